"""Weights by Hugging Face Hub repo id (`MiniT2I/MiniT2I`, `google/flan-t5-large`).

`--model` and `--t5` take a path or a repo id (`minit2i.repo_ids` tells them apart and imports this
module for a repo id only: it needs huggingface_hub 2.x). A repo id becomes a snapshot folder of
the Hugging Face cache (wherever `HF_HUB_CACHE` / `HF_HOME` put it), which `minit2i.model_files`
then reads like any folder:

* cached: if the snapshot `refs/main` names holds every file the model needs, it is used and the
  network is not touched;
* otherwise the Hub's file list (with sizes) is read, the same `choose_*` rules as for folders pick
  the files, the small ones (config.json, tokenizer.json, a shard index) are fetched, the weights'
  safetensors headers are checked with HTTP range reads (a wrong checkpoint is refused before its
  data is downloaded; of a JAX (Orbax) checkpoint, the `_METADATA` naming its parameter trees is
  fetched and the tree chosen first), one line says what will be downloaded and how big, and
  huggingface_hub downloads it (its progress bars, locks and resumable partial files);
* offline (`HF_HUB_OFFLINE=1`) or Hub unreachable: one `MiniT2IError` naming the repo, the files
  missing from the cache and the `hf download` command that fetches them.
"""

from __future__ import annotations

import logging
import posixpath
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import httpx2
from huggingface_hub import HfApi, constants, hf_hub_download, set_client_factory
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    SafetensorsParsingError,
)
from huggingface_hub.file_download import repo_folder_name
from huggingface_hub.utils import get_session, validate_repo_id

from minit2i.core.checkpoint import check_mmjit_header, check_orbax_tree, check_t5_header
from minit2i.core.checks import human_size
from minit2i.core.errors import MiniT2IError
from minit2i.core.files import write_atomically
from minit2i.core.mmjit_config import DEFAULT_VARIANT, VARIANT_ALIASES
from minit2i.core.safetensors_file import IndexEntry

from .model_files import (
    MMJIT_WEIGHTS,
    T5_WEIGHTS,
    Choice,
    cached_snapshot,
    choose_mmjit,
    choose_t5,
    is_orbax_choice,
    local_listing,
    looks_like_t5,
    read_shard_index,
)

log = logging.getLogger(__name__)

# An answer slower than this, in bytes per second averaged from the start, is given up once
# HF_HUB_DOWNLOAD_TIMEOUT seconds have passed (a dial-up modem is 7 kB/s).
MIN_RATE = 1000


class _BoundedTransport(httpx2.HTTPTransport):
    """Every Hub request gets a timeout on each phase (connect, each read, write), whatever the
    caller passed (`model_info` passes none), and a floor on the rate of its answer: an endpoint
    that accepts and never answers, or trickles bytes, is given up after HF_HUB_DOWNLOAD_TIMEOUT
    seconds (default 10) instead of hanging."""

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        limit = float(constants.HF_HUB_DOWNLOAD_TIMEOUT)
        request.extensions["timeout"] = dict.fromkeys(("connect", "read", "write", "pool"), limit)
        response = super().handle_request(request)
        response.stream = _RateFloor(response.stream, request, limit)
        return response


class _RateFloor(httpx2.SyncByteStream):
    """A response body that raises ReadTimeout when it arrives slower than MIN_RATE."""

    def __init__(self, stream, request: httpx2.Request, limit: float):
        self.stream, self.request, self.limit = stream, request, limit

    def __iter__(self):
        start, received = time.monotonic(), 0
        for chunk in self.stream:
            received += len(chunk)
            elapsed = time.monotonic() - start
            if elapsed > self.limit and received < MIN_RATE * elapsed:
                raise httpx2.ReadTimeout(f"{received} bytes in {elapsed:.0f} s", request=self.request)
            yield chunk

    def close(self) -> None:
        self.stream.close()


def _bounded_client_factory(event_hooks):
    """huggingface_hub's client (its request hooks: headers, auth) on the bounded transport."""
    return lambda: httpx2.Client(transport=_BoundedTransport(), event_hooks=event_hooks, follow_redirects=True)


set_client_factory(_bounded_client_factory(get_session().event_hooks))

COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass
class HubModel:
    """One model inside a Hub repo: how to pick its files and check their headers."""

    repo_id: str
    choose: Callable  # (names, where, read_shards) -> Choice, as weights.choose_*
    check: Callable  # (header index, config.json or None, labels) -> Checkpoint, as weights.check_*_header
    usual: list[str]  # the files it needs when nothing tells otherwise (offline, nothing cached); may be a pattern
    kind: str
    jax_tree: str | None = None  # the parameter tree of a JAX (Orbax) checkpoint (--jax-tree)


class HubUnreachable(MiniT2IError):
    """Files are missing from the cache and the Hub cannot be asked (offline or unreachable)."""


# The official JAX repos (MiniT2I/MiniT2I-B-16-jax, ...) hold an Orbax checkpoint folder: `checkpoint/` as
# the Mean Flow code's loader expects, or `checkpoint_<step>/` as the base code's does; offline, with
# nothing cached, the pattern fetches either.
JAX_REPO_SUFFIX = "-jax"
JAX_REPO_FILES = "checkpoint*"


def mmjit_model(repo_id: str, variant: str = DEFAULT_VARIANT, jax_tree: str | None = None) -> HubModel:
    folder = VARIANT_ALIASES.get(variant.lower(), variant) + "/transformer/"
    usual = [JAX_REPO_FILES] if repo_id.endswith(JAX_REPO_SUFFIX) else [folder + "config.json", folder + MMJIT_WEIGHTS]
    return HubModel(repo_id, lambda names, where, read_shards: choose_mmjit(names, variant, where),
                    check_mmjit_header, usual, "MiniT2I transformer", jax_tree)


def t5_model(repo_id: str, expected_d_model: int | None = None) -> HubModel:
    def choose(names, where, read_shards) -> Choice:
        choice = choose_t5(names, where, read_shards)
        # A T5 repo is used with its tokenizer: one not cached yet is missing, not absent.
        choice.tokenizer = choice.tokenizer or posixpath.join(posixpath.dirname(choice.weights[0]), "tokenizer.json")
        return choice

    def check(index, config_path, labels):
        return check_t5_header(index, config_path, labels, expected_d_model)

    return HubModel(repo_id, choose, check, ["config.json", T5_WEIGHTS, "tokenizer.json"], "T5 encoder")


def check_repo_id(repo_id: str) -> str:
    """`repo_id` if the Hub would accept it (huggingface_hub's own rule: no name ending in `.` or
    `-`, at most 96 characters, ...); otherwise one line, before the cache or network is touched."""
    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise MiniT2IError(f"{repo_id}: no such local path, and not a valid Hub repo id ({_first_line(err)}); "
                           "check the name") from None
    return repo_id


def local_snapshot(model: HubModel) -> Path:
    """The cached snapshot if it holds the model's files; otherwise download them (unless offline)."""
    snapshot, _, missing = cached_files(model, _snapshot(check_repo_id(model.repo_id)))
    if not missing:
        return snapshot
    if constants.is_offline_mode():
        raise not_cached(model, missing, "downloads are switched off (HF_HUB_OFFLINE=1)")
    return download(model, missing)


def cached_files(model: HubModel, snapshot: Path | None) -> tuple[Path | None, list[str], list[str]]:
    """(the cached `snapshot` or None, the files the model needs, those the snapshot lacks).

    The needed files are `model.usual` when nothing usable is cached.
    """
    if snapshot is None:
        return None, model.usual, model.usual
    try:
        needed = model.choose(local_listing(snapshot), model.repo_id,
                              lambda index: read_shard_index(snapshot / index)).files
    except MiniT2IError:  # e.g. another variant is cached: the usual files of this one are missing
        needed = model.usual
    return snapshot, needed, [name for name in needed if not (snapshot / name).is_file()]


def cache_folder(repo_id: str) -> Path:
    """`models--org--name` in the hub cache (HF_HUB_CACHE / HF_HOME, which huggingface_hub reads at import)."""
    return Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type="model")


def _snapshot(repo_id: str) -> Path | None:
    folder = cache_folder(repo_id)
    return cached_snapshot(folder) if (folder / "snapshots").is_dir() else None


