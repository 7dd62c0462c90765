"""Shared fixtures: tiny checkpoints written in the real file layouts, in a temp folder."""

from __future__ import annotations

import os

import numpy as np
import pytest

from minit2i.core.mean_flow_config import MEAN_FLOW_TINY
from minit2i.core.mmjit_config import MMJIT_TINY
from minit2i.core.t5_config import T5_TINY
from minit2i.demo_models import write_model

TINY_SEED = 1234


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """(transformer folder, t5 folder) of a tiny MiniT2I in diffusers/HF layout (float32)."""
    root = tmp_path_factory.mktemp("tiny-model")
    write_model(root / "transformer", root / "t5", MMJIT_TINY, T5_TINY, TINY_SEED)
    return root / "transformer", root / "t5"


@pytest.fixture(scope="session")
def tiny_student(tmp_path_factory):
    """(transformer folder, t5 folder) of a tiny Mean Flow student (every prefix group active),
    in the same layout as `tiny_model`."""
    root = tmp_path_factory.mktemp("tiny-student")
    write_model(root / "transformer", root / "t5", MEAN_FLOW_TINY, T5_TINY, TINY_SEED)
    return root / "transformer", root / "t5"


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def pytest_report_header(config):
    return f"BLAS threads: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"


class HFCache:
    """A Hugging Face hub cache laid out exactly as huggingface_hub writes it:

        models--org--name/blobs/<sha256>                       file contents
        models--org--name/snapshots/<commit>/<path>            relative links to ../../blobs/<sha256>
        models--org--name/refs/main                            the commit (no newline)
    """

    def __init__(self, root):
        self.root = root

    def folder(self, repo_id: str):
        return self.root / ("models--" + repo_id.replace("/", "--"))

    def add(self, repo_id: str, files: dict[str, bytes], commit: str = "a" * 40, main: bool = True):
        """Put `files` (repo path -> bytes) into snapshot `commit`; return the snapshot folder."""
        import hashlib

        repo = self.folder(repo_id)
        for name, content in files.items():
            blob = repo / "blobs" / hashlib.sha256(content).hexdigest()
            blob.parent.mkdir(parents=True, exist_ok=True)
            blob.write_bytes(content)
            link = repo / "snapshots" / commit / name
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob, link.parent))
        if main:
            (repo / "refs").mkdir(exist_ok=True)
            (repo / "refs" / "main").write_text(commit)
        return repo / "snapshots" / commit


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """An empty HF cache in tmp_path with HF_HUB_OFFLINE=1: in the environment (for subprocesses) and
    in huggingface_hub's constants, which it reads once, at import."""
    from huggingface_hub import constants

    root = tmp_path / "hf-hub"
    root.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return HFCache(root)
