"""cudasim's build cache under faults: a damaged cached library, a full cache, a broken g++.
Each is a `BuildError` with one line saying what to do (the application turns it into its
one-line error), never a crash on loading a damaged library."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from minit2i.cudasim import BuildError, Module, build

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="cudasim needs g++")

# A source of its own, so its cache entry is built by these tests alone.
SCALE = """
extern "C" __global__ void scale_by_three_for_the_build_tests(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= 3.0f;
}
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache of the test's own, holding only the runtime object that every library with the
    detectors links (three quarters of a build, made once in the suite's shared cache): each test
    compiles its libraries from source and finds the runtime built."""
    runtime = build._runtime_object(build.FLAGS, build.DETECTOR_LINK_FLAGS).parent
    shutil.copytree(runtime, tmp_path / "cache" / runtime.name)
    monkeypatch.setenv("CUDASIM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def run_scale() -> np.ndarray:
    x = np.arange(4, dtype=np.float32)
    Module(SCALE, name="scale.cu").get_function("scale_by_three_for_the_build_tests")((1,), (4,), (x, np.int32(4)))
    return x


def test_a_truncated_cached_library_is_rebuilt_not_loaded(cache):
    np.testing.assert_array_equal(run_scale(), [0, 3, 6, 9])
    (library,) = cache.glob("*/kernels.so")
    truncated = library.read_bytes()[:4096]
    library.unlink()  # a new file: this process still maps the old one
    library.write_bytes(truncated)
    np.testing.assert_array_equal(run_scale(), [0, 3, 6, 9])
    assert library.stat().st_size > 4096


@pytest.mark.parametrize("name", ["kernels.so", "kernels.so.sha256"])
def test_a_fifo_in_the_cache_is_rebuilt_over_not_read(cache, name):
    """Whoever can write to the cache can leave a FIFO there: reading it would block forever. The
    build runs in a thread so that a hang fails the test (60 s: a build takes a few seconds)."""
    import threading

    np.testing.assert_array_equal(run_scale(), [0, 3, 6, 9])
    (folder,) = (p.parent for p in cache.glob("*/kernels.so"))
    (folder / name).unlink()
    os.mkfifo(folder / name)
    results = []
    worker = threading.Thread(target=lambda: results.append(run_scale()), daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "the build blocked on the FIFO"
    np.testing.assert_array_equal(results[0], [0, 3, 6, 9])
    assert (folder / name).is_file()


def test_builds_of_one_library_at_once_compile_it_once(cache, monkeypatch):
    """Four threads build one new library at the same moment (as the suite's workers do, sharing
    the cache): it is compiled once, the others wait for its result, and no lock file stays behind.
    (flock excludes each open of the lock file, so threads of one process contend as processes do.)"""
    import threading

    compiled = []
    compile_in = build._compile_in
    monkeypatch.setattr(build, "_compile_in", lambda *args: (compiled.append(args[-1]), compile_in(*args)))
    start = threading.Barrier(4)
    libraries = []

    def build_scale():
        start.wait()
        libraries.append(build.build(SCALE, "scale.cu").path)

    workers = [threading.Thread(target=build_scale) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=300)  # hang guard: one build takes a few seconds
    assert len(compiled) == 1 and len(set(libraries)) == 1 and len(libraries) == 4
    assert [p.parent for p in cache.glob("*/kernels.so")] == compiled and list(cache.glob(".*")) == []
    np.testing.assert_array_equal(run_scale(), [0, 3, 6, 9])


def test_a_full_cache_is_one_line_and_leaves_no_partial_build(cache, monkeypatch):
    def disk_full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(build, "_compile_in", disk_full)
    before = sorted(cache.iterdir())
    with pytest.raises(BuildError) as info:
        run_scale()
    assert str(info.value) == (f"cannot write to the cudasim cache {cache} (No space left on device); free some "
                               "space or set CUDASIM_CACHE to another folder")
    assert sorted(cache.iterdir()) == before


def test_a_broken_compiler_is_one_line(tmp_path, monkeypatch):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "g++").write_text("#!/bin/sh\nexit 1\n")
    (fake / "g++").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    build.compiler_version.cache_clear()
    try:
        with pytest.raises(BuildError, match=r"^g\+\+ does not run \(.*\); reinstall it"):
            build.compiler_version()
    finally:
        build.compiler_version.cache_clear()


def test_the_cudasim_backend_reports_a_build_fault_in_one_line(tiny_model, tmp_path, monkeypatch, capsys):
    from minit2i.cli import main

    def broken(*args, **kwargs):
        raise BuildError("g++ could not compile kernels.cu for cudasim:\nkernels.cu:1: error: something")

    # Kernels are built at their first launch (T5's first); earlier tests may have built them all.
    monkeypatch.setattr("minit2i.accelerated.pipeline.CupyRunner.encode", broken)
    code = main(["generate", "-p", "a red cat", "--steps", "1", "-W", "16", "-H", "16", "-q", "--backend", "cudasim",
                 "--model", str(tiny_model[0]), "--t5", str(tiny_model[1]), "-o", str(tmp_path / "x.png")])
    err = capsys.readouterr().err
    assert code == 2 and err == ("minit2i: error: the cudasim backend could not build its kernels: g++ could not "
                                 "compile kernels.cu for cudasim: (kernels.cu:1: error: something)\n")
    assert not (tmp_path / "x.png").exists()


RACE = """
extern "C" __global__ void reset_while_counting_for_the_build_tests(int* counter) {
    if (threadIdx.x == 0) *counter = 0;
    else atomicAdd(counter, 1);
}
"""


def race_report() -> str:
    from minit2i.cudasim import RaceError

    with pytest.raises(RaceError) as info:
        Module(RACE, name="race.cu").get_function("reset_while_counting_for_the_build_tests")(
            (1,), (32,), (np.zeros(1, np.int32),))
    return str(info.value)


@pytest.mark.parametrize("built_elsewhere", [True, False])
def test_checkouts_share_a_library_and_each_blames_the_kernel_line(cache, tmp_path, monkeypatch, built_elsewhere):
    """A library's debug info names the header folder by a fixed name, whatever checkout built it,
    and race reports skip the runtime's frames by that name: a checkout elsewhere sharing the
    cache (gpu-check's copy of the checkout) and this one use one library, whichever built it,
    and both reports blame the kernel's line 4, not cudasim.h."""
    elsewhere = tmp_path / "elsewhere" / "include"
    shutil.copytree(build.INCLUDE, elsewhere)
    for there in (built_elsewhere, not built_elsewhere):
        with monkeypatch.context() as patch:
            if there:
                patch.setattr(build, "INCLUDE", elsewhere)
            assert "on line 4;" in race_report()
    assert len(list(cache.glob("*/kernels.so"))) == 1


def test_a_change_to_the_generated_glue_builds_a_new_library(tmp_path, monkeypatch):
    """build.py writes the launch glue compiled beside each kernel: a library built by an older
    build.py must not be taken from the cache, so its text is part of the cache key."""
    key = build.cache_key("__global__ void k() {}", "k.cu", [])
    edited = tmp_path / "build.py"
    edited.write_text(Path(build.__file__).read_text().replace(build.GLUE, build.GLUE + " /* changed */", 1))
    monkeypatch.setattr(build, "__file__", str(edited))
    assert build.cache_key("__global__ void k() {}", "k.cu", []) != key
