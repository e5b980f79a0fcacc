"""The local-file store: key ``k`` at ``<root>/k.json``, one envelope file per key.

``FileStore`` implements ``Store`` (``base.py``) with the durable atomic
replace of ``atomic.py``, the lock of ``flock.py`` and the checks of
``safefs.py``.  The writer reaches it through ``envelopes.Envelopes``.
Every write and delete runs under the key's lock (``<root>/k.lock``): the
writer's, held for its life, or taken for the call; so the revision check
of a write and its rename are one step for every process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Sequence

from .._format.envelope import decode_meta, peek_meta
from .atomic import fsync_dir, fsync_parents, sweep_temps, write_atomic
from .base import KEY_PATTERN, KeyLock, check_key, landed
from .flock import FileKeyLock, acquire_file_lock
from .safefs import check_root, read_checked

__all__ = ["FileStore"]

logger = logging.getLogger("checkpointer")

SWEEP_EVERY = 300.0
"""Seconds after which a root is swept again at the next open (a sibling may have died)."""

# (pid, st_dev, st_ino) of a root this process swept -> when (time.monotonic).
# Keyed by the directory itself, not its name: a relative root after
# os.chdir, or a root deleted and made again, is another directory.
_swept: dict[tuple[int, int, int], float] = {}

_PEEK = 4096  # bytes read to find a file's meta: a meta is a few hundred


class FileStore:
    """Checkpoints as files: key ``k`` lives at ``root/k.json``.

    The root is created (mode 0700) on the first write.  Each write is a
    durable atomic replace (temp file, fsync, rename, directory fsync).
    The first write of each store object also fsyncs the directories above
    the root (``atomic.fsync_parents``): a root that was already there (the
    app made it) may never have been made durable.
    A writer holds ``root/k.lock`` while it writes ``k`` (see ``lock``).
    Nothing planted in the root (a link, a FIFO, a hard link) is followed
    or written through; see ``safefs`` for the rules.

    Args:
        root: the directory that holds the checkpoint files.
    """

    suffix = ".json"
    _grows = False  # JournalStore: appended in place, so a read without the lock sees it grow

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.fspath(root)
        if not isinstance(self.root, str) or not self.root:
            raise ValueError(f"FileStore root must be a non-empty path, got {root!r}")
        self._root_synced = False
        self._synced_summaries: set[str] = set()  # keys whose sessions/<key>/ is durable
        self._locks: dict[str, FileKeyLock] = {}  # the key locks taken through lock()

    def __repr__(self) -> str:
        return f"FileStore({self.root!r})"

    def validate_key(self, key: str) -> None:
        check_key(key)

    def location(self, key: str) -> str:
        return os.path.join(self.root, key + self.suffix)

    def open(self) -> None:
        """Called as each writer opens: check the root, sweep dead processes' temps.

        The sweep lists the root, so it runs once per directory and process
        every ``SWEEP_EVERY`` seconds (an agent server opening 10,000 writers
        on one root lists it once, not 10,000 times over 10,000 files); temps
        a process leaves when it dies are swept by the next process to open
        the root, or by a live one's next open after ``SWEEP_EVERY``.  The
        directory is known by its device and inode, so a relative root after
        ``os.chdir``, or a root deleted and made again, is swept afresh.
        """
        check_root(self.root)
        try:
            st = os.stat(self.root)
        except OSError:
            st = None  # not there yet: swept when it is
        now = time.monotonic()
        if st is not None:
            swept = (os.getpid(), st.st_dev, st.st_ino)
            last = _swept.get(swept)
            if last is not None and now - last < SWEEP_EVERY:
                return
        for path in sweep_temps(self.root):
            logger.info("checkpointer: removed stale temp file %s", path)
        if st is not None:
            _swept[swept] = now

    def write(
        self, key: str, chunks: Sequence[bytes], *, revision: str, expected: str | None
    ) -> int:
        """Replace ``key``'s file if it holds revision ``expected``, under the key's lock.

        See ``Store.write``.  The lock is the writer's when it holds it
        through this store, else taken for the call (``KeyLocked`` if
        another writer holds it).
        """
        check_key(key)
        with self._owned(key):
            if landed(key, self.revision(key), revision, expected):
                return sum(map(len, chunks))
            nbytes = write_atomic(self.location(key), chunks)
        self._sync_root()
        return nbytes

    def revision(self, key: str) -> str | None:
        """The revision of ``key``'s checkpoint (None: there is none), read from its meta.

        Raises:
            CheckpointError: the file holds no checkpoint envelope.
            OSError: it cannot be read.
        """
        path = self.location(key)
        head = read_checked(path, limit=_PEEK)
        if head is None:
            return None
        meta = peek_meta(head)
        if meta is None:  # laid out by hand, or a meta past _PEEK: decode it all
            data = read_checked(path)
            if data is None:
                return None
            meta = decode_meta(data, path)
        return meta.revision

    def _holds(self, key: str) -> bool:
        """Whether this store holds ``key``'s lock now (a writer's, or one taken for a call)."""
        held = self._locks.get(key)
        return held is not None and held.held  # a forked child's copy is not held

    @contextlib.contextmanager
    def _owned(self, key: str) -> Iterator[None]:
        """Hold ``key``'s lock for the block: the one taken through ``lock()``, or one for it.

        Raises:
            KeyLocked: another writer holds it (another process, or another
                store object of this one).
        """
        if self._holds(key):
            yield
            return
        lock = self._locks[key] = acquire_file_lock(os.path.join(self.root, key + ".lock"), key=key)
        try:
            yield
        finally:
            if self._locks.get(key) is lock:
                del self._locks[key]
            lock.release()

    def _sync_root(self) -> None:
        """Once per store object, after its first write: make the root's own entry durable.

        Not per write, nor per writer open: once it is durable it stays so.
        Two threads racing here fsync twice, harmlessly; a failure is tried
        again at the next write.
        """
        if not self._root_synced:
            fsync_parents(self.root)
            self._root_synced = True

    def read(self, key: str) -> bytes | None:
        """The bytes of ``key``'s file, or None.

        Raises:
            UnsafeFile: a symbolic link, a FIFO or a device is in its place
                (never followed, never waited on), or a file of an untrusted
                owner (see ``safefs``).
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
        """Remove ``key``'s file, durably (its directory fsynced); False if there was none.

        Under the key's lock: this store's, if it holds it (a writer of this
        process, whose next write is then a conflict, or a caller that locked
        the key to delete it), else one taken for the call.

        Raises:
            KeyLocked: a live writer of another process, or of another store
                object of this one, holds the key.
        """
        check_key(key)
        with self._owned(key):
            try:
                os.unlink(self.location(key))
            except FileNotFoundError:
                return False
        fsync_dir(self.root)  # after the lock's own unlink: one fsync makes both durable
        return True

    def move_aside(self, key: str, suffix: str) -> str | None:
        check_key(key)
        source = self.location(key)
        target = os.path.join(self.root, f"{key}.{suffix}")
        with self._owned(key):
            try:
                # A rename moves and replaces names, never following a link at either.
                os.replace(source, target)
            except FileNotFoundError:
                return None
        fsync_dir(self.root)
        return target

    def lock(self, key: str, *, timeout: float = 0.0) -> KeyLock:
        """Take the writer lock of ``key``: ``flock`` on ``root/<key>.lock``.

        The ``LockingStore`` capability; see ``checkpointer._stores.flock`` for why
        ``flock`` and how release avoids the unlink race.

        Raises:
            KeyLocked: another writer holds it after ``timeout`` seconds.
        """
        check_key(key)
        path = os.path.join(self.root, key + ".lock")
        lock = self._locks[key] = acquire_file_lock(path, key=key, timeout=timeout)
        return lock
