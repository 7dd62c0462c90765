"""One weight loader for both halves: safetensors files -> float32 NumPy arrays, checked.

Where weights come from (spec 1.3, 2.1, 6.3):
  * a `.safetensors` file;
  * a diffusers model folder (`transformer/` with `diffusion_pytorch_model.safetensors`);
  * the MiniT2I pipeline repo (`minit2i-b-16/transformer/...`, variant picked by name);
  * an HF snapshot folder (`snapshots/<rev>`) or an HF cache repo folder (`models--org--name`),
    or the HF hub cache root itself (it holds `models--MiniT2I--MiniT2I`, ...).

`safetensors.safe_open` validates every file and lists dtypes and shapes from its header:
`inspect_mmjit` / `inspect_t5` check names, shapes and the config from the headers alone, so a
wrong file is refused before any tensor is read (their `check_mmjit_header` / `check_t5_header`
also judge a Hub file's header before `minit2i.hub` downloads it). `Checkpoint.load` then
memory-maps the payloads: float32 tensors are zero-copy read-only views of the file,
float16/bfloat16 are widened to float32 one tensor at a time, so loading never holds two float
copies of the model.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open

from .checks import existing_path, read_json, read_json_object, shown
from .config import (
    MODEL_VARIANTS,
    VARIANT_ALIASES,
    MMJiTConfig,
    T5Config,
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
# Fields that tensor shapes cannot tell: without config.json they keep their defaults.
MMJIT_ASSUMED = ("image_size", "prompt_length")
T5_ASSUMED = ("relative_attention_max_distance", "layer_norm_epsilon")

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
    _require_dims(shapes, {"img_embedder.proj1.weight": 4, "img_embedder.proj2.weight": 4,
                           "txt_embedder.weight": 2, "double_blocks.0.q_norm.weight": 1,
                           "double_blocks.0.img_mlp.w1.weight": 2, "t_embedder.mlp.0.weight": 2})
    pca, channels, patch, _ = shapes["img_embedder.proj1.weight"]
    hidden = shapes["img_embedder.proj2.weight"][0]
    head_dim = shapes["double_blocks.0.q_norm.weight"][0]
    mlp_hidden = shapes["double_blocks.0.img_mlp.w1.weight"][0]
    dead = shapes.get("t_embedder.mlp.0.weight")
    return _inferred(
        MMJiTConfig, patch_size=patch, in_channels=channels, pca_channels=pca, hidden_size=hidden,
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
    _require_dims(shapes, {bias: 2, "shared.weight": 2, "encoder.block.0.layer.0.SelfAttention.q.weight": 2,
                           "encoder.block.0.layer.1.DenseReluDense.wi_0.weight": 2})
    buckets, heads = shapes[bias]
    vocab, d_model = shapes["shared.weight"]
    return _inferred(
        T5Config, vocab_size=vocab, d_model=d_model, num_heads=heads,
        d_kv=shapes["encoder.block.0.layer.0.SelfAttention.q.weight"][0] // heads,
        d_ff=shapes["encoder.block.0.layer.1.DenseReluDense.wi_0.weight"][0],
        num_layers=_count_blocks(shapes, "encoder.block"),
        relative_attention_num_buckets=buckets,
    )


def _inferred(cls, **values):
    """A config built from shape values, whose range checks then talk about the shapes."""
    try:
        return cls(**values)
    except MiniT2IError as err:
        raise MiniT2IError(f"the config inferred from the tensor shapes is invalid: {err}") from None


def _require_dims(shapes, dims: dict[str, int]) -> None:
    """Before any shape value is unpacked or divided by: each named tensor (if present) has
    the expected number of dimensions, none of them empty."""
    for name, ndim in dims.items():
        shape = shapes.get(name)
        if shape is not None and (len(shape) != ndim or 0 in shape):
            sizes = "dimensions" if len(shape) != ndim else "dimensions of size at least 1"
            raise MiniT2IError(f"{name}: expected {ndim} {sizes}, found {list(shape)}")


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
                           f"{_short_list(bad, 3)}; {fix}")
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


def find_mmjit_files(path: str | Path, variant: str = "minit2i-b-16") -> tuple[list[Path], Path | None]:
    """Resolve any accepted local MMJiT location to (safetensors files, config.json or None)."""
    root = existing_path(path, "--model")
    if root.is_file():
        return [root], _sibling_config(root)
    root = _hf_cache_snapshot(root, "mmjit")
    return _local_files(root, choose_mmjit(local_listing(root), variant, str(root)))


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
    """The chosen weights as usable paths (a cache's broken link is named as such), and the config."""
    flag = f"{root / choice.index} names the shard" if choice.index else "weights file"
    weights = [existing_path(root / name, flag) for name in choice.weights]
    return weights, root / choice.config if choice.config else None


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


@dataclass
class Checkpoint:
    """A checkpoint checked from its headers (names, shapes, dtypes, config); no tensor read yet.

    `locations` maps each live tensor's name (stripped of any key prefix) to its name in the
    file and the file; `assumed` names the config values that neither a config.json nor the
    shapes gave. `info` stops here; `load()` reads the tensors.
    """

    config: MMJiTConfig | T5Config
    files: list[Path]
    prefix: str
    config_source: str
    ignored: list[str]
    shapes: dict[str, tuple[int, ...]]
    locations: dict[str, tuple[str, Path]]
    stored_dtypes: list[str]
    assumed: str = ""
    text_encoder: str | None = None  # the T5 repo a MiniT2I config.json names (`llm`)

    @property
    def num_parameters(self) -> int:
        return sum(int(np.prod(shape)) for shape in self.shapes.values())

    def load(self) -> LoadedWeights:
        """Read every live tensor as float32; a NaN or Inf in any of them is a damaged file."""
        maps: dict[Path, _MappedFile] = {}
        tensors = {}
        for name, (stored_name, path) in self.locations.items():
            if path not in maps:
                maps[path] = _MappedFile(path)
            tensors[name] = maps[path].tensor(stored_name)
            bad = tensors[name].size - int(np.count_nonzero(np.isfinite(tensors[name])))
            if bad:
                raise MiniT2IError(
                    f"{path}: tensor {stored_name} holds {bad} NaN or Inf value(s) of "
                    f"{tensors[name].size}; the checkpoint is damaged: re-download or re-convert it"
                )
        return LoadedWeights(self.config, tensors, self.files, self.prefix, self.stored_dtypes,
                             self.config_source, self.ignored)


def inspect_mmjit(path: str | Path, variant: str = "minit2i-b-16") -> Checkpoint:
    """Find and check a local MMJiT checkpoint from its headers and config.json alone."""
    files, config_path = find_mmjit_files(path, variant)
    checkpoint = check_mmjit_header(read_index(files), config_path, files)
    checkpoint.text_encoder = named_text_encoder(config_path)
    return checkpoint


def inspect_t5(path: str | Path, expected_d_model: int | None = None) -> Checkpoint:
    """Find and check a local T5 v1.1 encoder from its headers and config.json alone;
    `expected_d_model` is the MMJiT's txt_input_size."""
    files, config_path = find_t5_files(path)
    return check_t5_header(read_index(files), config_path, files, expected_d_model)


def load_mmjit(path: str | Path, variant: str = "minit2i-b-16") -> LoadedWeights:
    """Load and check an MMJiT checkpoint; tensors keyed without the `model.net.` style prefix."""
    return inspect_mmjit(path, variant).load()


def load_t5(path: str | Path, expected_d_model: int | None = None) -> LoadedWeights:
    """Load and check a T5 v1.1 encoder; `expected_d_model` is the MMJiT's txt_input_size."""
    return inspect_t5(path, expected_d_model).load()


def named_text_encoder(config_path: Path | None) -> str | None:
    """The text encoder a diffusers MiniT2I config.json names in `llm` (google/flan-t5-large), if any."""
    raw = read_json(config_path, "config") if config_path is not None else None
    llm = raw.get("llm") if isinstance(raw, dict) else None
    return llm if isinstance(llm, str) and llm else None


def check_mmjit_header(index, config_path: Path | None, files: list) -> Checkpoint:
    """Check an MMJiT's tensor names and shapes (`read_index` output) against its config.

    Needs only the headers: `inspect_mmjit` runs it on local files, `minit2i.hub` on a Hub file
    before downloading it (`files` are then `repo/name` labels for the messages, not loadable).
    """
    prefix = _detect_prefix(index)
    stripped = {k[len(prefix):]: v for k, v in index.items() if k.startswith(prefix)}
    if len(stripped) != len(index):
        others = sorted(k for k in index if not k.startswith(prefix))
        raise MiniT2IError(
            f"{files[0]}: tensors outside the {prefix!r} prefix: {_short_list(others)}; "
            "pass the MiniT2I transformer file alone"
        )
    shapes = {k: v[1] for k, v in stripped.items() if not k.startswith(MMJIT_DEAD_PREFIXES)}
    config, source, assumed = _config(MMJiTConfig, config_path, infer_mmjit_config, shapes, files[0], MMJIT_ASSUMED)
    expected = mmjit_expected_shapes(config)
    ignored = check_tensors(
        stripped, expected, MMJIT_DEAD_PREFIXES,
        f"{files[0]} does not match the MMJiT config ({source})",
        "pass an unmodified MiniT2I transformer checkpoint (and its config.json)",
    )
    return _checkpoint(config, files, prefix, source, assumed, ignored, stripped,
                       {k: prefix + k for k in expected})


def check_t5_header(index, config_path: Path | None, files: list, expected_d_model: int | None = None) -> Checkpoint:
    """Check a T5's tensor names and shapes (`read_index` output), and its width against the MMJiT's.

    Needs only the headers: `inspect_t5` runs it on local files, `minit2i.hub` refuses a wrong T5
    on the Hub with it before downloading it (`files` as for `check_mmjit_header`).
    """
    index = dict(index)  # the caller's index keeps the tied alias popped below
    # Files carry the embedding as `shared.weight`, as its tied alias, or as both (spec 6.3).
    alias = index.pop(T5_TIED_EMBEDDING, None)
    embedding_name = "shared.weight"
    if "shared.weight" not in index and alias is not None:
        index["shared.weight"], embedding_name = alias, T5_TIED_EMBEDDING
    shapes = {k: v[1] for k, v in index.items() if not k.startswith(T5_IGNORED_PREFIXES)}
    config, source, assumed = _config(T5Config, config_path, infer_t5_config, shapes, files[0], T5_ASSUMED)
    if expected_d_model is not None and config.d_model != expected_d_model:
        raise MiniT2IError(_wrong_t5_message(files[0], config, expected_d_model, index))
    expected = t5_expected_shapes(config)
    ignored = check_tensors(
        index, expected, T5_IGNORED_PREFIXES,
        f"{files[0]} does not match the T5 config ({source})",
        "pass an unmodified google/flan-t5-large model.safetensors (and its config.json)",
    )
    return _checkpoint(config, files, "", source, assumed, ignored, index,
                       {k: embedding_name if k == "shared.weight" else k for k in expected})


def _checkpoint(config, files, prefix, source, assumed, ignored, index, stored_names: dict[str, str]) -> Checkpoint:
    """A Checkpoint of the expected tensors: `index` is keyed by our names, the files by theirs."""
    return Checkpoint(config, files, prefix, source, ignored,
                      shapes={k: tuple(index[k][1]) for k in stored_names},
                      locations={k: (stored, index[k][2]) for k, stored in stored_names.items()},
                      stored_dtypes=sorted({index[k][0] for k in stored_names}), assumed=assumed)


def _config(cls, config_path, infer, shapes, weights_path, assumed: tuple[str, ...]):
    """(config, where it came from, assumed values): config.json if there is one, else inferred
    from the shapes, with the values the shapes cannot tell kept at their defaults."""
    if config_path is not None:
        return cls.from_json(config_path), str(config_path), ""
    try:
        config = infer(shapes)
    except MiniT2IError as err:
        raise MiniT2IError(f"{weights_path}: {err}") from None
    values = ", ".join(f"{name}={getattr(config, name)}" for name in assumed)
    return config, "inferred from tensor shapes", values


def _wrong_t5_message(path: Path, config: T5Config, expected_d_model: int, index) -> str:
    """The T5 is not the width the MMJiT reads: name what it looks like and what is needed."""
    found = list(index["shared.weight"][1]) if "shared.weight" in index else f"d_model {config.d_model}"
    looks = T5_NAMES_BY_WIDTH.get(config.d_model, f"a T5 with d_model {config.d_model}")
    needed = T5_NAMES_BY_WIDTH.get(expected_d_model)
    need, fix = ((f"google/{needed}", f"pass google/{needed}'s model.safetensors") if needed else
                 ("a T5 v1.1 encoder of that width", "pass the T5 encoder this model was trained with"))
    return (f"{path} is the wrong T5 encoder: it has d_model {config.d_model} (looks like {looks}), "
            f"but this MiniT2I model needs d_model {expected_d_model} ({need}): expected shared.weight "
            f"[{config.vocab_size}, {expected_d_model}], found {found}; {fix}")


def _detect_prefix(index) -> str:
    for prefix in MMJIT_PREFIXES:
        if any(k.startswith(prefix + "img_embedder.") for k in index):
            return prefix
    return ""


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
