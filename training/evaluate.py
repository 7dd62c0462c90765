"""Judge the demo model like a user would: draw full captions, read back what was drawn.

    python -m minit2i.training.evaluate                    # the shipped model, 64 held-in + 32 held-out prompts x 2 seeds
    python -m minit2i.training.evaluate --model demo-mf        # the four-step student
    python -m minit2i.training.evaluate --prompts 8 --seeds 1 --model DIR
    python -m minit2i.training.evaluate --cfg-scale 1 --steps 40     # other sampler settings
    python -m minit2i.training.evaluate --failures misread.png       # and a sheet of the images read wrong
    python -m minit2i.training.evaluate --short                       # prompts that name colour and shape only

Images come from the ordinary `generate` path (NumPy backend, the model's default steps and
guidance unless --steps / --cfg-scale say otherwise). A plain deterministic checker reads each
image back:

* background: the nearest background colour to the median of the 2-pixel border;
* shape mask: pixels farther than MASK_DISTANCE (RGB Euclidean) from that background colour;
* colour: the nearest palette colour to the median of the mask's pixels;
* position: the nearest of the five positions to the mask's centroid;
* size: the nearest size to the longer side of the mask's bounding box;
* shape: the candidate whose rendering overlaps the mask best (IoU), each candidate fitted in
  size and place inside the mask's bounding box, up to FIT_SLACK pixels smaller than it: a stray
  pixel off a corner widens the box, and a square rendered at the wider box loses to a circle.

With --short the prompts name only colour and shape ("a red circle"), the model chooses the rest,
and only colour and shape are scored. It prints accuracy per attribute, separately for held-in
scenes and the six held-out colour-shape pairs, as Markdown for docs/demo-model.md, then one line
per image read wrong; --failures also tiles those images into one PNG, in the same order, to look
at what the checker saw.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import numpy as np

from minit2i.console import OneLineParser, emit, guarded, printable
from minit2i.core.checks import Range, existing_path
from minit2i.core.files import check_output_file, write_atomically
from minit2i.core.images import check_writable, grid, save_png, to_pixels
from minit2i.pipeline import REQUEST_RANGES
from minit2i.reference.sampler import initial_noise

from . import shapes

ATTRIBUTES = ("background", "colour", "position", "size", "shape")
SHORT_ATTRIBUTES = ("colour", "shape")  # what a short prompt ("a red circle") names
MASK_DISTANCE = 50.0  # the closest shape/background pair (blue on navy) is 150 apart
MIN_MASK_PIXELS = 16
BORDER = 2
# How much a few stray pixels off a shape's corners may widen its bounding box: a drawn 28 x 28
# square with one such pixel two pixels out is read at 30, where a circle overlaps it better.
FIT_SLACK = 4
# The background metric looks only at pixels at least this far (centre to centre) from the
# intended shape: an edge may blur into its neighbours, a flat background should not move at all.
CLEAR_DISTANCE = 4.0
BACKGROUND_PERCENTILE = 99


def _nearest(table: dict[str, tuple[int, int, int]], rgb: np.ndarray) -> str:
    names = list(table)
    distances = [np.linalg.norm(np.subtract(table[n], rgb, dtype=np.float64)) for n in names]
    return names[int(np.argmin(distances))]


def fitted_shape(mask: np.ndarray) -> str:
    """bool [H, W] non-empty mask -> the shape whose rendering overlaps it best (IoU), trying each
    size from the bounding box's longer side down FIT_SLACK pixels, at every half-pixel centre that
    keeps the rendering inside the box. A rendered scene fits exactly at the box itself."""
    ys, xs = np.nonzero(mask)
    width, height = xs.max() - xs.min() + 1, ys.max() - ys.min() + 1
    centre_x, centre_y = (xs.min() + xs.max() + 1) / 2, (ys.min() + ys.max() + 1) / 2
    longest = max(width, height)
    best: dict[str, float] = dict.fromkeys(shapes.SHAPES, 0.0)
    for size in range(longest, max(1, longest - FIT_SLACK) - 1, -1):
        shifts_x = np.arange(-max(0, width - size), max(0, width - size) + 1) / 2
        shifts_y = np.arange(-max(0, height - size), max(0, height - size) + 1) / 2
        for shape, dx, dy in itertools.product(shapes.SHAPES, shifts_x, shifts_y):
            candidate = shapes.render_mask(shape, size, (centre_x + dx, centre_y + dy), mask.shape[0])
            best[shape] = max(best[shape], (candidate & mask).sum() / (candidate | mask).sum())
        if max(best.values()) == 1.0:
            break
    return max(best, key=best.get)


def classify(pixels: np.ndarray) -> dict[str, str | None]:
    """uint8 [H, W, 3] -> the five attributes read from the image (None where no shape is found)."""
    frame = np.ones(pixels.shape[:2], dtype=bool)
    frame[BORDER:-BORDER, BORDER:-BORDER] = False
    background = _nearest(shapes.BACKGROUNDS, np.median(pixels[frame], axis=0))
    distance = np.linalg.norm(pixels.astype(np.float64) - shapes.BACKGROUNDS[background], axis=-1)
    mask = distance > MASK_DISTANCE
    result = dict.fromkeys(ATTRIBUTES)
    result["background"] = background
    if mask.sum() < MIN_MASK_PIXELS:
        return result
    ys, xs = np.nonzero(mask)
    result["colour"] = _nearest(shapes.COLOURS, np.median(pixels[mask], axis=0))
    centroid = np.array([xs.mean() + 0.5, ys.mean() + 0.5])
    result["position"] = min(shapes.POSITIONS, key=lambda p: np.linalg.norm(centroid - shapes.POSITIONS[p]))
    extent = max(xs.max() - xs.min() + 1, ys.max() - ys.min() + 1)
    result["size"] = min(shapes.SIZES, key=lambda s: abs(shapes.SIZES[s] - extent))
    result["shape"] = fitted_shape(mask)
    return result


def clear_of_shape(scene: shapes.Scene) -> np.ndarray:
    """bool [H, W]: the pixels at least CLEAR_DISTANCE from every pixel of the scene's shape."""
    shape = shapes.render_mask(scene.shape, shapes.SIZES[scene.size], shapes.POSITIONS[scene.position])
    near = np.zeros_like(shape)
    reach = int(np.ceil(CLEAR_DISTANCE))
    padded = np.pad(shape, reach)
    size = shape.shape[0]
    for dy in range(-reach, reach + 1):
        for dx in range(-reach, reach + 1):
            if dx * dx + dy * dy < CLEAR_DISTANCE**2:
                near |= padded[reach + dy:reach + dy + size, reach + dx:reach + dx + size]
    return ~near


