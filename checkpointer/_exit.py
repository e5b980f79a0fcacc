"""Exit hooks: flush every open writer from atexit and from SIGTERM/SIGHUP.

What this module is built on:

* atexit does not run when a signal Python does not handle kills the process
  (the default SIGTERM and SIGHUP), so we handle those two and write inside
  the handler;
* after writing we chain so the exit status is what it would have been
  without us: a previous Python handler is called; "ignore" (``nohup``) is
  kept; the default action is restored and the signal re-raised, so the
  process dies of it (status -15 for SIGTERM);
* SIGINT is left alone: asyncio's runner and trio install their Ctrl-C
  handling only when they find Python's default handler.  KeyboardInterrupt
  unwinds through ``async with`` (whose exit writes) and then atexit runs;
* a handler runs on the main thread between bytecodes, possibly while that
  same thread is inside a writer's synchronous write.  Waiting for the
  writer's lock there would deadlock, so the signal is deferred and handled
  (flush, then chain) as soon as that write releases its lock.  A store
  whose calls hold a lock of their own (``PostgresStore``'s connection)
  marks them with ``busy()``, so a signal landing in one (the application
  reading another key through the writer's store) waits for it the same way.

Handlers are installed when the first writer with ``exit_hooks=True`` opens
on the main thread and restored when the last one closes, unless another
handler was installed on top of ours meanwhile; ours then stays and, with no
writer left, only chains.  A last writer closed off the main thread (where
``signal.signal`` cannot be called) leaves the restoration to the main
thread: its event loop, if the writer ran on one there
(``restore_pending``), else the main thread's next register, unregister or
write; meanwhile ours only chain.  Each installation is its own ``_Handler`` that
remembers what it replaced, so a writer opened later over an application
handler that chains to an earlier ``_Handler`` adds a layer instead of
making a loop (ours -> the app's -> ours -> ...).

A forked child (a ``multiprocessing`` worker, ``os.fork``) inherits the
atexit callbacks, the signal handlers and this registry, but none of those
writers is its own: writing would put the child's stale copy of the state
over the parent's file, and releasing their locks would release the
parent's.  So right after a fork the child forgets them (the registry and the
deferred signals emptied, a fresh registry lock in case another thread held
it at the fork) and puts back the handlers ours replaced, as the last
writer's close would: a child with no writer must die of SIGTERM in the
kernel, not in a Python handler.  A Python handler runs when the main thread
next checks for signals; a signal landing while that thread is in user space
on its way into a blocking call is checked for only when the call returns.
A ``multiprocessing`` worker idle in ``sem_wait`` on its task queue's lock is
woken when another worker lets the lock go, loses it to ``Pool.terminate()``
(which takes it and keeps it) and waits again inside libc: a SIGTERM landing
in that window (wide on a loaded machine) is never handled, and
``terminate()`` waits on the worker forever.  The forking thread holds our
signals pending across the fork (``_block_for_fork``), so one sent to the
child before this hook has run waits for it, then kills.  A writer the child
opens itself registers as usual.  Each writer also checks its pid before any
write (``CheckpointWriter._forked``), for a fork that runs no Python hooks.

The one answer to "what happens on SIGTERM?": ``_Handler``.  The hooks know
a writer only as a ``Flushable`` and import nothing of the library, so a
store may mark its calls ``busy()`` without importing the writer.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, Protocol

__all__ = [
    "HANDLED_SIGNALS",
    "Flushable",
    "busy",
    "forget_join",
    "join_at_exit",
    "register",
    "restore_pending",
    "run_deferred",
    "unregister",
]

logger = logging.getLogger("checkpointer")

HANDLED_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGHUP)


class Flushable(Protocol):
    """A writer, as the exit hooks see it (a ``CheckpointWriter`` registers one).

    Called from atexit and from a signal handler on the main thread: none
    of them may wait for a lock the interrupted code could hold.
    """

    def flush_at_exit(self) -> None:
        """Write the final checkpoint at interpreter exit; let the key go."""
        ...

    def flush_at_signal(self) -> None:
        """Write the final checkpoint in a signal handler (the process dies next)."""
        ...

    def busy_on(self, thread_id: int) -> bool:
        """Whether the thread ``thread_id`` is inside one of this writer's writes."""
        ...


