"""Draw the figures of docs/ (Pillow only; run from the repository root):

    python scripts/make_figures.py            # writes every figure into docs/figures/

dataflow.png: one prompt through the system, with the B/16 shape at every stage.
x0-steps.png: what each sampler sees at each step, the demo model's (Euler, 10 steps) above the
four-step student's: x moving onto the x0 while the shape forms.
demo-grid.png: prompts and both demo models' images, the held-out colour-shape pairs included.
demo-loss.png: the demo model's training loss and the student's distillation error (from each
model's training-log.jsonl, which covers its last training stage).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from minit2i.core.images import grid, save_png, to_pixels
from minit2i.demo_models import DEMO_MODEL_DIR, DEMO_STUDENT_DIR
from minit2i.pipeline import Request, generate, is_student, load_model, make_runner, sampling_defaults
from minit2i.training.charts import font, loss_chart
from minit2i.training.shapes import HELD_OUT

FIGURES = Path(__file__).resolve().parent.parent / "docs" / "figures"
INK, PAPER, ARROW = (30, 30, 30), (255, 255, 255), (90, 90, 90)
# Fill colour by part of the system: text side, image side, sampler, input/output.
FILLS = {"text": (222, 235, 247), "image": (229, 245, 224), "sampler": (254, 230, 206), "io": (240, 240, 240)}

# Boxes by name: (column, row, title, shape line, part); columns: text, image, sampler.
BOXES = {
    "prompt": (0, 0, "prompt \"a cat\"", "str", "io"),
    "tokenizer": (0, 1, "tokenizer", "ids, mask [1, 256]", "text"),
    "t5": (0, 2, "T5 encoder, 24 blocks", "context [1, 256, 1024]", "text"),
    "txt_embed": (0, 3, "mask_token + txt_embedder", "txt [2, 256, 768]", "text"),
    "preamble": (0, 4, "2 preamble blocks (1-D RoPE)", "txt [2, 256, 768]", "text"),
    "noise": (1, 0, "noise x = 2 N(0, I)", "[1, 3, 512, 512]", "io"),
    "batch": (1, 1, "[cond ; uncond] batch", "x [2, 3, 512, 512], mask [2, 256]", "sampler"),
    "patch_embed": (1, 2, "patch embed + sin/cos", "img [2, 1024, 768]", "image"),
    "double": (1, 5, "17 double blocks", "joint attention, 256 + 1024 tokens", "image"),
    "final": (1, 6, "final layer + unpatchify", "x0 [2, 3, 512, 512]", "image"),
    "cfg": (2, 6, "CFG on x0", "x0_cfg [1, 3, 512, 512]", "sampler"),
    "euler": (2, 7, "x0 -> v, Euler step", "x += dt v  [1, 3, 512, 512]", "sampler"),
    "pixels": (2, 8, "pixels", "uint8 [512, 512, 3] -> PNG", "io"),
}
BOX_W, BOX_H, COL_GAP, ROW_GAP, MARGIN, TITLE_H = 300, 64, 90, 34, 30, 50


def box_rect(name: str) -> tuple[int, int, int, int]:
    column, row = BOXES[name][:2]
    x, y = MARGIN + column * (BOX_W + COL_GAP), MARGIN + TITLE_H + row * (BOX_H + ROW_GAP)
    return x, y, x + BOX_W, y + BOX_H


def side(name: str, where: str) -> tuple[int, int]:
    """Middle of one side ("top", "bottom", "left", "right") of a box."""
    x0, y0, x1, y1 = box_rect(name)
    return {"top": ((x0 + x1) // 2, y0), "bottom": ((x0 + x1) // 2, y1),
            "left": (x0, (y0 + y1) // 2), "right": (x1, (y0 + y1) // 2)}[where]


def routes() -> list[tuple[list[tuple[int, int]], str]]:
    """Arrows as polylines (axis-parallel segments) with a label on their longest segment."""
    def down(a, b, label=""):
        return [side(a, "bottom"), side(b, "top")], label

    gap_x = box_rect("prompt")[2] + COL_GAP // 2  # the lane between the text and image columns
    outer_x = box_rect("euler")[2] + COL_GAP // 2  # the lane right of the sampler column
    preamble_x, double_y = side("preamble", "bottom")[0], side("double", "left")[1]
    return [
        down("prompt", "tokenizer"), down("tokenizer", "t5"), down("t5", "txt_embed", "context"),
        down("txt_embed", "preamble"), down("noise", "batch"), down("batch", "patch_embed", "x"),
        down("patch_embed", "double", "img"), down("double", "final", "img"), down("cfg", "euler"),
        down("euler", "pixels", "t = 1: done"),
        ([side("batch", "left"), (gap_x, side("batch", "left")[1]), (gap_x, side("txt_embed", "right")[1]),
          side("txt_embed", "right")], "mask"),
        ([side("preamble", "bottom"), (preamble_x, double_y), side("double", "left")], "txt"),
        ([side("final", "right"), side("cfg", "left")], "x0"),
        ([side("euler", "right"), (outer_x, side("euler", "right")[1]), (outer_x, side("batch", "right")[1]),
          side("batch", "right")], "next step, t < 1"),
    ]


def draw_arrow(draw: ImageDraw.ImageDraw, points: list[tuple[int, int]], label: str) -> None:
    """A polyline ending in an arrow head, labelled beside its longest segment."""
    draw.line(points, fill=ARROW, width=2, joint="curve")
    end, before = np.array(points[-1]), np.array(points[-2])
    direction = (end - before) / np.hypot(*(end - before))
    normal = np.array([-direction[1], direction[0]])
    draw.polygon([tuple(end), tuple(end - 12 * direction + 6 * normal), tuple(end - 12 * direction - 6 * normal)],
                 fill=ARROW)
    if label:
        segments = list(zip(points, points[1:]))
        a, b = max(segments, key=lambda seg: np.hypot(*np.subtract(seg[1], seg[0])))
        vertical = a[0] == b[0]
        x, y = (a[0] + 8, (a[1] + b[1]) // 2) if vertical else ((a[0] + b[0]) // 2, a[1] - 12)
        draw.text((x, y), label, fill=ARROW, font=font(13), anchor="lm" if vertical else "mm")


def dataflow_figure() -> Image.Image:
    """One prompt through tokenizer, T5, MMJiT and the sampler, B/16 shapes on every box."""
    right = max(box_rect(name)[2] for name in BOXES) + COL_GAP + 110  # room for the loop label
    bottom = max(box_rect(name)[3] for name in BOXES) + MARGIN
    image = Image.new("RGB", (right, bottom), PAPER)
    draw = ImageDraw.Draw(image)
    draw.text((MARGIN, MARGIN), "MiniT2I B/16: one prompt, one image (CFG runs cond and uncond as a batch of 2)",
              fill=INK, font=font(20))
    for name, (_, _, title, shape, part) in BOXES.items():
        x0, y0, x1, y1 = box_rect(name)
        draw.rounded_rectangle([x0, y0, x1, y1], radius=10, fill=FILLS[part], outline=INK, width=2)
        draw.text(((x0 + x1) // 2, y0 + 22), title, fill=INK, font=font(16), anchor="mm")
        draw.text(((x0 + x1) // 2, y0 + 46), shape, fill=INK, font=font(13), anchor="mm")
    for points, label in routes():
        draw_arrow(draw, points, label)
    return image


def x0_steps_figure(steps: int, size: int, zoom: int, prompt: str) -> Image.Image:
    """Both samplers on one prompt, one block each: the demo model's Euler sampler in `steps`
    steps, then the four-step student's. Each block's top row is the state x after each step,
    its bottom row the x0 that step aimed at (the guided one for the base model).

    Tiles are enlarged `zoom` times without smoothing, so the patch grid stays visible.
    """
    blocks = [sampler_block("demo", steps, size, zoom, prompt), sampler_block("demo-mf", None, size, zoom, prompt)]
    canvas = Image.new("RGB", (max(b.width for b in blocks), sum(b.height for b in blocks) + 20), PAPER)
    top = 0
    for block in blocks:
        canvas.paste(block, (0, top))
        top += block.height + 20
    return canvas


def sampler_block(name: str, steps: int | None, size: int, zoom: int, prompt: str) -> Image.Image:
    """x after each step over the x0 of that step, for demo model `name` (its own step count
    when `steps` is None), titled with its sampler and labelled with each step's times."""
    model, runner = load_demo(name)
    states, previews, times = [], [], []

    def on_step(info):
        states.append(to_pixels(runner.to_host(info.x))[0])
        previews.append(to_pixels(runner.to_host(info.x0))[0])
        times.append(info.t)

    settings = sampling_defaults(model) | {"width": size, "height": size} | ({"steps": steps} if steps else {})
    generate(model, runner, Request(prompt, seed=42, **settings), on_step)
    student = is_student(model)
    ends = times[1:] + [0.0 if student else 1.0]
    tile = size * zoom
    tiles = grid([p.repeat(zoom, axis=0).repeat(zoom, axis=1) for p in states + previews], columns=len(states))
    title_h, label_h, side_w = 26, 40, 90
    canvas = Image.new("RGB", (side_w + tiles.shape[1], title_h + label_h + tiles.shape[0]), PAPER)
    canvas.paste(Image.fromarray(tiles), (side_w, title_h + label_h))
    draw = ImageDraw.Draw(canvas)
    title = (f"--model {name}: Mean Flow student, {len(states)} steps, one forward each" if student else
             f"{name}: Euler x0 -> v, {len(states)} steps, cond + uncond each")
    draw.text((8, 6), title, fill=INK, font=font(15))
    for i, (start, end) in enumerate(zip(times, ends)):
        centre = side_w + i * tile + tile // 2
        draw.text((centre, title_h + 12), f"step {i + 1}", fill=INK, font=font(14), anchor="mm")
        draw.text((centre, title_h + 30), f"t {start:.3g} -> {end:.3g}", fill=ARROW, font=font(12), anchor="mm")
    for row, label in enumerate(("x after", "x0" if student else "guided x0")):
        draw.text((side_w // 2, title_h + label_h + row * tile + tile // 2), label, fill=INK, font=font(14),
                  anchor="mm")
    return canvas


def load_demo(name: str):
    """(the demo model `name`, a NumPy runner for it)."""
    model = load_model(name)
    return model, make_runner(model)


# Full captions of every kind, then one prompt for each held-out colour-shape pair.
GRID_PROMPTS = (
    "a large red circle at the left on a gray background",
    "a small blue square at the top on a white background",
    "a large yellow cross at the center on a navy background",
    "a small green triangle at the right on a black background",
    "a large white square at the bottom on a navy background",
    "a small orange cross at the left on a gray background",
    "a large purple circle at the right on a white background",
    "a small cyan triangle at the bottom on a black background",
    "a large red triangle at the center on a black background",
    "a small green circle at the left on a white background",
    "a large blue cross at the bottom on a gray background",
    "a large yellow square at the right on a navy background",
    "a small purple triangle at the top on a gray background",
    "a large cyan square at the center on a black background",
    "a blue circle",
    "a small orange square on a white background",
)


def demo_grid_figure(zoom: int, prompts: tuple[str, ...] = GRID_PROMPTS, columns: int = 4) -> Image.Image:
    """Each prompt's image from the demo model (left) and the four-step student (right), seed
    42 and each model's default settings, with the caption underneath; prompts naming a
    held-out colour-shape pair are labelled as such."""
    models = [load_demo(name) for name in ("demo", "demo-mf")]
    size = sampling_defaults(models[0][0])["width"]
    tile, head_h, caption_h, gap = size * zoom, 22, 44, 16
    cell_w, cell_h = tile * 2 + 3 * gap, tile + caption_h + gap
    rows = -(-len(prompts) // columns)
    canvas = Image.new("RGB", (columns * cell_w + gap, head_h + rows * cell_h + gap), PAPER)
    draw = ImageDraw.Draw(canvas)
    draw.text((gap, 4), "left: demo (20 Euler steps)    right: demo-mf (4 Mean Flow steps)    seed 42",
              fill=INK, font=font(14))
    for i, prompt in enumerate(prompts):
        x, y = gap + (i % columns) * cell_w, head_h + gap + (i // columns) * cell_h
        for j, (model, runner) in enumerate(models):
            pixels = generate(model, runner, Request(prompt, seed=42, **sampling_defaults(model))).pixels[0]
            canvas.paste(Image.fromarray(pixels.repeat(zoom, axis=0).repeat(zoom, axis=1)), (x + j * (tile + gap), y))
        words = prompt.split()
        lines = [" ".join(words[:len(words) // 2 + 1]), " ".join(words[len(words) // 2 + 1:])]
        held_out = any(c in words and s in words for c, s in HELD_OUT)
        for j, line in enumerate(lines + (["(held-out pair)"] if held_out else [])):
            draw.text((x + tile + gap // 2, y + tile + 10 + 14 * j), line, fill=ARROW if j == 2 else INK,
                      font=font(12), anchor="mm")
    return canvas


def loss_figure(curves: list[tuple[Path, str, str]], width: int = 720, height: int = 300) -> Image.Image:
    """One panel per (training log, record key, title): the logged value (10-step means, log
    scale) against the step."""
    panels = [loss_panel(path, key, title, width, height) for path, key, title in curves]
    canvas = Image.new("RGB", (width, height * len(panels)), PAPER)
    for i, panel in enumerate(panels):
        canvas.paste(panel, (0, i * height))
    return canvas


def loss_panel(log_path: Path, key: str, title: str, width: int, height: int) -> Image.Image:
    """The logged `key` of a training log against its step, drawn by the chart the training uses."""
    records = [json.loads(line) for line in log_path.read_text().splitlines()]
    points = np.array([(r["step"], r[key]) for r in records if key in r], dtype=float)
    return Image.fromarray(loss_chart(points[:, 0], points[:, 1], title=title, size=(width, height)))


LOSS_CURVES = [(DEMO_MODEL_DIR / "training-log.jsonl", "loss", "demo: training loss of its last stage (v-space MSE)"),
               (DEMO_STUDENT_DIR / "training-log.jsonl", "error",
                "demo-mf: distillation error of its last stage (unweighted Mean Flow MSE per pixel)")]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=FIGURES)
    parser.add_argument("--steps", type=int, default=10, help="sampler steps shown in x0-steps.png")
    parser.add_argument("--size", type=int, default=64, help="image size in pixels (multiple of the patch size)")
    parser.add_argument("--zoom", type=int, default=2)
    parser.add_argument("--prompt", default="a large red circle at the left on a gray background")
    return parser.parse_args(argv)


def figure_makers(args: argparse.Namespace) -> dict:
    """Each figure's file name -> the call that draws it (a PIL image)."""
    return {"dataflow.png": dataflow_figure,
            "x0-steps.png": lambda: x0_steps_figure(args.steps, args.size, args.zoom, args.prompt),
            "demo-grid.png": lambda: demo_grid_figure(args.zoom),
            "demo-loss.png": lambda: loss_figure(LOSS_CURVES)}


def main() -> None:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, draw in figure_makers(args).items():
        print(save_png(np.asarray(draw()), args.out / name))


if __name__ == "__main__":
    main()
