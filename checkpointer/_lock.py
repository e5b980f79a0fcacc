"""One writer per key: an OS advisory lock on ``<root>/<key>.lock``.

Why ``fcntl.flock`` and not a pid file: the kernel releases the lock when the
holder's last descriptor closes, and so when the holder dies, even by
SIGKILL.  Nobody has to guess from a pid and an age whether a holder is
stale (pids are reused; clocks and ages lie).  Why ``flock`` and not
``fcntl.lockf`` (POSIX record locks): those belong to the process, so any
``close()`` of the same file anywhere in the process drops them, and two
writers in one process would not exclude each other.  ``flock`` locks belong
to the open file description: two opens conflict even inside one process.
Why not the ``filelock`` package: it is ``flock`` underneath, leaves the
lock file behind on release, and would be a third runtime dependency.

The lock file holds its holder's pid, host and start time, for error
messages, for a person running ``cat``, and for ``probe_file_lock``, which
tells a live holder from a dead one without taking the lock (so it never
makes a writer's non-blocking acquire fail); nothing that writes decides
anything from it.

Releasing unlinks the file while still holding the lock, so no lock debris
is left after a clean close.  That opens a race this module closes: a
waiter may have opened the old file before the unlink and get the lock on
that (now nameless) inode once the holder closes it, while a newcomer
creates a new file under the same name and locks that one.  So after
locking, ``acquire`` compares the inode of its descriptor with the inode the
path names now (``fstat`` and ``stat``) and starts over when they differ.

A store that is not on a local filesystem brings its own lock by
implementing ``LockingStore`` (a Postgres advisory lock, say); a store
without a ``lock`` method is not locked at all.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import math
import os
import socket
import time
from datetime import UTC, datetime
from typing import Protocol, runtime_checkable

import msgspec

from ._atomic import makedirs_durable
from ._results import Failed

__all__ = [
    "FileKeyLock",
    "KeyLock",
    "KeyLocked",
    "KeyLocks",
    "LockHolder",
    "LockProbe",
    "LockingStore",
    "acquire_file_lock",
    "probe_file_lock",
    "read_holder",
]

logger = logging.getLogger("checkpointer")

_POLL = 0.05  # seconds between attempts while waiting for a lock


class LockHolder(msgspec.Struct, frozen=True, kw_only=True):
    """Who holds a key's writer lock: written into the lock file for display."""

    pid: int
    host: str
    started_at: datetime

    def describe(self) -> str:
        started = self.started_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return f"pid {self.pid} on {self.host} since {started}"


class KeyLocked(Exception):
    """Another live writer holds the key's lock.

    Attributes:
        key: the key.
        location: where the lock is (a path for ``FileStore``).
        holder: who holds it, if it said so, else None.
    """

    def __init__(self, key: str, location: str, holder: LockHolder | None) -> None:
        who = holder.describe() if holder is not None else "a writer that has not said who"
        super().__init__(
            f"key {key!r} is locked by another writer ({who}; {location}): close that "
            "writer, or pass lock_timeout= to wait for it"
        )
        self.key = key
        self.location = location
        self.holder = holder


class KeyLock(Protocol):
    """A held writer lock of one key."""

    def release(self) -> None:
        """Give the lock up; idempotent."""


@runtime_checkable
class LockingStore(Protocol):
    """The optional capability of a store to lock a key for one writer.

    A ``CheckpointWriter`` takes the lock of a key before its first write of
    that key and releases it when it closes or moves to another key.
    Readers (``load``) never lock.
    """

    def lock(self, key: str, *, timeout: float = 0.0) -> KeyLock:
        """Take the writer lock of ``key``, waiting at most ``timeout`` seconds.

        Raises:
            KeyLocked: another writer still holds it after ``timeout``.
            OSError: the lock could not be taken for another reason.
        """
        ...


_HOLDER_ENCODER = msgspec.json.Encoder()
_HOLDER_DECODER = msgspec.json.Decoder(LockHolder)


