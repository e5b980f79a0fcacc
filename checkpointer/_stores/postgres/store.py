"""The PostgreSQL store: checkpoints as rows, one writer per key across a fleet.

A write is one transaction whose first statement writes only over the
revision expected (an insert when none is; an update of that revision):
the revision makes it safe, the advisory lock (``locks.py``) only refuses a
second live writer early.  A forked child forgets its parent's connection.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from ... import _exit
from ..._format.envelope import FORMAT, MIDDLE, PREFIX, SUFFIX, decode_raw
from ..._format.journal import assemble_rows
from ..._text import one_line
from ..._values import Meta, NewerVersionError
from ..base import check_key
from .connection import SLOW_BYTES_PER_SECOND, Watchdog, describe_dsn, import_psycopg, seconds
from .errors import IdleLoss, KeyLockedError, PostgresStoreError, StaleWriteError
from .locks import LocksPart
from .schema import HEAD_FORMAT, QUERIES, SCHEMA_VERSION, quote_schema

if TYPE_CHECKING:
    import psycopg

__all__ = ["PostgresStore"]

_META_DECODER = msgspec.json.Decoder(Meta)


class _FormatOnly(msgspec.Struct):
    format: int


_FORMAT_DECODER = msgspec.json.Decoder(_FormatOnly)


class PostgresStore(LocksPart):
    """Checkpoints as rows in PostgreSQL, with one writer per key across a fleet.

    Key ``k`` is the row ``k`` of ``<schema>.checkpoints``.  Implements the
    ``Store`` protocol plus ``acquire``/``release``, the writer lock.  Use
    it like a ``FileStore``; close it (or use ``with``) to release its locks
    early, else they go when the process exits.

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

    Raises:
        ImportError: psycopg is not installed (the message names the extra).
        ValueError: the DSN cannot be parsed, or an argument is out of range.
    """

    def __init__(
        self,
        dsn: str = "",
        *,
        schema: str = "checkpointer",
        create_schema: bool = True,
        connect_timeout: float = 5.0,
        statement_timeout: float = 10.0,
        lock_timeout: float = 2.0,
        application_name: str = "checkpointer",
    ) -> None:
        self._pg = import_psycopg()
        if not isinstance(dsn, str):
            raise TypeError(f"dsn must be a str (a libpq connection string), got {dsn!r:.80}")
        try:
            params = self._pg.conninfo.conninfo_to_dict(dsn)
        except self._pg.Error as exc:
            raise ValueError(f"invalid PostgreSQL DSN: {one_line(str(exc))}") from None
        self._dsn = dsn
        self.schema = schema
        self._quoted = quote_schema(schema)
        self._create = bool(create_schema)
        self.connect_timeout = seconds("connect_timeout", connect_timeout)
        self.statement_timeout = seconds("statement_timeout", statement_timeout)
        self.lock_timeout = seconds("lock_timeout", lock_timeout)
        self._application_name = str(application_name)
        self._where = describe_dsn(params)
        self._sql = {name: q.format(s=self._quoted).encode() for name, q in QUERIES.items()}
        self._host = socket.gethostname()
        self._schema_ok = False
        # A call gets no answer a second after the server would have given up.
        self._deadline = self.statement_timeout + 1.0
        self._watching = self._deadline
        self._busy_wait = self.connect_timeout + self._deadline + 1.0
        self._start_fresh()
        _all_stores.add(self)

    def _start_fresh(self) -> None:
        """No connection, lock or watchdog yet: this process's own state (also after a fork)."""
        self._pid = os.getpid()
        self._mutex = threading.Lock()
        self._conn = None
        self._backend = None
        self._held = set()
        self._suspect = False
        self._lost = False
        self._orphans = []
        self._handles = {}
        self._handles_lock = threading.Lock()
        self._watchdog = Watchdog(f"checkpointer-pg-watchdog {self._where}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._where!r}, schema={self.schema!r})"

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def validate_key(self, key: str) -> None:
        check_key(key)

    def open(self) -> None:
        """Connect and make sure the schema is there (creating it if allowed); a
        ``PostgresStoreError`` says what is wrong (server, login, database, schema)."""
        self._run(lambda conn: None)

    def write(
        self, key: str, chunks: Sequence[bytes], *, revision: str, expected: str | None
    ) -> int:
        """``Store.write``: one transaction, under the key's lock (taken if not held).

        Raises ``StaleWriteError``, ``KeyLockedError``, ``PostgresStoreError``,
        or ``ValueError`` for ``chunks`` that are not a checkpoint envelope.
        """
        check_key(key)
        fmt, meta_json, state = self._split(key, chunks)
        params = {
            "key": key,
            "revision": revision,
            "expected": expected,
            "format": fmt,
            "meta": meta_json.decode(),
            "state": state,
            "journal": False,
        }
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
        """Write ``key``'s row over revision ``params["expected"]``, then ``then(conn)``.

        One transaction, under the key's lock; ``then`` runs only if the row
        was written.  ``statement`` defaults to ``insert`` (no revision
        expected) or ``update``; ``nbytes`` widens the time budget.  A write
        whose connection was lost once it reached the server is made again
        on a new one, for ``connect_timeout`` at most: if its COMMIT landed,
        it finds its own revision.  One that never reached the server, or
        was cut off as a hang, is not repeated.
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
        """The conditional write in the caller's transaction: True if it wrote, False if
        the row holds this write's revision already; ``StaleWriteError`` otherwise."""
        revision, expected = params["revision"], params["expected"]
        while conn.execute(self._sql[statement], params).fetchone() is None:
            row = conn.execute(self._sql["revision"], {"key": key}).fetchone()
            stored = None if row is None else str(row[0])
            if stored == revision:
                return False
            if stored != expected:
                raise StaleWriteError(key, expected=expected, stored=stored)
            # Changed back between the two statements (a row that stopped an
            # insert, deleted by hand since): the write may go ahead after all.
        return True

    def read(self, key: str) -> bytes | None:
        """The checkpoint of ``key`` as an envelope (a journal's rows assembled).

        Raises ``CheckpointError`` for a journal key's damaged or newer rows.
        """
        check_key(key)
        params = {"key": key}
        rows = self._run(lambda c: c.execute(self._sql["read"], params, binary=True).fetchall())
        if not rows:
            return None
        fmt, meta, state, journal, _ = rows[0]
        meta_json = meta.encode()
        if journal:
            if fmt > HEAD_FORMAT:  # kept, and the key left to the newer version
                written_by = None
                with contextlib.suppress(msgspec.DecodeError):
                    written_by = _META_DECODER.decode(meta_json).library_version
                by = "a newer version" if written_by is None else f"agent-checkpointer {written_by}"
                raise NewerVersionError(
                    self.location(key),
                    f"a journal head of format {fmt}, written by {by}; this agent-checkpointer "
                    f"reads journal format {HEAD_FORMAT}: upgrade it to load the key",
                    written_by,
                )
            state = assemble_rows(meta_json, [row[4] for row in rows], self.location(key))
            fmt = FORMAT  # the rows assembled are an envelope of this library's format
        return b"".join([b'{"format":%d,"meta":' % fmt, meta_json, MIDDLE, state, SUFFIX])

    def keys(self) -> list[str]:
        rows = self._run(lambda c: c.execute(self._sql["keys"]).fetchall())
        return sorted(row[0] for row in rows)

    def delete(self, key: str) -> bool:
        """``Store.delete``, under the key's lock, a journal's rows too.

        ``KeyLockedError`` while a live writer holds the key (another session,
        or a writer through this store).
        """
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
        """Run ``statement`` in a transaction holding the key's lock; whether it returned a row.

        (The transaction's own hold: this store's session hold counts as free.)
        """
        lock_id = self._lock_id(key)

        def run(conn: psycopg.Connection[Any]) -> bool:
            with conn.transaction():
                row = conn.execute(self._sql["lock_for_call"], {"id": lock_id}).fetchone()
                if row is None or not row[0]:
                    raise self._holder(conn, key, lock_id)[1]
                return conn.execute(self._sql[statement], params).fetchone() is not None

        return self._run(run)

    def create_schema(self) -> int:
        """Create the tables if they are not there; return the schema version in place.

        Raises:
            PostgresStoreError: the server cannot be reached, the user may not
                create the schema, or its tables are of another version.
        """
        with self._session(ensure=False) as conn:
            self._install(conn)
            self._schema_ok = True
        return SCHEMA_VERSION

    def schema_version(self) -> int | None:
        """The version of the tables in the database, or None if there are none."""
        with self._session(ensure=False) as conn:
            return self._version(conn)

    def close(self) -> None:
        """Close the connection, which releases every lock; a later call connects again.

        A lock object from ``lock()`` stays its writer's: another writer of
        the key through this store is still refused.
        """
        with _exit.busy(), self._mutex:
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

    def _after_fork(self) -> None:
        """In a forked child: a fresh store; the parent's session is left alone.

        Its connection is never closed here (``close()`` would end the
        parent's session and locks): only this process's descriptor.
        """
        if self._conn is not None:
            _inherited.append(self._conn)
            with contextlib.suppress(Exception):
                os.close(self._conn.pgconn.socket)
        if self._watchdog._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._watchdog._fd)
        self._start_fresh()

    def _split(self, key: str, chunks: Sequence[bytes]) -> tuple[int, bytes, bytes]:
        """The format, the meta JSON and the state JSON of an envelope."""
        if (
            len(chunks) >= 4
            and chunks[0] == PREFIX
            and chunks[2] == MIDDLE
            and chunks[-1] == SUFFIX
        ):
            # The writer's envelope: the meta, then the state in pieces, joined
            # here in the worker thread (bytes.join releases the GIL).
            state = chunks[3] if len(chunks) == 5 else b"".join(chunks[3:-1])
            return FORMAT, bytes(chunks[1]), bytes(state)
        data = b"".join(chunks)
        try:
            checkpoint = decode_raw(data, self.location(key))
        except Exception as exc:
            raise ValueError(f"not a checkpoint envelope for {key!r}: {exc}") from None
        meta = msgspec.json.encode(checkpoint.meta)
        return _FORMAT_DECODER.decode(data).format, meta, bytes(checkpoint.state)


_all_stores: weakref.WeakSet[PostgresStore] = weakref.WeakSet()
_inherited: list[object] = []  # a forked child's copies of its parent's connections


def _after_fork_in_child() -> None:
    for store in list(_all_stores):
        store._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
