"""MiniT2I: a readable NumPy reference and a fast CuPy twin of the MiniT2I text-to-image model.

One package in layers that only import downwards (README: Layout): `minit2i.core` (configs,
weights, tokenizer, images; folder `core/`), `minit2i.reference` (NumPy), `minit2i.cudasim` (the
CUDA kernels on a CPU), `minit2i.accelerated` (CuPy), then the application in this folder
(pipeline, CLI, golden suite, trace, Hub, and `MiniT2IPipeline`, the Python API), and
`minit2i.training` on top.
"""

__version__ = "0.1.0"

# Imported on first use, so that `import minit2i` stays light (no NumPy model code loaded).
_API = ("MiniT2IPipeline", "MiniT2IPipelineOutput")
__all__ = list(_API)


def __getattr__(name):
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'minit2i' has no attribute {name!r}")
