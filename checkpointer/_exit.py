"""Exit hooks: flush every open writer from atexit and from SIGTERM/SIGHUP.

* A signal Python does not handle skips atexit, so SIGTERM and SIGHUP get a handler
  that writes, then chains so the exit status stays the same: a previous Python
  handler is called, "ignore" kept, else the default restored and the signal raised
  again (not in a container's PID 1, which the default action does not end).
  SIGINT is left to asyncio's and trio's Ctrl-C handling.
* A handler that lands inside a write (``busy()``) whose lock the flush needs is
  deferred until the write ends, rather than deadlock.
* Handlers go in with the first writer opened on the main thread and the replaced
  ones come back with the last one gone (``restore_pending`` off the main thread),
  unless another was installed over ours; each remembers what it replaced.
* A forked child forgets the parent's writers and restores the old handlers, so a
  child with no writer dies of SIGTERM in the kernel (a blocked ``multiprocessing``
  worker would otherwise hang ``Pool.terminate()``); the forking thread holds our
  signals pending across the fork.  A process dying of a signal SIGTERMs its daemonic
  ``multiprocessing`` children after the flush, as an exit does, and a child forked
  meanwhile sends itself the signal it missed.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, Literal

__all__ = [
    "Flush",
    "busy",
    "busy_here",
    "register",
    "restore_pending",
    "unregister",
]

logger = logging.getLogger("checkpointer")

HANDLED_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGHUP)

Flush = Callable[[Literal["exit", "signal"]], None]
"""A writer's final write at interpreter exit or in a signal handler (the process dies next)."""

# Insertion-ordered and O(1) to add and remove: an agent server opens and
# closes thousands of writers.  One atexit hook flushes them, newest first.
_writers: dict[Flush, None] = {}
_atexit_hooked = False
_MISSING: Any = object()
_deferred: list[tuple[_Handler, int]] = []
_registry_lock = threading.Lock()  # never taken inside a signal handler
_busy: dict[int, int] = {}  # thread id -> writes and store calls in progress on it
_restore_wanted = False  # the last writer left off the main thread: see restore_pending
_dying = 0  # the signal this process dies of once its writers are flushed


class _Handler:
    """Our handler for a signal, installed on top of ``previous``."""

    __slots__ = ("previous",)

    def __init__(self, previous: Any) -> None:
        self.previous = previous

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        global _dying
        previous = self.previous
        if previous in (signal.SIG_DFL, None):  # None: a handler not installed from Python
            # The default action ends the process, but for the init of a PID namespace (a
            # container's PID 1), which the kernel spares: it goes on, as if it ignored it.
            previous = signal.SIG_IGN if os.getpid() == 1 else signal.SIG_DFL
        if previous is signal.SIG_DFL:  # it dies of the signal after the flush
            _dying = signum
        if busy_here():  # inside a write: handled as it ends
            _deferred.append((self, signum))
            return
        for flush in list(_writers):
            flush("signal")
        if previous is signal.SIG_DFL:
            _end_daemonic_children()
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        elif callable(previous):
            previous(signum, frame)


def _end_daemonic_children() -> None:
    """SIGTERM the daemonic ``multiprocessing`` children, as an exit does (a signal's skips it)."""
    mp = sys.modules.get("multiprocessing")
    for child in [] if mp is None else mp.active_children():
        if child.daemon:
            child.terminate()


def _flush_all_at_exit() -> None:
    """The one atexit hook: flush every writer still registered, the newest first.

    Isolated as atexit isolates its callbacks: an exception is reported; a
    KeyboardInterrupt lets the others flush first, then is raised again.
    """
    interrupted: BaseException | None = None
    for flush in reversed(list(_writers)):
        if flush not in _writers:  # an earlier flush may have closed this one
            continue
        try:
            flush("exit")
        except Exception:  # as atexit would: report it, and flush the others
            logger.exception("checkpointer: an exit flush raised")
        except BaseException as exc:  # Ctrl-C, SystemExit: the others first
            if interrupted is None:
                interrupted = exc
    if interrupted is not None:
        raise interrupted


