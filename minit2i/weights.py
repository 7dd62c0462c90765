"""One weight loader for both halves: safetensors files -> float32 NumPy arrays, checked.

Where weights come from (spec 1.3, 2.1, 6.3):
  * a `.safetensors` file;
  * a diffusers model folder (`transformer/` with `diffusion_pytorch_model.safetensors`);
  * the MiniT2I pipeline repo (`minit2i-b-16/transformer/...`, variant picked by name);
  * an HF snapshot folder (`snapshots/<rev>`) or an HF cache repo folder (`models--org--name`),
    or the HF hub cache root itself (it holds `models--MiniT2I--MiniT2I`, ...).

`safetensors.safe_open` validates every file and lists dtypes and shapes. Payloads are then
memory-mapped: float32 tensors are zero-copy read-only views of the file, float16/bfloat16 are
widened to float32 one tensor at a time, so loading never holds two float copies of the model.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open

from .config import (
    MODEL_VARIANTS,
    VARIANT_ALIASES,
    MMJiTConfig,
    T5Config,
    _read_json,
)
from .errors import MiniT2IError

MMJIT_PREFIXES = ("model.diffusion_model.model.net.", "model.diffusion_model.net.", "model.net.", "net.")
# Computed by the torch ports but never used by the output (spec 2.4).
MMJIT_DEAD_PREFIXES = ("t_embedder.", "pooled_embedder.")
# A full T5ForConditionalGeneration file also carries these; the encoder ignores them.
T5_IGNORED_PREFIXES = ("decoder.", "lm_head.")
T5_TIED_EMBEDDING = "encoder.embed_tokens.weight"
SUPPORTED_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}
T5_NAMES_BY_WIDTH = {512: "flan-t5-small", 768: "flan-t5-base", 1024: "flan-t5-large",
                     2048: "flan-t5-xl", 4096: "flan-t5-xxl"}
HF_REPOS = {"mmjit": "models--MiniT2I--MiniT2I", "t5": "models--google--flan-t5-large"}

log = logging.getLogger(__name__)


@dataclass
class LoadedWeights:
    """Checked float32 tensors under their stripped names, plus where they came from."""

    config: MMJiTConfig | T5Config
    tensors: dict[str, np.ndarray]
    files: list[Path]
    prefix: str
    stored_dtypes: list[str]
    config_source: str
    ignored: list[str] = field(default_factory=list)
    text_encoder: str | None = None  # the T5 repo a MiniT2I config.json names (`llm`)

    @property
    def num_parameters(self) -> int:
        return sum(int(t.size) for t in self.tensors.values())


# ---------------------------------------------------------------------------------------------
# Expected keys and shapes


def mmjit_expected_shapes(cfg: MMJiTConfig) -> dict[str, tuple[int, ...]]:
    """Every live MMJiT tensor (stripped name -> torch-layout shape), spec 2.2."""
    d, dh, hid, p = cfg.hidden_size, cfg.head_dim, cfg.mlp_hidden, cfg.patch_size
    shapes = {
        "img_embedder.proj1.weight": (cfg.pca_channels, cfg.in_channels, p, p),
        "img_embedder.proj2.weight": (d, cfg.pca_channels, 1, 1),
        "img_embedder.proj2.bias": (d,),
        "txt_embedder.weight": (d, cfg.txt_input_size),
        "mask_token": (1, 1, cfg.txt_input_size),
        "final_layer.norm_final.weight": (d,),
        "final_layer.linear.weight": (cfg.patch_dim, d),
        "final_layer.linear.bias": (cfg.patch_dim,),
    }

    def mlp(prefix):
        return {f"{prefix}.w1.weight": (hid, d), f"{prefix}.w3.weight": (hid, d), f"{prefix}.w2.weight": (d, hid)}

    for i in range(cfg.txt_preamble_depth):
        b = f"txt_preamble_blocks.{i}"
        shapes.update({
            f"{b}.norm1.weight": (d,), f"{b}.norm2.weight": (d,),
            f"{b}.qkv.weight": (3 * d, d), f"{b}.qkv.bias": (3 * d,),
            f"{b}.q_norm.weight": (dh,), f"{b}.k_norm.weight": (dh,),
            f"{b}.attn_proj.weight": (d, d), f"{b}.attn_proj.bias": (d,),
            **mlp(f"{b}.mlp"),
        })
    for i in range(cfg.depth_double):
        b = f"double_blocks.{i}"
        shapes.update({f"{b}.q_norm.weight": (dh,), f"{b}.k_norm.weight": (dh,)})
        for s in ("img", "txt"):
            shapes.update({
                f"{b}.{s}_norm1.weight": (d,), f"{b}.{s}_norm2.weight": (d,),
                f"{b}.{s}_qkv.weight": (3 * d, d), f"{b}.{s}_qkv.bias": (3 * d,),
                f"{b}.{s}_attn_proj.weight": (d, d), f"{b}.{s}_attn_proj.bias": (d,),
                **mlp(f"{b}.{s}_mlp"),
            })
    return shapes


def t5_expected_shapes(cfg: T5Config) -> dict[str, tuple[int, ...]]:
    """Every T5 encoder tensor (HF name -> shape), spec 6.3."""
    d, inner, ff = cfg.d_model, cfg.inner_dim, cfg.d_ff
    shapes = {
        "shared.weight": (cfg.vocab_size, d),
        "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight":
            (cfg.relative_attention_num_buckets, cfg.num_heads),
        "encoder.final_layer_norm.weight": (d,),
    }
    for i in range(cfg.num_layers):
        b = f"encoder.block.{i}.layer"
        shapes.update({
            f"{b}.0.SelfAttention.q.weight": (inner, d), f"{b}.0.SelfAttention.k.weight": (inner, d),
            f"{b}.0.SelfAttention.v.weight": (inner, d), f"{b}.0.SelfAttention.o.weight": (d, inner),
            f"{b}.0.layer_norm.weight": (d,),
            f"{b}.1.DenseReluDense.wi_0.weight": (ff, d), f"{b}.1.DenseReluDense.wi_1.weight": (ff, d),
            f"{b}.1.DenseReluDense.wo.weight": (d, ff),
            f"{b}.1.layer_norm.weight": (d,),
        })
    return shapes


# ---------------------------------------------------------------------------------------------
# Config inference from shapes (used when no config.json sits next to the weights)


def infer_mmjit_config(shapes: dict[str, tuple[int, ...]]) -> MMJiTConfig:
    """Read the architecture off the tensor shapes; image_size and prompt_length keep defaults."""
    need = ["img_embedder.proj1.weight", "img_embedder.proj2.weight", "txt_embedder.weight",
            "double_blocks.0.q_norm.weight", "double_blocks.0.img_mlp.w1.weight"]
    missing = [k for k in need if k not in shapes]
    if missing:
        raise MiniT2IError(
            "not a MiniT2I transformer checkpoint: missing " + ", ".join(missing)
            + "; pass minit2i-b-16/transformer/diffusion_pytorch_model.safetensors (or its folder)"
        )
    pca, channels, patch, _ = shapes["img_embedder.proj1.weight"]
    hidden = shapes["img_embedder.proj2.weight"][0]
    head_dim = shapes["double_blocks.0.q_norm.weight"][0]
    mlp_hidden = shapes["double_blocks.0.img_mlp.w1.weight"][0]
    dead = shapes.get("t_embedder.mlp.0.weight")
    return MMJiTConfig(
        patch_size=patch, in_channels=channels, pca_channels=pca, hidden_size=hidden,
        txt_input_size=shapes["txt_embedder.weight"][1],
        depth_double=_count_blocks(shapes, "double_blocks"),
        txt_preamble_depth=_count_blocks(shapes, "txt_preamble_blocks"),
        num_heads=hidden // head_dim, head_dim=head_dim, mlp_ratio=mlp_hidden / hidden,
        cond_vec_size=dead[0] if dead else hidden,
    )


def infer_t5_config(shapes: dict[str, tuple[int, ...]]) -> T5Config:
    """Read a T5 v1.1 encoder's size off its tensor shapes."""
    if "encoder.block.0.layer.1.DenseReluDense.wi.weight" in shapes:
        raise MiniT2IError(
            "this T5 has an ungated ReLU feed-forward (original T5); MiniT2I needs the T5 v1.1 "
            "gated-gelu encoder of google/flan-t5-large"
        )
    bias = "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    need = ["shared.weight", bias, "encoder.block.0.layer.0.SelfAttention.q.weight",
            "encoder.block.0.layer.1.DenseReluDense.wi_0.weight"]
    missing = [k for k in need if k not in shapes]
    if missing:
        raise MiniT2IError(
            "not a T5 encoder checkpoint: missing " + ", ".join(missing)
            + "; pass google/flan-t5-large's model.safetensors (or its folder)"
        )
    buckets, heads = shapes[bias]
    vocab, d_model = shapes["shared.weight"]
    return T5Config(
        vocab_size=vocab, d_model=d_model, num_heads=heads,
        d_kv=shapes["encoder.block.0.layer.0.SelfAttention.q.weight"][0] // heads,
        d_ff=shapes["encoder.block.0.layer.1.DenseReluDense.wi_0.weight"][0],
        num_layers=_count_blocks(shapes, "encoder.block"),
        relative_attention_num_buckets=buckets,
    )


