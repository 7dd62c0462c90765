"""Which files make up a model, in a folder, a file or a Hugging Face cache (model.md 1.3, 2.1, 6.3).

Accepted places:
  * a `.safetensors` file;
  * a diffusers model folder (`transformer/` with `diffusion_pytorch_model.safetensors`);
  * the MiniT2I pipeline repo (`minit2i-b-16/transformer/...`, variant picked by name);
  * an HF snapshot folder (`snapshots/<rev>`) or an HF cache repo folder (`models--org--name`),
    or the HF hub cache root itself (it holds `models--MiniT2I--MiniT2I`, ...);
  * an official JAX (Orbax) checkpoint, as the official loader finds it: a checkpoint folder
    (`checkpoint_<step>/`, or `checkpoint/` as on the Hub), a folder holding `checkpoint/`, or one
    holding several `checkpoint_<step>/` (the latest step wins).

Which files of a folder or Hub repo make up a model is decided once, on a listing of relative
names (`choose_mmjit`, `choose_t5`): for a local folder the listing is read from disk, for a
repo id it is the Hub's file list (`minit2i.hub`), so both accept exactly the same layouts.
`inspect_mmjit` / `inspect_t5` then check the files found from their headers alone
(`minit2i.core.checkpoint`).
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from minit2i.core.checkpoint import (
    Checkpoint,
    LoadedWeights,
    check_mmjit_header,
    check_orbax_checkpoint,
    check_t5_header,
)
from minit2i.core.checks import (existing_path, is_folder, read_json, read_json_object, read_limited, short_list,
                                 shown, walk)
from minit2i.core.errors import MiniT2IError
from minit2i.core.mmjit_config import DEFAULT_VARIANT, VARIANT_ALIASES
from minit2i.core.orbax_file import ORBAX_METADATA
from minit2i.core.safetensors_file import MappedFile, index_of, read_headers

HF_REPOS = {"mmjit": "models--MiniT2I--MiniT2I", "t5": "models--google--flan-t5-large"}

log = logging.getLogger(__name__)

MMJIT_WEIGHTS = "diffusion_pytorch_model.safetensors"
T5_WEIGHTS = "model.safetensors"
T5_INDEX = "model.safetensors.index.json"
REF_LIMIT = 4096  # refs/main holds a 40-character commit hash
# Where tokenizer.json may sit, relative to the T5 weights' folder: a T5 repo, a pipeline's text_encoder/.
TOKENIZER_PLACES = ("tokenizer.json", "../tokenizer/tokenizer.json", "../tokenizer.json")
# The folder names the official JAX loader takes for a checkpoint (flax's `checkpoint_<step>`, the Hub's `checkpoint`).
ORBAX_FOLDER = re.compile(r"checkpoint(_(\d+))?")


@dataclass
class Choice:
    """One model's files inside a folder or repo, as relative posix names."""

    weights: list[str]
    config: str | None
    tokenizer: str | None = None
    index: str | None = None  # the shard index the weights were read from, if sharded

    @property
    def files(self) -> list[str]:
        """Every file to fetch: small ones (config, tokenizer, index) first, then the weights."""
        return [f for f in (self.config, self.tokenizer, self.index) if f] + self.weights


def choose_mmjit(names: set[str], variant: str, where: str) -> Choice:
    """The transformer of a file listing: an Orbax checkpoint, a diffusers folder, its parent, a
    pipeline variant, or a lone file."""
    orbax = choose_orbax(names, where)
    if orbax is not None:
        metadata = orbax + ORBAX_METADATA
        return Choice(sorted(n for n in names if n.startswith(orbax) and n != metadata), None, index=metadata)
    variant = VARIANT_ALIASES.get(variant.lower(), variant)
    for folder in ("", "transformer/", f"{variant}/transformer/"):
        if folder + MMJIT_WEIGHTS in names:
            return _choice(names, [folder + MMJIT_WEIGHTS])
    variants = sorted(n.split("/")[0] for n in names if n.count("/") == 2 and n.endswith("/transformer/" + MMJIT_WEIGHTS))
    if variants:
        raise MiniT2IError(
            f"{where} has no variant {variant!r}; it has {', '.join(variants)}: pass --variant with one of them"
        )
    return _choice(names, _lone_safetensors(names, where, "MiniT2I transformer", MMJIT_WEIGHTS))


