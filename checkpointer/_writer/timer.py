"""The writer on its event loop: each write from the loop, and the timer task.

A write from the loop (``write``) takes the write lock, tells the scheduler
it began and how it ended, and hops to a worker thread.  The timer task
writes when the scheduler says one is due, else sleeps (``wake`` cuts it
short), and during a backoff asks a ``ProbingStore`` whether it answers
again.  It is a task of the event loop's own (``spawn_system_task``), so the
writer may be closed from any task.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import math
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, final

import anyio
import anyio.lowlevel

from .._schedule import IDLE, WRITE, Outcome, Scheduler
from .._text import describe_error
from .._values import Result
from .clock import Clock
from .commit import Committer, Job
from .record import outcome

FinalCommit = Callable[[Job, float, bool], Awaitable[Result]]
"""Commits the final write by a deadline: ``(job, deadline, behind)`` (``Close.commit``)."""

__all__ = ["Timer", "spawn_system_task"]

logger = logging.getLogger("checkpointer")


@final
class Timer:
    """The writes from the event loop of one writer, and its timer task (``probe``: the store's)."""

    def __init__(
        self, sched: Scheduler, clock: Clock, core: Committer, probe: Callable[[], bool] | None
    ) -> None:
        self._sched = sched
        self._clock = clock
        self._now = clock.now
        self._core = core
        self._probe = probe
        self._forked = core.forked
        self._lock: anyio.Lock | None = None  # the write lock, made on the writer's loop
        self._token: anyio.lowlevel.EventLoopToken | None = None
        self._loop_thread: int | None = None
        self._sleep_scope: anyio.CancelScope | None = None
        self._task_ref: object = None  # the running task: keep a reference
        self._scope: anyio.CancelScope | None = None
        self._done: anyio.Event | None = None
        self._crash: BaseException | None = None  # raised in the timer task (trio)

    def bind(self) -> None:
        """Bind to the running event loop: the write lock, and ``threadsafe`` through it."""
        self._token = anyio.lowlevel.current_token()
        self._loop_thread = threading.get_ident()
        # Fast: no extra pass of the event loop per write (the hop yields anyway).
        self._lock = anyio.Lock(fast_acquire=True)

    @property
    def bound(self) -> bool:
        return self._lock is not None

    async def write(
        self,
        *,
        force: bool = False,
        pin: bool | None = None,
        live: bool,
        final: tuple[float, FinalCommit] | None = None,
    ) -> Result:
        """One write from the event loop; ``final``: a close's, by its deadline."""
        lock = self._lock
        if lock is None:
            raise RuntimeError(
                "write_now() needs the writer opened on an event loop ('async with' or "
                "aopen()); a writer opened with open() writes on flush_sync()"
            )
        deadline = math.inf if final is None else final[0]
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
                until = deadline + anyio.current_time() - started
                result: Result
                if isinstance(job, Job):
                    if final is None:
                        result = await self._hop(job)
                    else:
                        result = await final[1](job, until, not locked)
                else:
                    result = self._core.record.account(job, quiet=not live)
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
                        self.wake()
        finally:
            if locked:
                lock.release()

    async def _hop(self, job: Job) -> Result:
        """Commit ``job`` in one worker-thread hop.

        Cancelled, the hop abandons the thread: a job it has begun ends there
        (``Committer.run``); one it has not begun never runs.
        """
        try:
            return await anyio.to_thread.run_sync(self._core.run, job, abandon_on_cancel=True)
        except BaseException:
            self._core.drop(job)
            raise

    def start(self) -> None:
        """Start the timer task on the running event loop."""
        self._scope = anyio.CancelScope()
        self._done = anyio.Event()
        self._task_ref = spawn_system_task(self._task, "checkpointer-timer")

    def cancel(self) -> None:
        """Cancel the timer task, from any thread; it ends the next time it runs (``ended``)."""
        scope, done = self._scope, self._done
        if scope is not None and done is not None and not done.is_set():  # as for wake
            self.threadsafe(scope.cancel)

    async def ended(self) -> None:
        if self._done is not None:
            await self._done.wait()

    def take_crash(self) -> BaseException | None:
        """What the timer task raised on trio (it stopped then), once; None if nothing."""
        crash, self._crash = self._crash, None
        return crash

    async def _task(self) -> None:
        """The timer task: ``_run`` until ``stop`` cancels it."""
        scope, done = self._scope, self._done
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
            # A trio system task must not raise (TrioInternalError): kept for
            # aclose() to raise.  Not Ctrl-C (trio raises it in the program's
            # code): this came from source() or the clock.
            self._crash = exc
            logger.warning(
                "checkpointer: the timer task stopped on %s; aclose() raises it again",
                describe_error(exc),
            )
        finally:
            done.set()

    async def _run(self) -> None:
        while True:
            try:
                now = self._now()
                decision = self._sched.decide(now)
                if decision is WRITE:
                    await self.write(live=True)
                    continue
                delay = math.inf if decision is IDLE else decision.until - now
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

    def wake(self) -> None:
        """Cut the sleep short: the scheduler's answer may have changed.

        A no-op once the task has ended (cancelling its scope would raise on
        asyncio): the change waits for the exit hooks or a close.
        """
        scope, done = self._sleep_scope, self._done
        if scope is not None and done is not None and not done.is_set():
            scope.cancel()

    def wake_soon(self) -> None:
        """``wake()``, from any thread or a signal handler, by the loop the writer is bound to.

        From an asyncio task, through a callback of the loop's rather than now:
        anyio's cancel formats the calling task's repr (tens of µs), which every
        session's first ``notify()`` of a burst would pay.  Elsewhere (another
        thread, a signal handler while the loop waits on its selector, trio
        outside a task) by the loop's thread-safe call, which wakes that wait.
        """
        token = self._token
        if token is None or self._forked():
            return
        loop, here = token.native_token, threading.get_ident() == self._loop_thread
        if here and _on_trio():
            self.wake()
            return
        with contextlib.suppress(Exception):  # the loop has ended
            if not isinstance(loop, asyncio.AbstractEventLoop):
                token.backend_class.run_sync_soon(self.wake, (), loop)
            elif here and asyncio.current_task(loop) is not None:
                loop.call_soon(self.wake)  # the loop goes round before it waits again
            else:
                loop.call_soon_threadsafe(self.wake)

    def call_on_main_loop(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` soon on the writer's event loop if that runs on the main thread."""
        if self._loop_thread == threading.main_thread().ident:
            self.threadsafe(fn)

    def threadsafe(self, fn: Callable[[], object]) -> None:
        """``fn()`` now on the event loop's thread, else soon through the loop.

        Not in a forked child: its copy of the loop is not running.
        """
        token = self._token
        if token is None or self._forked():
            return
        if threading.get_ident() == self._loop_thread:
            fn()
        else:
            with contextlib.suppress(Exception):  # the loop may be gone
                token.backend_class.run_sync_soon(fn, (), token.native_token)


def _on_trio() -> bool:
    trio = sys.modules.get("trio")
    return trio is not None and bool(trio.lowlevel.in_trio_task())


def spawn_system_task(fn: Callable[[], Coroutine[Any, Any, None]], name: str) -> object:
    """Run ``fn()`` in a task of the event loop's own, as anyio does for its own.

    A trio system task (Ctrl-C is kept out of it), else an asyncio task.
    Returns the task: keep a reference.
    """
    if _on_trio():
        import trio

        return trio.lowlevel.spawn_system_task(fn, name=name, context=contextvars.copy_context())
    return asyncio.get_running_loop().create_task(fn(), name=name)


async def _acquire_by(lock: anyio.Lock, deadline: float) -> bool:
    """Take ``lock`` at once if free, whatever the time; else wait until ``deadline``.

    So only a write in flight, not a busy event loop, makes a close give up.
    """
    with contextlib.suppress(anyio.WouldBlock):
        lock.acquire_nowait()
        return True
    with anyio.move_on_at(deadline):
        await lock.acquire()
        return True
    return False
