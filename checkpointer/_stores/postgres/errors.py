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
    """A write was refused: the store holds a newer checkpoint of the key.

    The writer that sent it lost the session to another writer, which wrote
    since; applying the late write would lose that writer's work.
    """


class IdleLoss(PostgresStoreError):
    """The connection kept from an earlier call was found lost: worth one retry."""
