"""A LangGraph thread as stored: an append-only log of rows, and the indexes over it.

One row per checkpoint (without its channel values), per new channel value
(a list channel that grew as a ``Tail``: its new items only) and per pending
write.  Pruning rewrites the log, joining a tail chain it cuts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import msgspec
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    Checkpoint,
    CheckpointTuple,
    get_checkpoint_id,
    writes_sort_key,
)

Version = str | int | float
Loads = Callable[[tuple[str, bytes]], Any]
Last = dict[tuple[str, str], tuple[Version, int, bytes] | None]


class Put(msgspec.Struct, frozen=True, tag="checkpoint", tag_field="row"):
    ns: str
    id: str
    parent: str | None
    type: str
    checkpoint: bytes  # serde of the checkpoint without channel_values
    metadata_type: str
    metadata: bytes


class Blob(msgspec.Struct, frozen=True, tag="blob", tag_field="row"):
    ns: str
    channel: str
    version: Version
    type: str  # "empty": the channel had no value
    data: bytes


class Tail(msgspec.Struct, frozen=True, tag="tail", tag_field="row"):
    """A msgpack list value: ``base``'s items, then the items in ``data``; ``count`` in all."""

    ns: str
    channel: str
    version: Version
    base: Version
    count: int
    data: bytes


class Write(msgspec.Struct, frozen=True, tag="write", tag_field="row"):
    ns: str
    checkpoint: str
    task: str
    idx: int
    channel: str
    type: str
    data: bytes
    path: str


Row = Put | Blob | Tail | Write


class State(msgspec.Struct):
    """The state of a thread's key."""

    thread_id: str
    messages: list[Row]


def _split_array(data: bytes) -> tuple[int, int] | None:
    """``(count, header size)`` of a msgpack array, or None for anything else."""
    if not data:
        return None
    first = data[0]
    if 0x90 <= first <= 0x9F:
        return first & 0x0F, 1
    if first == 0xDC and len(data) >= 3:
        return int.from_bytes(data[1:3], "big"), 3
    if first == 0xDD and len(data) >= 5:
        return int.from_bytes(data[1:5], "big"), 5
    return None


def _array_header(count: int) -> bytes:
    if count < 16:
        return bytes([0x90 | count])
    if count < 1 << 16:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