def choose_orbax(names: set[str], where: str) -> str | None:
    """The Orbax checkpoint folder of a file listing, as a prefix ("" for the listing's own root),
    by the official loader's order: the root itself, `checkpoint/`, the latest `checkpoint_<step>/`
    (two folders naming that step, `checkpoint_5` and `checkpoint_05`, are refused); None when the
    listing holds none. A folder counts when it has its `_METADATA`."""
    folders = {name.rpartition("/")[0] for name in names if name.rpartition("/")[2] == ORBAX_METADATA}
    if "" in folders or "checkpoint" in folders:
        return "" if "" in folders else "checkpoint/"
    steps: dict[int, list[str]] = {}
    for folder in sorted(folders):
        if (match := ORBAX_FOLDER.fullmatch(folder)) and match.group(2):
            steps.setdefault(int(match.group(2)), []).append(folder)
    if not steps:
        return None
    latest = steps[max(steps)]
    if len(latest) > 1:  # checkpoint_5 and checkpoint_05: which one wins would depend on listing order
        raise MiniT2IError(f"{where}: {' and '.join(latest)} both hold step {max(steps)}; remove or rename all but one "
                           "(or pass the checkpoint folder itself)")
    return latest[0] + "/"


def choose_t5(names: set[str], where: str, read_shards) -> Choice:
    """The T5 of a file listing: a shard index, model.safetensors (also under text_encoder/), or a lone file.

    `read_shards(index_name)` returns the shard file names an index lists (it may have to fetch it).
    """
    for folder in ("", "text_encoder/"):
        if folder + T5_INDEX in names:
            shards = [folder + shard for shard in read_shards(folder + T5_INDEX)]
            return _choice(names, shards, index=folder + T5_INDEX)
        if folder + T5_WEIGHTS in names:
            return _choice(names, [folder + T5_WEIGHTS])
    return _choice(names, _lone_safetensors(names, where, "T5 encoder", T5_WEIGHTS))


def read_shard_index(path: Path) -> list[str]:
    """The shard files a `model.safetensors.index.json` lists, sorted, as names in its folder
    (a damaged or hostile index must not send the loader elsewhere)."""
    fix = "re-download it"
    weight_map = read_json_object(path, "shard index").get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise MiniT2IError(f"{path}: expected a non-empty \"weight_map\" object, found {shown(weight_map)}; {fix}")
    bad = [f"{k}: {shown(v)}" for k, v in weight_map.items()
           if not isinstance(v, str) or Path(v).name != v or v in ("", ".", "..")]
    if bad:
        raise MiniT2IError(f"{path}: weight_map values must be file names in its folder, found "
                           f"{short_list(bad, 3)}; {fix}")
    return sorted(set(weight_map.values()))


def _choice(names: set[str], weights: list[str], index: str | None = None) -> Choice:
    """Add the config.json beside the weights and the tokenizer.json near them, when listed."""
    folder = posixpath.dirname(weights[0])
    config = posixpath.join(folder, "config.json")
    tokenizers = [posixpath.normpath(posixpath.join(folder, place)) for place in TOKENIZER_PLACES]
    return Choice(weights, config if config in names else None,
                  next((t for t in tokenizers if t in names), None), index)


def _lone_safetensors(names: set[str], where: str, what: str, usual: str) -> list[str]:
    files = sorted(n for n in names if "/" not in n and n.endswith(".safetensors"))
    if len(files) == 1:
        return files
    if files:
        found, fix = f"{len(files)} .safetensors files", "pass the file itself"
    else:
        found, fix = "no .safetensors file", "check the path or download the weights into it"
    raise MiniT2IError(f"{where}: expected the {what} weights ({usual}), found {found}; {fix}")


def looks_like_t5(names: set[str]) -> bool:
    """A listing with T5 files (or a tokenizer.json) and no diffusion_pytorch_model.safetensors is a T5's."""
    t5_files = {T5_WEIGHTS, T5_INDEX, "text_encoder/" + T5_WEIGHTS, "text_encoder/" + T5_INDEX, "tokenizer.json"}
    return bool(names & t5_files) and not any(n.endswith(MMJIT_WEIGHTS) for n in names)


