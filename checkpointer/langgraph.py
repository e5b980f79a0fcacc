"""LangGraph's ``BaseCheckpointSaver``, kept by checkpointer.

``CheckpointSaver(store)`` is a LangGraph checkpointer over checkpointer's
public API, with the sync and async methods (``delete_for_runs``,
``copy_thread`` and ``prune`` included)::

    async with CheckpointSaver(JournalStore("threads")) as saver:
        graph = builder.compile(checkpointer=saver)
        await graph.ainvoke(inputs, {"configurable": {"thread_id": "t1"}})

A thread is one key (``thread_key(thread_id)``) holding an append-only log
of rows: one per checkpoint, per new channel value (a list channel that grew
as its new items only) and per pending write.  In an async saver a thread's
``CheckpointWriter`` writes ``"async"`` puts at its timing and durable ones
at once; a synchronous saver commits every put through the thread's
``KeyCommitter``.  Durability, conflicts and what SIGTERM keeps:
docs/frameworks/langgraph.md.  asyncio and sync, as LangGraph's API.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from types import TracebackType
from typing import Any, Literal

import anyio
import anyio.abc
import anyio.to_thread
import msgspec
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from checkpointer import Checkpoint as Loaded
from checkpointer import (
    CheckpointFailed,
    CheckpointWriter,
    Failed,
    KeyCommitter,
    Meta,
    Result,
    Snapshot,
    load,
)
from checkpointer._adapters import (
    check_options,
    committer_options,
    framework_key,
    lock_timeout,
    locked,
    probe_lock,
    store_keys,
)
from checkpointer.stores import KeyLocked, Store

__all__ = ["CheckpointFailed", "CheckpointSaver", "thread_key"]

_PLAIN, _HASHED = "lg-", "lg."
_DURABLE = ("sync", "exit")

Version = str | int | float


def thread_key(thread_id: str) -> str:
    """The checkpoint key of a thread: ``lg-<id>``, or ``lg.<sha256 prefix>`` for other ids."""
    return framework_key(thread_id, plain=_PLAIN, hashed=_HASHED)


# -- the rows of a thread's log ------------------------------------------------


class _Put(msgspec.Struct, frozen=True, tag="checkpoint", tag_field="row"):
    ns: str
    id: str
    parent: str | None
    type: str
    checkpoint: bytes  # serde of the checkpoint without channel_values
    metadata_type: str
    metadata: bytes


class _Blob(msgspec.Struct, frozen=True, tag="blob", tag_field="row"):
    ns: str
    channel: str
    version: Version
    type: str  # "empty": the channel had no value
    data: bytes


class _Tail(msgspec.Struct, frozen=True, tag="tail", tag_field="row"):
    """A msgpack list value: ``base``'s items, then the items in ``data``; ``count`` in all."""

    ns: str
    channel: str
    version: Version
    base: Version
    count: int
    data: bytes


class _Write(msgspec.Struct, frozen=True, tag="write", tag_field="row"):
    ns: str
    checkpoint: str
    task: str
    idx: int
    channel: str
    type: str
    data: bytes
    path: str


_Row = _Put | _Blob | _Tail | _Write


class _State(msgspec.Struct):
    thread_id: str
    messages: list[_Row]


# -- msgpack arrays: the header, and the items' bytes after it ------------------


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


