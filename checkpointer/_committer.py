"""``KeyCommitter``: the writer's commit core without its schedule, exit hooks or lifecycle,
for a program or framework that already says when to save and waits for it."""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from typing import Any, final

import anyio.to_thread

from ._stores.base import Store
from ._stores.encoding import Transcript
from ._values import Checkpoint, Limits, Meta, Result, Skipped, Snapshot
from ._writer.commit import Committer, Job
from ._writer.keystate import UNKNOWN, Unknown

__all__ = ["KeyCommitter"]

_NONE: Any = object()  # no state given: the source has no snapshot (see close)


@final
class KeyCommitter:
    """Commits one key's state durably each time ``commit`` is called: no timer, no exit hooks.

    Each commit is a ``CheckpointWriter``'s write: encoded, fenced on the
    revision expected (``resume_from``), durable when it returns, skipped
    when the state is unchanged, never raising for a failed write.  The
    key's lock is taken at the first commit and held until ``close`` (or ``release``).
    ``transcript`` and ``state_version`` are as ``CheckpointWriter``'s.

    Args:
        resume_from: what ``load(store, key)`` returned: the ``Checkpoint``
            (or its ``Meta``), or None (no checkpoint); the store refuses a
            commit over any other revision (``Failed("conflict")``).  Not
            given, the first commit expects what the store holds then.
        limits: only ``lock_timeout`` applies: how long a commit waits for
            another writer of the key to let go.
    """

    def __init__(
        self,
        store: Store,
        key: str,
        *,
        transcript: Transcript | None = None,
        resume_from: Checkpoint[Any] | Meta | Unknown | None = UNKNOWN,
        state_version: int = 0,
        limits: Limits = Limits(),  # noqa: B008 -- a frozen value
    ) -> None:
        store.validate_key(key)
        self.key = key
        self._store = store
        self._state: Any = _NONE
        self._lock = threading.Lock()  # one commit at a time: _state is the source's
        self._pid: int | None = None  # the process of the first commit; only it writes
        self._closed = False
        if isinstance(resume_from, Checkpoint):
            resume_from = resume_from.meta
        self._args = (store, transcript, state_version, limits, resume_from)
        self._core = self._make()  # made now: a store that cannot fence is refused here

    def _make(self) -> Committer:
        return Committer(self._source, *self._args, retried=False)

    def _forked(self) -> bool:
        """Whether this is a forked child's copy of a committer its parent used: such a
        copy never writes (its view of the key is stale) nor lets go (the lock is the
        parent's).  One the parent made but never used works in the child."""
        return self._pid is not None and self._pid != os.getpid()

    def __repr__(self) -> str:
        return f"<KeyCommitter {'closed' if self._closed else 'open'} key={self.key!r}>"

    def _source(self) -> Snapshot | None:
        return None if self._state is _NONE else Snapshot(self.key, self._state)

    def commit(self, state: Any, *, live: bool = True) -> Result:
        """Write ``state`` durably now; blocking (call it from a worker thread in async code).

        Returns:
            ``Written``, ``Skipped("unchanged")`` (the store holds it), or
            ``Failed`` (``"conflict"``, ``"locked"``, ``"write-failed"``, ...);
            ``Skipped("closed")`` after ``close``.
        """
        if self._forked():  # before the lock: a thread of the parent may hold it
            return Skipped("closed")
        with self._lock:
            if self._closed:
                return Skipped("closed")
            if self._pid is None:
                self._pid = os.getpid()
                if self._core.pid != self._pid:  # made in a parent that never used it
                    self._core = self._make()
                with contextlib.suppress(Exception):  # a broken root fails the commit, saying why
                    self._store.open()
            core = self._core
            self._state = state
            try:
                job = core.prepare(force=False, pin=None, live=live)
            finally:
                self._state = _NONE
            if not isinstance(job, Job):
                return core.record.account(job, quiet=False)
            try:
                return core.execute(job)
            finally:
                core.end(job)

    async def acommit(self, state: Any, *, live: bool = True) -> Result:
        """``commit`` in a worker thread; a commit that began runs to its end if cancelled."""
        return await anyio.to_thread.run_sync(functools.partial(self.commit, state, live=live))

    def release(self) -> None:
        """Let go of the key's lock, still expecting the revision this committer wrote.

        The next commit takes the lock again; it is refused (``Failed("conflict")``)
        if another writer wrote the key meanwhile.  Nothing is written.  Skipped
        while a commit runs (it is in use).
        """
        if not self._forked() and self._lock.acquire(blocking=False):
            try:
                if self._pid is not None and not self._closed:
                    self._core.release_locks()
            finally:
                self._lock.release()

    def close(self) -> None:
        """Mark the key's checkpoint not live (if this committer wrote it live), let the key go.

        Only the meta changes; a failure is logged.  A second close does nothing.
        """
        if self._forked():
            return  # the parent's lock: releasing it would release it for the parent
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._pid is None:
                return  # never committed: nothing written, nothing held
            # A final write whose source has no state: the core marks the key not live.
            self._core.prepare(force=False, pin=None, live=False)
            self._core.finish()
            self._core.release_locks()

    async def aclose(self) -> None:
        """``close`` in a worker thread; it runs to its end if cancelled."""
        await anyio.to_thread.run_sync(self.close)

    def __enter__(self) -> KeyCommitter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> KeyCommitter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
