"""Weights by Hub repo id: the Hugging Face cache (offline), damaged caches, `info`, and downloads
through a loopback stand-in for the Hub's file endpoints.

The cache is built in huggingface_hub's real layout (blobs/, snapshots/<commit>/ links, refs/main;
see `HFCache` in conftest.py) from the tiny model's files, which use the real key layout.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from minit2i.cli import main
from minit2i.core.checks import human_size
from minit2i.core.config_fields import to_json
from minit2i.core.t5_config import T5Config
from minit2i.demo_models import random_t5_weights
from minit2i.repo_ids import is_repo_id

T5_REPO = "tiny-org/tiny-t5"
COMMIT, OTHER = "a" * 40, "c" * 40
TRANSFORMER = "minit2i-b-16/transformer/"
SMALL = ["-W", "64", "-H", "64", "--steps", "2", "-q"]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """Run where no folder is named like the repo ids used here (an existing path would win)."""
    monkeypatch.chdir(tmp_path)


def minit2i_files(tiny_model, llm: str | None = T5_REPO, folder: str = TRANSFORMER) -> dict[str, bytes]:
    """The MiniT2I/MiniT2I layout (model.md 1.3), its config.json naming the text encoder in `llm`."""
    transformer, _ = tiny_model
    config = json.loads((transformer / "config.json").read_text())
    if llm:
        config["llm"] = llm
    return {folder + "config.json": json.dumps(config).encode(),
            folder + "diffusion_pytorch_model.safetensors": (transformer / "diffusion_pytorch_model.safetensors").read_bytes(),
            "minit2i-b-16/scheduler/scheduler_config.json": b'{"num_inference_steps": 100}'}


def t5_files(tiny_model) -> dict[str, bytes]:
    _, t5 = tiny_model
    return {name: (t5 / name).read_bytes() for name in ("config.json", "model.safetensors", "tokenizer.json")}


def cached_model(hub, tiny_model) -> Path:
    hub.add(T5_REPO, t5_files(tiny_model), commit="b" * 40)
    return hub.add("MiniT2I/MiniT2I", minit2i_files(tiny_model))


def cli(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def pixels(path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image)


# ---------------------------------------------------------------------------------------------
# Path or repo id


@pytest.mark.parametrize("spec, expected", [
    ("MiniT2I/MiniT2I", True), ("google/flan-t5-large", True), ("org/name.v2_b", True),
    ("flan-t5-large", False), ("a/b/c", False), ("./org/name", False), ("/org/name", False),
    ("~/org/name", False), ("org/model.safetensors", False), ("org--x/name", False), ("org/..", False),
])
def test_what_counts_as_a_repo_id(spec, expected):
    assert is_repo_id(spec) is expected


# huggingface_hub 1.x (as the lent GPU machine had) and no httpx2: an interpreter that cannot import it
OLD_HUB_MAIN = "import sys; sys.modules['httpx2'] = None; from minit2i.cli import main; sys.exit(main(sys.argv[1:]))"


def old_hub_minit2i(hub_1x, *args: str) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(hub_1x), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-c", OLD_HUB_MAIN, *args], capture_output=True, text=True, env=env,
                          timeout=300)  # a hang guard


def test_the_demo_model_draws_the_same_png_with_huggingface_hub_1_and_no_httpx2(hub_1x, tmp_path, capsys):
    """Only a repo id imports minit2i.hub: the demo model needs no huggingface_hub 2.x."""
    args = ["generate", "--model", "demo", "-p", "a small blue square", *SMALL]
    assert main([*args, "-o", str(tmp_path / "here.png")]) == 0
    result = old_hub_minit2i(hub_1x, *args, "-o", str(tmp_path / "old-hub.png"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "old-hub.png").read_bytes() == (tmp_path / "here.png").read_bytes()


def test_a_repo_id_with_huggingface_hub_1_is_one_line(hub_1x, tmp_path):
    result = old_hub_minit2i(hub_1x, "generate", "--model", "MiniT2I/MiniT2I", "-p", "a cat", "-o", "cat.png")
    assert result.returncode == 2
    assert re.fullmatch(r"minit2i: error: MiniT2I/MiniT2I is a Hub repo id, which needs huggingface_hub 2\.x, and "
                        r"1\.\d+\.\d+ is installed; pip install 'huggingface_hub>=2,<3', or pass a local path\n",
                        result.stderr), result.stderr
    assert not (tmp_path / "cat.png").exists()


def test_a_repo_id_without_huggingface_hub_is_one_line(monkeypatch):
    from importlib import metadata

    from minit2i import repo_ids
    from minit2i.core.errors import MiniT2IError

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(repo_ids.metadata, "version", missing)
    with pytest.raises(MiniT2IError, match=r"^org/name is a Hub repo id, which needs huggingface_hub 2\.x, and it is "
                                           r"not installed; pip install 'huggingface_hub>=2,<3', or pass a local path$"):
        repo_ids.resolve_model("org/name")


def test_an_existing_path_wins_over_the_repo_id(tmp_path):
    (tmp_path / "MiniT2I" / "MiniT2I").mkdir(parents=True)
    assert not is_repo_id("MiniT2I/MiniT2I")


def test_a_local_folder_named_like_a_repo_is_read_even_offline_and_uncached(offline_hub, tiny_model, capsys):
    transformer, t5 = tiny_model
    local = Path("MiniT2I") / "MiniT2I"
    local.mkdir(parents=True)
    for name in ("config.json", "diffusion_pytorch_model.safetensors"):
        (local / name).write_bytes((transformer / name).read_bytes())
    code, _, err = cli(capsys, "generate", "-p", "a cat", "--model", "MiniT2I/MiniT2I", "--t5", t5, *SMALL)
    assert (code, err) == (0, "")


# ---------------------------------------------------------------------------------------------
# From the cache, offline


def test_generate_by_repo_ids_from_the_cache_equals_the_same_files_by_path(offline_hub, tiny_model, capsys):
    cached_model(offline_hub, tiny_model)
    transformer, t5 = tiny_model
    code, out, err = cli(capsys, "generate", "-p", "a red cat", "--model", "MiniT2I/MiniT2I", "--variant", "b16",
                         *SMALL, "-o", "by-id.png")
    assert (code, err) == (0, ""), err
    assert out == "by-id.png\n"
    code, _, err = cli(capsys, "generate", "-p", "a red cat", "--model", transformer, "--t5", t5, *SMALL,
                       "-o", "by-path.png")
    assert (code, err) == (0, "")
    np.testing.assert_array_equal(pixels("by-id.png"), pixels("by-path.png"))


def test_t5_by_repo_id_overrides_the_config(offline_hub, tiny_model, capsys):
    """--t5 by repo id; the config's llm names a repo that is not cached and is not used."""
    offline_hub.add(T5_REPO, t5_files(tiny_model))
    offline_hub.add("MiniT2I/MiniT2I", minit2i_files(tiny_model, llm="google/flan-t5-large"))
    code, _, err = cli(capsys, "generate", "-p", "a cat", "--model", "MiniT2I/MiniT2I", "--t5", T5_REPO, *SMALL)
    assert (code, err) == (0, "")


