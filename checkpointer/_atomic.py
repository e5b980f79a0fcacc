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
import tempfile
from collections.abc import Callable, Sequence

__all__ = ["fsync_dir", "sweep_temps", "write_atomic"]

_TEMP_RE = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[A-Za-z0-9_]+\.tmp$")


def fsync_dir(directory: str, fsync: Callable[[int], None] = os.fsync) -> None:
    """Make the entries of ``directory`` (renames, new files) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fsync(fd)
    finally:
        os.close(fd)


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

    Creates the parent directory (with ``dir_mode``) when it is missing.
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
    os.makedirs(directory, mode=dir_mode, exist_ok=True)
    # bytes.join releases the GIL for large results: the loop keeps running.
    data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.{os.getpid()}.", suffix=".tmp", dir=directory)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            fsync(fd)
        finally:
            os.close(fd)
        replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(directory, fsync)
    return len(data)


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