class _Thread:
    """One thread in memory: its log and the indexes over it."""

    __slots__ = (
        "base",
        "blobs",
        "checkpoints",
        "committer",
        "held",
        "key",
        "last",
        "opening",
        "refusal",
        "result",
        "rows",
        "thread_id",
        "writer",
        "writes",
    )

    def __init__(self, thread_id: str, key: str) -> None:
        self.thread_id = thread_id
        self.key = key
        self.rows: list[_Row] = []
        self.checkpoints: dict[str, dict[str, _Put]] = {}
        self.blobs: dict[tuple[str, str, Version], _Blob | _Tail] = {}
        self.writes: dict[tuple[str, str], dict[tuple[str, int], _Write]] = {}
        # (ns, channel) -> (version, item count, items' bytes) of the last list value
        # stored, or (version, -1, b"") until it is needed (after a load).
        self.last: dict[tuple[str, str], tuple[Version, int, bytes]] = {}
        # Who writes the thread: in an async saver a writer (its timer for
        # "async" puts) in the saver's task, else a committer (every put at once).
        self.writer: CheckpointWriter[Snapshot] | None = None
        self.committer: KeyCommitter | None = None
        # Ownership: ``base`` is the stored checkpoint the rows were read from
        # (None: there was none), what the thread's writer expects to replace.
        # ``held``: this saver changed the rows since (its writer writes them),
        # so they are never read again.  ``refusal``: the store refused this
        # saver's write (another writer's, or deleted): the rows were dropped,
        # and a put raises it until the thread is read again.
        self.base: Meta | None = None
        self.held = False
        self.refusal: Failed | None = None
        self.result: Result | None = None  # the final write's, or its opening's failure
        self.opening: anyio.Event | None = None  # set once its writer opened in the saver's task

    def apply(self, row: _Row) -> None:
        if isinstance(row, _Put):
            self.checkpoints.setdefault(row.ns, {})[row.id] = row
        elif isinstance(row, _Write):
            self.writes.setdefault((row.ns, row.checkpoint), {})[(row.task, row.idx)] = row
        else:
            self.blobs[(row.ns, row.channel, row.version)] = row
            self.last[(row.ns, row.channel)] = (row.version, -1, b"")

    def add(self, row: _Row) -> None:
        self.rows.append(row)
        self.apply(row)

    def reset(self, rows: list[_Row]) -> None:
        self.rows = []
        self.checkpoints, self.blobs, self.writes, self.last = {}, {}, {}, {}
        for row in rows:
            self.add(row)

    def read(self, checkpoint: Loaded[_State] | None) -> None:
        """Take what the store holds (``load``'s answer) as the thread, unless it is held."""
        if not self.held:
            self.base = None if checkpoint is None else checkpoint.meta
            self.refusal = None
            self.reset([] if checkpoint is None else checkpoint.state.messages)

    def blob_bytes(self, ns: str, channel: str, version: Version) -> tuple[str, bytes] | None:
        """The serialized value of a channel version, a tail chain joined up."""
        row = self.blobs.get((ns, channel, version))
        if row is None:
            return None
        if isinstance(row, _Blob):
            return row.type, row.data
        tails: list[bytes] = []
        count = row.count
        cursor: _Blob | _Tail | None = row
        while isinstance(cursor, _Tail):
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


class CheckpointSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer whose threads are checkpointed by ``CheckpointWriter`` s.

    Args:
        store: where the threads go; a ``JournalStore(root)`` makes each
            checkpoint cost its new rows only.
        serde: LangGraph's serializer (default: its ``JsonPlusSerializer``).
        **writer_options: passed to each thread's ``CheckpointWriter``
            (``debounce``, ``max_wait``, ``limits``, ``exit_hooks``...);
            ``limits``, ``transcript`` and ``state_version`` to its
            ``KeyCommitter`` too.

    Use it as ``with`` (synchronous graphs) or ``async with`` (asyncio).
    """

    def __init__(
        self, store: Store, *, serde: SerializerProtocol | None = None, **writer_options: Any
    ) -> None:
        super().__init__(serde=serde)
        self.store = store
        self._options = check_options("CheckpointSaver", writer_options)
        self._lock = threading.RLock()
        self._threads: dict[str, _Thread] = {}
        self._mode: Literal["new", "sync", "async", "closed"] = "new"
        self._task_group: anyio.abc.TaskGroup | None = None
        self._opening: anyio.Lock | None = None
        self._unraised: list[Failed] = []  # refusals found by a read: raised at close

    def __repr__(self) -> str:
        return f"<CheckpointSaver {self._mode} store={self.store!r} threads={len(self._threads)}>"

    # -- lifecycle ------------------------------------------------------------

    def __enter__(self) -> CheckpointSaver:
        self._claim("sync")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        failed = self._close_all()
        if failed is not None and exc is None:
            raise CheckpointFailed(failed)

    def close(self) -> None:
        """Close every thread's writer (a final write each); for ``with``.

        Raises:
            CheckpointFailed: a thread's final write failed (``"conflict"``:
                another process wrote the thread; the error names the key).
        """
        failed = self._close_all()
        if failed is not None:
            raise CheckpointFailed(failed)

    def _close_all(self) -> Failed | None:
        with self._lock:
            threads = list(self._threads.values())
        for thread in threads:
            if thread.writer is not None:
                thread.result = thread.writer.close()
            self._end_committer(thread)
        self._mode = "closed"
        return self._failures(threads)

    async def __aenter__(self) -> CheckpointSaver:
        self._claim("async")
        self._opening = anyio.Lock()
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with self._lock:
            threads = list(self._threads.values())
        async with anyio.create_task_group() as closing:  # their final writes at once
            for thread in threads:
                closing.start_soon(self._close_writer, thread)
        task_group, self._task_group = self._task_group, None
        if task_group is not None:
            await task_group.__aexit__(None, None, None)
        self._mode = "closed"
        failed = self._failures(threads)
        if failed is not None and exc is None:
            raise CheckpointFailed(failed)

    def _failures(self, threads: Sequence[_Thread]) -> Failed | None:
        """What the close raises: the failed final writes of ``threads`` and the refusals no
        put raised, as one ``Failed`` (the first reason), or None."""
        failed = [*self._unraised, *(t.result for t in threads if isinstance(t.result, Failed))]
        if not failed:
            return None
        return Failed(failed[0].reason, "; ".join(f.error for f in failed))

    def _claim(self, mode: Literal["sync", "async"]) -> None:
        if self._mode != "new":
            raise RuntimeError(f"this CheckpointSaver is {self._mode}; create a new one")
        self._mode = mode

    def _check_open(self) -> None:
        if self._mode in ("new", "closed"):
            raise RuntimeError(
                f"this CheckpointSaver is {self._mode}: use it inside 'with' or 'async with'"
            )

    # -- threads in memory ----------------------------------------------------

    def _thread(self, thread_id: str, *, look: bool = True) -> _Thread:
        """The thread (blocking): read from the store at first use, and at each ``look``.

        A thread this saver does not hold may have been written or deleted
        by another process since it was read: ``look`` compares the revision
        stored (a read of its meta) and reads the thread again only if it
        changed.  A put does not look: it changes the thread as LangGraph
        last read it, and its writer expects that revision (a write of
        another process meanwhile is then a conflict, not replaced).
        """
        with self._lock:
            thread = self._threads.get(thread_id)
        key = thread_key(thread_id)
        if thread is not None:
            if thread.held or not look:
                return thread
            base = None if thread.base is None else thread.base.revision
            if thread.refusal is None and self.store.revision(key) == base:
                return thread
        return self._install(thread_id, load(self.store, key, _State))

    def _install(self, thread_id: str, checkpoint: Loaded[_State] | None) -> _Thread:
        with self._lock:
            thread = self._threads.get(thread_id)
            if thread is None:
                thread = self._threads[thread_id] = _Thread(thread_id, thread_key(thread_id))
            thread.read(checkpoint)
            return thread

    async def _athread(self, thread_id: str, *, look: bool = True) -> _Thread:
        with self._lock:
            thread = self._threads.get(thread_id)
        if thread is not None and (thread.held or not look):
            return thread
        return await anyio.to_thread.run_sync(lambda: self._thread(thread_id, look=look))

    def _all_threads(self) -> list[_Thread]:
        """Every thread of the store and of this saver, each looked at (blocking)."""
        with self._lock:
            ids = {t.key: t.thread_id for t in self._threads.values()}
        for key in store_keys(self.store):
            if key.startswith((_PLAIN, _HASHED)) and key not in ids:
                checkpoint = load(self.store, key, _State)  # a digest key names no thread
                if checkpoint is not None:
                    ids[key] = self._install(checkpoint.state.thread_id, checkpoint).thread_id
        return [self._thread(thread_id) for thread_id in ids.values()]

    def _hold(self, thread: _Thread) -> None:
        """This saver changes the thread (under ``self._lock``): it holds it from now on.

        Raises:
            CheckpointFailed: the store refused a write of this saver's since
                the thread was last read (``"conflict"``), or another writer
                held it (``"locked"``).
        """
        refusal = thread.refusal
        if refusal is not None:
            self._unraised = [f for f in self._unraised if f is not refusal]
            raise CheckpointFailed(refusal)
        thread.held = True

    def _state(self, thread: _Thread) -> dict[str, Any] | None:
        with self._lock:
            if not thread.held:
                return None  # deleted, or refused: nothing of this saver's to write
            return {"thread_id": thread.thread_id, "messages": list(thread.rows)}

    def _source(self, thread: _Thread) -> Snapshot | None:
        state = self._state(thread)
        return None if state is None else Snapshot(thread.key, state)

    def _refuse(self, thread: _Thread, failed: Failed, *, raised: bool) -> None:
        """The store refused the thread's write: its rows go (its writer is closed after).

        Another writer wrote the thread, or deleted it, after this saver read
        it: that work stays, and what this saver had not written of the
        thread is dropped.  The next read shows what the store holds; until
        then a put raises the refusal, and the saver's close raises it if
        nothing did (``raised``).
        """
        with self._lock:
            thread.held, thread.refusal = False, failed
            thread.reset([])
            if not raised:
                self._unraised.append(failed)

    def _refused_sync(self, thread: _Thread, failed: Failed) -> CheckpointFailed:
        # A writer of the saver's task (a sync method of an async saver) stays:
        # it writes nothing from now on and closes with the saver.
        self._refuse(thread, failed, raised=True)
        self._end_committer(thread)  # not held: no final commit, the key let go
        return CheckpointFailed(failed)

    def _end_committer(self, thread: _Thread) -> None:
        """Commit the thread's rows a final time (not live) if it holds them; let the key go."""
        with self._lock:
            committer, thread.committer = thread.committer, None
        if committer is not None:
            state = self._state(thread)
            if state is not None:
                thread.result = committer.commit(state, live=False)
            committer.close()

    async def _refused(self, thread: _Thread, failed: Failed, *, raised: bool) -> CheckpointFailed:
        # Under the opening lock: a new writer of the thread opens once this one let go.
        async with self._opening or contextlib.nullcontext():
            with self._lock:
                self._refuse(thread, failed, raised=raised)
                writer, thread.writer = thread.writer, None
            if writer is not None:
                await writer.aclose()  # not held: no final write, the key let go
        return CheckpointFailed(failed)

    async def _settle(self, thread_id: str, *, wait: bool) -> None:
        """Let go of the thread if its writer met a conflict in the saver's task.

        With ``wait``, a writer still opening is waited for (its first write
        tells); a put does not wait for it, the put after it finds out.
        """
        with self._lock:
            thread = self._threads.get(thread_id)
        if thread is None:
            return
        if wait and thread.opening is not None:
            await thread.opening.wait()
        writer = thread.writer
        if writer is not None and thread.held:
            last = writer.statistics().last_result
            if isinstance(last, Failed) and last.reason == "conflict":
                await self._refused(thread, last, raised=False)

    def _check_unlocked(self, thread: _Thread) -> None:
        """Raise ``CheckpointFailed`` if another writer holds the thread's key (blocking).

        A probe, before the thread's writer opens (it takes the lock at its
        first write, in the background): LangGraph raises it from ``ainvoke``.
        What this saver changed of the thread is refused: the holder's work stands.
        """
        way_out = f"or run thread {thread.thread_id!r} under another thread_id"
        try:
            probe_lock(self.store, thread.key, lock_timeout(self._options), way_out)
        except CheckpointFailed as exc:
            self._refuse(thread, exc.result, raised=True)
            raise

    def _committer(self, thread: _Thread) -> KeyCommitter:
        with self._lock:
            if thread.committer is None:
                thread.committer = KeyCommitter(
                    self.store,
                    thread.key,
                    resume_from=thread.base,  # None: absent when read, fenced too
                    **committer_options(self._options),
                )
            return thread.committer

    async def _async_writer(self, thread: _Thread) -> CheckpointWriter[Snapshot]:
        if thread.writer is not None:
            return thread.writer
        assert self._opening is not None
        async with self._opening:  # LangGraph runs aput and aput_writes concurrently
            if thread.writer is None:
                await anyio.to_thread.run_sync(self._check_unlocked, thread)
                writer: CheckpointWriter[Snapshot] = CheckpointWriter(
                    lambda: self._source(thread),
                    self.store,
                    resume_from=thread.base,  # None: absent when read, fenced too
                    **self._options,
                )
                thread.writer = await writer.aopen()  # only once it is open
            return thread.writer

    def _changed(self, thread: _Thread, durability: str | None) -> None:
        """After a change on a sync method: notify the thread's timed writer, or write now.

        A thread with no writer is committed at once, whatever the durability
        (no timer would write it later): a refusal (``"locked"`` too) raises.
        """
        writer = thread.writer
        if writer is not None and durability not in _DURABLE:
            writer.notify()
            return
        if writer is not None:
            result = writer.flush_sync()
            refused = _refusal(result, durability)
        else:
            state = self._state(thread)
            if state is None:
                return  # deleted or refused meanwhile: nothing of this saver's to write
            result = self._committer(thread).commit(state)
            refused = _refusal(result, "sync")
        if isinstance(result, Failed) and refused:
            raise self._refused_sync(thread, result)
        if isinstance(result, Failed) and durability in _DURABLE:
            raise CheckpointFailed(result)

    async def _achanged(self, thread: _Thread, durability: str | None) -> None:
        if self._mode == "sync" or thread.committer is not None:
            # No timer runs for this thread: commit in a worker thread.
            await anyio.to_thread.run_sync(self._changed, thread, durability)
            return
        if durability not in _DURABLE:
            if thread.writer is not None:
                thread.writer.notify()
            elif thread.opening is None:
                # Opened in the saver's task, not here: LangGraph's next put
                # waits for this one, and its nodes run on meanwhile, changing
                # the values the next put is handed (see aput).
                thread.opening = anyio.Event()
                assert self._task_group is not None
                self._task_group.start_soon(self._open_then_notify, thread)
            return
        writer = await self._async_writer(thread)
        result = await writer.write_now()
        if isinstance(result, Failed) and _refusal(result, durability):
            raise await self._refused(thread, result, raised=True)
        if isinstance(result, Failed):
            raise CheckpointFailed(result)

    async def _open_then_notify(self, thread: _Thread) -> None:
        """Open the thread's writer, then notify it; a failure is raised by the next put."""
        try:
            writer = await self._async_writer(thread)
        except CheckpointFailed as exc:
            thread.result = exc.result
        except Exception as exc:
            error = f"cannot open the writer of {thread.key!r}: {type(exc).__name__}: {exc}"
            thread.result = Failed("write-failed", error)
        else:
            writer.notify()
        finally:
            opening, thread.opening = thread.opening, None
            if opening is not None:
                opening.set()

    @staticmethod
    def _raise_failed_open(thread: _Thread) -> None:
        """Raise the failure of the thread's writer opening in the background.

        It stays, so the saver's close raises it too (LangGraph may drop an
        error of a put it ran in the background).
        """
        if isinstance(thread.result, Failed) and thread.writer is None:
            raise CheckpointFailed(thread.result)

    # -- reading ----------------------------------------------------------------

    def _tuple(self, thread: _Thread, ns: str, row: _Put) -> CheckpointTuple:
        loads = self.serde.loads_typed
        checkpoint: Checkpoint = loads((row.type, row.checkpoint))
        values: dict[str, Any] = {}
        for channel, version in checkpoint["channel_versions"].items():
            blob = thread.blobs.get((ns, channel, version))
            if blob is None or (isinstance(blob, _Blob) and blob.type == "empty"):
                continue
            typed = thread.blob_bytes(ns, channel, version)
            if typed is not None:
                values[channel] = loads(typed)
        stored = thread.writes.get((ns, row.id), {})
        ordered = sorted(stored.values(), key=lambda w: writes_sort_key(w.path, w.task, w.idx))
        return CheckpointTuple(
            config={
                "configurable": {
                    "thread_id": thread.thread_id,
                    "checkpoint_ns": ns,
                    "checkpoint_id": row.id,
                }
            },
            checkpoint={**checkpoint, "channel_values": values},
            metadata=loads((row.metadata_type, row.metadata)),
            parent_config=(
                {
                    "configurable": {
                        "thread_id": thread.thread_id,
                        "checkpoint_ns": ns,
                        "checkpoint_id": row.parent,
                    }
                }
                if row.parent
                else None
            ),
            pending_writes=[(w.task, w.channel, loads((w.type, w.data))) for w in ordered],
        )

    def _get_tuple(self, thread: _Thread, config: RunnableConfig) -> CheckpointTuple | None:
        ns: str = config["configurable"].get("checkpoint_ns", "")
        with self._lock:
            checkpoints = thread.checkpoints.get(ns)
            if not checkpoints:
                return None
            checkpoint_id = get_checkpoint_id(config) or max(checkpoints)
            row = checkpoints.get(checkpoint_id)
            return None if row is None else self._tuple(thread, ns, row)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint of ``config`` (its ``checkpoint_id``, else the thread's latest)."""
        self._check_open()
        return self._get_tuple(self._thread(config["configurable"]["thread_id"]), config)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Async ``get_tuple``."""
        self._check_open()
        await self._settle(config["configurable"]["thread_id"], wait=True)
        # Decoding the channels builds Python objects (LangChain messages): in a
        # worker thread the loop gets the GIL back between them.
        return await anyio.to_thread.run_sync(self.get_tuple, config)

    def _list(
        self,
        threads: list[_Thread],
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> list[CheckpointTuple]:
        wanted_ns = config["configurable"].get("checkpoint_ns") if config else None
        wanted_id = get_checkpoint_id(config) if config else None
        before_id = get_checkpoint_id(before) if before else None
        found: list[CheckpointTuple] = []
        with self._lock:
            for thread in threads:
                for ns, checkpoints in thread.checkpoints.items():
                    if wanted_ns is not None and ns != wanted_ns:
                        continue
                    for checkpoint_id in sorted(checkpoints, reverse=True):
                        if wanted_id and checkpoint_id != wanted_id:
                            continue
                        if before_id and checkpoint_id >= before_id:
                            continue
                        row = checkpoints[checkpoint_id]
                        if filter:
                            metadata = self.serde.loads_typed((row.metadata_type, row.metadata))
                            if not all(metadata.get(k) == v for k, v in filter.items()):
                                continue
                        if limit is not None and len(found) >= limit:
                            return found
                        found.append(self._tuple(thread, ns, row))
        return found

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first, of ``config``'s thread (all threads for None)."""
        self._check_open()
        threads = (
            [self._thread(config["configurable"]["thread_id"])] if config else self._all_threads()
        )
        yield from self._list(threads, config, filter, before, limit)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Async ``list``."""
        self._check_open()
        with self._lock:
            ids = [config["configurable"]["thread_id"]] if config else list(self._threads)
        for thread_id in ids:
            await self._settle(thread_id, wait=True)
        if config:
            threads = [await self._athread(ids[0])]
        else:
            threads = await anyio.to_thread.run_sync(self._all_threads)
        found = await anyio.to_thread.run_sync(self._list, threads, config, filter, before, limit)
        for item in found:
            yield item

    # -- writing ----------------------------------------------------------------

    def _put(
        self,
        thread: _Thread,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        dumps = self.serde.dumps_typed
        ns: str = config["configurable"]["checkpoint_ns"]
        copied = checkpoint.copy()
        values: dict[str, Any] = copied.pop("channel_values")  # type: ignore[misc]
        rows: list[_Row] = []
        last: dict[tuple[str, str], tuple[Version, int, bytes] | None] = {}
        with self._lock:
            for channel, version in new_versions.items():
                if channel not in values:
                    rows.append(_Blob(ns, channel, version, "empty", b""))
                    last[(ns, channel)] = None
                    continue
                kind, data = dumps(values[channel])
                split = _split_array(data) if kind == "msgpack" else None
                rows.append(self._blob(thread, ns, channel, version, kind, data, split))
                last[(ns, channel)] = (
                    None if split is None else (version, split[0], data[split[1] :])
                )
            kind, data = dumps(copied)
            meta_kind, meta_data = dumps(get_checkpoint_metadata(config, metadata))
            parent = config["configurable"].get("checkpoint_id")
            rows.append(_Put(ns, checkpoint["id"], parent, kind, data, meta_kind, meta_data))
            self._hold(thread)
            for row in rows:
                thread.add(row)
            for where, entry in last.items():  # after add(), which marks them unknown
                if entry is None:
                    thread.last.pop(where, None)
                else:
                    thread.last[where] = entry
        return _stored_config(thread, config, checkpoint)

    @staticmethod
    def _blob(
        thread: _Thread,
        ns: str,
        channel: str,
        version: Version,
        kind: str,
        data: bytes,
        split: tuple[int, int] | None,
    ) -> _Blob | _Tail:
        """A full value, or a tail when it extends the channel's last list value."""
        last = thread.last.get((ns, channel))
        if split is None or last is None:
            return _Blob(ns, channel, version, kind, data)
        base, count, items = last
        if count < 0:  # loaded: join the last value up once
            typed = thread.blob_bytes(ns, channel, base)
            previous = None if typed is None else _split_array(typed[1])
            if typed is None or previous is None:
                return _Blob(ns, channel, version, kind, data)
            count, items = previous[0], typed[1][previous[1] :]
        total, header = split
        if count == 0 or total < count or not data.startswith(items, header):
            return _Blob(ns, channel, version, kind, data)
        return _Tail(ns, channel, version, base, total, data[header + len(items) :])

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint and the channel values in ``new_versions``; see the durability rules.

        Raises:
            CheckpointFailed: a durable put (``"sync"``/``"exit"``) was not written.
        """
        self._check_open()
        thread = self._thread(config["configurable"]["thread_id"], look=False)
        stored = self._put(thread, config, checkpoint, metadata, new_versions)
        self._changed(thread, _durability(config))
        return stored

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Async ``put``.

        The put is the thread's (a write, a signal's flush included, stores it)
        from the call on, before the worker thread that encodes it has run.
        """
        self._check_open()
        await self._settle(config["configurable"]["thread_id"], wait=False)
        thread = await self._athread(config["configurable"]["thread_id"], look=False)
        self._raise_failed_open(thread)
        # Encoded here, on the loop's thread, before returning: the next node may
        # change the channel values in place once aput returns (or while a worker
        # thread would still be encoding them), and the checkpoint must be the
        # values LangGraph handed over.
        stored = self._put(thread, config, checkpoint, metadata, new_versions)
        await self._achanged(thread, _durability(config))
        return stored

    def _put_writes(
        self,
        thread: _Thread,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> bool:
        ns: str = config["configurable"].get("checkpoint_ns", "")
        checkpoint_id: str = config["configurable"]["checkpoint_id"]
        added = False
        with self._lock:
            stored = thread.writes.get((ns, checkpoint_id), {})
            for idx, (channel, value) in enumerate(writes):
                index = WRITES_IDX_MAP.get(channel, idx)
                if index >= 0 and (task_id, index) in stored:
                    continue
                kind, data = self.serde.dumps_typed(value)
                self._hold(thread)
                thread.add(
                    _Write(ns, checkpoint_id, task_id, index, channel, kind, data, task_path)
                )
                added = True
        return added

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's pending writes for the checkpoint of ``config``."""
        self._check_open()
        thread = self._thread(config["configurable"]["thread_id"], look=False)
        if self._put_writes(thread, config, writes, task_id, task_path):
            self._changed(thread, _durability(config))

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Async ``put_writes``."""
        self._check_open()
        await self._settle(config["configurable"]["thread_id"], wait=False)
        thread = await self._athread(config["configurable"]["thread_id"], look=False)
        self._raise_failed_open(thread)
        if self._put_writes(thread, config, writes, task_id, task_path):
            await self._achanged(thread, _durability(config))

    # -- deleting, copying, pruning ----------------------------------------------

    def _let_go(self, thread_id: str) -> _Thread | None:
        """Forget the thread: its writer, closed after this, writes nothing more."""
        with self._lock:
            thread = self._threads.pop(thread_id, None)
            if thread is not None:
                thread.held = False
            return thread

    def _delete(self, thread_id: str) -> None:
        try:
            self.store.delete(thread_key(thread_id))
        except KeyLocked as exc:
            way_out = f"thread {thread_id!r} not deleted: delete it once that saver has closed"
            raise locked(exc, way_out) from exc

    def delete_thread(self, thread_id: str) -> None:
        """Delete the thread's checkpoints and writes (its key), durably.

        A thread this saver writes is let go first: its writer closed, what
        it had not written dropped.

        Raises:
            CheckpointFailed: ``"locked"``: a live writer of another process
                (or of another store object) holds the thread; nothing was
                deleted.  The message names it.
        """
        self._check_open()
        thread = self._let_go(thread_id)
        if thread is not None and thread.writer is not None:
            thread.writer.close()
        if thread is not None:
            self._end_committer(thread)
        self._delete(thread_id)

    async def adelete_thread(self, thread_id: str) -> None:
        """Async ``delete_thread``."""
        self._check_open()
        thread = self._let_go(thread_id)
        if thread is not None:
            await self._close_writer(thread)
        await anyio.to_thread.run_sync(self._delete, thread_id)

    async def _close_writer(self, thread: _Thread) -> None:
        """Close the thread's writer (its final write) or its committer."""
        if thread.opening is not None:  # opening in the saver's task: close what it opens
            await thread.opening.wait()
        writer, thread.writer = thread.writer, None
        if writer is not None:
            thread.result = await writer.aclose()
        if thread.committer is not None:
            await anyio.to_thread.run_sync(self._end_committer, thread)

    def _copy_thread(self, source: _Thread, target: _Thread) -> bool:
        with self._lock:
            rows = list(source.rows)
            if rows:
                self._hold(target)
            for row in rows:
                target.add(row)
            target.last.clear()  # the source's last values are not the target's
            return bool(rows)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of one thread onto another, durably."""
        self._check_open()
        target = self._thread(target_thread_id)
        if self._copy_thread(self._thread(source_thread_id), target):
            self._changed(target, "sync")

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Async ``copy_thread``."""
        self._check_open()
        source = await self._athread(source_thread_id)
        target = await self._athread(target_thread_id)
        if self._copy_thread(source, target):
            await self._achanged(target, "sync")

    def _keep(self, thread: _Thread, kept: set[tuple[str, str]]) -> bool:
        """Rewrite the log with only the checkpoints ``kept``, their values and writes."""
        with self._lock:
            before = sum(len(c) for c in thread.checkpoints.values())
            if before == len(kept):
                return False
            loads = self.serde.loads_typed
            needed: set[tuple[str, str, Version]] = set()
            for ns, checkpoint_id in kept:
                put = thread.checkpoints[ns][checkpoint_id]
                versions = loads((put.type, put.checkpoint))["channel_versions"]
                needed.update((ns, channel, version) for channel, version in versions.items())
            rows: list[_Row] = []
            for row in thread.rows:
                if isinstance(row, _Put | _Write):
                    checkpoint_id = row.id if isinstance(row, _Put) else row.checkpoint
                    if (row.ns, checkpoint_id) in kept:
                        rows.append(row)
                elif (row.ns, row.channel, row.version) in needed:
                    if isinstance(row, _Tail) and not self._chain_kept(thread, row, needed):
                        typed = thread.blob_bytes(row.ns, row.channel, row.version)
                        assert typed is not None
                        rows.append(_Blob(row.ns, row.channel, row.version, *typed))
                    else:
                        rows.append(row)
            self._hold(thread)
            thread.reset(rows)
            return True

    @staticmethod
    def _chain_kept(thread: _Thread, row: _Tail, needed: set[tuple[str, str, Version]]) -> bool:
        cursor: _Blob | _Tail | None = row
        while isinstance(cursor, _Tail):
            key = (row.ns, row.channel, cursor.base)
            if key not in needed:
                return False
            cursor = thread.blobs.get(key)
        return cursor is not None

    def _prune(self, thread: _Thread, strategy: str) -> bool:
        if strategy == "delete":
            return self._keep(thread, set())
        if strategy != "keep_latest":
            raise ValueError(f"strategy must be 'keep_latest' or 'delete', got {strategy!r}")
        with self._lock:
            kept = {(ns, max(c)) for ns, c in thread.checkpoints.items() if c}
        return self._keep(thread, kept)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Keep only each namespace's latest checkpoint (``"keep_latest"``), or none (``"delete"``).

        Raises:
            ValueError: an unknown ``strategy``.
        """
        self._check_open()
        for thread_id in thread_ids:
            thread = self._thread(thread_id)
            if self._prune(thread, strategy):
                self._changed(thread, "sync")

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Async ``prune``."""
        self._check_open()
        for thread_id in thread_ids:
            thread = await self._athread(thread_id)
            if self._prune(thread, strategy):
                await self._achanged(thread, "sync")

    def _drop_runs(self, thread: _Thread, run_ids: set[str]) -> bool:
        with self._lock:
            kept: set[tuple[str, str]] = set()
            for ns, checkpoints in thread.checkpoints.items():
                for checkpoint_id, row in checkpoints.items():
                    metadata = self.serde.loads_typed((row.metadata_type, row.metadata))
                    if metadata.get("run_id") not in run_ids:
                        kept.add((ns, checkpoint_id))
        return self._keep(thread, kept)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) whose metadata's ``run_id`` is listed."""
        self._check_open()
        if not run_ids:
            return
        for thread in self._all_threads():
            if self._drop_runs(thread, set(run_ids)):
                self._changed(thread, "sync")

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Async ``delete_for_runs``."""
        self._check_open()
        if not run_ids:
            return
        for thread in await anyio.to_thread.run_sync(self._all_threads):
            if self._drop_runs(thread, set(run_ids)):
                await self._achanged(thread, "sync")

    def get_next_version(self, current: str | None, channel: None) -> str:
        """A version greater than ``current``: ``<counter>.<random>``, as LangGraph's savers do."""
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(current.split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"


def _stored_config(
    thread: _Thread, config: RunnableConfig, checkpoint: Checkpoint
) -> RunnableConfig:
    """What ``put`` returns: the config of the checkpoint stored."""
    return {
        "configurable": {
            "thread_id": thread.thread_id,
            "checkpoint_ns": config["configurable"]["checkpoint_ns"],
            "checkpoint_id": checkpoint["id"],
        }
    }


def _refusal(result: Result, durability: str | None) -> bool:
    """Whether the thread is another writer's: it wrote the thread after this saver read it,
    or a durable put found it holding the thread (a timed write retries: it may let go)."""
    if not isinstance(result, Failed):
        return False
    return result.reason == "conflict" or (result.reason == "locked" and durability in _DURABLE)


def _durability(config: RunnableConfig) -> str | None:
    value = config["configurable"].get("__pregel_durability")
    return value if isinstance(value, str) else None
