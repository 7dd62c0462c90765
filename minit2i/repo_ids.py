"""Paths or Hub repo ids, told apart without importing huggingface_hub.

`--model` and `--t5` take a path or a repo id: an existing path always wins, and `org/name` that is
not a path is a repo id. Only a repo id imports `minit2i.hub`, which needs huggingface_hub 2.x: a
local path or a demo model runs with any huggingface_hub, or none (a GPU machine's image may
carry an older one), and a repo id without a usable huggingface_hub is one line.
"""

from __future__ import annotations

import os
import re
from importlib import metadata

from minit2i.core.errors import MiniT2IError
from minit2i.core.mmjit_config import DEFAULT_VARIANT

# `org/name` as the Hub spells repo ids (no `--` or `..`, which the Hub forbids too).
REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
HUB_REQUIREMENT = "huggingface_hub>=2,<3"  # as pyproject.toml's dependency: the line that speaks httpx2


def is_repo_id(spec) -> bool:
    """True for `org/name` that is not an existing path (an existing path always wins)."""
    text = str(spec)
    return (REPO_ID.fullmatch(text) is not None and "--" not in text and ".." not in text
            and not text.lower().endswith(".safetensors") and not os.path.lexists(os.path.expanduser(text)))


def hub(repo_id: str):
    """The module `minit2i.hub`, imported now; one line naming `repo_id` when huggingface_hub is
    missing or older than the 2.x line it needs."""
    fix = f"pip install '{HUB_REQUIREMENT}', or pass a local path"
    try:
        version = metadata.version("huggingface_hub")
    except metadata.PackageNotFoundError:
        raise MiniT2IError(f"{repo_id} is a Hub repo id, which needs huggingface_hub 2.x, and it is not "
                           f"installed; {fix}") from None
    if version.split(".")[0] != "2":
        raise MiniT2IError(f"{repo_id} is a Hub repo id, which needs huggingface_hub 2.x, and {version} is "
                           f"installed; {fix}")
    try:
        from minit2i import hub as module
    except ImportError as err:  # a dependency of huggingface_hub 2.x missing (httpx2)
        raise MiniT2IError(f"{repo_id} is a Hub repo id, and huggingface_hub cannot be used here ({err}); "
                           f"{fix}") from None
    return module


def resolve_model(spec, variant: str = DEFAULT_VARIANT, jax_tree: str | None = None):
    """`spec` unchanged if it is a path; for a repo id, the local snapshot folder holding the transformer."""
    if not is_repo_id(spec):
        return spec
    module = hub(str(spec))
    return module.local_snapshot(module.mmjit_model(str(spec), variant, jax_tree))


def resolve_t5(spec, expected_d_model: int | None = None):
    """`spec` unchanged if it is a path; for a repo id, the local snapshot folder holding the T5 encoder."""
    if not is_repo_id(spec):
        return spec
    module = hub(str(spec))
    return module.local_snapshot(module.t5_model(str(spec), expected_d_model))
