"""How a writer closes on its event loop: the final write of ``aclose()``.

The close runs in a task of the loop's own, so what interrupts the caller
cannot cut it short (asyncio's runner cancels the main task on Ctrl-C
natively, through any anyio shield; trio raises KeyboardInterrupt at the
caller's next cancellation point): the caller waits it out.  Its waits are
bounded by ``close_timeout`` from the call.  Its commit runs in a daemon
thread of its own that may outlive the close: the key stays locked, and the
writer registered with the exit hooks, until that write has ended.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Any, final

import anyio
import anyio.lowlevel

from .. import _exit
from .._text import describe_error
from .._values import Failed, Result, Skipped
from .commit import Job, Phase
from .timer import spawn_system_task

if TYPE_CHECKING:
    from .service import CheckpointWriter

__all__ = ["Close"]


@final
class Close:
    """An ``aclose()`` in progress: the close task, what it waits on, what it gives back."""

    def __init__(self, writer: CheckpointWriter[Any], deadline: float) -> None:
        self._writer = writer
        self.deadline = deadline  # on anyio's clock: close_timeout from the call
        self.done = anyio.Event()
        self.result: Result = Skipped("closed")
        self.thread: threading.Thread | None = None  # the final write's, while it runs
        self._crash: BaseException | None = None  # raised in the close task
        self._task: object = None  # the running close task: keep a reference

    async def run(self) -> Result:
        """Start the close task and wait for it; raise what interrupted or crashed it."""
        self._task = spawn_system_task(self._run, "checkpointer-close")
        interrupted = await _wait_through(self.done)
        if interrupted is not None:
            raise interrupted
        crash = self._crash if self._crash is not None else self._writer._timer.take_crash()
        if crash is not None:
            raise crash
        return self.result

    async def _run(self) -> None:
        """The close task: the final write, then ``done``."""
        try:
            with anyio.CancelScope(shield=True):  # trio: through the loop's shutdown too
                result = await self._final_write()
                self.result = self._writer._core.record.note_final(result, "at close")
        except anyio.get_cancelled_exc_class():
            raise  # the event loop is shutting down (asyncio); the exit hooks write
        except BaseException as exc:  # a task of the loop's own must not raise (trio)
            self._crash = exc
        finally:
            self.done.set()

    async def _final_write(self) -> Result:
        """Stop the timer, write ``live=False``, let the key go, shut.

        Cut short (the event loop shutting down under it), the exit hooks
        stay: they write the final checkpoint at exit or on SIGTERM.
        """
        writer = self._writer
        ended = False
        try:
            # Cancelled, not waited for: a timer write in flight abandons its
            # hop and lets the write lock go when the timer task next runs.
            writer._timer.cancel()
            result = await writer._timer.write(live=False, close=self)
            ended = True
            writer._core.phase = Phase.CLOSED  # a write in flight lets the key go as it ends
            # Releasing a lock may be a network round trip: not on the loop's
            # thread.  Past the deadline, _shut releases them on the loop.
            with anyio.move_on_at(self.deadline):
                await anyio.to_thread.run_sync(writer._release_locks, abandon_on_cancel=True)
            with anyio.move_on_at(self.deadline):  # for take_crash: what the timer task raised
                await writer._timer.stop()
        finally:
            if ended:
                writer._shut()
            else:
                writer._unsubscribe_all()
        return result

    async def commit(self, job: Job, deadline: float, *, behind: bool) -> Result:
        """Commit the final write in a thread of its own, started now whatever the time.

        Waited for until ``deadline``; past it the write goes on, and the
        exit hooks wait up to ``exit_timeout`` for it.  A daemon thread, as
        trio's workers are, so a hung disk cannot hang the exit; it tells the
        loop of its end itself (a worker waiting in ``join`` would outlive the
        deadline).  ``behind``: a write in flight held the writer until the
        deadline (the message says so).
        """
        writer = self._writer
        core = writer._core
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
                self._thread_ended()
                with contextlib.suppress(Exception):  # the loop may be gone
                    token.backend_class.run_sync_soon(ended.set, (), token.native_token)

        self.thread = threading.Thread(target=run, name="checkpointer-final-write", daemon=True)
        if not writer._exit_hooks:  # still, the process waits for it at exit
            _exit.register(writer._flush_final, signals=False)
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
        limits = writer._limits
        return Failed(  # logged by aclose (note_final), at ERROR
            "write-failed",
            f"the final write of {writer._store.location(job.key)} did not finish within "
            f"close_timeout={limits.close_timeout}s"
            f"{' (a write in flight held the writer until then)' if behind else ''}; it goes on "
            "in a thread of its own and lands unless the process ends first (the exit hooks "
            f"wait up to exit_timeout={limits.exit_timeout}s for it); the key stays locked "
            "until then",
        )

    def _thread_ended(self) -> None:
        writer = self._writer
        with writer._phase_lock:
            self.thread = None
            if writer._closed or not writer._exit_hooks:  # else a close cut short keeps them
                writer._remove_hooks()


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
