"""One-line errors and safe output for every entry point: the `minit2i` CLI and the training scripts.

`guarded(prog, command)` runs a command and turns every failure that is not a bug into one line
on stderr (`PROG: error: ...`, exit status 2); `OneLineParser` is argparse with such errors;
`emit` prints a result to stdout. What they print can carry names and values from files and
arguments: `printable` shows those escaped (a control character cannot drive the terminal or
forge a second line) and shortened (a 100 kB argument is not printed whole).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from minit2i.core.errors import MiniT2IError

# The longest echoed value, and the longest error line, shown whole: a line of a terminal screen or
# two of real names and paths (a path is at most 4096 bytes); beyond that, the head and the tail.
VALUE_LIMIT = 300
LINE_LIMIT = 2000


def printable(text: str, limit: int | None = VALUE_LIMIT, keep: str = "") -> str:
    """`text` with every non-printable character but those in `keep` written as its Python escape
    (ESC -> \\x1b, BEL -> \\x07, CR -> \\r, newline -> \\n), and, beyond `limit` characters (None:
    no limit), its first three quarters and its last quarter with the count left out between."""
    shown = "".join(c if c.isprintable() or c in keep else repr(c)[1:-1] for c in text)
    if limit is None or len(shown) <= limit:
        return shown
    head, tail = limit * 3 // 4, limit // 4
    return f"{shown[:head]}...({len(shown) - head - tail} characters left out)...{shown[-tail:]}"


def guarded(prog: str, command) -> int:
    """`command()`'s exit status, with every failure that is not a bug as one line: user and
    environment errors `PROG: error: ...` and status 2, Ctrl-C status 130, SIGTERM 143 (after the
    same clean-up as Ctrl-C). A reader closing the pipe on stdout (`| head -1`) is its choice, not
    an error: a quiet exit 0."""
    if sys.stderr is None:  # started with stderr closed (`2>&-`): messages go nowhere, not to stdout
        sys.stderr = open(os.devnull, "w")
    previous_handler = _raise_on_sigterm()
    try:
        if sys.stdout is None:  # started with stdout closed (`>&-`): results could not be shown
            raise MiniT2IError("stdout is closed; redirect it (e.g. >/dev/null) instead of closing it")
        return command() or 0
    except MiniT2IError as err:
        return fail(f"{prog}: error: {err}", 2)
    except BrokenPipeError:
        _silence(sys.stdout)
        return 0
    except OSError as err:  # the environment, not a bug: a file that vanished, a full disk, ...
        where = f"{err.filename}: " if err.filename is not None else ""
        return fail(f"{prog}: error: {where}{err.strerror or err}", 2)
    except MemoryError:
        return fail(f"{prog}: error: out of memory (the process may run under a memory or address-space "
                    "limit, `ulimit -v`); raise the limit or use a smaller model or run", 2)
    except Terminated:
        return fail(*signal_ending(prog, signal.SIGTERM))
    except KeyboardInterrupt:
        return fail(*signal_ending(prog, signal.SIGINT))
    finally:
        if previous_handler is not None:
            signal.signal(signal.SIGTERM, previous_handler)


def signal_ending(prog: str, signum: int) -> tuple[str, int]:
    """(the last line, the exit status) of a run that SIGTERM or Ctrl-C (SIGINT) ended."""
    return (f"{prog}: terminated", 128 + signal.SIGTERM) if signum == signal.SIGTERM else (f"{prog}: interrupted", 130)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is, so that it cleans up (temporary files) as after Ctrl-C."""


def _raise_on_sigterm():
    """Make SIGTERM raise `Terminated`; the handler it replaces, or None where Python takes no
    signals (a thread other than the main one)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def terminate(signum, frame):
        raise Terminated

    return signal.signal(signal.SIGTERM, terminate) or signal.SIG_DFL


def emit(text: str) -> None:
    """Print a result (one or more lines) to stdout, control characters escaped (its line breaks
    are its own; a value that may hold one is passed through `printable` by the caller); a full
    stdout is a one-line user error (a closed pipe is left to `guarded`)."""
    try:
        print(printable(text, None, keep="\n"), flush=True)
    except BrokenPipeError:
        raise
    except OSError as err:
        raise MiniT2IError(f"cannot write to stdout: {err.strerror or err}") from None


def fail(message: str, status: int) -> int:
    """Print the final message as one line, escaped and shortened by `printable`, and return
    `status`. A closed or full stdout/stderr must not turn it into a traceback."""
    line = printable(message, LINE_LIMIT)
    try:
        if sys.stdout is not None:  # None when started with stdout closed
            sys.stdout.flush()
    except OSError:
        _silence(sys.stdout)
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        _silence(sys.stderr)
    return status


def _silence(stream) -> None:
    """Point a failed standard stream at /dev/null, so Python's exit flush does not fail again."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, stream.fileno())
        os.close(null)
    except (OSError, ValueError):
        pass


class OneLineFormatter(logging.Formatter):
    """A log record (the library's notes and warnings) as one `printable` line."""

    def format(self, record) -> str:
        return printable(super().format(record), LINE_LIMIT)


class OneLineParser(argparse.ArgumentParser):
    """argparse with one-line errors (argparse's own put the usage text first), named by the
    program (`minit2i`, `train`), not the subcommand."""

    def error(self, message):
        self.exit(fail(f"{self.prog.split()[0]}: error: {message} (see `{self.prog} --help`)", 2))