# Insertion-ordered, and O(1) to add and remove: an agent server opens and
# closes thousands of writers (a list's remove and atexit.unregister, which
# scans every callback, made closing quadratic).  One atexit hook flushes them
# all, the newest first, as one callback per writer used to.
_writers: dict[Flushable, None] = {}
# Waits for final writes still in their threads (a close past close_timeout),
# run before the flushes; O(1) to add and remove for the same reason.
_joins: dict[Callable[[], None], None] = {}
_atexit_hooked = False
_MISSING: Any = object()
_deferred: list[tuple[_Handler, int]] = []
_registry_lock = threading.Lock()  # never taken inside a signal handler
_busy: dict[int, int] = {}  # thread id -> store calls in progress on it (see busy)
# The last writer was unregistered off the main thread, where signal.signal
# cannot be called: our handlers (which only chain now) are to be restored on
# the main thread at its next chance (restore_pending).
_restore_wanted = False


class _Handler:
    """Our handler for a signal, installed on top of ``previous``."""

    __slots__ = ("previous",)

    def __init__(self, previous: Any) -> None:
        self.previous = previous

    def __repr__(self) -> str:
        return f"<checkpointer exit handler over {self.previous!r}>"

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        me = threading.get_ident()
        writers = list(_writers)
        if me in _busy or any(w.busy_on(me) for w in writers):
            # This thread is inside a writer's own write: finish it first.
            _deferred.append((self, signum))
            return
        for join in list(_joins):  # first: final writes still in their threads land
            try:
                join()
            except Exception:
                logger.exception("checkpointer: waiting for a final write on a signal raised")
        for writer in writers:
            writer.flush_at_signal()
        _chain(self.previous, signum, frame)


def _flush_all_at_exit() -> None:
    """The one atexit hook: wait for final writes in their threads, then flush every writer.

    The writers still registered flush the newest first.

    Each flush is isolated as atexit isolates its callbacks: an exception is
    reported and the others flush; a KeyboardInterrupt (Ctrl-C during the
    flush) lets the others flush too and is raised again at the end.
    """
    interrupted: BaseException | None = None
    for join in reversed(list(_joins)):  # first: those writes land before the flushes
        try:
            join()
        except Exception:
            logger.exception("checkpointer: waiting for a final write at exit raised")
        except BaseException as exc:
            if interrupted is None:
                interrupted = exc
    for writer in reversed(list(_writers)):
        if writer not in _writers:  # an earlier flush may have closed this one
            continue
        try:
            writer.flush_at_exit()
        except Exception:  # as atexit would: report it, and flush the others
            logger.exception("checkpointer: an exit flush raised")
        except BaseException as exc:  # Ctrl-C, SystemExit: the others first
            if interrupted is None:
                interrupted = exc
    if interrupted is not None:
        raise interrupted


def _hook_atexit() -> None:
    global _atexit_hooked
    if not _atexit_hooked:
        atexit.register(_flush_all_at_exit)
        _atexit_hooked = True


def join_at_exit(join: Callable[[], None]) -> None:
    """Call ``join`` at exit, before the flushes, until ``forget_join`` (O(1) both)."""
    with _registry_lock:
        _joins[join] = None
        _hook_atexit()


def forget_join(join: Callable[[], None]) -> None:
    """Undo ``join_at_exit``; a no-op for one not registered.

    The last one gone with no writer registered: our signal handlers are
    restored (on the main thread now, else at its next chance, as ``unregister``).
    """
    global _restore_wanted
    if _joins.pop(join, _MISSING) is _MISSING or _joins or _writers:
        return
    if threading.current_thread() is not threading.main_thread():
        _restore_wanted = True
        return
    with _registry_lock:
        if not _joins and not _writers:
            _restore_handlers()


