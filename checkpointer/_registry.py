"""``SessionRegistry``: the writers of a server's many sessions, opened on first use,
closed when idle or least recently used, flushed at exit by one hook for them all.

Each key is an entry in one ``OrderedDict`` kept in order of last use, so the
least recently used key is its first and the idle ones lead it.  An entry is
``OPENING`` (its ``resume`` and first write running), ``OPEN``, or ``CLOSING``
(its final write running); it leaves the dict once its writer has let the key
go, so a key in use again waits for that and then resumes from what it wrote.

Past 500 lines: the entry's phases and the registry's (open, closing) are one machine,
and its transitions (open, evict, idle close, keep, release, aclose) read each other's.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
import math
import os
import resource
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal, final

import anyio
import anyio.to_thread

from . import _exit
from ._stores.base import Store
from ._text import describe_error
from ._values import (
    Checkpoint,
    CheckpointFailed,
    Failed,
    Meta,
    RegistryStatistics,
    Result,
    Skipped,
    Snapshot,
    Written,
)
from ._writer.clock import Clock, MonotonicClock
from ._writer.service import DEFAULT_LIMITS, CheckpointWriter
from ._writer.timer import spawn_system_task

__all__ = ["SessionRegistry"]

logger = logging.getLogger("checkpointer")

_REFUSED = ("locked", "conflict", "newer-version")  # another writer's key: refused for good
_CLOSING_AT_ONCE = 64  # final writes in flight at once: each runs in a thread of its own
_Why = Literal["closed_idle", "evicted", ""]  # why a key closes: its count ("" none)


_Phase = enum.Enum("_Phase", "OPENING OPEN CLOSING")


@final
class _Entry:
    __slots__ = (
        "changed",
        "closer",
        "error",
        "key",
        "last_used",
        "phase",
        "result",
        "users",
        "writer",
    )

    def __init__(self, key: str) -> None:
        self.key = key
        self.phase = _Phase.OPENING
        self.writer: CheckpointWriter[Snapshot] | None = None
        self.users = 0  # session() blocks inside it now: never closed while > 0
        self.last_used = 0.0
        self.changed = anyio.Event()  # set as the opening or the closing ends
        self.error: BaseException | None = None  # why the opening failed (not a cancel)
        self.closer: object = None  # the registry's task closing it: keep a reference
        self.result: Result = Skipped("closed")  # its final write's, once closed


@final
class SessionRegistry:
    """Hands out the ``CheckpointWriter`` of each session of a server, opening and closing them.

    A key's writer opens when ``session(key)`` first asks for it: ``resume(key)`` loads
    the session (and sets up your state of it), the writer resumes from what it returned,
    fenced as any resume.  Unused for ``idle_timeout`` seconds, or least recently used past
    ``max_open``, it closes: its final write, then its lock and descriptor let go, then
    ``on_close(key, result)`` (drop your state there); if the store fails that write, it
    stays open, its lock let go, until a write lands.  Used again, it opens again through
    ``resume``: what another process wrote meanwhile is what you get.  One exit hook
    flushes every open writer at exit and on SIGTERM/SIGHUP.  ``async with
    SessionRegistry(...) as registry:`` on asyncio or trio, or let the first ``session()``
    open it on its loop, then ``aclose()``.

    Args:
        source: ``source(key)`` returns the session's ``Snapshot(key, state)``
            (or None without one), as a writer's source; on the event loop.
        store: where the sessions go.
        resume: ``resume(key)`` returns what ``load(store, key)`` returned
            (the ``Checkpoint``, its ``Meta``, or None), having made your
            state of the key from it; blocking, called in a worker thread.
        on_close: ``on_close(key, result)`` once a key's writer has closed,
            with its final write's result; on the event loop.  Also after
            an opening that failed once ``resume`` was called.
        idle_timeout: seconds a key stays open with no ``session()`` block.
        max_open: most keys open at once outside a ``session()`` block (one
            descriptor each on a ``FileStore``); None: ``default_max_open()``, read
            at each opening.
        clock: the clock idle time is read on (the writers' too).
        **writer_options: for each ``CheckpointWriter`` (``debounce``,
            ``transcript``, ``limits``, ...); not ``exit_hooks``.

    Raises:
        ValueError: ``idle_timeout``, ``max_open`` or a writer option is out of range.
        TypeError: a writer option is unknown, of the wrong type, or one the
            registry sets itself.
    """

    def __init__(
        self,
        source: Callable[[str], Snapshot | None],
        store: Store,
        *,
        resume: Callable[[str], Checkpoint[Any] | Meta | None],
        on_close: Callable[[str, Result], object] | None = None,
        idle_timeout: float = 300.0,
        max_open: int | None = None,
        clock: Clock | None = None,
        **writer_options: Any,
    ) -> None:
        if not idle_timeout > 0:
            raise ValueError(f"idle_timeout must be > 0 seconds, got {idle_timeout!r}")
        if max_open is not None and (type(max_open) is not int or max_open < 1):
            raise ValueError(f"max_open must be an int >= 1, got {max_open!r}")
        for reserved in ("resume_from", "exit_hooks"):
            if reserved in writer_options:
                raise TypeError(f"SessionRegistry sets {reserved!r} itself")
        self._source = source
        self._store = store
        self._resume = resume
        self._on_close = on_close
        self._idle = float(idle_timeout)
        self._max_open = max_open
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._options = writer_options
        # Checked once here as each writer checks them: a typo fails now, not every request.
        CheckpointWriter(lambda: None, store, resume_from=None, exit_hooks=False, **writer_options)
        self._close_timeout = writer_options.get("limits", DEFAULT_LIMITS).close_timeout
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._closing_now = 0  # entries CLOSING: an opening's room is counted without them
        self._state: Literal["new", "open", "closing", "closed"] = "new"
        self._pid = os.getpid()
        self._closing = anyio.Semaphore(_CLOSING_AT_ONCE)
        self._reaper: object = None  # the idle-closing task: keep a reference
        self._nap: anyio.CancelScope | None = None  # the reaper's sleep, cancelled to wake it
        self._napping_forever = False
        self._reaped = anyio.Event()  # the reaper has ended
        self._closed = anyio.Event()
        self._counts = dict.fromkeys(("opened", "closed_idle", "evicted", "failed"), 0)

    def __repr__(self) -> str:
        return f"<SessionRegistry {self._state} store={self._store!r} open={len(self._entries)}>"

    @staticmethod
    def default_max_open() -> int:
        """512, or a quarter of the process's soft ``ulimit -n`` if less (at least 1): a
        lock descriptor per open key on a file store, the rest for the writes, openings
        and closings in flight and the process's own."""
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return 512 if soft == resource.RLIM_INFINITY else max(1, min(512, soft // 4))

    def statistics(self) -> RegistryStatistics:
        """The registry's counters, as a frozen value."""
        in_use = sum(1 for entry in self._entries.values() if entry.users)
        return RegistryStatistics(open=len(self._entries), in_use=in_use, **self._counts)

    async def __aenter__(self) -> SessionRegistry:
        if self._state != "new":
            raise RuntimeError(f"this SessionRegistry is {self._state}; create a new one")
        self._state = "open"
        self._reaper = spawn_system_task(self._reap, "checkpointer-registry")
        _exit.register(self._flush_final)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @contextlib.asynccontextmanager
    async def session(self, key: str) -> AsyncIterator[CheckpointWriter[Snapshot]]:
        """The key's open writer for the block, opened (``resume``, a first write) if it is not.

        Inside the block the key is never closed; it counts as used as the
        block ends (and closes then if ``aclose()`` is waiting for it).  A
        cancel while opening lets the key go as it found it.

        Raises:
            CheckpointFailed: the store refused the key's first write (another
                writer holds it, wrote it since ``resume`` read it, or a newer
                program did).
            RuntimeError: the registry is not open, or was made in a parent
                process (make one in the child).
            BaseException: what ``resume`` raised.
        """
        entry = await self._acquire(key)
        assert entry.writer is not None
        try:
            yield entry.writer
        finally:
            entry.users -= 1
            self._touch(entry)
            if entry.users == 0 and self._state == "closing" and entry.phase is _Phase.OPEN:
                self._start_close(entry, "")  # aclose() waits for it
            elif entry.users == 0:
                if (victim := self._victim()) is not None:  # opened past the bound: make room
                    self._start_close(victim, "evicted")
                self._rouse()

    def _rouse(self) -> None:
        """A key is idle again: wake the reaper if it sleeps with nothing idle to wait for."""
        if self._napping_forever and self._nap is not None:
            self._nap.cancel()

    def _touch(self, entry: _Entry) -> None:
        entry.last_used = self._clock.now()
        if self._entries.get(entry.key) is entry:
            self._entries.move_to_end(entry.key)

    async def _acquire(self, key: str) -> _Entry:
        while True:
            if self._state == "new" and self._pid == os.getpid():
                await self.__aenter__()
            if self._state != "open" or self._pid != os.getpid():
                raise RuntimeError(
                    f"this SessionRegistry is {self._state}"
                    + ("" if self._pid == os.getpid() else f" and belongs to process {self._pid}")
                )
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry(key)
                await self._open(entry)
            if entry.phase is _Phase.OPEN:
                entry.users += 1
                self._touch(entry)
                return entry
            await entry.changed.wait()  # opening or closing: then look again
            if entry.error is not None:
                raise entry.error  # the opening failed: as it did for its opener

    async def _open(self, entry: _Entry) -> None:
        """Open the entry's writer: make room, ``resume``, a first write; else forget it."""
        resuming = _Resuming(self._resume, entry.key)
        try:
            await self._evict()
            base = await anyio.to_thread.run_sync(resuming)
            writer: CheckpointWriter[Snapshot] = CheckpointWriter(
                functools.partial(self._snapshot, entry),
                self._store,
                resume_from=base,
                exit_hooks=False,  # the registry's one hook flushes it
                clock=self._clock,
                **self._options,
            )
            entry.writer = writer  # in the exit hook's reach from its first write on
            await writer.aopen()
            _raise_refused(writer)
        except BaseException as exc:
            if not isinstance(exc, anyio.get_cancelled_exc_class()):
                entry.error = exc
                self._counts["failed"] += 1
            with anyio.CancelScope(shield=True):
                # A cancel on asyncio may land while resume still runs in its thread.
                resumed = resuming.settle(blocking=False)
                if resumed is None:
                    resumed = await anyio.to_thread.run_sync(resuming.settle)
                result = await entry.writer.aclose() if entry.writer is not None else None
            self._forget(entry, (result or Skipped("closed")) if resumed else None)
            raise
        entry.phase = _Phase.OPEN
        self._counts["opened"] += 1
        self._wake(entry)

    def _snapshot(self, entry: _Entry) -> Snapshot | None:
        # A key refused at its opening is another writer's: nothing to write at close.
        return None if entry.error is not None else self._source(entry.key)

    async def _evict(self) -> None:
        """Close the least recently used keys not in use while past ``max_open``."""
        while (victim := self._victim()) is not None:
            await self._start_close(victim, "evicted").wait()
            if victim.phase is _Phase.OPEN:
                return  # kept open, its state not written: past the bound until it is

    def _victim(self) -> _Entry | None:
        """The least recently used key not in use if more than ``max_open`` are open, closing
        ones not counted (each opening in flight makes room for itself only); else None."""
        bound = self.default_max_open() if self._max_open is None else self._max_open
        if len(self._entries) - self._closing_now <= bound:
            return None
        idle = (e for e in self._entries.values() if e.phase is _Phase.OPEN and not e.users)
        return next(idle, None)

    async def release(self, key: str) -> Result | None:
        """Close the key's writer now (its final write, then its lock), then ``on_close``.

        After an opening or a closing in progress.  Shielded from cancellation.

        Returns:
            The final write's result, or None if the key was not open.

        Raises:
            RuntimeError: the key is inside a ``session()`` block.
        """
        while (entry := self._entries.get(key)) is not None:
            if entry.phase is not _Phase.OPEN:
                await entry.changed.wait()
                continue
            if entry.users:
                raise RuntimeError(f"session {key!r} is in use: release it after its block")
            with anyio.CancelScope(shield=True):
                await self._start_close(entry, "").wait()
            return entry.result
        return None

    def _start_close(self, entry: _Entry, why: _Why) -> anyio.Event:
        """Close the entry in a task of the registry's own, so a caller cancelled meanwhile
        (a request's timeout, Ctrl-C) never leaves it half closed; set once it is gone."""
        entry.phase = _Phase.CLOSING
        self._closing_now += 1
        done = entry.changed
        entry.closer = spawn_system_task(
            functools.partial(self._close, entry, why), "checkpointer-registry-close"
        )
        return done

    async def _close(self, entry: _Entry, why: _Why) -> None:
        """Close the entry's writer (its final write, then its lock), then ``on_close``; it
        stays in the registry, so in the exit hook's reach, until its final write is done."""
        assert entry.writer is not None
        kept = False
        try:
            async with self._closing:
                if why and (kept := await self._kept(entry)):
                    return
                result = await entry.writer.aclose()
                if result != Skipped("unchanged") or not isinstance(entry.result, Written):
                    entry.result = result  # else _kept's write was the last
        except Exception as exc:  # source() raised in the timer task (trio): the key is let go
            entry.result = Failed("write-failed", f"the close raised {describe_error(exc)}")
            logger.exception("checkpointer: closing %r: %s", entry.key, entry.result.error)
        finally:
            if not kept:
                if why:
                    self._counts[why] += 1
                self._forget(entry, entry.result)

    async def _kept(self, entry: _Entry) -> bool:
        """Write an idle or evicted key's state before it is let go; if the store failed it
        (a full disk, no descriptor or thread left) or has not answered within
        ``close_timeout`` (the write goes on), keep it open: a use meanwhile gets its writer,
        which holds no lock between its retries, fenced as any.  Any other failure, or any
        once closing: let go."""
        assert entry.writer is not None
        result: Result = Failed(
            "write-failed", f"no answer within close_timeout={self._close_timeout}s; it goes on"
        )
        try:
            with anyio.move_on_after(self._close_timeout):  # a store that does not answer
                result = await entry.writer._write_final()
        except Exception as exc:  # no worker thread to be had (a pids limit): as a full disk
            result = Failed("write-failed", f"the write raised {describe_error(exc)}")
        entry.result = result
        failed = isinstance(result, Failed) and result.reason == "write-failed"
        if not failed or self._state != "open":
            return False
        logger.warning(
            "checkpointer: %r kept open: its state could not be written (%s)", entry.key, result
        )
        entry.writer._detach()
        entry.phase = _Phase.OPEN
        self._closing_now -= 1
        self._touch(entry)
        self._wake(entry)
        self._rouse()
        return True

    def _forget(self, entry: _Entry, result: Result | None) -> None:
        """The entry leaves the registry; ``on_close`` if it had been resumed."""
        if self._entries.get(entry.key) is entry:
            del self._entries[entry.key]
            self._closing_now -= entry.phase is _Phase.CLOSING
        self._wake(entry)
        if result is not None and self._on_close is not None:
            try:
                self._on_close(entry.key, result)
            except Exception:
                logger.exception("checkpointer: on_close(%r) raised", entry.key)
        self._settle()

    def _wake(self, entry: _Entry) -> None:
        changed, entry.changed = entry.changed, anyio.Event()
        changed.set()

    async def _reap(self) -> None:
        """The registry's task: close each key ``idle_timeout`` after its last use."""
        try:
            while self._state == "open":
                due, wait = self._due()
                for entry in due:
                    self._start_close(entry, "closed_idle")
                if due:
                    continue
                with anyio.CancelScope() as self._nap:
                    self._napping_forever = math.isinf(wait)
                    await self._clock.sleep(wait)
                self._nap, self._napping_forever = None, False
        finally:
            self._reaped.set()

    def _due(self) -> tuple[list[_Entry], float]:
        """The keys idle past their time (oldest first), and the seconds until the next one."""
        now = self._clock.now()
        due: list[_Entry] = []
        for entry in self._entries.values():  # in order of last use
            if entry.phase is not _Phase.OPEN or entry.users:
                continue
            left = entry.last_used + self._idle - now
            if left > 0:
                return due, left
            due.append(entry)
        return due, math.inf

    async def aclose(self) -> None:
        """Close every open key (its final write, then its lock), and the exit hook.

        A key inside a ``session()`` block closes as the block ends: cancel
        those tasks first (the end of a task group does).  From any task of
        the registry's loop; a second call waits for the first.  Shielded
        from cancellation, except while waiting for blocks to end: cancelled
        then, each such key still closes at its block's end.  In a forked
        child it forgets the parent's keys and closes nothing.
        """
        if self._pid != os.getpid():  # the parent's loop objects and writers: not touched
            self._entries.clear()
            self._state = "closed"
            return
        if self._state == "new":
            self._state = "closed"
            self._closed.set()
        if self._state == "open":
            self._state = "closing"
            if self._nap is not None:
                self._nap.cancel()
            with anyio.CancelScope(shield=True):
                await self._reaped.wait()
            self._settle()
        while not self._closed.is_set():
            with anyio.CancelScope(shield=True):
                for entry in list(self._entries.values()):
                    if entry.phase is _Phase.OPEN and not entry.users:
                        self._start_close(entry, "")
                for entry in list(self._entries.values()):
                    if entry.phase is not _Phase.OPEN and self._entries.get(entry.key) is entry:
                        await entry.changed.wait()  # closing, or opening: then look again
            in_use = [entry.changed for entry in self._entries.values() if entry.users]
            if in_use:
                await in_use[0].wait()  # closed as its block ends; cancellable

    def _settle(self) -> None:
        """Once closing and no key is left: closed, and the exit hook goes."""
        if self._state == "closing" and not self._entries:
            self._state = "closed"
            _exit.unregister(self._flush_final)
            self._closed.set()

    def _flush_final(self, reason: Literal["exit", "signal"]) -> None:
        """The exit hook: every open writer's final write (``live=False``), synchronously."""
        for entry in list(self._entries.values()):
            if entry.writer is not None:
                entry.writer.flush_sync(reason)


@final
class _Resuming:
    """``resume(key)`` for a worker thread, once; ``settle()`` says whether it was called,
    after waiting for it to return, and keeps it from starting after (a cancelled opening)."""

    def __init__(self, resume: Callable[[str], Checkpoint[Any] | Meta | None], key: str) -> None:
        self._resume, self._key, self._guard = resume, key, threading.Lock()
        self._state: Literal["new", "called", "settled"] = "new"

    def __call__(self) -> Checkpoint[Any] | Meta | None:
        with self._guard:
            if self._state == "settled":
                raise RuntimeError("the opening was cancelled")
            self._state = "called"
            return self._resume(self._key)

    def settle(self, blocking: bool = True) -> bool | None:
        if not self._guard.acquire(blocking):
            return None  # resume runs now
        try:
            called, self._state = self._state == "called", "settled"
        finally:
            self._guard.release()
        return called


def _raise_refused(writer: CheckpointWriter[Snapshot]) -> None:
    """Raise ``CheckpointFailed`` if the store refused the writer's first write for good."""
    last = writer.statistics().last_result
    if isinstance(last, Failed) and last.reason in _REFUSED:
        raise CheckpointFailed(last)
