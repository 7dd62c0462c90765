"""cudasim: run CUDA C kernels on a CPU, one fiber per CUDA thread (see README.md)."""

from .build import BuildError, sanitizer_environment
from .module import (SCHEDULES, Kernel, KernelError, LaunchCounts, Module, RaceError, counting, detectors, device_array,
                     schedules)

__all__ = ["SCHEDULES", "BuildError", "Kernel", "KernelError", "LaunchCounts", "Module", "RaceError", "counting",
           "detectors", "device_array", "sanitizer_environment", "schedules"]
