"""A NumPy-backed stand-in for the part of CuPy that `accelerated/` uses, kernels run by cudasim.

Only CuPy names the twin calls are offered, each with a signature CuPy also accepts (checked
against the real `cupy` by tests/test_cudasim.py), so code that runs here runs on CuPy.

* `ndarray` is NumPy memory standing for device memory. Mixing it with a host (NumPy) array
  in arithmetic raises TypeError as CuPy does; `asnumpy` / `.get()` are the device-to-host copies.
* `matmul` computes like cuBLAS with fp32 accumulation: inputs upcast to float32, the product
  rounded once to the input dtype (fp32 GEMMs without TF32, CuPy's default).
* `gemm(x, w_t, out, beta)` is not a CuPy name: it plays the twin's own cuBLAS calls
  (accelerated/cublas.py: cublasGemmEx, and cublasGemmStridedBatchedEx for a strided batch),
  which compute as `matmul` does, plus beta * out in fp32 before the one rounding, but, unlike
  CuPy's cuBLAS wrappers, may be captured in a graph, where they are recorded like a kernel launch.
* `RawModule` compiles the CUDA source with cudasim and launches its kernels on the CPU.
* CUDA graphs: between `Stream.begin_capture()` and `end_capture()` nothing runs; every
  kernel launch and array operation is recorded, and the outputs it allocates are poisoned
  (NaN), as a captured GPU op has not run yet. `Graph.launch()` re-runs the recorded
  operations on the same buffers, reading their values at replay time; kernel scalars stay
  those given at capture, as in a real graph.
* Streams and events, as a capture sees them: each recorded operation is a node of the graph
  with the stream it was issued on (the current stream, `with stream:`) and the nodes it waits
  for (`Graph.nodes`, cudasim's own attribute), so a test can read the graph's dependencies. Work
  on one stream depends on that stream's previous work; `Event.record(stream)` marks a point of
  a stream and `Stream.wait_event(event)` makes another stream's next work wait for it. As in
  CUDA (Programming Guide, "Cross-stream dependencies and events"), a stream joins a capture only
  by waiting on an event recorded in a capturing stream, and `end_capture` refuses a capture
  with work not joined back into the stream that began it (cudaErrorStreamCaptureUnjoined).
  Outside a capture the CPU runs everything at once in issue order, which every stream order
  allows, so streams and events change nothing there.
* What CuPy 14 refuses during a capture, the stand-in refuses the same way (`Capture` lists
  each rule with its CuPy source), so a capture that works here works on a GPU.
"""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np

from . import cupy_dtypes
from .module import Module

# The names offered as `cupy.<name>`; `cuda` and `cupyx` hold the cupy.cuda.* and cupyx.* ones.
__all__ = ["float16", "float32", "float64", "int32", "int64", "ndarray", "asarray", "ascontiguousarray", "asnumpy",
           "empty", "empty_like", "zeros", "zeros_like", "ones", "full", "concatenate", "where", "matmul", "RawModule",
           "RawKernel", "cuda", "cos", "sin", "exp"]

float16, float32, float64, int32, int64 = np.float16, np.float32, np.float64, np.int32, np.int64
# Elementwise functions: NumPy's ufuncs reach `ndarray.__array_ufunc__`, which records them in a capture.
cos, sin, exp = np.cos, np.sin, np.exp

class CUDARuntimeError(RuntimeError):
    pass


