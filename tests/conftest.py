"""Shared fixtures: tiny checkpoints written in the real file layouts, in a temp folder."""

from __future__ import annotations

import os

import numpy as np
import pytest

from minit2i.config import MMJIT_TINY, T5_TINY
from minit2i.default_model import write_model

TINY_SEED = 1234


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """(transformer folder, t5 folder) of a tiny MiniT2I in diffusers/HF layout (float32)."""
    root = tmp_path_factory.mktemp("tiny-model")
    write_model(root / "transformer", root / "t5", MMJIT_TINY, T5_TINY, TINY_SEED)
    return root / "transformer", root / "t5"


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def pytest_report_header(config):
    return f"BLAS threads: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"
