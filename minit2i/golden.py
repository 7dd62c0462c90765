"""Golden regression suite: fixed recipes, recorded outputs, tolerance checks (`minit2i golden`).

Every item is a recipe (configs, weight seeds, inputs) and the output it produced when it was
recorded. Weights are rebuilt from their seeds, so `golden/` holds only outputs and recipes:

    golden/manifest.json        recipes, tolerances, shapes and sha256 of every stored array,
                                and the name of the arrays file
    golden/golden-<hash>.npz    the recorded arrays (float64 outputs, uint8 images)

Recording writes the arrays under a new name, then replaces manifest.json: that one rename is
the commit, so an interrupted recording leaves the old pair, never new arrays with an old
manifest.

How outputs are compared, and why no float bytes are hashed: NumPy/BLAS results are not
bit-identical across CPUs and BLAS builds (float32 matmul differs between x86-64 and arm64,
between OpenBLAS kernels, even between Xeon generations), so a hash of float bytes would fail on
the next machine. Instead

  * float outputs are recorded from a float64 run and compared twice: the float64 run with a
    tight tolerance (any change to the math, down to an RMSNorm eps, is far above float64
    rounding) and the float32 run, the one generation uses, with a tolerance ~10x the float32
    rounding error measured against float64;
  * images are compared as the uint8 pixels themselves (a few KB each): every pixel within 1
    level. floor(127.5 x + 128) can flip by one level when x sits on a level boundary, so even
    a PNG hash is not portable; the stored sha256 of the pixels only says whether this run was
    bit-identical to the recording (reported, never required).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import io
import json
import math
import os
import platform
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from minit2i.core.checks import created_folder, human_size, open_checked, read_json_object, shown, sizes_compared
from minit2i.core.errors import MiniT2IError
from minit2i.core.files import write_atomically
from minit2i.core.images import to_pixels
from minit2i.core.mean_flow_config import MEAN_FLOW_TINY, MeanFlowConfig
from minit2i.core.mmjit_config import MMJIT_TINY, MMJiTConfig
from minit2i.core.t5_config import T5_TINY, T5Config
from minit2i.core.threads import blas_threads, chosen_threads
from minit2i.core.tokenizer import PromptTokenizer, make_t5_style_tokenizer
from minit2i.core.weights import LoadedWeights, nest
from minit2i.reference.layers import cast_tree
from minit2i.reference.mean_flow import mean_flow_forward
from minit2i.reference.mmjit import mmjit_forward
from minit2i.reference.pipeline import PRECISIONS, NumpyRunner
from minit2i.reference.sampler import initial_noise
from minit2i.reference.t5 import t5_encode

from .console import emit, printable
from .demo_models import demo_digest, random_mmjit_weights, random_t5_weights, tokenizer_pieces
from .pipeline import Model, Request, generate


def golden_dir(package: Path = Path(__file__).resolve().parent) -> Path:
    """Where the recording is: `golden_data/` inside an installed package (pyproject.toml ships the
    repository's golden/ there as package data), else `golden/` beside the package, as in a source
    checkout and an editable install."""
    shipped = package / "golden_data"
    return shipped if shipped.is_dir() else package.parent / "golden"


GOLDEN_DIR = golden_dir()
MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 2
RECORD_PRECISION = "fp64"
ARRAYS_LIMIT = 256 * 2**20  # the golden arrays file, and each array in it (the recording is ~100 kB)


# ---------------------------------------------------------------------------------------------
# Checks


@dataclass(frozen=True)
class FloatCheck:
    """Run the recipe in `precision`; pass if |got - want| <= atol + rtol |want| everywhere."""

    precision: str
    rtol: float
    atol: float

    def compare(self, got: np.ndarray, want: np.ndarray) -> tuple[bool, str]:
        diff = np.abs(got.astype(np.float64) - want)
        worst = float(np.max(diff / (self.atol + self.rtol * np.abs(want))))
        detail = f"max|d| {diff.max():.2e}, {worst:.2g} of tolerance (rtol {self.rtol:g}, atol {self.atol:g})"
        return worst <= 1.0, detail


@dataclass(frozen=True)
class PixelCheck:
    """Run the recipe in `precision`, convert to uint8 pixels; pass if every pixel is within
    `max_levels` of the recording."""

    precision: str
    max_levels: int = 1

    def compare(self, got: np.ndarray, want: np.ndarray) -> tuple[bool, str]:
        diff = np.abs(got.astype(np.int16) - want.astype(np.int16))
        changed = float(np.mean(diff > 0))
        exact = "bit-identical" if array_sha256(got) == array_sha256(want) else f"{changed:.2%} of values differ"
        return int(diff.max()) <= self.max_levels, f"max|d| {diff.max()} levels (limit {self.max_levels}), {exact}"


# ---------------------------------------------------------------------------------------------
# Recipes: plain JSON-able dicts, copied into the manifest when recorded.


@dataclass(frozen=True)
class Item:
    """One golden output: `run(recipe, precision)` recomputes it; `checks` say how it is compared."""

    name: str
    recipe: dict
    run: Callable[[dict, str], np.ndarray]
    checks: tuple = ()
    # What else the recording depends on, computed only when recording or checking (hashing the
    # demo model's weights at import would make every command read them, even `--help`).
    fingerprint: Callable[[], dict] = dict

    def stored_arrays(self) -> dict[str, str]:
        """Stored array name -> precision it is recorded in (float: fp64; pixels: the check's)."""
        arrays = {}
        for check in self.checks:
            if isinstance(check, FloatCheck):
                arrays[self.name] = RECORD_PRECISION
            else:
                arrays[f"{self.name}.pixels"] = check.precision
        return arrays

    def manifest_entry(self) -> dict:
        return {"recipe": {**self.recipe, **self.fingerprint()}, "checks": [_check_json(c) for c in self.checks]}


def tiny_t5_hidden(recipe: dict, precision: str) -> np.ndarray:
    """T5 encoder output [B, L, d_model] for seeded ids with right padding."""
    config = T5Config(**recipe["config"])
    ids, mask = _padded_ids(recipe["input_seed"], recipe["length"], recipe["real_tokens"], config.vocab_size)
    dtype = PRECISIONS[precision]
    params = cast_tree(nest(random_t5_weights(config, recipe["weight_seed"])), dtype)
    return t5_encode(params, config, ids, mask.astype(dtype))


def tiny_mmjit_x0(recipe: dict, precision: str) -> np.ndarray:
    """One MMJiT forward [B, 3, H, W] on seeded noise and a seeded context, one row per mask."""
    config = MMJiTConfig(**recipe["config"])
    params, x, context, mask = _forward_inputs(recipe, config, PRECISIONS[precision])
    return mmjit_forward(params, config, x, context, mask)


def tiny_student_x0(recipe: dict, precision: str) -> np.ndarray:
    """One Mean Flow student forward [B, 3, H, W], as `tiny_mmjit_x0`, with per-row h, omega,
    t_min and t_max from the recipe."""
    config = MeanFlowConfig(**recipe["config"])
    dtype = PRECISIONS[precision]
    params, x, context, mask = _forward_inputs(recipe, config, dtype)
    scalars = [np.array(recipe[name], dtype=dtype) for name in ("h", "omega", "t_min", "t_max")]
    return mean_flow_forward(params, config, x, *scalars, context, mask)


def _forward_inputs(recipe: dict, config: MMJiTConfig, dtype):
    """(weights tree, seeded noise [B, 3, H, W], seeded context [B, L, Dc], mask [B, L]) in `dtype`."""
    rows = len(recipe["real_tokens"])
    x = initial_noise(recipe["input_seed"], rows, config.in_channels, recipe["height"], recipe["width"])
    context = np.random.default_rng(recipe["input_seed"] + 1).standard_normal(
        (rows, config.prompt_length, config.txt_input_size), dtype=np.float32)
    mask = _prefix_mask(config.prompt_length, recipe["real_tokens"])
    params = cast_tree(nest(random_mmjit_weights(config, recipe["weight_seed"])), dtype)
    return params, x.astype(dtype), context.astype(dtype), mask.astype(dtype)


def tiny_sampler_image(recipe: dict, precision: str) -> np.ndarray:
    """prompt -> tokenizer -> T5 -> sampler (CFG Euler, or the student's with a "guidance_interval"
    in the recipe), the shared pipeline on a tiny model: the final image state [B, 3, H, W]
    (float32, as `generate` returns it)."""
    student = "guidance_interval" in recipe
    mmjit_config = (MeanFlowConfig if student else MMJiTConfig)(**recipe["mmjit"])
    t5_config = T5Config(**recipe["t5"])
    seed = recipe["weight_seed"]

    def loaded(config, tensors):
        return LoadedWeights(config, tensors, [], "", ["F32"], "golden recipe")

    model = Model(
        loaded(mmjit_config, random_mmjit_weights(mmjit_config, seed)),
        loaded(t5_config, random_t5_weights(t5_config, seed + 1)),
        PromptTokenizer(make_t5_style_tokenizer(tokenizer_pieces(t5_config.vocab_size - 3)),
                        mmjit_config.prompt_length),
    )
    sampler = {"guidance_interval": tuple(recipe["guidance_interval"])} if student else {"a_min": recipe["a_min"]}
    request = Request(recipe["prompt"], recipe["steps"], recipe["cfg_scale"], recipe["width"],
                      recipe["height"], recipe["seed"], **sampler)
    return generate(model, NumpyRunner(model.mmjit, model.t5, precision), request).images


def demo_png(recipe: dict, precision: str) -> np.ndarray:
    """`minit2i generate` on a demo model with its default settings, read back from the PNG:
    uint8 [H, W, 3].

    The recipe holds the digest of that model's weights, so a retrained model makes the item stale.
    """
    from PIL import Image

    from . import generate_command
    from .console import OneLineParser

    parser = OneLineParser(prog="minit2i")
    generate_command.add_parser(parser.add_subparsers(dest="command", required=True))
    with tempfile.TemporaryDirectory(prefix="minit2i-golden-") as folder:
        output = Path(folder) / "golden.png"
        # The command itself, not the CLI's main: its errors and Ctrl-C reach the caller's handling.
        args = parser.parse_args([*recipe["argv"], "--precision", precision, "--output", str(output)])
        with contextlib.redirect_stdout(io.StringIO()):  # generate prints the output path
            args.run(args)
        return np.asarray(Image.open(output).convert("RGB"))


def _padded_ids(seed: int, length: int, real_tokens: list[int], vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded ids [B, length] shaped like tokenizer output: words, `</s>` (1), then `<pad>` (0).

    Row b has real_tokens[b] >= 1 masked-in positions, the last of them `</s>`.
    """
    ids = np.random.default_rng(seed).integers(3, vocab, size=(len(real_tokens), length))
    mask = _prefix_mask(length, real_tokens)
    ids[mask == 0] = 0
    ids[np.arange(len(real_tokens)), np.array(real_tokens) - 1] = 1
    return ids, mask


def _prefix_mask(length: int, real_tokens: list[int]) -> np.ndarray:
    """[B, length] float32: row b has its first real_tokens[b] positions set."""
    return (np.arange(length)[None, :] < np.array(real_tokens)[:, None]).astype(np.float32)


# Tolerances come from measurements (golden/README.md): over five OpenBLAS kernel sets and 1 or 2
# threads, float32 runs differ from float64 by at most 0.21 of the float32 tolerances below, and
# float64 runs from each other by 6e-15, under 1e-4 of theirs. An RMSNorm eps of 1e-5 instead of
# 1e-6 moves the float64 outputs by 4e-5 (T5) to 6e-4 (MMJiT): over 1e5 float64 tolerances.
ITEMS = (
    Item("t5.hidden",
         {"config": dataclasses.asdict(T5_TINY), "weight_seed": 501, "input_seed": 502, "length": 40,
          "real_tokens": [29, 7]},
         tiny_t5_hidden,
         (FloatCheck("fp64", rtol=1e-9, atol=1e-10), FloatCheck("fp32", rtol=1e-4, atol=1e-5))),
    Item("mmjit.x0",
         {"config": dataclasses.asdict(MMJIT_TINY), "weight_seed": 601, "input_seed": 602, "height": 32,
          "width": 48, "real_tokens": [6, 0]},
         tiny_mmjit_x0,
         (FloatCheck("fp64", rtol=1e-9, atol=1e-10), FloatCheck("fp32", rtol=1e-4, atol=1e-5))),
    Item("sampler.image",
         {"mmjit": dataclasses.asdict(MMJIT_TINY), "t5": dataclasses.asdict(T5_TINY), "weight_seed": 701,
          "prompt": "a red cat sitting on a boat", "steps": 3, "cfg_scale": 1.5, "a_min": 0.001,
          "seed": 703, "height": 32, "width": 48},
         tiny_sampler_image,
         # The runner hands back float32 even in fp64, hence the float32-rounding floor here.
         (FloatCheck("fp64", rtol=1e-6, atol=1e-6), FloatCheck("fp32", rtol=2e-4, atol=2e-5),
          PixelCheck("fp32"))),
    Item("student.x0",
         {"config": dataclasses.asdict(MEAN_FLOW_TINY), "weight_seed": 801, "input_seed": 802, "height": 32,
          "width": 48, "real_tokens": [6, 0], "h": [0.25, 0.5], "omega": [12.0, 1.0], "t_min": [0.2, 0.0],
          "t_max": [0.8, 1.0]},
         tiny_student_x0,
         (FloatCheck("fp64", rtol=1e-9, atol=1e-10), FloatCheck("fp32", rtol=1e-4, atol=1e-5))),
    Item("student.image",
         {"mmjit": dataclasses.asdict(MEAN_FLOW_TINY), "t5": dataclasses.asdict(T5_TINY), "weight_seed": 901,
          "prompt": "a red cat sitting on a boat", "steps": 4, "cfg_scale": 12.0, "guidance_interval": [0.2, 0.8],
          "seed": 903, "height": 32, "width": 48},
         tiny_sampler_image,
         (FloatCheck("fp64", rtol=1e-6, atol=1e-6), FloatCheck("fp32", rtol=2e-4, atol=2e-5),
          PixelCheck("fp32"))),
    Item("demo.png",
         {"argv": ["generate", "--prompt", "a large red circle at the left on a gray background", "--seed", "42",
                   "--quiet"]},
         demo_png,
         (PixelCheck("fp32"),),
         lambda: {"demo": demo_digest("demo")}),
    Item("demo-mf.png",
         {"argv": ["generate", "--model", "demo-mf", "--prompt", "a small green triangle at the right on a gray "
                   "background", "--seed", "42", "--quiet"]},
         demo_png,
         (PixelCheck("fp32"),),
         lambda: {"demo-mf": demo_digest("demo-mf")}),
)


# ---------------------------------------------------------------------------------------------
# Record and check


@dataclass
class Outcome:
    """The verdict of one check of one item."""

    item: str
    check: str
    passed: bool
    detail: str

    def line(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'}  {self.item:<18} {self.check:<11} {self.detail}"


def select(names: list[str] | None) -> tuple[Item, ...]:
    """The items called `names` (all of them for None), or a clear error for unknown names."""
    if not names:
        return ITEMS
    known = {item.name: item for item in ITEMS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise MiniT2IError(f"unknown golden item(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    return tuple(known[n] for n in names)


def record(folder: Path = GOLDEN_DIR, force: bool = False) -> list[str]:
    """Run every recipe and write arrays + manifest; refuses to overwrite without `force`.

    The folder is checked writable before the (slow) recipes run. Returns the stored array names.
    """
    folder = Path(folder)
    manifest_path = folder / MANIFEST_NAME
    if manifest_path.exists() and not force:
        raise MiniT2IError(
            f"{manifest_path} already exists: recording would replace the golden outputs; pass --force "
            "if the change to the math is intended (and review the diff)"
        )
    _creatable_folder(folder)
    arrays: dict[str, np.ndarray] = {}
    for item in ITEMS:
        for name, precision in item.stored_arrays().items():
            value = item.run(item.recipe, precision)
            arrays[name] = value if name == item.name else as_pixels(value)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    arrays_file = f"golden-{hashlib.sha256(buffer.getvalue()).hexdigest()[:16]}.npz"
    manifest = {
        "format": FORMAT_VERSION,
        "recorded_with": {"numpy": np.__version__, "machine": platform.machine(),
                          "python": platform.python_version()},
        "arrays_file": arrays_file,
        "items": {item.name: item.manifest_entry() for item in ITEMS},
        "arrays": {name: {"shape": list(a.shape), "dtype": str(a.dtype), "sha256": array_sha256(a)}
                   for name, a in arrays.items()},
    }
    previous = _previous_arrays_file(manifest_path)
    write_atomically(folder / arrays_file, buffer.getvalue())
    try:
        write_atomically(manifest_path, json.dumps(manifest, indent=1).encode())  # the commit
    except BaseException:
        (folder / arrays_file).unlink(missing_ok=True)
        raise
    if previous not in (None, arrays_file):
        (folder / previous).unlink(missing_ok=True)
    return sorted(arrays)


def _creatable_folder(folder: Path) -> None:
    """Create the golden folder if needed and check it is writable, before any recipe runs."""
    created_folder(folder, "--dir")


def _previous_arrays_file(manifest_path: Path) -> str | None:
    """The arrays file an existing, readable manifest names (removed once replaced)."""
    try:
        return _arrays_file(read_json_object(manifest_path, "golden manifest"), manifest_path)
    except MiniT2IError:
        return None


def check(folder: Path = GOLDEN_DIR, names: list[str] | None = None) -> list[Outcome]:
    """Recompute the selected items and compare them with the recording, one Outcome per check."""
    manifest, arrays = load(folder)
    outcomes = []
    for item in select(names):
        stale = _staleness(item, manifest, arrays)
        if stale:
            outcomes.append(Outcome(item.name, "recording", False, stale))
            continue
        runs: dict[str, np.ndarray] = {}
        for chk in item.checks:
            if chk.precision not in runs:
                runs[chk.precision] = item.run(item.recipe, chk.precision)
            if isinstance(chk, FloatCheck):
                got, want, label = runs[chk.precision], arrays[item.name], chk.precision
            else:
                got, want = as_pixels(runs[chk.precision]), arrays[f"{item.name}.pixels"]
                label = f"{chk.precision}/pixels"
            if got.shape != want.shape:
                passed, detail = False, (f"output shape {list(got.shape)} differs from the recorded "
                                         f"{list(want.shape)}; re-record with `minit2i golden record --force`")
            else:
                passed, detail = chk.compare(got, want)
            outcomes.append(Outcome(item.name, label, passed, detail))
    return outcomes


def load(folder: Path = GOLDEN_DIR) -> tuple[dict, dict[str, np.ndarray]]:
    """(manifest, arrays) from a golden folder, or a MiniT2IError saying how to get one."""
    folder = Path(folder)
    manifest_path = folder / MANIFEST_NAME
    if not os.path.lexists(manifest_path):  # a FIFO or a broken link is named by the reader below
        raise MiniT2IError(
            f"no golden recording in {folder} (needs {MANIFEST_NAME} and the arrays file it names); "
            "reinstall minit2i (it ships the recording), pass --dir, or create one with `minit2i golden record`"
        )
    manifest = read_json_object(manifest_path, "golden manifest")
    if manifest.get("format") != FORMAT_VERSION:
        raise MiniT2IError(f"{manifest_path} has format {shown(manifest.get('format'))}, this code reads "
                           f"{FORMAT_VERSION}; re-record with `minit2i golden record --force`")
    _check_manifest(manifest, manifest_path)
    arrays_path = folder / _arrays_file(manifest, manifest_path)
    try:
        with open_checked(arrays_path, "golden arrays", ARRAYS_LIMIT) as f:
            arrays = _read_npz(f)
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as err:
        raise MiniT2IError(f"cannot read the golden arrays {arrays_path} ({type(err).__name__}: {err}); "
                           "restore the golden folder from git") from None
    return manifest, arrays


NPY_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def _read_npz(f) -> dict[str, np.ndarray]:
    """The arrays of an .npz file, each checked against what it declares before it is read: an
    array header can declare any shape, and NumPy allocates it before reading the data."""
    arrays = {}
    with zipfile.ZipFile(f) as archive:
        for info in archive.infolist():
            if info.file_size > ARRAYS_LIMIT:
                found, most = sizes_compared(info.file_size, ARRAYS_LIMIT)
                raise ValueError(f"member {info.filename} unpacks to {found}, more than {most}")
            with archive.open(info) as member:
                version = np.lib.format.read_magic(member)
                if version not in NPY_HEADER_READERS:
                    raise ValueError(f"member {info.filename} is .npy format {version}, not 1.0 or 2.0")
                shape, _, dtype = NPY_HEADER_READERS[version](member)
                declared = math.prod(shape) * dtype.itemsize
                if declared > info.file_size:
                    raise ValueError(f"member {info.filename} declares {human_size(declared)} of data but holds "
                                     f"{human_size(info.file_size)}")
            with archive.open(info) as member:
                arrays[info.filename.removesuffix(".npy")] = np.lib.format.read_array(member, allow_pickle=False)
    return arrays


def _arrays_file(manifest: dict, manifest_path: Path) -> str:
    """The arrays file name the manifest gives: a plain name inside the golden folder."""
    name = manifest.get("arrays_file")
    if not isinstance(name, str) or Path(name).name != name or not name.endswith(".npz"):
        raise MiniT2IError(f"{manifest_path}: arrays_file must be a .npz file name in its folder, found "
                           f"{shown(name)}; restore the golden folder from git")
    return name


def _check_manifest(manifest: dict, path: Path) -> None:
    """The manifest's structure, so a damaged one is one line and not a KeyError later."""
    fix = "restore the golden folder from git or re-record with `minit2i golden record --force`"
    items, arrays = manifest.get("items"), manifest.get("arrays")
    if not isinstance(items, dict) or not isinstance(arrays, dict):
        raise MiniT2IError(f"{path}: expected \"items\" and \"arrays\" objects, found {shown(items)} and "
                           f"{shown(arrays)}; {fix}")
    for name, entry in arrays.items():
        if not (isinstance(entry, dict) and isinstance(entry.get("sha256"), str)
                and isinstance(entry.get("shape"), list)):
            raise MiniT2IError(f"{path}: array {name} needs \"shape\" and \"sha256\", found {shown(entry)}; {fix}")


def _staleness(item: Item, manifest: dict, arrays: dict[str, np.ndarray]) -> str:
    """Why the recording cannot judge this item ('' when it can)."""
    fix = "re-record with `minit2i golden record --force`"
    if manifest["items"].get(item.name) != json.loads(json.dumps(item.manifest_entry())):
        return f"recipe or checks changed since recording (see {MANIFEST_NAME}); {fix}"
    for name in item.stored_arrays():
        if name not in arrays or name not in manifest["arrays"]:
            return f"array {name} missing from the recording; {fix}"
        if array_sha256(arrays[name]) != manifest["arrays"][name]["sha256"]:
            return (f"array {name} does not match its sha256 in {MANIFEST_NAME} (edited or corrupted); "
                    "restore it from git")
    return ""


def as_pixels(value: np.ndarray) -> np.ndarray:
    """Images [B, 3, H, W] float -> uint8 [B, H, W, 3]; uint8 images pass through."""
    return value if value.dtype == np.uint8 else to_pixels(value)


def array_sha256(array: np.ndarray) -> str:
    """Hash of dtype, shape and bytes (for integrity of the stored arrays, not for comparison)."""
    digest = hashlib.sha256(f"{array.dtype.str}{array.shape}".encode())
    digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def _check_json(chk) -> dict:
    return {"kind": type(chk).__name__, **dataclasses.asdict(chk)}


# ---------------------------------------------------------------------------------------------
# CLI


def add_parser(sub) -> None:
    p = sub.add_parser("golden", help="check (or record) the golden regression outputs",
                       description="Recompute fixed recipes (tiny T5, tiny MMJiT, tiny sampler, default "
                                   "model PNG) and compare them with the recording in golden/.")
    p.add_argument("action", choices=["check", "record"])
    p.add_argument("--dir", type=_folder_argument, default=GOLDEN_DIR, help=f"golden folder (default {GOLDEN_DIR})")
    p.add_argument("--item", action="append", dest="items", metavar="NAME",
                   help="check only this item (repeatable): " + ", ".join(i.name for i in ITEMS))
    p.add_argument("--force", action="store_true", help="record: overwrite an existing recording")
    p.set_defaults(run=run)


def _folder_argument(text: str) -> Path:
    """An empty --dir would be the current folder (Path("") is "."): refuse it."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path names no folder; pass a folder")
    return Path(text)


def run(args) -> int:
    # Every recipe is a tiny model, its products far below FLOPS_PER_THREAD: the thread count
    # `threads_for` gives the smallest work (the demo PNG's `generate` sizes its own, the same).
    with blas_threads(chosen_threads(None, 0.0)):
        return _run(args)


def _run(args) -> int:
    if args.action == "record":
        names = record(args.dir, args.force)
        emit(f"recorded {len(names)} arrays into {printable(str(args.dir), None)}: {', '.join(names)}")
        return 0
    outcomes = check(args.dir, args.items)
    for outcome in outcomes:
        emit(outcome.line())
    failed = [o for o in outcomes if not o.passed]
    emit(f"golden: {len(outcomes) - len(failed)}/{len(outcomes)} checks passed"
          + (f"; failing: {', '.join(sorted({o.item for o in failed}))}" if failed else ""))
    return 1 if failed else 0
