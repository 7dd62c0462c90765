"""The one exception type that user-facing entry points turn into a clear message."""


class MiniT2IError(Exception):
    """Bad input or environment: the message names the problem and the fix.

    The CLI prints it as one line (no traceback) and exits with status 2.
    """
