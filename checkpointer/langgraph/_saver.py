"""``CheckpointSaver``: LangGraph's checkpointer interface over the threads of ``_threads.py``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, Literal

import anyio
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

from ._log import Put, Write, config_of
from ._threads import Thread, Threads, thread_key

__all__ = ["CheckpointFailed", "CheckpointSaver", "thread_key"]


class CheckpointSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer whose threads are checkpointed by ``CheckpointWriter`` s.

    Args:
        store: where the threads go.
        serde: LangGraph's serializer (default: its ``JsonPlusSerializer``).
        **writer_options: for each thread's ``CheckpointWriter``; ``limits``,
            ``transcript`` and ``state_version`` for its ``KeyCommitter`` too.

    Use it as ``with`` (synchronous graphs) or ``async with`` (asyncio).
    """

    def __init__(
        self, store: Store, *, serde: SerializerProtocol | None = None, **writer_options: Any
    ) -> None:
        super().__init__(serde=serde)
        self.store = store
        self._options = check_options("CheckpointSaver", writer_options)
        self._mode: Literal["new", "sync", "async", "closed"] = "new"
        self._threads = Threads(store, self._options)

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

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        self._check_open()
        await self._threads.settle(_id(config), wait=True)
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
            await self._threads.settle(thread_id, wait=True)
        found = await anyio.to_thread.run_sync(self._list, config, filter, before, limit)
        for item in found:
            yield item

    def _put(
        self,
        thread: Thread,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        dumps = self.serde.dumps_typed
        ns: str = config["configurable"]["checkpoint_ns"]
        copied = checkpoint.copy()
        values: dict[str, Any] = copied.pop("channel_values")  # type: ignore[misc]
        with self._threads.lock:
            rows, last = thread.value_rows(ns, values, new_versions, dumps)
            kind, data = dumps(copied)
            meta_kind, meta_data = dumps(get_checkpoint_metadata(config, metadata))
            parent = config["configurable"].get("checkpoint_id")
            rows.append(Put(ns, checkpoint["id"], parent, kind, data, meta_kind, meta_data))
            self._threads.hold(thread)
            thread.extend(rows, last)
        return config_of(thread.thread_id, ns, checkpoint["id"])

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
        thread = self._threads.get(_id(config), look=False)
        stored = self._put(thread, config, checkpoint, metadata, new_versions)
        self._threads.changed(thread, _durability(config))
        return stored

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        self._check_open()
        thread = await self._threads.for_put(_id(config))
        # Encoded on the loop's thread before returning: once aput returns, the
        # next node may change in place the channel values LangGraph handed over.
        stored = self._put(thread, config, checkpoint, metadata, new_versions)
        await self._threads.achanged(thread, _durability(config))
        return stored

    def _put_writes(
        self,
        thread: Thread,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> bool:
        ns: str = config["configurable"].get("checkpoint_ns", "")
        checkpoint_id: str = config["configurable"]["checkpoint_id"]
        added = False
        with self._threads.lock:
            stored = thread.writes.get((ns, checkpoint_id), {})
            for idx, (channel, value) in enumerate(writes):
                index = WRITES_IDX_MAP.get(channel, idx)
                if index >= 0 and (task_id, index) in stored:
                    continue
                kind, data = self.serde.dumps_typed(value)
                self._threads.hold(thread)
                thread.add(Write(ns, checkpoint_id, task_id, index, channel, kind, data, task_path))
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
        thread = self._threads.get(_id(config), look=False)
        if self._put_writes(thread, config, writes, task_id, task_path):
            self._threads.changed(thread, _durability(config))

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._check_open()
        thread = await self._threads.for_put(_id(config))
        if self._put_writes(thread, config, writes, task_id, task_path):
            await self._threads.achanged(thread, _durability(config))

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
        thread = self._threads.let_go(thread_id)
        if thread is not None:
            self._threads.close_thread(thread)
        self._delete(thread_id)

    async def adelete_thread(self, thread_id: str) -> None:
        self._check_open()
        thread = self._threads.let_go(thread_id)
        if thread is not None:
            await self._threads.aclose_thread(thread)
        await anyio.to_thread.run_sync(self._delete, thread_id)

    def _copy_thread(self, source: Thread, target: Thread) -> bool:
        with self._threads.lock:
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
        target = self._threads.get(target_thread_id)
        if self._copy_thread(self._threads.get(source_thread_id), target):
            self._threads.changed(target, "sync")

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._check_open()
        source = await self._threads.aget(source_thread_id)
        target = await self._threads.aget(target_thread_id)
        if self._copy_thread(source, target):
            await self._threads.achanged(target, "sync")

    def _keep(self, thread: Thread, drop: str | set[str]) -> bool:
        """Rewrite the log without the checkpoints ``drop`` names: all but each namespace's
        latest (``"keep_latest"``), all (``"delete"``), or a set of run ids'.  False if none go."""
        loads = self.serde.loads_typed
        with self._threads.lock:
            if isinstance(drop, set):
                rows = thread.kept(thread.without_runs(drop, loads), loads)
            else:
                rows = thread.kept(thread.latest() if drop == "keep_latest" else set(), loads)
            if rows is None:
                return False
            self._threads.hold(thread)
            thread.reset(rows)
            return True

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Keep each namespace's latest checkpoint (``"keep_latest"``), or none (``"delete"``)."""
        self._check_open()
        _check_strategy(strategy)
        for thread_id in thread_ids:
            thread = self._threads.get(thread_id)
            if self._keep(thread, strategy):
                self._threads.changed(thread, "sync")

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._check_open()
        _check_strategy(strategy)
        for thread_id in thread_ids:
            thread = await self._threads.aget(thread_id)
            if self._keep(thread, strategy):
                await self._threads.achanged(thread, "sync")

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) whose metadata's ``run_id`` is listed."""
        self._check_open()
        if not run_ids:
            return
        for thread in self._threads.all():
            if self._keep(thread, set(run_ids)):
                self._threads.changed(thread, "sync")

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._check_open()
        if not run_ids:
            return
        for thread in await anyio.to_thread.run_sync(self._threads.all):
            if self._keep(thread, set(run_ids)):
                await self._threads.achanged(thread, "sync")

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