def test_t5_default_comes_from_the_config_llm_of_a_local_model_too(offline_hub, tiny_model, capsys):
    offline_hub.add(T5_REPO, t5_files(tiny_model))
    for name, content in minit2i_files(tiny_model, folder="local/").items():
        Path(name).parent.mkdir(parents=True, exist_ok=True)
        Path(name).write_bytes(content)
    code, _, err = cli(capsys, "generate", "-p", "a cat", "--model", "local", *SMALL)
    assert (code, err) == (0, "")


def test_without_llm_in_the_config_t5_is_asked_for(tiny_model, capsys):
    transformer, _ = tiny_model
    code, _, err = cli(capsys, "generate", "-p", "a cat", "--model", transformer, *SMALL)
    assert code == 2
    assert err == (f"minit2i: error: --t5 is missing, and {transformer} has no config.json naming its text "
                   "encoder ('llm'); pass --t5 (google/flan-t5-large, or a path to it)\n")


def offline_miss(hub, repo: str, files: list[str]) -> str:
    them = "it" if len(files) == 1 else "them"
    return (f"minit2i: error: {repo}: {', '.join(files)} not in the Hugging Face cache ({hub.root}) and downloads "
            f"are switched off (HF_HUB_OFFLINE=1); fetch {them} with: hf download {repo} {' '.join(files)}\n")


