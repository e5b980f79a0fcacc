"""Opening files under a store's root so that nothing planted there redirects a write.

A checkpoint root is often a directory other processes can write to (a
shared project folder, a mounted volume, a path under ``/tmp``).  Whatever
someone puts in place of a file the library uses, no write, truncation,
append, lock or creation may reach a file outside the root.  The rules, and
where each is kept:

* **Written in place** (a lock file, a journal's append and its torn-tail
  truncation): opened with ``O_NOFOLLOW | O_NOCTTY | O_NONBLOCK`` and
  checked with ``fstat`` before a byte is written (``open_checked``): a
  regular file, one link, owned as expected (below).  Anything else (a
  symbolic link, dangling or not, a FIFO, a socket, a device, a directory,
  a file with a second hard link that may lie outside the root, a file of
  another user) is refused with ``UnsafeFile`` naming the path and what is
  there, and left as it is.  ``O_NONBLOCK``: opening a FIFO never waits
  for a peer (it has no effect on the regular file that passes the check).
* **Replaced by rename** (a snapshot, a journal rewrite, a summary, a file
  moved aside): the rename replaces the *name*, never following it, so a
  link there is not written through and a hard link's other name keeps its
  old bytes.  Where the library reads the file first (a writer learning its
  ``seq``), the read refuses what it would not write in place.
* **Read** (``load``, the CLI, a writer's first look at a key):
  ``read_checked`` opens without following a symbolic link and without
  blocking on a FIFO, and reads only a regular file.
* **Directories below the root** (``sessions/<key>/``): ``open_subdir``
  opens (or creates, 0700) each level with ``O_DIRECTORY | O_NOFOLLOW``
  relative to its parent's descriptor; writes go through that descriptor
  (``dir_fd=``), so a level swapped for a link after the check still
  cannot redirect them.
* **The root itself** may be a symbolic link: people link their checkpoint
  directory elsewhere on purpose.  A root writable by every user without
  the sticky bit gets one warning per process (``check_root``).

"Owned as expected": by the effective user, by root (uid 0), or by the owner
of the directory the file is in.  The last covers a root-run process in a
user's directory (the user's own files are trusted, as the user is there)
and is why a file planted by a third user in a shared directory is refused.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import threading

__all__ = [
    "UnsafeFile",
    "check_root",
    "describe",
    "open_checked",
    "open_dir",
    "open_subdir",
    "read_checked",
    "read_fd",
    "refuse_unless_replaceable",
]

logger = logging.getLogger("checkpointer")

_NOFOLLOW = os.O_NOFOLLOW | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class UnsafeFile(OSError):
    """A path under a store's root holds something the library will not use.

    An ``OSError``, so it takes every path an I/O error takes: a writer's
    ``Failed("write-failed")``, ``load``'s ``CheckpointError``, a CLI error.

    Attributes:
        path: where it is.
        found: what is there ("a symbolic link to '/etc/passwd'", "a FIFO").
    """

    def __init__(self, path: str, found: str, *, expected: str = "a file") -> None:
        super().__init__(
            f"{path} is {found}, not {expected} this library made; not following it, "
            "and leaving it as it is (remove it to go on)"
        )
        self.path = path
        self.found = found


_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
)


def describe(st: os.stat_result, path: str, dir_fd: int | None = None) -> str:
    """What kind of thing ``st`` is, in words (with a link's target)."""
    for test, name in _KINDS:
        if test(st.st_mode):
            if name == "a symbolic link":
                try:
                    return f"a symbolic link to {os.readlink(_name(path, dir_fd), dir_fd=dir_fd)!r}"
                except OSError:
                    return name
            return name
    return "a regular file" if stat.S_ISREG(st.st_mode) else "not a regular file"


def _name(path: str, dir_fd: int | None) -> str:
    return os.path.basename(path) if dir_fd is not None else path


def _lstat(path: str, dir_fd: int | None) -> os.stat_result | None:
    try:
        return os.lstat(_name(path, dir_fd), dir_fd=dir_fd)
    except OSError:
        return None


def _refusal(exc: OSError, path: str, dir_fd: int | None) -> OSError:
    """The error to raise for a failed open: ``UnsafeFile`` when a non-file is in the way."""
    if exc.errno == errno.ENOENT:
        return exc
    st = _lstat(path, dir_fd)
    if st is None or stat.S_ISREG(st.st_mode):
        return exc
    return UnsafeFile(path, describe(st, path, dir_fd))


def _owners(dir_owner: int | None) -> tuple[int, ...]:
    return (os.geteuid(), 0) if dir_owner is None else (os.geteuid(), 0, dir_owner)


def _check_owner(
    st: os.stat_result, path: str, dir_fd: int | None, *, expected: str = "a file"
) -> None:
    if st.st_uid in _owners(None):
        return
    # Only now look at the directory (most files are our own: no syscall then).
    try:
        owner = os.fstat(dir_fd).st_uid if dir_fd is not None else os.stat(_parent(path)).st_uid
    except OSError:
        owner = None
    if st.st_uid not in _owners(owner):
        raise UnsafeFile(
            path,
            f"owned by uid {st.st_uid}, not by this process (uid {os.geteuid()}), root, "
            f"or the owner of its directory (uid {owner})",
            expected=expected,
        )


def _parent(path: str) -> str:
    return os.path.dirname(path) or "."


def open_checked(
    path: str, flags: int, *, mode: int = 0o600, dir_fd: int | None = None, links: bool = False
) -> tuple[int, os.stat_result]:
    """Open a file to write in place, refusing anything but a regular file of ours.

    Args:
        path: the file (with ``dir_fd``, its basename is opened relative to it).
        flags: ``os.O_RDWR``, ``os.O_WRONLY | os.O_APPEND``, maybe ``os.O_CREAT``.
        mode: for a file created.
        dir_fd: the directory to open it in, from ``open_dir``/``open_subdir``.
        links: accept a file with more than one hard link (the caller will
            not write it in place: it replaces it by rename).

    Returns:
        The descriptor and its ``fstat``.

    Raises:
        UnsafeFile: a symbolic link, a FIFO, a directory, ... (by ``lstat``
            when the open itself fails), more hard links than one, or
            another owner; nothing was written and the descriptor is closed.
        OSError: the open failed for another reason (``FileNotFoundError``
            without ``O_CREAT``).
    """
    try:
        fd = os.open(_name(path, dir_fd), flags | _NOFOLLOW, mode, dir_fd=dir_fd)
    except OSError as exc:
        raise _refusal(exc, path, dir_fd) from None
    try:
        st = os.fstat(fd)
        _check_opened(st, path, dir_fd, links)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _check_opened(st: os.stat_result, path: str, dir_fd: int | None, links: bool) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFile(path, describe(st, path, dir_fd))
    if st.st_nlink > 1 and not links:
        raise UnsafeFile(
            path,
            f"a file with {st.st_nlink} hard links (another name for it may lie outside the root)",
        )
    _check_owner(st, path, dir_fd)


def read_checked(path: str, *, dir_fd: int | None = None, limit: int | None = None) -> bytes | None:
    """The bytes of the regular file at ``path`` (its first ``limit``); None if nothing is there.

    Never follows a symbolic link at ``path`` itself, never blocks on a
    FIFO, never reads a device.  Owners and links are not checked: reading
    changes nothing.

    Raises:
        UnsafeFile: something other than a regular file is there.
        IsADirectoryError: a directory is there (what ``open`` would say).
        OSError: it cannot be read.
    """
    try:
        fd = os.open(_name(path, dir_fd), os.O_RDONLY | _NOFOLLOW, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _refusal(exc, path, dir_fd) from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(path, describe(st, path, dir_fd))
        if limit is not None:
            return os.read(fd, limit)
        return read_fd(fd, st.st_size)
    finally:
        os.close(fd)


def read_fd(fd: int, size: int) -> bytes:
    """Read a regular file's descriptor to its end; ``size`` is its ``st_size``."""
    # O_NONBLOCK does not apply to regular files: reads return what is there.
    parts: list[bytes] = []
    while True:
        part = os.read(fd, max(size, 1 << 16))
        if not part:
            return b"".join(parts) if len(parts) != 1 else parts[0]
        parts.append(part)
        size = 1 << 16  # it grew while we read: go on in 64 KiB steps


def refuse_unless_replaceable(path: str, *, dir_fd: int | None = None) -> None:
    """Raise ``UnsafeFile`` unless ``path`` is missing or a regular file.

    For a file about to be replaced by rename without being read first (a
    summary): the rename would be safe, but a planted link is refused the
    same way everywhere, and left for a person to see.
    """
    st = _lstat(path, dir_fd)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise UnsafeFile(path, describe(st, path, dir_fd))


def open_dir(path: str, *, create: bool = False, mode: int = 0o700) -> int:
    """A descriptor of the store's root, made (``mode``) if missing and ``create``.

    The root may be a symbolic link (that is the user's choice); the
    directories below it are opened with ``open_subdir``.

    Raises:
        OSError: it is missing (and not ``create``) or not a directory.
    """
    try:
        return os.open(path, _DIRECTORY)
    except FileNotFoundError:
        if not create:
            raise
    os.makedirs(path, mode=mode, exist_ok=True)
    return os.open(path, _DIRECTORY)


def open_subdir(
    parent_fd: int, name: str, path: str, *, create: bool = False, mode: int = 0o700
) -> int:
    """A descriptor of the directory ``name`` in ``parent_fd``, never through a link.

    Args:
        parent_fd: the directory holding it (``open_dir`` or ``open_subdir``).
        name: one path component.
        path: its whole path, for messages.
        create: make it (``mode``) when missing.

    Raises:
        UnsafeFile: a symbolic link, a file or anything else is there, or a
            directory of another owner.
        FileNotFoundError: it is missing and not ``create``.
    """
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, mode, dir_fd=parent_fd)
    try:
        fd = os.open(name, _DIRECTORY | os.O_NOFOLLOW, dir_fd=parent_fd)
    except FileNotFoundError:
        raise
    except OSError:  # ELOOP: a link; ENOTDIR: a file, a FIFO, ...
        st = _lstat(path, parent_fd)
        if st is None:
            raise
        raise UnsafeFile(path, describe(st, path, parent_fd), expected="a directory") from None
    try:
        _check_owner(os.fstat(fd), path, parent_fd, expected="a directory")
    except BaseException:
        os.close(fd)
        raise
    return fd


_warned: set[str] = set()
_warned_lock = threading.Lock()


def check_root(root: str) -> None:
    """Warn once per process when ``root`` is writable by all users and not sticky."""
    try:
        st = os.stat(root)
    except OSError:
        return
    if not (st.st_mode & stat.S_IWOTH) or st.st_mode & stat.S_ISVTX:
        return
    with _warned_lock:
        if root in _warned:
            return
        _warned.add(root)
    logger.warning(
        "checkpointer: %s is writable by every user and has no sticky bit, so anyone can "
        "plant or rename files in it; files planted there are refused, but give the store "
        "a directory of its own (or chmod o-w %s)",
        root,
        root,
    )
