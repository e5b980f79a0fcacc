"""The errors of the PostgreSQL store: ``OSError`` s, as the ``Store`` protocol promises."""

from __future__ import annotations

from ..base import KeyLocked, StaleWrite

__all__ = ["IdleLoss", "KeyLockedError", "PostgresStoreError", "StaleWriteError"]


class PostgresStoreError(OSError):
    """The PostgreSQL store could not do what was asked.

    The message names the server (never the password) and, where there is
    one, the way out.  An ``OSError`` (without an errno), as the ``Store``
    protocol promises for a failed write.
    """


class KeyLockedError(KeyLocked, PostgresStoreError):
    """Another writer holds the key's lock in PostgreSQL.

    A ``KeyLocked`` (what every locking store raises, and what the writer
    turns into ``Failed("locked")``) and a ``PostgresStoreError``.

    Attributes:
        key: the key.
        location: the key's row, and the PostgreSQL backend holding the lock.
        holder: who holds it (pid, host, since when), or None if it is not
            a checkpointer writer that said so.
    """


class StaleWriteError(StaleWrite, PostgresStoreError):
    """A write was refused: the key's row does not hold the revision the writer expected.

    Another writer wrote the key (or deleted it) since this writer looked;
    applying the write would lose that writer's work.  A ``StaleWrite``
    (what every store raises, and what the writer turns into
    ``Failed("conflict")``) and a ``PostgresStoreError``.

    Attributes:
        key: the key.
        expected: the revision the write expected (None: no checkpoint).
        stored: the revision the row holds (None: no row).
    """


class IdleLoss(PostgresStoreError):
    """The connection kept from an earlier call was found lost: worth one retry."""