def download(model: HubModel, missing: list[str]) -> Path:
    """Fetch what the model needs from the Hub: small files, then (after a header check) the weights."""
    api = HfApi()
    info = _model_info(model, missing)
    sizes = {s.rfilename: s.size or 0 for s in info.siblings or []}
    snapshot = cache_folder(model.repo_id) / "snapshots" / info.sha

    def fetch(name: str) -> Path:
        return Path(_hub(model, [name], lambda: hf_hub_download(model.repo_id, name, revision=info.sha)))

    choice = model.choose(set(sizes), model.repo_id, lambda index: read_shard_index(fetch(index)))
    for name in choice.files[:-len(choice.weights)]:
        fetch(name)
    _record_main(cache_folder(model.repo_id), info.sha)
    todo = [name for name in choice.weights if not (snapshot / name).is_file()]
    if todo:
        if is_orbax_choice(choice):  # an Orbax store has no header to range-read
            check_orbax_tree((snapshot / choice.index).parent, model.jax_tree)
        else:
            header = _hub(model, todo, lambda: remote_header(api, model.repo_id, info.sha, choice.weights))
            model.check(header, snapshot / choice.config if choice.config else None,
                        [f"{model.repo_id}/{name}" for name in todo])
        log.info(f"downloading {model.repo_id} {', '.join(todo)}, {human_size(sum(sizes[n] for n in todo))}, once")
        for name in todo:
            fetch(name)
    return snapshot


def _model_info(model: HubModel, missing: list[str]):
    """The Hub's description of the repo (file list with sizes, commit), checked: its commit
    becomes a folder name in the cache, so anything but a commit hash is refused."""
    info = _hub(model, missing, lambda: HfApi().model_info(model.repo_id, files_metadata=True))
    if not (isinstance(info.sha, str) and COMMIT.fullmatch(info.sha)):
        raise MiniT2IError(f"{model.repo_id}: the Hub at {constants.ENDPOINT} answered with revision "
                           f"{str(info.sha)[:50]!r}, which is not a commit hash; check HF_ENDPOINT")
    return info


def remote_header(api: HfApi, repo_id: str, revision: str, names: list[str]) -> dict[str, IndexEntry]:
    """`read_index` of files on the Hub, from their safetensors headers only (HTTP range reads)."""
    index = {}
    for name in names:
        tensors = api.parse_safetensors_file_metadata(repo_id, name, revision=revision).tensors
        index.update({k: IndexEntry(t.dtype, tuple(t.shape), name) for k, t in tensors.items()})
    return index


def describe_repo(repo_id: str, variant: str = DEFAULT_VARIANT) -> tuple[str, Path | None]:
    """What `info` says about a repo id, downloading nothing: the cached files, and the files a run
    would download with their sizes (from the Hub's file list; offline, what the cache tells).

    Returns the text, and the snapshot folder when it holds everything (to describe the model too).
    """
    snapshot = _snapshot(check_repo_id(repo_id))
    model = _model_for_info(repo_id, local_listing(snapshot) if snapshot else set(), variant)
    _, needed, missing = cached_files(model, snapshot)
    sizes: dict[str, int] = {}
    unknown = "sizes unknown offline"
    if missing and not constants.is_offline_mode():
        try:
            info = _model_info(model, missing)
        except HubUnreachable:
            unknown, info = f"sizes unknown: the Hub at {constants.ENDPOINT} cannot be reached; HF_HUB_OFFLINE=1 skips it", None
        sizes = {s.rfilename: s.size or 0 for s in info.siblings or []} if info else {}
    if sizes:
        model = _model_for_info(repo_id, set(sizes), variant)
        needed = model.choose(set(sizes), repo_id, lambda index: _shards_beside(index, sizes)).files
        missing = [n for n in needed if snapshot is None or not (snapshot / n).is_file()]
    cached = [n for n in needed if n not in missing]
    lines = [f"{repo_id}: Hugging Face Hub repo, {model.kind}",
             f"  cache:      {snapshot or f'nothing cached ({cache_folder(model.repo_id)})'}"]
    if cached:
        lines.append("  cached:     " + ", ".join(f"{n} ({human_size((snapshot / n).stat().st_size)})" for n in cached))
    if not missing:
        lines.append("  download:   nothing, every file is cached")
    elif sizes:
        lines.append("  download:   " + ", ".join(f"{n} ({human_size(sizes.get(n, 0))})" for n in missing)
                     + f"; {human_size(sum(sizes.get(n, 0) for n in missing))} in all, fetched by the first run "
                     "that needs it")
    else:
        lines.append(f"  download:   {', '.join(missing)} ({unknown}); fetch with: "
                     f"hf download {repo_id} {' '.join(missing)}")
    return "\n".join(lines), None if missing else snapshot


