"""Atomic, durable replacement of a file: the one place that calls fsync.

Every ``fsync`` of the library is made here: the temp file and the
directory of ``write_atomic``, the directories ``makedirs_durable`` makes,
the directories above a store's root once per store (``fsync_parents``),
``fsync_dir`` after a rename or an unlink made elsewhere (``move_aside``,
``delete``: a delete comes back after a power cut until its directory is
fsynced),
and ``fsync_fd`` for what other modules write in place (a journal's append
and its torn-tail truncation, a directory ``safefs.open_subdir`` made).

The recipe, written once (``_write_at``, in a directory's descriptor):

1. a temp file in the target's own directory (``mkstemp``: O_EXCL, 0600);
2. set the intended mode, write everything, ``fsync`` the file;
3. ``os.replace`` onto the target, so readers see the old or the new file;
4. ``fsync`` the directory, so the rename itself is durable;
5. on any error unlink the temp.  After an fsync error the caller retries
   with a fresh temp file built from memory: never fsync the same file again,
   the kernel may have dropped its dirty pages.

``sweep_temps`` removes the debris of dead processes only, never a temp
that a live writer is about to rename.  What proves a write live is a lock:
the writer holds an ``flock`` on its temp file from right after creating it
until after the rename, and the sweep removes only a temp it can lock
itself (non-blocking).  A temp still of mode 000 (a temp is created so,
and gets its mode once locked: its writer may have created it an instant
ago) that names our own pid goes only once it has not changed for
``STALE_AFTER`` seconds; one naming a pid not alive here goes at once (a
writer in another pid namespace is at risk then only in the instant
between creating its temp and locking it).
The kernel drops the lock when the writer dies, even by SIGKILL, so the
debris of a killed run goes at the next open.  A pid cannot say it: two
containers on one volume are both pid 1, each in its own pid namespace,
and each would take the other's temps for debris of its own earlier run.

Temp names also say which process wrote them, ``.<name>.<pid>.<tag><random>.tmp``,
and a temp whose writer is plainly alive in our pid namespace is kept
without a look at its lock.  The tag (``_tag``) tells one process from
another that had the same pid: a hash of the boot id and the process's
start time (``/proc/<pid>/stat``); or, where ``/proc`` cannot be read, a
random one that only the process itself knows.  Names without a tag (from
versions before it) are still swept, by the same lock and age.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import secrets
import stat
import time
from collections.abc import Callable, Sequence

__all__ = [
    "STALE_AFTER",
    "fsync_dir",
    "fsync_fd",
    "fsync_parents",
    "makedirs_durable",
    "sweep_temps",
    "write_all",
    "write_atomic",
]

STALE_AFTER = 600.0
"""Seconds since its last change before an unlocked temp of mode 000, or one on a
filesystem without flock, may be swept."""

_TEMP_RE = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.(?P<rest>[A-Za-z0-9_]+)\.tmp$")
# The tag and mkstemp's 8 random characters; an older name has the 8 only.
_TAGGED_RE = re.compile(r"^(?P<tag>[sr][0-9a-f]{15})[a-z0-9_]{8}$")


def fsync_fd(fd: int) -> None:
    """Make what was written through ``fd`` durable (a file, or a directory's entries).

    ``os.fsync`` is looked up at each call, so a test that replaces it sees
    every fsync of the library.  After it fails, never call it again on the
    same file (the kernel may have dropped its dirty pages, so a second
    fsync can "succeed" with data lost): rewrite the file from memory.
    """
    os.fsync(fd)


def fsync_dir(directory: str, fsync: Callable[[int], None] = os.fsync) -> None:
    """Make the entries of ``directory`` (renames, new files) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fsync(fd)
    finally:
        os.close(fd)


_NO_DIR_FSYNC = frozenset({errno.EACCES, errno.EPERM, errno.EINVAL, errno.ENOTSUP, errno.ENOSYS})


def fsync_parents(directory: str, fsync: Callable[[int], None] = fsync_fd) -> None:
    """Make the entry of ``directory`` durable, and of each directory above it on its filesystem.

    ``makedirs_durable`` fsyncs the parent of each directory it makes; a
    directory that was already there may never have been made durable: the
    app made the root with ``os.makedirs``, or a process was killed between
    its ``mkdir`` and the parent's fsync (or is still in that window).  Then
    every checkpoint written into it vanishes with it at a power cut.  So a
    store calls this once, at its first write.  It walks up the absolute
    path and, when ``directory`` is reached through a symbolic link, the
    real one too, up to the filesystem's mount point (the walk stops where
    ``st_dev`` changes).  An ancestor that this user may not open or that
    cannot be fsynced (EACCES, EINVAL, ...) ends the walk quietly: the
    directories below it are done, nothing more can be.

    Raises:
        OSError: ``directory`` cannot be looked at, or an fsync failed (EIO).
    """
    done: set[tuple[int, int]] = set()
    for start in dict.fromkeys([os.path.abspath(directory), os.path.realpath(directory)]):
        path, below = start, os.stat(start)
        while (parent := os.path.dirname(path)) != path:
            st = os.stat(parent)
            if st.st_dev != below.st_dev:
                break  # ``path`` is a mount point: its entry is another filesystem's
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
    directory: str, mode: int = 0o777, fsync: Callable[[int], None] = os.fsync
) -> None:
    """``os.makedirs(directory, mode, exist_ok=True)``, each directory made durable.

    A directory that ``mkdir`` made survives a power cut only once the
    directory holding it is fsynced; until then a new store root can vanish
    with every checkpoint reported written in it (``tests/powercut.py``
    found this).  So the parent of each missing directory is fsynced after
    its ``mkdir``, also when another process made it meanwhile (it may not
    have got that far).  ``mode`` is the last directory's, as with makedirs.
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
    """Whether ``path`` is a directory; an error other than "not there" is raised.

    (``os.path.isdir`` says False for an EIO too, and makedirs then reports
    a ``FileExistsError`` for a directory that is there but cannot be read.)
    """
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
    fsync: Callable[[int], None] = os.fsync,
    replace: Callable[..., None] = os.replace,
) -> int:
    """Replace ``path`` with the concatenation of ``chunks``, durably.

    Creates the parent directory (with ``dir_mode``) when it is missing,
    durably (``makedirs_durable``).
    Blocking: call it from a worker thread or a synchronous exit path.
    ``fsync`` (of the temp file, then of the directory) and ``replace`` are
    seams for fault-injection tests.

    The rename replaces the name ``path``: a symbolic link or a hard link
    there is replaced, never written through.  With ``dir_fd`` (a directory
    below a store's root, opened by ``safefs.open_subdir``), the temp file,
    the rename (``replace(tmp, name, src_dir_fd=, dst_dir_fd=)``) and the
    fsync all go through that descriptor, so no link swapped in for the
    directory can redirect them; ``path`` then names the file in messages
    and its basename is the name in ``dir_fd``.

    Returns:
        The number of bytes written.

    Raises:
        OSError: any step failed; no temp file is left behind, and ``path``
            still holds its previous content, unless only the final directory
            fsync failed (then the new content is in place, maybe not durably).
    """
    directory, name = os.path.split(path)
    if dir_fd is not None:
        return _write_at(dir_fd, name, chunks, mode, fsync, replace)
    directory = directory or "."
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:  # first write: make the directory (a syscall saved per write)
        makedirs_durable(directory, dir_mode)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return _write_at(fd, name, chunks, mode, fsync, replace)
    finally:
        os.close(fd)


def _hold(fd: int) -> None:
    """Lock a new temp file for as long as it is being written (``sweep_temps`` reads it).

    A filesystem without flock (some network ones: ENOLCK, EOPNOTSUPP) writes
    on unlocked, and the sweep's age rule alone keeps its temp.
    """
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


_TEMP_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _write_at(
    dir_fd: int,
    name: str,
    chunks: Sequence[bytes],
    mode: int,
    fsync: Callable[[int], None],
    replace: Callable[..., None],
) -> int:
    """The recipe, in the directory ``dir_fd``: temp, lock, write, fsync, rename, dir fsync."""
    pid, tag = _me()
    fd, tmp = _create_temp(f".{name}.{pid}.{tag}", dir_fd)
    try:
        try:
            _hold(fd)
            os.fchmod(fd, mode)
            size = write_all(fd, chunks)
            fsync(fd)
            replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
    finally:
        os.close(fd)  # the lock goes with it, after the rename: the sweep's proof of a live write
    fsync(dir_fd)
    return size


def _create_temp(prefix: str, dir_fd: int | None = None) -> tuple[int, str]:
    """A new temp file ``<prefix><8 random>.tmp``, as ``mkstemp`` makes one, but mode 000.

    Mode 000 until it is locked (``_hold``) and given its mode: the sweep's
    sign of a temp whose writer may not have locked it yet (``_UNLOCKED_YET``).

    Open-coded (``O_EXCL``, a fresh random name until one is free) rather
    than ``tempfile.mkstemp``, whose name generator costs several
    microseconds a write in Python code.
    """
    for _ in range(100):
        tmp = f"{prefix}{secrets.token_hex(4)}.tmp"  # 8 characters, as mkstemp's
        try:
            return os.open(tmp, _TEMP_FLAGS, 0, dir_fd=dir_fd), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temp file name", prefix)


_IOV_MAX = 1024  # IOV_MAX on Linux and macOS: the most buffers one writev takes


def write_all(fd: int, chunks: Sequence[bytes]) -> int:
    """Write ``chunks`` in order with ``os.writev``, batches of up to IOV_MAX.

    No joined copy is made: a 50 MB checkpoint in 50,000 pieces is never one
    50 MB buffer that would have to be faulted in and, worse, freed while
    holding the GIL (tens of milliseconds on a busy machine).  The GIL is
    released during each ``writev``.

    Returns:
        The number of bytes written.
    """
    if len(chunks) <= _IOV_MAX:  # the common case: one writev that writes it all
        size = sum(map(len, chunks))
        written = os.writev(fd, chunks)
        if written == size:
            return size
        return written + _write_rest(fd, _after(chunks, written))
    total = 0
    for start in range(0, len(chunks), _IOV_MAX):
        batch: list[bytes | memoryview] = list(chunks[start : start + _IOV_MAX])
        left = sum(map(len, batch))
        while left:
            written = os.writev(fd, batch)
            if written <= 0:
                raise OSError(f"writev wrote {written} of {left} bytes")
            total += written
            left -= written
            if not left:
                break
            skip = 0  # a short write: drop what went out, resume mid-buffer
            while written >= len(batch[skip]):
                written -= len(batch[skip])
                skip += 1
            batch = [memoryview(batch[skip])[written:], *batch[skip + 1 :]]
    return total


def _write_rest(fd: int, chunks: list[bytes | memoryview]) -> int:
    """After a short ``writev``: the rest, one buffer at a time."""
    total = 0
    for chunk in chunks:
        view = memoryview(chunk)
        while view:
            written = os.write(fd, view)
            if written <= 0:
                raise OSError(f"write wrote {written} of {len(view)} bytes")
            total += written
            view = view[written:]
    return total


def _after(chunks: Sequence[bytes], written: int) -> list[bytes | memoryview]:
    """What is left of ``chunks`` once ``written`` bytes of them went out."""
    if written <= 0:
        raise OSError(f"writev wrote {written} bytes")
    skip = 0
    while written >= len(chunks[skip]):
        written -= len(chunks[skip])
        skip += 1
    return [memoryview(chunks[skip])[written:], *chunks[skip + 1 :]]


def sweep_temps(directory: str, now: Callable[[], float] = time.time) -> list[str]:
    """Remove temp files left in ``directory`` by processes that are gone.

    A temp goes only when no process holds its lock (``_remove_abandoned``;
    ``now``, a seam for tests, is compared with an empty temp's mtime); one
    whose writer is alive by pid and tag is kept anyway.

    Returns:
        The paths removed.  A missing directory is not an error.
    """
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return removed
    for name in names:
        match = _TEMP_RE.match(name)
        if match is None:
            continue
        tagged = _TAGGED_RE.match(match["rest"])
        if _alive(int(match["pid"]), tagged["tag"] if tagged else None):
            continue
        path = os.path.join(directory, name)
        # unlink removes the name only: a link planted under a temp's name
        # goes, what it points to stays.  One entry we cannot remove (gone
        # already, not ours, a directory) must not stop the sweep or fail
        # the store's open().
        with contextlib.suppress(OSError):
            if _remove_abandoned(path, now(), patient=int(match["pid"]) == _me()[0]):
                removed.append(path)
    return removed


def _remove_abandoned(path: str, now: float, *, patient: bool) -> bool:
    """Unlink the temp ``path`` if nobody writes it; the unlink is made holding its lock.

    A regular file goes when no process holds its lock and its mode is set
    (a writer creates its temp with mode 000, locks it, then sets the mode).
    One of mode 000, or on a filesystem without flock, that names our own
    pid (``patient``: another container's pid 1 is ours too) waits until it
    is ``STALE_AFTER`` seconds old; with another pid, that pid was found dead.
    Anything else under a temp's name (a link, a fifo) is no writer's temp.

    Returns:
        Whether it was removed.
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
        if stat.S_ISREG(st.st_mode):
            free = _try_lock(fd)
            if free is False:
                return False  # a live writer holds it, whatever its pid says
            fresh = free is None or not stat.S_IMODE(st.st_mode)
            if fresh and patient and now - st.st_mtime < STALE_AFTER:
                return False  # mode 000: created a moment ago, maybe, its lock not taken yet
        os.unlink(path)
        return True
    finally:
        os.close(fd)


def _try_lock(fd: int) -> bool | None:
    """Lock ``fd`` unless another holds it: True if taken, False if held, None: no flock here."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        return None
    return True


def _alive(pid: int, tag: str | None) -> bool:
    """Whether the process that wrote a temp named with ``pid`` and ``tag`` may still run."""
    me, my_tag = _me()
    if pid == me:
        return tag == my_tag  # an untagged name is never ours
    if not _pid_exists(pid):
        return False
    if tag is not None and tag.startswith("s"):
        theirs = _start_tag(pid)
        return theirs is None or theirs == tag  # None: cannot tell, keep it
    return True


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OverflowError:
        return False
    return True


_mine: tuple[int, str] | None = None


def _me() -> tuple[int, str]:
    """This process's pid and tag; computed again in a forked child.  A seam for tests."""
    global _mine
    pid = os.getpid()
    if _mine is None or _mine[0] != pid:
        _mine = (pid, _start_tag("self") or "r" + secrets.token_hex(8)[:15])
    return _mine


def _start_tag(pid: int | str) -> str | None:
    """``"s"`` and 15 hex digits naming the process ``pid`` in this boot, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        # pid (comm) state ppid ...: comm may hold spaces and parentheses.
        start = stat[stat.rindex(b")") + 2 :].split()[19]  # field 22, starttime
    except (OSError, ValueError, IndexError):
        return None
    digest = hashlib.blake2b(_boot_id() + b":" + start, digest_size=8).hexdigest()
    return "s" + digest[:15]


_boot: bytes | None = None


def _boot_id() -> bytes:
    """This boot's id: start times count from the boot, and pid 1 starts every one."""
    global _boot
    if _boot is None:
        try:
            with open("/proc/sys/kernel/random/boot_id", "rb") as f:
                _boot = f.read().strip()
        except OSError:
            _boot = b""
    return _boot