def _count_blocks(shapes, prefix: str) -> int:
    pattern = re.compile(re.escape(prefix) + r"\.(\d+)\.")
    found = {int(m.group(1)) for k in shapes if (m := pattern.match(k))}
    return max(found) + 1 if found else 0


# ---------------------------------------------------------------------------------------------
# Finding files
#
# Which files of a folder or Hub repo make up a model is decided once, on a listing of relative
# names (`choose_mmjit`, `choose_t5`): for a local folder the listing is read from disk, for a
# repo id it is the Hub's file list (`minit2i.hub`), so both accept exactly the same layouts.

MMJIT_WEIGHTS = "diffusion_pytorch_model.safetensors"
T5_WEIGHTS = "model.safetensors"
T5_INDEX = "model.safetensors.index.json"
# Where tokenizer.json may sit, relative to the T5 weights' folder: a T5 repo, a pipeline's text_encoder/.
TOKENIZER_PLACES = ("tokenizer.json", "../tokenizer/tokenizer.json", "../tokenizer.json")


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
    """The transformer of a file listing: diffusers folder, its parent, a pipeline variant, or a lone file."""
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
    """The shard files a `model.safetensors.index.json` lists, sorted, each named relative to it."""
    try:
        shards = sorted(set(json.loads(path.read_text())["weight_map"].values()))
    except (OSError, ValueError, KeyError, AttributeError, TypeError) as err:
        raise MiniT2IError(f"{path} is not a valid shard index ({err}); re-download it") from None
    if not shards or not all(isinstance(s, str) and "/" not in s and s not in (".", "..") for s in shards):
        raise MiniT2IError(f"{path} is not a valid shard index (its weight_map must name files beside it); re-download it")
    return shards


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


