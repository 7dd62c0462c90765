"""The demo models' training (README.md). Its commands need PyTorch, the `train` extra."""

from minit2i.console import fail

MISSING_TORCH = 'training needs PyTorch, the train extra; install it with: .venv/bin/pip install -e ".[train]"'


def require_torch(prog: str) -> None:
    """Before a command's `import torch`: without PyTorch, one line naming the extra and exit
    status 2 instead of an ImportError's traceback."""
    try:
        import torch  # noqa: F401  (the command imports it next anyway)
    except ImportError:
        raise SystemExit(fail(f"{prog}: error: {MISSING_TORCH}", 2)) from None