def background_error(scenes, pixels) -> dict[str, float]:
    """{background: the BACKGROUND_PERCENTILE-th percentile of |pixel - background colour| in
    levels (the largest of the three channels), over the pixels clear of the intended shape of
    every image on that background}. A faint patch grid or a stray colour shows up here; a clean
    image scores 0."""
    errors: dict[str, list[np.ndarray]] = {}
    for (scene, _, _), image in zip(scenes, pixels):
        colour = np.array(shapes.BACKGROUNDS[scene.background], dtype=np.int16)
        deviation = np.abs(image.astype(np.int16) - colour).max(axis=-1)
        errors.setdefault(scene.background, []).append(deviation[clear_of_shape(scene)])
    return {name: float(np.percentile(np.concatenate(errors[name]), BACKGROUND_PERCENTILE))
            for name in shapes.BACKGROUNDS if name in errors}


def evaluation_scenes(prompts: int, seeds: int, held_out_prompts: int | None = None):
    """[(scene, seed, held_out)]: `prompts` held-in and `held_out_prompts` (default prompts // 2)
    held-out scenes, spread over the data set by a fixed generator, each with `seeds` seeds."""
    rng = np.random.default_rng(2026)
    held_out_prompts = prompts // 2 if held_out_prompts is None else held_out_prompts
    picked = []
    for held_out, count in ((False, prompts), (True, held_out_prompts)):
        pool = shapes.all_scenes(held_out)
        picked += [(pool[i], held_out) for i in rng.choice(len(pool), size=min(count, len(pool)), replace=False)]
    return [(scene, seed, held_out) for scene, held_out in picked for seed in range(seeds)]


