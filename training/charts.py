"""Charts drawn with Pillow alone, so the training commands and the figure scripts need no plotting
library: the loss curves of the demo models' figure and of the watch-it-learn run."""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFont

INK, GRID, LABEL, CURVE, MARK = (0, 0, 0), (225, 225, 225), (80, 80, 80), (200, 40, 40), (170, 170, 220)
FLOOR = (30, 110, 60)  # the predicted floor's dashed line


def font(size: int):
    """Pillow's own scalable font (no system font needed)."""
    return ImageFont.load_default(size)


def loss_chart(steps: np.ndarray, losses: np.ndarray, *, title: str, x_label: str = "training step",
               marks=(), floor: tuple[float, str] | None = None, size=(640, 360)) -> np.ndarray:
    """uint8 [height, width, 3]: `losses` against `steps` (1-D, equal length, losses > 0) on a
    log-scale axis with a labelled line at every 1, 2 and 5 times a power of ten (at every 1 to 9
    times one where those would be fewer than three), the steps in `marks` drawn as dotted
    verticals, `floor` (value > 0, label) as a dashed horizontal line, `title` above and `x_label`
    below."""
    width, height = size
    left, right, top, bottom = 60, 30, 30, 40
    image = Image.new("RGB", size, (255, 255, 255))
    draw = ImageDraw.Draw(image)
    shown = np.append(losses, floor[0]) if floor else losses
    low, high = np.log10(shown.min()), np.log10(shown.max())
    low, high = (low - 0.05, high + 0.05) if high > low else (low - 0.5, high + 0.5)
    last = max(int(steps.max()), 1)

    def x(step):
        return left + (width - left - right) * step / last

    def y(loss):
        return top + (height - top - bottom) * (high - np.log10(loss)) / (high - low)

    def ticks(mantissas):
        return [m * 10.0**p for p in range(int(np.floor(low)), int(np.ceil(high)) + 1) for m in mantissas
                if low <= np.log10(m * 10.0**p) <= high]

    values = ticks((1, 2, 5))
    for value in values if len(values) >= 3 else ticks(range(1, 10)):
        draw.line([(left, y(value)), (width - right, y(value))], fill=GRID)
        draw.text((4, y(value) - 7), f"{value:g}", fill=LABEL, font=font(12))
    for step in marks:
        for dot in range(top, height - bottom, 6):
            draw.line([(x(step), dot), (x(step), dot + 2)], fill=MARK)
    if floor:
        value, label = floor
        for dash in range(left, width - right, 12):
            draw.line([(dash, y(value)), (min(dash + 7, width - right), y(value))], fill=FLOOR, width=2)
    draw.line([(x(s), y(v)) for s, v in zip(steps, losses)], fill=CURVE, width=2)
    if floor:  # the label last, on white, so that the curve cannot hide it
        box = draw.textbbox((width - right - 4, y(value) - 4), label, font=font(12), anchor="rb")
        draw.rectangle((box[0] - 3, box[1] - 2, box[2] + 3, box[3] + 2), fill=(255, 255, 255), outline=FLOOR)
        draw.text((width - right - 4, y(value) - 4), label, fill=FLOOR, font=font(12), anchor="rb")
    draw.line([(left, height - bottom), (width - right, height - bottom)], fill=INK)
    draw.line([(left, top), (left, height - bottom)], fill=INK)
    for step in np.linspace(0, last, 5):
        draw.text((x(step) - 10, height - bottom + 4), f"{int(step)}", fill=LABEL, font=font(12))
    draw.text((width // 2, height - 12), x_label, fill=INK, font=font(12), anchor="mm")
    draw.text((left, 8), title, fill=INK, font=font(12))
    return np.asarray(image)
