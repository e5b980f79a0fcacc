"""The local-file store: key ``k`` at ``<root>/k.json``, one envelope file per key.

Every write and delete runs under the key's lock (``<root>/k.lock``): the
writer's, held for its life, or one taken for the call; and under this store
object's lock of the key (threads share the first): so the revision check of
a write and its rename are one step for every process and thread.  Bytes not
an envelope of their revision (a wrapper's, compressed) get it on a first
line of the store's own (``_MARK``), which ``read`` strips.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

from .._format.envelope import decode_meta, peek_meta
from .atomic import fsync_dir, fsync_parents, sweep_temps, write_atomic
from .base import KEY_PATTERN, KeyLock, check_key, landed, time_left
from .flock import FileKeyLock, acquire_file_lock
from .safefs import check_root, read_checked
from .sealing import DecryptionError, Encryption, check_sealer, is_sealed, seal, unseal

__all__ = ["FileStore"]

logger = logging.getLogger("checkpointer")

SWEEP_EVERY = 300.0
"""Seconds after which a root is swept again at the next open (a sibling may have died)."""

# (pid, absolute path, st_dev, st_ino) of a root this process swept -> when (monotonic):
# by its path and the directory there, for neither alone names one.  A path that names
# another directory (a relative root after chdir) is swept afresh, and so is a new path
# whose directory got the inode of one swept and deleted (ext4 and tmpfs reuse it at once).
# A root deleted and made again at its path and inode holds only temps younger than the
# sweep, as when a sibling dies later: swept at an open past SWEEP_EVERY.
_swept: dict[tuple[int, str, int, int], float] = {}

_PEEK = 4096  # bytes read to find a file's meta: a meta is a few hundred
_MARK = b"\x00checkpointer-revision "  # + the revision + b"\n": no envelope starts so


class FileStore:
    """Checkpoints as files: key ``k`` lives at ``root/k.json``.

    The root is created (mode 0700) on the first write.  Each write is a
    durable atomic replace (temp file, fsync, rename, directory fsync),
    under the key's lock ``root/k.lock``; the first one also fsyncs the
    directories above the root.  Writes that fall due together (other keys'
    writers, in other threads) share one directory fsync: each returns once
    a directory fsync begun after its rename has ended.  Nothing planted in the root (a link, a
    FIFO, a hard link) is followed or written through.

    Args:
        root: the directory that holds the checkpoint files.
        encryption: seal every file (``Encryption``): only its revision and
            meta stay readable (see the docs page "Encryption at rest").
    """

    suffix = ".json"
    _grows = False  # JournalStore: appended in place, so a read without the lock sees it grow

    def __init__(
        self, root: str | os.PathLike[str], *, encryption: Encryption | None = None
    ) -> None:
        self.root = os.fspath(root)
        self.encryption = encryption
        if not isinstance(self.root, str) or not self.root:
            raise ValueError(f"FileStore root must be a non-empty path, got {root!r}")
        self._root_synced = False
        self._synced_summaries: set[str] = set()  # keys whose sessions/<key>/ is durable
        # The key locks taken through lock(), and this object's mutex per key: weak, so each
        # goes with the last user of its key (a server opens keys without end).
        self._locks: weakref.WeakValueDictionary[str, FileKeyLock] = weakref.WeakValueDictionary()
        self._mutexes = _Mutexes()

    def __getstate__(self) -> dict[str, Any]:
        """For a spawned process: the key locks and mutexes are this process's own."""
        state = self.__dict__.copy()
        del state["_locks"], state["_mutexes"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._locks = weakref.WeakValueDictionary()
        self._mutexes = _Mutexes()

    def __repr__(self) -> str:
        sealed = "" if self.encryption is None else f", encryption={self.encryption!r}"
        return f"{type(self).__name__}({self.root!r}{sealed})"

    def validate_key(self, key: str) -> None:
        check_key(key)

    def location(self, key: str) -> str:
        return os.path.join(self.root, key + self.suffix)

    def open(self) -> None:
        """Check the root and sweep dead writes' temps: once per directory and process
        every ``SWEEP_EVERY`` seconds (10,000 writers opening on one root list it once)."""
        check_root(self.root)
        try:
            st = os.stat(self.root)
        except OSError:
            st = None  # not there yet: swept when it is
        now = time.monotonic()
        if st is not None:
            swept = (os.getpid(), os.path.abspath(self.root), st.st_dev, st.st_ino)
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
        """``Store.write``, under the key's lock: the writer's, else taken for the call."""
        check_key(key)
        with self._locked(key), self._owned(key):
            stored, head = self._peek(key)
            # This very write landed, its answer lost: written again, not fsynced again,
            # for that answer may have been the directory fsync's error, and a second
            # fsync may call clean what the first dropped.
            landed(key, stored, revision, expected)
            check_sealer(self.encryption, head, key=key, where=self.location(key))
            sealed = seal(self.encryption, chunks, key=key, position=revision)
            # An envelope's prefix, meta, middle; a sealed record is never one.
            meta = peek_meta(b"".join(chunks[:3])) if sealed is chunks else None
            if meta is None or meta.revision != revision:
                chunks = [b"%s%s\n" % (_MARK, revision.encode()), *sealed]
            nbytes = write_atomic(self.location(key), chunks)
        self._sync_root()
        return nbytes

    def revision(self, key: str) -> str | None:
        """``Store.revision``, from ``_MARK`` or the file's meta (``CheckpointError`` if none)."""
        return self._peek(key)[0]

    def _peek(self, key: str) -> tuple[str | None, bytes]:
        """The revision of ``key``'s file and its record's first bytes (b"" if none)."""
        path = self.location(key)
        head = read_checked(path, limit=_PEEK)
        if head is None:
            return None, b""
        if head.startswith(_MARK):
            end = head.find(b"\n")
            return head[len(_MARK) : end].decode(), head[end + 1 :]
        if is_sealed(head):  # not damage: it may open once its line is put back
            why = "a sealed record without its revision line (cut at the front?); kept"
            raise DecryptionError(path, why, key=key, position="?", key_id=None, why="truncated")
        meta = peek_meta(head)
        if meta is None:  # laid out by hand, or a meta past _PEEK: decode it all
            data = read_checked(path)
            if data is None:
                return None, b""
            meta = decode_meta(data, path)
        return meta.revision, head

    def _holds(self, key: str) -> bool:
        """Whether this store holds ``key``'s lock now (a writer's, or one taken for a call)."""
        held = self._locks.get(key)
        return held is not None and held.held  # a forked child's copy is not held

    @contextlib.contextmanager
    def _owned(self, key: str) -> Iterator[None]:
        """Hold ``key``'s lock for the block: the one taken through ``lock()``, or one for it."""
        if self._holds(key):
            yield
            return
        lock = self._locks[key] = acquire_file_lock(self._lock_path(key), key=key)
        try:
            yield
        finally:
            if self._locks.get(key) is lock:
                del self._locks[key]
            lock.release()

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        """This store's lock of ``key``; ``TimeoutError`` past the caller's ``commit_deadline``."""
        mutex = self._mutex(key)
        if not mutex.acquire(timeout=time_left()):
            raise TimeoutError(
                f"cannot use {self.location(key)}: another write of this store did not "
                "finish within the flush's timeout (exit_timeout); is the disk stuck?"
            )
        try:
            yield
        finally:
            mutex.release()

    def _mutex(self, key: str) -> threading.Lock:
        if self._mutexes.pid != os.getpid():  # forked: a thread of the parent's may have held one
            self._mutexes = _Mutexes()
        mutexes = self._mutexes
        with mutexes.guard:  # a weak dict's setdefault is not atomic
            return mutexes.by_key.setdefault(key, threading.Lock())

    def _forget(self, key: str) -> None:
        """What this store remembers of ``key``'s file, dropped (it is going away)."""

    def _sync_root(self) -> None:
        """After the first write of this store object: the root's own entry, durable."""
        if not self._root_synced:
            fsync_parents(self.root)
            self._root_synced = True

    def read(self, key: str) -> bytes | None:
        """The bytes of ``key``'s file, or None; ``UnsafeFile`` if something else is there."""
        check_key(key)
        where = self.location(key)
        data = read_checked(where, growing=self._grows)
        if data is None:
            return None
        revision = "(its own meta's)"  # a plaintext envelope: said only if it is refused
        if data.startswith(_MARK):
            end = data.find(b"\n")
            revision, data = data[len(_MARK) : end].decode(errors="replace"), data[end + 1 :]
        return unseal(self.encryption, data, key=key, position=revision, where=where)

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
        """``Store.delete``, durably, under the key's lock: this store's if it holds it
        (its writer's next write is then a conflict), else one taken for the call."""
        check_key(key)
        with self._locked(key), self._owned(key):
            self._forget(key)
            try:
                os.unlink(self.location(key))
            except FileNotFoundError:
                return False
        fsync_dir(self.root)  # after the lock's own unlink: one fsync for both
        return True

    def move_aside(self, key: str, suffix: str) -> str | None:
        check_key(key)
        with self._locked(key), self._owned(key):
            return self._moved_aside(key, suffix)

    def _moved_aside(self, key: str, suffix: str) -> str | None:
        """``move_aside``, under the key's locks."""
        self._forget(key)
        target = os.path.join(self.root, f"{key}.{suffix}")
        try:
            # A rename moves and replaces names, never following a link at either.
            os.replace(self.location(key), target)
        except FileNotFoundError:
            return None
        fsync_dir(self.root)
        return target

    def lock(self, key: str, *, timeout: float = 0.0) -> KeyLock:
        """``LockingStore.lock``: an ``flock`` on ``root/<key>.lock``."""
        check_key(key)
        lock = self._locks[key] = acquire_file_lock(self._lock_path(key), key=key, timeout=timeout)
        return lock

    def _lock_path(self, key: str) -> str:
        return os.path.join(self.root, key + ".lock")


class _Mutexes:
    """A store object's mutex per key, each kept while a thread holds or waits for it."""

    __slots__ = ("by_key", "guard", "pid")

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.guard = threading.Lock()
        self.by_key: weakref.WeakValueDictionary[str, threading.Lock] = (
            weakref.WeakValueDictionary()
        )
