"""Durable atomic replacement of a file: the one module that calls fsync.

The recipe (``_write_at``): a temp file in the target's directory, written
and fsynced, renamed onto the target, then the directory fsynced.  After an
fsync error the caller rewrites from memory into a fresh temp: a second
fsync of the same file may "succeed" with its dirty pages dropped.

Writes into one directory share its fsync (``sync_dir``, group commit): one
that finds none running fsyncs at once; those whose rename comes while it
runs wait and share the next, so a burst of N writes costs N file fsyncs and
about two directory fsyncs, not N of each.

A write holds an ``flock`` on its temp until after the rename, and the
kernel drops it when the writer dies: so ``sweep_temps`` removes exactly
the temps no live process holds, whatever pid namespace it runs in.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import random
import re
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from .base import time_left

__all__ = [
    "STALE_AFTER",
    "fsync_dir",
    "fsync_fd",
    "fsync_parents",
    "makedirs_durable",
    "sweep_temps",
    "sync_dir",
    "write_all",
    "write_atomic",
]

STALE_AFTER = 600.0
"""Seconds before a temp that may not be locked yet (mode 000, or no flock here) is swept."""

_TEMP_RE = re.compile(r"^\.(?P<name>.+)\.[0-9a-f]{16}\.tmp$")
_TEMP_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_NO_DIR_FSYNC = frozenset({errno.EACCES, errno.EPERM, errno.EINVAL, errno.ENOTSUP, errno.ENOSYS})
_IOV_MAX = 1024  # the most buffers one writev takes (Linux, macOS)


def fsync_fd(fd: int) -> None:
    """``os.fsync(fd)``, looked up at each call so that a test replacing it sees every fsync."""
    os.fsync(fd)


def fsync_dir(directory: str, fsync: Callable[[int], None] = fsync_fd) -> None:
    """Make the entries of ``directory`` (renames, new files, unlinks) durable (``sync_dir``)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        sync_dir(fd, fsync)
    finally:
        os.close(fd)


def fsync_parents(directory: str, fsync: Callable[[int], None] = fsync_fd) -> None:
    """Make ``directory``'s entry durable, and each one above it on its filesystem.

    A root made with ``os.makedirs`` may never have been, and its checkpoints
    would vanish with it at a power cut.  Walks the absolute and the real
    path up to the mount point; one this user may not fsync ends the walk.
    """
    done: set[tuple[int, int]] = set()
    for start in dict.fromkeys([os.path.abspath(directory), os.path.realpath(directory)]):
        path, below = start, os.stat(start)
        while (parent := os.path.dirname(path)) != path:
            st = os.stat(parent)
            if st.st_dev != below.st_dev:
                break  # ``path`` is a mount point
            if (st.st_dev, st.st_ino) not in done:
                try:
                    fsync_dir(parent, fsync)
                except OSError as exc:
                    if exc.errno in _NO_DIR_FSYNC:
                        break
                    raise
                done.add((st.st_dev, st.st_ino))
            path, below = parent, st


def makedirs_durable(
    directory: str, mode: int = 0o777, fsync: Callable[[int], None] = fsync_fd
) -> None:
    """``os.makedirs(directory, mode, exist_ok=True)``, fsyncing the parent of each one made.

    Also when another process made it meanwhile: it may not have fsynced yet.
    """
    missing: list[str] = []
    head = os.path.abspath(directory)
    while not _is_dir(head):
        missing.append(head)
        parent = os.path.dirname(head)
        if parent == head:
            break
        head = parent
    for path in reversed(missing):
        try:
            os.mkdir(path, mode if path == missing[0] else 0o777)
        except FileExistsError:
            if not _is_dir(path):  # a file where a directory goes: say so, as open would
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path) from None
        fsync_dir(os.path.dirname(path), fsync)


def _is_dir(path: str) -> bool:
    # Not os.path.isdir: it says False for an EIO too.
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


def write_atomic(
    path: str,
    chunks: Sequence[bytes],
    *,
    mode: int = 0o600,
    dir_mode: int = 0o700,
    dir_fd: int | None = None,
    fsync: Callable[[int], None] = fsync_fd,
    replace: Callable[..., None] = os.replace,
) -> int:
    """Replace ``path`` with the joined ``chunks``, durably; blocking; return the bytes.

    Makes the parent directory (``dir_mode``) if missing.  A link at ``path``
    is replaced, never written through.  With ``dir_fd`` (``safefs.open_subdir``)
    all goes through that descriptor.  ``fsync``, ``replace``: test seams.
    An ``OSError`` leaves no temp and ``path`` as it was, unless only the
    directory's fsync failed (then the new file is in place).
    """
    directory, name = os.path.split(path)
    if dir_fd is not None:
        return _write_at(dir_fd, name, chunks, mode, fsync, replace)
    directory = directory or "."
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:  # the first write: make the directory
        makedirs_durable(directory, dir_mode)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return _write_at(fd, name, chunks, mode, fsync, replace)
    finally:
        os.close(fd)


