"""Opening files under a store's root so that nothing planted there redirects a write.

A root is often a directory others can write to (a shared folder, ``/tmp``).
Whatever is put in place of a file the library uses, nothing is written,
truncated, locked or created outside the root:

* written in place (a lock file, a journal append): ``open_checked`` opens
  with ``O_NOFOLLOW`` and refuses (``UnsafeFile``, left as it is) anything but
  a regular file with one link and a trusted owner;
* replaced by rename (snapshots, summaries): the rename replaces the name,
  never following it; directories below the root are opened relative to
  their parent's descriptor (``open_subdir``), without following links;
* read (``load``, the CLI): ``read_checked`` follows no link, waits on no
  FIFO, reads only a regular file of a trusted owner, and exactly the size
  ``fstat`` gave (``UnreadableFile`` if it grows while read);
* the root itself may be a link; one that others can change is named once
  in a warning (``check_root``).

A trusted owner: this user or root (run as the files' owner to read
another user's store).
"""

from __future__ import annotations

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
_SHARED = stat.S_IWGRP | stat.S_IWOTH


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


class UnreadableFile(OSError):
    """A regular file that is not read whole: too large, or growing while read.

    An ``OSError`` without an errno, so its message (which names the path
    and the sizes) is what a ``CheckpointError`` or a ``Failed`` says.

    Attributes:
        path: the file.
        size: its size when it was opened, in bytes.
    """

    def __init__(self, path: str, size: int, message: str) -> None:
        super().__init__(message)
        self.path = path
        self.size = size


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
    """The error to raise for a failed open: ``UnsafeFile`` when a non-file is in the way.

    Looked at even for ENOENT: a device node whose driver finds nothing
    behind it (a ``ptmx`` outside its ``devpts``) says ENOENT on open.
    """
    st = _lstat(path, dir_fd)
    if st is None or stat.S_ISREG(st.st_mode):
        return exc
    return UnsafeFile(path, describe(st, path, dir_fd))


def _check_owner(
    st: os.stat_result, path: str, dir_fd: int | None, *, expected: str = "a file"
) -> None:
    """Raise ``UnsafeFile`` unless ``st`` (of ``path``) belongs to this user or root."""
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        raise UnsafeFile(
            path,
            f"owned by uid {st.st_uid}, not by this process (uid {me}) or root, who may have "
            "planted it (run as that user, or use a directory of this user's own)",
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
            when the open itself fails), more hard links than one, or an
            untrusted owner; nothing was written and the descriptor is closed.
        OSError: the open failed for another reason (``FileNotFoundError``
            without ``O_CREAT``, when nothing is there).
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


def read_checked(
    path: str, *, dir_fd: int | None = None, limit: int | None = None, growing: bool = False
) -> bytes | None:
    """The bytes of the regular file at ``path`` (its first ``limit``); None if nothing is there.

    Never follows a symbolic link at ``path`` itself, never blocks on a
    FIFO, never reads a device, nor a file of an untrusted owner (a state
    forged by another user).  Hard links are not checked: reading changes
    nothing.  Reads what ``fstat`` said is there and never more (``read_fd``).

    Args:
        path: the file (with ``dir_fd``, its basename is opened relative to it).
        dir_fd: the directory to open it in.
        limit: read at most this many bytes (a lock file's holder).
        growing: the file may grow by appends while it is read (a journal
            read without its lock): keep what ``fstat`` saw, ignore the rest.

    Raises:
        UnsafeFile: something other than a regular file is there, or a
            file of an untrusted owner.
        UnreadableFile: too large to read, or it grew while being read.
        IsADirectoryError: a directory is there (what ``open`` would say).
        OSError: it cannot be read.
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
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(path, describe(st, path, dir_fd))
        _check_owner(st, path, dir_fd)
        if limit is not None:
            return os.read(fd, limit)
        return read_fd(fd, st.st_size, path, growing=growing)
    finally:
        os.close(fd)


def read_fd(fd: int, size: int, path: str, *, growing: bool = False) -> bytes:
    """The first ``size`` bytes of a regular file's descriptor (its ``st_size``), never more.

    Args:
        fd: the descriptor, at offset 0.
        size: its ``st_size`` from ``fstat``.
        path: the file, for messages.
        growing: an append may make it grow meanwhile (a journal read
            without its lock): keep the ``size`` bytes, ignore the rest.

    Returns:
        ``size`` bytes, or fewer if it shrank while being read.

    Raises:
        UnreadableFile: a ``MemoryError`` came while reading, or the file
            grew while being read (unless ``growing``).
        OSError: a read failed.
    """
    try:
        # O_NONBLOCK does not apply to regular files: reads return what is there.
        parts: list[bytes] = []
        left = size
        while left > 0:
            part = os.read(fd, left)  # Linux returns at most ~2 GiB per read
            if not part:
                break  # it shrank while being read: what is there now
            parts.append(part)
            left -= len(part)
        data = parts[0] if len(parts) == 1 else b"".join(parts)
    except MemoryError:
        raise UnreadableFile(
            path,
            size,
            f"{path} is {_bytes(size)}, more than this process could allocate to read it "
            "(MemoryError); free memory or raise the process's memory limit, or remove "
            "the file if it is not a checkpoint",
        ) from None
    if not growing and os.read(fd, 1):
        raise UnreadableFile(
            path,
            size,
            f"{path} grew while being read, from {_bytes(size)} when opened to "
            f"{_bytes(os.fstat(fd).st_size)}: something is writing into it in place, which "
            "this library never does; not using what was read (try again, or find that writer)",
        )
    return data


def _bytes(n: int) -> str:
    """``n`` bytes in words: "1 byte", "512 bytes", "68719476736 bytes (64.0 GiB)"."""
    if n < 1024:
        return "1 byte" if n == 1 else f"{n} bytes"
    return f"{n} bytes ({_human(n)})"


def _human(n: int) -> str:
    size = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        size /= 1024
        if size < 1024:
            return f"{size:.1f} {unit}"
    return f"{size / 1024:.1f} TiB"


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
    makedirs_durable(path, mode)  # a new root must survive a power cut
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
            directory of an untrusted owner.
        FileNotFoundError: it is missing and not ``create``, or it was
            removed while being opened (naming ``path``).
        OSError: it changed while being opened (naming ``path``).
    """
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
        _check_owner(os.fstat(fd), path, parent_fd, expected="a directory")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _subdir_refusal(exc: OSError, path: str, parent_fd: int) -> OSError:
    """What to raise when a directory below the root did not open: say what is there."""
    st = _lstat(path, parent_fd)
    if st is not None and not stat.S_ISDIR(st.st_mode):
        return UnsafeFile(path, describe(st, path, parent_fd), expected="a directory")
    # O_DIRECTORY|O_NOFOLLOW says ENOTDIR for a link too (ELOOP on some systems).
    was = {
        errno.ELOOP: "a symbolic link when opened",
        errno.ENOTDIR: "not a directory when opened (a link or a file?)",
    }.get(exc.errno or 0)
    if st is not None and was is not None:  # a directory again: someone is swapping it
        return UnsafeFile(
            path,
            f"{was} and a directory just after (being swapped by another process?)",
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
    """Warn once per process when users other than this one and root can change ``root``.

    That is: ``root`` is owned by another user, or writable by every user
    or by a group with other members, without the sticky bit (module
    docstring).  A root that cannot be looked at gets no warning (the write
    that follows will say why it fails).
    """
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
    """Why others can change the directory ``st`` (reasons, fixes); empty when nobody can."""
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
