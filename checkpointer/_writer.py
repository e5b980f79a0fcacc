"""The checkpoint writer: a service object that carries out the scheduler.

How a write flows (one write at a time):

1. On the caller's thread (the event loop for the async path): the
   scheduler marks the pending changes covered, ``source()`` is called,
   the key is checked, the caller's fingerprint compared, and the store
   stages the state (``_codec.py``: encodes it, or only what is new).
   msgspec holds the GIL while it encodes, so doing this in a worker
   thread would not spare the loop (``../shared/FACTS.md``).
2. In one worker-thread hop (``anyio.to_thread.run_sync``; the final write
   of ``aclose``: a thread of its own) or directly for ``flush_sync``:
   under the writer's I/O lock the job is checked against what is on disk
   (generation, content digest, live and pinned flags), the meta is built,
   and the store commits the staged state durably.

Every job carries a generation number taken before ``source()`` runs; the
I/O lock and a per-key "newest generation on disk" make sure an older
snapshot never replaces a newer one, whichever thread writes it (a signal
handler's flush can overtake a write in a worker thread).  A job counts as
in flight (``_inflight``) from its snapshot until its thread has really
ended it, even if the task that waited for it was cancelled: only then may
a later write be skipped as unchanged against what the writer believes is
on disk.

The timer runs in a task of the event loop's own (a trio system task, an
asyncio task; ``_spawn_system_task``), not in a task group held across the
caller's code, so ``aclose()`` may come from any task, under any cancel
scope, in any order among writers.  A close claims the writer once
(``_begin_close``); from then on live writes are ``Skipped("closed")``, and
the last write to end after it lets the key's lock go (``_job_done``).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import contextvars
import itertools
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Hashable, Iterator
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Generic, Literal, TypeVar, final

import anyio
import anyio.lowlevel
import msgspec

from . import _exit
from ._clock import Clock, MonotonicClock
from ._format.versions import newer_state
from ._keylocks import KeyLocks
from ._schedule import IDLE, WRITE, Outcome, Scheduler
from ._session import Prepare, run_prepare, session_meta
from ._stores.base import KeyLocked, ProbingStore, Staged, StaleWrite, Store, commit_deadline
from ._stores.envelopes import state_store
from ._values import (
    Checkpoint,
    CheckpointError,
    Failed,
    Meta,
    NewerVersionError,
    Prepared,
    Result,
    Skipped,
    Snapshot,
    WriterStatistics,
    Written,
)

__all__ = ["CheckpointWriter"]

logger = logging.getLogger("checkpointer")

S = TypeVar("S", bound=Snapshot)

_NO_FINGERPRINT: Any = object()

Subscribe = Callable[[Callable[..., None]], Callable[[], object] | None]


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if len(text) > 300:
        text = text[:297] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _utcnow() -> datetime:
    return datetime.now(UTC)


class _KeyState:
    """What this writer knows about one key's checkpoint on disk."""

    __slots__ = (
        "conflicted",
        "content",
        "created_at",
        "live",
        "looked",
        "newest_gen",
        "parent",
        "pin",
        "pinned",
        "resolved",
        "seen",
        "seq",
        "tried",
        "turns",
    )

    def __init__(self) -> None:
        self.resolved = False  # seq/created_at/pinned read from the store
        self.seq = 0
        self.created_at: datetime | None = None
        self.content: object = None  # fingerprint or digest of the state on disk
        self.live: bool | None = None  # live flag on disk (None: unknown)
        self.pinned: bool | None = None  # pinned flag on disk (None: unknown)
        self.pin: bool | None = None  # requested by write_now(pin=...)
        self.newest_gen = -1  # generation of the snapshot on disk
        self.parent: str | None = None  # Meta.parent of our last write
        self.turns: int | None = None  # Meta.turns of our last write
        # The checkpoint this writer may replace: what was stored when it first
        # looked at the key (or resume_from), then each of its own writes.  Any
        # other is another writer's work since then (see _conflict).
        self.looked = False
        self.seen: Meta | None = None
        self.tried: Meta | None = None  # a commit that failed, whose bytes may have landed
        self.conflicted = False  # the conflict was logged


@final
class _Job:
    __slots__ = (
        "claim",
        "content",
        "force",
        "gen",
        "key",
        "live",
        "prepared",
        "staged",
        "started",
    )

    def __init__(
        self,
        *,
        gen: int,
        key: str,
        staged: Staged,
        content: object,
        live: bool,
        force: bool,
        started: float,
        prepared: Prepared,
    ) -> None:
        self.prepared = prepared
        self.gen = gen
        self.key = key
        self.staged = staged
        self.content = content
        self.live = live
        self.force = force
        self.started = started
        # Taken by the thread that runs the job, or by a cancelled waiter
        # before any thread began it: whoever takes it first decides.
        self.claim = threading.Lock()


