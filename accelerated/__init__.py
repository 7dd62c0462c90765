"""CuPy twin of the reference: same module layout, GPU kernels."""