def find_mmjit_files(path: str | Path, variant: str = "minit2i-b-16") -> tuple[list[Path], Path | None]:
    """Resolve any accepted local MMJiT location to (safetensors files, config.json or None)."""
    root = _existing(path, "--model")
    if root.is_file():
        return [root], _sibling_config(root)
    root = _hf_cache_snapshot(root, "mmjit")
    return _local_files(root, choose_mmjit(local_listing(root), variant, str(root)))


def find_t5_files(path: str | Path) -> tuple[list[Path], Path | None]:
    """Resolve any accepted local T5 location to (safetensors files, config.json or None)."""
    root = _existing(path, "--t5")
    if root.is_file():
        return [root], _sibling_config(root)
    root = _hf_cache_snapshot(root, "t5")
    return _local_files(root, choose_t5(local_listing(root), str(root), lambda index: read_shard_index(root / index)))


def find_tokenizer_json(t5_files: list[Path], explicit: str | Path | None = None) -> Path:
    """tokenizer.json next to the T5 weights (or one folder up), unless given explicitly."""
    if explicit is not None:
        return _existing(explicit, "--tokenizer")
    folder = t5_files[0].parent
    for place in TOKENIZER_PLACES:
        candidate = Path(os.path.normpath(folder / place))
        if candidate.is_file():
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
    names = set()
    for pattern in ("*", "*/*", "*/transformer/*"):
        names.update(p.relative_to(root).as_posix() for p in root.glob(pattern) if not p.is_dir())
    return names


