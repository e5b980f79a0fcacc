"""A saver's LangGraph threads in memory: read from the store, and who writes them.

A thread the saver changed is *held*.  An async saver's ``SessionRegistry``
writes it: each change runs inside the key's session (its writer opened
from the revision the thread was read from, so no close comes mid-put), and
the thread leaves memory once its writer closed (idle, evicted, the saver's
close).  A synchronous saver's ``KeyCommitter`` commits each change at once; past
``max_open`` the least recently used lets its key's lock go (``Held``) and takes
it again at its next commit, fenced on what it wrote.
When the store refuses, the rows are dropped and the refusal raised.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
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
from checkpointer._adapters import (
    HELD,
    Held,
    committer_options,
    framework_key,
    probe_lock,
    raise_failed,
    session_registry,
)
from checkpointer.stores import Store

from ._log import Log, State

DURABLE = ("sync", "exit")
_PLAIN, _HASHED = "lg-", "lg."

Change = Callable[["Thread"], bool]  # changes the thread (under the lock); False if it did not


def thread_key(thread_id: str) -> str:
    """The checkpoint key of a thread: ``lg-<id>``, or ``lg.<sha256 prefix>`` for other ids."""
    return framework_key(thread_id, plain=_PLAIN, hashed=_HASHED)


class Thread(Log):
    """One thread in memory: its log, and who writes it."""

    def __init__(self, thread_id: str) -> None:
        super().__init__()
        self.thread_id = thread_id
        self.key = thread_key(thread_id)
        self.committer: KeyCommitter | None = None  # a synchronous saver's
        self.base: Meta | None = None  # the checkpoint the rows were read from
        self.held = False  # changed by this saver: never read again
        self.refusal: Failed | None = None  # raised by a put until the thread is read again
        self.result: Result | None = None  # its committer's final commit's
        self.taken = 0  # rows its writer's last snapshot took
        self.stored: int | None = None  # its writer closed, these rows stored: base is stale
        # A synchronous saver's puts commit from LangGraph's worker threads at once: a state
        # is taken and committed under it, so an older state never lands after a newer one.
        self.committing = threading.Lock()

    def read(self, checkpoint: Checkpoint[State] | None) -> None:
        """Take what the store holds (``load``'s answer) as the thread, unless it is held."""
        if not self.held:
            self.base = None if checkpoint is None else checkpoint.meta
            self.refusal, self.stored = None, None
            self.reset([] if checkpoint is None else checkpoint.state.messages)


class Threads:
    """One saver's threads (over its store, with its writer options), and who writes them."""

    def __init__(
        self,
        store: Store,
        options: dict[str, Any],
        *,
        idle_timeout: float,
        max_open: int | None,
    ) -> None:
        self._store = store
        self._options = options
        self.lock = threading.RLock()  # over the threads and their logs
        self._by_key: dict[str, Thread] = {}
        self._unraised: list[Failed] = []  # refusals and failed closes no put raised
        # Its opening writes the put that opened it (and takes the key).
        self.registry = session_registry(
            self, store, options, idle_timeout=idle_timeout, max_open=max_open
        )
        self._async = False  # entered with ``async with``: the registry writes the threads
        # A synchronous saver's committers holding their lock: the process's bound, shared
        # with the other savers and adapters, unless max_open gives this saver its own.
        self._held = HELD if max_open is None else Held(max_open)
        self._tasks: anyio.abc.TaskGroup | None = None  # an async saver's

    def __len__(self) -> int:
        return len(self._by_key)

    def get(self, thread_id: str, *, look: bool = True) -> Thread:
        """The thread (blocking): read at first use, and again if ``look`` finds another
        revision stored (not for a put: it changes the thread as LangGraph last read it)."""
        key = thread_key(thread_id)
        with self.lock:
            thread = self._by_key.get(key)
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
            thread = self._by_key.get(thread_key(thread_id))
        if thread is not None and (thread.held or not look):
            return thread
        return await anyio.to_thread.run_sync(lambda: self.get(thread_id, look=look))

    def _install(self, thread_id: str, checkpoint: Checkpoint[State] | None) -> Thread:
        key = thread_key(thread_id)
        with self.lock:
            thread = self._by_key.get(key)
            if thread is None:
                thread = self._by_key[key] = Thread(thread_id)
            thread.read(checkpoint)
            return thread

    def all(self) -> list[Thread]:
        """Every thread of the store and of this saver, each looked at (blocking)."""
        with self.lock:
            ids = {key: t.thread_id for key, t in self._by_key.items()}
        for key in self._store.keys():  # noqa: SIM118 -- a Store, not a mapping
            if key.startswith((_PLAIN, _HASHED)) and key not in ids:
                checkpoint = load(self._store, key, State)  # a digest key names no thread
                if checkpoint is not None:
                    ids[key] = self._install(checkpoint.state.thread_id, checkpoint).thread_id
        return [self.get(thread_id) for thread_id in ids.values()]

    def values(self) -> list[Thread]:
        with self.lock:
            return list(self._by_key.values())

    def let_go(self, thread_id: str) -> Thread | None:
        """Forget the thread: its writer or committer, closed after this, writes nothing more."""
        with self.lock:
            thread = self._by_key.pop(thread_key(thread_id), None)
            if thread is not None:
                thread.held = False
            return thread

    # -- an async saver's: the registry ----------------------------------------------------

    async def aopen(self) -> None:
        await self.registry.__aenter__()
        tasks = anyio.create_task_group()  # an "async" put's session, when it must wait
        await tasks.__aenter__()
        self._tasks, self._async = tasks, True

    async def aclose(self) -> Failed | None:
        """Close every thread's writer (its final write); what the close raises."""
        tasks, self._tasks = self._tasks, None
        if tasks is not None:
            await tasks.__aexit__(None, None, None)
        await self.registry.aclose()
        return self._failures([])

    def _resume(self, key: str) -> Meta | None:
        """The registry opens a thread's writer (blocking): from the revision the thread was
        read from; ``CheckpointFailed`` now if another writer holds it, or wrote it since
        this saver's writer of it closed."""
        with self.lock:
            thread = self._by_key.get(key)
        if thread is None:  # a put's thread is in memory: this is a read's
            checkpoint = load(self._store, key, State)
            thread = (
                None
                if checkpoint is None
                else self._install(checkpoint.state.thread_id, checkpoint)
            )
        elif thread.stored is not None:  # written here, then let go: is it as it was left?
            checkpoint = load(self._store, key, State)
            with self.lock:
                rows = [] if checkpoint is None else checkpoint.state.messages
                if rows != thread.rows[: thread.stored]:
                    error = f"{key!r} was written by another writer since this saver let it go"
                    raise CheckpointFailed(Failed("conflict", error))
                # Changed while its writer closed: held again, from what that writer left.
                thread.held = thread.held or len(thread.rows) > thread.stored
                thread.base, thread.stored = (None if checkpoint is None else checkpoint.meta), None
        name = key if thread is None else thread.thread_id
        probe_lock(
            self._store, key, self._options, f"or run thread {name!r} under another thread_id"
        )
        return None if thread is None else thread.base

    def _snapshot(self, key: str) -> Snapshot | None:
        with self.lock:
            thread = self._by_key.get(key)
            state = None if thread is None else self._state(thread)
            if thread is not None and state is not None:
                thread.taken = len(thread.rows)
        return None if state is None else Snapshot(key, state)

    def _closed(self, key: str, result: Result) -> None:
        """The thread's writer closed: its rows stay, as a read's, until one looks again;
        a failed final write is a refusal (the next put raises it, else the close)."""
        with self.lock:
            thread = self._by_key.get(key)
            if thread is None or not thread.held:
                return
            if isinstance(result, Failed):
                self._refuse(thread, result, raised=False)
            else:
                thread.held, thread.stored = False, thread.taken

    async def achange(
        self, thread_id: str, change: Change | None, durability: str | None, *, look: bool = False
    ) -> None:
        """Change the thread (before any wait: LangGraph's next node may change in place the
        values a put was handed), then in its writer's session notify it, or write now
        (durable: a refusal is raised, and the key let go).  An "async" put does that in a
        task of the saver's, so no put waits for a writer to open; a refusal found there is
        raised by the next put, or the close.  ``change`` None only looks for a conflict
        met in the background; ``look`` reads an unheld thread again if it changed.
        """
        if not self._async:  # a synchronous saver: its committer, in a worker thread
            await anyio.to_thread.run_sync(self.change, thread_id, change, durability, look)
            return
        thread = await self.aget(thread_id, look=look)  # waits only for a thread not read yet
        with self.lock:
            if change is not None and not change(thread):  # hold() raises a refusal
                return
        if change is not None and durability not in DURABLE and self._tasks is not None:
            self._tasks.start_soon(self._session, thread, None)
            return
        failed = await self._session(thread, durability if change is not None else None)
        if change is not None:
            self.hold(thread)  # raises the refusal of this write
            raise_failed(failed)

    async def _session(self, thread: Thread, durability: str | None) -> Failed | None:
        """Use the thread's writer in its session; a refusal (its opening's, its write's, a
        conflict met in the background) refuses the thread and lets the key go.  Returns a
        durable write's other failure."""
        failed = None
        try:
            async with self.registry.session(thread.key) as writer:
                failed = await self._use(thread, writer, durability)
        except Exception as exc:  # the opening: another writer holds or wrote the key, ...
            refusal = exc.result if isinstance(exc, CheckpointFailed) else None
            error = f"cannot open the writer of {thread.key!r}: {type(exc).__name__}: {exc}"
            self._refuse(thread, refusal or Failed("write-failed", error), raised=False)
        finally:
            if thread.refusal is not None:
                # Its writer expects a revision no longer stored: it goes (if another put
                # is in its block, the last one out lets it go).
                with anyio.CancelScope(shield=True), contextlib.suppress(RuntimeError):
                    await self.registry.release(thread.key)  # not held: no final write
        return failed

    async def _use(
        self, thread: Thread, writer: CheckpointWriter[Snapshot], durability: str | None
    ) -> Failed | None:
        last = writer.statistics().last_result
        if thread.held and isinstance(last, Failed) and last.reason == "conflict":
            self._refuse(thread, last, raised=False)
        elif durability not in DURABLE:
            if thread.held:
                writer.notify()
        else:
            result = await writer.write_now()
            if _refusal(result, durability):
                assert isinstance(result, Failed)
                self._refuse(thread, result, raised=False)
            elif isinstance(result, Failed):
                return result
        return None

    # -- a synchronous saver's: a committer per thread ---------------------------------------

    def close(self) -> Failed | None:
        """Commit each held thread a final time (not live) and let its key go; blocking."""
        threads = self.values()
        for thread in threads:
            self.end_committer(thread)
        return self._failures(threads)

    def change(
        self, thread_id: str, change: Change | None, durability: str | None, look: bool = False
    ) -> None:
        """``achange`` of a synchronous saver (blocking): every change committed at once."""
        thread = self.get(thread_id, look=look)
        with self.lock:
            changed = change is not None and change(thread)
        if changed:
            self._commit(thread, durability)

    def _commit(self, thread: Thread, durability: str | None) -> None:
        """Commit the thread now (no timer would write it later); raise a refusal, or a failure
        of a durable put."""
        with thread.committing:
            state = self._state(thread)
            if state is None:
                return  # deleted or refused meanwhile: nothing of this saver's to write
            committer = self._committer(thread)
            result = committer.commit(state)
        self._held.used(committer)  # past max_open, the least recently used lets its lock go
        if _refusal(result, "sync"):
            assert isinstance(result, Failed)
            self._refuse(thread, result, raised=True)
            self.end_committer(thread)  # not held: no final commit, the key let go
            raise CheckpointFailed(result)
        if isinstance(result, Failed) and durability in DURABLE:
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

    def end_committer(self, thread: Thread) -> None:
        """Commit the thread's rows a final time (not live) if it holds them; let the key go."""
        with self.lock:
            committer, thread.committer = thread.committer, None
        if committer is not None:
            with thread.committing:
                state = self._state(thread)
                if state is not None:
                    thread.result = committer.commit(state, live=False)
            committer.close()
            self._held.forget(committer)

    # -- both ------------------------------------------------------------------------------

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

    def _refuse(self, thread: Thread, failed: Failed, *, raised: bool) -> None:
        """The store refused the thread's write: its rows go, the other writer's work stays.
        A put raises the refusal until the next read; the close, if nothing did (``raised``)."""
        with self.lock:
            thread.held, thread.refusal = False, failed
            thread.reset([])
            if not raised:
                self._unraised.append(failed)

    def _failures(self, threads: list[Thread]) -> Failed | None:
        """The failed final writes of ``threads`` and the refusals no put raised, as one."""
        failed = [*self._unraised, *(t.result for t in threads if isinstance(t.result, Failed))]
        if not failed:
            return None
        return Failed(failed[0].reason, "; ".join(f.error for f in failed))


def _background_conflict(writer: CheckpointWriter[Snapshot], thread: Thread) -> Failed | None:
    """The conflict the writer of a held thread met at a timed write: the thread is another's."""
    last = writer.statistics().last_result
    if thread.held and isinstance(last, Failed) and last.reason == "conflict":
        return last
    return None


def _refusal(result: Result, durability: str | None) -> bool:
    """Whether the thread is another writer's: it wrote the thread after this saver read it,
    or a durable put found it holding the thread (a timed write retries: it may let go)."""
    if not isinstance(result, Failed):
        return False
    return result.reason == "conflict" or (result.reason == "locked" and durability in DURABLE)