def _write_at(
    dir_fd: int,
    name: str,
    chunks: Sequence[bytes],
    mode: int,
    fsync: Callable[[int], None],
    replace: Callable[..., None],
) -> int:
    """The recipe in the directory ``dir_fd``: temp, lock, write, fsync, rename, dir fsync."""
    fd, tmp = _create_temp(name, dir_fd)
    try:
        try:
            # Locked before it gets its mode: a sweep leaves a young temp of mode
            # 000 alone.  No flock here (some network filesystems): it goes by age.
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.fchmod(fd, mode)
            size = write_all(fd, chunks)
            fsync(fd)
            replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
    finally:
        os.close(fd)  # the lock goes with it, after the rename
    sync_dir(dir_fd, fsync)
    return size


_RELEASE = type(threading.Lock()).release


class _Batch:
    """The writes one directory fsync covers; ``error`` is its failure, once ``done``.

    ``gates``: a lock per caller waiting for this batch to end, each held by
    its caller and released by ``wake``: one C call that releases them all,
    so no signal handler's exception can fall between two of them.
    """

    __slots__ = ("done", "error", "gates", "wake")

    def __init__(self) -> None:
        self.done = False
        self.error: OSError | None = None
        self.gates: list[threading.Lock] = []
        self.wake = map(_RELEASE, self.gates)  # lazy: sees the gates added until it runs


class _Group:
    """Group commit of one directory's fsync, among the threads of this process.

    ``pending`` is the batch a caller joins: its fsync begins after every
    rename made before the caller came.  The first caller to find no batch
    ``running`` leads ``pending``; the others wait for the running one to
    end, then lead theirs or find it done.  ``lock`` is held only around
    assignments and C calls, never across a wait or an fsync, and a signal
    handler on a thread inside ``sync_dir`` never takes it (``_inside``): so
    neither an interrupt nor a re-entry can leave it held.
    """

    __slots__ = ("lock", "pending", "running")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending = _Batch()
        self.running: _Batch | None = None


# {(st_dev, st_ino) of a directory: its group}, and the threads inside sync_dir: a
# forked child starts afresh (a thread of the parent may have led a batch).
_groups: dict[tuple[int, int], _Group] = {}
_inside: dict[int, None] = {}


def _forget_groups() -> None:
    _groups.clear()
    _inside.clear()


os.register_at_fork(after_in_child=_forget_groups)


def sync_dir(dir_fd: int, fsync: Callable[[int], None] | None = None) -> None:
    """Return once a directory fsync begun after this call has ended; raise its error.

    Each writer of a batch gets an ``OSError`` of its own with the fsync's
    errno; none retries it (a second fsync may call clean what the first
    dropped).  The wait for another thread's fsync is bounded by the
    caller's ``commit_deadline`` (``TimeoutError`` past it).  Re-entered on
    a thread already inside (a signal handler's flush), it fsyncs by itself:
    the batch it would wait for may be the one this thread leads.
    ``fsync``: a test seam (default ``fsync_fd``).
    """
    fsync = fsync or fsync_fd
    me = threading.get_ident()
    if me in _inside:
        fsync(dir_fd)
        return
    _inside[me] = None
    try:
        batch = _grouped(dir_fd, fsync)
    finally:
        _inside.pop(me, None)
    if batch.error is not None:
        error = batch.error
        raise OSError(error.errno, error.strerror or str(error)) from error