def register(writer: Flushable) -> None:
    """Flush ``writer`` at exit and on SIGTERM/SIGHUP until ``unregister``."""
    global _restore_wanted
    with _registry_lock:
        _restore_wanted = False  # our handlers are in use again
        _writers[writer] = None
        _hook_atexit()
        if threading.current_thread() is threading.main_thread():
            for signum in HANDLED_SIGNALS:
                current = signal.getsignal(signum)
                if not isinstance(current, _Handler):
                    signal.signal(signum, _Handler(current))


def unregister(writer: Flushable) -> bool:
    """Undo ``register``; restore the signal handlers we replaced if we can.

    Returns:
        False if the handlers are still to be restored on the main thread
        (the last writer left from another thread): the caller may arrange
        a call of ``restore_pending`` there (on its event loop); otherwise
        the main thread's next ``register``, ``unregister`` or write does it.
        True otherwise.
    """
    global _restore_wanted
    with _registry_lock:
        if _writers.pop(writer, _MISSING) is _MISSING:
            return not _restore_wanted
        if _writers or _joins:  # a final write in its thread: SIGTERM waits for it
            return True
        if threading.current_thread() is not threading.main_thread():
            _restore_wanted = True
            return False
        _restore_handlers()
        return True


def restore_pending() -> None:
    """On the main thread: restore the handlers a last writer left off it could not.

    A no-op elsewhere, when nothing is pending, or when the registry is busy
    (it may be this thread's own, interrupted by a signal): a later call
    restores them.
    """
    if not _restore_wanted or threading.current_thread() is not threading.main_thread():
        return
    if not _registry_lock.acquire(blocking=False):
        return
    try:
        if _restore_wanted and not _writers and not _joins:
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


def run_deferred() -> None:
    """Handle signals that arrived during a write on this thread (main only)."""
    restore_pending()
    if not _deferred or threading.current_thread() is not threading.main_thread():
        return
    me = threading.get_ident()
    if me in _busy or any(w.busy_on(me) for w in list(_writers)):
        return
    while _deferred:
        handler, signum = _deferred.pop(0)
        handler(signum, None)


# The forking thread's mask of our signals before the fork (see _block_for_fork).
_fork_mask = threading.local()


def _block_for_fork() -> None:
    """Hold our signals pending in the forking thread until the hooks after the fork.

    The child starts with the parent's handlers, and CPython drops a signal
    its C handler caught before the child's interpreter reset its signal
    state: a SIGTERM sent to a worker that has not run yet (a pool ended as
    soon as made) would be lost.  Blocked, it waits in the kernel.
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

    The forking thread is the child's main thread, so ``signal.signal`` works
    here.  A SIGTERM sent to the child since the fork then kills it.
    """
    global _registry_lock
    _registry_lock = threading.Lock()
    _writers.clear()  # the one atexit hook stays: with no writer it does nothing
    _joins.clear()
    _deferred.clear()
    _restore_handlers()
    _unblock_after_fork()


os.register_at_fork(
    before=_block_for_fork,
    after_in_parent=_unblock_after_fork,
    after_in_child=_after_fork_in_child,
)


@contextlib.contextmanager
def busy() -> Iterator[None]:
    """Mark a store call on this thread: a signal landing meanwhile waits for its end.

    For a call that holds a lock the flush of a signal needs; the deferred
    signal is handled (flush, then chain) as the outermost call returns.
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
            run_deferred()


def _chain(previous: Any, signum: int, frame: FrameType | None) -> None:
    if previous is signal.SIG_IGN:
        return
    if callable(previous):
        previous(signum, frame)
        return
    # SIG_DFL, or None (a handler not installed from Python): die of it.
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
