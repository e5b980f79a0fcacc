"""The writer locks one ``CheckpointWriter`` holds, one per key.

Over the ``LockingStore`` capability (``_stores/base.py``): a store without
it is not locked, and every ``acquire`` succeeds.  Used under the writer's
I/O lock only.
"""

from __future__ import annotations

import logging
import os

from .._stores.base import KeyLock, KeyLocked, LockingStore
from .._values import Failed

__all__ = ["KeyLocks"]

logger = logging.getLogger("checkpointer")


class KeyLocks:
    """The writer locks one ``CheckpointWriter`` holds, one per key."""

    def __init__(self, store: object, timeout: float) -> None:
        self._store = store if isinstance(store, LockingStore) else None
        self._timeout = timeout
        self._held: dict[str, KeyLock] = {}
        self._pid = os.getpid()

    @property
    def waits(self) -> bool:
        """Whether ``acquire`` may wait for another holder (``lock_timeout`` > 0)."""
        return self._store is not None and self._timeout > 0

    def acquire(self, key: str, location: str, *, wait: bool = True) -> Failed | bool:
        """Take ``key``'s lock unless held already, waiting up to ``lock_timeout`` if ``wait``.

        Returns:
            True when taken just now, False when held already or the store
            does not lock, ``Failed`` (naming ``location``) when another
            writer holds it or locking failed.
        """
        self._forget_if_forked()
        if self._store is None or key in self._held:
            return False
        try:
            self._held[key] = self._store.lock(key, timeout=self._timeout if wait else 0.0)
        except KeyLocked as exc:
            return Failed("locked", str(exc))
        except Exception as exc:
            return Failed("write-failed", f"cannot lock {location}: {type(exc).__name__}: {exc}")
        return True

    def release(self, key: str) -> None:
        self._forget_if_forked()
        lock = self._held.pop(key, None)
        if lock is not None:
            try:
                lock.release()
            except Exception as exc:  # closing must go on; the kernel frees it at exit
                logger.warning("checkpointer: could not release the lock of %r: %s", key, exc)

    def release_all(self) -> None:
        for key in list(self._held):
            self.release(key)

    def _forget_if_forked(self) -> None:
        # In a forked child the held locks are the parent's: releasing one
        # (whatever the store) could release it for the parent.  Drop them.
        if self._pid != os.getpid():
            self._held.clear()
            self._pid = os.getpid()
