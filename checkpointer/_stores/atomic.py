"""Atomic, durable replacement of a file: the one place that calls fsync.

Every ``fsync`` of the library is made here: the temp file and the
directory of ``write_atomic``, the directories ``makedirs_durable`` makes,
and ``fsync_fd`` for what other modules write in place (a journal's append
and its torn-tail truncation, a directory ``safefs.open_subdir`` made).

The recipe (``../shared/FACTS.md``, "Durable atomic replace on Linux"):

1. a temp file in the target's own directory (``mkstemp``: O_EXCL, 0600);
2. set the intended mode, write everything, ``fsync`` the file;
3. ``os.replace`` onto the target, so readers see the old or the new file;
4. ``fsync`` the directory, so the rename itself is durable;
5. on any error unlink the temp.  After an fsync error the caller retries
   with a fresh temp file built from memory: never fsync the same file again,
   the kernel may have dropped its dirty pages.

Temp names say which process wrote them, ``.<name>.<pid>.<tag><random>.tmp``,
so ``sweep_temps`` removes the debris of dead processes only, never a temp
that a live writer is about to rename.  A pid alone does not say it: pids
are reused, and in a container every run is pid 1, so the temps of the
previous run would look like our own forever.  The tag (``_tag``) tells one
process from another that had the same pid: a hash of the boot id and the
process's start time (``/proc/<pid>/stat``), which the sweep can compute for
any live pid; or, where ``/proc`` cannot be read, a random one that only the
process itself knows.  Names without a tag (from versions before it) are
still swept: by pid, and always when the pid is ours, since we never write
them.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import secrets
import stat
from collections.abc import Callable, Sequence

__all__ = [
    "fsync_dir",
    "fsync_fd",
    "makedirs_durable",
    "sweep_temps",
    "write_all",
    "write_atomic",
]

_TEMP_RE = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.(?P<rest>[A-Za-z0-9_]+)\.tmp$")
# The tag and mkstemp's 8 random characters; an older name has the 8 only.
_TAGGED_RE = re.compile(r"^(?P<tag>[sr][0-9a-f]{15})[a-z0-9_]{8}$")


def fsync_fd(fd: int) -> None:
    """Make what was written through ``fd`` durable (a file, or a directory's entries).

    ``os.fsync`` is looked up at each call, so a test that replaces it sees
    every fsync of the library.  After it fails, never call it again on the
    same file (FACTS.md): rewrite the file from memory instead.
    """
    os.fsync(fd)


def fsync_dir(directory: str, fsync: Callable[[int], None] = os.fsync) -> None:
    """Make the entries of ``directory`` (renames, new files) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fsync(fd)
    finally:
        os.close(fd)


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
            if not _is_dir(path):
                raise
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
    directory = directory or "."
    if dir_fd is not None:
        return _write_atomic_at(dir_fd, name, chunks, mode, fsync, replace)
    pid, tag = _me()
    prefix = os.path.join(directory, f".{name}.{pid}.{tag}")
    try:
        fd, tmp = _create_temp(prefix)
    except FileNotFoundError:  # first write: make the directory (a syscall saved per write)
        makedirs_durable(directory, dir_mode)
        fd, tmp = _create_temp(prefix)
    try:
        try:
            os.fchmod(fd, mode)
            size = write_all(fd, chunks)
            fsync(fd)
        finally:
            os.close(fd)
        replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(directory, fsync)
    return size


_TEMP_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _write_atomic_at(
    dir_fd: int,
    name: str,
    chunks: Sequence[bytes],
    mode: int,
    fsync: Callable[[int], None],
    replace: Callable[..., None],
) -> int:
    """``write_atomic`` relative to a directory descriptor (``openat``, ``renameat``)."""
    pid, tag = _me()
    fd, tmp = _create_temp(f".{name}.{pid}.{tag}", dir_fd)
    try:
        try:
            os.fchmod(fd, mode)
            size = write_all(fd, chunks)
            fsync(fd)
        finally:
            os.close(fd)
        replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    fsync(dir_fd)
    return size


def _create_temp(prefix: str, dir_fd: int | None = None) -> tuple[int, str]:
    """A new temp file ``<prefix><8 random>.tmp``, mode 0600, as ``mkstemp`` makes one.

    Open-coded (``O_EXCL``, a fresh random name until one is free) rather
    than ``tempfile.mkstemp``, whose name generator costs several
    microseconds a write in Python code.
    """
    for _ in range(100):
        tmp = f"{prefix}{secrets.token_hex(4)}.tmp"  # 8 characters, as mkstemp's
        try:
            return os.open(tmp, _TEMP_FLAGS, 0o600, dir_fd=dir_fd), tmp
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


def sweep_temps(directory: str) -> list[str]:
    """Remove temp files left in ``directory`` by processes that are gone.

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
            os.unlink(path)
            removed.append(path)
    return removed


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