def test_offline_miss_names_the_repo_the_files_and_the_command(offline_hub, capsys, tmp_path):
    code, out, err = cli(capsys, "generate", "-p", "a cat", "--model", "MiniT2I/MiniT2I", *SMALL)
    assert (code, out) == (2, "")
    assert err == offline_miss(offline_hub, "MiniT2I/MiniT2I",
                               [TRANSFORMER + "config.json", TRANSFORMER + "diffusion_pytorch_model.safetensors"])
    assert not list(tmp_path.glob("*.png"))


@pytest.mark.parametrize("absent", ["model.safetensors", "tokenizer.json"])
def test_offline_miss_names_only_the_files_missing(offline_hub, tiny_model, capsys, absent):
    files = t5_files(tiny_model)
    del files[absent]
    offline_hub.add(T5_REPO, files)
    offline_hub.add("MiniT2I/MiniT2I", minit2i_files(tiny_model))
    code, _, err = cli(capsys, "generate", "-p", "a cat", "--model", "MiniT2I/MiniT2I", *SMALL)
    assert code == 2
    assert err == offline_miss(offline_hub, T5_REPO, [absent])


def test_offline_with_only_another_variant_cached_names_the_asked_one(offline_hub, tiny_model, capsys):
    offline_hub.add("MiniT2I/MiniT2I", minit2i_files(tiny_model, folder="minit2i-l-16/transformer/"))
    code, _, err = cli(capsys, "generate", "-p", "a cat", "--model", "MiniT2I/MiniT2I", "--variant", "base", *SMALL)
    assert code == 2
    assert err == offline_miss(offline_hub, "MiniT2I/MiniT2I",
                               [TRANSFORMER + "config.json", TRANSFORMER + "diffusion_pytorch_model.safetensors"])


def test_env_vars_are_honoured_by_a_fresh_process(offline_hub, tiny_model, tmp_path):
    """huggingface_hub reads HF_HUB_CACHE and HF_HUB_OFFLINE at import: check them as a user sets them."""
    cached_model(offline_hub, tiny_model)
    result = subprocess.run([sys.executable, "-m", "minit2i.cli", "generate", "-p", "a cat",
                             "--model", "MiniT2I/MiniT2I", *SMALL, "-o", "cat.png"],
                            capture_output=True, text=True, timeout=300, env=os.environ)
    assert (result.returncode, result.stderr) == (0, "")
    assert (tmp_path / "cat.png").is_file()


# ---------------------------------------------------------------------------------------------
# Damaged caches: one line each, and a good snapshot is still found


def test_dangling_snapshot_link_beside_a_good_snapshot_is_skipped(offline_hub, tiny_model, capsys):
    hub = offline_hub
    hub.add(T5_REPO, t5_files(tiny_model))
    hub.add("MiniT2I/MiniT2I", minit2i_files(tiny_model), main=False)  # no refs/main: the newest snapshot
    snapshots = hub.folder("MiniT2I/MiniT2I") / "snapshots"
    (snapshots / OTHER).symlink_to(hub.root / "gone")
    for model in ("MiniT2I/MiniT2I", hub.folder("MiniT2I/MiniT2I"), hub.root):
        code, _, err = cli(capsys, "generate", "-p", "a cat", "--model", model, "--t5", T5_REPO, *SMALL)
        assert (code, err) == (0, ""), model


