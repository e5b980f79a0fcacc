"""Where checkpoints live: the store interface and the local-file store.

The writer talks to a store only through ``Store``: synchronous calls that
the async path runs in one worker-thread hop each and ``flush_sync`` calls
directly.  Nothing in the writer assumes a local path, so a networked store
can implement the same protocol.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from ._atomic import fsync_dir, sweep_temps, write_atomic
from ._encoding import Transcript
from ._lock import KeyLock, acquire_file_lock
from ._safefs import check_root, read_checked

__all__ = ["KEY_PATTERN", "FileStore", "ProbingStore", "Store", "check_key"]

logger = logging.getLogger("checkpointer")

KEY_PATTERN = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,199}")
"""A key: 1-200 letters, digits, ``.``, ``_``, ``-``; not starting with ``.``."""

_RULE = "a key is 1-200 ASCII letters, digits, '.', '_' or '-', not starting with '.'"
_KEY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


def check_key(key: object) -> str:
    """Return ``key`` if it is a valid checkpoint key.

    Raises:
        ValueError: naming the key and the rule it breaks.
    """
    if not isinstance(key, str):
        # ValueError, not TypeError: every bad key is one kind of error for callers.
        why = f"it is of type {type(key).__name__}, not str"
        raise ValueError(f"invalid key {_shown(key)}: {why}; {_RULE}")  # noqa: TRY004
    if KEY_PATTERN.fullmatch(key) is None:
        if not key:
            why = "it is empty"
        elif len(key) > 200:
            why = f"it has {len(key)} characters"
        elif key.startswith("."):
            why = "it starts with '.'"
        else:
            bad = next(c for c in key if c not in _KEY_CHARS)
            why = f"it contains {bad!r}"
        raise ValueError(f"invalid key {_shown(key)}: {why}; {_RULE}")
    return key


def _shown(key: object) -> str:
    text = repr(key)
    return text if len(text) <= 80 else text[:77] + "..."


@runtime_checkable
class Store(Protocol):
    """What a checkpoint writer needs from storage.

    Every method is synchronous and may block; the writer calls them from a
    worker thread (async path) or directly (``flush_sync``).  ``write`` must
    be atomic: after a crash a reader sees the old bytes or the new ones.
    A store may also lock a key for one writer (``LockingStore``, optional).
    """

    def validate_key(self, key: str) -> None:
        """Raise ValueError if ``key`` cannot name a checkpoint here."""

    def location(self, key: str) -> str:
        """Where ``key`` lives, for messages and ``Written.location``."""

    def open(self) -> None:
        """Prepare for writing (clean up debris of crashed writers)."""

    def write(self, key: str, chunks: Sequence[bytes]) -> int:
        """Atomically and durably replace ``key`` with the joined chunks.

        Returns the number of bytes written.  Raises OSError on failure.
        """

    def read(self, key: str) -> bytes | None:
        """The bytes of ``key``, or None if there is none."""

    def keys(self) -> list[str]:
        """The keys that have a checkpoint, sorted."""

    def delete(self, key: str) -> bool:
        """Remove ``key``; False if there was nothing to remove."""

    def move_aside(self, key: str, suffix: str) -> str | None:
        """Rename ``key``'s checkpoint out of the way; return where it went."""


@runtime_checkable
class ProbingStore(Protocol):
    """The optional capability of a store to say cheaply that it can be reached again.

    A writer waiting out a retry backoff after a failed write calls
    ``probe`` about once a second (in a worker thread); True ends the wait
    and the write is retried at once.  So after an outage the writer is
    back within a second of the store, not at the end of a long backoff.
    """

    def probe(self) -> bool:
        """True if a write that failed because the store was unreachable would now reach it.

        False when the store was not lost (the failure was of another kind,
        whose backoff stands) or still does not answer.  Cheap, bounded,
        never raises.
        """
        ...


class FileStore:
    """Checkpoints as files: key ``k`` lives at ``root/k.json``.

    The root is created (mode 0700) on the first write.  Each write is a
    durable atomic replace (temp file, fsync, rename, directory fsync).
    A writer holds ``root/k.lock`` while it writes ``k`` (see ``lock``).
    Nothing planted in the root (a link, a FIFO, a hard link) is followed
    or written through; see ``_safefs`` for the rules.

    Args:
        root: the directory that holds the checkpoint files.
        transcript: where states keep their messages; given, each settled
            message is encoded once and its bytes cached, and the file is
            joined in the worker thread (no loop stall for large sessions).
    """

    suffix = ".json"
    _grows = False  # JournalStore: appended in place, so a read without the lock sees it grow

    def __init__(
        self, root: str | os.PathLike[str], *, transcript: Transcript | None = None
    ) -> None:
        self.root = os.fspath(root)
        if not isinstance(self.root, str) or not self.root:
            raise ValueError(f"FileStore root must be a non-empty path, got {root!r}")
        if transcript is not None and not isinstance(transcript, Transcript):
            raise TypeError(f"transcript must be a Transcript or None, got {transcript!r}")
        self.transcript = transcript

    def __repr__(self) -> str:
        return f"FileStore({self.root!r})"

    def validate_key(self, key: str) -> None:
        check_key(key)

    def location(self, key: str) -> str:
        return os.path.join(self.root, key + self.suffix)

    def open(self) -> None:
        check_root(self.root)
        for path in sweep_temps(self.root):
            logger.info("checkpointer: removed stale temp file %s", path)

    def write(self, key: str, chunks: Sequence[bytes]) -> int:
        check_key(key)
        return write_atomic(self.location(key), chunks)

    def read(self, key: str) -> bytes | None:
        """The bytes of ``key``'s file, or None.

        Raises:
            UnsafeFile: a symbolic link, a FIFO or a device is in its place
                (never followed, never waited on), or a file of an untrusted
                owner (see ``_safefs``).
            UnreadableFile: larger than this machine's memory, more than the
                process can allocate, or growing while read (a journal may
                grow: what ``fstat`` saw is read).
            OSError: it cannot be read.
        """
        check_key(key)
        return read_checked(self.location(key), growing=self._grows)

    def keys(self) -> list[str]:
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        n = len(self.suffix)
        found = [
            name[:-n]
            for name in names
            if name.endswith(self.suffix) and KEY_PATTERN.fullmatch(name[:-n])
        ]
        return sorted(found)

    def delete(self, key: str) -> bool:
        check_key(key)
        try:
            os.unlink(self.location(key))
        except FileNotFoundError:
            return False
        return True

    def move_aside(self, key: str, suffix: str) -> str | None:
        check_key(key)
        source = self.location(key)
        target = os.path.join(self.root, f"{key}.{suffix}")
        try:
            # A rename moves and replaces names, never following a link at either.
            os.replace(source, target)
        except FileNotFoundError:
            return None
        fsync_dir(self.root)
        return target

    def lock(self, key: str, *, timeout: float = 0.0) -> KeyLock:
        """Take the writer lock of ``key``: ``flock`` on ``root/<key>.lock``.

        The ``LockingStore`` capability; see ``checkpointer._lock`` for why
        ``flock`` and how release avoids the unlink race.

        Raises:
            KeyLocked: another writer holds it after ``timeout`` seconds.
        """
        check_key(key)
        path = os.path.join(self.root, key + ".lock")
        return acquire_file_lock(path, key=key, timeout=timeout)
