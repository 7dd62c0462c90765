"""Importing a file of a folder that is no package (benchmarks/, scripts/, docsite/) as a module,
the one way every test does it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_file(path: Path):
    """The file at `path` as a module named by its stem, its folder on sys.path as when it runs as
    a script (it may import its siblings), and in sys.modules (a dataclass looks its module up there)."""
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def load_benchmark(name: str):
    """benchmarks/<name>.py as a module."""
    return load_file(ROOT / "benchmarks" / f"{name}.py")


def load_script(name: str):
    """scripts/<name>.py as a module."""
    return load_file(ROOT / "scripts" / f"{name}.py")