@pytest.mark.parametrize("content, problem", [
    (b"", "is empty"),
    (b"\xff\xfe\x80", "is not a commit hash (it holds binary data)"),
    (b"../../../etc", "is not a commit hash ('../../../etc')"),
    (OTHER.encode(), "names {other}, which is not in {snapshots}"),
], ids=["empty", "not-utf8", "path", "dangling-target"])
@pytest.mark.parametrize("by", ["repo-id", "cache-folder"])
def test_bad_refs_main_does_not_hide_the_good_snapshot(offline_hub, tiny_model, capsys, content, problem, by):
    repo = offline_hub.folder("MiniT2I/MiniT2I")
    cached_model(offline_hub, tiny_model)
    (repo / "snapshots" / OTHER).symlink_to(offline_hub.root / "gone")
    (repo / "refs" / "main").write_bytes(content)
    model = "MiniT2I/MiniT2I" if by == "repo-id" else repo
    code, _, err = cli(capsys, "generate", "-p", "a cat", "--model", model, *SMALL)
    assert code == 0
    problem = problem.format(other=OTHER, snapshots=repo / "snapshots")
    assert err == f"minit2i: {repo / 'refs' / 'main'} {problem}; using the newest snapshot, {COMMIT}\n"


def test_missing_blob_is_a_missing_file_for_a_repo_id_and_a_broken_link_for_a_path(offline_hub, tiny_model, capsys):
    snapshot = cached_model(offline_hub, tiny_model)
    weights = snapshot / TRANSFORMER / "diffusion_pytorch_model.safetensors"
    weights.resolve().unlink()
    code, _, err = cli(capsys, "generate", "-p", "a cat", "--model", "MiniT2I/MiniT2I", *SMALL)
    assert code == 2
    assert err == offline_miss(offline_hub, "MiniT2I/MiniT2I", [TRANSFORMER + "diffusion_pytorch_model.safetensors"])
    code, _, err = cli(capsys, "generate", "-p", "a cat", "--model", snapshot, *SMALL)
    assert code == 2
    assert err == (f"minit2i: error: weights file {weights}: a link to {os.readlink(weights)}, which does not exist "
                   "(an interrupted download or a cleaned cache); re-download it\n")


def test_symlink_loop_is_named_as_such(capsys):
    Path("loop").symlink_to("loop")
    code, _, err = cli(capsys, "generate", "-p", "a cat", "--model", "loop", "--t5", "loop", *SMALL)
    assert (code, err) == (2, "minit2i: error: --model loop: a loop of symbolic links; point at the real file or folder\n")