class Capture:
    """The operations recorded by the stream being captured, and what CuPy refuses meanwhile.

    Each refusal raises what CuPy 14.2 raises, with its message:
    * a device-to-host copy (`get`, `asnumpy`): RuntimeError, cupy/cuda/memory.pyx
      (MemoryPointer.copy_to_host_async: "the current stream is capturing, so D2H transfers are
      disallowed");
    * a host-to-device copy (`asarray` of host data): RuntimeError, same file (copy_from_host_async);
    * a cuBLAS call (`matmul`): NotImplementedError, cupy_backends/cuda/libs/cublas.pyx
      (setStream, run before every cuBLAS routine: "calling cuBLAS API during stream capture is
      currently unsupported"; cupy#6290 tracks lifting it);
    * a stream or device synchronisation: the CUDA runtime's cudaErrorStreamCaptureUnsupported,
      which also invalidates the capture, so `end_capture` then fails with
      cudaErrorStreamCaptureInvalidated (CUDA Programming Guide, "Prohibited and Unhandled
      Operations"; CuPy passes both on as CUDARuntimeError);
    * capturing on the legacy default stream: RuntimeError, cupy/cuda/stream.pyx (begin_capture);
    * ending a capture whose work on another stream was not joined back (waited for by the stream
      that began it): cudaErrorStreamCaptureUnjoined from cudaStreamEndCapture (CUDA Runtime API);
    * work issued to a stream that never joined the capture: on a GPU it would run at once,
      outside the graph, before the captured work it reads; cudasim refuses it (a RuntimeError).
    Allocations are allowed: CuPy captures in relaxed mode so that its pool may grow
    (cupy/cuda/stream.pyx, begin_capture); what they hold stays at the captured addresses (cupy#9655).
    """

    def __init__(self, origin):
        self.nodes, self.invalidated = [], False
        self.origin = origin
        self.frontier = {origin: frozenset()}  # a capturing stream -> the nodes its next operation waits for

    def record(self, operation, name: str) -> None:
        """`operation` as the next node of the current stream, after that stream's frontier."""
        stream = _current_stream()
        if stream not in self.frontier:
            raise RuntimeError(f"{name} issued to a stream that is not part of the capture: a stream joins a capture "
                               "only by waiting on an event recorded in a capturing stream (cudasim refuses it: on a "
                               "GPU it would run at once, outside the graph)")
        self.nodes.append(Node(name, stream, self.frontier[stream], operation))
        self.frontier[stream] = frozenset({len(self.nodes) - 1})

    def check_joined(self) -> None:
        """Every node must come before the end of the origin stream (cudaStreamEndCapture's rule)."""
        joined, pending = set(), list(self.frontier[self.origin])
        while pending:
            node = pending.pop()
            if node not in joined:
                joined.add(node)
                pending.extend(self.nodes[node].waits_for)
        if len(joined) < len(self.nodes):
            raise CUDARuntimeError("cudaErrorStreamCaptureUnjoined: capture was not joined back into the stream that "
                                   "began it")

    def refuse_transfer(self, direction: str):
        raise RuntimeError(f"the current stream is capturing, so {direction} transfers are disallowed")

    def refuse_cublas(self):
        raise NotImplementedError("calling cuBLAS API during stream capture is currently unsupported")

    def refuse_synchronize(self):
        self.invalidated = True
        raise CUDARuntimeError("cudaErrorStreamCaptureUnsupported: operation not permitted when stream is capturing")


class Node:
    """One operation of a captured graph: a name (the kernel's, "gemm (handle n)" or "array
    operation"), the stream it was issued on, the indices of the nodes it waits for, and `run`,
    which performs it."""

    def __init__(self, name: str, stream, waits_for: frozenset, run):
        self.name, self.stream, self.waits_for, self.run = name, stream, waits_for, run


_state = {"capture": None, "synchronize_allowed": True, "streams": []}


def _capturing() -> Capture | None:
    return _state["capture"]


def _current_stream():
    """The stream of the innermost `with stream:`, else the legacy default stream."""
    return _state["streams"][-1] if _state["streams"] else _default_stream


def _run_or_record(operation, name: str = "array operation") -> None:
    """Run `operation()` now, or record it when a stream is capturing a graph."""
    if _capturing() is None:
        operation()
    else:
        _capturing().record(operation, name)


def _fresh(compute):
    """A new device array holding compute() (a NumPy array), recomputed on every graph replay."""
    result = np.asarray(compute()).view(ndarray)
    if _capturing() is not None:
        result.view(np.ndarray)[...] = np.nan if result.dtype.kind in "fc" else -1  # not computed yet
        _capturing().record(lambda: np.copyto(result.view(np.ndarray), compute(), casting="unsafe"), "array operation")
    return result


def _host(value):
    """The NumPy view of a device array (scalars pass); a host array is refused as CuPy does."""
    if isinstance(value, ndarray):
        return value.view(np.ndarray)
    if isinstance(value, np.ndarray):
        raise TypeError(f"Unsupported type {type(value)}: a host (NumPy) array where CuPy needs a device array")
    return value


def _to_host(array):
    if _capturing() is not None:
        _capturing().refuse_transfer("D2H")
    if not _state["synchronize_allowed"]:
        raise RuntimeError("synchronization disallowed by cupyx.allow_synchronize(False)")
    return np.array(array.view(np.ndarray))


