"""Waits that Ctrl-C and SIGTERM end, for calls that block in C: a name lookup, ray.init.

Python runs a signal handler only between bytecodes of the main thread, so a call that waits in
C holds the signal until it returns: `socket.getaddrinfo` with a name server that does not
answer (28 s seen, the resolver's retries; it has no deadline of its own), ray.init starting a
cluster whose processes a SIGTERM to the process group has already ended. `waited` runs such a
call in a thread of its own and waits for it in a wait that a signal ends (a lock's, which
Python's handlers interrupt; the kernel gives a signal sent to the process to its main thread).
A call left behind ends with the process (a daemon thread). A call that must stay on the main
thread (ray.init: from another thread its cluster fails) is given `signals_end_within` instead.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import threading
from collections.abc import Iterator
from typing import Callable, TypeVar

from .console import fail, signal_ending

T = TypeVar("T")

# How long a name server is given to answer: one on the network answers in milliseconds, and the
# resolver's own retries of a silent one take tens of seconds.
LOOKUP_SECONDS = 10


def waited(call: Callable[[], T], seconds: float, name: str) -> T:
    """`call()`'s result (or its exception), run in a daemon thread named `name` and waited for
    until it returns, a signal's handler raises, or `seconds` pass: then TimeoutError."""
    outcome: list = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as err:  # noqa: BLE001 - raised again in the waiting thread
            outcome.append((False, err))
        finally:
            done.set()

    threading.Thread(target=run, name=name, daemon=True).start()
    if not done.wait(seconds):
        raise TimeoutError(f"{name}: no result within {seconds:g} s")
    returned, value = outcome[0]
    if not returned:
        raise value
    return value


def addresses(host: str, port: int, seconds: float = LOOKUP_SECONDS) -> list[tuple]:
    """socket.getaddrinfo(host, port, type=SOCK_STREAM) -> [(family, type, proto, canonname,
    sockaddr)], within `seconds`. A name that does not resolve, cannot be a name (an empty label,
    one over 63 bytes: the codec's UnicodeError) or gets no answer in time is a socket.gaierror
    whose strerror says which."""
    try:
        return waited(lambda: socket.getaddrinfo(host, port, type=socket.SOCK_STREAM), seconds, f"lookup of {host}")
    except TimeoutError:
        raise socket.gaierror(socket.EAI_AGAIN, f"no answer from the name server within {seconds:g} s") from None
    except UnicodeError:
        raise socket.gaierror(socket.EAI_NONAME, "not a host name: a part between dots is empty or longer than 63 "
                                                 "characters") from None


@contextlib.contextmanager
def signals_end_within(seconds: float, prog: str = "minit2i") -> Iterator[None]:
    """Inside the block, Ctrl-C and SIGTERM end the process within `seconds`, even where its main
    thread waits in C, deaf to them (ray.init waits ~30 s for a cluster whose processes a SIGTERM
    to the process group ended): Python's handlers run as ever when the wait returns; past
    `seconds`, a watcher thread, woken by the signal (Python's wakeup file descriptor, written in
    C at once), ends the process as they would have (`signal_ending`'s line and status). Only for
    blocks that have written nothing yet: the process ends without its clean-up. Off the main
    thread, which takes no signal, it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    reader, writer = os.pipe()
    os.set_blocking(writer, False)
    previous = signal.set_wakeup_fd(writer, warn_on_full_buffer=False)
    left = threading.Event()

    def watch() -> None:
        while not left.is_set():
            if not select.select([reader], [], [], 0.2)[0]:
                continue
            ending = [signum for signum in os.read(reader, 64) if signum in (signal.SIGINT, signal.SIGTERM)]
            if ending and not left.wait(seconds):
                line, status = signal_ending(prog, ending[0])
                fail(line, status)
                os._exit(status)

    watcher = threading.Thread(target=watch, name="signal watcher", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        left.set()
        signal.set_wakeup_fd(previous)
        watcher.join()
        os.close(reader)
        os.close(writer)