def _shards_beside(index: str, names) -> list[str]:
    """The .safetensors files beside a shard index (for `info`, which must not fetch the index)."""
    folder = posixpath.dirname(index)
    return sorted(posixpath.basename(n) for n in names
                  if n.endswith(".safetensors") and posixpath.dirname(n) == folder)


def _model_for_info(repo_id: str, names: set[str], variant: str) -> HubModel:
    """A repo that `looks_like_t5` is taken for a T5, any other for a MiniT2I transformer."""
    if looks_like_t5(names):
        return t5_model(repo_id)
    return mmjit_model(repo_id, variant)


def not_cached(model: HubModel, missing: list[str], why: str) -> HubUnreachable:
    them = "it" if len(missing) == 1 and "*" not in missing[0] else "them"
    # A pattern (a JAX checkpoint's folder, whose file names only the Hub knows) goes to --include.
    names = " ".join(f'--include "{name}"' if "*" in name else name for name in missing)
    return HubUnreachable(
        f"{model.repo_id}: {', '.join(missing)} not in the Hugging Face cache ({constants.HF_HUB_CACHE}) "
        f"and {why}; fetch {them} with: hf download {model.repo_id} {names}"
    )


def _record_main(folder: Path, commit: str) -> None:
    """Write refs/main as huggingface_hub does, so the next run finds this snapshot without the network.

    (Downloads by commit hash keep one consistent snapshot but leave refs/ alone.)
    """
    refs = folder / "refs"
    refs.mkdir(parents=True, exist_ok=True)
    write_atomically(refs / "main", commit.encode())


def _hub(model: HubModel, files: list[str], call):
    """Run one huggingface_hub call; its failures become one-line MiniT2IErrors."""
    repo = model.repo_id
    try:
        return call()
    except GatedRepoError:
        raise MiniT2IError(f"{repo} is gated on the Hub: accept its terms at https://huggingface.co/{repo} "
                           "and log in with `hf auth login`") from None
    except RepositoryNotFoundError:
        raise MiniT2IError(f"{repo}: no such local path, and no model repo of that name on the Hub "
                           "(a private one needs `hf auth login`); check the name") from None
    except (OfflineModeIsEnabled, LocalEntryNotFoundError, httpx2.TransportError) as err:
        raise not_cached(model, files, f"the Hub at {constants.ENDPOINT} cannot be reached ({_first_line(err)}; "
                                       "HF_HUB_OFFLINE=1 skips it)") from None
    except RemoteEntryNotFoundError:
        raise MiniT2IError(f"{repo} has no {', '.join(files)}; it does not hold a usable {model.kind}") from None
    except SafetensorsParsingError as err:
        raise MiniT2IError(f"{repo}: {_first_line(err)}; this repo does not hold a usable {model.kind}") from None
    except HfHubHTTPError as err:
        raise MiniT2IError(f"{repo}: the Hub answered {_first_line(err)}; try again later") from None
    except ValueError as err:  # an answer that is not JSON, or not the JSON of a repo
        raise MiniT2IError(f"{repo}: the Hub at {constants.ENDPOINT} gave an answer that cannot be read "
                           f"({_first_line(err)[:80]}); check HF_ENDPOINT, or set HF_HUB_OFFLINE=1") from None
    except OSError as err:  # writing the cache: disk full, permissions
        raise MiniT2IError(f"cannot write to the Hugging Face cache {constants.HF_HUB_CACHE} ({err.strerror or err}); "
                           "free some space or set HF_HUB_CACHE to another folder") from None


def _first_line(err: Exception) -> str:
    text = str(err).strip() or type(err).__name__
    return text.splitlines()[0]

