"""The checkpoint writer: a service object that carries out the scheduler.

How a write flows (one write at a time):

1. On the caller's thread (the event loop for the async path): the
   scheduler marks the pending changes covered, ``source()`` is called,
   the key is checked, the caller's fingerprint compared, and the store
   stages the state (``_codec.py``: encodes it, or only what is new).
   msgspec holds the GIL while it encodes, so doing this in a worker
   thread would not spare the loop (``../shared/FACTS.md``).
2. In one worker-thread hop (``anyio.to_thread.run_sync``) or directly for
   ``flush_sync``: under the writer's I/O lock the job is checked against
   what is on disk (generation, content digest, live and pinned flags), the
   meta is built, and the store commits the staged state durably.

Every job carries a generation number taken before ``source()`` runs; the
I/O lock and a per-key "newest generation on disk" make sure an older
snapshot never replaces a newer one, whichever thread writes it (a signal
handler's flush can overtake a write in a worker thread).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Generic, Literal, TypeVar, final

import anyio
import anyio.abc
import anyio.lowlevel
import msgspec

from . import _exit
from ._clock import Clock, MonotonicClock
from ._codec import Staged, state_store
from ._format import CheckpointError, Meta, Snapshot
from ._lock import KeyLocked, KeyLocks
from ._results import Failed, Result, Skipped, WriterStatistics, Written
from ._schedule import IDLE, WRITE, Outcome, Scheduler
from ._session import Prepare, Prepared, run_prepare, session_meta
from ._stores import ProbingStore, Store

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
        "content",
        "created_at",
        "live",
        "newest_gen",
        "pin",
        "pinned",
        "resolved",
        "seq",
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


@final
class _Job:
    __slots__ = ("content", "force", "gen", "key", "live", "prepared", "staged", "started")

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
        close_timeout: bound, in seconds, on the final write when closing.
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
        self._key: str | None = None
        self._to_finish: set[str] = set()
        self._io_lock = threading.Lock()
        self._snapshot_lock = threading.Lock()  # generation + source() + encode
        self._busy: set[int] = set()  # threads inside _io(), see _exit
        self._inflight = False  # an async job is between prepare and commit
        # key -> (generation, meta, staged state) of an exit flush that wrote
        # without the I/O lock because a worker's write hung past exit_timeout
        # (see _execute).
        self._overtaking: dict[str, tuple[int, Meta, Staged]] = {}
        self._unsubscribes: list[Callable[[], object]] = []

        self._token: anyio.lowlevel.EventLoopToken | None = None
        self._loop_thread: int | None = None
        self._write_lock: anyio.Lock | None = None
        self._sleep_scope: anyio.CancelScope | None = None
        self._task_group: anyio.abc.TaskGroup | None = None

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
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group
        try:
            if self._write_on_start:
                await self._start_write()
            task_group.start_soon(self._run, name="checkpointer-timer")
        except BaseException:
            task_group.cancel_scope.cancel()
            await task_group.__aexit__(None, None, None)
            self._task_group = None
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

        The final write marks the checkpoint ``live=False``.  Shielded from
        cancellation and bounded by ``close_timeout``; call it from the task
        that entered the writer (``async with`` does).  Idempotent.

        Returns:
            The result of the final write (``Skipped("closed")`` if the
            writer was closed already).
        """
        if self._closed:
            return Skipped("closed")
        result: Result = Skipped("closed")
        task_group, self._task_group = self._task_group, None
        try:
            if task_group is not None:  # the timer task; it abandons a write in flight
                task_group.cancel_scope.cancel()
                try:
                    await task_group.__aexit__(None, None, None)
                except BaseExceptionGroup as group:
                    # trio raises Ctrl-C's KeyboardInterrupt in whatever task
                    # runs, possibly our timer task: hand it on as it came,
                    # not wrapped in the group of a task group users never see.
                    raise _sole(group) from None
        finally:
            result = await self._final_write()
        return result

    async def _final_write(self) -> Result:
        # The I/O lock makes this wait for a write the timer abandoned.
        result: Result = Skipped("closed")
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(self._close_timeout) as scope:
                result = await self._write_async(force=False, pin=None, live=False)
            if scope.cancelled_caught:
                result = Failed(
                    "write-failed",
                    f"the final write did not finish within close_timeout={self._close_timeout}s",
                )
                logger.warning("checkpointer: %s; it may still complete", result.error)
            # Releasing a lock may be I/O (a database round trip for a
            # networked store): not on the event loop's thread.
            with anyio.move_on_after(self._close_timeout):
                await anyio.to_thread.run_sync(self._release_locks, abandon_on_cancel=True)
            self._shut()
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
            changes stay pending.
        """
        if self._closed:
            return Skipped("closed")
        return await self._write_async(force=force, pin=pin, live=True)

    async def _start_write(self) -> None:
        result = await self._write_async(force=False, pin=None, live=True)
        if isinstance(result, Skipped) and result.reason == "no-identity":
            self._sched.event(self._now())  # one retry, through the timer

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
        if token is None or self._task_group is None:
            return
        if threading.get_ident() == self._loop_thread:
            self._wake()
            return
        with contextlib.suppress(Exception):  # the loop may be gone
            token.backend_class.run_sync_soon(self._wake, (), token.native_token)

    async def _write_async(self, *, force: bool, pin: bool | None, live: bool) -> Result:
        assert self._write_lock is not None, "enter the writer with 'async with' first"
        async with self._write_lock:
            self._sched.begin_write(self._now())
            outcome = Outcome.CANCELLED
            try:
                job = self._prepare(force=force, pin=pin, live=live)
                if isinstance(job, _Job):
                    self._inflight = True
                    try:
                        result = await anyio.to_thread.run_sync(
                            self._execute, job, abandon_on_cancel=True
                        )
                    finally:
                        self._inflight = False
                else:
                    result = self._account(job)
                outcome = _outcome(result)
                return result
            finally:
                self._sched.end_write(self._now(), outcome)
                if self._sched.pending:
                    # The timer saw this write in flight and sleeps until woken.
                    self._wake()

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
        """Write a final time (``live=False``) and remove the exit hooks."""
        if self._closed:
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
        ``Skipped("unchanged")``.  After close: ``Skipped("closed")``.

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

    def _busy_on(self, thread_id: int) -> bool:
        return thread_id in self._busy

    def _flush(self, *, force: bool, live: bool) -> Result:
        if self._busy_on(threading.get_ident()):
            # Re-entered from a signal handler on the thread that is writing:
            # the flush that follows that write (see _exit) covers this call.
            return Skipped("unchanged")
        job = self._prepare(force=force, pin=None, live=live)
        if isinstance(job, _Job):
            return self._execute(job, timeout=self._exit_timeout)
        return self._account(job)

    # -- open/close helpers -------------------------------------------------

    def _claim_open(self) -> None:
        if self._closed:
            raise RuntimeError("this CheckpointWriter is closed; create a new one")
        if self._opened:
            raise RuntimeError("this CheckpointWriter is open already")
        self._opened = True

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
        # Not while a write is in flight (a final write past close_timeout):
        # that key stays locked until the process exits rather than let
        # another writer in under a write that may still land.
        if self._io_lock.acquire(blocking=False):
            try:
                self._locks.release_all()
            finally:
                self._io_lock.release()
        else:
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
                and self._unchanged(state, content, live)
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
        return _Job(
            gen=gen,
            key=key,
            staged=staged,
            content=content,
            live=live,
            force=force,
            started=started,
            prepared=prepared,
        )

    @staticmethod
    def _unchanged(state: _KeyState, content: object, live: bool) -> bool:
        pinned = state.pin if state.pin is not None else state.pinned
        return (
            state.content is not None
            and state.content == content
            and state.live == live
            and state.pinned == pinned
        )

    def _execute(self, job: _Job, timeout: float = -1) -> Result:
        """Write a prepared job; blocking, under the I/O lock."""
        with self._io(timeout) as locked:
            self._finish_keys()
            state = self._keys[job.key]
            if job.gen < state.newest_gen:
                return self._account(Skipped("unchanged"))  # a newer snapshot is on disk
            taken = self._locks.acquire(job.key, self._store.location(job.key))
            if isinstance(taken, Failed):
                return self._account(taken)
            if taken:  # others may have written the key since we last held it: re-read
                state.resolved, state.content, state.live = False, None, None
            content = job.content
            if content is _NO_FINGERPRINT:
                content = job.staged.content()
            try:
                if not state.resolved:
                    self._resolve(job.key, state)
            except Exception as exc:
                return self._account(
                    Failed(
                        "write-failed",
                        f"cannot read {self._store.location(job.key)}: {_one_line(exc)}",
                    )
                )
            if not job.force and self._unchanged(state, content, job.live):
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
                nbytes = self._states.commit(job.key, meta, job.staged)
            except KeyLocked as exc:  # a networked store lost its lock and could not retake it
                return self._account(Failed("locked", str(exc)))
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

    def _resolve(self, key: str, state: _KeyState) -> None:
        """Learn seq, created_at and pinned from the checkpoint already stored."""
        try:
            meta = self._states.read_meta(key)
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
                    raise CheckpointError(
                        self._store.location(key),
                        f"holds state version {meta.state_version}, newer than this writer's "
                        f"{self._state_version}; not replacing it (upgrade, or use another key)",
                    )
                state.seq = meta.seq
                state.created_at = meta.created_at
                state.pinned = meta.pinned
        state.resolved = True

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
            if self._streak == 1:
                logger.warning(
                    "checkpointer: checkpoint failed (%s): %s; retrying with backoff",
                    result.reason,
                    result.error,
                )
        return result


def _finished(old: Meta) -> Meta:
    return msgspec.structs.replace(old, seq=old.seq + 1, updated_at=_utcnow(), live=False)


def _sole(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception inside ``group`` (nested groups flattened), else the group."""
    leaves: list[BaseException] = []
    stack: list[BaseException] = [group]
    while stack:
        exc = stack.pop()
        if isinstance(exc, BaseExceptionGroup):
            stack.extend(exc.exceptions)
        else:
            leaves.append(exc)
    return leaves[0] if len(leaves) == 1 else group


def _outcome(result: Result) -> Outcome:
    if isinstance(result, Written):
        return Outcome.WRITTEN
    if isinstance(result, Skipped):
        return Outcome.SKIPPED
    return Outcome.STORE_FAILED if result.reason == "write-failed" else Outcome.FAILED
