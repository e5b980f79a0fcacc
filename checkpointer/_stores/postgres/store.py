"""The PostgreSQL store: checkpoints as rows, one writer per key across a fleet.

A write is one transaction whose first statement writes only over the revision
expected: the revision makes it safe, the advisory lock only refuses a second
live writer early.  The same statement returns the header line of a sealed
record it replaced: a writer without the key that sealed it is refused
(``DecryptionError``) and the transaction rolled back, never a record lost.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from ... import _exit
from ..._format.envelope import FORMAT, MIDDLE, PREFIX, SUFFIX, check_format, decode_raw
from ..._format.journal import assemble_rows
from ..._values import CheckpointError, Meta
from ..base import check_key
from ..sealing import check_sealer, is_sealed, open_rows, seal, unseal
from .connection import SLOW_BYTES_PER_SECOND
from .errors import IdleLoss, KeyLockedError, PostgresStoreError, StaleWriteError
from .locks import LocksPart
from .schema import SCHEMA_VERSION

if TYPE_CHECKING:
    import psycopg

__all__ = ["PostgresStore", "row_params"]


class _Revision(msgspec.Struct):
    revision: str = "(none in its meta)"


def _revision(meta_json: bytes, where: str) -> str:
    """The revision a row's meta names: where its sealed state opens."""
    try:
        return msgspec.json.decode(meta_json, type=_Revision).revision
    except msgspec.ValidationError as exc:
        raise CheckpointError(where, f"the meta column is no checkpoint's meta ({exc})") from None