def register(flush: Flush, *, signals: bool = True) -> None:
    """Call ``flush`` at exit and on SIGTERM/SIGHUP until ``unregister``.

    ``signals`` False installs no handler for it (``Lifecycle.flush_final``).
    """
    global _restore_wanted, _atexit_hooked
    with _registry_lock:
        _writers[flush] = None
        if not _atexit_hooked:
            atexit.register(_flush_all_at_exit)
            _atexit_hooked = True
        if not signals:
            return
        _restore_wanted = False  # our handlers are in use again
        if threading.current_thread() is threading.main_thread():
            for signum in HANDLED_SIGNALS:
                current = signal.getsignal(signum)
                if not isinstance(current, _Handler):
                    signal.signal(signum, _Handler(current))


def unregister(flush: Flush) -> bool:
    """Undo ``register``; restore the signal handlers we replaced if we can.

    False if they are still to be restored on the main thread (the last
    writer left from another): the caller may have ``restore_pending`` run
    there, else the main thread's next register, unregister or write does.
    """
    global _restore_wanted
    with _registry_lock:
        if _writers.pop(flush, _MISSING) is _MISSING:
            return not _restore_wanted
        if _writers:
            return True
        if threading.current_thread() is not threading.main_thread():
            _restore_wanted = True
            return False
        _restore_handlers()
        return True


def restore_pending() -> None:
    """On the main thread: restore the handlers a last writer left off it could not.

    Not while the registry is busy (maybe this thread's, under a signal).
    """
    if not _restore_wanted or threading.current_thread() is not threading.main_thread():
        return
    if not _registry_lock.acquire(blocking=False):
        return
    try:
        if _restore_wanted and not _writers:
            _restore_handlers()
    finally:
        _registry_lock.release()


def _restore_handlers() -> None:
    """Put back the handlers ours replaced (main thread, under the registry lock)."""
    global _restore_wanted
    _restore_wanted = False
    for signum in HANDLED_SIGNALS:
        current = signal.getsignal(signum)
        if isinstance(current, _Handler):
            previous = current.previous
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)


@contextlib.contextmanager
def busy() -> Iterator[None]:
    """Mark a write or a store call on this thread: a signal landing meanwhile waits for its end.

    For a call holding a lock a flush needs; the signal is handled as the
    outermost call returns.
    """
    me = threading.get_ident()
    _busy[me] = _busy.get(me, 0) + 1
    try:
        yield
    finally:
        depth = _busy[me] - 1
        if depth:
            _busy[me] = depth
        else:
            del _busy[me]
            restore_pending()
            while _deferred and threading.current_thread() is threading.main_thread():
                handler, signum = _deferred.pop(0)
                handler(signum, None)


def busy_here() -> bool:
    """Whether this thread is inside a write or a store call (``busy``)."""
    return threading.get_ident() in _busy


# -- forks ------------------------------------------------------------------------

_fork_mask = threading.local()  # the forking thread's mask of our signals before the fork


def _block_for_fork() -> None:
    """Hold our signals pending in the forking thread until the hooks after the fork.

    CPython drops a signal caught before the child reset its signal state: a
    SIGTERM to a worker of a pool ended as soon as made would be lost.
    """
    _fork_mask.blocked = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED_SIGNALS)


def _unblock_after_fork() -> None:
    """Undo ``_block_for_fork``: a signal held meanwhile is delivered now."""
    blocked = getattr(_fork_mask, "blocked", None)
    if blocked is not None:
        del _fork_mask.blocked
        signal.pthread_sigmask(signal.SIG_UNBLOCK, set(HANDLED_SIGNALS) - blocked)


def _after_fork_in_child() -> None:
    """Forget the parent's writers and take our handlers down (the child has no writer).

    A fresh registry lock, in case another thread held it at the fork.
    """
    global _registry_lock
    _registry_lock = threading.Lock()
    _writers.clear()  # the one atexit hook stays: with no writer it does nothing
    _deferred.clear()
    _restore_handlers()
    if _dying:  # born after its group's signal, while the parent flushes: it dies of it too
        os.kill(os.getpid(), _dying)
    _unblock_after_fork()


os.register_at_fork(
    before=_block_for_fork,
    after_in_parent=_unblock_after_fork,
    after_in_child=_after_fork_in_child,
)