def _local_files(root: Path, choice: Choice) -> tuple[list[Path], Path | None]:
    weights = [root / name for name in choice.weights]
    for path in weights:
        _existing(path, "weights file")
    return weights, root / choice.config if choice.config else None


def _existing(path, flag: str) -> Path:
    """`path` as a Path if it can be used; otherwise say exactly why not (missing, broken link, loop, denied)."""
    p = Path(path).expanduser()
    try:
        p.stat()
    except OSError as err:
        if err.errno == errno.ENOENT and p.is_symlink():
            why = (f"a link to {os.readlink(p)}, which does not exist (an interrupted download or a cleaned "
                   "cache); re-download it")
        elif err.errno == errno.ENOENT:
            why = "no such file or folder; check the path"
        elif err.errno == errno.ELOOP:
            why = "a loop of symbolic links; point at the real file or folder"
        else:
            why = f"cannot be read ({err.strerror}); check its permissions"
        raise MiniT2IError(f"{flag} {path}: {why}") from None
    return p


def _sibling_config(weights: Path) -> Path | None:
    cfg = weights.parent / "config.json"
    return cfg if cfg.is_file() else None


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
    commit, problem = _read_ref(repo / "refs" / "main")
    if commit is not None and (folder / commit).is_dir():
        return folder / commit
    if commit is not None:
        problem = f"names {commit}, which is not in {folder}"
    if not snapshots:
        return None
    newest = max(snapshots, key=lambda p: p.stat().st_mtime)
    if problem:
        log.warning(f"{repo / 'refs' / 'main'} {problem}; using the newest snapshot, {newest.name}")
    return newest


def _read_ref(ref: Path) -> tuple[str | None, str | None]:
    """(commit named by a refs/ file, or None; why it is unusable, or None when fine or absent)."""
    try:
        raw = ref.read_bytes()
    except FileNotFoundError:
        return None, None
    except OSError as err:
        return None, f"cannot be read ({err.strerror})"
    try:
        commit = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        return None, "is not a commit hash (it holds binary data)"
    if not commit:
        return None, "is empty"
    if not re.fullmatch(r"[\w.-]+", commit) or commit in (".", ".."):
        return None, f"is not a commit hash ({commit[:40]!r})"
    return commit, None


# ---------------------------------------------------------------------------------------------
# Reading tensors


def read_index(files: list[Path]) -> dict[str, tuple[str, tuple[int, ...], Path]]:
    """Validate each file with safetensors and list name -> (dtype, shape, file)."""
    index = {}
    for path in files:
        try:
            with safe_open(str(path), framework="numpy") as f:
                for name in f.keys():
                    s = f.get_slice(name)
                    index[name] = (s.get_dtype(), tuple(s.get_shape()), path)
        except (SafetensorError, OSError, ValueError) as err:
            raise MiniT2IError(
                f"{path} is not a readable safetensors file ({err}); re-download or re-convert it"
            ) from None
    return index


class _MappedFile:
    """A read-only memory map of one safetensors file with its header offsets."""

    def __init__(self, path: Path):
        raw = np.memmap(path, dtype=np.uint8, mode="r")
        header_len = int(raw[:8].view("<u8")[0])
        self.header = json.loads(bytes(raw[8:8 + header_len]))
        self.data = raw[8 + header_len:]

    def tensor(self, name: str) -> np.ndarray:
        """The tensor as float32: a view for F32, a widened copy for F16 and BF16."""
        entry = self.header[name]
        start, end = entry["data_offsets"]
        raw = self.data[start:end].view(SUPPORTED_DTYPES[entry["dtype"]]).reshape(entry["shape"])
        if entry["dtype"] == "F32":
            return raw
        if entry["dtype"] == "F16":
            return raw.astype(np.float32)
        # bfloat16 is the top half of a float32: shift the 16 stored bits into place.
        widened = raw.astype(np.uint32)
        widened <<= 16
        return widened.view(np.float32)


