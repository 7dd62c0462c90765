"""Shared fixtures: tiny checkpoints written in the real file layouts, in a temp folder."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from minit2i.core.mean_flow_config import MEAN_FLOW_TINY
from minit2i.core.mmjit_config import MMJIT_TINY
from minit2i.core.t5_config import T5_TINY
from minit2i.core.threads import THREAD_VARIABLES, blas_threads, variable_set
from minit2i.demo_models import write_model
from minit2i.pipeline import make_request, open_model, run_threads

TINY_SEED = 1234


# Tests that run on one worker, one after another, by the start of their node id; the groups in
# this order, the longest first, so that none is left running alone at the end of a run.
GROUPS = {
    # scripts/gpu-check --cudasim from a copy of the checkout, run once for the module (`report`):
    # the suite's longest setup
    "tests/test_gpu_check.py": "gpu-check",
    # servers on probed free ports (no two probes at once), their module-wide servers started once;
    # a port probed as one nothing listens on
    "tests/test_explore.py": "ports",
    "tests/test_explore_browser.py": "ports",
    "tests/test_hub.py::test_unknown_repo_and_unreachable_hub_are_one_line": "ports",
    # module-wide work that tests spread over both workers would do on each: the bad inputs' trained,
    # scored and converted run folders; the batch runs drawn one image a forward and the Painters'
    # images drawn alone (the Ray test is the "ray" group's)
    "tests/test_bad_inputs.py": "bad-inputs",
    "tests/test_batch.py": "batch",
    "tests/test_batch_groups.py": "batch",
    # module-wide work done once: the site, the distillation, the NVRTC and ptxas compilations, the
    # explore captions' sampling runs, the notebook run, the official writer's JAX checkpoints, the
    # short training run
    "tests/test_site.py": "site",
    "tests/test_distill.py": "distill",
    "tests/test_kernels_compile.py": "nvrtc",
    "tests/test_ptx.py": "nvrtc",
    # the performance model's reading of the tensor-core attention's SASS, as the bad inputs' above
    "tests/test_performance_model.py": "performance-model",
    "tests/test_explore_captions.py": "captions",
    "tests/test_walkthrough.py": "walkthrough",
    "tests/test_jax_checkpoints.py": "jax-checkpoints",
    "tests/test_learn.py": "learn",
    # a local Ray cluster: one at a time
    "tests/test_batch.py::test_ray_": "ray",
}
GROUP_ORDER = list(dict.fromkeys(GROUPS.values()))


def group_of(nodeid: str) -> str | None:
    """The group of the longest start of `nodeid` in GROUPS (a test's own entry before its file's)."""
    start = max((start for start in GROUPS if nodeid.startswith(start)), key=len, default=None)
    return GROUPS.get(start)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """The whole suite (`pytest` without paths) on one worker per core (pytest-xdist, the [test]
    extra), as if run with `-n auto --dist loadgroup`, the groups being GROUPS. A file or test
    named on the command line runs in this process, unless `-n N` says otherwise; `-n 0` runs the
    whole suite here. Runs before xdist's own hook, which reads these options."""
    if not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput"):
        return
    if config.option.numprocesses is None and config.args_source is pytest.Config.ArgsSource.TESTPATHS:
        config.option.numprocesses = "auto"
    if config.option.numprocesses and config.option.dist == "no":
        config.option.dist = "loadgroup"
    config.option.loadscopereorder = False  # the groups in the order pytest_collection_modifyitems gives


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadgroup with GROUPS. (xdist 3.8's own reads `xdist_group` marks from suffixes it
    appends to node ids, which pytest 9 no longer lets it change: every test would be its own group.)"""
    if config.option.dist != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid) or nodeid

    return GroupScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """On xdist's workers (which must agree on the order): the groups first, in GROUP_ORDER, then
    the other tests, each in collection order."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: GROUP_ORDER.index(group) if (group := group_of(item.nodeid)) else len(GROUP_ORDER))


@pytest.fixture(scope="session", autouse=True)
def blas_threads_of_tiny_models():
    """The suite's own NumPy work on the BLAS threads the project chooses for the demo model's
    image (`run_threads`: one, unless the user set a *_NUM_THREADS variable): every model the
    tests run is that small or smaller. Commands run through `generate` choose for themselves."""
    files = open_model("demo")
    with blas_threads(run_threads(make_request(files, "a circle", {}), files)):
        yield


def pytest_collection_finish(session):
    """PyTorch's tests (training, the peers) are of the same tiny models: one intra-op thread, as
    the training commands use by default; only where a test module imported torch."""
    torch = sys.modules.get("torch")
    if torch is not None and variable_set() is None:
        torch.set_num_threads(1)


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
    return "BLAS threads: chosen per model (tiny: 1), " + (
        ", ".join(f"{name}={os.environ[name]}" for name in THREAD_VARIABLES if os.environ.get(name)) or "no *_NUM_THREADS set")


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


@pytest.fixture(scope="session")
def hub_1x(tmp_path_factory):
    """A folder holding huggingface_hub 1.x alone (the lent GPU machine's image had 1.33; the project
    needs 2.x for repo ids only), fetched from PyPI once a session; put first on PYTHONPATH."""
    import subprocess

    target = tmp_path_factory.mktemp("huggingface-hub-1")
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                             "--no-deps", "--target", str(target), "huggingface_hub>=1.33,<2"],
                            capture_output=True, text=True, timeout=600)  # a hang guard
    if result.returncode != 0:
        pytest.skip("pip could not fetch huggingface_hub 1.x from PyPI: "
                    + (result.stderr.strip().splitlines() or ["no output"])[-1])
    return target
