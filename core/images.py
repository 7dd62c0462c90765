"""Tensor -> pixels -> PNG (model.md 4.6), shared by both backends."""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from .checks import user_path
from .errors import MiniT2IError
from .files import check_output_file, write_together


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
    """Write several PNGs all or nothing (`checks.write_together`): a failure while writing (a full
    disk, a folder removed meanwhile) or Ctrl-C leaves every target as it was."""
    for pixels, _ in images:
        _check_pixels(pixels)
    paths = [Path(path) for _, path in images]
    write_together({path: _png_writer(pixels) for (pixels, _), path in zip(images, paths)},
                   "free some space or choose another folder")
    return paths


def _check_pixels(pixels) -> None:
    """Images are uint8 [H, W, 3] (channels last, as `to_pixels` returns them)."""
    if not (isinstance(pixels, np.ndarray) and pixels.dtype == np.uint8 and pixels.ndim == 3
            and pixels.shape[2] == 3 and pixels.shape[0] > 0 and pixels.shape[1] > 0):
        found = (f"{pixels.dtype} {list(pixels.shape)}" if isinstance(pixels, np.ndarray)
                 else type(pixels).__name__)
        raise MiniT2IError(f"expected uint8 pixels [H, W, 3] (channels last), found {found}; "
                           "convert images with to_pixels")


def _png_writer(pixels: np.ndarray):
    """A function writing uint8 [H, W, 3] as a PNG into an open binary file."""
    return lambda file: file.write(png_bytes(pixels))


def png_bytes(pixels: np.ndarray) -> bytes:
    """uint8 [H, W, 3] -> the bytes of its PNG, the same for the same pixels and Pillow (every PNG
    this project writes is encoded here, so that equal pixels give equal files)."""
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels)).save(buffer, format="PNG")
    return buffer.getvalue()


def png_limit(width: int, height: int) -> int:
    """The largest PNG file of a width x height RGB image: its raw pixels, a filter byte a row and
    zlib's 5 bytes a stored block of 64 kB at worst, bounded by twice the raw size plus 1 MiB."""
    return 2 * 3 * width * height + 2**20


def decode_png(data: bytes, path: Path, what: str, size: tuple[int, int], fix: str) -> np.ndarray:
    """The bytes of a PNG file from outside (`path`, `what` it should be, for the messages) ->
    uint8 [H, W, 3], checked to be a PNG of `size` (width, height) before it is decoded: another
    size, a decompression bomb (a small file declaring billions of pixels) or damaged data is one
    line ending in `fix`."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=["PNG"]) as png:
                if png.size != size:
                    raise MiniT2IError(f"{path} is {png.size[0]} x {png.size[1]} pixels, not {what} of "
                                       f"{size[0]} x {size[1]}; {fix}")
                return np.asarray(png.convert("RGB"))
    except UnidentifiedImageError:
        raise MiniT2IError(f"{path} is not a PNG image; {fix}") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise MiniT2IError(f"{path} is not {what} ({err}); {fix}") from None


def grid(pixels: list[np.ndarray], columns: int) -> np.ndarray:
    """Tile equally sized uint8 [H, W, 3] images into one [rows*H, columns*W, 3] image."""
    h, w, c = pixels[0].shape
    rows = -(-len(pixels) // columns)
    canvas = np.full((rows * h, columns * w, c), 255, dtype=np.uint8)
    for i, p in enumerate(pixels):
        r, col = divmod(i, columns)
        canvas[r * h:(r + 1) * h, col * w:(col + 1) * w] = p
    return canvas
