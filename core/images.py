"""Tensor -> pixels -> PNG (model.md 4.6), shared by both backends."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PIL import Image

from .checks import check_output_file, user_path, write_temporary
from .errors import MiniT2IError


def to_pixels(images: np.ndarray) -> np.ndarray:
    """[B, 3, H, W] float in ~[-1, 1] -> uint8 [B, H, W, 3]: floor(clip(127.5 x + 128, 0, 255))."""
    scaled = np.clip(127.5 * images.astype(np.float32) + 128.0, 0.0, 255.0)
    return scaled.astype(np.uint8).transpose(0, 2, 3, 1)


def check_writable(path: str | Path, flag: str = "--output") -> Path:
    """Fail early (before any model work) if `path`, given by `flag`, cannot be written as a PNG."""
    path = user_path(path)
    if path.suffix.lower() != ".png":
        raise MiniT2IError(f"{flag} {path} must end in .png; pass e.g. {flag} image.png")
    return check_output_file(path, flag)


def save_png(pixels: np.ndarray, path: str | Path) -> Path:
    """uint8 [H, W, 3] -> PNG at `path`, written atomically (see `save_pngs`)."""
    return save_pngs([(pixels, path)])[0]


def save_pngs(images: list[tuple[np.ndarray, str | Path]]) -> list[Path]:
    """Write several PNGs all or nothing: each to a temporary file beside its target, then,
    once every one is written, each renamed into place. A failure while writing (a full disk,
    a folder removed meanwhile) removes the temporary files and leaves every target as it was.
    Renaming within a folder needs no space, so the renames do not fail for the reasons writes do."""
    for pixels, _ in images:
        _check_pixels(pixels)
    written: list[tuple[str, Path]] = []
    try:
        for pixels, path in images:
            path = Path(path)
            written.append((_write_temporary(pixels, path), path))
        for tmp, path in written:
            os.replace(tmp, path)
    except OSError as err:
        _remove([tmp for tmp, _ in written])
        raise MiniT2IError(f"cannot write {err.filename or path}: {err.strerror or err}; free some space "
                           "or choose another folder") from None
    except BaseException:
        _remove([tmp for tmp, _ in written])
        raise
    return [path for _, path in written]


def _check_pixels(pixels) -> None:
    """Images are uint8 [H, W, 3] (channels last, as `to_pixels` returns them)."""
    if not (isinstance(pixels, np.ndarray) and pixels.dtype == np.uint8 and pixels.ndim == 3
            and pixels.shape[2] == 3 and pixels.shape[0] > 0 and pixels.shape[1] > 0):
        found = (f"{pixels.dtype} {list(pixels.shape)}" if isinstance(pixels, np.ndarray)
                 else type(pixels).__name__)
        raise MiniT2IError(f"expected uint8 pixels [H, W, 3] (channels last), found {found}; "
                           "convert images with to_pixels")


def _write_temporary(pixels: np.ndarray, path: Path) -> str:
    """The PNG in a new temporary file beside `path`; a failure names `path`, not the temporary file."""
    try:
        return write_temporary(path, lambda f: Image.fromarray(np.ascontiguousarray(pixels)).save(f, format="PNG"))
    except OSError as err:
        if not err.filename:
            err.filename = str(path)
        raise


def _remove(paths: list[str]) -> None:
    for p in paths:
        Path(p).unlink(missing_ok=True)


def grid(pixels: list[np.ndarray], columns: int) -> np.ndarray:
    """Tile equally sized uint8 [H, W, 3] images into one [rows*H, columns*W, 3] image."""
    h, w, c = pixels[0].shape
    rows = -(-len(pixels) // columns)
    canvas = np.full((rows * h, columns * w, c), 255, dtype=np.uint8)
    for i, p in enumerate(pixels):
        r, col = divmod(i, columns)
        canvas[r * h:(r + 1) * h, col * w:(col + 1) * w] = p
    return canvas