def test_unreadable_folder_is_named_as_such(tmp_path, capsys, monkeypatch):
    """Permissions are simulated: tests may run as root, which reads any folder."""
    locked = tmp_path / "locked"
    locked.mkdir()
    real_listdir = os.listdir

    def listdir(path="."):
        if Path(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return real_listdir(path)

    monkeypatch.setattr(os, "listdir", listdir)
    code, _, err = cli(capsys, "info", locked)
    assert (code, err) == (2, f"minit2i: error: cannot read the folder {locked}: Permission denied; check its permissions\n")


# ---------------------------------------------------------------------------------------------
# info REPO_ID


def test_info_on_a_cached_repo_lists_the_files_and_describes_the_model(offline_hub, tiny_model, capsys):
    snapshot = cached_model(offline_hub, tiny_model)
    sizes = {n: len(c) for n, c in minit2i_files(tiny_model).items()}
    code, out, err = cli(capsys, "info", "MiniT2I/MiniT2I")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[:4] == [
        "MiniT2I/MiniT2I: Hugging Face Hub repo, MiniT2I transformer",
        f"  cache:      {snapshot}",
        f"  cached:     {TRANSFORMER}config.json ({human_size(sizes[TRANSFORMER + 'config.json'])}), "
        f"{TRANSFORMER}diffusion_pytorch_model.safetensors "
        f"({human_size(sizes[TRANSFORMER + 'diffusion_pytorch_model.safetensors'])})",
        "  download:   nothing, every file is cached",
    ]
    assert lines[4] == "MiniT2I MMJiT transformer"
    assert lines[5] == f"  files:      {snapshot / TRANSFORMER / 'diffusion_pytorch_model.safetensors'}"


def test_info_offline_on_a_partly_cached_t5_says_what_is_known(offline_hub, tiny_model, capsys):
    files = t5_files(tiny_model)
    del files["model.safetensors"]
    snapshot = offline_hub.add(T5_REPO, files)
    code, out, err = cli(capsys, "info", T5_REPO)
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"{T5_REPO}: Hugging Face Hub repo, T5 encoder",
        f"  cache:      {snapshot}",
        f"  cached:     config.json ({human_size(len(files['config.json']))}), "
        f"tokenizer.json ({human_size(len(files['tokenizer.json']))})",
        f"  download:   model.safetensors (sizes unknown offline); fetch with: hf download {T5_REPO} model.safetensors",
    ]


@pytest.mark.parametrize("size, text", [(0, "0 B"), (999, "999 B"), (1500, "1.5 kB"), (3_132_000_000, "3.1 GB"),
                                        (5 * 10**15, "5000.0 TB")])
def test_human_size(size, text):
    assert human_size(size) == text


@pytest.mark.parametrize("size, text", [(1000, "1000 B"), (1536, "1.5 KiB"), (22.1 * 2**30, "22.1 GiB"),
                                        (301 * 2**40, "301.0 TiB")])
def test_human_size_binary(size, text):
    assert human_size(size, binary=True) == text


# ---------------------------------------------------------------------------------------------
# Downloads, through a loopback stand-in for the Hub's file endpoints


class FakeHub(ThreadingHTTPServer):
    """The three endpoints huggingface_hub uses here, on 127.0.0.1 only:

    GET  /api/models/<repo>              file list with sizes (model_info with files_metadata)
    HEAD /<repo>/resolve/<rev>/<path>    X-Repo-Commit, ETag, Content-Length
    GET  /<repo>/resolve/<rev>/<path>    the bytes, honouring Range (safetensors header reads)
    Every request is logged as (method, path, Range header or None).
    """

    daemon_threads = True  # a handler kept silent on purpose must not hold up the shutdown

    def __init__(self, repos: dict[str, dict[str, bytes]]):
        super().__init__(("127.0.0.1", 0), FakeHubHandler)
        self.repos = repos
        self.requests: list[tuple[str, str, str | None]] = []
        # How the file list of a repo is answered when it misbehaves: repo -> one of MISBEHAVIOURS.
        self.misbehaving: dict[str, str] = {}
        self.stopping = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def commit(self, repo: str) -> str:
        return hashlib.sha1(repo.encode()).hexdigest()


