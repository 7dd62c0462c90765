"""One name, one signature: a function that the NumPy reference, its CuPy twin and the PyTorch peer
define under one name takes the same parameters, in the same order, in all of them, so the files
read side by side. Where a twin needs something else it has another name (the GPU samplers'
`use_graph`: `sample_on_device`).

The twins are found, not listed: a module of accelerated/ is the twin of the reference module of
the same name (the launchers of `accelerated/kernels.py` and `accelerated/cublas.py` have no
reference module: they take the CUDA kernels' arguments), and `training/torch_model.py` is a peer of all of them. Module-level
functions and the public methods of their classes (the runners) are compared; a method that only
forwards `*args, **kwargs` to its parent's takes the parent's parameters.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil
from collections import defaultdict

import pytest

import minit2i.accelerated
import minit2i.reference

HAVE_TORCH = importlib.util.find_spec("torch") is not None  # the peer needs the [train] or [crosscheck] extra


def twin_modules() -> list[str]:
    """Every reference module, each accelerated module of the same name, and the torch peer (when
    torch is installed)."""
    reference = {info.name for info in pkgutil.iter_modules(minit2i.reference.__path__)}
    accelerated = {info.name for info in pkgutil.iter_modules(minit2i.accelerated.__path__)}
    return ([f"minit2i.reference.{name}" for name in sorted(reference)]
            + [f"minit2i.accelerated.{name}" for name in sorted(reference & accelerated)]
            + ["minit2i.training.torch_model"] * HAVE_TORCH)


def forwards_everything(function) -> bool:
    kinds = {p.kind for p in inspect.signature(function).parameters.values()}
    return inspect.Parameter.VAR_POSITIONAL in kinds and inspect.Parameter.VAR_KEYWORD in kinds


def defined_functions(module_name: str) -> dict[str, list[str]]:
    """{name: parameter names} of the public functions a module defines (not imports), and of the
    public methods of its classes (as "Class.method", without self)."""
    module = importlib.import_module(module_name)
    found = {}
    for name, value in vars(module).items():
        if name.startswith("_") or getattr(value, "__module__", None) != module_name:
            continue
        if inspect.isfunction(value):
            found[name] = list(inspect.signature(value).parameters)
        elif inspect.isclass(value):
            for method_name, method in vars(value).items():
                method = getattr(method, "__func__", method)  # staticmethod / classmethod
                if method_name.startswith("_") or not inspect.isfunction(method) or forwards_everything(method):
                    continue
                parameters = list(inspect.signature(method).parameters)
                found[f"{name}.{method_name}"] = parameters[1:] if parameters[:1] in (["self"], ["cls"]) else parameters
    return found


def shared_names() -> dict[str, dict[str, list[str]]]:
    """{name: {where: its parameters}} for the names defined in two or more twin modules; methods
    as ".method", whichever class holds them (the runners' `.sample` is not the sampler `sample`)."""
    by_name = defaultdict(dict)
    for module_name in twin_modules():
        for name, parameters in defined_functions(module_name).items():
            key = "." + name.rpartition(".")[2] if "." in name else name
            by_name[key][f"{module_name}:{name}"] = parameters
    return {name: where for name, where in by_name.items() if len(where) > 1}


def test_the_twins_are_found_where_they_are():
    modules = twin_modules()
    assert {"minit2i.reference.mmjit", "minit2i.accelerated.mmjit", "minit2i.accelerated.t5",
            "minit2i.accelerated.pipeline"} <= set(modules)
    assert "minit2i.accelerated.kernels" not in modules
    shared = shared_names()
    # transformer_body has no reference twin: the GPU's and the torch peer's (checked with torch, below).
    for name in ("linear", "embed_image", "mask_text", "mmjit_forward", "mean_flow_forward", "t5_encode",
                 "double_block", "final_layer", "scalar_embedder", ".denoise", ".sample"):
        assert len(shared[name]) >= 2, name
    # The GPU's unrotated prefix is built on the device and cached per shape: another name.
    assert "unrotated_prefix" not in shared


@pytest.mark.skipif(not HAVE_TORCH, reason="the PyTorch peer needs the [train] or [crosscheck] extra (torch)")
def test_the_torch_peer_shares_the_reference_names():
    shared = shared_names()
    for name in ("embed_image", "mask_text", "mmjit_forward", "mean_flow_forward", "t5_encode", "rms_norm",
                 "swiglu", "project_qkv", "double_block", "scalar_embedder", "transformer_body"):
        assert "minit2i.training.torch_model:" + name in shared[name], name
    assert len(shared["mmjit_forward"]) == 3


@pytest.mark.parametrize("name", sorted(shared_names()))
def test_one_name_takes_one_parameter_list(name):
    signatures = shared_names()[name]
    distinct = {tuple(parameters) for parameters in signatures.values()}
    assert len(distinct) == 1, "\n".join(f"{where}({', '.join(parameters)})" for where, parameters in signatures.items())



def test_a_kernel_launcher_under_a_reference_name_takes_its_parameters_first():
    """A launcher takes its kernel's arguments; where it has a reference function's name (`rms_norm`,
    `attention`) it must read as that function's twin: the reference's parameters first, in order
    (a launcher may add an output buffer). The student's Euler launcher takes (state, next_input,
    x0, factor), so it is not `euler_step` (x, x0, factor) but `student_euler`."""
    reference = {}
    for module in twin_modules():
        if module.startswith("minit2i.reference."):
            reference |= defined_functions(module)
    for launchers in ("minit2i.accelerated.kernels", "minit2i.accelerated.cublas"):
        for name, parameters in defined_functions(launchers).items():
            if name in reference:
                assert parameters[:len(reference[name])] == reference[name], f"{launchers}.{name}"
