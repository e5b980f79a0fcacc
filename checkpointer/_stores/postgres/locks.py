"""The writer lock of the PostgreSQL store: a session-level advisory lock per key, which
the server frees when the process dies; ``<schema>.holders`` says who holds it.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, final

from ... import _exit
from ..base import LockHolder, check_key
from .connection import ConnectionPart
from .errors import KeyLockedError, PostgresStoreError
from .schema import int64

if TYPE_CHECKING:
    import psycopg

__all__ = ["LocksPart", "PostgresKeyLock"]


@final
class PostgresKeyLock:
    """A held writer lock of one key of a ``PostgresStore`` (from ``lock``)."""

    def __init__(self, store: LocksPart, key: str) -> None:
        self.store = store
        self.key = key
        self.holder = LockHolder(
            pid=os.getpid(), host=socket.gethostname(), started_at=datetime.now(UTC)
        )

    def __repr__(self) -> str:
        return f"<PostgresKeyLock {self.store.location(self.key)!r}>"

    @property
    def held(self) -> bool:
        return self.store._handles.get(self.key) is self and self.key in self.store.held()

    def release(self) -> None:
        """Give the lock up if this object still holds it; idempotent, never raises for I/O."""
        self.store._release_handle(self)


class LocksPart(ConnectionPart):
    """The part of ``PostgresStore`` that holds the writer locks of its keys."""

    def _start_fresh(self) -> None:
        super()._start_fresh()
        self._host = socket.gethostname()
        self._handles: dict[str, PostgresKeyLock] = {}  # key -> its holder (lock())
        self._handles_lock = threading.Lock()

    def acquire(self, key: str) -> str | None:
        """Take the writer lock of ``key`` until ``release``, ``close`` or the connection's
        end; None once held, else a line naming the holder."""
        refused = self._try_lock(key)
        return None if refused is None else str(refused)

    def _try_lock(self, key: str) -> KeyLockedError | None:
        check_key(key)
        if key in self._held:  # held on the live connection: no round trip
            return None
        return self._run(lambda conn: self._acquire(conn, key))

    def lock(self, key: str, *, timeout: float = 0.0) -> PostgresKeyLock:
        """``LockingStore.lock``: ``acquire``'s lock as an object; one holder at a time, as
        with ``FileStore`` (a second ``lock`` of a key through this store is refused)."""
        if not (isinstance(timeout, (int, float)) and 0 <= timeout < math.inf):
            raise ValueError(
                f"lock timeout must be a finite number of seconds >= 0, got {timeout!r}"
            )
        deadline = time.monotonic() + timeout
        while isinstance(taken := self._take_handle(key), KeyLockedError):
            if time.monotonic() >= deadline:
                raise taken
            time.sleep(0.05)
        return taken

    @contextlib.contextmanager
    def _handles_held(self) -> Iterator[None]:
        # A signal landing meanwhile waits: its flush takes the lock too.
        with _exit.busy(), self._handles_lock:
            yield

    def _take_handle(self, key: str) -> PostgresKeyLock | KeyLockedError:
        other = self._handles.get(key)
        if other is None:
            refused = self._try_lock(key)
            if refused is not None:
                return refused
            with self._handles_held():
                other = self._handles.get(key)
                if other is None:
                    handle = self._handles[key] = PostgresKeyLock(self, key)
                    return handle
        return KeyLockedError(
            key,
            f"{self.location(key)}, held by another writer through this same PostgresStore",
            other.holder,
        )

    def _release_handle(self, handle: PostgresKeyLock) -> None:
        with self._handles_held():
            if self._handles.get(handle.key) is not handle:
                return  # released already, or the key went with a release() or close()
        self.release(handle.key)

    def release(self, key: str) -> None:
        """Give the writer lock of ``key`` back (a no-op if not held); never raises for I/O."""
        check_key(key)
        with self._handles_held():
            self._handles.pop(key, None)
        with _exit.busy():  # a signal landing meanwhile waits (see _session)
            if not self._mutex.acquire(timeout=self._busy_wait):
                return
            try:
                if key not in self._held:
                    return
                conn = self._conn
                if conn is None or conn.closed:
                    self._held.discard(key)
                    return
                try:
                    with self._watchdog.watch(conn.fileno(), self._deadline):
                        self._unlock(conn, key)
                except self._pg.Error:
                    self._drop()
            finally:
                self._mutex.release()

    def _release_all(self) -> None:
        """Unlock every key on the live connection (its closing caller holds the mutex):
        the server ends a closed session when it gets to it, and until then the keys'
        locks would keep other writers out, this store's next connection too."""
        conn = self._conn
        if not self._held or conn is None or conn.closed or conn.broken:
            return
        with (
            contextlib.suppress(self._pg.Error),
            self._watchdog.watch(conn.fileno(), self._deadline),
        ):
            conn.execute(self._sql["release_all"])

    def locked_by(self, key: str) -> str | None:
        """Who holds the writer lock of ``key`` (one line; this store counts), None if free."""
        check_key(key)
        backend, refused = self._run(lambda conn: self._holder(conn, key, self._lock_id(key)))
        if backend is None:
            return None
        if refused.holder is None:
            return f"PostgreSQL backend {backend}"
        return f"{refused.holder.describe()}, backend {backend}"

    def held(self) -> frozenset[str]:
        """The keys whose writer lock this store holds (as far as it knows)."""
        return frozenset(self._held.copy())

    def _lock_id(self, key: str) -> int:
        return int64(self._quoted.encode() + b"\0" + key.encode())

    def _acquire(
        self, conn: psycopg.Connection[Any], key: str, tries: int = 3
    ) -> KeyLockedError | None:
        """Take the key's lock on ``conn`` unless held; a refusal is returned."""
        if key in self._held:
            return None
        lock_id = self._lock_id(key)
        try:
            row = conn.execute(
                self._sql["acquire"],
                {"id": lock_id, "key": key, "host": self._host, "pid": os.getpid()},
            ).fetchone()
        except self._pg.Error:
            # The lock may be held now although we could not finish: only
            # closing the connection makes sure it is not kept unknowingly.
            self._suspect = True
            raise
        taken = row is not None and bool(row[0])
        if taken:
            self._held.add(key)
            return None
        backend, refused = self._holder(conn, key, lock_id)
        if backend is None and tries > 1:  # released between our try and our look
            return self._acquire(conn, key, tries - 1)
        if backend in self._orphans and refused.holder is not None and self._ours(refused.holder):
            # Our own session dropped mid-call, still running: end it and take the
            # lock; one that outlives the wait is a failure to retry, not a refusal.
            if self._end_backend(conn, backend):
                self._orphans.remove(backend)
                return self._acquire(conn, key)
            raise PostgresStoreError(
                f"{self.location(key)}: held by this store's own earlier connection "
                f"(PostgreSQL backend {backend}, cut off mid-call), asked to end but not "
                f"gone within lock_timeout={self.lock_timeout:g}s; a later try takes the key"
            )
        return refused

    def _ours(self, holder: LockHolder) -> bool:
        return holder.pid == os.getpid() and holder.host == self._host

    def _end_backend(self, conn: psycopg.Connection[Any], backend: int) -> bool:
        """Terminate a backend of ours and wait (lock_timeout at most) until it is gone."""
        try:
            conn.execute(b"SELECT pg_terminate_backend(%s)", [backend])
            deadline = time.monotonic() + self.lock_timeout
            while time.monotonic() < deadline:
                row = conn.execute(
                    b"SELECT 1 FROM pg_stat_activity WHERE pid = %s", [backend]
                ).fetchone()
                if row is None:
                    return True
                time.sleep(0.02)
        except self._pg.Error:
            if conn.broken:
                raise
        return False

    def _unlock(self, conn: psycopg.Connection[Any], key: str) -> None:
        self._held.discard(key)
        conn.execute(self._sql["release"], {"key": key, "id": self._lock_id(key)})

    def _holder(
        self, conn: psycopg.Connection[Any], key: str, lock_id: int
    ) -> tuple[int | None, KeyLockedError]:
        """The backend holding ``key``'s lock, and the refusal to raise."""
        params = {"key": key, "hi": (lock_id >> 32) & 0xFFFFFFFF, "lo": lock_id & 0xFFFFFFFF}
        for _ in range(3):
            row = conn.execute(self._sql["holder"], params).fetchone()
            if row is None or row[1] is not None:
                break
            # The holder notes itself in the statement that takes the lock; its
            # row shows when that statement commits, a moment after the lock.
            time.sleep(0.02)
        where = self.location(key)
        if row is None:  # gone between our try and our look: a retry may take it
            return None, KeyLockedError(key, f"{where}, released a moment ago", None)
        holder = None
        if row[1] is not None:
            holder = LockHolder(pid=row[2], host=row[1], started_at=row[3])
        return row[0], KeyLockedError(key, f"{where}, held by PostgreSQL backend {row[0]}", holder)