def config_of(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    """The config that names a checkpoint."""
    ids = {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}
    return {"configurable": ids}


class Log:
    """A thread's rows, and the indexes over them: checkpoints, values, writes."""

    __slots__ = ("blobs", "checkpoints", "last", "rows", "writes")

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.checkpoints: dict[str, dict[str, Put]] = {}
        self.blobs: dict[tuple[str, str, Version], Blob | Tail] = {}
        self.writes: dict[tuple[str, str], dict[tuple[str, int], Write]] = {}
        # (ns, channel) -> (version, item count, items' bytes) of the last list value
        # stored, or (version, -1, b"") until it is needed (after a load).
        self.last: dict[tuple[str, str], tuple[Version, int, bytes]] = {}

    def add(self, row: Row) -> None:
        self.rows.append(row)
        if isinstance(row, Put):
            self.checkpoints.setdefault(row.ns, {})[row.id] = row
        elif isinstance(row, Write):
            self.writes.setdefault((row.ns, row.checkpoint), {})[(row.task, row.idx)] = row
        else:
            self.blobs[(row.ns, row.channel, row.version)] = row
            self.last[(row.ns, row.channel)] = (row.version, -1, b"")

    def reset(self, rows: list[Row]) -> None:
        self.rows = []
        self.checkpoints, self.blobs, self.writes, self.last = {}, {}, {}, {}
        for row in rows:
            self.add(row)

    def extend(self, rows: list[Row], last: Last) -> None:
        """Add ``rows``, and the last list values they store (``value_row``'s)."""
        for row in rows:
            self.add(row)
        for where, entry in last.items():  # after add(), which marks them unknown
            if entry is None:
                self.last.pop(where, None)
            else:
                self.last[where] = entry

    def blob_bytes(self, ns: str, channel: str, version: Version) -> tuple[str, bytes] | None:
        """The serialized value of a channel version, a tail chain joined up."""
        row = self.blobs.get((ns, channel, version))
        if row is None:
            return None
        if isinstance(row, Blob):
            return row.type, row.data
        tails: list[bytes] = []
        count = row.count
        cursor: Blob | Tail | None = row
        while isinstance(cursor, Tail):
            tails.append(cursor.data)
            cursor = self.blobs.get((ns, channel, cursor.base))
        if cursor is None or cursor.type != "msgpack":
            return None  # the chain is cut: treated as no value (never written so)
        split = _split_array(cursor.data)
        if split is None:
            return None
        tails.append(cursor.data[split[1] :])
        tails.reverse()
        return "msgpack", b"".join([_array_header(count), *tails])

    def value_rows(
        self, ns: str, typed: Mapping[str, tuple[str, bytes]], versions: Mapping[str, Version]
    ) -> tuple[list[Row], Last]:
        """The rows of the channel ``versions`` (their values serialized: ``typed``), and the
        list values they store.  A full value, or a tail when it extends the channel's last
        list value.
        """
        rows: list[Row] = []
        last: Last = {}
        for channel, version in versions.items():
            last[(ns, channel)] = None
            if channel not in typed:
                rows.append(Blob(ns, channel, version, "empty", b""))
                continue
            kind, data = typed[channel]
            split = _split_array(data) if kind == "msgpack" else None
            tail = self._tail(ns, channel, version, data, split)
            rows.append(tail or Blob(ns, channel, version, kind, data))
            if split is not None:
                last[(ns, channel)] = (version, split[0], data[split[1] :])
        return rows, last

    def _tail(
        self, ns: str, channel: str, version: Version, data: bytes, split: tuple[int, int] | None
    ) -> Tail | None:
        last = self.last.get((ns, channel))
        if split is None or last is None:
            return None
        base, count, items = last
        if count < 0:  # loaded: join the last value up once
            typed = self.blob_bytes(ns, channel, base)
            previous = None if typed is None else _split_array(typed[1])
            if typed is None or previous is None:
                return None
            count, items = previous[0], typed[1][previous[1] :]
        total, header = split
        if count == 0 or total < count or not data.startswith(items, header):
            return None
        return Tail(ns, channel, version, base, total, data[header + len(items) :])

    def checkpoint_tuple(self, thread_id: str, ns: str, row: Put, loads: Loads) -> CheckpointTuple:
        """The checkpoint of ``row``, its channel values and pending writes decoded."""
        checkpoint: Checkpoint = loads((row.type, row.checkpoint))
        values: dict[str, Any] = {}
        for channel, version in checkpoint["channel_versions"].items():
            blob = self.blobs.get((ns, channel, version))
            if blob is None or (isinstance(blob, Blob) and blob.type == "empty"):
                continue
            typed = self.blob_bytes(ns, channel, version)
            if typed is not None:
                values[channel] = loads(typed)
        stored = self.writes.get((ns, row.id), {})
        ordered = sorted(stored.values(), key=lambda w: writes_sort_key(w.path, w.task, w.idx))
        return CheckpointTuple(
            config=config_of(thread_id, ns, row.id),
            checkpoint={**checkpoint, "channel_values": values},
            metadata=loads((row.metadata_type, row.metadata)),
            parent_config=config_of(thread_id, ns, row.parent) if row.parent else None,
            pending_writes=[(w.task, w.channel, loads((w.type, w.data))) for w in ordered],
        )

    def listed(
        self,
        config: RunnableConfig | None,
        filter: Mapping[str, Any] | None,
        before: RunnableConfig | None,
        loads: Loads,
    ) -> Iterator[tuple[str, Put]]:
        """``(ns, row)`` of the checkpoints ``list`` gives, newest first."""
        wanted_ns = config["configurable"].get("checkpoint_ns") if config else None
        wanted_id = get_checkpoint_id(config) if config else None
        before_id = get_checkpoint_id(before) if before else None
        for ns, checkpoints in self.checkpoints.items():
            if wanted_ns is not None and ns != wanted_ns:
                continue
            for checkpoint_id in sorted(checkpoints, reverse=True):
                if (wanted_id and checkpoint_id != wanted_id) or (
                    before_id and checkpoint_id >= before_id
                ):
                    continue
                row = checkpoints[checkpoint_id]
                if filter:
                    metadata = loads((row.metadata_type, row.metadata))
                    if not all(metadata.get(k) == v for k, v in filter.items()):
                        continue
                yield ns, row

    def latest(self) -> set[tuple[str, str]]:
        """``(ns, id)`` of each namespace's latest checkpoint."""
        return {(ns, max(c)) for ns, c in self.checkpoints.items() if c}

    def without_runs(self, run_ids: set[str], loads: Loads) -> set[tuple[str, str]]:
        """``(ns, id)`` of the checkpoints whose metadata's ``run_id`` is not in ``run_ids``."""
        return {
            (ns, checkpoint_id)
            for ns, checkpoints in self.checkpoints.items()
            for checkpoint_id, row in checkpoints.items()
            if loads((row.metadata_type, row.metadata)).get("run_id") not in run_ids
        }

    def kept(self, kept: set[tuple[str, str]], loads: Loads) -> list[Row] | None:
        """The log with only the checkpoints ``kept``, their values and writes; None if all are."""
        if sum(len(c) for c in self.checkpoints.values()) == len(kept):
            return None
        needed: set[tuple[str, str, Version]] = set()
        for ns, checkpoint_id in kept:
            put = self.checkpoints[ns][checkpoint_id]
            versions = loads((put.type, put.checkpoint))["channel_versions"]
            needed.update((ns, channel, version) for channel, version in versions.items())
        rows: list[Row] = []
        values: set[tuple[str, str, Version]] = set()  # kept so far (a tail's base comes first)
        for row in self.rows:
            if isinstance(row, Put | Write):
                checkpoint_id = row.id if isinstance(row, Put) else row.checkpoint
                if (row.ns, checkpoint_id) in kept:
                    rows.append(row)
            elif (row.ns, row.channel, row.version) in needed:
                if isinstance(row, Tail) and (row.ns, row.channel, row.base) not in values:
                    typed = self.blob_bytes(row.ns, row.channel, row.version)
                    assert typed is not None
                    row = Blob(row.ns, row.channel, row.version, *typed)
                rows.append(row)
                values.add((row.ns, row.channel, row.version))
        return rows
