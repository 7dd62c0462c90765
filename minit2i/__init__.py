"""MiniT2I: a readable NumPy reference and a fast CuPy twin of the MiniT2I text-to-image model.

Shared pieces live here (config, weight loader, tokenizer, image I/O, CLI); the math lives in
`reference/` (NumPy) and `accelerated/` (CuPy).
"""

__version__ = "0.1.0"
