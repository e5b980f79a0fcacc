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
import logging
import os
import threading
from collections.abc import Callable
from typing import Any, Generic, Literal, TypeVar, final

import anyio
import anyio.lowlevel

from .. import _exit
from .._schedule import Scheduler
from .._stores.base import ProbingStore, Store
from .._stores.encoding import Transcript
from .._text import describe_error
from .._values import Checkpoint, Limits, Meta, Result, Skipped, Snapshot, WriterStatistics
from .clock import Clock, MonotonicClock
from .closing import Close
from .commit import Committer, Phase
from .keystate import UNKNOWN, Unknown
from .timer import Timer

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
        source: called at write time (on the event loop's thread, or the
            caller's for ``flush_sync``); returns a ``Snapshot(key, state)``,
            or None while the session has no identity (at close, the last
            key's checkpoint is then marked ``live=False`` and the close
            returns ``Skipped("no-identity")``).
        store: where checkpoints go (``FileStore(root)``, ...).
        debounce: quiet seconds after the latest event before a write
            (default 0.5, or ``max_wait`` if less).
        min_interval: least seconds between the starts of two scheduled
            writes (default 1.0, or ``max_wait`` if less); ``write_now``,
            ``flush_sync`` and the final write are exempt.
        max_wait: most seconds the oldest unsaved change waits, however
            steady the stream of events.
        transcript: where an agent state keeps its messages
            (``Transcript("messages")``): each message encoded once, the
            transcript's fingerprint, dangling tool calls closed in the
            written copy, a history a model API would reject refused.
        resume_from: what ``load(store, key)`` returned for this session:
            the ``Checkpoint`` (or its ``Meta``), or None (the key had none).
            A write that would replace another revision than that one (a
            checkpoint another writer stored or deleted since) is then
            ``Failed("conflict")``.  Not given: what the store holds at the
            first write.
        state_version: your state's schema version, stamped on every
            checkpoint (``load(..., state_version=, migrations=)`` migrates
            older ones); a checkpoint of a newer one is never replaced.
        write_on_start: write once on entry so a new session is resumable
            (and claimed) at once.
        exit_hooks: flush at interpreter exit and on SIGTERM/SIGHUP while
            open (signal handlers only when opened on the main thread).
        limits: retry backoff and the close, exit and lock timeouts.
        clock: the clock to read and sleep on (tests inject a fake one).

    Raises:
        ValueError: a duration or ``state_version`` is out of range.
        TypeError: an argument is not usable, or the store cannot refuse a
            stale write (its ``write`` takes no ``expected`` revision: wrap
            it in ``checkpointer.stores.unfenced`` if your program keeps one
            writer per key itself).
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
        self._timer = Timer(self._sched, self._clock, self._core, probe)
        self._events = 0
        self._unsubscribes: list[Callable[[], object]] = []
        # The lifecycle is self._core.phase, moved on under this lock (a close
        # may come from any thread); _close is what an aclose() waits on.
        self._phase_lock = threading.Lock()
        self._close: Close | None = None

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
        return core.record.statistics(
            events=self._events, pending=self._sched.pending, key=core.keys.current
        )

    # -- async lifecycle -------------------------------------------------------

    async def __aenter__(self) -> CheckpointWriter[S]:
        return await self.aopen()

    async def __aexit__(self, *exc_info: object) -> None:
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
        self._timer.bind()  # this event loop: the writes, and notify() waking the timer
        await anyio.to_thread.run_sync(self._open_store)
        self._install_hooks()
        try:
            if self._write_on_start:
                result = await self._timer.write(live=True)
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
        return await self._timer.write(force=force, pin=pin, live=True)

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
        if self._close is not None:  # another task is closing the writer: its result is ours
            with anyio.CancelScope(shield=True):
                await self._close.done.wait()
            return self._close.result
        assert self._timer.bound, "enter the writer with 'async with' first"
        if not self._begin_close():
            return Skipped("closed")  # close() runs in another thread
        self._close = Close(self, anyio.current_time() + self._limits.close_timeout)
        return await self._close.run()

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
            self._core.flush(live=True, timeout=self._limits.exit_timeout)
        return self

    def close(self) -> Result:
        """Write a final time (``live=False``), let the key go, remove the exit hooks.

        From the moment it begins, ``flush_sync("manual")`` from other threads
        returns ``Skipped("closed")``; a second close returns it too.
        """
        if self._closed or not self._begin_close():
            return Skipped("closed")
        result = self._core.record.note_final(
            self._core.flush(live=False, timeout=self._limits.exit_timeout), "at close"
        )
        self._shut()
        return result

    def __enter__(self) -> CheckpointWriter[S]:
        return self.open()

    def __exit__(self, *exc_info: object) -> None:
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
        return self._core.flush(live=reason == "manual", timeout=self._limits.exit_timeout)

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
            self._core.record.note_final(self.flush_sync(reason), when)
            if reason == "exit":
                self._release_locks()  # a later write takes them again

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
