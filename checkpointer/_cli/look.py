"""What the commands say about one checkpoint of a root: its ``Row`` (``inspect``, the
row ``ls`` prints), and its agent history (``history``, in the layouts the adapters store).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal, NamedTuple, TypeVar

import msgspec

from checkpointer import Checkpoint, CheckpointError
from checkpointer.messages import count_turns

from . import report
from .roots import (
    EPOCH,
    Entry,
    LockView,
    Root,
    assemble,
    decode_state,
    detect,
    why,
)

T = TypeVar("T")


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
    summary: str | None = None  # its key's summary checkpoint (sessions/<key>/checkpoint.md)
    summary_at: datetime | None = None  # when that was written (its file's time if unreadable)


class Look(NamedTuple):
    row: Row
    loaded: Checkpoint[Any] | None  # None: unreadable
    lock: LockView | None
    history: History | None = None


class Loaded(NamedTuple):
    checkpoint: Checkpoint[Any]
    field: str | None  # the transcript field its journal recorded (a snapshot records none)


def load(root: Root, entry: Entry) -> Loaded | None:
    """``entry``'s checkpoint and the field its transcript is in, from one read: a journal's
    bytes are scanned once for both (its last compaction names the field)."""
    if entry.kind != "journal":
        checkpoint = root.load(entry)
        return None if checkpoint is None else Loaded(checkpoint, None)
    scan = root.journal(entry)
    if scan is None:
        return None
    state = decode_state(assemble(scan, entry.path), entry.path)
    return Loaded(
        Checkpoint(meta=scan.meta, state=state, torn=scan.torn), scan.compaction.transcript
    )


def read(root: Root, get: Callable[[Entry], T | None], entry: Entry) -> tuple[T | None, str | None]:
    """``get(entry)``: (what it gives, None), or (None, why it cannot be trusted)."""
    try:
        found = get(entry)
    except root.failure:  # the root itself failed (a server gone): it ends the command
        raise
    except CheckpointError as exc:  # a damaged file or journal row
        return None, exc.reason
    except OSError as exc:  # a directory in place of the file, no permission, ...
        return None, f"cannot be read: {why(exc)}"
    if found is None:
        return None, "disappeared while reading (removed by a prune or a writer?)"
    return found, None


def inspect(root: Root, entry: Entry, *, lock: bool = True) -> Look:
    """Everything ``ls`` says about an entry (its lock too, unless ``lock`` is False)."""
    row = Row(key=entry.key, kind=entry.kind, path=entry.path, size=0, mtime=EPOCH)
    view = root.lock(entry.key) if lock else None
    if view is not None:
        row.lock, row.lock_holder = view.state, view.holder
    measured, row.error = read(root, root.measure, entry)
    if measured is None:
        return Look(row, None, view)
    row.size, mtime = measured
    row.mtime = mtime or row.mtime
    got, row.error = read(root, lambda e: load(root, e), entry)
    loaded = None if got is None else got.checkpoint
    meta = loaded.meta if loaded is not None else root.sealed_metas.get(entry.path)
    if meta is not None:  # an encrypted one's too: its meta is readable
        row.updated_at, row.created_at = report.utc(meta.updated_at), report.utc(meta.created_at)
        row.mtime = mtime or row.updated_at  # a row's only time is its meta's
        row.seq, row.live, row.pinned, row.turns = meta.seq, meta.live, meta.pinned, meta.turns
    if got is None or loaded is None:
        return Look(row, None, view)
    found = transcript(loaded.state, got.field)
    listed = None if found is None else found.messages
    if row.turns is None and listed is not None:  # None again: a shape no dialect knows
        row.turns = count_turns(listed)
    row.messages = None if listed is None else len(listed)
    row.title = _title(listed)
    return Look(row, loaded, view, found)


class History(NamedTuple):
    """An agent history: its messages (None: unreadable, ``note`` says why), their JSON paths."""

    messages: list[Any] | None
    at: Callable[[int], str]
    note: str | None = None


_LANGGRAPH_ROWS = frozenset({"checkpoint", "blob", "tail", "write"})


def transcript(state: Any, field: str | None) -> History | None:
    """The agent history of a checkpoint: in the ``field`` its journal recorded; else in
    ``messages``; else in the one list of the state whose first item a dialect knows (of
    several, none is guessed: the note names them)."""
    if field is not None or not isinstance(state, dict) or "messages" in state:
        return history(state, field or "messages")
    lists = [k for k, v in state.items() if isinstance(v, list) and v and detect(v[0])]
    if len(lists) > 1:
        names = ", ".join(map(repr, lists))
        why = (
            f"the lists {names} all hold messages: which is the history is not recorded "
            "(a snapshot names no transcript field); none checked"
        )
        return History(None, "$.state[{}]".format, why)
    return history(state, lists[0]) if lists else None


def history(state: Any, field: str = "messages") -> History | None:
    """The agent history in ``state[field]`` (or a pydantic-ai conversation's chain of
    entries; a LangGraph thread log's serde bytes are not checked); None without one."""
    if not isinstance(state, dict) or field not in state:
        return None
    at = f"$.state.{field}" if field.isidentifier() else f"$.state[{field!r}]"
    _plain = f"{at}[{{}}]".format  # the JSON path of message i
    listed = state[field]
    if not isinstance(listed, list):
        why = f"{at} is {report.json_type(listed)}, not a list of messages: not checked"
        return History(None, _plain, why)
    first = listed[0] if listed else None
    if isinstance(first, dict) and first.get("row") in _LANGGRAPH_ROWS and "thread_id" in state:
        return History(
            None,
            _plain,
            f"a LangGraph thread log ({len(listed)} rows): its channel values are LangGraph's "
            "serde bytes, which only LangGraph decodes; messages not checked",
        )
    record = state.get("record")
    entries = isinstance(first, dict) and "parent_id" in first and "message" in first
    if isinstance(record, dict) and "head_id" in record and entries:
        return _conversation(listed, record.get("head_id"), at)
    return History(listed, _plain)


def _conversation(entries: list[Any], head: Any, at: str) -> History:
    """A pydantic-ai conversation: the messages of the entries chained up to ``head``."""
    where: dict[Any, tuple[int, Any]] = {}
    for k, entry in enumerate(entries):
        if isinstance(entry, dict) and isinstance(entry.get("id"), str):
            where[entry["id"]] = (k, entry.get("parent_id"))
    chain: list[int] = []
    cursor = head
    while cursor is not None:
        found = where.get(cursor) if isinstance(cursor, str) else None
        if found is None or len(chain) > len(entries):  # a missing entry, a loop
            why = (
                f"a pydantic-ai conversation whose entries do not chain from its head_id "
                f"{head!r} (at {cursor!r}): not checked"
            )
            return History(None, f"{at}[{{}}]".format, why)
        chain.append(found[0])
        cursor = found[1]
    chain.reverse()
    return History([entries[k]["message"] for k in chain], lambda i: f"{at}[{chain[i]}].message")


def _title(listed: list[Any] | None) -> str:
    for message in listed or ():
        dialect = detect(message)
        text = None if dialect is None else dialect.user_text(message)
        if text is not None:
            return report.one_line(text, 48)
    return ""
