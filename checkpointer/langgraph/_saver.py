"""``CheckpointSaver``: LangGraph's checkpointer interface over the threads of ``_threads.py``."""

from __future__ import annotations

import functools
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from typing import Any, Literal, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
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
)
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.base import SerializerProtocol

from checkpointer import CheckpointFailed
from checkpointer._adapters import check_options, locked, raise_failed
from checkpointer.stores import KeyLocked, Store

from ._log import Put, Row, Version, Write, config_of
from ._threads import Thread, Threads, thread_key

__all__ = ["CheckpointFailed", "CheckpointSaver", "thread_key"]

T = TypeVar("T")
Typed = dict[str, tuple[str, bytes]]  # channel -> its value serialized
Writes = list[tuple[int, str, str, bytes]]  # (index, channel, type, data) of a task's writes
Rows = list[Row]


class CheckpointSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer whose threads are checkpointed by ``CheckpointWriter`` s.

    Args:
        store: where the threads go.
        serde: LangGraph's serializer (default: its ``JsonPlusSerializer``).
        idle_timeout: seconds an async saver holds a thread's key with no put
            (``SessionRegistry``); then, or when past ``max_open``, its
            writer closes and the thread is read afresh at its next use.
        max_open: most threads' keys a saver holds at once (a descriptor each
            on a ``FileStore``; None: 512, or a quarter of the process's ``ulimit -n``
            if less); a synchronous saver's least recently used thread past
            it lets its lock go and takes it again at its next put, refused
            if another writer wrote the thread meanwhile.
        **writer_options: for each thread's ``CheckpointWriter``; ``limits``,
            ``transcript`` and ``state_version`` for its ``KeyCommitter`` too.

    Use it as ``with`` (synchronous graphs) or ``async with`` (asyncio).
    """

    def __init__(
        self,
        store: Store,
        *,
        serde: SerializerProtocol | None = None,
        idle_timeout: float = 300.0,
        max_open: int | None = None,
        **writer_options: Any,
    ) -> None:
        super().__init__(serde=serde)
        self.store = store
        self._options = check_options("CheckpointSaver", writer_options)
        self._mode: Literal["new", "sync", "async", "closed"] = "new"
        self._threads = Threads(store, self._options, idle_timeout=idle_timeout, max_open=max_open)
        self._loop: tuple[anyio.lowlevel.EventLoopToken, int] | None = None  # an async saver's

    def __repr__(self) -> str:
        return f"<CheckpointSaver {self._mode} store={self.store!r} threads={len(self._threads)}>"

    def __enter__(self) -> CheckpointSaver:
        self._claim("sync")
        return self

    def __exit__(self, _type: object, exc: object, _tb: object) -> None:
        self._mode = "closed"
        failed = self._threads.close()
        if exc is None:
            raise_failed(failed)

    def close(self) -> None:
        """Close every thread's writer (a final write each); ``CheckpointFailed`` if one failed."""
        self.__exit__(None, None, None)

    async def __aenter__(self) -> CheckpointSaver:
        self._claim("async")
        self._loop = anyio.lowlevel.current_token(), threading.get_ident()
        await self._threads.aopen()
        return self

    async def __aexit__(self, _type: object, exc: object, _tb: object) -> None:
        failed = await self._threads.aclose()
        self._mode = "closed"
        if exc is None:
            raise_failed(failed)

    def _claim(self, mode: Literal["sync", "async"]) -> None:
        if self._mode != "new":
            raise RuntimeError(f"this CheckpointSaver is {self._mode}; create a new one")
        self._mode = mode

    def _check_open(self) -> None:
        if self._mode in ("new", "closed"):
            raise RuntimeError(
                f"this CheckpointSaver is {self._mode}: use it inside 'with' or 'async with'"
            )

    def _on_loop(self, method: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
        """A change by a sync method of an async saver: its async twin on the saver's loop
        (as LangGraph's own async savers do), refused on that loop's thread (it would block)."""
        assert self._loop is not None
        token, loop_thread = self._loop
        if threading.get_ident() == loop_thread:
            raise RuntimeError(
                f"this CheckpointSaver is async: await {method.__name__}() on its event loop"
            )
        return anyio.from_thread.run(method, *args, token=token)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint of ``config`` (its ``checkpoint_id``, else the thread's latest)."""
        self._check_open()
        thread = self._threads.get(_id(config))
        ns: str = config["configurable"].get("checkpoint_ns", "")
        with self._threads.lock:
            checkpoints = thread.checkpoints.get(ns)
            if not checkpoints:
                return None
            checkpoint_id = get_checkpoint_id(config) or max(checkpoints)
            row = checkpoints.get(checkpoint_id)
            if row is None:
                return None
            return thread.checkpoint_tuple(thread.thread_id, ns, row, self.serde.loads_typed)

    async def _settle(self, thread_id: str) -> None:
        """Before a read: a held thread whose writer met a conflict in the background is let go."""
        thread = await self._threads.aget(thread_id, look=False)
        if thread.held:
            await self._threads.achange(thread_id, None, None)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        self._check_open()
        await self._settle(_id(config))
        # Decoding the channels builds Python objects (LangChain messages): in a
        # worker thread the loop gets the GIL back between them.
        return await anyio.to_thread.run_sync(self.get_tuple, config)

    def _list(
        self,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> list[CheckpointTuple]:
        threads = [self._threads.get(_id(config))] if config else self._threads.all()
        loads = self.serde.loads_typed
        found: list[CheckpointTuple] = []
        with self._threads.lock:
            for thread in threads:
                for ns, row in thread.listed(config, filter, before, loads):
                    if limit is not None and len(found) >= limit:
                        return found
                    found.append(thread.checkpoint_tuple(thread.thread_id, ns, row, loads))
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
        yield from self._list(config, filter, before, limit)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        self._check_open()
        ids = [_id(config)] if config else [t.thread_id for t in self._threads.values()]
        for thread_id in ids:
            await self._settle(thread_id)
        found = await anyio.to_thread.run_sync(self._list, config, filter, before, limit)
        for item in found:
            yield item

    def _encoded_put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> Callable[[Thread], bool]:
        """The put as a change of its thread, serialized now: once ``aput`` waits, the next
        node may change in place the channel values LangGraph handed over."""
        dumps = self.serde.dumps_typed
        copied = checkpoint.copy()
        values: dict[str, Any] = copied.pop("channel_values")  # type: ignore[misc]
        typed = {c: dumps(values[c]) for c in new_versions if c in values}
        kind, data = dumps(copied)
        meta_kind, meta_data = dumps(get_checkpoint_metadata(config, metadata))
        ns: str = config["configurable"]["checkpoint_ns"]
        parent = config["configurable"].get("checkpoint_id")
        put = Put(ns, checkpoint["id"], parent, kind, data, meta_kind, meta_data)
        return functools.partial(self._apply_put, put, typed, dict(new_versions))

    def _apply_put(
        self, put: Put, typed: Typed, versions: dict[str, Version], thread: Thread
    ) -> bool:
        rows, last = thread.value_rows(put.ns, typed, versions)
        rows.append(put)
        self._threads.hold(thread)
        thread.extend(rows, last)
        return True

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint and its ``new_versions`` values; a durable put (``"sync"``,
        ``"exit"``) that was not written raises ``CheckpointFailed``."""
        self._check_open()
        if self._mode == "async":
            return self._on_loop(self.aput, config, checkpoint, metadata, new_versions)
        change = self._encoded_put(config, checkpoint, metadata, new_versions)
        self._threads.change(_id(config), change, _durability(config))
        return config_of(_id(config), config["configurable"]["checkpoint_ns"], checkpoint["id"])

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        self._check_open()
        change = self._encoded_put(config, checkpoint, metadata, new_versions)
        await self._threads.achange(_id(config), change, _durability(config))
        return config_of(_id(config), config["configurable"]["checkpoint_ns"], checkpoint["id"])

    def _encoded_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, path: str
    ) -> Callable[[Thread], bool]:
        """The task's writes as a change of their thread, serialized now (see ``_encoded_put``)."""
        dumps = self.serde.dumps_typed
        typed: Writes = [
            (WRITES_IDX_MAP.get(channel, idx), channel, *dumps(value))
            for idx, (channel, value) in enumerate(writes)
        ]
        ns: str = config["configurable"].get("checkpoint_ns", "")
        checkpoint_id: str = config["configurable"]["checkpoint_id"]
        return functools.partial(self._apply_writes, ns, checkpoint_id, task_id, path, typed)

    def _apply_writes(
        self, ns: str, checkpoint_id: str, task_id: str, path: str, typed: Writes, thread: Thread
    ) -> bool:
        stored = thread.writes.get((ns, checkpoint_id), {})
        added = False
        for index, channel, kind, data in typed:
            if index >= 0 and (task_id, index) in stored:
                continue
            self._threads.hold(thread)
            thread.add(Write(ns, checkpoint_id, task_id, index, channel, kind, data, path))
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
        if self._mode == "async":
            return self._on_loop(self.aput_writes, config, writes, task_id, task_path)
        change = self._encoded_writes(config, writes, task_id, task_path)
        self._threads.change(_id(config), change, _durability(config))
        return None

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._check_open()
        change = self._encoded_writes(config, writes, task_id, task_path)
        await self._threads.achange(_id(config), change, _durability(config))

    def _delete(self, thread_id: str) -> None:
        try:
            self.store.delete(thread_key(thread_id))
        except KeyLocked as exc:
            way_out = f"thread {thread_id!r} not deleted: delete it once that saver has closed"
            raise locked(exc, way_out) from exc

    def delete_thread(self, thread_id: str) -> None:
        """Delete the thread's key, durably, dropping what this saver had not written of it.

        ``CheckpointFailed("locked")``, naming the holder, while another writer holds it.
        """
        self._check_open()
        if self._mode == "async":
            return self._on_loop(self.adelete_thread, thread_id)
        thread = self._threads.let_go(thread_id)
        if thread is not None:
            self._threads.end_committer(thread)
        self._delete(thread_id)
        return None

    async def adelete_thread(self, thread_id: str) -> None:
        self._check_open()
        if self._mode == "sync":
            await anyio.to_thread.run_sync(self.delete_thread, thread_id)
            return
        self._threads.let_go(thread_id)  # its writer writes nothing more
        await self._threads.registry.release(thread_key(thread_id))
        await anyio.to_thread.run_sync(self._delete, thread_id)

    def _copy_thread(self, source: Thread, target: Thread) -> bool:
        rows = list(source.rows)
        if rows:
            self._threads.hold(target)
        for row in rows:
            target.add(row)
        target.last.clear()  # the source's last values are not the target's
        return bool(rows)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of one thread onto another, durably."""
        self._check_open()
        if self._mode == "async":
            return self._on_loop(self.acopy_thread, source_thread_id, target_thread_id)
        change = functools.partial(self._copy_thread, self._threads.get(source_thread_id))
        self._threads.change(target_thread_id, change, "sync", look=True)
        return None

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._check_open()
        change = functools.partial(self._copy_thread, await self._threads.aget(source_thread_id))
        await self._threads.achange(target_thread_id, change, "sync", look=True)

    def _kept(self, thread: Thread, drop: str | set[str]) -> Rows | None:
        """The log without the checkpoints ``drop`` names: all but each namespace's latest
        (``"keep_latest"``), all (``"delete"``), or a set of run ids'.  None if none go."""
        loads = self.serde.loads_typed
        with self._threads.lock:
            if isinstance(drop, set):
                return thread.kept(thread.without_runs(drop, loads), loads)
            return thread.kept(thread.latest() if drop == "keep_latest" else set(), loads)

    def _keep(self, drop: str | set[str], thread: Thread) -> bool:
        rows = self._kept(thread, drop)
        if rows is None:
            return False
        self._threads.hold(thread)
        thread.reset(rows)
        return True

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Keep each namespace's latest checkpoint (``"keep_latest"``), or none (``"delete"``)."""
        self._check_open()
        if self._mode == "async":
            return self._on_loop(functools.partial(self.aprune, strategy=strategy), thread_ids)
        _check_strategy(strategy)
        for thread_id in thread_ids:
            self._threads.change(thread_id, functools.partial(self._keep, strategy), "sync", True)
        return None

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._check_open()
        _check_strategy(strategy)
        for thread_id in thread_ids:
            change = functools.partial(self._keep, strategy)
            await self._threads.achange(thread_id, change, "sync", look=True)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) whose metadata's ``run_id`` is listed."""
        self._check_open()
        if self._mode == "async":
            return self._on_loop(self.adelete_for_runs, run_ids)
        drop = set(run_ids)
        for thread in self._threads.all() if drop else []:
            if self._kept(thread, drop) is not None:
                self._threads.change(thread.thread_id, functools.partial(self._keep, drop), "sync")
        return None

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._check_open()
        drop = set(run_ids)
        for thread in await anyio.to_thread.run_sync(self._threads.all) if drop else []:
            if self._kept(thread, drop) is not None:  # only a thread it changes is opened
                change = functools.partial(self._keep, drop)
                await self._threads.achange(thread.thread_id, change, "sync")

    get_next_version = InMemorySaver.get_next_version  # "<counter>.<random>", as LangGraph's


def _id(config: RunnableConfig) -> str:
    thread_id: str = config["configurable"]["thread_id"]
    return thread_id


def _check_strategy(strategy: str) -> None:
    if strategy not in ("keep_latest", "delete"):
        raise ValueError(f"strategy must be 'keep_latest' or 'delete', got {strategy!r}")


def _durability(config: RunnableConfig) -> str | None:
    value = config["configurable"].get("__pregel_durability")
    return value if isinstance(value, str) else None