def _refuse_out(out, name: str) -> None:
    """The reductions take CuPy's signature; their `out=` is not modelled, so it is refused, not ignored."""
    if out is not None:
        raise TypeError(f"cudasim's stand-in does not model ndarray.{name}(out=...); use its return value")


class ndarray(np.ndarray):
    """Device memory (NumPy's, here); arithmetic on it is recorded while a graph is captured."""

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        """An operator or cupy ufunc: CuPy's loop for these operands (cupy_dtypes), NumPy computing it."""
        if method != "__call__" or kwargs:
            raise TypeError(f"numpy.{ufunc.__name__}.{method} with {sorted(kwargs)} on a device array: cudasim's "
                            "stand-in models CuPy's plain ufunc calls only")
        args = [_host(x) for x in inputs]
        loop = cupy_dtypes.resolve(ufunc.__name__, [cupy_dtypes.operand(x) for x in args])
        if out is None:
            return _fresh(lambda: cupy_dtypes.run_loop(ufunc, loop, args))
        (target,) = (_host(x) for x in out)
        cupy_dtypes.check_output_cast(loop, target.dtype)
        _run_or_record(lambda: np.copyto(target, cupy_dtypes.run_loop(ufunc, loop, args), casting="unsafe"))
        return out[0]

    def __array_function__(self, func, types, args, kwargs):
        raise TypeError(f"numpy.{func.__name__} on a device array: CuPy would refuse it; use the cupy function")

    def __getitem__(self, key):
        key = tuple(_host(k) for k in key) if isinstance(key, tuple) else _host(key)
        view = np.ndarray.__getitem__(self.view(np.ndarray), key)
        if np.may_share_memory(view, self.view(np.ndarray)):
            return view.view(ndarray)
        return _fresh(lambda: np.ndarray.__getitem__(self.view(np.ndarray), key))  # advanced indexing copies

    def __setitem__(self, key, value):
        _run_or_record(lambda: np.ndarray.__setitem__(self.view(np.ndarray), key, _host(value)))

    def reshape(self, *shape, order="C"):
        base = self.view(np.ndarray)
        view = base.reshape(*shape, order=order)
        if np.may_share_memory(view, base):
            return view.view(ndarray)
        return _fresh(lambda: base.reshape(*shape, order=order))  # a copy: a kernel on a GPU

    def astype(self, dtype, order="K", casting=None, subok=None, copy=True):
        base = self.view(np.ndarray)
        if not copy and base.dtype == np.dtype(dtype):
            return self
        return _fresh(lambda: base.astype(dtype, order=order))

    def copy(self, order="C"):
        base = self.view(np.ndarray)
        return _fresh(lambda: base.copy(order=order))

    def fill(self, value):
        _run_or_record(lambda: self.view(np.ndarray).fill(value))

    def get(self, stream=None, order="C", out=None, blocking=True):
        return _to_host(self)

    def mean(self, axis=None, dtype=None, out=None, keepdims=False):
        """CuPy's mean: 16-bit floats summed in float32 and returned in their own dtype (cupy_dtypes.mean_dtypes)."""
        _refuse_out(out, "mean")
        base = self.view(np.ndarray)
        total, result = cupy_dtypes.mean_dtypes(base.dtype) if dtype is None else (np.dtype(dtype),) * 2
        return _fresh(lambda: np.mean(base, axis=axis, dtype=total, keepdims=keepdims).astype(result))

    def all(self, axis=None, out=None, keepdims=False):
        _refuse_out(out, "all")
        base = self.view(np.ndarray)
        return _fresh(lambda: np.all(base, axis=axis, keepdims=keepdims))


# ---------------------------------------------------------------------------------------------
# Array creation and the functions accelerated/ calls


def asarray(a, dtype=None, order=None, *, blocking=False):
    if isinstance(a, ndarray):
        return a if dtype is None or a.dtype == np.dtype(dtype) else a.astype(dtype)
    if _capturing() is not None:
        _capturing().refuse_transfer("H2D")
    return np.array(a, dtype=dtype, order=order or "K").view(ndarray)  # a host-to-device copy


def ascontiguousarray(a, dtype=None):
    if not isinstance(a, ndarray):
        raise TypeError(f"Unsupported type {type(a)}")
    if a.flags.c_contiguous and (dtype is None or a.dtype == np.dtype(dtype)):
        return a
    base = a.view(np.ndarray)
    return _fresh(lambda: np.ascontiguousarray(base, dtype=dtype))