def _grouped(dir_fd: int, fsync: Callable[[int], None]) -> _Batch:
    """``sync_dir`` through the directory's group: the caller's batch, ended.

    Leading is decided and undone under the group's lock inside one ``try``,
    and the batch's end and its callers' wake are one step: an exception
    between any two bytecodes (a signal handler's) ends the batch it led.
    Anything but an OSError in its fsync is an EIO for the others.
    """
    st = os.fstat(dir_fd)
    key = (st.st_dev, st.st_ino)
    group = _groups.get(key) or _groups.setdefault(key, _Group())
    batch, leads = group.pending, False
    try:
        while True:
            gate = threading.Lock()
            gate.acquire()
            with group.lock:
                running = group.running
                if batch.done:
                    return batch
                if running is None:  # none running, this batch not begun: it fsyncs for it
                    group.running, group.pending, leads = batch, _Batch(), True
                    break
                running.gates.append(gate)
            _wait(gate)
        fsync(dir_fd)
    except OSError as exc:
        if not leads:
            raise
        batch.error = exc
    except BaseException as exc:
        if leads:
            batch.error = OSError(errno.EIO, f"the directory's fsync was interrupted: {exc!r}")
        raise
    finally:
        if leads:
            with group.lock:
                batch.done, group.running = True, None
                deque(batch.wake, 0)
                if not batch.gates and _groups.get(key) is group:
                    del _groups[key]  # none waits (one holding it leads its own batches)
    return batch


def _wait(gate: threading.Lock) -> None:
    """Wait for the running batch to release ``gate``, up to the caller's ``commit_deadline``."""
    if not gate.acquire(timeout=-1 if (left := time_left()) < 0 else left):
        raise TimeoutError(
            errno.ETIMEDOUT, "another write's fsync of this directory did not end in time"
        )


_names = random.Random()
os.register_at_fork(after_in_child=_names.seed)  # a child draws names of its own


def _create_temp(name: str, dir_fd: int) -> tuple[int, str]:
    """A new temp ``.<name>.<16 hex>.tmp`` of mode 000 (``mkstemp``'s name costs microseconds).

    The name need only be new, not secret (``O_EXCL`` refuses a taken one: a
    child forked outside Python's fork hooks, drawing its parent's names, pays a
    retry): no ``getrandom`` syscall, which releases the GIL and, in a burst of
    writes, waits to take it back.  A generator of its own, so the program's
    ``random`` sequence (a seeded run) is not ours to consume.
    """
    while True:
        tmp = f".{name}.{_names.getrandbits(64):016x}.tmp"
        try:
            return os.open(tmp, _TEMP_FLAGS, 0, dir_fd=dir_fd), tmp
        except FileExistsError:
            continue


def write_all(fd: int, chunks: Sequence[bytes]) -> int:
    """Write ``chunks`` in order with ``os.writev`` (up to IOV_MAX at a time); return the bytes.

    Never joined: a 50 MB checkpoint is not one buffer allocated and freed
    holding the GIL; ``writev`` releases it.
    """
    total = 0
    for start in range(0, len(chunks), _IOV_MAX):
        batch: Sequence[bytes | memoryview] = chunks[start : start + _IOV_MAX]
        left = sum(map(len, batch))
        total += left
        while left:
            written = os.writev(fd, batch)
            if written <= 0:
                raise OSError(f"writev wrote {written} of {left} bytes")
            left -= written
            if left:  # a short write: resume mid-buffer
                skip = 0
                while written >= len(batch[skip]):
                    written -= len(batch[skip])
                    skip += 1
                batch = [memoryview(batch[skip])[written:], *batch[skip + 1 :]]
    return total


def sweep_temps(directory: str, now: Callable[[], float] = time.time) -> list[str]:
    """Remove the temps in ``directory`` that no live write holds; return their paths.

    A missing directory is not an error, nor is an entry that cannot be
    removed.  ``now`` is a seam for tests.
    """
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return removed
    for name in names:
        if _TEMP_RE.match(name) is None:
            continue
        path = os.path.join(directory, name)
        with contextlib.suppress(OSError):
            if _remove_abandoned(path, now()):
                removed.append(path)
    return removed


def _remove_abandoned(path: str, now: float) -> bool:
    """Unlink the temp ``path``, holding its lock, unless a write may still hold it.

    A writer locks its temp before giving it its mode, so a young temp of
    mode 000 is not touched (trying its lock could be what makes its
    writer's fail).  Anything but a regular file under a temp's name (a
    link, a FIFO) is no writer's: the name goes.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        os.unlink(path)  # a symbolic link: the link goes, what it names stays
        return True
    try:
        st = os.fstat(fd)
        young = now - st.st_mtime < STALE_AFTER
        if stat.S_ISREG(st.st_mode):
            if young and not stat.S_IMODE(st.st_mode):
                return False
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN) or young:
                    return False  # a live write holds it, or no flock here and it is young
        os.unlink(path)
        return True
    finally:
        os.close(fd)
