"""Errors in one line, said the same way in ``Failed`` values, logs and exceptions."""

from __future__ import annotations

import os

__all__ = ["describe_error", "one_line", "oserror"]


def one_line(text: str, width: int | None = 300) -> str:
    """``text`` with its white space folded, cut to ``width`` characters (``...``); None: uncut."""
    text = " ".join(text.split())
    if width is None or len(text) <= width:
        return text
    return text[: width - 3] + "..."


def describe_error(exc: BaseException, *, width: int | None = 300) -> str:
    """``"TypeError: the message"`` in one line; the type alone when there is no message."""
    text = one_line(str(exc), width)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def oserror(exc: OSError) -> str:
    """What an ``OSError`` says, for "cannot be read: ...": its strerror and its type."""
    if not exc.errno and str(exc):  # a store's own error (no errno) says it all
        return str(exc)
    name = os.strerror(exc.errno) if exc.errno else type(exc).__name__
    return f"{name} ({type(exc).__name__})"