def check_tensors(index, expected: dict[str, tuple[int, ...]], ignored_prefixes, what: str, fix: str) -> list[str]:
    """Compare found names/shapes/dtypes with the expected ones; one error lists every problem.

    Returns the ignored names (dead or decoder tensors) for reporting.
    """
    found = {k: v for k, v in index.items() if not k.startswith(ignored_prefixes)}
    ignored = sorted(set(index) - set(found))
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    misshaped = sorted(k for k in set(expected) & set(found) if tuple(found[k][1]) != tuple(expected[k]))
    bad_dtype = sorted(k for k in found if found[k][0] not in SUPPORTED_DTYPES)
    problems = []
    if missing:
        problems.append(f"missing {len(missing)} tensor(s): {_short_list(missing)}")
    if unexpected:
        problems.append(f"unexpected {len(unexpected)} tensor(s): {_short_list(unexpected)}")
    if misshaped:
        problems.append(f"wrong shape for {len(misshaped)} tensor(s): " + _short_list(
            [f"{k} {list(found[k][1])} (expected {list(expected[k])})" for k in misshaped]))
    if bad_dtype:
        problems.append(f"unsupported dtype for {len(bad_dtype)} tensor(s): " + _short_list(
            [f"{k} {found[k][0]}" for k in bad_dtype]) + " (supported: F32, F16, BF16)")
    if problems:
        raise MiniT2IError(f"{what}: " + "; ".join(problems) + f"; {fix}")
    return ignored


def _short_list(items: list[str], limit: int = 6) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _materialise(index, names_to_file_names: dict[str, str]) -> dict[str, np.ndarray]:
    """Map each file once; `index` is keyed by our names, the files by their stored names."""
    maps: dict[Path, _MappedFile] = {}
    tensors = {}
    for name, stored_name in names_to_file_names.items():
        path = index[name][2]
        if path not in maps:
            maps[path] = _MappedFile(path)
        tensors[name] = maps[path].tensor(stored_name)
    return tensors


@dataclass
class CheckedHeader:
    """What the safetensors headers alone establish: the config, and where each live tensor is."""

    config: MMJiTConfig | T5Config
    config_source: str
    index: dict  # our tensor name -> (dtype, shape, file)
    stored_names: dict[str, str]  # our tensor name -> its name in the file
    prefix: str
    ignored: list[str]


def load_mmjit(path: str | Path, variant: str = "minit2i-b-16") -> LoadedWeights:
    """Load and check an MMJiT checkpoint; tensors keyed without the `model.net.` style prefix."""
    files, config_path = find_mmjit_files(path, variant)
    loaded = _load(files, check_mmjit_header(read_index(files), config_path, files[0]))
    loaded.text_encoder = named_text_encoder(config_path)
    return loaded


def load_t5(path: str | Path, expected_d_model: int | None = None) -> LoadedWeights:
    """Load and check a T5 v1.1 encoder; `expected_d_model` is the MMJiT's txt_input_size."""
    files, config_path = find_t5_files(path)
    return _load(files, check_t5_header(read_index(files), config_path, files[0], expected_d_model))


def named_text_encoder(config_path: Path | None) -> str | None:
    """The text encoder a diffusers MiniT2I config.json names in `llm` (google/flan-t5-large), if any."""
    raw = _read_json(config_path) if config_path is not None else None
    llm = raw.get("llm") if isinstance(raw, dict) else None
    return llm if isinstance(llm, str) and llm else None


def _load(files: list[Path], checked: CheckedHeader) -> LoadedWeights:
    stored_dtypes = sorted({checked.index[k][0] for k in checked.stored_names})
    return LoadedWeights(checked.config, _materialise(checked.index, checked.stored_names), files,
                         checked.prefix, stored_dtypes, checked.config_source, checked.ignored)


