"""NumPy reference implementation of MiniT2I (the golden oracle)."""
