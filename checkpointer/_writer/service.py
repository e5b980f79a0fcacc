"""The checkpoint writer: a service object that carries out the scheduler.

``CheckpointWriter`` is the anyio shell around two pure or synchronous
cores: the timing policy (``_schedule.py``: when is the next write due?) and
the commit core (``commit.py``: one write, from snapshot to store).  The
data path goes forward only::

    notify() -> Scheduler (due) -> the timer or write_now() -> Committer.prepare
      (snapshot, fingerprint, prepare step, encode) -> one worker-thread hop
      -> Committer.execute (the key's lock and window, the store's commit)

Here: the configuration, ``notify`` and ``attach``, the two lifecycles
(``async with`` and ``with``/``open``), the hops to a worker thread, the
exit hooks (registered through ``_exit.Flushable``) and ``statistics``; the
timer that starts the scheduled writes is ``timer.py``.

The timer (``timer.py``) runs in a task of the event loop's own, not in a
task group held across the caller's code, so ``aclose()`` may come from any
task, under any cancel scope, in any order among writers.  A close claims the writer once
(``_begin_close``); from then on live writes are ``Skipped("closed")``, and
the last write to end after it lets the key's lock go (``_job_done``).

(Past 500 lines on purpose: this is one concern, the lifecycle of a writer
in both worlds, whose parts share the close claim, the write lock and the
hand-off of a job to a thread; a third of it is the public API's docstrings.)
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, Generic, Literal, TypeVar, final

import anyio
import anyio.lowlevel

from .. import _exit
from .._schedule import Outcome, Scheduler
from .._stores.base import ProbingStore, Store
from .._stores.encoding import Transcript
from .._text import describe_error
from .._values import (
    Checkpoint,
    Failed,
    Limits,
    Meta,
    Result,
    Skipped,
    Snapshot,
    WriterStatistics,
    Written,
)
from .clock import Clock, MonotonicClock
from .commit import REFUSED, Committer, Job, Phase
from .keystate import UNKNOWN, Unknown
from .timer import Timer, spawn_system_task

__all__ = ["CheckpointWriter"]

logger = logging.getLogger("checkpointer")

DEFAULT_LIMITS = Limits()

S = TypeVar("S", bound=Snapshot)

Subscribe = Callable[[Callable[..., None]], Callable[[], object] | None]


@final
class CheckpointWriter(Generic[S]):
    """Keeps a session's checkpoint on disk, debounced, durable and cheap.

    Use it as ``async with CheckpointWriter(source, store) as writer:`` in
    an asyncio or trio program (through anyio), or ``with ...`` / ``open()``
    in a synchronous one, where writes happen on ``flush_sync`` and at exit.

    Args:
        source: called at write time; returns a ``Snapshot(key, state)`` or
            None when the session has no identity (yet, or any more: at
            close, the last key's checkpoint is then marked ``live=False``
            and the close returns ``Skipped("no-identity")``).  Called on the
            event loop's thread for the async path, on the calling thread
            for ``flush_sync``.
        store: where checkpoints go (``FileStore(root)``, ...).
        debounce: quiet seconds after the latest event before a write
            (default 0.5, or ``max_wait`` if less).
        min_interval: least seconds between the starts of two scheduled
            writes (default 1.0, or ``max_wait`` if less); ``write_now``,
            ``flush_sync`` and the final write are exempt.
        max_wait: most seconds the oldest unsaved change waits, however
            steady the stream of events.
        transcript: where an agent state keeps its messages
            (``Transcript("messages")``): each message encoded once, unchanged
            writes skipped by the transcript's fingerprint, dangling tool calls
            closed in the written copy, a history a model API would reject
            refused (see ``Transcript``).
        resume_from: what ``load(store, key)`` returned when your session
            was loaded: the ``Checkpoint`` (or its ``Meta``), or None (the
            key had none).  The store then refuses every write of this
            writer that would replace another revision than that one: a
            checkpoint another writer stored, or deleted, after the load
            (``Failed("conflict")``).  Not given, the writer expects what
            the store holds at its first write.
        state_version: the version of your state's schema, stamped on every
            checkpoint (``Meta.state_version``); ``load(..., state_version=,
            migrations=)`` migrates older ones.  The writer never replaces
            a checkpoint of a newer state version.
        write_on_start: write once on entry so a new session is resumable
            (and claimed) at once.
        exit_hooks: flush at interpreter exit and on SIGTERM/SIGHUP while
            open (signal handlers only when opened on the main thread).
        limits: retry backoff and the close, exit and lock timeouts
            (``Limits``).
        clock: the clock to read and sleep on (tests inject a fake one).

    Raises:
        ValueError: a duration is out of range (the message says which).
        TypeError: ``source`` or ``store`` is not usable, or the store
            cannot refuse a stale write (its ``write`` takes no ``expected``
            revision: wrap it in ``checkpointer.stores.unfenced`` if your
            program keeps one writer per key itself).
    """

    def __init__(
        self,
        source: Callable[[], S | None],
        store: Store,
        *,
        debounce: float | None = None,
        min_interval: float | None = None,
        max_wait: float = 5.0,
        transcript: Transcript | None = None,
        resume_from: Checkpoint[Any] | Meta | Unknown | None = UNKNOWN,
        state_version: int = 0,
        write_on_start: bool = True,
        exit_hooks: bool = True,
        limits: Limits = DEFAULT_LIMITS,
        clock: Clock | None = None,
    ) -> None:
        if not callable(source):
            raise TypeError(f"source must be a callable returning a Snapshot, got {source!r}")
        if not isinstance(store, Store):
            raise TypeError(
                f"store must implement checkpointer.Store (FileStore(root), ...), got {store!r}"
            )
        if transcript is not None and not isinstance(transcript, Transcript):
            raise TypeError(f"transcript must be a Transcript or None, got {transcript!r}")
        if not isinstance(limits, Limits):
            raise TypeError(f"limits must be a Limits(...), got {limits!r}")
        if (
            isinstance(state_version, bool)
            or not isinstance(state_version, int)
            or state_version < 0
        ):
            raise ValueError(f"state_version must be an int >= 0, got {state_version!r}")
        if isinstance(resume_from, Checkpoint):
            resume_from = resume_from.meta
        if resume_from is not None and not isinstance(resume_from, Meta | Unknown):
            raise TypeError(
                "resume_from must be the Checkpoint load() returned, its Meta, or None, "
                f"got {resume_from!r}"
            )
        self._sched = Scheduler(
            debounce=debounce,
            min_interval=min_interval,
            max_wait=max_wait,
            backoff_initial=limits.retry_initial,
            backoff_max=limits.retry_max,
        )
        self._store = store
        self._write_on_start = write_on_start
        self._exit_hooks = exit_hooks
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._now = self._clock.now
        self._close_timeout = float(limits.close_timeout)
        self._exit_timeout = float(limits.exit_timeout)
        # The synchronous core of every write: snapshot, encode, commit.
        self._core = Committer(
            source,
            store,
            transcript=transcript,
            state_version=state_version,
            lock_timeout=float(limits.lock_timeout),
            resume_from=resume_from,
        )
        probe = store.probe if isinstance(store, ProbingStore) else None
        self._timer = Timer(self._sched, self._clock, self._timed_write, probe, self._forked)
        self._hooks = _ExitHooks(self)  # this writer as the exit hooks see it

        self._pid = os.getpid()  # in a forked child this writer is the parent's: see _forked
        self._hooked = False
        self._events = 0
        self._unsubscribes: list[Callable[[], object]] = []
        self._write_lock: anyio.Lock | None = None
        # The lifecycle is self._core.phase; a move to CLOSING is claimed under
        # this lock (close() may come from any thread).  _close is what an
        # aclose() in progress is waiting on.
        self._phase_lock = threading.Lock()
        self._close: _Close | None = None

    @property
    def _closed(self) -> bool:
        return self._core.phase is Phase.CLOSED

    def __repr__(self) -> str:
        phase = self._core.phase.name.lower()
        return f"<CheckpointWriter {phase} store={self._store!r} key={self._core.keys.current!r}>"

    # -- the hot path ----------------------------------------------------------

    def notify(self) -> None:
        """Record that the session changed; a write follows per the timing rules.

        O(1) and non-blocking: one clock read and a few attribute stores in
        a burst.  Safe from any thread.  A no-op after close.  Never raises:
        after the writer's event loop has ended (the writer not closed) the
        change is recorded and written by the exit hooks, ``flush_sync`` or
        ``close()``, as in synchronous use.
        """
        if self._closed:
            return
        self._events += 1
        if self._sched.event(self._now()):
            self._timer.wake_threadsafe()

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
        core = self._core
        return WriterStatistics(
            events=self._events,
            writes=core.writes,
            skipped=core.skipped,
            failures=core.failures,
            failure_streak=core.streak,
            bytes_written=core.bytes_written,
            last_write_seconds=core.last_seconds,
            pending=self._sched.pending,
            key=core.keys.current,
            repaired=core.repaired,
            settled=core.settled,
            last_result=core.last_result,
            last_failure=core.last_failure,
        )

    # -- async lifecycle -------------------------------------------------------

    async def __aenter__(self) -> CheckpointWriter[S]:
        return await self.aopen()

    async def aopen(self) -> CheckpointWriter[S]:
        """Open on this event loop: the store, the exit hooks, a first write, the timer.

        ``async with writer:`` calls it; call it yourself when the writer's
        life is not one block (a framework's session object), and pair it
        with ``aclose()``.  Cancellation: a cancel during the first write
        closes the writer and propagates.

        Returns:
            The writer itself.

        Raises:
            RuntimeError: the writer is open already, or closed.
        """
        self._claim_open()
        self._timer.bind()  # this event loop: notify() wakes the timer through it
        # Fast: no extra pass of the event loop per write (the hop yields anyway;
        # a write that needs no hop yields in _write_async).
        self._write_lock = anyio.Lock(fast_acquire=True)
        await anyio.to_thread.run_sync(self._open_store)
        self._install_hooks()
        try:
            if self._write_on_start:
                await self._start_write()
            if self._core.phase is Phase.OPEN:  # else aclose() came during the first write
                self._timer.start()
        except BaseException:
            self._remove_hooks()
            self._core.phase = Phase.CLOSED
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
        Called while ``async with``'s entry still writes, the entry then
        returns a closed writer (no timer task starts).

        Returns:
            The result of the final write (``Skipped("closed")`` if the
            writer was closed already).

        Raises:
            KeyboardInterrupt: or another ``BaseException`` that was raised
                inside the timer task on trio (by ``source()``, say), again.
        """
        if self._closed:
            return Skipped("closed")
        close = self._close
        if close is not None:  # another task is closing the writer: its result is ours
            with anyio.CancelScope(shield=True):
                await close.done.wait()
            return close.result
        assert self._write_lock is not None, "enter the writer with 'async with' first"
        if not self._begin_close():
            return Skipped("closed")  # close() runs in another thread
        # From the call: the time the close task waits for a busy loop counts
        # (close returns about close_timeout after the call), though it never
        # keeps the final write from being written.
        close = self._close = _Close(anyio.current_time() + self._close_timeout)
        # The close runs in a task of the loop's own (as the timer does), so
        # what interrupts the caller cannot cut it short: asyncio's runner
        # cancels the main task on Ctrl-C natively, through any anyio shield,
        # and trio raises KeyboardInterrupt at the caller's next cancellation
        # point.  The caller waits it out, then gets the interruption.
        close.task = spawn_system_task(self._close_in_task, "checkpointer-close")
        interrupted = await _wait_through(close.done)
        if interrupted is not None:
            raise interrupted
        crash, close.crash = close.crash, None
        if crash is None:
            crash = self._timer.take_crash()
        if crash is not None:
            raise crash
        return close.result

    async def _close_in_task(self) -> None:
        """The close, in its own task: the final write, then ``close.done``."""
        close = self._close
        assert close is not None
        try:
            with anyio.CancelScope(shield=True):  # trio: through the loop's shutdown too
                close.result = self._core.note_final(await self._final_write(), "at close")
        except anyio.get_cancelled_exc_class():
            raise  # the event loop is shutting down (asyncio); the exit hooks write
        except BaseException as exc:  # a task of the loop's own must not raise (trio)
            close.crash = exc
        finally:
            close.done.set()

    async def _final_write(self) -> Result:
        """Stop the timer, write ``live=False``, let the key go, shut.

        If this is cut short (the event loop shutting down under it) the exit
        hooks stay: at exit, or on SIGTERM, they write the final checkpoint
        (waiting up to ``exit_timeout`` for a final write in its thread).
        """
        assert self._close is not None
        deadline = self._close.deadline
        ended = False
        try:
            # Cancelled, not waited for: a timer write in flight abandons its
            # hop and lets the write lock go when the timer task next runs.
            # (Waiting here cost thousands of writers closed at once their
            # close_timeout: each wait is a pass of a loop that is busy.)
            self._timer.cancel()
            result = await self._write_async(force=False, pin=None, live=False, deadline=deadline)
            ended = True
            # From here a write still in flight lets the key go when it ends.
            self._core.phase = Phase.CLOSED
            # Releasing a lock may be I/O (a database round trip for a
            # networked store): not on the event loop's thread.  Past the
            # deadline, _shut releases them on the loop.
            with anyio.move_on_at(deadline):
                await anyio.to_thread.run_sync(self._release_locks, abandon_on_cancel=True)
            with anyio.move_on_at(deadline):  # for take_crash: what the timer task raised
                await self._timer.stop()
        finally:
            if ended:
                self._shut()
            else:
                self._unsubscribe_all()
        return result

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

    async def _timed_write(self) -> None:
        """The write the timer starts when the scheduler says one is due."""
        await self._write_async(force=False, pin=None, live=True)

    async def _start_write(self) -> None:
        result = await self._write_async(force=False, pin=None, live=True)
        if isinstance(result, Skipped) and result.reason == "no-identity":
            self._sched.event(self._now())  # one retry, through the timer

    async def _write_async(
        self, *, force: bool, pin: bool | None, live: bool, deadline: float | None = None
    ) -> Result:
        """One write from the event loop; ``deadline`` is the final write's (see aclose)."""
        lock = self._write_lock
        assert lock is not None, "enter the writer with 'async with' first"
        locked = True
        if deadline is None:
            await lock.acquire()
        else:
            locked = await _acquire_by(lock, deadline)
            # Not locked: a write in flight (write_now(), or the timer's
            # abandoned one whose task has not run since) held the writer
            # until the deadline.  The final write goes on behind it all the
            # same: the I/O lock orders the two in the writing threads, and
            # the generations make the newer state win, as for flush_sync.
        try:
            if locked:
                self._sched.begin_write(self._now())
            outcome = Outcome.CANCELLED
            try:
                started = anyio.current_time() if deadline is not None else 0.0
                job = self._prepare(force=force, pin=pin, live=live)
                result: Result
                if not isinstance(job, Job):
                    result = self._core.account(job)
                    if not live and self._core.keys.to_finish:  # source() had no session
                        # source() ran on the loop: its time does not count.
                        until = math.inf if deadline is None else deadline
                        with anyio.move_on_at(until + anyio.current_time() - started):
                            await anyio.to_thread.run_sync(
                                self._core.finish, abandon_on_cancel=True
                            )
                    else:
                        # Still a cancellation point's pass of the loop, as with the
                        # hop, but never raising: the result above stands.
                        await anyio.lowlevel.cancel_shielded_checkpoint()
                elif deadline is None:
                    result = await self._hop(job)
                else:
                    # source(), prepare and the encoding ran on the loop and
                    # could not be interrupted: they do not count.
                    result = await self._final_hop(
                        job, deadline + anyio.current_time() - started, behind=not locked
                    )
                outcome = _outcome(result)
                return result
            finally:
                if locked:
                    self._sched.end_write(self._now(), outcome)
                    if self._sched.pending:
                        # The timer saw this write in flight and sleeps until woken.
                        self._timer.wake()
        finally:
            if locked:
                lock.release()

    async def _hop(self, job: Job) -> Result:
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

    async def _final_hop(self, job: Job, deadline: float, *, behind: bool) -> Result:
        """Commit the final write in a thread of its own, started now whatever the time.

        Waited for until ``deadline``.  Past it the write goes on: the key
        stays locked until it ends (``_job_done``), and the process waits for
        it at exit up to ``exit_timeout`` (the thread is a daemon, as trio's
        worker threads are, so that a hung disk cannot hang the exit).  The
        loop learns of its end from the thread itself: a worker thread
        waiting in ``join`` would outlive the deadline, and asyncio's are not
        daemons (the interpreter would wait for the hung write at exit).
        ``behind``: a write in flight held the writer until the deadline (the
        message says so).
        """
        results: list[Result] = []
        ended = anyio.Event()
        token = anyio.lowlevel.current_token()

        def run() -> None:
            try:
                results.append(self._run_job(job))
                # Let the key go here, off the loop (a close(2) of a lock file
                # takes milliseconds while thousands of final writes fsync).
                self._core.release_locks()
            finally:
                # Landed (or failed): nothing left for an exit or a signal to wait for.
                _exit.forget_join(self._join_at_exit)
                with contextlib.suppress(Exception):  # the loop may be gone
                    token.backend_class.run_sync_soon(ended.set, (), token.native_token)

        assert self._close is not None
        thread = self._close.thread = threading.Thread(
            target=run, name="checkpointer-final-write", daemon=True
        )
        # Before the start: a KeyboardInterrupt may land anywhere from here on
        # (asyncio raises a second Ctrl-C wherever the loop's thread is).
        # The O(1) registry, not atexit.register: atexit.unregister scans every
        # callback, and thousands of closes made that quadratic.
        _exit.join_at_exit(self._join_at_exit)
        try:
            thread.start()
        except RuntimeError as exc:  # no thread to be had
            _exit.forget_join(self._join_at_exit)
            if job.claim.acquire(blocking=False):
                self._job_done(job)
            failed = Failed(
                "write-failed",
                f"cannot start a thread for the final write: {describe_error(exc)}; "
                "nothing was written at close",
            )
            return failed  # logged by aclose (note_final), at ERROR
        with anyio.move_on_at(deadline):
            await ended.wait()
        if ended.is_set():  # else past the deadline: waited for at exit
            _exit.forget_join(self._join_at_exit)
            if not results:  # _execute raised: a bug, printed by the thread
                return Failed("write-failed", "the final write raised an internal error")
        if results:
            return results[0]
        why = " (a write in flight held the writer until then)" if behind else ""
        failed = Failed(
            "write-failed",
            f"the final write of {self._store.location(job.key)} did not finish within "
            f"close_timeout={self._close_timeout}s{why}; it goes on in a thread of its own and "
            "lands unless the process ends first (at exit the process waits up to "
            f"exit_timeout={self._exit_timeout}s for it); the key stays locked until then",
        )
        return failed  # logged by aclose (note_final), at ERROR

    def _join_at_exit(self) -> None:
        """At exit: wait up to ``exit_timeout`` for a final write still in its thread.

        Run by the one exit hook, and by our SIGTERM/SIGHUP handler, before the
        flushes; while the writer's hooks stay (a close cut short), their flush
        waits for that write itself.
        """
        thread = None if self._close is None else self._close.thread
        if thread is not None and thread.is_alive() and not self._hooked:
            thread.join(self._exit_timeout)

    def _run_job(self, job: Job) -> Result:
        """In the writing thread: execute ``job`` unless a cancelled waiter dropped it."""
        if not job.claim.acquire(blocking=False):
            return Skipped("unchanged")  # dropped before it began; nobody waits for it
        try:
            return self._execute(job)
        finally:
            self._job_done(job)

    def _job_done(self, job: Job) -> None:
        """A prepared job has ended (written, skipped, failed or dropped)."""
        self._core.end(job)
        if self._closed:
            self._release_locks()  # the last write to end after close lets the key go

    # -- sync lifecycle --------------------------------------------------------

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
        result = self._core.note_final(self._flush(force=False, live=False), "at close")
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
        self._core.note_final(self.flush_sync("exit"), "at exit")
        self._release_locks()  # a later write takes them again

    def _flush_at_signal(self) -> None:
        self._core.note_final(self.flush_sync("signal"), "on a signal")

    def _forked(self) -> bool:
        """Whether this is a forked child's copy of a writer its parent opened.

        Such a copy is closed: it never writes (its state is the child's
        stale copy), never releases a lock (``flock(LOCK_UN)`` on the
        inherited descriptor would release the parent's) and never touches
        the store's connection.  One ``getpid`` call, under a microsecond.
        """
        return self._pid != os.getpid()

    def _busy_on(self, thread_id: int) -> bool:
        return thread_id in self._core.busy

    def _flush(self, *, force: bool, live: bool) -> Result:
        if self._busy_on(threading.get_ident()):
            # Re-entered from a signal handler on the thread that is writing:
            # the flush that follows that write (see _exit) covers this call.
            return Skipped("unchanged")
        job = self._prepare(force=force, pin=None, live=live)
        if isinstance(job, Job):
            try:
                return self._execute(job, timeout=self._exit_timeout)
            finally:
                self._job_done(job)
        if not live and self._core.keys.to_finish:  # source() had no session: see finish
            self._core.finish(self._exit_timeout)
        return self._core.account(job)

    # -- open/close helpers ----------------------------------------------------

    def _begin_close(self) -> bool:
        """Claim the close (one, from any thread): ``CLOSING``, where live writes end."""
        with self._phase_lock:
            if self._core.phase >= Phase.CLOSING:
                return False
            self._core.phase = Phase.CLOSING
            return True

    def _claim_open(self) -> None:
        with self._phase_lock:
            phase = self._core.phase
            if phase >= Phase.CLOSING:
                raise RuntimeError("this CheckpointWriter is closed; create a new one")
            if phase is Phase.OPEN:
                raise RuntimeError("this CheckpointWriter is open already")
            self._core.phase = Phase.OPEN
        self._pid = os.getpid()

    def _open_store(self) -> None:
        try:
            self._store.open()
        except Exception as exc:  # a broken root fails the writes, loudly, later
            logger.warning("checkpointer: could not open %r: %s", self._store, describe_error(exc))

    def _install_hooks(self) -> None:
        if self._exit_hooks:
            _exit.register(self._hooks)
            self._hooked = True

    def _remove_hooks(self) -> None:
        if self._hooked:
            self._hooked = False
            if not _exit.unregister(self._hooks):  # closed off the main thread
                self._timer.call_on_main_loop(_exit.restore_pending)

    def _shut(self) -> None:
        self._core.phase = Phase.CLOSED
        self._remove_hooks()
        self._release_locks()
        self._unsubscribe_all()

    def _unsubscribe_all(self) -> None:
        for unsubscribe in list(self._unsubscribes):
            try:
                unsubscribe()
            except Exception as exc:
                logger.warning("checkpointer: unsubscribe failed: %s", describe_error(exc))

    def _release_locks(self) -> None:
        if self._forked():
            return  # the parent's locks: releasing one would release it for the parent
        # Not while a write is in flight (a final write past close_timeout):
        # the key stays locked rather than let another writer in under a
        # write that may still land.  After close that write lets it go when
        # it ends (_job_done); before, it stays locked until the process exits.
        if not self._core.release_locks() and not self._closed:
            logger.warning("checkpointer: a write is still in flight; keeping its key locked")

    # -- one write: the commit core --------------------------------------------

    def _prepare(self, *, force: bool, pin: bool | None, live: bool) -> Job | Skipped | Failed:
        """Snapshot, check and encode, on the caller's thread (``Committer.prepare``).

        In a forked child this writer is its parent's: nothing is written.
        """
        if self._forked():
            return Skipped("closed")
        return self._core.prepare(force=force, pin=pin, live=live)

    def _execute(self, job: Job, timeout: float = -1) -> Result:
        """Write a prepared job; blocking, under the I/O lock (``Committer.execute``)."""
        return self._core.execute(job, timeout)


@final
class _Close:
    """An ``aclose()`` in progress: what it waits on, and what it gives back."""

    __slots__ = ("crash", "deadline", "done", "result", "task", "thread")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline  # on anyio's clock: close_timeout from the call
        self.done = anyio.Event()
        self.result: Result = Skipped("closed")
        self.crash: BaseException | None = None  # raised in the close task
        self.task: object = None  # the running close task: keep a reference
        self.thread: threading.Thread | None = None  # the final write's (_final_hop)


@final
class _ExitHooks:
    """A writer as the exit hooks see it: ``_exit.Flushable``, kept by the registry."""

    __slots__ = ("_writer",)

    def __init__(self, writer: CheckpointWriter[Any]) -> None:
        self._writer = writer

    def flush_at_exit(self) -> None:
        self._writer._flush_at_exit()

    def flush_at_signal(self) -> None:
        self._writer._flush_at_signal()

    def busy_on(self, thread_id: int) -> bool:
        return self._writer._busy_on(thread_id)


async def _wait_through(done: anyio.Event) -> BaseException | None:
    """Wait for ``done`` through one interruption of the waiting task; return it, or None.

    The interruption is a native asyncio cancel (the runner's on Ctrl-C,
    ``asyncio.timeout``), which passes any anyio shield, or trio's
    KeyboardInterrupt.  A second one is raised at once.
    """
    interrupted: BaseException | None = None
    while not done.is_set():
        try:
            with anyio.CancelScope(shield=True):
                await done.wait()
        except GeneratorExit:
            raise
        except BaseException as exc:
            if interrupted is not None:
                raise
            interrupted = exc
    return interrupted


async def _acquire_by(lock: anyio.Lock, deadline: float) -> bool:
    """Take ``lock`` at once if it is free, whatever the time; else wait for it until ``deadline``.

    A free lock is never refused for the time the close spent waiting for a
    busy event loop: only a lock held by a write in flight returns False.
    """
    try:
        lock.acquire_nowait()
        return True
    except anyio.WouldBlock:
        pass
    with anyio.move_on_at(deadline):
        await lock.acquire()
        return True
    return False


def _outcome(result: Result) -> Outcome:
    if isinstance(result, Written):
        return Outcome.WRITTEN
    if isinstance(result, Skipped):
        return Outcome.SKIPPED
    if result.reason in REFUSED:  # no retry can succeed: the next change tries again
        return Outcome.REFUSED
    return Outcome.STORE_FAILED if result.reason == "write-failed" else Outcome.FAILED
