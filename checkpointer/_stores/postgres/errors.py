"""The errors of the PostgreSQL store: ``OSError`` s, as the ``Store`` protocol promises."""

from __future__ import annotations

from ..base import KeyLocked, StaleWrite

__all__ = ["IdleLoss", "KeyLockedError", "PostgresStoreError", "StaleWriteError"]


class PostgresStoreError(OSError):
    """The PostgreSQL store could not do what was asked (the message names the server,
    never the password, and the way out)."""


class KeyLockedError(KeyLocked, PostgresStoreError):
    """Another writer holds the key's lock in PostgreSQL (``location`` names its backend)."""


class StaleWriteError(StaleWrite, PostgresStoreError):
    """The key's row does not hold the revision the writer expected."""


class IdleLoss(PostgresStoreError):
    """The connection kept from an earlier call was found lost: worth one retry."""
