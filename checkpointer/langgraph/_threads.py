"""A saver's LangGraph threads in memory: read from the store, and who writes them.

A thread the saver changed is *held*: its ``CheckpointWriter`` (an async
saver's: ``"async"`` puts at its timing) or ``KeyCommitter`` (every put at
once) writes it, expecting the revision it was read from.  When the store
refuses, the rows are dropped and the refusal raised.
"""

from __future__ import annotations

import threading
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread

from checkpointer import (
    Checkpoint,
    CheckpointFailed,
    CheckpointWriter,
    Failed,
    KeyCommitter,
    Meta,
    Result,
    Snapshot,
    load,
)
from checkpointer._adapters import committer_options, framework_key, probe_lock
from checkpointer.stores import Store

from ._log import Log, State

DURABLE = ("sync", "exit")
_PLAIN, _HASHED = "lg-", "lg."


def thread_key(thread_id: str) -> str:
    """The checkpoint key of a thread: ``lg-<id>``, or ``lg.<sha256 prefix>`` for other ids."""
    return framework_key(thread_id, plain=_PLAIN, hashed=_HASHED)


class Thread(Log):
    """One thread in memory: its log, and who writes it."""

    def __init__(self, thread_id: str) -> None:
        super().__init__()
        self.thread_id = thread_id
        self.key = thread_key(thread_id)
        self.writer: CheckpointWriter[Snapshot] | None = None  # an async saver's
        self.committer: KeyCommitter | None = None  # a thread's with no writer
        self.base: Meta | None = None  # the checkpoint the rows were read from
        self.held = False  # changed by this saver: never read again
        self.refusal: Failed | None = None  # raised by a put until the thread is read again
        self.result: Result | None = None  # the final write's, or its opening's failure
        self.opening: anyio.Event | None = None  # set once its writer opened in the background

    def read(self, checkpoint: Checkpoint[State] | None) -> None:
        """Take what the store holds (``load``'s answer) as the thread, unless it is held."""
        if not self.held:
            self.base = None if checkpoint is None else checkpoint.meta
            self.refusal = None
            self.reset([] if checkpoint is None else checkpoint.state.messages)