def asnumpy(a, stream=None, order="C", out=None, *, blocking=True):
    return _to_host(a) if isinstance(a, ndarray) else np.asarray(a, order=order)


def empty(shape, dtype=float, order="C"):
    """Uninitialised device memory: filled with NaN (0xff bytes) so reading it shows up."""
    array = np.empty(shape, dtype=dtype, order=order)
    array.view(np.uint8)[...] = 0xFF
    return array.view(ndarray)


def empty_like(prototype, dtype=None, order="K", subok=None, shape=None):
    return empty(prototype.shape if shape is None else shape, dtype=prototype.dtype if dtype is None else dtype)


def zeros(shape, dtype=float, order="C"):
    return np.zeros(shape, dtype=dtype, order=order).view(ndarray)


def zeros_like(a, dtype=None, order="K", subok=None, shape=None):
    return zeros(a.shape if shape is None else shape, dtype=a.dtype if dtype is None else dtype)


def ones(shape, dtype=float, order="C"):
    return np.ones(shape, dtype=dtype, order=order).view(ndarray)


def full(shape, fill_value, dtype=None, order="C"):
    return np.full(shape, fill_value, dtype=dtype, order=order).view(ndarray)


def concatenate(tup, axis=0, out=None, *, dtype=None, casting="same_kind"):
    arrays = [_host(a) for a in tup]
    return _fresh(lambda: np.concatenate(arrays, axis=axis, dtype=dtype, casting=casting))


def where(condition, x, y):
    """cupy.where(condition, x, y): its own loop table, which has no bfloat16 loop (cupy_dtypes)."""
    condition = condition.astype(bool, copy=False)  # as CuPy does first: a device operation, recorded in a capture
    args = [_host(a) for a in (condition, x, y)]
    loop = cupy_dtypes.resolve("where", [cupy_dtypes.operand(a) for a in args])
    return _fresh(lambda: cupy_dtypes.run_loop(np.where, loop, args))


def _fp32_product(a, b):
    """cuBLAS with fp32 accumulation: inputs upcast to float32, one rounding to the input dtype."""
    return (a.astype(np.float32) @ b.astype(np.float32)).astype(a.dtype)


def matmul(x1, x2, /, out=None):
    """cupy.matmul: computed as cuBLAS does; refused during a capture, as CuPy refuses it."""
    if _capturing() is not None:
        _capturing().refuse_cublas()
    a, b = _host(x1), _host(x2)
    return _fresh(lambda: _fp32_product(a, b))


def gemm(x, w_t, out, beta: float = 0.0, handle: int = 0) -> None:
    """out = x @ w_t + beta out as accelerated/cublas.py's cuBLAS call computes it on its handle
    `handle` (the node's name in a capture: "gemm (handle n)"), run now or, during a capture,
    recorded and re-run on replay with the values of that moment.

    x [M, K] or [B, M, K] (each sample's product, as cublasGemmStridedBatchedEx), w_t [K, N], out
    [M, N] or [B, M, N]. CUBLAS_COMPUTE_32F: the inputs upcast to float32, the product summed in
    float32, beta * out added in float32 (beta = 0: out is not read, as in cuBLAS) and the sum
    rounded once to out's dtype.
    """
    a, b, c = _host(x), _host(w_t), _host(out)

    def compute():
        total = a.astype(np.float32) @ b.astype(np.float32)
        return total + np.float32(beta) * c.astype(np.float32) if beta else total

    _run_or_record(lambda: np.copyto(c, compute().astype(c.dtype)), f"gemm (handle {handle})")


class RawModule:
    """cupy.RawModule(code=..., options=...): compiled by g++ with the cudasim prelude."""

    def __init__(self, code=None, *, path=None, options=(), backend="nvrtc", translate_cucomplex=False,
                 enable_cooperative_groups=False, name_expressions=None, jitify=False):
        self._module = Module(code, options, name="source.cu")

    def get_function(self, name):
        return RawKernel(self._module.get_function(name))


