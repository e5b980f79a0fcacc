"""The writer's prepare step.

A prepare step (``transcript_prepare``, when the writer has a transcript)
runs on each snapshot about to be encoded, after the fingerprint check: it
returns a repaired copy (``Prepared``) or refuses it (``Failed``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._text import describe_error
from .._values import Failed, Prepared, Snapshot

__all__ = ["Prepare", "run_prepare"]

Prepare = Callable[[Any], Prepared | Failed]
"""``(Snapshot) -> Prepared | Failed``."""


def run_prepare(prepare: Prepare | None, snapshot: Snapshot) -> Prepared | Failed:
    """Run ``prepare`` on ``snapshot``; an exception or a bad return is ``Failed``.

    Also refuses, before anything is encoded, a ``parent`` that not every
    store can keep, so a session written to one store can move to any other.
    """
    prepared: object = Prepared(snapshot=snapshot)
    if prepare is not None:
        try:
            prepared = prepare(snapshot)
        except Exception as exc:
            return Failed("snapshot-failed", f"prepare() raised {describe_error(exc)}")
    if isinstance(prepared, Failed):
        return prepared
    if not isinstance(prepared, Prepared):
        return Failed(
            "snapshot-failed",
            f"prepare() returned {type(prepared).__name__}, expected Prepared(...) or Failed(...)",
        )
    parent = prepared.snapshot.parent
    if parent is None:
        return prepared
    if not isinstance(parent, str):
        why = f"is of type {type(parent).__name__}; give the parent session's key (a str) or None"
    elif "\x00" in parent:
        why = (
            f"contains a NUL character ('\\x00') at index {parent.index(chr(0))}, which "
            "PostgreSQL cannot store (so no store takes it); remove it"
        )
    else:
        try:
            parent.encode("utf-8")
            return prepared
        except UnicodeEncodeError as exc:
            why = (
                f"contains a lone surrogate ({parent[exc.start]!r}) at index {exc.start}, which "
                "is not valid Unicode and cannot be encoded as UTF-8 (so no store takes it); "
                "decode the name with errors='replace', or give another key"
            )
    return Failed("snapshot-failed", f"Snapshot.parent of key {snapshot.key!r} {why}")
