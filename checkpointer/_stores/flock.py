"""One writer per key on a local disk: an OS advisory lock on ``<root>/<key>.lock``.

``FileStore.lock`` (the ``LockingStore`` capability of ``base.py``) takes it;
the writer holds it through ``_writer/keylocks.py``; the CLI looks at it
with ``probe_file_lock``.

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

A forked child (a ``multiprocessing`` worker) shares the parent's lock
through the inherited descriptor: the lock belongs to the open file
description, so ``flock(LOCK_UN)`` there would release it for the parent,
and unlinking the file would let a third process lock a new file under the
same name.  Closing the child's descriptor releases nothing while the
parent holds its own, and it must be closed: otherwise a worker that
outlives a SIGKILLed parent keeps the key locked.  So right after a fork
the child closes the descriptor of every held ``FileKeyLock`` and forgets
it, and ``release`` in a process other than the one that locked never
unlocks or unlinks; the writer's ``KeyLocks`` forgets, without releasing,
the locks of any store that a forked child inherited.

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
import weakref
from datetime import UTC, datetime

import msgspec

from .atomic import makedirs_durable
from .base import KeyLocked, LockHolder
from .safefs import UnsafeFile, open_checked, read_checked

__all__ = [
    "FileKeyLock",
    "LockProbe",
    "acquire_file_lock",
    "probe_file_lock",
    "read_holder",
]

logger = logging.getLogger("checkpointer")

_POLL = 0.05  # seconds between attempts while waiting for a lock


_HOLDER_ENCODER = msgspec.json.Encoder()
_HOLDER_DECODER = msgspec.json.Decoder(LockHolder)


class FileKeyLock:
    """A held ``flock`` on a lock file; ``release`` removes the file."""

    def __init__(self, path: str, fd: int, holder: LockHolder) -> None:
        self.path = path
        self.holder = holder
        self._fd: int | None = fd
        self._pid = os.getpid()
        _held_files.add(self)

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
        _held_files.discard(self)
        if self._pid != os.getpid():  # a forked child: the lock is the parent's
            os.close(fd)
            return
        try:
            # Unlink while still holding, and only our own inode (the file is
            # never unlinked by anyone else while held, unless by hand).
            if _same_file(fd, self.path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
        finally:
            os.close(fd)

    def _forget(self) -> None:
        """In a forked child: close the inherited descriptor; no unlock, no unlink."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


_held_files: weakref.WeakSet[FileKeyLock] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for lock in list(_held_files):
        lock._forget()
    _held_files.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


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
        UnsafeFile: ``path`` is a symbolic link, a FIFO, a directory, a file
            with a second hard link or of an untrusted owner, or a file that
            holds something other than a lock holder (renamed in from
            elsewhere?); it is left as it is.
        OSError: the file cannot be created or locked.
    """
    if not (timeout >= 0 and math.isfinite(timeout)):
        raise ValueError(f"lock timeout must be a finite number of seconds >= 0, got {timeout!r}")
    makedirs_durable(os.path.dirname(path) or ".", dir_mode)  # a new root, durably
    deadline = time.monotonic() + timeout
    while True:
        # Never through a link, a FIFO or a second hard link: the holder's
        # JSON goes into this file in place (see safefs).
        fd, _ = open_checked(path, os.O_RDWR | os.O_CREAT)
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
            _refuse_foreign(fd, path)
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


def _refuse_foreign(fd: int, path: str) -> None:
    """Raise ``UnsafeFile`` unless the lock file ``fd`` holds nothing or a lock holder.

    A lock file only ever holds a holder's JSON (or nothing, between create
    and write; NUL bytes or a torn holder after a power cut).  Anything else
    is a file that someone renamed in from elsewhere (a root-owned file of a
    directory they can write, say): truncating it would write outside the
    root, so it is left as it is.
    """
    size = os.fstat(fd).st_size
    if size == 0:
        return
    data = os.pread(fd, min(size, _HOLDER_MAX), 0)
    if size <= _HOLDER_MAX:
        if not data.strip(b"\0") or data.startswith(_HOLDER_START):
            return
        with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
            _HOLDER_DECODER.decode(data)
            return
    shown = data[:40] + (b"..." if size > 40 else b"")
    raise UnsafeFile(
        path,
        f"a file of {size} bytes that hold no lock holder ({shown!r})",
        expected="a lock file",
    )


_HOLDER_MAX = 4096  # a holder is ~70 bytes; more is not one
_HOLDER_START = b'{"pid":'  # how the encoder starts every holder (a torn one too)


def read_holder(path: str) -> LockHolder | None:
    """Who a lock file says holds it; None if it is missing, empty or garbled.

    Reads without locking: the answer is for display only.
    """
    try:
        data = read_checked(path, limit=4096)  # no link followed, no FIFO waited on
        return None if data is None else _HOLDER_DECODER.decode(data)
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
        problem: what is wrong with the path when it is not a lock file
            this library made (a symbolic link, a FIFO, ...: ``alive`` is
            None then, and the file was not opened or not read); else None.
    """

    path: str
    alive: bool | None
    holder: LockHolder | None
    problem: str | None = None


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
        # Never a link, a FIFO (no wait), a second hard link (no LOCK_SH on it).
        fd, _ = open_checked(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except UnsafeFile as exc:
        return LockProbe(path=path, alive=None, holder=None, problem=str(exc))
    except OSError:
        return LockProbe(path=path, alive=None, holder=None)
    try:
        try:
            holder: LockHolder | None = _HOLDER_DECODER.decode(os.pread(fd, 4096, 0))
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            holder = None
        if holder is not None and holder.pid > 0 and holder.host == socket.gethostname():
            with contextlib.suppress(OverflowError):  # a pid beyond pid_t: ask the kernel
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
