"""``CheckpointWriter``: the public face of the writer, over its parts.

The timing policy is ``_schedule.py``; the writes from the event loop and
the timer task ``timer.py``; one write ``commit.py``; opening and closing
(and the exit hooks) ``lifecycle.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, Literal, TypeVar, final

import anyio
import anyio.lowlevel

from .._schedule import Scheduler
from .._stores.base import ProbingStore, Store
from .._stores.encoding import Transcript
from .._values import Checkpoint, Limits, Meta, Result, Skipped, Snapshot, WriterStatistics
from .clock import Clock, MonotonicClock
from .commit import Committer, Phase
from .keystate import UNKNOWN, Unknown
from .lifecycle import Lifecycle
from .timer import Timer

__all__ = ["CheckpointWriter"]


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
            raise TypeError(f"store must be a Store (FileStore(root), ...), got {store!r}")
        if transcript is not None and not isinstance(transcript, Transcript):
            raise TypeError(f"transcript must be a Transcript or None, got {transcript!r}")
        if not isinstance(limits, Limits):
            raise TypeError(f"limits must be a Limits(...), got {limits!r}")
        if type(state_version) is not int or state_version < 0:
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
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._now = self._clock.now
        self._core = Committer(source, store, transcript, state_version, limits, resume_from)
        probe = store.probe if isinstance(store, ProbingStore) else None
        self._timer = Timer(self._sched, self._clock, self._core, probe)
        self._life = Lifecycle(self._core, self._timer, store, limits, exit_hooks=exit_hooks)
        self._events = 0

    def __repr__(self) -> str:
        phase = self._core.phase.name.lower()
        return f"<CheckpointWriter {phase} store={self._store!r} key={self._core.keys.current!r}>"

    def notify(self) -> None:
        """Record that the session changed; a write follows per the timing rules.

        O(1), safe from any thread, never raises; a no-op after close.  Once
        the event loop has ended, the change waits for an exit hook or close.
        """
        if self._life.closed:
            return
        self._events += 1
        if self._sched.event(self._now()):
            self._timer.wake_soon()

    def attach(self, subscribe: Subscribe) -> Callable[[], None]:
        """Subscribe ``notify`` to an event source.

        Args:
            subscribe: called once with a callback taking any arguments;
                returns an unsubscribe function, or None.

        Returns:
            A function that unsubscribes (at close too; twice is harmless).
        """
        if not callable(subscribe):
            raise TypeError(f"subscribe must be callable, got {subscribe!r}")
        undo = subscribe(lambda *args, **kwargs: self.notify())
        if undo is not None and not callable(undo):
            raise TypeError(
                f"subscribe() must return an unsubscribe callable or None, got {undo!r}"
            )

        def unsubscribe() -> None:
            try:
                self._life.unsubscribes.remove(unsubscribe)
            except ValueError:
                return  # done already
            if undo is not None:
                undo()

        self._life.unsubscribes.append(unsubscribe)
        return unsubscribe

    def statistics(self) -> WriterStatistics:
        """The writer's counters, as a frozen value."""
        core = self._core
        return core.record.statistics(
            events=self._events, pending=self._sched.pending, key=core.keys.current
        )

    async def __aenter__(self) -> CheckpointWriter[S]:
        return await self.aopen()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aopen(self) -> CheckpointWriter[S]:
        """Open on this event loop: the store, the exit hooks, a first write, the timer.

        ``async with`` calls it; pair it with ``aclose()`` when the writer's
        life is not one block.  A cancel (or error) during the opening closes
        the writer as ``aclose()`` does, then propagates.

        Returns:
            The writer itself.

        Raises:
            RuntimeError: the writer is open already, or closed.
        """
        self._life.claim_open()
        self._timer.bind()  # this event loop: the writes, and notify() waking the timer
        try:
            await anyio.to_thread.run_sync(self._life.open_store)
            self._life.install_hooks()
            if self._write_on_start:
                result = await self._timer.write(live=True)
                if isinstance(result, Skipped) and result.reason == "no-identity":
                    self._sched.event(self._now())  # one retry, through the timer
            if self._core.phase is Phase.OPEN:  # else aclose() came during the first write
                self._timer.start()
        except BaseException:
            # Closed as aclose() closes: a first write still in flight is followed
            # by the final one (live=False), and the key goes once both have ended.
            await self._life.aclose()
            raise
        return self

    async def write_now(self, *, force: bool = False, pin: bool | None = None) -> Result:
        """Write now, ignoring the timers, after any write in flight.

        Cancelled while the store writes, the write goes on in its thread and
        the changes stay pending.

        Args:
            force: write even if the fingerprint says nothing changed.
            pin: sets ``Meta.pinned`` (sticky, part of "changed"); None keeps it.

        Returns:
            ``Written``, ``Skipped`` or ``Failed``; a failed write never raises.

        Raises:
            RuntimeError: the writer was not opened on an event loop.
        """
        if self._life.closed:
            return Skipped("closed")
        return await self._timer.write(force=force, pin=pin, live=True)

    async def aclose(self) -> Result:
        """Stop the timer, wait for a write in flight, write a final time (``live=False``).

        Then the key's lock is let go.  From any task of the writer's loop, in
        any order among writers: shielded from cancellation, bounded by
        ``Limits.close_timeout`` (a final write still running then goes on in
        a thread).  From its start live writes are ``Skipped("closed")``; a
        second call waits for the first and returns its result.  A writer
        opened with ``open()``, or not opened, is closed as ``close()`` does.

        Returns:
            The final write's result; ``Skipped("closed")`` if closed already.

        Raises:
            BaseException: a Ctrl-C that came during the close, once it is
                done; or what the timer task raised on trio (``source()``'s).
        """
        if self._life.closed:
            return Skipped("closed")
        return await self._life.aclose()

    def open(self) -> CheckpointWriter[S]:
        """Open for synchronous use (``with``, or pair with ``close()``): no timer.

        The writer writes on ``flush_sync``, at exit and on SIGTERM/SIGHUP.
        """
        self._life.claim_open()
        self._life.open_store()
        self._life.install_hooks()
        if self._write_on_start:
            self._core.flush(live=True)
        return self

    def close(self) -> Result:
        """Stop the timer, write a final time (``live=False``), let the key go, remove the hooks.

        From its start ``flush_sync("manual")`` is ``Skipped("closed")``; a second ``close()``
        while it runs waits for it and returns its result, after it ``Skipped("closed")``.
        """
        return self._life.close_sync()

    def __enter__(self) -> CheckpointWriter[S]:
        return self.open()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def _write_final(self) -> Result:
        """``write_now()`` as a close's final write (``live=False``), the writer left open:
        a ``SessionRegistry`` closes a key only once its state is stored."""
        return await self._timer.write(live=False)

    def _detach(self) -> None:
        """Hold no lock, nor its descriptor, between writes until one lands: for a
        ``SessionRegistry`` keeping the key open while its store fails.  A write in flight
        lets go of it as it ends (``Committer.execute``)."""
        self._core.detached = True
        self._core.release_locks()

    def flush_sync(self, reason: Literal["manual", "exit", "signal"] = "manual") -> Result:
        """Write the current state now, synchronously, from any thread; never raises for a failure.

        For atexit hooks, signal handlers and scripts.  ``"exit"`` and
        ``"signal"`` mark the checkpoint ``live=False``.  ``Skipped("closed")``
        once a close has begun (``"exit"`` and ``"signal"`` still write until
        it ends), and in a forked child for a writer its parent opened.

        Raises:
            ValueError: ``reason`` is not ``"manual"``, ``"exit"`` or ``"signal"``.
        """
        if reason not in ("manual", "exit", "signal"):
            raise ValueError(f"reason must be 'manual', 'exit' or 'signal', got {reason!r}")
        if self._life.closed:
            return Skipped("closed")
        return self._core.flush(live=reason == "manual")
