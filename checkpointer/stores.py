"""The store contract, for writing a store of your own: the protocols and their helpers.

A store is any object with the methods of ``Store``; its ``write`` is
conditional (``landed`` makes the decision, ``StaleWrite`` is the refusal).
``LockingStore`` and ``ProbingStore`` are optional capabilities;
``unfenced`` accepts a store that cannot refuse a stale write.  See the
docs page "One writer per key", section "Writing a store of your own".
"""

from ._stores.base import (
    KEY_PATTERN,
    KeyLock,
    KeyLocked,
    LockHolder,
    LockingStore,
    ProbingStore,
    StaleWrite,
    Store,
    check_key,
    landed,
    unfenced,
)

__all__ = [
    "KEY_PATTERN",
    "KeyLock",
    "KeyLocked",
    "LockHolder",
    "LockingStore",
    "ProbingStore",
    "StaleWrite",
    "Store",
    "check_key",
    "landed",
    "unfenced",
]