class FileKeyLock:
    """A held ``flock`` on a lock file; ``release`` removes the file."""

    def __init__(self, path: str, fd: int, holder: LockHolder) -> None:
        self.path = path
        self.holder = holder
        self._fd: int | None = fd

    def __repr__(self) -> str:
        state = "held" if self._fd is not None else "released"
        return f"<FileKeyLock {self.path!r} {state}>"

    @property
    def held(self) -> bool:
        return self._fd is not None

    def fileno(self) -> int:
        if self._fd is None:
            raise ValueError(f"the lock {self.path} was released")
        return self._fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            # Unlink while still holding, and only our own inode (the file is
            # never unlinked by anyone else while held, unless by hand).
            if _same_file(fd, self.path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
        finally:
            os.close(fd)


def acquire_file_lock(
    path: str, *, key: str = "", timeout: float = 0.0, dir_mode: int = 0o700
) -> FileKeyLock:
    """Take an exclusive ``flock`` on ``path``, creating the file if needed.

    Args:
        path: the lock file.
        key: the key it locks, for the error message.
        timeout: seconds to wait for a holder to let go; 0 tries once.
        dir_mode: mode of the parent directory if it has to be created.

    Returns:
        The held lock; its file names this process as the holder.

    Raises:
        KeyLocked: another open file description still holds the lock after
            ``timeout`` (naming the holder when its file says who).
        OSError: the file cannot be created or locked.
    """
    if not (timeout >= 0 and math.isfinite(timeout)):
        raise ValueError(f"lock timeout must be a finite number of seconds >= 0, got {timeout!r}")
    makedirs_durable(os.path.dirname(path) or ".", dir_mode)  # a new root, durably
    deadline = time.monotonic() + timeout
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if time.monotonic() >= deadline:
                raise KeyLocked(key or path, path, read_holder(path)) from None
            time.sleep(_POLL)
            continue
        except BaseException:
            os.close(fd)
            raise
        try:
            if not _same_file(fd, path):
                # The holder unlinked the file we opened as it let go: this
                # inode is no longer the lock.  Start over with the new file.
                os.close(fd)
                continue
            holder = LockHolder(
                pid=os.getpid(), host=socket.gethostname(), started_at=datetime.now(UTC)
            )
            data = _HOLDER_ENCODER.encode(holder)
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
        except BaseException:
            os.close(fd)
            raise
        return FileKeyLock(path, fd, holder)


def read_holder(path: str) -> LockHolder | None:
    """Who a lock file says holds it; None if it is missing, empty or garbled.

    Reads without locking: the answer is for display only.
    """
    try:
        with open(path, "rb") as f:
            data = f.read(4096)
        return _HOLDER_DECODER.decode(data)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


class LockProbe(msgspec.Struct, frozen=True, kw_only=True):
    """What ``probe_file_lock`` found in a lock file.

    Attributes:
        path: the lock file.
        alive: True while a live process holds it, False when its holder is
            gone (a stale file, left by a SIGKILLed writer), None when that
            cannot be told (no permission to open it, say).
        holder: who the file names; None if it is empty or garbled.
    """

    path: str
    alive: bool | None
    holder: LockHolder | None


def probe_file_lock(path: str) -> LockProbe | None:
    """Whether the lock file at ``path`` is held by a live process; None if there is none.

    For display and for cleaning up (``checkpointer ls``, ``prune``): the
    answer may be out of date as soon as it is returned.  To act on a key,
    take its lock (``acquire_file_lock``), which is authoritative.

    Returns:
        A ``LockProbe``, or None when there is no lock file.
    """
    # Why not simply try a shared flock: while a probe holds LOCK_SH, even
    # for microseconds, a writer taking over a stale file with LOCK_EX|LOCK_NB
    # fails and reports the key as locked.  So when the file names a holder
    # on this host, its pid decides (os.kill(pid, 0); a zombie counts as
    # dead, it holds no files) and the lock is not touched.  Only a file
    # naming no holder (empty: a writer between create and flock; garbled) or
    # one on another host (a shared file system) is asked with a brief
    # LOCK_SH|LOCK_NB.  The price: a reused pid, or a holder in another pid
    # namespace under the same hostname, can be misread; acquiring is never.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError:
        return LockProbe(path=path, alive=None, holder=None)
    try:
        try:
            holder: LockHolder | None = _HOLDER_DECODER.decode(os.pread(fd, 4096, 0))
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            holder = None
        if holder is not None and holder.pid > 0 and holder.host == socket.gethostname():
            return LockProbe(path=path, alive=_pid_alive(holder.pid), holder=holder)
        alive: bool | None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            alive = True
        except OSError:
            alive = None
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            alive = False
        return LockProbe(path=path, alive=alive, holder=holder)
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host is running (not gone, not a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, and belongs to another user
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:  # no procfs: trust kill
        return True
    # "pid (comm) S ...": the state follows the last ")" (comm may hold one).
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] != b"Z"


def _same_file(fd: int, path: str) -> bool:
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


class KeyLocks:
    """The writer locks one ``CheckpointWriter`` holds, one per key.

    Called under the writer's I/O lock only.  A store without the
    ``LockingStore`` capability is not locked: every ``acquire`` succeeds.
    """

    def __init__(self, store: object, timeout: float) -> None:
        self._store = store if isinstance(store, LockingStore) else None
        self._timeout = timeout
        self._held: dict[str, KeyLock] = {}

    def acquire(self, key: str, location: str) -> Failed | bool:
        """Take ``key``'s lock unless held already.

        Returns:
            True when the lock was taken just now (someone else may have
            written the key since this writer last held it), False when it
            was held already or the store does not lock, ``Failed`` when
            another writer holds it or locking failed.
        """
        if self._store is None or key in self._held:
            return False
        try:
            self._held[key] = self._store.lock(key, timeout=self._timeout)
        except KeyLocked as exc:
            return Failed("locked", str(exc))
        except Exception as exc:
            return Failed("write-failed", f"cannot lock {location}: {type(exc).__name__}: {exc}")
        return True

    def release(self, key: str) -> None:
        lock = self._held.pop(key, None)
        if lock is None:
            return
        try:
            lock.release()
        except Exception as exc:  # closing must go on; the kernel frees it at exit
            logger.warning("checkpointer: could not release the lock of %r: %s", key, exc)

    def release_all(self) -> None:
        for key in list(self._held):
            self.release(key)
