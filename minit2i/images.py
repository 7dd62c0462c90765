"""Tensor -> pixels -> PNG (spec 4.6), shared by both backends."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from .errors import MiniT2IError


def to_pixels(images: np.ndarray) -> np.ndarray:
    """[B, 3, H, W] float in ~[-1, 1] -> uint8 [B, H, W, 3]: floor(clip(127.5 x + 128, 0, 255))."""
    scaled = np.clip(127.5 * images.astype(np.float32) + 128.0, 0.0, 255.0)
    return scaled.astype(np.uint8).transpose(0, 2, 3, 1)


def check_writable(path: str | Path) -> Path:
    """Fail early (before any model work) if `path` cannot be written as a PNG."""
    path = Path(path).expanduser()
    if path.suffix.lower() != ".png":
        raise MiniT2IError(f"output {path} must end in .png; pass e.g. --output image.png")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise MiniT2IError(f"output folder {folder} does not exist; create it or choose another --output")
    if not os.access(folder, os.W_OK):
        raise MiniT2IError(f"output folder {folder} is not writable; choose another --output")
    if path.is_dir():
        raise MiniT2IError(f"output {path} is a folder; pass a file name ending in .png")
    return path


def save_png(pixels: np.ndarray, path: str | Path) -> Path:
    """uint8 [H, W, 3] -> PNG at `path`, written atomically (a temp file renamed into place),
    so an interrupted run never leaves a half-written image."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".png.part", dir=path.parent or ".")
    try:
        # mkstemp makes the file private (0600); give the PNG the mode a plain open() would.
        os.chmod(tmp, 0o666 & ~_current_umask())
        with os.fdopen(fd, "wb") as f:
            Image.fromarray(np.ascontiguousarray(pixels)).save(f, format="PNG")
        os.replace(tmp, path)
    except OSError as err:  # disk full, folder removed meanwhile, ...: a user problem, not a bug
        Path(tmp).unlink(missing_ok=True)
        raise MiniT2IError(
            f"cannot write {path}: {err.strerror or err}; free some space or choose another --output"
        ) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _current_umask() -> int:
    """The process umask (reading it means setting it, so it is put straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def grid(pixels: list[np.ndarray], columns: int) -> np.ndarray:
    """Tile equally sized uint8 [H, W, 3] images into one [rows*H, columns*W, 3] image."""
    h, w, c = pixels[0].shape
    rows = -(-len(pixels) // columns)
    canvas = np.full((rows * h, columns * w, c), 255, dtype=np.uint8)
    for i, p in enumerate(pixels):
        r, col = divmod(i, columns)
        canvas[r * h:(r + 1) * h, col * w:(col + 1) * w] = p
    return canvas