class PostgresStore(LocksPart):
    """Checkpoints as rows in PostgreSQL, with one writer per key across a fleet.

    Key ``k`` is the row ``k`` of ``<schema>.checkpoints``.  Use it like a ``FileStore``;
    close it (or use ``with``) to release its locks early, else they go when the process exits.

    Args:
        dsn: a libpq connection string or URI
            (``"postgresql://app@db.internal:5432/agents"``); ``""`` uses the
            ``PG*`` environment variables.  A password may come from the DSN,
            ``PGPASSWORD`` or ``~/.pgpass``.
        schema: the PostgreSQL schema that holds the tables.
        create_schema: create the tables on first use; with False a
            missing schema is an error that says how to create it.
        connect_timeout: seconds to connect (libpq waits at least 2).
        statement_timeout: seconds the server may spend on one statement; a
            call that gets no answer a second after that is cut off.
        lock_timeout: seconds a statement may wait for a table or row lock.
        application_name: shown in ``pg_stat_activity``.
        encryption: seal every checkpoint (``Encryption``): its meta column
            stays readable (see the docs page "Encryption at rest").

    Raises:
        ImportError: psycopg is not installed (the message names the extra).
        ValueError: the DSN cannot be parsed, or an argument is out of range.
    """

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._where!r}, schema={self.schema!r})"

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def validate_key(self, key: str) -> None:
        check_key(key)

    def open(self) -> None:
        """Connect and make sure the schema is there (creating it if allowed)."""
        self._run(lambda conn: None)

    def write(
        self, key: str, chunks: Sequence[bytes], *, revision: str, expected: str | None
    ) -> int:
        """``Store.write``: one transaction, under the key's lock (taken if not held)."""
        check_key(key)
        meta_json, state = self._split(key, chunks)
        if self.encryption is not None:  # the meta stays readable (a column), bound to the state
            state = b"".join(seal(self.encryption, chunks, key=key, position=revision))
        params = row_params(key, revision, expected, meta_json.decode(), state, journal=False)
        nbytes = sum(len(chunk) for chunk in chunks)
        self._conditional_write(key, params, nbytes=nbytes)
        return nbytes

    def revision(self, key: str) -> str | None:
        """The revision ``key``'s row holds (None: no row): one small SELECT."""
        check_key(key)
        row = self._run(lambda c: c.execute(self._sql["revision"], {"key": key}).fetchone())
        return None if row is None else str(row[0])

    def _conditional_write(
        self,
        key: str,
        params: dict[str, Any],
        then: Callable[[psycopg.Connection[Any]], None] | None = None,
        *,
        statement: str = "",
        nbytes: int = 0,
    ) -> None:
        """Write ``key``'s row over revision ``params["expected"]``, then ``then(conn)``: one
        transaction, under the key's lock.  One whose connection was lost once it reached the
        server is made again on a new one, for ``connect_timeout`` at most (if its COMMIT
        landed, it finds its own revision); one cut off as a hang is not.
        """
        if not statement:
            statement = "insert" if params["expected"] is None else "update"
        budget = nbytes / SLOW_BYTES_PER_SECOND
        retry_until: float | None = None
        reached = False  # an attempt had a connection
        while True:
            self._lost = False  # set again by a failure of this attempt to reach the server
            try:
                with self._session(budget=budget) as conn:
                    reached = True
                    refused = self._acquire(conn, key)
                    if refused is not None:
                        raise refused
                    with conn.transaction():
                        if budget >= 1:
                            timeout = round((self.statement_timeout + budget) * 1000)
                            conn.execute(b"SET LOCAL statement_timeout = %d" % timeout)
                        if self._apply(conn, key, statement, params) and then is not None:
                            then(conn)
                return
            except (KeyLockedError, StaleWriteError):
                raise
            except PostgresStoreError as exc:
                # The server went away (a restart, a failover, an idle loss), not
                # a hang: again on a fresh connection, for connect_timeout at most.
                if not (reached and self._lost) or self._watchdog.fired:
                    raise
                now = time.monotonic()
                if retry_until is None:
                    retry_until = now + self.connect_timeout
                elif now >= retry_until:
                    raise
                if not isinstance(exc, IdleLoss):
                    time.sleep(0.1)  # a restarting server refuses connections a moment

    def _apply(
        self, conn: psycopg.Connection[Any], key: str, statement: str, params: dict[str, Any]
    ) -> bool:
        """The conditional write: True if it wrote, False if the row holds its revision.

        Raises:
            DecryptionError: it replaced a record sealed with a key this store's
                ``Encryption`` lacks (or it has none): the transaction rolls back.
        """
        revision, expected = params["revision"], params["expected"]
        while (written := conn.execute(self._sql[statement], params).fetchone()) is None:
            row = conn.execute(self._sql["revision"], {"key": key}).fetchone()
            stored = None if row is None else str(row[0])
            if stored == revision:
                return False
            if stored != expected:
                raise StaleWriteError(key, expected=expected, stored=stored)
            # Changed back between the two statements (a row that stopped an
            # insert, deleted by hand since): the write may go ahead after all.
        if written[0] is not None:
            check_sealer(self.encryption, bytes(written[0]), key=key, where=self.location(key))
        return True

    def read(self, key: str) -> bytes | None:
        """The checkpoint of ``key`` as an envelope (a journal's rows assembled)."""
        check_key(key)
        params = {"key": key}
        rows = self._run(lambda c: c.execute(self._sql["read"], params, binary=True).fetchall())
        if not rows:
            return None
        fmt, meta, state, journal, _ = rows[0]
        meta_json, where = meta.encode(), self.location(key)
        if journal:  # a head of a newer format: its rows are left to that version
            check_format(b'{"format":%d,"meta":%b}' % (fmt, meta_json), where)
            bodies = [row[4] for row in rows if row[4] is not None]
            if self.encryption is not None or is_sealed(state):  # a head's state: the end
                readable = msgspec.json.decode(meta_json, type=Meta)  # on a DecryptionError
                bodies = open_rows(
                    self.encryption, bodies, state, key=key, where=where, meta=readable
                )
            state = assemble_rows(meta_json, bodies, where)
        elif self.encryption is not None or is_sealed(state):
            at = _revision(meta_json, where)
            return unseal(self.encryption, state, key=key, position=at, where=where)
        return b"".join([b'{"format":%d,"meta":' % fmt, meta_json, MIDDLE, state, SUFFIX])

    def keys(self) -> list[str]:
        rows = self._run(lambda c: c.execute(self._sql["keys"]).fetchall())
        return sorted(row[0] for row in rows)

    def delete(self, key: str) -> bool:
        """``Store.delete``, under the key's lock (``KeyLockedError`` if a live writer has it)."""
        check_key(key)
        handle = self._handles.get(key)
        if handle is not None:
            where = f"{self.location(key)}, held by a writer through this same PostgresStore"
            raise KeyLockedError(key, where, handle.holder)
        return self._locked_run(key, "delete", {"key": key})

    def move_aside(self, key: str, suffix: str) -> str | None:
        """Move ``key``'s row (a journal's rows as lines) to ``<schema>.aside``, as ``delete``."""
        check_key(key)
        if not self._locked_run(key, "move_aside", {"key": key, "suffix": suffix}):
            return None
        return f"{self._where}/{self.schema}.aside/{key}.{suffix}"

    def _locked_run(self, key: str, statement: str, params: dict[str, Any]) -> bool:
        """Run ``statement`` in a transaction holding the key's lock; whether it returned a row."""
        lock_id = self._lock_id(key)

        def run(conn: psycopg.Connection[Any]) -> bool:
            with conn.transaction():
                row = conn.execute(self._sql["lock_for_call"], {"id": lock_id}).fetchone()
                if row is None or not row[0]:
                    raise self._holder(conn, key, lock_id)[1]
                return conn.execute(self._sql[statement], params).fetchone() is not None

        return self._run(run)

    def create_schema(self) -> int:
        """Create the tables if they are not there; return the schema version in place."""
        with self._session(ensure=False) as conn:
            self._install(conn)
            self._schema_ok = True
        return SCHEMA_VERSION

    def schema_version(self) -> int | None:
        """The version of the tables in the database, or None if there are none."""
        with self._session(ensure=False) as conn:
            return self._version(conn)

    def close(self) -> None:
        """Release every lock, then close the connection; a later call connects again (a
        lock object from ``lock()`` stays its writer's)."""
        with _exit.busy(), self._mutex:
            self._release_all()
            self._drop()
            self._watchdog.close()

    def __del__(self) -> None:  # quietly: psycopg would warn
        with contextlib.suppress(Exception):
            if self._mutex.acquire(blocking=False):
                try:
                    self._drop()
                    self._watchdog.close(wait=0)
                finally:
                    self._mutex.release()

    def _split(self, key: str, chunks: Sequence[bytes]) -> tuple[bytes, bytes]:
        """The meta JSON and the state JSON of an envelope."""
        if len(chunks) >= 4 and (chunks[0], chunks[2], chunks[-1]) == (PREFIX, MIDDLE, SUFFIX):
            # The writer's envelope: the meta, then the state in pieces, joined
            # here in the worker thread (bytes.join releases the GIL).
            state = chunks[3] if len(chunks) == 5 else b"".join(chunks[3:-1])
            return bytes(chunks[1]), bytes(state)
        data = b"".join(chunks)
        try:
            checkpoint = decode_raw(data, self.location(key))
        except Exception as exc:
            raise ValueError(f"not a checkpoint envelope for {key!r}: {exc}") from None
        return msgspec.json.encode(checkpoint.meta), bytes(checkpoint.state)


def row_params(
    key: str, revision: str, expected: str | None, meta: str, state: bytes, *, journal: bool
) -> dict[str, Any]:
    """The parameters of a row's conditional write (an envelope of this library's format)."""
    return {
        "key": key,
        "revision": revision,
        "expected": expected,
        "format": FORMAT,
        "meta": meta,
        "state": state,
        "journal": journal,
    }
