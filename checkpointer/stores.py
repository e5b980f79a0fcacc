"""The store contract, for writing a store of your own: the protocols and their helpers.

A store is any object with the methods of ``Store``; its ``write`` is
conditional (``landed`` makes the decision, ``StaleWrite`` is the refusal).
``LockingStore`` and ``ProbingStore`` are optional capabilities;
``unfenced`` accepts a store that cannot refuse a stale write; ``Encryption``
seals what a built-in store keeps (``FileStore(root, encryption=...)``).  Also here:
the errors the built-in stores raise, and the values a checkpoint's meta
and a journal report carry.  See the docs page "One writer per key",
section "Writing a store of your own".
"""

from ._stores.base import (
    KEY_PATTERN,
    KeyLock,
    KeyLocked,
    LockHolder,
    LockingStore,
    ProbingStore,
    Staged,
    StaleWrite,
    StateStore,
    Store,
    check_key,
    landed,
    unfenced,
)
from ._stores.journal.file import JournalStatistics
from ._stores.postgres.errors import KeyLockedError, PostgresStoreError, StaleWriteError
from ._stores.s3.client import S3StoreError
from ._stores.sealing import DecryptionError, Encryption
from ._values import TornTail, WriterInfo

__all__ = [
    "KEY_PATTERN",
    "DecryptionError",
    "Encryption",
    "JournalStatistics",
    "KeyLock",
    "KeyLocked",
    "KeyLockedError",
    "LockHolder",
    "LockingStore",
    "PostgresStoreError",
    "ProbingStore",
    "S3StoreError",
    "Staged",
    "StaleWrite",
    "StaleWriteError",
    "StateStore",
    "Store",
    "TornTail",
    "WriterInfo",
    "check_key",
    "landed",
    "unfenced",
]