def check_mmjit_header(index, config_path: Path | None, label) -> CheckedHeader:
    """Check an MMJiT's tensor names and shapes (`read_index` output) against its config.

    Needs only the headers, so `minit2i.hub` runs it on a Hub file before downloading it.
    """
    prefix = _detect_prefix(index)
    stripped = {k[len(prefix):]: v for k, v in index.items() if k.startswith(prefix)}
    if len(stripped) != len(index):
        others = sorted(k for k in index if not k.startswith(prefix))
        raise MiniT2IError(
            f"{label}: tensors outside the {prefix!r} prefix: {_short_list(others)}; "
            "pass the MiniT2I transformer file alone"
        )
    shapes = {k: v[1] for k, v in stripped.items() if not k.startswith(MMJIT_DEAD_PREFIXES)}
    if config_path is not None:
        config, source = MMJiTConfig.from_json(config_path), str(config_path)
    else:
        config, source = _infer(infer_mmjit_config, shapes, label), "inferred from tensor shapes"
    ignored = check_tensors(
        stripped, mmjit_expected_shapes(config), MMJIT_DEAD_PREFIXES,
        f"{label} does not match the MMJiT config ({source})",
        "pass an unmodified MiniT2I transformer checkpoint (and its config.json)",
    )
    live = {k: prefix + k for k in mmjit_expected_shapes(config)}
    return CheckedHeader(config, source, stripped, live, prefix, ignored)


def check_t5_header(index, config_path: Path | None, label, expected_d_model: int | None = None) -> CheckedHeader:
    """Check a T5's tensor names and shapes (`read_index` output), and its width against the MMJiT's.

    Needs only the headers, so `minit2i.hub` refuses a wrong T5 on the Hub before downloading it.
    """
    index = dict(index)
    # Files carry the embedding as `shared.weight`, as its tied alias, or as both (spec 6.3).
    alias = index.pop(T5_TIED_EMBEDDING, None)
    embedding_name = "shared.weight"
    if "shared.weight" not in index and alias is not None:
        index["shared.weight"], embedding_name = alias, T5_TIED_EMBEDDING
    shapes = {k: v[1] for k, v in index.items() if not k.startswith(T5_IGNORED_PREFIXES)}
    if config_path is not None:
        config, source = T5Config.from_json(config_path), str(config_path)
    else:
        config, source = _infer(infer_t5_config, shapes, label), "inferred from tensor shapes"
    if expected_d_model is not None and config.d_model != expected_d_model:
        got = index.get("shared.weight", (None, ("?", config.d_model)))[1]
        name = T5_NAMES_BY_WIDTH.get(config.d_model, f"a T5 with d_model {config.d_model}")
        raise MiniT2IError(
            f"{label} is the wrong T5 encoder: it has d_model {config.d_model} (looks like {name}), "
            f"but this MiniT2I model needs d_model {expected_d_model} (google/flan-t5-large): "
            f"expected shared.weight [{config.vocab_size}, {expected_d_model}], found {list(got)}; "
            "pass google/flan-t5-large's model.safetensors"
        )
    expected = t5_expected_shapes(config)
    ignored = check_tensors(
        index, expected, T5_IGNORED_PREFIXES,
        f"{label} does not match the T5 config ({source})",
        "pass an unmodified google/flan-t5-large model.safetensors (and its config.json)",
    )
    stored = {k: embedding_name if k == "shared.weight" else k for k in expected}
    return CheckedHeader(config, source, index, stored, "", ignored)


def _detect_prefix(index) -> str:
    for prefix in MMJIT_PREFIXES:
        if any(k.startswith(prefix + "img_embedder.") for k in index):
            return prefix
    return ""


def _infer(fn, shapes, path):
    try:
        return fn(shapes)
    except MiniT2IError as err:
        raise MiniT2IError(f"{path}: {err}") from None


def nest(flat: dict[str, np.ndarray]) -> dict:
    """{'a.0.b': x} -> {'a': [{'b': x}]}: the checkpoint's names as a tree, picoGPT style."""
    tree: dict = {}
    for name, value in flat.items():
        node = tree
        parts = name.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return _lists_for_numbered(tree)


def _lists_for_numbered(node):
    if not isinstance(node, dict):
        return node
    node = {k: _lists_for_numbered(v) for k, v in node.items()}
    if node and all(k.isdigit() for k in node):
        return [node[str(i)] for i in range(len(node))]
    return node
