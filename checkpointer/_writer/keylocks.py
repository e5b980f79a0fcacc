"""The writer locks one ``CheckpointWriter`` holds, one per key.

Over the ``LockingStore`` capability (``_stores/base.py``): a store
without it is not locked.  In a forked child the locks held are the
parent's: they are forgotten, never released (see ``_stores/flock.py``).
"""

from __future__ import annotations

import logging
import os

from .._stores.base import KeyLock, KeyLocked, LockingStore
from .._values import Failed

__all__ = ["KeyLocks"]

logger = logging.getLogger("checkpointer")


class KeyLocks:
    """The writer locks one ``CheckpointWriter`` holds, one per key.

    Called under the writer's I/O lock only.  A store without the
    ``LockingStore`` capability is not locked: every ``acquire`` succeeds.
    """

    def __init__(self, store: object, timeout: float) -> None:
        self._store = store if isinstance(store, LockingStore) else None
        self._timeout = timeout
        self._held: dict[str, KeyLock] = {}
        self._pid = os.getpid()

    def acquire(self, key: str, location: str, *, wait: bool = True) -> Failed | bool:
        """Take ``key``'s lock unless held already.

        Args:
            key: the key.
            location: where it lives, for the message.
            wait: wait up to the writer's ``lock_timeout`` for another
                holder; False tries once.

        Returns:
            True when the lock was taken just now (someone else may have
            written the key since this writer last held it), False when it
            was held already or the store does not lock, ``Failed`` when
            another writer holds it or locking failed.
        """
        if self._pid != os.getpid():
            self._forget_if_forked()
        if self._store is None or key in self._held:
            return False
        try:
            self._held[key] = self._store.lock(key, timeout=self._timeout if wait else 0.0)
        except KeyLocked as exc:
            return Failed("locked", str(exc))
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
            return Failed("write-failed", f"cannot lock {location}: {why}")
        return True

    @property
    def waits(self) -> bool:
        """Whether ``acquire`` may wait for another holder (``lock_timeout`` > 0)."""
        return self._store is not None and self._timeout > 0

    def release(self, key: str) -> None:
        self._forget_if_forked()
        lock = self._held.pop(key, None)
        if lock is None:
            return
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
