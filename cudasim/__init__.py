"""cudasim: run CUDA C kernels on a CPU, one fiber per CUDA thread (see README.md)."""

from .build import BuildError, sanitizer_environment
from .module import SCHEDULES, Kernel, KernelError, Module, RaceError, detectors, schedules

__all__ = ["SCHEDULES", "BuildError", "Kernel", "KernelError", "Module", "RaceError", "detectors",
           "sanitizer_environment", "schedules"]
