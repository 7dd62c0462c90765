"""The "coloured shapes" data set of the demo model: one hard-edged shape on a plain background.

Every image is 64 x 64 RGB (or smaller, for the watch-it-learn run: the same scene with its
geometry scaled) and described by five attributes; its caption is

    a {size} {colour} {shape} at the {position} on a {background} background

with the size, position and background phrases each optionally left out (the attribute is then
random, so "a red circle" is a valid prompt). Six colour-shape pairs (HELD_OUT) never appear in
training, so an evaluation on them measures whether the model composes words it only saw apart.

Rendering is exact and deterministic: a pixel belongs to the shape when its centre (x + 0.5,
y + 0.5) lies inside the geometric figure. `render_mask` is also what the evaluation checker
uses to compare a generated mask with each candidate shape.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

IMAGE_SIZE = 64
COLOURS = {
    "red": (220, 40, 40), "orange": (245, 140, 30), "yellow": (240, 220, 40), "green": (40, 170, 70),
    "cyan": (40, 200, 220), "blue": (40, 80, 230), "purple": (150, 60, 200), "white": (245, 245, 245),
}
BACKGROUNDS = {"black": (15, 15, 15), "gray": (128, 128, 128), "white": (245, 245, 245), "navy": (20, 30, 90)}
SHAPES = ("circle", "square", "triangle", "cross")
SIZES = {"small": 16, "large": 28}
POSITIONS = {"left": (16, 32), "right": (48, 32), "top": (32, 16), "bottom": (32, 48), "center": (32, 32)}
HELD_OUT = {("red", "triangle"), ("green", "circle"), ("blue", "cross"), ("yellow", "square"),
            ("purple", "triangle"), ("cyan", "square")}

# Each optional caption phrase (size, position, background) is kept with this probability by
# default; a left-out attribute is random, so short captions teach a model to fill in the rest.
PHRASE_PROBABILITY = 0.75


@dataclass(frozen=True)
class Scene:
    """One image's attributes (keys of the tables above)."""

    size: str
    colour: str
    shape: str
    position: str
    background: str

    def caption(self, with_size: bool = True, with_position: bool = True, with_background: bool = True) -> str:
        """The full caption, or a short one with some phrases left out."""
        words = ["a"] + ([self.size] if with_size else []) + [self.colour, self.shape]
        if with_position:
            words += ["at", "the", self.position]
        if with_background:
            words += ["on", "a", self.background, "background"]
        return " ".join(words)


def vocabulary() -> list[str]:
    """Every word a caption can contain, in a fixed order (the demo tokenizer's word ids)."""
    words = ["a", *SIZES, *COLOURS, *SHAPES, "at", "the", *POSITIONS, "on", *BACKGROUNDS, "background"]
    return list(dict.fromkeys(words))


def is_valid(scene: Scene) -> bool:
    """The shape is never drawn in the background's colour (white on white would be invisible)."""
    return COLOURS[scene.colour] != BACKGROUNDS[scene.background]


@lru_cache(maxsize=None)
def all_scenes(held_out: bool = False) -> tuple[Scene, ...]:
    """Every valid scene whose colour-shape pair is (held_out=True) or is not in HELD_OUT."""
    scenes = (Scene(*attrs) for attrs in itertools.product(SIZES, COLOURS, SHAPES, POSITIONS, BACKGROUNDS))
    return tuple(s for s in scenes if is_valid(s) and ((s.colour, s.shape) in HELD_OUT) == held_out)


@lru_cache(maxsize=4)
def pixel_centres(image_size: int) -> np.ndarray:
    """float [2, H, W]: each pixel's centre (y + 0.5, x + 0.5), made once per size (the checker
    renders a hundred candidate masks per image it reads)."""
    centres = np.mgrid[0:image_size, 0:image_size] + 0.5
    centres.flags.writeable = False
    return centres


def render_mask(shape: str, size: float, centre: tuple[float, float], image_size: int = IMAGE_SIZE) -> np.ndarray:
    """bool [H, W]: pixels whose centre lies inside `shape` with a `size`-pixel bounding box
    centred at `centre` = (x, y).

    circle: diameter `size`; square: axis-aligned; triangle: apex up, base = height = `size` (its
    apex row holds no pixel centre, so it is drawn `size` - 1 rows tall); cross: a plus sign whose
    arms are `size` / 3 wide.
    """
    cx, cy = centre
    y, x = pixel_centres(image_size)
    dx, dy, half = x - cx, y - cy, size / 2
    if shape == "circle":
        return dx * dx + dy * dy <= half * half
    if shape == "square":
        return (np.abs(dx) <= half) & (np.abs(dy) <= half)
    if shape == "triangle":  # the half-width grows from 0 at the apex to size / 2 at the base
        return (np.abs(dy) <= half) & (np.abs(dx) <= (dy + half) / 2)
    if shape == "cross":
        arm = size / 6
        return ((np.abs(dx) <= arm) & (np.abs(dy) <= half)) | ((np.abs(dy) <= arm) & (np.abs(dx) <= half))
    raise ValueError(f"unknown shape {shape!r}; expected one of {', '.join(SHAPES)}")


def render(scene: Scene, image_size: int = IMAGE_SIZE) -> np.ndarray:
    """uint8 [image_size, image_size, 3]: the scene's shape on its background, its size and
    position (SIZES, POSITIONS, given at IMAGE_SIZE) scaled by image_size / IMAGE_SIZE."""
    scale = image_size / IMAGE_SIZE
    centre = tuple(c * scale for c in POSITIONS[scene.position])
    image = np.empty((image_size, image_size, 3), dtype=np.uint8)
    image[...] = BACKGROUNDS[scene.background]
    image[render_mask(scene.shape, SIZES[scene.size] * scale, centre, image_size)] = COLOURS[scene.colour]
    return image


def to_model_range(pixels: np.ndarray) -> np.ndarray:
    """uint8 [B, H, W, 3] -> float32 [B, 3, H, W] in [-1, 1], the exact inverse of
    `minit2i.images.to_pixels` (floor(127.5 x + 128) gives back every level)."""
    return (pixels.astype(np.float32).transpose(0, 3, 1, 2) - 127.5) / 127.5


def random_batch(rng: np.random.Generator, batch: int, phrase_probability: float = PHRASE_PROBABILITY,
                 image_size: int = IMAGE_SIZE):
    """(float32 images [B, 3, S, S] in [-1, 1], B captions) drawn from the training scenes, S =
    `image_size`.

    Each optional phrase is kept with `phrase_probability`, so short captions are common.
    """
    scenes = all_scenes(held_out=False)
    picked = [scenes[i] for i in rng.integers(len(scenes), size=batch)]
    keep = rng.random((batch, 3)) < phrase_probability
    captions = [s.caption(*flags) for s, flags in zip(picked, keep.tolist())]
    return to_model_range(np.stack([render(s, image_size) for s in picked])), captions

