"""Session meta and the writer's ``prepare`` step.

A ``prepare`` step runs on each snapshot the writer is about to encode, on
the same thread, after the fingerprint check: it may return a repaired copy
of the snapshot (``Prepared``) or refuse it (``Failed``, the previous file
stays).  ``transcript_prepare`` (``_transcript/prepare.py``) is the one
agents use.

``session_meta`` gives the fields the writer adds to ``Meta`` beyond seq and
times: turns, parent, writer (pid, host), library and state versions.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

from .._text import describe_error
from .._values import Failed, Prepared, Snapshot, WriterInfo
from .._version import VERSION

__all__ = ["Prepare", "check_parent", "run_prepare", "session_meta", "writer_info"]


Prepare = Callable[[Any], Prepared | Failed]
"""``(Snapshot) -> Prepared | Failed``: the writer's ``prepare`` argument."""

_HOST = socket.gethostname()


def run_prepare(prepare: Prepare | None, snapshot: Snapshot) -> Prepared | Failed:
    """Run ``prepare`` on ``snapshot``; an exception or a bad return is ``Failed``.

    Also refuses a snapshot whose ``parent`` no store can keep (see
    ``check_parent``), before anything is encoded.
    """
    if prepare is None:
        if snapshot.parent is None:  # the common case, once per write
            return Prepared(snapshot=snapshot)
        prepared: object = Prepared(snapshot=snapshot)
    else:
        try:
            prepared = prepare(snapshot)
        except Exception as exc:
            return Failed("snapshot-failed", f"prepare() raised {describe_error(exc)}")
    if isinstance(prepared, Prepared):
        return check_parent(prepared.snapshot) or prepared
    if isinstance(prepared, Failed):
        return prepared
    return Failed(
        "snapshot-failed",
        f"prepare() returned {type(prepared).__name__}, expected Prepared(...) or Failed(...)",
    )


def check_parent(snapshot: Snapshot) -> Failed | None:
    """``Failed`` if ``snapshot.parent`` is not a str (or None) every store can keep.

    Every store refuses the same (a NUL, which PostgreSQL's jsonb cannot
    hold; a lone surrogate, which no UTF-8 file or column can; a parent that
    is not a str, which ``load`` could not read back),
    so a session written to one store can move to any other.
    """
    parent = snapshot.parent
    if parent is None:
        return None
    if not isinstance(parent, str):
        why = f"is of type {type(parent).__name__}; give the parent session's key (a str) or None"
    elif "\x00" in parent:
        why = (
            f"contains a NUL character ('\\x00') at index {parent.index(chr(0))}, which "
            "PostgreSQL cannot store (so no store takes it); remove it"
        )
    elif (surrogate := _lone_surrogate(parent)) is not None:
        why = (
            f"contains a lone surrogate ({parent[surrogate]!r}) at index {surrogate}, which "
            "is not valid Unicode and cannot be encoded as UTF-8 (so no store takes it); "
            "decode the name with errors='replace', or give another key"
        )
    else:
        return None
    return Failed("snapshot-failed", f"Snapshot.parent of key {snapshot.key!r} {why}")


def _lone_surrogate(text: str) -> int | None:
    """The index of the first lone surrogate in ``text`` (unencodable as UTF-8), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def session_meta(prepared: Prepared, state_version: int) -> dict[str, Any]:
    """The ``Meta`` fields a write adds beyond key, seq, times, live and pinned."""
    return {
        "turns": prepared.turns,
        "parent": prepared.snapshot.parent,
        "writer": writer_info(),
        "library_version": VERSION,
        "state_version": state_version,
    }


_me: WriterInfo | None = None


def writer_info() -> WriterInfo:
    """This process's ``WriterInfo``; made again in a forked child (a new pid)."""
    global _me
    pid = os.getpid()
    if _me is None or _me.pid != pid:
        _me = WriterInfo(pid=pid, host=_HOST)
    return _me