@final
class CheckpointWriter(Generic[S]):
    """Keeps a session's checkpoint on disk, debounced, durable and cheap.

    Use it as ``async with CheckpointWriter(source, store) as writer:`` in
    an asyncio or trio program (through anyio), or ``with ...`` / ``open()``
    in a synchronous one, where writes happen on ``flush_sync`` and at exit.

    Args:
        source: called at write time; returns a ``Snapshot(key, state)`` or
            None when the session has no identity yet.  Called on the event
            loop's thread for the async path, on the calling thread for
            ``flush_sync``.
        store: where checkpoints go (``FileStore(root)``).
        debounce: quiet seconds after the latest event before a write.
        min_interval: least seconds between the starts of two scheduled
            writes (``write_now``, ``flush_sync`` and the final write are
            exempt).
        max_wait: most seconds the oldest unsaved change waits, however
            steady the stream of events.
        fingerprint: optional cheap structural fingerprint of a snapshot; a
            write whose fingerprint equals the last written one is skipped
            before encoding.  Without it, an identical encoded state counts
            as unchanged.
        write_on_start: write once on entry so a new session is resumable
            at once.
        exit_hooks: flush at interpreter exit and on SIGTERM/SIGHUP while
            open (signal handlers only when opened on the main thread).
        clock: the clock to read and sleep on (tests inject a fake one).
        backoff_initial: first retry delay after a failed write.
        backoff_max: cap of the doubling retry delay.
        close_timeout: bound, in seconds, on the waits of a close: for a
            write in flight, then for the store to take the final write.
            The final ``source()`` call and encoding run on the event loop
            and are not counted (nothing can interrupt them); what was
            encoded is always written, and a write still going at the bound
            goes on in a thread of its own while ``aclose()`` returns a
            ``Failed`` that says so.
        exit_timeout: how long an exit or signal flush waits for a write in
            flight in a worker thread before it writes anyway.
        prepare: optional step run on each snapshot after the fingerprint
            check and before encoding, e.g. ``transcript_prepare()``: returns
            ``Prepared`` (a repaired copy to write) or ``Failed`` (nothing is
            written, the previous file stays).
        state_version: the version of your state's schema, stamped on every
            file (``Meta.state_version``); ``load(..., state_version=,
            migrations=)`` migrates older files.  The writer never replaces
            a file of a newer state version.
        lock_timeout: how long a write waits for another live writer of the
            same key to let go of the key's lock; 0 (default) means
            ``Failed("locked")`` at once, retried with backoff.  Stores
            without the ``LockingStore`` capability are not locked.
        resume_from: the ``Checkpoint`` (or its ``Meta``) your session was
            loaded from.  The writer never replaces a checkpoint of that key
            that another writer stored after it (``Failed("conflict")``).
            Without it, the window starts at the writer's first look at the
            key (its first write attempt).

    Raises:
        ValueError: a duration is out of range (the message says which).
        TypeError: ``source``, ``store`` or ``fingerprint`` is not usable.
    """

    def __init__(
        self,
        source: Callable[[], S | None],
        store: Store,
        *,
        debounce: float = 0.5,
        min_interval: float = 1.0,
        max_wait: float = 5.0,
        fingerprint: Callable[[S], Hashable] | None = None,
        write_on_start: bool = True,
        exit_hooks: bool = True,
        clock: Clock | None = None,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        close_timeout: float = 10.0,
        exit_timeout: float = 5.0,
        prepare: Prepare | None = None,
        state_version: int = 0,
        lock_timeout: float = 0.0,
        resume_from: Checkpoint[Any] | Meta | None = None,
    ) -> None:
        if not callable(source):
            raise TypeError(f"source must be a callable returning a Snapshot, got {source!r}")
        if not isinstance(store, Store):
            raise TypeError(
                f"store must implement checkpointer.Store (FileStore(root), ...), got {store!r}"
            )
        if fingerprint is not None and not callable(fingerprint):
            raise TypeError(f"fingerprint must be callable or None, got {fingerprint!r}")
        for name, value in (("close_timeout", close_timeout), ("exit_timeout", exit_timeout)):
            if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
        if prepare is not None and not callable(prepare):
            raise TypeError(f"prepare must be callable or None, got {prepare!r}")
        if (
            isinstance(state_version, bool)
            or not isinstance(state_version, int)
            or state_version < 0
        ):
            raise ValueError(f"state_version must be an int >= 0, got {state_version!r}")
        if not (isinstance(lock_timeout, (int, float)) and 0 <= lock_timeout < math.inf):
            raise ValueError(
                f"lock_timeout must be a finite number of seconds >= 0, got {lock_timeout!r}"
            )
        if isinstance(resume_from, Checkpoint):
            resume_from = resume_from.meta
        if resume_from is not None and not isinstance(resume_from, Meta):
            raise TypeError(
                "resume_from must be the Checkpoint load() returned, its Meta, or None, "
                f"got {resume_from!r}"
            )
        self._sched = Scheduler(
            debounce=debounce,
            min_interval=min_interval,
            max_wait=max_wait,
            backoff_initial=backoff_initial,
            backoff_max=backoff_max,
        )
        self._source = source
        self._store = store
        self._fingerprint = fingerprint
        self._write_on_start = write_on_start
        self._exit_hooks = exit_hooks
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._now = self._clock.now
        self._close_timeout = float(close_timeout)
        self._exit_timeout = float(exit_timeout)
        self._states = state_store(store)
        self._prepare_step = prepare
        self._state_version = state_version
        self._locks = KeyLocks(store, float(lock_timeout))
        self._probe = store.probe if isinstance(store, ProbingStore) else None
        self._repaired = 0
        self._settled = 0

        self._opened = False
        self._closed = False
        self._pid = os.getpid()  # in a forked child this writer is the parent's: see _forked
        self._hooked = False
        self._events = 0
        self._writes = 0
        self._skipped = 0
        self._failures = 0
        self._streak = 0
        self._bytes = 0
        self._last_seconds: float | None = None

        self._gen = itertools.count()
        self._keys: dict[str, _KeyState] = {}
        if resume_from is not None:
            resumed = self._keys[resume_from.key] = _KeyState()
            resumed.looked, resumed.seen = True, resume_from
        self._key: str | None = None
        self._to_finish: set[str] = set()
        self._io_lock = threading.Lock()
        self._snapshot_lock = threading.Lock()  # generation + source() + encode
        self._busy: set[int] = set()  # threads inside _io(), see _exit
        # Generations of jobs prepared and not yet ended, on any thread; an
        # abandoned worker write stays here until it has really ended.
        self._inflight: set[int] = set()
        # key -> (generation, meta, staged state) of an exit flush that wrote
        # without the I/O lock because a worker's write hung past exit_timeout
        # (see _execute).
        self._overtaking: dict[str, tuple[int, Meta, Staged]] = {}
        self._unsubscribes: list[Callable[[], object]] = []

        self._token: anyio.lowlevel.EventLoopToken | None = None
        self._loop_thread: int | None = None
        self._write_lock: anyio.Lock | None = None
        self._sleep_scope: anyio.CancelScope | None = None
        # The timer is a task of the event loop's own (_spawn_system_task),
        # in no task group of the caller's: aclose() may come from any task.
        self._timer_task: object = None
        self._timer_scope: anyio.CancelScope | None = None
        self._timer_done: anyio.Event | None = None
        self._crash: BaseException | None = None  # raised in the timer task (trio)
        self._closing = False  # a close began: live writes are Skipped("closed")
        self._close_claim = threading.Lock()  # taken by the one close that runs
        self._close_done: anyio.Event | None = None
        self._close_result: Result = Skipped("closed")

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open" if self._opened else "new"
        return f"<CheckpointWriter {state} store={self._store!r} key={self._key!r}>"

    # -- the hot path -------------------------------------------------------

    def notify(self) -> None:
        """Record that the session changed; a write follows per the timing rules.

        O(1) and non-blocking: one clock read and a few attribute stores in
        a burst.  Safe from any thread.  A no-op after close.
        """
        if self._closed:
            return
        self._events += 1
        if self._sched.event(self._now()):
            self._wake_threadsafe()

    def _on_event(self, *args: object, **kwargs: object) -> None:
        self.notify()

    def attach(self, subscribe: Subscribe) -> Callable[[], None]:
        """Subscribe ``notify`` to an event source.

        Args:
            subscribe: called once with a callback that accepts any
                arguments (the agent's "run ended" event, say); returns an
                unsubscribe function (or None).

        Returns:
            A function that unsubscribes; it also runs when the writer
            closes, and running it twice is harmless.
        """
        if not callable(subscribe):
            raise TypeError(f"subscribe must be callable, got {subscribe!r}")
        undo = subscribe(self._on_event)
        if undo is not None and not callable(undo):
            raise TypeError(
                f"subscribe() must return an unsubscribe callable or None, got {undo!r}"
            )
        done = False

        def unsubscribe() -> None:
            nonlocal done
            if done:
                return
            done = True
            with contextlib.suppress(ValueError):
                self._unsubscribes.remove(unsubscribe)
            if undo is not None:
                undo()

        self._unsubscribes.append(unsubscribe)
        return unsubscribe

    def statistics(self) -> WriterStatistics:
        """The writer's counters, as a frozen value."""
        return WriterStatistics(
            events=self._events,
            writes=self._writes,
            skipped=self._skipped,
            failures=self._failures,
            failure_streak=self._streak,
            bytes_written=self._bytes,
            last_write_seconds=self._last_seconds,
            pending=self._sched.pending,
            key=self._key,
            repaired=self._repaired,
            settled=self._settled,
        )

    # -- async lifecycle ----------------------------------------------------

    async def __aenter__(self) -> CheckpointWriter[S]:
        self._claim_open()
        self._token = anyio.lowlevel.current_token()
        self._loop_thread = threading.get_ident()
        self._write_lock = anyio.Lock()
        await anyio.to_thread.run_sync(self._open_store)
        self._install_hooks()
        try:
            if self._write_on_start:
                await self._start_write()
            self._timer_scope = anyio.CancelScope()
            self._timer_done = anyio.Event()
            self._timer_task = _spawn_system_task(self._timer, "checkpointer-timer")
        except BaseException:
            self._remove_hooks()
            self._closed = True
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> Result:
        """Stop the timer, wait for a write in flight, write a final time.

        The final write marks the checkpoint ``live=False``; then the key's
        lock is let go.  Call it from any task of the writer's event loop, in
        any order among writers, under any cancel scope: it is shielded from
        cancellation and bounded by ``close_timeout`` (see there).  From the
        moment it begins, ``write_now()`` and ``flush_sync("manual")`` return
        ``Skipped("closed")``.  A second call while the first runs waits for
        it and returns the same result; after that, ``Skipped("closed")``.

        Returns:
            The result of the final write (``Skipped("closed")`` if the
            writer was closed already).

        Raises:
            KeyboardInterrupt: or another ``BaseException`` that was raised
                inside the timer task on trio (by ``source()``, say), again.
        """
        if self._closed:
            return Skipped("closed")
        done = self._close_done
        if done is not None:  # another task is closing the writer: its result is ours
            with anyio.CancelScope(shield=True):
                await done.wait()
            return self._close_result
        assert self._write_lock is not None, "enter the writer with 'async with' first"
        if not self._begin_close():
            return Skipped("closed")  # close() runs in another thread
        done = self._close_done = anyio.Event()
        try:
            with anyio.CancelScope(shield=True):
                self._close_result = await self._final_write()
        finally:
            done.set()
        crash, self._crash = self._crash, None
        if crash is not None:
            raise crash
        return self._close_result

    async def _final_write(self) -> Result:
        """Stop the timer, write ``live=False``, let the key go; always shuts."""
        deadline = anyio.current_time() + self._close_timeout
        try:
            with anyio.move_on_at(deadline):  # the timer abandons a write in flight
                await self._stop_timer()
            result = await self._write_async(force=False, pin=None, live=False, deadline=deadline)
            # From here a write still in flight lets the key go when it ends.
            self._closed = True
            # Releasing a lock may be I/O (a database round trip for a
            # networked store): not on the event loop's thread.
            with anyio.move_on_after(self._close_timeout):
                await anyio.to_thread.run_sync(self._release_locks, abandon_on_cancel=True)
        finally:
            self._shut()
        return result

    async def _stop_timer(self) -> None:
        scope, done = self._timer_scope, self._timer_done
        if scope is not None and done is not None:
            scope.cancel()
            await done.wait()

    async def write_now(self, *, force: bool = False, pin: bool | None = None) -> Result:
        """Write now, ignoring the debounce and interval timers.

        Args:
            force: write even if the fingerprint says nothing changed.
            pin: True or False sets ``Meta.pinned`` (sticky, and part of
                what "changed" means); None keeps it.

        Returns:
            ``Written``, ``Skipped`` or ``Failed``; never raises for a failed
            write.  Waits for a write in flight first.  If cancelled while
            the store is writing, the write goes on in its thread and the
            changes stay pending; what the writer knows of the disk changes
            only when that write has ended.
        """
        if self._closed:
            return Skipped("closed")
        return await self._write_async(force=force, pin=pin, live=True)

    async def _start_write(self) -> None:
        result = await self._write_async(force=False, pin=None, live=True)
        if isinstance(result, Skipped) and result.reason == "no-identity":
            self._sched.event(self._now())  # one retry, through the timer

    async def _timer(self) -> None:
        """The timer task: ``_run`` until ``_stop_timer`` cancels it."""
        scope, done = self._timer_scope, self._timer_done
        assert scope is not None
        assert done is not None
        try:
            with scope:
                await self._run()
        except anyio.get_cancelled_exc_class():
            raise  # the event loop is shutting down
        except BaseException as exc:
            if not _on_trio():
                raise  # asyncio stops the loop with it, as for any task
            # A trio system task must not raise (TrioInternalError).  Ctrl-C
            # does not land here (trio keeps it out of system tasks and raises
            # it in the program's code); this came from source() or the clock.
            self._crash = exc
            logger.warning(
                "checkpointer: the timer task stopped on %s; aclose() raises it again",
                _one_line(exc),
            )
        finally:
            done.set()

    async def _run(self) -> None:
        while True:
            try:
                now = self._now()
                decision = self._sched.decide(now)
                if decision is WRITE:
                    await self._write_async(force=False, pin=None, live=True)
                    continue
                delay = math.inf if decision is IDLE else decision.until - now  # type: ignore[union-attr]
                probe = self._sched.next_probe() if self._probe is not None else None
                if probe is not None and probe <= now:  # in a backoff: the store back yet?
                    ok = await anyio.to_thread.run_sync(self._probe_store, abandon_on_cancel=True)
                    self._sched.probed(self._now(), ready=ok)
                    continue
                if probe is not None:
                    delay = min(delay, probe - now)
                with anyio.CancelScope() as scope:
                    self._sleep_scope = scope
                    await self._clock.sleep(delay)
                self._sleep_scope = None
            except Exception:  # a bug of ours must not kill the agent's task group
                logger.exception("checkpointer: internal error in the timer task")
                await self._clock.sleep(self._sched.backoff_max)

    def _probe_store(self) -> bool:
        try:
            return self._probe is not None and self._probe() is True
        except Exception:  # a probe that raises answers no
            return False

    def _wake(self) -> None:
        scope = self._sleep_scope
        if scope is not None:
            scope.cancel()

    def _wake_threadsafe(self) -> None:
        token = self._token
        if token is None or self._timer_done is None or self._forked():
            return  # a forked child: its copy of the loop is not running (asyncio raises)
        if threading.get_ident() == self._loop_thread:
            self._wake()
            return
        with contextlib.suppress(Exception):  # the loop may be gone
            token.backend_class.run_sync_soon(self._wake, (), token.native_token)

    async def _write_async(
        self, *, force: bool, pin: bool | None, live: bool, deadline: float | None = None
    ) -> Result:
        """One write from the event loop; ``deadline`` is the final write's (see aclose)."""
        assert self._write_lock is not None, "enter the writer with 'async with' first"
        if deadline is None:
            await self._write_lock.acquire()
        else:
            acquired = False
            with anyio.move_on_at(deadline):  # a write_now() in flight holds the writer
                await self._write_lock.acquire()
                acquired = True
            if not acquired:
                failed = Failed(
                    "write-failed",
                    "the final write did not start within "
                    f"close_timeout={self._close_timeout}s: a write in flight held the "
                    "writer; nothing was written at close",
                )
                logger.warning("checkpointer: %s", failed.error)
                return failed
        try:
            self._sched.begin_write(self._now())
            outcome = Outcome.CANCELLED
            try:
                started = anyio.current_time()
                job = self._prepare(force=force, pin=pin, live=live)
                result: Result
                if not isinstance(job, _Job):
                    result = self._account(job)
                elif deadline is None:
                    result = await self._hop(job)
                else:
                    # source(), prepare and the encoding ran on the loop and
                    # could not be interrupted: they do not count.
                    result = await self._final_hop(job, deadline + anyio.current_time() - started)
                outcome = _outcome(result)
                return result
            finally:
                self._sched.end_write(self._now(), outcome)
                if self._sched.pending:
                    # The timer saw this write in flight and sleeps until woken.
                    self._wake()
        finally:
            self._write_lock.release()

    async def _hop(self, job: _Job) -> Result:
        """Commit ``job`` in one worker-thread hop.

        Cancelled, the hop abandons the thread: a job that thread has begun
        goes on and ends there (``_run_job``); one it has not begun never
        runs.  Either way the writer's knowledge of the disk changes only when
        a write has really ended.
        """
        try:
            return await anyio.to_thread.run_sync(self._run_job, job, abandon_on_cancel=True)
        except BaseException:
            if job.claim.acquire(blocking=False):  # no thread began it: none will
                self._job_done(job)
            raise

    async def _final_hop(self, job: _Job, deadline: float) -> Result:
        """Commit the final write in a thread of its own, started now whatever the time.

        Waited for until ``deadline``.  Past it the write goes on: the key
        stays locked until it ends (``_job_done``), and the process waits for
        it at exit up to ``exit_timeout`` (the thread is a daemon, as trio's
        worker threads are, so that a hung disk cannot hang the exit).
        """
        results: list[Result] = []

        def run() -> None:
            results.append(self._run_job(job))

        thread = threading.Thread(target=run, name="checkpointer-final-write", daemon=True)
        try:
            thread.start()
        except RuntimeError as exc:  # no thread to be had
            if job.claim.acquire(blocking=False):
                self._job_done(job)
            failed = Failed(
                "write-failed",
                f"cannot start a thread for the final write: {_one_line(exc)}; "
                "nothing was written at close",
            )
            logger.warning("checkpointer: %s", failed.error)
            return failed
        with anyio.move_on_at(deadline):
            await anyio.to_thread.run_sync(thread.join, abandon_on_cancel=True)
        if results:
            return results[0]
        if not thread.is_alive():  # _execute raised: a bug, printed by the thread
            return Failed("write-failed", "the final write raised an internal error")
        atexit.register(thread.join, self._exit_timeout)  # once, for this writer
        failed = Failed(
            "write-failed",
            f"the final write of {self._store.location(job.key)} did not finish within "
            f"close_timeout={self._close_timeout}s; it goes on in a thread of its own and "
            "lands unless the process ends first (at exit the process waits up to "
            f"exit_timeout={self._exit_timeout}s for it); the key stays locked until then",
        )
        logger.warning("checkpointer: %s", failed.error)
        return failed

    def _run_job(self, job: _Job) -> Result:
        """In the writing thread: execute ``job`` unless a cancelled waiter dropped it."""
        if not job.claim.acquire(blocking=False):
            return Skipped("unchanged")  # dropped before it began; nobody waits for it
        try:
            return self._execute(job)
        finally:
            self._job_done(job)

    def _job_done(self, job: _Job) -> None:
        """A prepared job has ended (written, skipped, failed or dropped)."""
        self._inflight.discard(job.gen)
        if self._closed:
            self._release_locks()  # the last write to end after close lets the key go

    # -- sync lifecycle -----------------------------------------------------

    def open(self) -> CheckpointWriter[S]:
        """Open for synchronous use: exit hooks, and a first write.

        Without an event loop there is no timer: the writer writes on
        ``flush_sync``, at exit and on SIGTERM/SIGHUP.  ``notify`` still
        records changes.  Pair with ``close()``, or use ``with``.
        """
        self._claim_open()
        self._open_store()
        self._install_hooks()
        if self._write_on_start:
            self._flush(force=False, live=True)
        return self

    def close(self) -> Result:
        """Write a final time (``live=False``), let the key go, remove the exit hooks.

        From the moment it begins, ``flush_sync("manual")`` from other threads
        returns ``Skipped("closed")``; a second close returns it too.
        """
        if self._closed or not self._begin_close():
            return Skipped("closed")
        result = self._flush(force=False, live=False)
        self._shut()
        return result

    def __enter__(self) -> CheckpointWriter[S]:
        return self.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def flush_sync(self, reason: Literal["manual", "exit", "signal"] = "manual") -> Result:
        """Write the current state now, synchronously, from any thread.

        Needs no event loop and never raises for a failed write: meant for
        atexit hooks, signal handlers and scripts.  ``"exit"`` and
        ``"signal"`` mark the checkpoint ``live=False``; ``"manual"`` keeps
        it live.  Idempotent: a second call with nothing changed is
        ``Skipped("unchanged")``.  Once a close has begun:
        ``Skipped("closed")`` (``"exit"`` and ``"signal"`` still write until
        the close has ended); in a forked child, for a writer its parent
        opened: ``Skipped("closed")``.

        Raises:
            ValueError: ``reason`` is not one of the three above.
        """
        if reason not in ("manual", "exit", "signal"):
            raise ValueError(f"reason must be 'manual', 'exit' or 'signal', got {reason!r}")
        if self._closed:
            return Skipped("closed")
        return self._flush(force=False, live=reason == "manual")

    def _flush_at_exit(self) -> None:
        self.flush_sync("exit")
        self._release_locks()  # a later write takes them again

    def _flush_at_signal(self) -> None:
        self.flush_sync("signal")

    def _forked(self) -> bool:
        """Whether this is a forked child's copy of a writer its parent opened.

        Such a copy is closed: it never writes (its state is the child's
        stale copy), never releases a lock (``flock(LOCK_UN)`` on the
        inherited descriptor would release the parent's) and never touches
        the store's connection.  One ``getpid`` call, under a microsecond.
        """
        return self._pid != os.getpid()

    def _busy_on(self, thread_id: int) -> bool:
        return thread_id in self._busy

    def _flush(self, *, force: bool, live: bool) -> Result:
        if self._busy_on(threading.get_ident()):
            # Re-entered from a signal handler on the thread that is writing:
            # the flush that follows that write (see _exit) covers this call.
            return Skipped("unchanged")
        job = self._prepare(force=force, pin=None, live=live)
        if isinstance(job, _Job):
            try:
                return self._execute(job, timeout=self._exit_timeout)
            finally:
                self._job_done(job)
        return self._account(job)

    # -- open/close helpers -------------------------------------------------

    def _begin_close(self) -> bool:
        """Claim the close (one, from any thread); live writes end here."""
        if not self._close_claim.acquire(blocking=False):
            return False
        self._closing = True
        return True

    def _claim_open(self) -> None:
        if self._closed:
            raise RuntimeError("this CheckpointWriter is closed; create a new one")
        if self._opened:
            raise RuntimeError("this CheckpointWriter is open already")
        self._opened = True
        self._pid = os.getpid()

    def _open_store(self) -> None:
        try:
            self._store.open()
        except Exception as exc:  # a broken root fails the writes, loudly, later
            logger.warning("checkpointer: could not open %r: %s", self._store, _one_line(exc))

    def _install_hooks(self) -> None:
        if self._exit_hooks:
            _exit.register(self)
            self._hooked = True

    def _remove_hooks(self) -> None:
        if self._hooked:
            self._hooked = False
            _exit.unregister(self)

    def _shut(self) -> None:
        self._closed = True
        self._remove_hooks()
        self._release_locks()
        for unsubscribe in list(self._unsubscribes):
            try:
                unsubscribe()
            except Exception as exc:
                logger.warning("checkpointer: unsubscribe failed: %s", _one_line(exc))

    def _release_locks(self) -> None:
        if self._forked():
            return  # the parent's locks: releasing one would release it for the parent
        # Not while a write is in flight (a final write past close_timeout):
        # the key stays locked rather than let another writer in under a
        # write that may still land.  After close that write lets it go when
        # it ends (_job_done); before, it stays locked until the process exits.
        if self._io_lock.acquire(blocking=False):
            try:
                self._locks.release_all()
            finally:
                self._io_lock.release()
        elif not self._closed:
            logger.warning("checkpointer: a write is still in flight; keeping its key locked")

    # -- one write ----------------------------------------------------------

    def _prepare(self, *, force: bool, pin: bool | None, live: bool) -> _Job | Skipped | Failed:
        """Snapshot, check and encode, on the caller's thread.

        The generation, ``source()`` and the encoding happen under one lock,
        so generations order the states as they were encoded: two threads
        flushing at once cannot give the older state the newer generation.
        A signal landing while this thread holds the lock is deferred (see
        ``_exit``) rather than deadlock on it.
        """
        if self._forked():
            return Skipped("closed")
        me = threading.get_ident()
        self._busy.add(me)
        try:
            with self._snapshot_lock:
                return self._prepare_locked(force=force, pin=pin, live=live)
        finally:
            self._busy.discard(me)
            _exit.run_deferred()

    def _prepare_locked(
        self, *, force: bool, pin: bool | None, live: bool
    ) -> _Job | Skipped | Failed:
        if live and self._closing:
            # Under the snapshot lock: a write that began before the close has
            # an older generation than the final write, so it cannot follow it.
            return Skipped("closed")
        gen = next(self._gen)
        started = time.perf_counter()
        try:
            snapshot = self._source()
        except Exception as exc:
            return Failed("snapshot-failed", f"source() raised {_one_line(exc)}")
        if snapshot is None:
            return Skipped("no-identity")
        if not isinstance(snapshot, Snapshot):
            return Failed(
                "snapshot-failed",
                f"source() returned {type(snapshot).__name__}, "
                "expected Snapshot(key, state) or None",
            )
        key = snapshot.key
        try:
            self._store.validate_key(key)
        except (ValueError, TypeError) as exc:
            return Failed("invalid-key", _one_line(exc))
        state = self._keys.get(key)
        if state is None:
            state = self._keys[key] = _KeyState()
        if self._key is not None and self._key != key:
            self._to_finish.add(self._key)
        self._key = key
        self._to_finish.discard(key)
        if pin is not None:
            state.pin = pin
        content: object = _NO_FINGERPRINT
        if self._fingerprint is not None:
            try:
                content = self._fingerprint(snapshot)
                hash(content)
            except Exception as exc:
                return Failed("snapshot-failed", f"fingerprint() raised {_one_line(exc)}")
            if (
                not force
                and not self._inflight
                and not self._to_finish
                # turns come from prepare, not run yet: an equal state has equal turns
                and self._unchanged(state, content, live, snapshot.parent, state.turns)
            ):
                return Skipped("unchanged")
        prepared = run_prepare(self._prepare_step, snapshot)
        if isinstance(prepared, Failed):
            return prepared
        try:
            staged = self._states.stage(key, prepared.snapshot.state)
        except Exception as exc:
            return Failed(
                "encode-failed", f"the state of key {key!r} cannot be encoded: {_one_line(exc)}"
            )
        job = _Job(
            gen=gen,
            key=key,
            staged=staged,
            content=content,
            live=live,
            force=force,
            started=started,
            prepared=prepared,
        )
        self._inflight.add(gen)  # until it ends: no skip before encoding meanwhile
        return job

    @staticmethod
    def _unchanged(
        state: _KeyState, content: object, live: bool, parent: str | None, turns: int | None
    ) -> bool:
        """Whether the store holds this state with the meta the caller controls."""
        pinned = state.pin if state.pin is not None else state.pinned
        return (
            state.content is not None
            and state.content == content
            and state.live == live
            and state.pinned == pinned
            and state.parent == parent
            and state.turns == turns
        )

    def _execute(self, job: _Job, timeout: float = -1) -> Result:
        """Write a prepared job; blocking, under the I/O lock."""
        with commit_deadline(timeout), self._io(timeout) as locked:
            self._finish_keys()
            state = self._keys[job.key]
            if job.gen < state.newest_gen:
                return self._account(Skipped("unchanged"))  # a newer snapshot is on disk
            taken = self._locks.acquire(job.key, self._store.location(job.key))
            if isinstance(taken, Failed):
                if not state.looked:  # the window starts now, lock or not
                    self._look(job.key, state)
                return self._account(taken)
            if taken:  # others may have written the key since we last held it: re-read
                state.resolved, state.content, state.live = False, None, None
            content = job.content
            if content is _NO_FINGERPRINT:
                content = job.staged.content()
            try:
                refused = None if state.resolved else self._resolve(job.key, state)
            except NewerVersionError as exc:  # kept, and the key left to the newer version
                self._locks.release(job.key)
                return self._account(Failed("newer-version", f"not writing {job.key!r}: {exc}"))
            except Exception as exc:
                return self._account(
                    Failed(
                        "write-failed",
                        f"cannot read {self._store.location(job.key)}: {_one_line(exc)}",
                    )
                )
            if refused is not None:
                self._locks.release(job.key)  # the key is another writer's now
                return self._account(refused)
            parent, turns = job.prepared.snapshot.parent, job.prepared.turns
            if not job.force and self._unchanged(state, content, job.live, parent, turns):
                state.newest_gen = job.gen
                return self._account(Skipped("unchanged"))
            now = _utcnow()
            pinned = state.pin if state.pin is not None else bool(state.pinned)
            meta = Meta(
                key=job.key,
                seq=state.seq + 1,
                created_at=state.created_at or now,
                updated_at=now,
                live=job.live,
                pinned=pinned,
                **session_meta(job.prepared, self._state_version),
            )
            overtaken = self._overtaking.get(job.key)
            if not locked:
                # An exit flush overtaking a write stuck in a worker thread:
                # leave our state where that write will find it when it ends.
                self._overtaking[job.key] = (job.gen, meta, job.staged)
            elif overtaken is not None and overtaken[0] > job.gen:
                return self._account(Skipped("unchanged"))  # a newer flush is writing
            try:
                state.tried = meta
                nbytes = self._states.commit(job.key, meta, job.staged)
            except KeyLocked as exc:  # a networked store lost its lock and could not retake it
                return self._account(Failed("locked", str(exc)))
            except StaleWrite as exc:  # fenced: another writer stored the key meanwhile
                state.resolved, state.content, state.tried = False, None, None
                error = f"cannot write {self._store.location(job.key)}: {_one_line(exc)}"
                if not state.conflicted:
                    state.conflicted = True
                    logger.warning(
                        "checkpointer: %s; not retrying until the session changes", error
                    )
                return self._account(Failed("conflict", error))
            except Exception as exc:
                # The bytes may have landed anyway (a directory fsync failing
                # after the rename): re-read the key before the retry.
                state.resolved = False
                state.content = None
                return self._account(
                    Failed(
                        "write-failed",
                        f"cannot write {self._store.location(job.key)}: {_one_line(exc)}",
                    )
                )
            if locked:
                overtaken = self._overtaking.pop(job.key, None)
                if overtaken is not None and overtaken[0] > job.gen:
                    # The flush overtook us while we wrote: newer bytes go back on top.
                    self._rewrite(job.key, overtaken[1], overtaken[2])
                    return self._account(Skipped("unchanged"))
            state.seq = meta.seq
            state.created_at = meta.created_at
            state.content = content
            state.live = job.live
            state.pinned = pinned
            state.newest_gen = job.gen
            state.parent, state.turns = meta.parent, meta.turns
            state.looked, state.seen, state.tried = True, meta, None
            self._repaired += job.prepared.repaired
            self._settled += job.prepared.settled
            return self._account(
                Written(
                    key=job.key,
                    location=self._store.location(job.key),
                    nbytes=nbytes,
                    seconds=time.perf_counter() - job.started,
                    seq=meta.seq,
                    repaired=job.prepared.repaired,
                    settled=job.prepared.settled,
                )
            )

    def _rewrite(self, key: str, meta: Meta, staged: Staged) -> None:
        try:
            self._states.commit(key, meta, staged)
        except Exception as exc:
            logger.warning(
                "checkpointer: could not put the newer checkpoint back on %s: %s",
                self._store.location(key),
                _one_line(exc),
            )

    @contextlib.contextmanager
    def _io(self, timeout: float) -> Iterator[bool]:
        me = threading.get_ident()
        self._busy.add(me)
        try:
            acquired = self._io_lock.acquire(timeout=timeout)
            if not acquired:
                logger.warning(
                    "checkpointer: a write in flight did not finish within %ss; writing anyway",
                    timeout,
                )
            try:
                yield acquired
            finally:
                if acquired:
                    self._io_lock.release()
        finally:
            self._busy.discard(me)
        _exit.run_deferred()

    def _resolve(self, key: str, state: _KeyState) -> Failed | None:
        """Learn seq, created_at and pinned from the checkpoint already stored.

        Returns:
            ``Failed("conflict")`` if another writer stored it after this
            writer first looked at the key (the key stays unresolved, so the
            next attempt looks again); None otherwise.
        """
        meta: Meta | None = None
        try:
            meta = self._states.read_meta(key)
        except NewerVersionError:
            raise  # not damage: never moved aside
        except CheckpointError as exc:
            aside = self._store.move_aside(
                key, "corrupt-" + _utcnow().strftime("%Y%m%dT%H%M%S.%fZ")
            )
            logger.warning(
                "checkpointer: %s; moved it aside to %s and starting afresh",
                exc,
                aside,
            )
        else:
            if meta is not None:
                if meta.state_version > self._state_version:
                    raise newer_state(
                        self._store.location(key),
                        meta,
                        f"this writer's state version is {self._state_version}; not replacing "
                        "it (upgrade the program, or use another key)",
                    )
                conflict = self._conflict(key, state, meta)
                if conflict is not None:
                    return conflict
                state.seq = meta.seq
                state.created_at = meta.created_at
                state.pinned = meta.pinned
        if not state.looked:
            state.looked, state.seen = True, meta
        state.resolved = True
        return None

    def _look(self, key: str, state: _KeyState) -> None:
        """Note what is stored for ``key`` now, without its lock (a reader's read).

        ``read_checkpoint`` is the read ``load()`` does: a file replaced
        atomically, a journal's committed rows, a database row; it changes
        nothing.  If it fails, the next attempt looks, under the lock.
        """
        try:
            checkpoint = self._states.read_checkpoint(key)
        except Exception:
            return
        state.looked = True
        state.seen = None if checkpoint is None else checkpoint.meta

    def _conflict(self, key: str, state: _KeyState, meta: Meta) -> Failed | None:
        """``Failed("conflict")`` if ``meta`` is not a checkpoint this writer may replace."""
        if not state.looked or _same(meta, state.seen):
            return None
        if _same(meta, state.tried):  # our failed commit landed after all
            state.seen, state.tried = meta, None
            return None
        state.content = None  # whatever we wrote, it is not what the store holds
        who = (
            f"pid {meta.writer.pid} on {meta.writer.host}"
            if meta.writer is not None
            else "a writer that did not say who"
        )
        since = "when it had no checkpoint" if state.seen is None else f"at seq {state.seen.seq}"
        error = (
            f"key {key!r} was written by another writer ({who}, seq {meta.seq}, "
            f"{meta.updated_at:%Y-%m-%dT%H:%M:%SZ}) after this writer first saw it {since} "
            f"({self._store.location(key)}); not replacing it: load the key again and start "
            "a new writer from what it holds, or write to another key"
        )
        if not state.conflicted:
            state.conflicted = True
            logger.warning("checkpointer: %s; not retrying until the session changes", error)
        return Failed("conflict", error)

    def _finish_keys(self) -> None:
        """Mark the checkpoints of keys the source moved away from not live."""
        for key in list(self._to_finish):
            state = self._keys.get(key)
            if state is None or state.live is not True:
                self._to_finish.discard(key)
                self._locks.release(key)
                continue
            try:
                meta = self._states.update_meta(key, _finished)
                if meta is not None:
                    state.seq = meta.seq
                    state.seen = meta
                state.live = False
                self._to_finish.discard(key)
                self._locks.release(key)
            except Exception as exc:
                logger.warning(
                    "checkpointer: could not mark %s not live: %s (will retry)",
                    self._store.location(key),
                    _one_line(exc),
                )

    def _account(self, result: Result) -> Result:
        """Update the counters and log once per failure streak."""
        if isinstance(result, Written):
            self._writes += 1
            self._bytes += result.nbytes
            self._last_seconds = result.seconds
            if self._streak:
                logger.info(
                    "checkpointer: writing %s works again after %d failures",
                    result.location,
                    self._streak,
                )
            self._streak = 0
        elif isinstance(result, Skipped):
            self._skipped += 1
            if result.reason == "unchanged":
                self._streak = 0
        else:
            self._failures += 1
            self._streak += 1
            if self._streak == 1 and result.reason != "conflict":  # logged by _conflict
                logger.warning(
                    "checkpointer: checkpoint failed (%s): %s; %s",
                    result.reason,
                    result.error,
                    "waiting for the session to change"
                    if result.reason in _REFUSED
                    else "retrying with backoff",
                )
        return result


