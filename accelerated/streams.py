"""Both streams of a double block at once: the text stream's work on a second CUDA stream.

Between two joint attentions the text and image streams do not read each other: each runs its
RMSNorm, QKV GEMM and qkv_heads kernel, and after the attention its output projection,
add_rms_norm and MLP. The text stream's GEMMs are small (M = 2 x 256 rows against the image's
2 x 1024 for one CFG image) and fill a fraction of the GPU's SMs, so a forward runs them, and the
text stream's small kernels, on a second stream (`kernels.text_stream()`) beside the image
stream's. A grouped GEMM (cublasGemmGroupedBatchedEx, cuBLAS 12.5+) would put each pair of
same-shaped GEMMs in one launch but leave the kernels between them in sequence; two streams
overlap everything, with no change to any kernel or GEMM call.

`forked()` (around one forward) enables it; inside, `on_text_stream()` issues a block of text
work to the text stream and `join_text_stream()` makes the current (main) stream wait for it:
fork: an event recorded on the main stream, the text stream waits on it (lazily, at the first
text work after a join); join: an event recorded on the text stream, the main stream waits on
it. Inside a graph capture the text stream joins the capture by that wait and is joined back by
the next (CUDA Programming Guide, "Cross-stream dependencies and events"), so the graph holds the
two chains side by side, tied only at each joint attention. Results are the same bits as
unforked: the same kernels on the same data, in an order each stream keeps.

CuPy's memory pool keeps freed memory per stream and hands it to the next allocation on that
stream, which a graph orders after the free on that stream only. An array of the main stream
that the text stream reads (the attention output) is therefore kept alive (`lent`) until the
next join, so that no main-stream allocation reuses it while the text stream may still read it.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

from .kernels import cp, text_stream

_FORK: ContextVar = ContextVar("text stream fork", default=None)  # the TextStreamFork of the running forward


class TextStreamFork:
    """The state of one forward's fork: the main stream while forked, the arrays lent to the text
    stream and the events recorded (kept until the forward ends)."""

    def __init__(self):
        self.main = None
        self.lent, self.events = [], []

    @contextmanager
    def text(self, lent):
        """Issue the block's work to the text stream, forked from the main stream if not yet."""
        if self.main is None:
            self.main = cp.cuda.get_current_stream()
            text_stream().wait_event(self.event(self.main))
        self.lent.extend(lent)
        with text_stream():
            yield

    def join(self) -> None:
        """The main stream waits for the text stream's work so far."""
        if self.main is not None:
            self.main.wait_event(self.event(text_stream()))
            self.main, self.lent = None, []

    def event(self, stream):
        event = cp.cuda.Event(disable_timing=True)
        event.record(stream)
        self.events.append(event)
        return event


@contextmanager
def forked(enabled: bool = True):
    """Within: `on_text_stream` blocks run on the text stream (unless not `enabled`); joined at the end."""
    fork = TextStreamFork() if enabled else None
    token = _FORK.set(fork)
    try:
        yield
    finally:
        _FORK.reset(token)
        if fork is not None:
            fork.join()


@contextmanager
def on_text_stream(*lent):
    """The block's device work on the text stream when forked; `lent`: main-stream arrays it reads."""
    fork = _FORK.get()
    if fork is None:
        yield
    else:
        with fork.text(lent):
            yield


def join_text_stream() -> None:
    """The current stream waits for the text stream's work (before a joint attention)."""
    fork = _FORK.get()
    if fork is not None:
        fork.join()