class FakeHubHandler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # keep the test output clean
        pass

    def do_HEAD(self):
        self._answer(body=False)

    def do_GET(self):
        self._answer(body=True)

    def _answer(self, body: bool):
        hub, path = self.server, self.path.split("?")[0]
        hub.requests.append((self.command, path, self.headers.get("Range")))
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/[^/]+)?", path):
            repo = m.group(1)
            if repo in hub.misbehaving:
                return self._misbehave(hub.misbehaving[repo], repo)
            if repo not in hub.repos:
                return self._send(404, b"{}", {"X-Error-Code": "RepoNotFound"}, body)
            info = {"id": repo, "sha": hub.commit(repo),
                    "siblings": [{"rfilename": n, "size": len(c)} for n, c in hub.repos[repo].items()]}
            return self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"}, body)
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/[^/]+/(.+)", path)
        content = hub.repos.get(m.group(1), {}).get(m.group(2)) if m else None
        if content is None:
            return self._send(404, b"", {"X-Error-Code": "EntryNotFound"}, body)
        headers = {"X-Repo-Commit": hub.commit(m.group(1)), "ETag": f'"{hashlib.sha256(content).hexdigest()}"',
                   "Accept-Ranges": "bytes"}
        wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
        if wanted:
            start = int(wanted.group(1))
            end = min(int(wanted.group(2) or len(content) - 1), len(content) - 1)
            headers["Content-Range"] = f"bytes {start}-{end}/{len(content)}"
            return self._send(206, content[start:end + 1], headers, body)
        return self._send(200, content, headers, body)

    def _misbehave(self, how: str, repo: str):
        """Answer the file list as a broken or hostile endpoint would (bounded: at most 30 s)."""
        if how == "silent":  # accept the connection, never answer
            self.server.stopping.wait(30)
        elif how == "trickle":  # a valid start, then one byte every 0.2 s
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            for _ in range(150):
                if self.server.stopping.wait(0.2):
                    break
                self.wfile.write(b" ")
                self.wfile.flush()
        else:
            sha = {"revision": "../../..", "shell": "$(touch pwned)"}.get(how, "0" * 40)
            info = {"id": repo, "sha": sha, "siblings": [{"rfilename": "config.json", "size": 10}]}
            content = b"<html>not json" if how == "not-json" else json.dumps(info).encode()
            self._send(200, content, {"Content-Type": "application/json"}, True)

    def _send(self, status: int, content: bytes, headers: dict, body: bool):
        self.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(content))}.items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            self.wfile.write(content)


@pytest.fixture
def fake_hub(tiny_model, tmp_path):
    """A FakeHub with MiniT2I/MiniT2I (both variants), the tiny T5 and a T5 of the wrong width."""
    wide = T5Config(vocab_size=512, d_model=32, d_kv=8, num_heads=4, d_ff=48, num_layers=1)
    from safetensors.numpy import save

    repos = {
        "MiniT2I/MiniT2I": {**minit2i_files(tiny_model), **minit2i_files(tiny_model, folder="minit2i-l-16/transformer/"),
                            "pipeline.py": b"# custom pipeline\n"},
        T5_REPO: {**t5_files(tiny_model), "pytorch_model.bin": b"\0" * 4096, "README.md": b"# tiny\n"},
        "other-org/wide-t5": {"config.json": to_json(wide).encode(), "tokenizer.json": t5_files(tiny_model)["tokenizer.json"],
                              "model.safetensors": save(random_t5_weights(wide, 0))},
        "other-org/bare-t5": {n: c for n, c in t5_files(tiny_model).items() if n != "tokenizer.json"},
    }
    server = FakeHub(repos)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.stopping.set()
    server.shutdown()
    server.server_close()


