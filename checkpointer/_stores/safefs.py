"""Opening files under a store's root so that nothing planted there redirects a write.

Files are opened with ``O_NOFOLLOW`` and must be regular, single-link and
owned by this user or root; directories below the root are opened through
their parent's descriptor.  Anything else is an ``UnsafeFile``, left as it is.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import logging
import os
import stat
import threading

from .atomic import fsync_fd, makedirs_durable

__all__ = [
    "UnreadableFile",
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
    """A path under a store's root holds something the library will not use (an I/O error)."""

    def __init__(self, path: str, found: str, *, expected: str = "a file") -> None:
        super().__init__(
            f"{path} is {found}, not {expected} this library made; not following it, "
            "and leaving it as it is (remove it to go on)"
        )


class UnreadableFile(OSError):
    """A regular file that is not read whole: too large, or growing while read."""


_KINDS = {
    stat.S_IFLNK: "a symbolic link",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a directory",
    stat.S_IFREG: "a regular file",
}


def describe(st: os.stat_result, path: str, dir_fd: int | None = None) -> str:
    """What kind of thing ``st`` is, in words (with a link's target)."""
    kind = stat.S_IFMT(st.st_mode)
    if kind == stat.S_IFLNK:
        with contextlib.suppress(OSError):
            return f"a symbolic link to {os.readlink(_name(path, dir_fd), dir_fd=dir_fd)!r}"
    return _KINDS.get(kind, "not a regular file")


def _name(path: str, dir_fd: int | None) -> str:
    return os.path.basename(path) if dir_fd is not None else path


def _lstat(path: str, dir_fd: int | None) -> os.stat_result | None:
    try:
        return os.lstat(_name(path, dir_fd), dir_fd=dir_fd)
    except OSError:
        return None


def _refusal(exc: OSError, path: str, dir_fd: int | None) -> OSError:
    """``UnsafeFile`` when a non-file is in the way (a device may say ENOENT), else ``exc``."""
    st = _lstat(path, dir_fd)
    if st is None or stat.S_ISREG(st.st_mode):
        return exc
    return UnsafeFile(path, describe(st, path, dir_fd))


def _check_owner(st: os.stat_result, path: str, *, expected: str = "a file") -> None:
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        raise UnsafeFile(
            path,
            f"owned by uid {st.st_uid}, not by this process (uid {me}) or root, who may have "
            "planted it (run as that user, or use a directory of this user's own)",
            expected=expected,
        )


def open_checked(
    path: str, flags: int, *, mode: int = 0o600, dir_fd: int | None = None, links: bool = False
) -> tuple[int, os.stat_result]:
    """Open a regular single-link file of ours (``links``: or more); return it and its ``fstat``.

    With ``dir_fd`` the basename of ``path`` is opened there.
    """
    try:
        fd = os.open(_name(path, dir_fd), flags | _NOFOLLOW, mode, dir_fd=dir_fd)
    except OSError as exc:
        raise _refusal(exc, path, dir_fd) from None
    try:
        st = os.fstat(fd)
        _check_file(st, path, dir_fd, links=links)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _check_file(st: os.stat_result, path: str, dir_fd: int | None, *, links: bool) -> None:
    """Raise ``UnsafeFile`` unless ``st`` is a regular file of ours (one link, unless ``links``)."""
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFile(path, describe(st, path, dir_fd))
    if st.st_nlink > 1 and not links:
        raise UnsafeFile(
            path,
            f"a file with {st.st_nlink} hard links (another name for it may lie outside the root)",
        )
    _check_owner(st, path)


def read_checked(
    path: str, *, dir_fd: int | None = None, limit: int | None = None, growing: bool = False
) -> bytes | None:
    """The bytes of the regular file of ours at ``path`` (its first ``limit``); None if absent.

    Hard links are allowed: reading changes nothing.  ``growing``: see ``read_fd``.
    """
    try:
        fd = os.open(_name(path, dir_fd), os.O_RDONLY | _NOFOLLOW, dir_fd=dir_fd)
    except OSError as exc:
        refusal = _refusal(exc, path, dir_fd)
        if isinstance(refusal, FileNotFoundError):
            return None
        raise refusal from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        _check_file(st, path, dir_fd, links=True)
        if limit is not None:
            return os.read(fd, limit)
        return read_fd(fd, st.st_size, path, growing=growing)
    finally:
        os.close(fd)


def read_fd(fd: int, size: int, path: str, *, growing: bool = False) -> bytes:
    """The first ``size`` bytes (its ``st_size``) of a regular file's descriptor, never more.

    ``UnreadableFile`` if it grew, unless ``growing`` (a journal read without its lock).
    """
    try:
        parts: list[bytes] = []
        left = size
        while left > 0:
            part = os.read(fd, left)  # Linux returns at most ~2 GiB per read
            if not part:
                break
            parts.append(part)
            left -= len(part)
        data = parts[0] if len(parts) == 1 else b"".join(parts)
    except MemoryError:
        raise UnreadableFile(
            f"{path} is {_bytes(size)}, more than this process could allocate to read it "
            "(MemoryError); free memory, or remove the file if it is not a checkpoint"
        ) from None
    if not growing and os.read(fd, 1):
        raise UnreadableFile(
            f"{path} grew while being read, from {_bytes(size)} when opened to "
            f"{_bytes(os.fstat(fd).st_size)}: something is writing into it in place, which "
            "this library never does; not using what was read (try again, or find that writer)"
        )
    return data