def _finished(old: Meta) -> Meta:
    return msgspec.structs.replace(old, seq=old.seq + 1, updated_at=_utcnow(), live=False)


def _on_trio() -> bool:
    trio = sys.modules.get("trio")
    return trio is not None and bool(trio.lowlevel.in_trio_task())


def _spawn_system_task(fn: Callable[[], Coroutine[Any, Any, None]], name: str) -> object:
    """Run ``fn()`` in a task of the event loop's own, in no task group of the caller's.

    As anyio does for its own background tasks: a trio system task (trio
    keeps Ctrl-C out of it and raises it in the program's own code), else a
    task of the running asyncio loop.  Returns the task: keep a reference.
    """
    if _on_trio():
        import trio

        return trio.lowlevel.spawn_system_task(fn, name=name, context=contextvars.copy_context())
    return asyncio.get_running_loop().create_task(fn(), name=name)


_REFUSED = frozenset({"conflict", "newer-version", "not-sendable"})
"""Failures no retry can fix until the session changes: not retried (``Outcome.REFUSED``)."""


def _same(meta: Meta, other: Meta | None) -> bool:
    """Whether two metas are of the same write (seq, time and writer: not merely equal seq)."""
    return (
        other is not None
        and meta.seq == other.seq
        and meta.updated_at == other.updated_at
        and meta.writer == other.writer
    )


def _outcome(result: Result) -> Outcome:
    if isinstance(result, Written):
        return Outcome.WRITTEN
    if isinstance(result, Skipped):
        return Outcome.SKIPPED
    if result.reason in _REFUSED:  # no retry can succeed: the next change tries again
        return Outcome.REFUSED
    return Outcome.STORE_FAILED if result.reason == "write-failed" else Outcome.FAILED
