"""Imports only point down: core and cudasim at the bottom, then reference, accelerated, the
application (`minit2i` itself) and training on top (README: Layout).

Every module of the installed package is parsed (imports inside functions count too) and each
import of another part of the project is checked against the parts its own part may use.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# part -> (folder in the repository, the parts it may import besides itself)
LAYERS = {
    "core": ("core", set()),
    "cudasim": ("cudasim", set()),
    "reference": ("reference", {"core"}),
    "accelerated": ("accelerated", {"core", "reference", "cudasim"}),
    "app": ("minit2i", {"core", "reference", "accelerated", "cudasim"}),
    "training": ("training", {"core", "reference", "accelerated", "cudasim", "app"}),
}
SUBPACKAGES = {part: f"minit2i.{part}" for part in LAYERS if part != "app"}


def part_of(module: str) -> str | None:
    """The layer a dotted module name belongs to (None outside the project)."""
    if module != "minit2i" and not module.startswith("minit2i."):
        return None
    for part, package in SUBPACKAGES.items():
        if module == package or module.startswith(package + "."):
            return part
    return "app"


def imported_modules(source: str, module: str, is_package: bool) -> list[tuple[str, int]]:
    """(absolute module name, line) of every import in `source`, the module being `module`."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from minit2i import cudasim` imports the subpackage, not the app.
            found += [(f"{base}.{alias.name}" if f"{base}.{alias.name}" in SUBPACKAGES.values() else base,
                       node.lineno) for alias in node.names]
    return found


def upward_imports(source: str, module: str, is_package: bool = False) -> list[str]:
    """Each import in `source` of a part that `module`'s part may not use, as 'line: name'."""
    part = part_of(module)
    allowed = LAYERS[part][1] | {part}
    return [f"{line}: {name}" for name, line in imported_modules(source, module, is_package)
            if part_of(name) is not None and part_of(name) not in allowed]


def project_modules() -> list[tuple[str, Path, bool]]:
    """(name, file, is a package) of every module of the installed package."""
    modules = {}
    for package in ["minit2i", *SUBPACKAGES.values()]:
        root = importlib.import_module(package)
        modules[package] = (package, Path(root.__file__), True)
        for info in pkgutil.walk_packages(root.__path__, package + "."):
            modules[info.name] = (info.name, Path(importlib.util.find_spec(info.name).origin), info.ispkg)
    return sorted(modules.values())


def test_every_layer_folder_is_a_package_of_the_install():
    folders = {folder for folder, _ in LAYERS.values()}
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert packages == folders
    for package in SUBPACKAGES.values():
        assert Path(importlib.import_module(package).__file__).parent.parent == ROOT


def test_the_walk_finds_every_module():
    names = {name for name, _, _ in project_modules()}
    assert {"minit2i.core.checkpoint", "minit2i.reference.mmjit", "minit2i.accelerated.kernels",
            "minit2i.cudasim.standin", "minit2i.cli", "minit2i.training.train"} <= names
    files = {path.resolve() for _, path, _ in project_modules()}
    for folder, _ in LAYERS.values():
        assert set((ROOT / folder).glob("*.py")) <= files, folder


@pytest.mark.parametrize("name, path, is_package", project_modules(), ids=lambda v: v if isinstance(v, str) else "")
def test_imports_only_point_down(name, path, is_package):
    assert upward_imports(path.read_text(), name, is_package) == []


def private_imports(source: str) -> list[str]:
    """Each `from minit2i... import _name` (or relative) in `source`, as 'line: module._name'."""
    return [f"{node.lineno}: {node.module or ''}.{alias.name}" for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("minit2i"))
            for alias in node.names if alias.name.startswith("_") and not alias.name.startswith("__")]


def test_no_module_imports_a_private_name_of_another():
    """A name with a leading underscore is its module's own: what another module needs is public."""
    sources = [path for _, path, _ in project_modules()] + sorted((ROOT / "tests").glob("*.py"))
    found = {str(path.relative_to(ROOT)): private_imports(path.read_text()) for path in sources}
    assert {path: names for path, names in found.items() if names} == {}
    assert private_imports("from .cli import _model_paths, emit") == ["1: cli._model_paths"]


@pytest.mark.parametrize("source, module, found", [
    ("from minit2i.pipeline import generate", "minit2i.core.checks", ["1: minit2i.pipeline"]),
    ("def f():\n    from ..accelerated import kernels", "minit2i.reference.mmjit", ["2: minit2i.accelerated"]),
    ("from minit2i import cudasim", "minit2i.core.images", ["1: minit2i.cudasim"]),
    ("import minit2i.training.train", "minit2i.cli", ["1: minit2i.training.train"]),
    ("from .core.checks import Range", "minit2i.pipeline", []),
    ("from minit2i.reference.layers import rope\nimport numpy", "minit2i.accelerated.layers", []),
])
def test_a_planted_upward_import_is_found(source, module, found):
    assert upward_imports(source, module) == found


def module_graph() -> dict[str, set[str]]:
    """{module: the project's modules it imports}, `from . import x` resolved to the module x."""
    modules = {name: (path, is_package) for name, path, is_package in project_modules()}
    graph = {}
    for name, (path, is_package) in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                package = name if is_package else name.rpartition(".")[0]
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                found |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names}
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
        graph[name] = {module for module in found if module in modules and module != name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each cycle of `graph` found by a depth-first walk, as the modules around it."""
    cycles, done = [], set()

    def walk(module, path):
        if module in path:
            cycles.append(path[path.index(module):] + [module])
            return
        if module in done:
            return
        for imported in sorted(graph[module]):
            walk(imported, path + [module])
        done.add(module)

    for module in sorted(graph):
        walk(module, [])
    return cycles


def test_no_two_application_modules_import_each_other():
    """Imports inside functions count: `golden` runs the generate command through
    `generate_command`, not by importing `cli` (which imports golden)."""
    graph = module_graph()
    assert "minit2i.generate_command" in graph["minit2i.golden"]
    assert [cycle for cycle in import_cycles(graph) if part_of(cycle[0]) == "app"] == []
    assert import_cycles({"minit2i.cli": {"minit2i.golden"}, "minit2i.golden": {"minit2i.cli"}}) == [
        ["minit2i.cli", "minit2i.golden", "minit2i.cli"]]