def find_mmjit_files(path: str | Path, variant: str = DEFAULT_VARIANT) -> tuple[list[Path], Path | None]:
    """Resolve any accepted local MMJiT location to (safetensors files, config.json or None), or
    to ([its folder], None) for an Orbax checkpoint (`is_orbax_folder`)."""
    root = existing_path(path, "--model")
    if root.is_file():
        return [root], _sibling_config(root)
    root = _hf_cache_snapshot(root, "mmjit")
    names = local_listing(root)
    if looks_like_t5(names):
        raise MiniT2IError(f"--model {path} holds a T5 text encoder ({short_list(sorted(names), 3)}), not the MiniT2I "
                           "transformer; pass it as --t5 and the transformer folder as --model")
    if ORBAX_FOLDER.fullmatch(root.name) and ORBAX_METADATA not in names:
        raise MiniT2IError(f"--model {path} is named like a JAX (Orbax) checkpoint folder but has no {ORBAX_METADATA}; "
                           "the checkpoint is incomplete: download or copy it again")
    choice = choose_mmjit(names, variant, str(root))
    if is_orbax_choice(choice):
        return [root / posixpath.dirname(choice.index)], None
    return _local_files(root, choice)


def is_orbax_choice(choice: Choice) -> bool:
    """Whether `choose_mmjit` chose an Orbax checkpoint (its `_METADATA` stands as the index)."""
    return posixpath.basename(choice.index or "") == ORBAX_METADATA


def is_orbax_folder(path: Path) -> bool:
    """Whether a `find_mmjit_files` result names an Orbax checkpoint folder rather than weight files."""
    return path.is_dir() and (path / ORBAX_METADATA).exists()


def find_t5_files(path: str | Path) -> tuple[list[Path], Path | None]:
    """Resolve any accepted local T5 location to (safetensors files, config.json or None)."""
    root = existing_path(path, "--t5")
    if root.is_file():
        return [root], _sibling_config(root)
    root = _hf_cache_snapshot(root, "t5")
    return _local_files(root, choose_t5(local_listing(root), str(root), lambda index: read_shard_index(root / index)))


def find_tokenizer_json(t5_files: list[Path], explicit: str | Path | None = None) -> Path:
    """tokenizer.json next to the T5 weights (or one folder up), unless given explicitly."""
    if explicit is not None:
        return existing_path(explicit, "--tokenizer")
    folder = t5_files[0].parent
    for place in TOKENIZER_PLACES:
        candidate = Path(os.path.normpath(folder / place))
        if os.path.lexists(candidate):  # a FIFO or broken link is named by its reader, not taken for absent
            return candidate
    raise MiniT2IError(
        f"no tokenizer.json next to {t5_files[0]}; put google/flan-t5-large's tokenizer.json there "
        "or pass --tokenizer PATH"
    )


def local_listing(root: Path) -> set[str]:
    """Relative names of the non-folder entries a model folder can use (what `choose_*` look at).

    Broken links are listed too, so that a chosen one is reported as broken, not as absent.
    """
    try:
        os.listdir(root)
    except OSError as err:
        raise MiniT2IError(f"cannot read the folder {root}: {err.strerror}; check its permissions") from None
    return {name for name, entry in walk(root, _listed_folder) if not is_folder(entry)}


def _listed_folder(name: str) -> bool:
    """Whether `local_listing` looks into the folder `name`: any at the top, `*/transformer`, and
    everything under `checkpoint*` (Orbax checkpoints' stores)."""
    parts = name.split("/")
    return len(parts) == 1 or parts[0].startswith("checkpoint") or parts[1:] == ["transformer"]



def _local_files(root: Path, choice: Choice) -> tuple[list[Path], Path | None]:
    """The chosen weights as usable paths (a cache's broken link is named as such), and the config."""
    flag = f"{root / choice.index} names the shard" if choice.index else "weights file"
    weights = [existing_path(root / name, flag) for name in choice.weights]
    return weights, root / choice.config if choice.config else None


def _sibling_config(weights: Path) -> Path | None:
    cfg = weights.parent / "config.json"
    return cfg if os.path.lexists(cfg) else None


def _hf_cache_snapshot(root: Path, kind: str) -> Path:
    """Step from the hub cache root or a `models--org--name` folder down to one snapshot."""
    if (root / HF_REPOS[kind]).is_dir():
        root = root / HF_REPOS[kind]
    if not (root / "snapshots").is_dir():
        return root
    snapshot = cached_snapshot(root)
    if snapshot is None:
        raise MiniT2IError(f"{root} is an HF cache folder with no snapshots; download the model into it first")
    return snapshot


