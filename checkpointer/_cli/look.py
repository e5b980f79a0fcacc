"""What the commands say about one checkpoint of a root: its ``Row``.

``inspect`` fills the row ``ls`` prints (and ``ls --json`` encodes) from
the root's answers; ``show`` and ``prune`` use the same row.  ``read``
turns a root's refusal to load a checkpoint into the reason printed.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, NamedTuple

import msgspec

from checkpointer import CheckpointError

from . import report
from .roots import EPOCH, Entry, Loaded, LockView, Root, why

__all__ = ["Look", "Row", "inspect", "messages", "read"]


class Row(msgspec.Struct, kw_only=True):
    """One line of ``ls``: a checkpoint and what it says (``--json`` too)."""

    key: str
    kind: str
    path: str
    size: int
    mtime: datetime
    updated_at: datetime | None = None
    created_at: datetime | None = None
    seq: int | None = None
    turns: int | None = None
    messages: int | None = None
    live: bool | None = None
    pinned: bool | None = None
    lock: Literal["alive", "stale", "unknown"] | None = None
    lock_holder: str | None = None
    title: str = ""
    error: str | None = None


class Look(NamedTuple):
    """A checkpoint looked at: its row, what it holds (None: unreadable), its lock."""

    row: Row
    loaded: Loaded | None
    lock: LockView | None


def read(root: Root, entry: Entry) -> tuple[Loaded | None, str | None]:
    """Load an entry: (what it holds, None) or (None, why it cannot be trusted)."""
    try:
        loaded = root.load(entry)
    except CheckpointError as exc:
        return None, exc.reason
    except OSError as exc:  # a directory in place of the file, no permission, ...
        return None, f"cannot be read: {why(exc)}"
    if loaded is None:
        return None, "disappeared while reading (removed by a prune or a writer?)"
    return loaded, None


def inspect(root: Root, entry: Entry, *, lock: bool = True) -> Look:
    """Everything ``ls`` says about an entry (its lock too, unless ``lock`` is False)."""
    row = Row(key=entry.key, kind=entry.kind, path=entry.path, size=0, mtime=EPOCH)
    view = root.lock(entry.key) if lock else None
    if view is not None:
        row.lock, row.lock_holder = view.state, view.holder
    try:
        row.size, mtime = root.measure(entry)
    except CheckpointError as exc:  # a damaged journal row, reported as a file is
        row.error = exc.reason
        return Look(row, None, view)
    except OSError as exc:
        row.error = f"cannot be read: {why(exc)}"
        return Look(row, None, view)
    if mtime is not None:
        row.mtime = mtime
    loaded, row.error = read(root, entry)
    if loaded is None:
        return Look(row, None, view)
    meta = loaded.meta
    history = messages(loaded.state)
    row.updated_at = report.utc(meta.updated_at)
    row.created_at = report.utc(meta.created_at)
    if mtime is None:  # a row's only time is its meta's
        row.mtime = row.updated_at
    row.seq = meta.seq
    row.live = meta.live
    row.pinned = meta.pinned
    row.turns = _turns(meta, history)
    row.messages = None if history is None else len(history)
    row.title = _title(history)
    return Look(row, loaded, view)


def messages(state: Any) -> list[Any] | None:
    """The agent history in a state (``state["messages"]``), if it has one."""
    if isinstance(state, dict):
        history = state.get("messages")
        return history if isinstance(history, list) else None
    return None


def _title(history: list[Any] | None) -> str:
    for message in history or ():
        if isinstance(message, dict) and message.get("role") == "user":
            return report.one_line(report.text(message.get("content")), 48)
    return ""


def _turns(meta: Any, history: list[Any] | None) -> int | None:
    turns = getattr(meta, "turns", None)
    if isinstance(turns, int):
        return turns
    if history is None:
        return None
    return sum(1 for m in history if isinstance(m, dict) and m.get("role") == "assistant")
