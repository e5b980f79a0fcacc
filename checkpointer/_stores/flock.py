"""One writer per key on a local disk: an ``fcntl.flock`` on ``<root>/<key>.lock``.

The kernel drops the lock when its holder dies, even by SIGKILL.  The file
names its holder (pid, host, start) for messages and ``probe_file_lock`` only.
Why ``flock``, and how release avoids the unlink race: docs/concepts/one-writer-per-key.md.
"""

from __future__ import annotations

import contextlib
import fcntl
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

__all__ = ["FileKeyLock", "LockProbe", "acquire_file_lock", "probe_file_lock"]

_POLL = 0.05  # seconds between attempts while waiting for a lock
_HOLDER_MAX = 4096  # a holder is ~70 bytes; more is not one
_HOLDER_START = b'{"pid":'  # how the encoder starts every holder, a torn one too
_HOLDER_ENCODER = msgspec.json.Encoder()
_HOLDER_DECODER = msgspec.json.Decoder(LockHolder)


class FileKeyLock:
    """A held ``flock`` on a lock file; ``release`` removes the file.

    A forked child closes its inherited descriptor right away (``_forget``)
    and a release there only closes: unlocking or unlinking would free the
    parent's lock, and keeping it would hold the key past the parent's death.
    """

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
        try:  # unlinked while still held, and only if the path is still our inode
            if _same_file(fd, self.path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
        finally:
            os.close(fd)

    def _forget(self) -> None:
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


def acquire_file_lock(path: str, *, key: str = "", timeout: float = 0.0) -> FileKeyLock:
    """Take an exclusive ``flock`` on ``path`` (made if missing), waiting up to ``timeout`` s;
    ``KeyLocked`` if another holder still has it then."""
    if not (timeout >= 0 and math.isfinite(timeout)):
        raise ValueError(f"lock timeout must be a finite number of seconds >= 0, got {timeout!r}")
    makedirs_durable(os.path.dirname(path) or ".", 0o700)  # a new root, durably
    deadline = time.monotonic() + timeout
    while True:
        fd, _ = open_checked(path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if _same_file(fd, path):  # else its holder unlinked it as it let go: start over
                _refuse_foreign(fd, path)
                now = datetime.now(UTC)
                holder = LockHolder(pid=os.getpid(), host=socket.gethostname(), started_at=now)
                os.ftruncate(fd, 0)
                os.pwrite(fd, _HOLDER_ENCODER.encode(holder), 0)
                return FileKeyLock(path, fd, holder)
        except BlockingIOError:
            os.close(fd)
            if time.monotonic() >= deadline:
                raise KeyLocked(key or path, path, read_holder(path)) from None
            time.sleep(_POLL)
            continue
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def _refuse_foreign(fd: int, path: str) -> None:
    """``UnsafeFile`` unless the lock file holds nothing, NULs or a (torn) holder: anything
    else was renamed in from elsewhere, and truncating it would destroy a file not ours."""
    size = os.fstat(fd).st_size
    data = os.pread(fd, min(size, _HOLDER_MAX), 0)
    if size <= _HOLDER_MAX and (not data.strip(b"\0") or data.startswith(_HOLDER_START)):
        return
    shown = data[:40] + (b"..." if size > 40 else b"")
    raise UnsafeFile(
        path, f"a file of {size} bytes that hold no lock holder ({shown!r})", expected="a lock file"
    )


def read_holder(path: str) -> LockHolder | None:
    """Who a lock file says holds it (for display); None if it is missing, empty or garbled."""
    try:
        data = read_checked(path, limit=_HOLDER_MAX)
        return None if data is None else _HOLDER_DECODER.decode(data)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


class LockProbe(msgspec.Struct, frozen=True, kw_only=True):
    """What ``probe_file_lock`` found: ``alive`` None when it cannot tell (``problem`` says
    why, when the path is not a lock file of ours); ``holder`` None if none is named."""

    path: str
    alive: bool | None
    holder: LockHolder | None
    problem: str | None = None


def probe_file_lock(path: str) -> LockProbe | None:
    """Whether the lock file at ``path`` is held by a live process; None if there is none.

    For display (``ls``, ``prune``), never authoritative.  A holder named on
    this host is asked by its pid (a zombie is dead), so a writer's lock is
    never contended; only a file naming none, or another host, gets a brief
    ``LOCK_SH|LOCK_NB``.
    """
    try:
        fd, _ = open_checked(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except UnsafeFile as exc:
        return LockProbe(path=path, alive=None, holder=None, problem=str(exc))
    except OSError:
        return LockProbe(path=path, alive=None, holder=None)
    try:
        try:
            holder: LockHolder | None = _HOLDER_DECODER.decode(os.pread(fd, _HOLDER_MAX, 0))
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