def cached_snapshot(repo: Path) -> Path | None:
    """The snapshot `refs/main` names in an HF cache repo folder, else the newest one (None if none).

    huggingface_hub's own readers (`scan_cache_dir`, `try_to_load_from_cache`) raise on a non-UTF-8
    `refs/main` and drop a whole repo for one broken link, so damaged caches are read here: links and
    files in `snapshots/` that are not folders are skipped, and an unusable `refs/main` is reported
    (one log line) and replaced by the newest snapshot.
    """
    folder = repo / "snapshots"
    try:
        snapshots = [p for p in folder.iterdir() if p.is_dir()]
    except OSError as err:
        raise MiniT2IError(f"cannot read the folder {folder}: {err.strerror}; check its permissions") from None
    ref = repo / "refs" / "main"
    commit, problem = _read_ref(ref)
    if commit is not None and (folder / commit).is_dir():
        return folder / commit
    if commit is not None:
        problem = f"{ref} names {commit}, which is not in {folder}"
    if not snapshots:
        return None
    newest = max(snapshots, key=lambda p: p.stat().st_mtime)
    if problem:
        log.warning(f"{problem}; using the newest snapshot, {newest.name}")
    return newest


def _read_ref(ref: Path) -> tuple[str | None, str | None]:
    """(commit named by a refs/ file, or None; why it is unusable, or None when fine or absent)."""
    if not os.path.lexists(ref):
        return None, None
    try:
        raw = read_limited(ref, "refs/main", REF_LIMIT)
    except MiniT2IError as err:
        return None, str(err).split("; ")[0]  # the problem without its fix: the fix here is the fallback
    try:
        commit = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        return None, f"{ref} is not a commit hash (it holds binary data)"
    if not commit:
        return None, f"{ref} is empty"
    if not re.fullmatch(r"[\w.-]+", commit) or commit in (".", ".."):
        return None, f"{ref} is not a commit hash ({commit[:40]!r})"
    return commit, None


def inspect_mmjit(path: str | Path, variant: str = DEFAULT_VARIANT, jax_tree: str | None = None) -> Checkpoint:
    """Find and check a local MMJiT checkpoint from its headers and config.json alone (an Orbax
    one from its metadata, reading the parameter tree `jax_tree` names, by default the official one)."""
    files, config_path = find_mmjit_files(path, variant)
    if is_orbax_folder(files[0]):
        return check_orbax_checkpoint(files[0], jax_tree)
    if jax_tree is not None:
        raise MiniT2IError(f"--jax-tree chooses a tree of a JAX (Orbax) checkpoint, but {path} is not one; "
                           "drop --jax-tree")
    headers = read_headers(files)
    checkpoint = check_mmjit_header(index_of(headers), config_path, files)
    checkpoint.text_encoder = named_text_encoder(config_path)
    checkpoint.open_file = partial(MappedFile, checked=headers)
    return checkpoint


def inspect_t5(path: str | Path, expected_d_model: int | None = None) -> Checkpoint:
    """Find and check a local T5 v1.1 encoder from its headers and config.json alone;
    `expected_d_model` is the MMJiT's txt_input_size."""
    files, config_path = find_t5_files(path)
    headers = read_headers(files)
    checkpoint = check_t5_header(index_of(headers), config_path, files, expected_d_model)
    checkpoint.open_file = partial(MappedFile, checked=headers)
    return checkpoint


def load_mmjit(path: str | Path, variant: str = DEFAULT_VARIANT, jax_tree: str | None = None) -> LoadedWeights:
    """Load and check an MMJiT checkpoint; tensors keyed without the `model.net.` style prefix."""
    return inspect_mmjit(path, variant, jax_tree).load()


def load_t5(path: str | Path, expected_d_model: int | None = None) -> LoadedWeights:
    """Load and check a T5 v1.1 encoder; `expected_d_model` is the MMJiT's txt_input_size."""
    return inspect_t5(path, expected_d_model).load()


def named_text_encoder(config_path: Path | None) -> str | None:
    """The text encoder a diffusers MiniT2I config.json names in `llm` (google/flan-t5-large), if any."""
    raw = read_json(config_path, "config") if config_path is not None else None
    llm = raw.get("llm") if isinstance(raw, dict) else None
    return llm if isinstance(llm, str) and llm else None