class Threads:
    """One saver's threads (over its store, with its writer options), and who writes them."""

    def __init__(self, store: Store, options: dict[str, Any]) -> None:
        self._store = store
        self._options = options
        self.lock = threading.RLock()  # over the threads and their logs
        self._by_id: dict[str, Thread] = {}
        self._unraised: list[Failed] = []  # refusals found by a read: raised at close
        self._opening: anyio.Lock | None = None  # an async saver's: one writer opens at a time
        self._task_group: anyio.abc.TaskGroup | None = None  # opens writers in the background

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, thread_id: str, *, look: bool = True) -> Thread:
        """The thread (blocking): read at first use, and again if ``look`` finds another
        revision stored (not for a put: it changes the thread as LangGraph last read it)."""
        with self.lock:
            thread = self._by_id.get(thread_id)
        key = thread_key(thread_id)
        if thread is not None:
            if thread.held or not look:
                return thread
            base = None if thread.base is None else thread.base.revision
            if thread.refusal is None and self._store.revision(key) == base:
                return thread
        return self._install(thread_id, load(self._store, key, State))

    async def aget(self, thread_id: str, *, look: bool = True) -> Thread:
        """``get``, in a worker thread when it reads."""
        with self.lock:
            thread = self._by_id.get(thread_id)
        if thread is not None and (thread.held or not look):
            return thread
        return await anyio.to_thread.run_sync(lambda: self.get(thread_id, look=look))

    def _install(self, thread_id: str, checkpoint: Checkpoint[State] | None) -> Thread:
        with self.lock:
            thread = self._by_id.get(thread_id)
            if thread is None:
                thread = self._by_id[thread_id] = Thread(thread_id)
            thread.read(checkpoint)
            return thread

    def all(self) -> list[Thread]:
        """Every thread of the store and of this saver, each looked at (blocking)."""
        with self.lock:
            ids = {t.key: t.thread_id for t in self._by_id.values()}
        for key in self._store.keys():  # noqa: SIM118 -- a Store, not a mapping
            if key.startswith((_PLAIN, _HASHED)) and key not in ids:
                checkpoint = load(self._store, key, State)  # a digest key names no thread
                if checkpoint is not None:
                    ids[key] = self._install(checkpoint.state.thread_id, checkpoint).thread_id
        return [self.get(thread_id) for thread_id in ids.values()]

    def values(self) -> list[Thread]:
        with self.lock:
            return list(self._by_id.values())

    def let_go(self, thread_id: str) -> Thread | None:
        """Forget the thread: its writer, closed after this, writes nothing more."""
        with self.lock:
            thread = self._by_id.pop(thread_id, None)
            if thread is not None:
                thread.held = False
            return thread

    async def aopen(self) -> None:
        self._opening = anyio.Lock()
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group

    async def aclose(self) -> Failed | None:
        """Close every thread's writer and committer, all at once; what the close raises."""
        threads = self.values()
        async with anyio.create_task_group() as closing:
            for thread in threads:
                closing.start_soon(self.aclose_thread, thread)
        task_group, self._task_group = self._task_group, None
        if task_group is not None:
            await task_group.__aexit__(None, None, None)
        return self._failures(threads)

    def close(self) -> Failed | None:
        """``aclose``, blocking, one thread after another."""
        threads = self.values()
        for thread in threads:
            self.close_thread(thread)
        return self._failures(threads)

    def _failures(self, threads: list[Thread]) -> Failed | None:
        """The failed final writes of ``threads`` and the refusals no put raised, as one."""
        failed = [*self._unraised, *(t.result for t in threads if isinstance(t.result, Failed))]
        if not failed:
            return None
        return Failed(failed[0].reason, "; ".join(f.error for f in failed))

    def close_thread(self, thread: Thread) -> None:
        """Close the thread's writer (its final write) and committer; blocking."""
        if thread.writer is not None:
            thread.result = thread.writer.close()
        self._end_committer(thread)

    async def aclose_thread(self, thread: Thread) -> None:
        """Close the thread's writer (its final write) and committer."""
        if thread.opening is not None:  # opening in the background: close what it opens
            await thread.opening.wait()
        writer, thread.writer = thread.writer, None
        if writer is not None:
            thread.result = await writer.aclose()
        if thread.committer is not None:
            await anyio.to_thread.run_sync(self._end_committer, thread)

    def _end_committer(self, thread: Thread) -> None:
        """Commit the thread's rows a final time (not live) if it holds them; let the key go."""
        with self.lock:
            committer, thread.committer = thread.committer, None
        if committer is not None:
            state = self._state(thread)
            if state is not None:
                thread.result = committer.commit(state, live=False)
            committer.close()

    def hold(self, thread: Thread) -> None:
        """The saver changes the thread (under its lock): it holds it from now on, unless the
        store refused a write of it since it was last read (raised as ``CheckpointFailed``)."""
        refusal = thread.refusal
        if refusal is not None:
            self._unraised = [f for f in self._unraised if f is not refusal]
            raise CheckpointFailed(refusal)
        thread.held = True

    def _state(self, thread: Thread) -> dict[str, Any] | None:
        with self.lock:
            if not thread.held:
                return None  # deleted, or refused: nothing of this saver's to write
            return {"thread_id": thread.thread_id, "messages": list(thread.rows)}

    def _source(self, thread: Thread) -> Snapshot | None:
        state = self._state(thread)
        return None if state is None else Snapshot(thread.key, state)

    def _refuse(self, thread: Thread, failed: Failed, *, raised: bool) -> None:
        """The store refused the thread's write: its rows go, the other writer's work stays.
        A put raises the refusal until the next read; the close, if nothing did (``raised``)."""
        with self.lock:
            thread.held, thread.refusal = False, failed
            thread.reset([])
            if not raised:
                self._unraised.append(failed)

    def _refused_sync(self, thread: Thread, failed: Failed) -> CheckpointFailed:
        # A writer (a sync method of an async saver) stays: it writes nothing
        # from now on and closes with the saver.
        self._refuse(thread, failed, raised=True)
        self._end_committer(thread)  # not held: no final commit, the key let go
        return CheckpointFailed(failed)

    async def _refused(self, thread: Thread, failed: Failed, *, raised: bool) -> CheckpointFailed:
        # Under the opening lock: a new writer of the thread opens once this one let go.
        assert self._opening is not None
        async with self._opening:
            with self.lock:
                self._refuse(thread, failed, raised=raised)
                writer, thread.writer = thread.writer, None
            if writer is not None:
                await writer.aclose()  # not held: no final write, the key let go
        return CheckpointFailed(failed)

    async def settle(self, thread_id: str, *, wait: bool) -> None:
        """Let go of the thread if its writer met a conflict in the background; ``wait``: for
        a writer still opening (a put does not: the put after it finds out)."""
        with self.lock:
            thread = self._by_id.get(thread_id)
        if thread is None:
            return
        if wait and thread.opening is not None:
            await thread.opening.wait()
        writer = thread.writer
        if writer is not None and thread.held:
            last = writer.statistics().last_result
            if isinstance(last, Failed) and last.reason == "conflict":
                await self._refused(thread, last, raised=False)

    async def for_put(self, thread_id: str) -> Thread:
        """The thread an async put changes, as LangGraph last read it; raises the failure of
        its writer's opening in the background (the close raises it too)."""
        await self.settle(thread_id, wait=False)
        thread = await self.aget(thread_id, look=False)
        if isinstance(thread.result, Failed) and thread.writer is None:
            raise CheckpointFailed(thread.result)
        return thread

    def changed(self, thread: Thread, durability: str | None) -> None:
        """After a change on a sync method: notify the thread's writer, or write now (always
        for a thread with no writer: no timer would write it later)."""
        writer = thread.writer
        if writer is not None and durability not in DURABLE:
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
        if isinstance(result, Failed) and durability in DURABLE:
            raise CheckpointFailed(result)

    async def achanged(self, thread: Thread, durability: str | None) -> None:
        """After a change on an async method: notify the thread's writer, or write now."""
        if self._task_group is None or thread.committer is not None:
            # A synchronous saver, or a thread with no writer: commit in a worker thread.
            await anyio.to_thread.run_sync(self.changed, thread, durability)
            return
        if durability not in DURABLE:
            if thread.writer is not None:
                thread.writer.notify()
            elif thread.opening is None:
                # Opened in the background, not here: LangGraph's next put
                # waits for this one, and its nodes run on meanwhile, changing
                # the values the next put is handed (see aput).
                thread.opening = anyio.Event()
                self._task_group.start_soon(self._open_then_notify, thread)
            return
        writer = await self._writer(thread)
        result = await writer.write_now()
        if _refusal(result, durability):
            assert isinstance(result, Failed)
            raise await self._refused(thread, result, raised=True)
        if isinstance(result, Failed):
            raise CheckpointFailed(result)

    def _committer(self, thread: Thread) -> KeyCommitter:
        with self.lock:
            if thread.committer is None:
                thread.committer = KeyCommitter(
                    self._store,
                    thread.key,
                    resume_from=thread.base,  # None: absent when read, fenced too
                    **committer_options(self._options),
                )
            return thread.committer

    async def _writer(self, thread: Thread) -> CheckpointWriter[Snapshot]:
        """The thread's writer, opened (its first write included) if it has none."""
        if thread.writer is not None:
            return thread.writer
        assert self._opening is not None
        async with self._opening:  # LangGraph runs aput and aput_writes concurrently
            if thread.writer is None:
                await anyio.to_thread.run_sync(self._check_unlocked, thread)
                writer: CheckpointWriter[Snapshot] = CheckpointWriter(
                    lambda: self._source(thread),
                    self._store,
                    resume_from=thread.base,  # None: absent when read, fenced too
                    **self._options,
                )
                thread.writer = await writer.aopen()  # only once it is open
            return thread.writer

    def _check_unlocked(self, thread: Thread) -> None:
        """Raise ``CheckpointFailed("locked")`` now if another writer holds the key (blocking)."""
        way_out = f"or run thread {thread.thread_id!r} under another thread_id"
        try:
            probe_lock(self._store, thread.key, self._options, way_out)
        except CheckpointFailed as exc:
            self._refuse(thread, exc.result, raised=True)
            raise

    async def _open_then_notify(self, thread: Thread) -> None:
        """Open the thread's writer, then notify it; a failure is raised by the next put."""
        try:
            writer = await self._writer(thread)
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


def _refusal(result: Result, durability: str | None) -> bool:
    """Whether the thread is another writer's: it wrote the thread after this saver read it,
    or a durable put found it holding the thread (a timed write retries: it may let go)."""
    if not isinstance(result, Failed):
        return False
    return result.reason == "conflict" or (result.reason == "locked" and durability in DURABLE)
