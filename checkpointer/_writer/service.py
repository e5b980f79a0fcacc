"""``CheckpointWriter``: the anyio service that carries out the scheduler's decisions.

Here: the public API, both lifecycles (``async with``/``aopen``/``aclose``
and ``with``/``open``/``close``) and the hop of each write to a worker
thread.  The timing policy is ``_schedule.py``, the timer task ``timer.py``,
one write ``commit.py``; the exit hooks (``_exit.py``) call ``_flush_final``.
The timer and the close run in tasks of the event loop's own, not in a task
group held across the caller's code, so ``aclose()`` may come from any task,
under any cancel scope, in any order among writers.
"""

from __future__ import annotations

import contextlib
import dataclasses
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
from .._values import Checkpoint, Failed, Limits, Meta, Result, Skipped, Snapshot, WriterStatistics
from .clock import Clock, MonotonicClock
from .commit import Committer, Job, Phase, outcome
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
        self._limits = limits
        self._write_on_start = write_on_start
        self._exit_hooks = exit_hooks
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._now = self._clock.now
        self._core = Committer(
            source,
            store,
            transcript=transcript,
            state_version=state_version,
            lock_timeout=float(limits.lock_timeout),
            resume_from=resume_from,
        )
        probe = store.probe if isinstance(store, ProbingStore) else None
        self._timer = Timer(self._sched, self._clock, self._timed_write, probe, self._core.forked)
        self._events = 0
        self._unsubscribes: list[Callable[[], object]] = []
        self._write_lock: anyio.Lock | None = None  # made on the writer's event loop
        # The lifecycle is self._core.phase, moved on under this lock (a close
        # may come from any thread); _close is what an aclose() waits on.
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

        O(1), non-blocking, safe from any thread, a no-op after close; never
        raises.  After the writer's event loop has ended (the writer not
        closed) the change waits for the exit hooks, ``flush_sync`` or
        ``close()``, as in synchronous use.
        """
        if self._closed:
            return
        self._events += 1
        if self._sched.event(self._now()):
            self._timer.wake_threadsafe()

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
        undo = subscribe(lambda *args, **kwargs: self.notify())
        if undo is not None and not callable(undo):
            raise TypeError(
                f"subscribe() must return an unsubscribe callable or None, got {undo!r}"
            )
        done = False

        def unsubscribe() -> None:
            nonlocal done
            if not done:
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

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

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
        # Fast: no extra pass of the event loop per write (the hop yields anyway).
        self._write_lock = anyio.Lock(fast_acquire=True)
        await anyio.to_thread.run_sync(self._open_store)
        self._install_hooks()
        try:
            if self._write_on_start:
                result = await self._write_async(force=False, pin=None, live=True)
                if isinstance(result, Skipped) and result.reason == "no-identity":
                    self._sched.event(self._now())  # one retry, through the timer
            if self._core.phase is Phase.OPEN:  # else aclose() came during the first write
                self._timer.start()
        except BaseException:
            self._remove_hooks()
            self._core.phase = Phase.CLOSED
            raise
        return self

    async def write_now(self, *, force: bool = False, pin: bool | None = None) -> Result:
        """Write now, ignoring the debounce and interval timers; wait for a write in flight first.

        Args:
            force: write even if the fingerprint says nothing changed.
            pin: True or False sets ``Meta.pinned`` (sticky, and part of
                what "changed" means); None keeps it.

        Returns:
            ``Written``, ``Skipped`` or ``Failed``; never raises for a failed
            write.  Cancelled while the store writes, the write goes on in
            its thread and the changes stay pending; what the writer knows of
            the disk changes only when that write has ended.
        """
        if self._closed:
            return Skipped("closed")
        return await self._write_async(force=force, pin=pin, live=True)

    async def _timed_write(self) -> None:
        """The write the timer starts when the scheduler says one is due."""
        await self._write_async(force=False, pin=None, live=True)

    async def aclose(self) -> Result:
        """Stop the timer, wait for a write in flight, write a final time (``live=False``).

        Then the key's lock is let go.  Call it from any task of the writer's
        event loop, in any order among writers, under any cancel scope: it is
        shielded from cancellation and bounded by ``Limits.close_timeout``
        from the call (a final write still running then goes on in a thread
        and lands unless the process ends first).  From the moment it begins,
        ``write_now()`` and ``flush_sync("manual")`` return
        ``Skipped("closed")``.  A second call while the first runs waits for
        it and returns the same result; after that, ``Skipped("closed")``.
        Called while ``aopen`` still writes, ``aopen`` then returns a closed
        writer.

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
        close = self._close = _Close(anyio.current_time() + self._limits.close_timeout)
        # In a task of the loop's own, so what interrupts the caller cannot cut
        # the close short: asyncio's runner cancels the main task on Ctrl-C
        # natively, through any anyio shield, and trio raises KeyboardInterrupt
        # at the caller's next cancellation point.  The caller waits it out.
        close.task = spawn_system_task(self._close_in_task, "checkpointer-close")
        interrupted = await _wait_through(close.done)
        if interrupted is not None:
            raise interrupted
        crash = close.crash if close.crash is not None else self._timer.take_crash()
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

        Cut short (the event loop shutting down under it), the exit hooks
        stay: they write the final checkpoint at exit or on SIGTERM.
        """
        assert self._close is not None
        deadline = self._close.deadline
        ended = False
        try:
            # Cancelled, not waited for: a timer write in flight abandons its
            # hop and lets the write lock go when the timer task next runs.
            self._timer.cancel()
            result = await self._write_async(force=False, pin=None, live=False, deadline=deadline)
            ended = True
            self._core.phase = Phase.CLOSED  # a write still in flight lets the key go as it ends
            # Releasing a lock may be a network round trip: not on the loop's
            # thread.  Past the deadline, _shut releases them on the loop.
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

    async def _write_async(
        self, *, force: bool, pin: bool | None, live: bool, deadline: float | None = None
    ) -> Result:
        """One write from the event loop; ``deadline`` is the final write's (see aclose)."""
        lock = self._write_lock
        assert lock is not None, "enter the writer with 'async with' first"
        # Past the deadline a write in flight (write_now(), or the timer's
        # abandoned one) still holds the writer: the final write goes on
        # behind it, ordered by the I/O lock and the generations.
        locked = await _acquire_by(lock, deadline)
        try:
            if locked:
                self._sched.begin_write(self._now())
            ended = Outcome.CANCELLED
            try:
                started = anyio.current_time()
                job = self._core.prepare(force=force, pin=pin, live=live)
                # source(), prepare and the encoding ran on the loop, uninterruptible:
                # their time does not count against the deadline.
                until = math.inf if deadline is None else deadline + anyio.current_time() - started
                result: Result
                if isinstance(job, Job):
                    result = await (
                        self._hop(job)
                        if deadline is None
                        else self._final_hop(job, until, not locked)
                    )
                else:
                    result = self._core.account(job, final=not live)
                    if not live and self._core.keys.to_finish:  # source() had no session
                        with anyio.move_on_at(until):
                            finish = self._core.finish
                            await anyio.to_thread.run_sync(finish, abandon_on_cancel=True)
                    else:  # a cancellation point's pass of the loop, as with a hop
                        await anyio.lowlevel.cancel_shielded_checkpoint()
                ended = outcome(result)
                return result
            finally:
                if locked:
                    self._sched.end_write(self._now(), ended)
                    if self._sched.pending:  # the timer saw this write and sleeps until woken
                        self._timer.wake()
        finally:
            if locked:
                lock.release()

    async def _hop(self, job: Job) -> Result:
        """Commit ``job`` in one worker-thread hop.

        Cancelled, the hop abandons the thread: a job that thread has begun
        goes on and ends there (``_run_job``); one it has not begun never
        runs.  Either way the writer's knowledge of the disk changes only
        when a write has really ended.
        """
        try:
            return await anyio.to_thread.run_sync(self._run_job, job, abandon_on_cancel=True)
        except BaseException:
            if job.claim.acquire(blocking=False):  # no thread began it: none will
                self._core.end(job)
            raise

    async def _final_hop(self, job: Job, deadline: float, behind: bool) -> Result:
        """Commit the final write in a thread of its own, started now whatever the time.

        Waited for until ``deadline``.  Past it the write goes on: the key
        stays locked and the writer registered with the exit hooks until it
        ends (at exit and on a signal they wait up to ``exit_timeout`` for
        it).  A daemon thread, as trio's workers are, so a hung disk cannot
        hang the exit; it tells the loop of its end itself (a worker waiting
        in ``join`` would outlive the deadline).  ``behind``: a write in
        flight held the writer until the deadline (the message says so).
        """
        close = self._close
        assert close is not None
        results: list[Result] = []
        ended = anyio.Event()
        token = anyio.lowlevel.current_token()

        def run() -> None:
            try:
                results.append(self._run_job(job))
                # Off the loop: a close(2) of a lock file takes milliseconds
                # while thousands of final writes fsync.
                self._core.release_locks()
            finally:
                self._final_thread_ended()
                with contextlib.suppress(Exception):  # the loop may be gone
                    token.backend_class.run_sync_soon(ended.set, (), token.native_token)

        close.thread = threading.Thread(target=run, name="checkpointer-final-write", daemon=True)
        if not self._exit_hooks:  # still, the process waits for it at exit
            _exit.register(self._flush_final, signals=False)
        try:
            close.thread.start()
        except RuntimeError as exc:  # no thread to be had
            close.thread = None
            if job.claim.acquire(blocking=False):
                self._core.end(job)
            why = describe_error(exc)
            return Failed(
                "write-failed",
                f"cannot start a thread for the final write: {why}; nothing was written at close",
            )
        with anyio.move_on_at(deadline):
            await ended.wait()
        if results:
            return results[0]
        if ended.is_set():  # _execute raised: a bug, printed by the thread
            return Failed("write-failed", "the final write raised an internal error")
        limits = self._limits
        return Failed(  # logged by aclose (note_final), at ERROR
            "write-failed",
            f"the final write of {self._store.location(job.key)} did not finish within "
            f"close_timeout={limits.close_timeout}s"
            f"{' (a write in flight held the writer until then)' if behind else ''}; it goes on "
            "in a thread of its own and lands unless the process ends first (the exit hooks "
            f"wait up to exit_timeout={limits.exit_timeout}s for it); the key stays locked "
            "until then",
        )

    def _final_thread_ended(self) -> None:
        with self._phase_lock:
            assert self._close is not None
            self._close.thread = None
            if self._closed or not self._exit_hooks:  # else a close cut short keeps them
                self._remove_hooks()

    def _run_job(self, job: Job) -> Result:
        """In the writing thread: execute ``job`` unless a cancelled waiter dropped it."""
        if not job.claim.acquire(blocking=False):
            return Skipped("unchanged")  # dropped before it began; nobody waits for it
        try:
            return self._core.execute(job)
        finally:
            self._core.end(job)

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
            self._flush(live=True)
        return self

    def close(self) -> Result:
        """Write a final time (``live=False``), let the key go, remove the exit hooks.

        From the moment it begins, ``flush_sync("manual")`` from other threads
        returns ``Skipped("closed")``; a second close returns it too.
        """
        if self._closed or not self._begin_close():
            return Skipped("closed")
        result = self._core.note_final(self._flush(live=False), "at close")
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
        it live.  A second call with nothing changed is
        ``Skipped("unchanged")``.  Once a close has begun:
        ``Skipped("closed")`` (``"exit"`` and ``"signal"`` still write until
        it has ended); in a forked child, for a writer its parent opened:
        ``Skipped("closed")``.

        Raises:
            ValueError: ``reason`` is not one of the three above.
        """
        if reason not in ("manual", "exit", "signal"):
            raise ValueError(f"reason must be 'manual', 'exit' or 'signal', got {reason!r}")
        if self._closed:
            return Skipped("closed")
        return self._flush(live=reason == "manual")

    def _flush_final(self, reason: Literal["exit", "signal"]) -> None:
        """The exit hooks' final write (``_exit.Flush``); at exit the key goes after it.

        While the final write of a close runs in its thread, waits up to
        ``exit_timeout`` for it instead, if the writer is closed or has no
        exit hooks (registered only for this wait).
        """
        thread = None if self._close is None else self._close.thread
        if thread is not None and (self._closed or not self._exit_hooks):
            thread.join(self._limits.exit_timeout)
        elif self._exit_hooks:
            when = "at exit" if reason == "exit" else "on a signal"
            self._core.note_final(self.flush_sync(reason), when)
            if reason == "exit":
                self._release_locks()  # a later write takes them again

    def _flush(self, *, live: bool) -> Result:
        if threading.get_ident() in self._core.busy:
            # Re-entered from a signal handler on the thread that is writing:
            # the flush that follows that write (see _exit) covers this call.
            return Skipped("unchanged")
        job = self._core.prepare(force=False, pin=None, live=live)
        if isinstance(job, Job):
            try:
                return self._core.execute(job, timeout=self._limits.exit_timeout)
            finally:
                self._core.end(job)
        if not live and self._core.keys.to_finish and not self._core.forked():
            self._core.finish(self._limits.exit_timeout)  # source() had no session
        return self._core.account(job, final=not live)

    # -- open/close helpers ----------------------------------------------------

    def _claim_open(self) -> None:
        with self._phase_lock:
            phase = self._core.phase
            if phase >= Phase.CLOSING:
                raise RuntimeError("this CheckpointWriter is closed; create a new one")
            if phase is Phase.OPEN:
                raise RuntimeError("this CheckpointWriter is open already")
            self._core.phase = Phase.OPEN
            self._core.pid = os.getpid()

    def _begin_close(self) -> bool:
        """Claim the close (one, from any thread): ``CLOSING``, where live writes end."""
        with self._phase_lock:
            if self._core.phase >= Phase.CLOSING:
                return False
            self._core.phase = Phase.CLOSING
            return True

    def _shut(self) -> None:
        with self._phase_lock:
            self._core.phase = Phase.CLOSED
            if self._close is None or self._close.thread is None:
                self._remove_hooks()  # else the final write's thread does, as it ends
        self._release_locks()
        self._unsubscribe_all()

    def _open_store(self) -> None:
        try:
            self._store.open()
        except Exception as exc:  # a broken root fails the writes, loudly, later
            logger.warning("checkpointer: could not open %r: %s", self._store, describe_error(exc))

    def _install_hooks(self) -> None:
        if self._exit_hooks:
            _exit.register(self._flush_final)

    def _remove_hooks(self) -> None:
        if not _exit.unregister(self._flush_final):  # off the main thread
            self._timer.call_on_main_loop(_exit.restore_pending)

    def _unsubscribe_all(self) -> None:
        for unsubscribe in list(self._unsubscribes):
            try:
                unsubscribe()
            except Exception as exc:
                logger.warning("checkpointer: unsubscribe failed: %s", describe_error(exc))

    def _release_locks(self) -> None:
        # Not while a write is in flight (a final write past close_timeout):
        # the key stays locked rather than let another writer in under a write
        # that may still land.  After close that write lets it go as it ends;
        # before, it stays locked until the process exits.
        if not self._core.release_locks() and not self._closed:
            logger.warning("checkpointer: a write is still in flight; keeping its key locked")


_CLOSED = Skipped("closed")


@final
@dataclasses.dataclass(eq=False)
class _Close:
    """An ``aclose()`` in progress: what it waits on, and what it gives back."""

    deadline: float  # on anyio's clock: close_timeout from the call
    done: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    result: Result = _CLOSED
    crash: BaseException | None = None  # raised in the close task
    task: object = None  # the running close task: keep a reference
    thread: threading.Thread | None = None  # the final write's, while it runs (_final_hop)


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


async def _acquire_by(lock: anyio.Lock, deadline: float | None) -> bool:
    """Take ``lock`` at once if free, whatever the time; else wait until ``deadline`` (or ever).

    A free lock is never refused for the time the close spent waiting for a
    busy event loop: only a lock held by a write in flight returns False.
    """
    if deadline is None:
        await lock.acquire()
        return True
    with contextlib.suppress(anyio.WouldBlock):
        lock.acquire_nowait()
        return True
    with anyio.move_on_at(deadline):
        await lock.acquire()
        return True
    return False
