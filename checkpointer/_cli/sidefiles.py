"""A store directory's files besides its checkpoints: summaries and corrupt files.

Summary checkpoints (``sessions/<key>/checkpoint.md``, written by
``write_summary``) and corrupt files a writer moved aside
(``<key>.corrupt-<UTC time>``), found, looked at and removed for ``ls`` and
``prune`` (through ``roots.DirectoryRoot``).  ``sessions/`` and
``sessions/<key>/`` are opened without following a link, each relative to
its parent's descriptor (``safefs.open_subdir``), and every look and unlink
below them goes through that descriptor, so nothing planted there reaches a
file outside the root.  A directory is fsynced after an unlink in it.

Like ``roots.py``, a module of the command line that uses the library's
private modules; it knows nothing of ``Root``.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import NamedTuple

from checkpointer import CheckpointError
from checkpointer._stores.atomic import fsync_fd
from checkpointer._stores.base import KEY_PATTERN
from checkpointer._stores.safefs import UnsafeFile, describe, open_dir, open_subdir
from checkpointer.summaries import load_summary

__all__ = [
    "ASIDE",
    "Look",
    "fsync_root",
    "look_corrupt",
    "look_summary",
    "remove_summary",
    "summary_keys",
]

EPOCH = datetime.fromtimestamp(0, UTC)
ASIDE = re.compile(r"\.corrupt-(\d{8}T\d{6})(\.\d+)?Z$")
SESSIONS, SUMMARY = "sessions", "checkpoint.md"
_SUMMARY_TEMP = re.compile(r"\.checkpoint\.md\..+\.tmp")  # a write_summary that died


class Look(NamedTuple):
    """A summary or corrupt file looked at."""

    size: int
    time: datetime  # a summary's created_at (its file's time if unreadable); when moved aside
    problem: str | None = None  # something planted in its place: left alone
    unreadable: str | None = None  # a summary that cannot be read


def summary_keys(root: str) -> list[str]:
    """The keys with a ``sessions/<key>`` entry (a directory, or something planted there).

    Raises:
        FileNotFoundError: no ``sessions/``.
        UnsafeFile: a link, a file, ... in place of ``sessions/``.
        OSError: it cannot be listed.
    """
    with _sessions(root) as fd:
        return [name for name in sorted(os.listdir(fd)) if KEY_PATTERN.fullmatch(name)]


def look_summary(root: str, key: str, path: str) -> Look | None:
    """``key``'s summary (at ``path``): its size and time; None: there is none."""
    try:
        with _summary_dir(root, key) as (_, fd):
            st = _summary_stat(fd, path)
    except FileNotFoundError:
        return None  # no summary (an empty directory): nothing to show or remove
    except UnsafeFile as exc:
        return Look(0, EPOCH, str(exc))
    except OSError as exc:
        return Look(0, EPOCH, unreadable=f"cannot be read: {_why(exc)}")
    mtime = datetime.fromtimestamp(st.st_mtime, UTC)
    try:
        summary = load_summary(root, key)
    except CheckpointError as exc:
        return Look(st.st_size, mtime, unreadable=exc.reason)
    if summary is None:
        return None
    created = summary.created_at
    return Look(st.st_size, created.replace(tzinfo=created.tzinfo or UTC))


def look_corrupt(path: str) -> Look | None:
    """A corrupt file moved aside: its size, and when it was moved aside or touched since."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    # The later of the two: a rename keeps the file's old mtime.
    time = max(_moved_aside(path), datetime.fromtimestamp(st.st_mtime, UTC))
    if not stat.S_ISREG(st.st_mode):
        return Look(0, time, str(UnsafeFile(path, describe(st, path))))
    return Look(st.st_size, time)


def remove_summary(root: str, key: str, path: str) -> str | None:
    """Remove ``key``'s summary, a dead write's temp file, and the directory if it is empty.

    Returns:
        None, or why the directory stays (it holds other files).

    Raises:
        FileNotFoundError: the summary is gone.
        UnsafeFile: something planted on the way or in its place (left).
        OSError: it could not be removed.
    """
    with _summary_dir(root, key) as (sessions, fd):
        _summary_stat(fd, path)
        os.unlink(SUMMARY, dir_fd=fd)
        for name in os.listdir(fd):
            if _SUMMARY_TEMP.fullmatch(name):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=fd)
        fsync_fd(fd)
        try:
            os.rmdir(key, dir_fd=sessions)  # a link swapped in meanwhile: ENOTDIR, left
        except OSError:
            return f"{os.path.dirname(path)} holds other files, so it stays"
        fsync_fd(sessions)
    return None


def fsync_root(root: str) -> None:
    """Make the unlinks in ``root`` durable."""
    fd = open_dir(root)
    try:
        fsync_fd(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _sessions(root: str) -> Iterator[int]:
    """A descriptor of ``sessions/``, reached without following a link below the root."""
    top = open_dir(root)
    try:
        fd = open_subdir(top, SESSIONS, os.path.join(root, SESSIONS))
    finally:
        os.close(top)
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def _summary_dir(root: str, key: str) -> Iterator[tuple[int, int]]:
    """Descriptors of ``sessions/`` and ``sessions/<key>/``, never through a link."""
    with _sessions(root) as sessions:
        fd = open_subdir(sessions, key, os.path.join(root, SESSIONS, key))
        try:
            yield sessions, fd
        finally:
            os.close(fd)


def _summary_stat(fd: int, path: str) -> os.stat_result:
    """The ``checkpoint.md`` in the directory ``fd``, not followed; UnsafeFile: not a file."""
    st = os.stat(SUMMARY, dir_fd=fd, follow_symlinks=False)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFile(path, describe(st, path, fd))
    return st


def _moved_aside(name: str) -> datetime:
    """When a writer moved ``name`` aside, from the UTC time in its name."""
    match = ASIDE.search(name)
    if match is None:
        return EPOCH
    try:
        return datetime.strptime(match.group(1), "%Y%m%dT%H%M%S").replace(tzinfo=UTC)
    except ValueError:  # a stamp outside the calendar: a name the library never gives
        return EPOCH


def _why(exc: OSError) -> str:
    return os.strerror(exc.errno) if exc.errno else str(exc)