def scored(short: bool) -> tuple[str, ...]:
    """The attributes a prompt names, and so the ones scored."""
    return SHORT_ATTRIBUTES if short else ATTRIBUTES


def accuracy_report(scenes, pixels, short: bool = False) -> dict:
    """The checker's verdict over the images:

    "held_in", "held_out": {attribute: accuracy}; "shape_by_size": {group: {size: shape accuracy}};
    "counts": {group: images}; "shapes": per prompted shape, how often each shape was read back;
    "background_error": `background_error` per background colour. With `short` (the prompts named
    colour and shape only) just those two are scored, and size and background, the model's own
    choice, are neither split by nor measured against.
    """
    report, counts, by_size = {}, {}, {}
    shapes_found: dict[str, dict[str, int]] = {s: {} for s in shapes.SHAPES}
    for group, wanted in (("held_in", False), ("held_out", True)):
        pairs = [(scene, classify(p)) for (scene, _, held_out), p in zip(scenes, pixels) if held_out == wanted]
        counts[group] = len(pairs)
        if pairs:
            report[group] = {a: float(np.mean([getattr(s, a) == found[a] for s, found in pairs])) for a in scored(short)}
            if not short:
                by_size[group] = {size: float(np.mean([s.shape == found["shape"] for s, found in pairs if s.size == size]))
                                  for size in shapes.SIZES if any(s.size == size for s, _ in pairs)}
        for scene, found in pairs:
            row = shapes_found[scene.shape]
            row[str(found["shape"])] = row.get(str(found["shape"]), 0) + 1
    report["shape_by_size"] = by_size
    report["counts"] = counts
    report["shapes"] = shapes_found
    report["background_error"] = {} if short else background_error(scenes, pixels)
    return report


def prompt(scene: shapes.Scene, short: bool = False) -> str:
    """The scene's full caption, or with short=True only its colour and shape ("a red circle")."""
    return scene.caption(with_size=False, with_position=False, with_background=False) if short else scene.caption()


def misread(scenes, pixels, short: bool = False) -> list[tuple[int, dict[str, str | None]]]:
    """[(index, what the checker read)] of every image with at least one scored attribute read wrong."""
    found = [(i, classify(p)) for i, p in enumerate(pixels)]
    return [(i, read) for i, read in found if any(getattr(scenes[i][0], a) != read[a] for a in scored(short))]


def misread_line(scene_seed, read: dict[str, str | None], short: bool = False) -> str:
    """'prompt (seed s): attribute read as value, ...' for one misread image."""
    scene, seed, _ = scene_seed
    wrong = ", ".join(f"{a} read as {read[a]}" for a in scored(short) if getattr(scene, a) != read[a])
    return f"{prompt(scene, short)} (seed {seed}): {wrong}"


def contact_sheet(pixels: list[np.ndarray], columns: int = 8) -> np.ndarray:
    """uint8 [H, W, 3] images -> one uint8 image, `columns` wide, each framed by a 2-pixel mid-gray
    border so that equal backgrounds of neighbours stay apart."""
    framed = [np.pad(p, ((2, 2), (2, 2), (0, 0)), constant_values=128) for p in pixels]
    return grid(framed, min(columns, len(framed)))


def at_checker_size(pixels: np.ndarray) -> np.ndarray:
    """uint8 [S, S, 3], S dividing IMAGE_SIZE -> uint8 [IMAGE_SIZE, IMAGE_SIZE, 3], each pixel
    repeated: the checker reads a smaller model's images at the data set's size (every scene
    rendered at 32 x 32 reads back exactly so, a test)."""
    repeat = shapes.IMAGE_SIZE // pixels.shape[0]
    return pixels.repeat(repeat, axis=0).repeat(repeat, axis=1)


