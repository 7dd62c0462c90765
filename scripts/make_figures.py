"""Draw the figures of docs/ (Pillow only; run from the repository root):

    python scripts/make_figures.py            # writes docs/figures/dataflow.png, x0-steps.png

dataflow.png: one prompt through the system, with the B/16 shape at every stage.
x0-steps.png: what the sampler sees at each step on the built-in default model (random
weights, so the pictures are abstract; the point is how x moves onto the guided x0).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from minit2i.default_model import default_model_dir
from minit2i.images import grid, save_png, to_pixels
from minit2i.pipeline import Request, generate, load_model, make_runner

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


def font(size: int):
    return ImageFont.load_default(size=size)


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
    """Top row: the state x after each step; bottom row: the guided x0 that step aimed at.

    Tiles are enlarged `zoom` times without smoothing, so the 16x16 patch grid stays visible.
    """
    folder, _ = default_model_dir()
    model = load_model(folder / "transformer", folder / "t5")
    runner = make_runner(model)
    states, previews = [], []

    def on_step(info):
        states.append(to_pixels(runner.to_host(info.x))[0])
        previews.append(to_pixels(runner.to_host(info.x0))[0])

    generate(model, runner, Request(prompt, steps=steps, width=size, height=size, seed=42), on_step)
    tile = size * zoom
    tiles = grid([p.repeat(zoom, axis=0).repeat(zoom, axis=1) for p in states + previews], columns=steps)
    label_h, side_w = 40, 90
    canvas = Image.new("RGB", (side_w + tiles.shape[1], label_h + tiles.shape[0]), PAPER)
    canvas.paste(Image.fromarray(tiles), (side_w, label_h))
    draw = ImageDraw.Draw(canvas)
    for i in range(steps):
        centre = side_w + i * tile + tile // 2
        draw.text((centre, 12), f"step {i + 1}", fill=INK, font=font(14), anchor="mm")
        draw.text((centre, 30), f"t {i / steps:.3g} -> {(i + 1) / steps:.3g}", fill=ARROW, font=font(12), anchor="mm")
    for row, name in enumerate(("x after", "guided x0")):
        draw.text((side_w // 2, label_h + row * tile + tile // 2), name, fill=INK, font=font(14), anchor="mm")
    return canvas


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=FIGURES)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--size", type=int, default=64, help="image size in pixels (multiple of 16)")
    parser.add_argument("--zoom", type=int, default=2)
    parser.add_argument("--prompt", default="a red cat sitting on a boat")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, figure in (("dataflow.png", dataflow_figure()),
                         ("x0-steps.png", x0_steps_figure(args.steps, args.size, args.zoom, args.prompt))):
        print(save_png(np.asarray(figure), args.out / name))


if __name__ == "__main__":
    main()