class RawKernel:
    """A kernel of a RawModule; a launch is recorded when a graph is being captured."""

    def __init__(self, kernel):
        self._kernel = kernel

    @property
    def max_dynamic_shared_size_bytes(self):
        return self._kernel.max_dynamic_shared_size_bytes

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, value):
        self._kernel.max_dynamic_shared_size_bytes = value

    def __call__(self, grid, block, args, *, shared_mem=0, enable_cooperative_groups=False):
        args = tuple(args)
        self._kernel.check(grid, block, args, shared_mem)  # a bad launch fails at capture time too
        _run_or_record(lambda: self._kernel(grid, block, args, shared_mem=shared_mem), self._kernel.name)


# ---------------------------------------------------------------------------------------------
# cupy.cuda: one device, streams, graphs


class Graph:
    """A captured graph; launch() replays its operations on the same buffers, in the order they
    were issued (a topological order of `nodes`: a node only waits for earlier ones)."""

    def __init__(self, nodes):
        self.nodes = nodes  # cudasim's: the graph's Node list, also read by tests of its dependencies

    def upload(self, stream=None):
        pass

    def launch(self, stream=None):
        for node in self.nodes:
            node.run()


class Event:
    """A point in a stream's work. Recorded in a capturing stream it stands for the nodes issued
    there so far; recorded elsewhere, for work the CPU has already run."""

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self._waits_for = None  # the capture nodes the event marks (None: nothing to wait for)

    def record(self, stream=None):
        stream = _current_stream() if stream is None else stream
        capture = _capturing()
        self._waits_for = capture.frontier.get(stream) if capture is not None else None

    def synchronize(self):
        if _capturing() is not None:
            _capturing().refuse_synchronize()


class Stream:
    """Work runs in order on the CPU, so a stream only matters for graph capture; `with stream:`
    makes it the current stream."""

    def __init__(self, null=False, non_blocking=False, ptds=False, priority=None):
        self.null = null

    def __enter__(self):
        _state["streams"].append(self)
        return self

    def __exit__(self, *exc):
        _state["streams"].pop()
        return False

    def synchronize(self):  # not seen by cupyx.allow_synchronize (cupy/_core/syncdetect.py)
        if _capturing() is not None:
            _capturing().refuse_synchronize()

    def record(self, event=None):
        event = Event() if event is None else event
        event.record(self)
        return event

    def wait_event(self, event):
        """This stream's next work waits for `event`; an event recorded in a capture pulls this
        stream into it (cudaStreamWaitEvent)."""
        capture = _capturing()
        if capture is None or event._waits_for is None:
            return
        capture.frontier[self] = capture.frontier.get(self, frozenset()) | event._waits_for

    def begin_capture(self, mode=None):
        if self.null:
            raise RuntimeError("cannot capture on the default (legacy) stream")
        if _capturing() is not None:
            raise RuntimeError("a stream is already capturing")
        _state["capture"] = Capture(self)

    def end_capture(self):
        capture, _state["capture"] = _capturing(), None
        if capture.invalidated:
            raise CUDARuntimeError("cudaErrorStreamCaptureInvalidated: operation failed due to a previous error "
                                   "during capture")
        capture.check_joined()
        return Graph(capture.nodes)


class Device:
    def __init__(self, device=None):
        pass

    def synchronize(self):
        if _capturing() is not None:
            _capturing().refuse_synchronize()
        if not _state["synchronize_allowed"]:  # cupy/cuda/device.pyx: Device.synchronize declares it
            raise RuntimeError("synchronization disallowed by cupyx.allow_synchronize(False)")


class MemoryPool:
    """Memory is NumPy's: a pool only has to exist and hand out an allocator."""

    def __init__(self, allocator=None):
        pass

    def malloc(self, size):
        return np.empty(size, np.uint8)


@contextmanager
def using_allocator(allocator=None):
    yield


_default_stream = Stream(null=True)

cuda = SimpleNamespace(
    runtime=SimpleNamespace(getDeviceCount=lambda: 1, getDevice=lambda: 0, CUDARuntimeError=CUDARuntimeError),
    Stream=Stream, Event=Event, Device=Device, MemoryPool=MemoryPool, using_allocator=using_allocator,
    get_current_stream=lambda device_id=-1: _current_stream(), graph=SimpleNamespace(Graph=Graph),
)


@contextmanager
def allow_synchronize(allow):
    """cupyx.allow_synchronize: with False, any device-to-host copy or synchronisation raises."""
    saved = _state["synchronize_allowed"]
    _state["synchronize_allowed"] = allow
    try:
        yield
    finally:
        _state["synchronize_allowed"] = saved


cupyx = SimpleNamespace(allow_synchronize=allow_synchronize)