def run_cli(tmp_path, env_extra: dict, *args):
    """The CLI in a fresh process, so huggingface_hub reads HF_ENDPOINT and the cache at import."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update({"HF_HUB_CACHE": str(tmp_path / "hf-hub"), "HF_HUB_DISABLE_XET": "1", **env_extra})
    return subprocess.run([sys.executable, "-m", "minit2i.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=300, env=env)


def test_download_fetches_only_the_needed_files_says_their_size_and_is_used_from_the_cache_after(
        fake_hub, tiny_model, tmp_path):
    env = {"HF_ENDPOINT": fake_hub.url}
    first = run_cli(tmp_path, env, "generate", "-p", "a cat", "--model", "MiniT2I/MiniT2I", "-W", 64, "-H", 64,
                    "--steps", 2, "-o", "cat.png")
    assert first.returncode == 0, first.stderr
    weights = minit2i_files(tiny_model)[TRANSFORMER + "diffusion_pytorch_model.safetensors"]
    t5_weights = t5_files(tiny_model)["model.safetensors"]
    notes = [line for line in first.stderr.splitlines() if line.startswith("minit2i:")]
    assert notes == [
        f"minit2i: downloading MiniT2I/MiniT2I {TRANSFORMER}diffusion_pytorch_model.safetensors, "
        f"{human_size(len(weights))}, once",
        f"minit2i: downloading {T5_REPO} model.safetensors, {human_size(len(t5_weights))}, once",
    ]
    fetched = {(path.split("/resolve/")[0][1:], path.split("/", 5)[-1]) for method, path, rng in fake_hub.requests
               if method == "GET" and "/resolve/" in path and rng is None}
    assert fetched == {("MiniT2I/MiniT2I", TRANSFORMER + "config.json"),
                       ("MiniT2I/MiniT2I", TRANSFORMER + "diffusion_pytorch_model.safetensors"),
                       (T5_REPO, "config.json"), (T5_REPO, "tokenizer.json"), (T5_REPO, "model.safetensors")}
    assert Path("cat.png").is_file()

    before = len(fake_hub.requests)
    again = run_cli(tmp_path, env, "generate", "-p", "a cat", "--model", "MiniT2I/MiniT2I", *SMALL, "-o", "again.png")
    assert (again.returncode, again.stderr) == (0, "")
    assert len(fake_hub.requests) == before  # cached: the network is not touched
    np.testing.assert_array_equal(pixels("cat.png"), pixels("again.png"))


def test_wrong_t5_is_refused_from_its_header_before_its_data_is_downloaded(fake_hub, tiny_model, tmp_path):
    result = run_cli(tmp_path, {"HF_ENDPOINT": fake_hub.url}, "generate", "-p", "a cat",
                     "--model", "MiniT2I/MiniT2I", "--t5", "other-org/wide-t5", *SMALL)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("minit2i: error: other-org/wide-t5/model.safetensors is the wrong T5 encoder: "
                                    "it has d_model 32")
    reads = [rng for method, path, rng in fake_hub.requests
             if method == "GET" and path.startswith("/other-org/wide-t5/resolve/") and path.endswith("model.safetensors")]
    assert reads and all(rng and rng.startswith("bytes=") for rng in reads)  # header range reads only
    assert not (tmp_path / "hf-hub" / "models--other-org--wide-t5" / "snapshots" / fake_hub.commit("other-org/wide-t5")
                / "model.safetensors").exists()


def test_t5_repo_without_tokenizer_is_refused_before_its_weights_are_downloaded(fake_hub, tmp_path):
    result = run_cli(tmp_path, {"HF_ENDPOINT": fake_hub.url}, "generate", "-p", "a cat",
                     "--model", "MiniT2I/MiniT2I", "--t5", "other-org/bare-t5", *SMALL)
    assert (result.returncode, result.stderr) == (
        2, "minit2i: error: other-org/bare-t5 has no tokenizer.json; it does not hold a usable T5 encoder\n")
    assert not [p for m, p, r in fake_hub.requests if p.startswith("/other-org/bare-t5/resolve/")
                and p.endswith("model.safetensors")]


def test_info_online_says_what_would_be_downloaded_and_downloads_nothing(fake_hub, tiny_model, tmp_path):
    result = run_cli(tmp_path, {"HF_ENDPOINT": fake_hub.url}, "info", T5_REPO)
    assert (result.returncode, result.stderr) == (0, "")
    sizes = {n: human_size(len(c)) for n, c in t5_files(tiny_model).items()}
    total = human_size(sum(len(c) for c in t5_files(tiny_model).values()))
    assert result.stdout.splitlines()[2] == (
        f"  download:   config.json ({sizes['config.json']}), tokenizer.json ({sizes['tokenizer.json']}), "
        f"model.safetensors ({sizes['model.safetensors']}); {total} in all, fetched by the first run that needs it")
    paths = [path for method, path, rng in fake_hub.requests]
    assert f"/api/models/{T5_REPO}" in paths
    assert not [p for p in paths if "/resolve/" in p]  # not a byte of any file
    assert not (tmp_path / "hf-hub" / f"models--{T5_REPO.replace('/', '--')}").exists()


def test_unknown_repo_and_unreachable_hub_are_one_line(fake_hub, tmp_path):
    result = run_cli(tmp_path, {"HF_ENDPOINT": fake_hub.url}, "generate", "-p", "a cat", "--model", "nobody/nothing")
    assert (result.returncode, result.stderr) == (2, (
        "minit2i: error: nobody/nothing: no such local path, and no model repo of that name on the Hub "
        "(a private one needs `hf auth login`); check the name\n"))
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    result = run_cli(tmp_path, {"HF_ENDPOINT": f"http://127.0.0.1:{closed}"}, "generate", "-p", "a cat",
                     "--model", "MiniT2I/MiniT2I")
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"minit2i: error: MiniT2I/MiniT2I: {TRANSFORMER}config.json, ")
    assert f"and the Hub at http://127.0.0.1:{closed} cannot be reached (" in result.stderr
    assert result.stderr.endswith(f"fetch them with: hf download MiniT2I/MiniT2I {TRANSFORMER}config.json "
                                  f"{TRANSFORMER}diffusion_pytorch_model.safetensors\n")


MISBEHAVIOURS = ["silent", "trickle", "not-json", "revision", "shell"]


@pytest.mark.parametrize("how", MISBEHAVIOURS)
@pytest.mark.parametrize("command", ["generate", "info"])
def test_a_misbehaving_hub_is_one_line_within_the_timeout(fake_hub, tmp_path, how, command):
    """Silent or trickling answers are given up after HF_HUB_DOWNLOAD_TIMEOUT (1 s here); an
    answer that is not JSON or names a revision that is not a commit is refused; nothing is
    written into the cache or beside it. A run takes a few seconds (a few 1 s timeouts and the
    start-up); the 60 s bound is a hang guard against a timeout that is not honoured."""
    repo = f"bad-org/{how}"
    fake_hub.misbehaving[repo] = how
    env = {"HF_ENDPOINT": fake_hub.url, "HF_HUB_DOWNLOAD_TIMEOUT": "1", "HF_HUB_ETAG_TIMEOUT": "1"}
    args = ["generate", "-p", "a cat", "--model", repo, "-o", "x.png"] if command == "generate" else ["info", repo]
    started = time.monotonic()
    result = run_cli(tmp_path, env, *args)
    assert time.monotonic() - started < 60
    assert result.returncode == (2 if command == "generate" or how in ("not-json", "revision", "shell") else 0)
    line = result.stderr if command == "generate" else result.stderr or result.stdout
    assert "Traceback" not in result.stderr and result.stderr.count("\n") <= 1
    words = {"silent": ["cannot be reached", "HF_HUB_OFFLINE=1", fake_hub.url],
             "trickle": ["cannot be reached", "HF_HUB_OFFLINE=1", fake_hub.url],
             "not-json": ["gave an answer that cannot be read", fake_hub.url],
             "revision": ["'../../..', which is not a commit hash"],
             "shell": ["which is not a commit hash"]}[how]
    assert all(w in line for w in words), line
    assert not Path("x.png").exists() and not Path("pwned").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("repo_id", ["a/b.", "a/b-", "org/" + "n" * 97])
def test_repo_ids_the_hub_refuses_are_one_line_without_the_network(fake_hub, tmp_path, capsys, repo_id):
    for args in (["generate", "-p", "a cat", "--model", repo_id], ["info", repo_id]):
        code, out, err = cli(capsys, *args)
        assert code == 2 and err.count("\n") == 1 and "not a valid Hub repo id" in err, err
    assert fake_hub.requests == []