def _bytes(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n} bytes ({n / (1 << shift):.1f} {unit})"
    return f"{n} bytes"


def refuse_unless_replaceable(path: str, *, dir_fd: int | None = None) -> None:
    """Raise ``UnsafeFile`` unless ``path`` is missing or a regular file (before a rename over
    it: safe anyway, but a planted link is refused everywhere alike, left for a person to see)."""
    st = _lstat(path, dir_fd)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise UnsafeFile(path, describe(st, path, dir_fd))


def open_dir(path: str, *, create: bool = False, mode: int = 0o700) -> int:
    """A descriptor of the store's root (a link is the user's choice), made if ``create``."""
    try:
        return os.open(path, _DIRECTORY)
    except FileNotFoundError:
        if not create:
            raise
    makedirs_durable(path, mode)  # a new root must survive a power cut
    return os.open(path, _DIRECTORY)


def open_subdir(
    parent_fd: int, name: str, path: str, *, create: bool = False, mode: int = 0o700
) -> int:
    """A descriptor of the directory ``name`` (whole path ``path``) in ``parent_fd``, never
    through a link, made if ``create``; ``UnsafeFile`` for anything else, or another owner's."""
    if create:
        try:
            os.mkdir(name, mode, dir_fd=parent_fd)
        except FileExistsError:
            pass
        else:
            fsync_fd(parent_fd)  # the new entry survives a power cut only so
    try:
        fd = os.open(name, _DIRECTORY | os.O_NOFOLLOW, dir_fd=parent_fd)
    except OSError as exc:  # ELOOP: a link; ENOTDIR: a file, a FIFO, ...; ENOENT: gone
        raise _subdir_refusal(exc, path, parent_fd) from None
    try:
        _check_owner(os.fstat(fd), path, expected="a directory")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _subdir_refusal(exc: OSError, path: str, parent_fd: int) -> OSError:
    """What to raise when a directory below the root did not open: what is there."""
    st = _lstat(path, parent_fd)
    if st is not None and not stat.S_ISDIR(st.st_mode):
        return UnsafeFile(path, describe(st, path, parent_fd), expected="a directory")
    # O_DIRECTORY|O_NOFOLLOW says ENOTDIR for a link too (ELOOP on some systems).
    if st is not None and exc.errno in (errno.ELOOP, errno.ENOTDIR):  # a directory again
        return UnsafeFile(
            path,
            "not a directory when opened (a link or a file?) and a directory just after "
            "(being swapped by another process?)",
            expected="a directory",
        )
    if st is None:
        gone = "removed or renamed while being opened (by another process?)"
        if exc.errno == errno.ENOENT:
            return FileNotFoundError(errno.ENOENT, gone, path)
        return OSError(exc.errno, f"{exc.strerror}, then {gone}", path)
    return OSError(exc.errno, exc.strerror, path)


_warned: set[str] = set()
_warned_lock = threading.Lock()


def check_root(root: str) -> None:
    """Warn once per process when users other than this one and root can change ``root``."""
    try:
        st = os.stat(root)
    except OSError:
        return
    reasons, fixes = _shared_by(st, root)
    if not reasons:
        return
    with _warned_lock:
        if root in _warned:
            return
        _warned.add(root)
    logger.warning(
        "checkpointer: %s is %s, so others can remove, rename or plant files in it. "
        "Planted links, FIFOs, devices, hard links and files of untrusted users are "
        "refused, but a checkpoint removed or replaced by a rename from elsewhere cannot "
        "be: give the store a directory of its own (%s)",
        root,
        " and ".join(reasons),
        ", ".join(fixes),
    )


def _shared_by(st: os.stat_result, root: str) -> tuple[list[str], list[str]]:
    reasons: list[str] = []
    fixes: list[str] = []
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        reasons.append(f"owned by uid {st.st_uid}, not by this process (uid {me}) or root")
        fixes.append(f"or chown {me} {root}, or run as uid {st.st_uid}")
    if not st.st_mode & stat.S_ISVTX:
        if st.st_mode & stat.S_IWOTH:
            reasons.append("writable by every user without the sticky bit")
            fixes.append(f"or chmod o-w {root}")
        if st.st_mode & stat.S_IWGRP:
            reasons.append(f"writable by group {_group(st.st_gid)} without the sticky bit")
            fixes.append(f"or chmod g-w {root}")
    return reasons, fixes


def _group(gid: int) -> str:
    try:
        return f"{grp.getgrgid(gid).gr_name!r} (gid {gid})"
    except KeyError:
        return f"gid {gid}"
