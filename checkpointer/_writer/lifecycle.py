"""A writer's lifecycle: one ``Phase``, moved on under one lock, and what it waits on.

``NEW`` -> ``OPEN`` -> ``CLOSING`` -> ``CLOSED``; each move takes or lets go
of the exit hooks, the key locks, the subscriptions.  A close on the event
loop (``Close``) runs in a task of the loop's own, so what interrupts the
caller (asyncio's runner cancels natively on Ctrl-C, through any shield;
trio raises KeyboardInterrupt) cannot cut it short.  It is bounded by
``close_timeout``; its commit runs in a daemon thread that may outlive it,
the key locked and the exit hooks waiting until that write has ended.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Literal, final

import anyio
import anyio.lowlevel

from .. import _exit
from .._stores.base import Store
from .._text import describe_error
from .._values import Failed, Limits, Result, Skipped
from .commit import Committer, Job, Phase
from .timer import Timer, spawn_system_task

__all__ = ["Close", "Lifecycle"]

logger = logging.getLogger("checkpointer")


@final
class Lifecycle:
    """The lifecycle of one writer: its phase (``core.phase``) and what follows each move."""

    def __init__(
        self, core: Committer, timer: Timer, store: Store, limits: Limits, *, exit_hooks: bool
    ) -> None:
        self._core = core
        self._timer = timer
        self._store = store
        self._limits = limits
        self._exit_hooks = exit_hooks
        self._lock = threading.Lock()  # a move may come from any thread
        self.close: Close | None = None  # an aclose() in progress
        self._closing: Future[Result] | None = None  # a close_sync() in progress: its result
        self.unsubscribes: list[Callable[[], object]] = []

    @property
    def closed(self) -> bool:
        return self._core.phase is Phase.CLOSED

    def claim_open(self) -> None:
        """``NEW`` -> ``OPEN``; RuntimeError if the writer is open already, or closed."""
        with self._lock:
            phase = self._core.phase
            if phase >= Phase.CLOSING:
                raise RuntimeError("this CheckpointWriter is closed; create a new one")
            if phase is Phase.OPEN:
                raise RuntimeError("this CheckpointWriter is open already")
            self._core.phase = Phase.OPEN
            self._core.pid = os.getpid()

    def open_store(self) -> None:
        try:
            self._store.open()
        except Exception as exc:  # a broken root fails the writes, loudly, later
            logger.warning("checkpointer: could not open %r: %s", self._store, describe_error(exc))

    def install_hooks(self) -> None:
        if self._exit_hooks:
            _exit.register(self.flush_final)

    def begin_close(self, closing: Future[Result] | None = None) -> bool:
        """Claim the close (one, from any thread): ``CLOSING``, where live writes end."""
        with self._lock:
            if self._core.phase >= Phase.CLOSING:
                return False
            self._core.phase = Phase.CLOSING
            self._closing = closing
            return True

    def close_sync(self) -> Result:
        """The close on this thread; or, one in progress, its result once it is done."""
        closing: Future[Result] = Future()
        if not self.begin_close(closing):
            other = self._closing
            return Skipped("closed") if other is None or self.closed else other.result()
        self._timer.cancel()  # an aopen()ed writer's timer task, from any thread
        result: Result = Skipped("closed")  # if flush raised a BaseException
        try:
            result = self._core.flush(live=False)
        except Exception as exc:
            result = _raised(exc)
        finally:
            self.shut()
            closing.set_result(self._core.record.note_final(result, "at close"))
        return closing.result()

    async def aclose(self) -> Result:
        """The close on the event loop, in a task of its own (``Close``), waited out.

        Or the result of the one in progress.  Raises what interrupted the
        wait, once the close is done, or what the close or timer task raised.
        A writer not opened on an event loop (``open()``, or not at all) is
        closed as ``close()`` closes it, in a worker thread.
        """
        if self.close is not None:  # another task is closing the writer: its result is ours
            with anyio.CancelScope(shield=True):
                await self.close.done.wait()
            return self.close.result
        if not self._timer.bound or not self.begin_close():  # or close() is closing it
            result = await anyio.to_thread.run_sync(self.close_sync)
            _exit.restore_pending()  # the signal handlers, if this is the main thread
            return result
        close = self.close = Close(self, anyio.current_time() + self._limits.close_timeout)
        close.task = spawn_system_task(close.run, "checkpointer-close")
        interrupted = await _wait_through(close.done)
        if interrupted is not None:
            raise interrupted
        crash = close.crash if close.crash is not None else self._timer.take_crash()
        if crash is not None:
            raise crash
        return close.result

    def shut(self) -> None:
        """``CLOSED``: let the exit hooks, the key locks and the subscriptions go."""
        with self._lock:
            self._core.phase = Phase.CLOSED
            if self.close is None or self.close.thread is None:
                self._remove_hooks()  # else the final write's thread does, as it ends
        self.release_locks()
        self.unsubscribe_all()

    def flush_final(self, reason: Literal["exit", "signal"]) -> None:
        """The exit hooks' final write (``_exit.Flush``); at exit the key goes after it.

        While a close's final write runs in its thread, and the writer is
        closed or without exit hooks: waits up to ``exit_timeout`` for it.
        """
        thread = None if self.close is None else self.close.thread
        if thread is not None and (self.closed or not self._exit_hooks):
            if thread.ident is not None:  # a signal may land before it starts
                thread.join(self._limits.exit_timeout)
        elif self._exit_hooks and not self.closed:
            when = "at exit" if reason == "exit" else "on a signal"
            self._core.record.note_final(self._core.flush(live=False), when)
            if reason == "exit":
                self.release_locks()  # a later write takes them again

    def release_locks(self) -> None:
        # Not under a write in flight, which may still land: after close it
        # lets the key go as it ends; before, the key stays locked until exit.
        if not self._core.release_locks() and not self.closed:
            logger.warning("checkpointer: a write is still in flight; keeping its key locked")

    def unsubscribe_all(self) -> None:
        for unsubscribe in list(self.unsubscribes):
            try:
                unsubscribe()
            except Exception as exc:
                logger.warning("checkpointer: unsubscribe failed: %s", describe_error(exc))

    def _remove_hooks(self) -> None:
        if not _exit.unregister(self.flush_final):  # off the main thread
            self._timer.call_on_main_loop(_exit.restore_pending)

    def _final_thread_ended(self) -> None:
        with self._lock:
            assert self.close is not None
            self.close.thread = None
            if self.closed or not self._exit_hooks:  # else a close cut short keeps them
                self._remove_hooks()


@final
class Close:
    """An ``aclose()`` in progress: the close task, what it waits on, what it gives back."""

    def __init__(self, life: Lifecycle, deadline: float) -> None:
        self._life = life
        self.deadline = deadline  # on anyio's clock: close_timeout from the call
        self.done = anyio.Event()
        self.result: Result = Skipped("closed")
        self.thread: threading.Thread | None = None  # the final write's, while it runs
        self.crash: BaseException | None = None  # raised in the close task
        self.task: object = None  # the running close task: keep a reference

    async def run(self) -> None:
        """The close task: stop the timer, write ``live=False``, let the key go, shut.

        Cut short (the loop shutting down), the exit hooks stay and write it.
        """
        life, timer = self._life, self._life._timer
        cut_short = False
        try:
            with anyio.CancelScope(shield=True):  # trio: through the loop's shutdown too
                # Cancelled, not waited for: a timer write in flight abandons its
                # hop and lets the write lock go when the timer task next runs.
                timer.cancel()
                try:
                    result = await timer.write(live=False, final=(self.deadline, self.commit))
                except Exception as exc:  # prepare, on the loop: a store's validate_key, ...
                    result = _raised(exc)
                life._core.phase = Phase.CLOSED  # a write in flight lets the key go as it ends
                # Releasing a lock may be a network round trip: not on the loop's
                # thread.  Past the deadline, shut() releases them on the loop.
                with anyio.move_on_at(self.deadline):
                    await anyio.to_thread.run_sync(life.release_locks, abandon_on_cancel=True)
                with anyio.move_on_at(self.deadline):  # for take_crash: what the timer raised
                    await timer.ended()
                self.result = life._core.record.note_final(result, "at close")
        except anyio.get_cancelled_exc_class():
            cut_short = not life.closed  # the loop is shutting down (asyncio): the exit hooks write
            raise
        except BaseException as exc:  # a task of the loop's own must not raise (trio)
            self.crash = exc
        finally:
            (life.unsubscribe_all if cut_short else life.shut)()
            self.done.set()

    async def commit(self, job: Job, deadline: float, behind: bool) -> Result:
        """Commit the final write in a thread of its own, waited for until ``deadline``.

        A daemon thread, as trio's workers are, so a hung disk cannot hang the
        exit; it tells the loop of its end itself (a worker waiting in ``join``
        would outlive the deadline).  ``behind``: a write in flight held the
        writer until the deadline.
        """
        life = self._life
        core = life._core
        results: list[Result] = []
        ended = anyio.Event()
        token = anyio.lowlevel.current_token()

        def run() -> None:
            try:
                results.append(core.run(job))
                # Off the loop: a close(2) of a lock file takes milliseconds
                # while thousands of final writes fsync.
                core.release_locks()
            finally:
                life._final_thread_ended()
                with contextlib.suppress(Exception):  # the loop may be gone
                    token.backend_class.run_sync_soon(ended.set, (), token.native_token)

        self.thread = threading.Thread(target=run, name="checkpointer-final-write", daemon=True)
        if not life._exit_hooks:  # still, the process waits for it at exit
            _exit.register(life.flush_final, signals=False)
        try:
            self.thread.start()
        except RuntimeError as exc:  # no thread to be had
            self.thread = None
            core.drop(job)
            why = f"cannot start a thread for the final write: {describe_error(exc)}"
            return Failed("write-failed", f"{why}; nothing was written at close")
        with anyio.move_on_at(deadline):
            await ended.wait()
        if results:
            return results[0]
        if ended.is_set():  # execute raised: a bug, printed by the thread
            return Failed("write-failed", "the final write raised an internal error")
        limits = life._limits
        return Failed(  # logged by aclose (note_final), at ERROR
            "write-failed",
            f"the final write of {life._store.location(job.key)} did not finish within "
            f"close_timeout={limits.close_timeout}s"
            f"{' (a write in flight held the writer until then)' if behind else ''}; it goes on "
            "in a thread of its own and lands unless the process ends first (the exit hooks "
            f"wait up to exit_timeout={limits.exit_timeout}s for it); the key stays locked "
            "until then",
        )


def _raised(exc: Exception) -> Failed:
    """A final write that raised: a failure, a value as any other, and the close ends."""
    return Failed("write-failed", f"the final write raised {describe_error(exc)}")


async def _wait_through(done: anyio.Event) -> BaseException | None:
    """Wait for ``done`` through one interruption (a native asyncio cancel, which passes
    any anyio shield, or trio's KeyboardInterrupt); return it, or None.  A second is raised.
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
