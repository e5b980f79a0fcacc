"""Atomic, durable replacement of a file: the one place that calls fsync.

The recipe (``../shared/FACTS.md``, "Durable atomic replace on Linux"):

1. a temp file in the target's own directory (``mkstemp``: O_EXCL, 0600);
2. set the intended mode, write everything, ``fsync`` the file;
3. ``os.replace`` onto the target, so readers see the old or the new file;
4. ``fsync`` the directory, so the rename itself is durable;
5. on any error unlink the temp.  After an fsync error the caller retries
   with a fresh temp file built from memory: never fsync the same file again,
   the kernel may have dropped its dirty pages.

Temp names carry the writing process's pid (``.<name>.<pid>.<random>.tmp``)
so ``sweep_temps`` removes the debris of dead processes only, never a temp
that a live writer is about to rename.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import tempfile
from collections.abc import Callable, Sequence

__all__ = ["fsync_dir", "makedirs_durable", "sweep_temps", "write_all", "write_atomic"]

_TEMP_RE = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[A-Za-z0-9_]+\.tmp$")


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
    fsync: Callable[[int], None] = os.fsync,
    replace: Callable[[str, str], None] = os.replace,
) -> int:
    """Replace ``path`` with the concatenation of ``chunks``, durably.

    Creates the parent directory (with ``dir_mode``) when it is missing,
    durably (``makedirs_durable``).
    Blocking: call it from a worker thread or a synchronous exit path.
    ``fsync`` (of the temp file, then of the directory) and ``replace`` are
    seams for fault-injection tests.

    Returns:
        The number of bytes written.

    Raises:
        OSError: any step failed; no temp file is left behind, and ``path``
            still holds its previous content, unless only the final directory
            fsync failed (then the new content is in place, maybe not durably).
    """
    directory, name = os.path.split(path)
    directory = directory or "."
    prefix = f".{name}.{os.getpid()}."
    try:
        fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=directory)
    except FileNotFoundError:  # first write: make the directory (a syscall saved per write)
        makedirs_durable(directory, dir_mode)
        fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=directory)
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
        if match is None or _alive(int(match["pid"])):
            continue
        path = os.path.join(directory, name)
        # One entry we cannot remove (gone already, not ours, a directory)
        # must not stop the sweep or fail the store's open().
        with contextlib.suppress(OSError):
            os.unlink(path)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OverflowError:
        return False
    return True
