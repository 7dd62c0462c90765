"""What a model is, apart from how files are read: importing the configs or the reference model
loads no file reader (safetensors, Orbax through tensorstore), no temporary-file machinery and no
tokenizer. Each import runs in a fresh interpreter, whose `sys.modules` is what that import pulled in.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Top-level names of the modules a model must not load, and our own modules that wrap them.
FILE_MACHINERY = ("safetensors", "tensorstore", "orbax", "tempfile", "tokenizers",
                  "minit2i.core.safetensors_file", "minit2i.core.orbax_file", "minit2i.core.checkpoint",
                  "minit2i.core.tokenizer", "minit2i.core.files")


def modules_loaded_by(module: str) -> set[str]:
    """The names in sys.modules after `import module` in a fresh interpreter."""
    code = f"import json, sys; import {module}; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return set(json.loads(result.stdout))


def file_machinery(loaded: set[str]) -> list[str]:
    return sorted(name for name in loaded if name in FILE_MACHINERY or name.split(".")[0] in FILE_MACHINERY)


@pytest.mark.parametrize("module", ["minit2i.reference.mmjit", "minit2i.reference.pipeline",
                                    "minit2i.reference.mean_flow", "minit2i.reference.t5",
                                    "minit2i.core.mmjit_config", "minit2i.core.t5_config",
                                    "minit2i.core.mean_flow_config", "minit2i.core.weights"])
def test_importing_the_model_loads_no_file_machinery(module):
    loaded = modules_loaded_by(module)
    assert module in loaded
    assert file_machinery(loaded) == []


def test_the_check_sees_a_file_reader_when_one_is_imported():
    """The loader does import them: the check above would see them if the model did."""
    assert {"safetensors", "minit2i.core.safetensors_file", "minit2i.core.orbax_file"} <= set(
        file_machinery(modules_loaded_by("minit2i.core.checkpoint")))
    assert "tokenizers" in file_machinery(modules_loaded_by("minit2i.core.tokenizer"))
    assert {"tempfile", "minit2i.core.files"} <= set(file_machinery(modules_loaded_by("minit2i.core.files")))
