"""Summary checkpoints on disk: ``<root>/sessions/<key>/checkpoint.md``, written and read.

``sessions/<key>/`` is reached without following a link below the root.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from .._format.summary import decode_summary, encode_summary
from .._values import CheckpointError, SummaryCheckpoint
from .atomic import fsync_fd, fsync_parents, write_atomic
from .base import check_key
from .files import _MARK, FileStore
from .safefs import check_root, open_dir, open_subdir, read_checked, refuse_unless_replaceable
from .sealing import _ROW_HEAD, is_sealed

__all__ = ["Root", "load_summary", "summary_path", "write_summary"]


Root = str | os.PathLike[str] | FileStore


def summary_path(root: Root, key: str) -> str:
    """Where the summary checkpoint of ``key`` lives under ``root`` (a directory or a
    ``FileStore``); ``ValueError`` for an invalid key."""
    check_key(key)
    base = root.root if isinstance(root, FileStore) else os.fspath(root)
    return os.path.join(base, "sessions", key, "checkpoint.md")


def write_summary(root: Root, key: str, checkpoint: SummaryCheckpoint) -> str:
    """Write ``checkpoint`` atomically and durably; return its path.  Blocking.

    ``ValueError`` or ``TypeError`` for a bad key or field; ``OSError`` if the
    write failed (the previous file, if any, intact).
    """
    path = summary_path(root, key)
    if (isinstance(root, FileStore) and root.encryption is not None) or _sealed_beside(path, key):
        raise ValueError(
            f"{path}: the checkpoints there are encrypted and summary checkpoints are not; "
            "none is written"
        )
    data = encode_summary(key, checkpoint)
    sessions = os.path.dirname(os.path.dirname(path))
    base = os.path.dirname(sessions) or "."
    check_root(base)
    with _dirs(base, sessions, key, create=True) as fds:
        synced = root._synced_summaries if isinstance(root, FileStore) else set()
        if key not in synced:  # directories found there may never have been made durable
            fsync_fd(fds[1])
            fsync_fd(fds[0])
            if isinstance(root, FileStore):
                root._sync_root()
            else:
                fsync_parents(base)
            synced.add(key)
        refuse_unless_replaceable(path, dir_fd=fds[-1])
        write_atomic(path, [data], dir_fd=fds[-1])
    return path


def _sealed_beside(path: str, key: str) -> bool:
    """Whether the checkpoint of ``key`` beside summary ``path`` is sealed (a snapshot, its
    revision line first, or a journal): a summary in plaintext would sit beside it."""
    base = os.path.dirname(os.path.dirname(os.path.dirname(path)))
    for name in (f"{key}.json", f"{key}.jsonl"):
        with contextlib.suppress(OSError, CheckpointError):
            head = read_checked(os.path.join(base, name), limit=256) or b""
            if head.startswith(_MARK):
                head = head[head.find(b"\n") + 1 :]
            if is_sealed(head) or head.startswith(_ROW_HEAD):
                return True
    return False


@contextlib.contextmanager
def _dirs(root: str, sessions: str, key: str, *, create: bool) -> Iterator[list[int]]:
    """Descriptors of ``root``, ``sessions/`` and ``sessions/<key>`` (no link followed below)."""
    fds = [open_dir(root, create=create)]
    try:
        fds.append(open_subdir(fds[-1], "sessions", sessions, create=create))
        fds.append(open_subdir(fds[-1], key, os.path.join(sessions, key), create=create))
        yield fds
    finally:
        for fd in fds:
            os.close(fd)


def load_summary(root: Root, key: str) -> SummaryCheckpoint | None:
    """Load the summary checkpoint of ``key``; None if there is none.

    ``ValueError`` for an invalid key; ``CheckpointError`` if the file cannot
    be read or is not a summary checkpoint.
    """
    path = summary_path(root, key)
    sessions = os.path.dirname(os.path.dirname(path))
    try:
        with _dirs(os.path.dirname(sessions) or ".", sessions, key, create=False) as fds:
            data = read_checked(path, dir_fd=fds[-1])
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CheckpointError(path, f"cannot be read: {_unreadable(exc, path)}") from None
    if data is None:
        return None
    return decode_summary(data, path)


def _unreadable(exc: OSError, path: str) -> str:
    """Why ``path`` cannot be read, naming the directory on the way when that was the trouble."""
    why = exc.strerror or str(exc)
    if exc.strerror and exc.filename and os.fspath(exc.filename) != path:
        return f"{exc.filename}: {why}"  # sessions/ or sessions/<key>/ (changed while opened)
    return why