def draw_scenes(scenes, tokenizer, encode, draw, image_size: int = shapes.IMAGE_SIZE, batch: int = 64) -> np.ndarray:
    """uint8 [len(scenes), S, S, 3]: every (scene, seed) drawn from its full caption in batches, with
    `encode(ids, mask)` -> context and `draw(noise, context, mask)` -> images (a sampler over the
    network), S = `image_size`."""
    pixels = []
    for start in range(0, len(scenes), batch):
        chunk = scenes[start:start + batch]
        ids, mask = tokenizer([scene.caption() for scene, _, _ in chunk])
        noise = np.concatenate([initial_noise(seed, 1, 3, image_size, image_size) for _, seed, _ in chunk])
        pixels.append(to_pixels(draw(noise, encode(ids, mask), mask)))
    return np.concatenate(pixels)


def evaluate_scenes(scenes, tokenizer, encode, draw, image_size: int = shapes.IMAGE_SIZE) -> dict:
    """The checker's report (`accuracy_report`) on every (scene, seed) drawn by `draw_scenes`
    (used by training, where the network is torch)."""
    pixels = draw_scenes(scenes, tokenizer, encode, draw, image_size)
    return accuracy_report(scenes, [at_checker_size(p) for p in pixels])


def model_folders(model: str | Path, t5: Path | None = None) -> tuple[Path, Path]:
    """(transformer folder, T5 folder) of a demo model's name ("demo", "demo-mf") or an
    exported folder (transformer/ and t5/; a student's export has no t5/ and reads prompts with the
    demo model's), the T5 folder being `t5` where given."""
    from minit2i.demo_models import DEMO_MODEL_DIR, demo_model

    demo = demo_model(model)
    if demo is not None:
        transformer, default_t5 = demo[:2]
    else:
        transformer, default_t5 = Path(model) / "transformer", Path(model) / "t5"
        if not default_t5.exists():
            default_t5 = DEMO_MODEL_DIR / "t5"
    return transformer, t5 or default_t5


def add_model_arguments(parser) -> None:
    """--model and --t5, as `model_folders` takes them (evaluate and probe)."""
    parser.add_argument("--model", default="demo",
                        help="a demo model (demo, demo-mf) or an exported folder (transformer/, t5/)")
    parser.add_argument("--t5", type=Path, default=None,
                        help="T5 folder (default: the model's t5/, else the demo model's)")


def check_model_arguments(args) -> None:
    """--model names a demo model or an existing path, and --t5 (if given) exists."""
    from minit2i.demo_models import demo_model

    if demo_model(args.model) is None:
        existing_path(args.model, "--model")
    if args.t5 is not None:
        existing_path(args.t5, "--t5")


def generate_scenes(scenes, model: str | Path = "demo", t5: Path | None = None,
                    settings: dict | None = None, short: bool = False) -> list[np.ndarray]:
    """Draw every (scene, seed) through minit2i's ordinary generate path with the model's
    defaults, or with `settings` (Request fields such as steps, cfg_scale) where given; the
    prompt is the scene's full caption, or its colour and shape alone with `short`.

    `model`, `t5`: as `model_folders` takes them. The seeds of one scene (consecutive in `scenes`)
    are one request with a batch count, which gives image i the seed first + i, exactly as separate
    runs would.
    """
    from minit2i.pipeline import Request, generate, load_model, make_runner, sampling_defaults

    loaded = load_model(*model_folders(model, t5))
    runner = make_runner(loaded, "numpy")
    defaults = sampling_defaults(loaded) | (settings or {})
    pixels = []
    for (scene, _), group in itertools.groupby(scenes, key=lambda s: (s[0], s[2])):
        seeds = [seed for _, seed, _ in group]
        if seeds != list(range(seeds[0], seeds[0] + len(seeds))):
            raise ValueError(f"the seeds of {scene} are not consecutive: {seeds}")
        request = Request(prompt(scene, short), seed=seeds[0], batch_count=len(seeds), **defaults)
        pixels += list(generate(loaded, runner, request).pixels)
    return pixels


def markdown_table(report: dict) -> str:
    """The accuracy report as Markdown: accuracy per attribute, with shape split by size (rows:
    held-in, held-out), the background error per background colour, then which shape the checker
    read for each prompted shape (all images)."""
    sizes = list(shapes.SIZES) if report["shape_by_size"] else []
    attributes = list(next(report[g] for g in ("held_in", "held_out") if g in report))
    columns = [*attributes, *(f"shape, {size}" for size in sizes)]
    lines = ["| prompts | images | " + " | ".join(columns) + " |", "|---" * (len(columns) + 2) + "|"]
    for group, label in (("held_in", "held-in"), ("held_out", "held-out pairs")):
        if group in report:
            by_size = report["shape_by_size"].get(group, {})
            cells = [f"{report[group][a]:.0%}" for a in attributes]
            cells += [f"{by_size[size]:.0%}" if size in by_size else "-" for size in sizes]
            lines.append(f"| {label} | {report['counts'][group]} | {' | '.join(cells)} |")
    errors = report["background_error"]
    if errors:
        lines += ["", f"| background error (p{BACKGROUND_PERCENTILE}, levels) | " + " | ".join(errors) + " |",
                  "|---" * (len(errors) + 1) + "|", "| | " + " | ".join(f"{v:g}" for v in errors.values()) + " |"]
    found_columns = [*shapes.SHAPES, "None"]
    lines += ["", "| prompted shape | " + " | ".join(f"read as {c}" for c in found_columns) + " |",
              "|---" * (len(found_columns) + 1) + "|"]
    for shape, found in report["shapes"].items():
        lines.append(f"| {shape} | " + " | ".join(str(found.get(c, 0)) for c in found_columns) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    def command() -> int:
        p = OneLineParser(prog="evaluate", description=__doc__.splitlines()[0])
        p.add_argument("--prompts", type=int, default=64, help="held-in prompts (held-out: half as many)")
        p.add_argument("--seeds", type=int, default=2)
        add_model_arguments(p)
        p.add_argument("--steps", type=int, default=None, help="sampler steps (default: the model's)")
        p.add_argument("--cfg-scale", type=float, default=None, help="guidance (default: the model's)")
        p.add_argument("--json", type=Path, default=None, help="also write the report here")
        p.add_argument("--failures", type=Path, default=None,
                       help="also write the images read wrong, tiled, to this PNG")
        p.add_argument("--short", action="store_true",
                       help="prompts name colour and shape only; only those are scored")
        args = p.parse_args(argv)
        Range(1, 10**4).check("--prompts", args.prompts)
        Range(1, 10**4).check("--seeds", args.seeds)
        settings = {name: getattr(args, name) for name in ("steps", "cfg_scale") if getattr(args, name) is not None}
        for name, value in settings.items():
            REQUEST_RANGES[name][1].check(REQUEST_RANGES[name][0], value)
        check_model_arguments(args)
        if args.json is not None:
            check_output_file(args.json, "--json")
        if args.failures is not None:
            check_writable(args.failures, "--failures")
        scenes = evaluation_scenes(args.prompts, args.seeds)
        pixels = generate_scenes(scenes, args.model, args.t5, settings, args.short)
        report = accuracy_report(scenes, pixels, args.short)
        emit(markdown_table(report))
        wrong = misread(scenes, pixels, args.short)
        emit(f"\n{len(wrong)} of {len(scenes)} images read wrong" + ":" * bool(wrong))
        for i, read in wrong:
            emit(misread_line(scenes[i], read, args.short))
        if args.json:
            write_atomically(args.json, (json.dumps(report, indent=2) + "\n").encode())
        if args.failures is not None and wrong:
            save_png(contact_sheet([pixels[i] for i, _ in wrong]), args.failures)
            emit(f"wrote {printable(str(args.failures), None)}")
        return 0

    return guarded("evaluate", command)


if __name__ == "__main__":
    sys.exit(main())
