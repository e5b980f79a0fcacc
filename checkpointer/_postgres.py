"""The PostgreSQL store: checkpoints as rows, one writer per key across a fleet.

``PostgresStore`` implements the same ``Store`` protocol as ``FileStore``, so
the writer, ``load()`` and the CLI work with it unchanged.  Every call is a
synchronous psycopg call: the async path runs it in the writer's one
worker-thread hop (psycopg's async connection is asyncio-only), and
``flush_sync`` runs it directly.

How it works
------------
* **One connection per store**, opened lazily (or by ``open()``), in
  autocommit mode.  It holds this store's locks and carries its writes.
* **Rows.**  ``<schema>.checkpoints`` holds per key: ``seq``, the envelope
  ``format``, ``meta`` (jsonb), the state's bytes (bytea), the id of the store
  instance that wrote it (``writer``) and the server's ``updated_at``.
  ``read()`` rebuilds the same envelope a ``FileStore`` file holds.
* **Journal keys** (``PostgresJournalStore``, ``_pgjournal.py``; schema
  versions 2 and 3): the key's ``checkpoints`` row is its head (``journal``
  true, format 2, no state) and ``<schema>.journal`` holds its rows.
  ``read()``, ``delete()`` and ``move_aside()`` handle both kinds, so any
  store (and the CLI) reads either.  Version 3 keeps workers of version 1
  off journal keys (see ``_MIGRATE_3_SQL``): they refuse them, rather than
  read them as empty and start over.
* **Versioned schema**, created on first use (or by ``create_schema()`` /
  ``checkpointer pg-schema``) under a transaction-level advisory lock, so
  concurrent first users do not race; ``<schema>.schema_version`` says which.
* **One writer per key** (``acquire``/``release``): a session-level advisory
  lock on a 64-bit hash of (schema, key), held by the store's connection.
  The server releases it when that connection ends, however the process
  died.  ``<schema>.holders`` records who holds it (host, pid, backend pid),
  so a refused writer is told whose lock it met.  ``write()`` takes the lock
  itself when it does not hold it: a write is never made without it.
* **Fencing.**  A write is one transaction: an upsert that applies only if
  the stored ``seq`` is lower and the row was last written by the writer
  this store found there when it took the key (or by itself since), or if
  it is this store's own ``seq`` again (a retry of a commit whose answer was
  lost).  So a worker that lost its session (its connection, and with it the
  lock), whose successor wrote since, is refused whatever seq it sends, even
  after re-reading the key (``StaleWriteError``).  It stays fenced for that
  key (refused without a round trip, its lock given back) until ``release``.
* **Bounded calls.**  ``connect_timeout`` bounds connecting; the session's
  ``statement_timeout`` and ``lock_timeout`` bound the server's work; a
  watchdog thread shuts the socket down when a call outlives
  ``statement_timeout`` by a second (a server that stopped answering, or a
  network that dropped without a reset), and TCP keepalives and
  ``tcp_user_timeout`` catch a vanished host.  So ``flush_sync`` in a signal
  handler never hangs on a dead server.  A write's deadline (and its
  ``statement_timeout``) grows with what it sends, so a large session is not
  taken for a hang.  A broken connection is dropped and the next call
  reconnects (and takes its locks again); one found broken when a call
  starts (lost while idle) is replaced and the call made again at once.  A
  backend of ours that a cut-off call left running, still holding a key, is
  ended when the key is taken again.
* **Writers sharing a store.**  ``lock()`` hands out one lock object per
  key: a second writer of the key through the same store is refused, as
  with ``FileStore``.  A signal landing in a store call on the main thread
  waits for its end (``_exit.busy``), since its flush needs the mutex.
* **After an outage**, ``probe()`` tells a writer in backoff that the server
  answers again (``ProbingStore``).
* **Forks.**  libpq connections must not be used or closed from a forked
  child: ``close()`` sends Terminate on the socket both share, which ends
  the parent's session and frees its locks.  Right after a fork the child's
  copy of every store forgets its connection without a word to the server
  (its descriptor closed, so a worker outliving its parent does not keep
  the session and its locks; the object kept alive, as dropping it would
  only warn: psycopg's finaliser checks the pid), its locks, fencing and
  watchdog, and takes a new writer id: in the child it is a fresh store
  that connects on first use.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import re
import socket
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar, final

import msgspec

from . import _exit
from ._format.envelope import FORMAT, MIDDLE, PREFIX, SUFFIX, decode_raw
from ._format.journal import assemble_rows
from ._stores.base import KeyLocked, LockHolder, StaleWrite, check_key
from ._stores.encoding import Transcript
from ._values import CheckpointError, Meta

if TYPE_CHECKING:
    import argparse

    import psycopg

__all__ = [
    "SCHEMA_VERSION",
    "KeyLockedError",
    "PostgresKeyLock",
    "PostgresStore",
    "PostgresStoreError",
    "StaleWriteError",
    "grants_sql",
    "schema_sql",
]

SCHEMA_VERSION = 3
"""The version of the tables this library creates and the newest it uses."""

_INSTALL_HINT = "PostgresStore needs psycopg 3: pip install 'agent-checkpointer[postgres]'"
_SCHEMA_RE = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_META_DECODER = msgspec.json.Decoder(Meta)


class _FormatOnly(msgspec.Struct):
    format: int


_FORMAT_DECODER = msgspec.json.Decoder(_FormatOnly)

_SCHEMA_SQL = """\
CREATE SCHEMA IF NOT EXISTS {s};
CREATE TABLE IF NOT EXISTS {s}.schema_version (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    version integer NOT NULL,
    installed_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS {s}.checkpoints (
    key text PRIMARY KEY,
    seq bigint NOT NULL,
    format integer NOT NULL,
    meta jsonb NOT NULL,
    state bytea NOT NULL,
    writer text NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS {s}.holders (
    key text PRIMARY KEY,
    host text NOT NULL,
    pid integer NOT NULL,
    backend_pid integer NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS {s}.aside (
    key text NOT NULL,
    suffix text NOT NULL,
    seq bigint NOT NULL,
    format integer NOT NULL,
    meta jsonb NOT NULL,
    state bytea NOT NULL,
    writer text NOT NULL,
    updated_at timestamptz NOT NULL,
    moved_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (key, suffix)
);
INSERT INTO {s}.schema_version (version) VALUES (1) ON CONFLICT (one) DO NOTHING;
"""

# Version 2: the journal (``PostgresJournalStore``).  A journal key's
# checkpoints row is its head (seq, meta, fencing; no state); its
# rows hold the journal's lines, in order of ``n``.
_MIGRATE_2_SQL = """\
ALTER TABLE {s}.checkpoints
    ADD COLUMN IF NOT EXISTS journal boolean NOT NULL DEFAULT false;
CREATE TABLE IF NOT EXISTS {s}.journal (
    key text NOT NULL,
    n bigserial,
    kind text NOT NULL,
    body bytea NOT NULL,
    PRIMARY KEY (key, n)
);
UPDATE {s}.schema_version SET version = 2, installed_at = now() WHERE version < 2;
"""

# Version 3: what keeps workers of version 1 (which do not know journal keys)
# off them during a rolling upgrade, and what lets plain table grants do.
# * A journal head says format 2, and null for its state: a version-1 reader
#   builds a whole envelope of format 2 from it and refuses it as "newer".
# * A head cannot be deleted while it has rows (the foreign key), nor
#   rewritten as a plain row while it is a head (the check): a version-1
#   writer, which moves a key it cannot read aside, fails instead.  Both
#   NOT VALID: enforced from now on, without scanning the tables.
# * Rows are numbered per key (the writer holds the key's lock), so the
#   journal needs no sequence, and no grant on one.
_MIGRATE_3_SQL = """\
UPDATE {s}.checkpoints SET format = 2, state = 'null' WHERE journal AND format < 2;
ALTER TABLE {s}.journal ALTER COLUMN n DROP DEFAULT;
DROP SEQUENCE IF EXISTS {s}.journal_n_seq;
ALTER TABLE {s}.journal ADD CONSTRAINT journal_key_needs_a_newer_checkpointer
    FOREIGN KEY (key) REFERENCES {s}.checkpoints (key) NOT VALID;
ALTER TABLE {s}.checkpoints ADD CONSTRAINT journal_head_needs_a_newer_checkpointer
    CHECK (NOT journal OR format >= 2) NOT VALID;
UPDATE {s}.schema_version SET version = 3, installed_at = now() WHERE version < 3;
"""

_JOURNAL_FORMAT = 2
"""The ``format`` of a journal key's head row (its rows hold the state)."""

_LZ4_SQL = (
    "ALTER TABLE {s}.checkpoints ALTER COLUMN state SET COMPRESSION lz4;"
    " ALTER TABLE {s}.journal ALTER COLUMN body SET COMPRESSION lz4;"
)

# Each statement is one round trip.  {s} is the quoted schema name.
_Q = {
    "version": "SELECT version FROM {s}.schema_version",
    "install_lock": "SELECT pg_advisory_xact_lock(%(id)s)",
    "acquire": """
        WITH got AS (SELECT pg_try_advisory_lock(%(id)s) AS ok),
        noted AS (
            INSERT INTO {s}.holders AS h (key, host, pid, backend_pid, acquired_at)
            SELECT %(key)s, %(host)s, %(pid)s, pg_backend_pid(), now() FROM got WHERE got.ok
            ON CONFLICT (key) DO UPDATE SET host = EXCLUDED.host, pid = EXCLUDED.pid,
                backend_pid = EXCLUDED.backend_pid, acquired_at = EXCLUDED.acquired_at
        )
        SELECT ok FROM got""",
    "holder": """
        SELECT l.pid, h.host, h.pid, h.acquired_at
        FROM pg_locks l
        LEFT JOIN {s}.holders h ON h.key = %(key)s AND h.backend_pid = l.pid
        WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND l.classid::bigint = %(hi)s AND l.objid::bigint = %(lo)s""",
    "release": """
        WITH gone AS (
            DELETE FROM {s}.holders WHERE key = %(key)s AND backend_pid = pg_backend_pid()
        )
        SELECT pg_advisory_unlock(%(id)s)""",
    "upsert": """
        INSERT INTO {s}.checkpoints AS c
            (key, seq, format, meta, state, writer, updated_at, journal)
        VALUES (%(key)s, %(seq)s, %(format)s, %(meta)s::jsonb, %(state)b, %(writer)s, now(),
            %(journal)s)
        ON CONFLICT (key) DO UPDATE SET seq = EXCLUDED.seq, format = EXCLUDED.format,
            meta = EXCLUDED.meta, state = EXCLUDED.state, writer = EXCLUDED.writer,
            updated_at = EXCLUDED.updated_at, journal = EXCLUDED.journal
        WHERE (c.seq < EXCLUDED.seq AND c.writer IS NOT DISTINCT FROM %(base)s::text)
           OR (c.seq = EXCLUDED.seq AND c.writer = EXCLUDED.writer)
        RETURNING c.seq""",
    "last_writer": "SELECT writer FROM {s}.checkpoints WHERE key = %(key)s",
    "stored": "SELECT seq, writer FROM {s}.checkpoints WHERE key = %(key)s",
    # One statement, so the head and the rows come from one snapshot.
    "read": """
        SELECT c.format, c.meta::text, c.state, c.journal, j.body
        FROM {s}.checkpoints c
        LEFT JOIN {s}.journal j ON c.journal AND j.key = c.key AND j.n >= (
            SELECT max(n) FROM {s}.journal WHERE key = c.key AND kind = 'compaction')
        WHERE c.key = %(key)s
        ORDER BY j.n""",
    "head": "SELECT meta::text, journal FROM {s}.checkpoints WHERE key = %(key)s",
    "keys": "SELECT key FROM {s}.checkpoints",
    "delete": """
        WITH rows AS (DELETE FROM {s}.journal WHERE key = %(key)s)
        DELETE FROM {s}.checkpoints WHERE key = %(key)s RETURNING 1""",
    "journal_clear": "DELETE FROM {s}.journal WHERE key = %(key)s",
    # Bodies as binary parameters: text would double them and make the
    # server parse the hex.  Rows are numbered per key, under its lock.
    "journal_append": """
        INSERT INTO {s}.journal (key, n, kind, body)
        SELECT %(key)s, coalesce((SELECT max(n) FROM {s}.journal WHERE key = %(key)s), 0) + u.i,
            u.kind, u.body
        FROM unnest(%(kinds)s::text[], %(bodies)b::bytea[]) WITH ORDINALITY AS u(kind, body, i)""",
    "journal_compaction": """
        INSERT INTO {s}.journal (key, n, kind, body)
        VALUES (%(key)s, 1, 'compaction', %(body)b)""",
    "move_aside": """
        WITH moved AS (DELETE FROM {s}.checkpoints WHERE key = %(key)s RETURNING *),
        rows AS (DELETE FROM {s}.journal WHERE key = %(key)s RETURNING n, body)
        INSERT INTO {s}.aside AS a (key, suffix, seq, format, meta, state, writer, updated_at)
        SELECT key, %(suffix)s, seq, format, meta,
            -- a journal key's rows go aside too: its lines, as they were, one per line
            CASE WHEN journal THEN coalesce(
                (SELECT string_agg(body, '\\x0a'::bytea ORDER BY n) FROM rows), ''::bytea)
            ELSE state END,
            writer, updated_at
        FROM moved
        ON CONFLICT (key, suffix) DO UPDATE SET seq = EXCLUDED.seq, format = EXCLUDED.format,
            meta = EXCLUDED.meta, state = EXCLUDED.state, writer = EXCLUDED.writer,
            updated_at = EXCLUDED.updated_at, moved_at = now()
        RETURNING 1""",
}


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


class _IdleLoss(PostgresStoreError):
    """The connection kept from an earlier call was found lost: worth one retry."""


_T = TypeVar("_T")

_SLOW_BYTES_PER_SECOND = 8 << 20
"""What a write may take longer than a small one: a second per 8 MiB it sends.

Measured: 200 MB sent and stored in 1.8 s (binary, lz4) to 12.7 s (text,
pglz) on one machine; so a large session that is merely large is not cut
off as a hang, while a server that stopped answering still is.
"""


def _import_psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:
        raise ImportError(f"{_INSTALL_HINT} ({exc})") from exc
    return psycopg


def schema_sql(schema: str = "checkpointer") -> str:
    """The SQL that creates the tables (version ``SCHEMA_VERSION``).

    For a database administrator who prefers to run it; the store creates
    the same on first use unless ``create_schema=False``.
    """
    quoted = _quote_schema(schema)
    lz4 = _LZ4_SQL.format(s=quoted)
    return (
        _SCHEMA_SQL.format(s=quoted)
        + _MIGRATE_2_SQL.format(s=quoted)
        + _MIGRATE_3_SQL.format(s=quoted)
        + "-- Optional, on PostgreSQL 14+ built with lz4 (what the store does when it can):\n"
        + "".join(f"-- {line};\n" for line in lz4.rstrip(";").split("; "))
    )


def grants_sql(schema: str = "checkpointer", role: str = "app") -> str:
    """What a role needs to use tables ``pg-schema`` made (as another user).

    Every store works through these: reading and writing rows, and the
    advisory locks, which need no grant.
    """
    quoted = _quote_schema(schema)
    who = role
    if re.fullmatch(r"[a-z_][a-z0-9_]*", role) is None:
        who = '"' + role.replace('"', '""') + '"'
    return (
        f"GRANT USAGE ON SCHEMA {quoted} TO {who}; "
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {quoted} TO {who};"
    )


def _quote_schema(schema: str) -> str:
    if not isinstance(schema, str) or _SCHEMA_RE.fullmatch(schema) is None:
        raise ValueError(
            f"invalid schema name {schema!r}: use 1-63 lowercase letters, digits "
            "and '_', not starting with a digit"
        )
    return f'"{schema}"'


def _int64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big", signed=True)


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text[:297] + "..." if len(text) > 300 else text


def _seconds(name: str, value: float) -> float:
    if not (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and value > 0
        and math.isfinite(value)
    ):
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


@final
class _Watchdog:
    """Shuts a connection's socket down when a call on it outlives its deadline.

    A psycopg call blocked on a server that stopped answering then fails at
    once ("server closed the connection"), whichever thread waits.  One
    daemon thread per store, started on first use.  It works on a duplicate
    of the socket's descriptor, taken when the watch starts, so it can never
    hit a descriptor number the process reused meanwhile.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._cond = threading.Condition(threading.Lock())
        self._deadline: float | None = None
        self._fd = -1
        self._stop: threading.Event | None = None  # set: that thread exits
        self.fired = False

    @contextlib.contextmanager
    def watch(self, fd: int, seconds: float) -> Iterator[None]:
        dup = os.dup(fd)
        with self._cond:
            self.fired = False
            self._deadline = time.monotonic() + seconds
            self._fd = dup
            if self._stop is None:
                self._stop = threading.Event()
                threading.Thread(
                    target=self._run, args=(self._stop,), name=self._name, daemon=True
                ).start()
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._deadline = None
                self._fd = -1
            os.close(dup)

    def close(self, *, wait: float = 1.0) -> None:
        """Let the thread exit (a later ``watch`` starts another); never blocks long.

        Called under the store's mutex, as ``watch`` is.  The condition's
        lock is only tried, for at most ``wait`` seconds: at interpreter
        exit the daemon thread is frozen wherever it was, possibly holding
        it, and a blocking wait there hung the process forever.  If it
        cannot be taken, the thread holds it and sees ``stop`` before it
        waits again.
        """
        stop, self._stop = self._stop, None
        if stop is None:
            return
        stop.set()
        if self._cond.acquire(timeout=wait):
            try:
                self._cond.notify_all()
            finally:
                self._cond.release()

    def _run(self, stop: threading.Event) -> None:
        with self._cond:
            while not stop.is_set():
                if self._deadline is None:
                    self._cond.wait()
                    continue
                remaining = self._deadline - time.monotonic()
                if remaining > 0:
                    self._cond.wait(remaining)
                    continue
                self._deadline = None
                self.fired = True
                with contextlib.suppress(OSError):
                    sock = socket.socket(fileno=os.dup(self._fd))
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    finally:
                        sock.close()


@final
class PostgresKeyLock:
    """A held writer lock of one key of a ``PostgresStore`` (from ``lock``)."""

    def __init__(self, store: PostgresStore, key: str) -> None:
        self.store = store
        self.key = key
        self.holder = LockHolder(
            pid=os.getpid(), host=socket.gethostname(), started_at=datetime.now(UTC)
        )

    def __repr__(self) -> str:
        return f"<PostgresKeyLock {self.store.location(self.key)!r}>"

    @property
    def held(self) -> bool:
        return self.store._handles.get(self.key) is self and self.key in self.store.held()

    def release(self) -> None:
        """Give the lock up; idempotent, never raises for I/O.

        Only while it is this object that holds the key: a lock object
        released already never frees the lock a later holder took.
        """
        self.store._release_handle(self)


class PostgresStore:
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
        create_schema: create (or upgrade) the tables on first use; with
            False a missing schema is an error that says how to create it.
        connect_timeout: seconds to connect (libpq waits at least 2).
        statement_timeout: seconds the server may spend on one statement; a
            call that gets no answer a second after that is cut off.
        lock_timeout: seconds a statement may wait for a table or row lock.
        application_name: shown in ``pg_stat_activity``.
        transcript: where states keep their messages; given, each settled
            message is encoded once and its bytes cached, and the state is
            joined in the worker thread (no loop stall for large sessions),
            as with ``FileStore``.

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
        transcript: Transcript | None = None,
    ) -> None:
        self._pg = _import_psycopg()
        if transcript is not None and not isinstance(transcript, Transcript):
            raise TypeError(f"transcript must be a Transcript or None, got {transcript!r}")
        self.transcript = transcript
        if not isinstance(dsn, str):
            raise TypeError(f"dsn must be a str (a libpq connection string), got {dsn!r:.80}")
        try:
            params = self._pg.conninfo.conninfo_to_dict(dsn)
        except self._pg.Error as exc:
            raise ValueError(f"invalid PostgreSQL DSN: {_one_line(str(exc))}") from None
        self._dsn = dsn
        self.schema = schema
        self._quoted = _quote_schema(schema)
        self._create = bool(create_schema)
        self.connect_timeout = _seconds("connect_timeout", connect_timeout)
        self.statement_timeout = _seconds("statement_timeout", statement_timeout)
        self.lock_timeout = _seconds("lock_timeout", lock_timeout)
        self._application_name = str(application_name)
        self._where = _describe(params)
        self._sql = {name: q.format(s=self._quoted).encode() for name, q in _Q.items()}
        self._writer_id = uuid.uuid4().hex
        self._host = socket.gethostname()
        self._mutex = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._schema_ok = False
        self._held: set[str] = set()
        # Fencing, per key: the writer id of the row when this store took the
        # key (then its own, once it wrote); a write applies only over that.
        self._base: dict[str, str | None] = {}
        self._fenced: dict[str, str] = {}  # key -> why its writes are refused
        self._suspect = False  # the connection may hold a lock we do not know of
        self._handles: dict[str, PostgresKeyLock] = {}  # key -> its holder (lock())
        self._handles_lock = threading.Lock()
        self._lost = False  # the last call lost the server (for probe())
        self._backend: int | None = None  # the backend pid of self._conn
        # Backends of connections dropped mid-call: one may still run our
        # statement and hold our key's lock (see _acquire).
        self._orphans: list[int] = []
        self._watchdog = _Watchdog(f"checkpointer-pg-watchdog {self._where}")
        # A call gets no answer a second after the server would have given up.
        self._deadline = self.statement_timeout + 1.0
        self._watching = self._deadline  # the deadline of the call in progress
        self._busy_wait = self.connect_timeout + self._deadline + 1.0
        self._pid = os.getpid()  # the process whose connection self._conn is
        _stores.add(self)

    def __repr__(self) -> str:
        return f"PostgresStore({self._where!r}, schema={self.schema!r})"

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the Store protocol -------------------------------------------------

    def validate_key(self, key: str) -> None:
        check_key(key)

    def location(self, key: str) -> str:
        return f"{self._where}/{self.schema}/{key}"

    def open(self) -> None:
        """Connect and make sure the schema is there (creating it if allowed).

        Raises:
            PostgresStoreError: the server cannot be reached, refuses the
                login, has no such database, or the schema is missing or
                newer than this library; the message says which.
        """
        self._run(lambda conn: None)

    def write(self, key: str, chunks: Sequence[bytes]) -> int:
        """Store the checkpoint in ``chunks`` (an envelope) in one transaction.

        Takes the key's writer lock first if this store does not hold it.

        Returns:
            The envelope's size in bytes.

        Raises:
            KeyLockedError: another writer holds the key.
            StaleWriteError: another writer wrote the key since this store took it
                (or the store holds a newer seq); the store is fenced for the key.
            PostgresStoreError: the server failed or cannot be reached.
            ValueError: ``chunks`` is not a checkpoint envelope.
        """
        check_key(key)
        fmt, meta_json, state = self._split(key, chunks)
        seq = _META_DECODER.decode(meta_json).seq
        params = {
            "key": key,
            "seq": seq,
            "format": fmt,
            "meta": meta_json.decode(),
            "state": state,
            "writer": self._writer_id,
            "journal": False,
        }
        nbytes = sum(len(chunk) for chunk in chunks)
        self._fenced_write(key, params, nbytes=nbytes)
        return nbytes

    def _fenced_write(
        self,
        key: str,
        params: dict[str, Any],
        then: Callable[[psycopg.Connection[Any]], None] | None = None,
        *,
        nbytes: int = 0,
    ) -> None:
        """The fenced upsert of ``key``'s row, and ``then(conn)``, in one transaction.

        Takes the key's lock first if not held; ``then`` runs only if the
        upsert applied (the journal's rows go with their head, or not at all).
        ``nbytes`` (what the write sends) widens the call's time budget, so a
        large session is not cut off as a hang.  A connection found lost
        after it sat idle is replaced and the write made once more: fencing
        makes a repeated upsert safe, and ``then`` is repeated only if its
        first commit was never sent.
        """
        budget = nbytes / _SLOW_BYTES_PER_SECOND
        for attempt in (1, 2):
            if key in self._fenced:
                raise StaleWriteError(self._fenced[key])
            committing = False
            try:
                with self._session(budget=budget) as conn:
                    refused = self._acquire(conn, key, fresh=False)
                    if refused is not None:
                        raise refused
                    params["base"] = self._base.get(key)
                    with conn.transaction():
                        if budget >= 1:
                            conn.execute(
                                b"SET LOCAL statement_timeout = %d"
                                % round((self.statement_timeout + budget) * 1000)
                            )
                        applied = self._upsert(conn, params)
                        if applied and then is not None:
                            then(conn)
                        committing = True
                    if not applied:
                        why = self._fenced[key] = self._stale(conn, key, params["seq"])
                        self._unlock(conn, key)  # a fenced store lets go of the key
                        raise StaleWriteError(why)
                    self._base[key] = self._writer_id
                return
            except _IdleLoss:
                if attempt == 2 or (committing and then is not None):
                    raise

    def read(self, key: str) -> bytes | None:
        """The checkpoint of ``key`` as an envelope (a journal's rows assembled).

        Raises:
            CheckpointError: a journal key's rows are damaged, or of a newer format.
            PostgresStoreError: the server failed or cannot be reached.
        """
        check_key(key)
        params = {"key": key}
        rows = self._run(lambda c: c.execute(self._sql["read"], params, binary=True).fetchall())
        if not rows:
            return None
        fmt, meta, state, journal, _ = rows[0]
        meta_json = meta.encode()
        if journal:
            if fmt > _JOURNAL_FORMAT:
                raise CheckpointError(
                    self.location(key),
                    f"a journal head of format {fmt}, newer than this library reads "
                    f"({_JOURNAL_FORMAT}); upgrade agent-checkpointer to load it",
                )
            state = assemble_rows(meta_json, [row[4] for row in rows], self.location(key))
            fmt = FORMAT  # the rows assembled are an envelope of this library's format
        return b"".join([b'{"format":%d,"meta":' % fmt, meta_json, MIDDLE, state, SUFFIX])

    def keys(self) -> list[str]:
        rows = self._run(lambda c: c.execute(self._sql["keys"]).fetchall())
        return sorted(row[0] for row in rows)

    def delete(self, key: str) -> bool:
        check_key(key)
        row = self._run(lambda c: c.execute(self._sql["delete"], {"key": key}).fetchone())
        return row is not None

    def move_aside(self, key: str, suffix: str) -> str | None:
        check_key(key)
        params = {"key": key, "suffix": suffix}
        if self._run(lambda c: c.execute(self._sql["move_aside"], params).fetchone()) is None:
            return None
        return f"{self._where}/{self.schema}.aside/{key}.{suffix}"

    # -- the writer lock ----------------------------------------------------

    def acquire(self, key: str) -> str | None:
        """Take the writer lock of ``key`` for this store's connection.

        Idempotent (a lock this store holds costs no round trip).  The lock
        lasts until ``release``, ``close``, or the end of the connection,
        whichever comes first; the server drops it when the process dies.

        Returns:
            None when this store holds the lock; otherwise one line naming
            the holder (pid, host, since when).

        Raises:
            PostgresStoreError: the server cannot be reached.
        """
        refused = self._try_lock(key)
        return None if refused is None else str(refused)

    def _try_lock(self, key: str) -> KeyLockedError | None:
        check_key(key)
        if key in self._held:  # held on the live connection: no round trip
            return None
        return self._run(lambda conn: self._acquire(conn, key, fresh=True))

    def lock(self, key: str, *, timeout: float = 0.0) -> PostgresKeyLock:
        """Take the writer lock of ``key``, waiting at most ``timeout`` seconds.

        The same lock as ``acquire``, in the shape of a held lock object whose
        ``release()`` gives it back (the ``LockingStore`` capability).  One
        holder at a time, as with ``FileStore``: while a lock object of this
        store holds the key, another ``lock`` of it (a second writer sharing
        the store) is refused, although the connection's lock is the same.

        Raises:
            KeyLockedError: another writer still holds it after ``timeout``.
            PostgresStoreError: the server cannot be reached.
        """
        if not (isinstance(timeout, (int, float)) and 0 <= timeout < math.inf):
            raise ValueError(
                f"lock timeout must be a finite number of seconds >= 0, got {timeout!r}"
            )
        deadline = time.monotonic() + timeout
        while isinstance(taken := self._take_handle(key), KeyLockedError):
            if time.monotonic() >= deadline:
                raise taken
            time.sleep(0.05)
        return taken

    def _take_handle(self, key: str) -> PostgresKeyLock | KeyLockedError:
        other = self._handles.get(key)
        if other is None:
            refused = self._try_lock(key)
            if refused is not None:
                return refused
            with self._handles_lock:
                other = self._handles.get(key)
                if other is None:
                    handle = self._handles[key] = PostgresKeyLock(self, key)
                    return handle
        return KeyLockedError(
            key,
            f"{self.location(key)}, held by another writer through this same PostgresStore",
            other.holder,
        )

    def _release_handle(self, handle: PostgresKeyLock) -> None:
        with self._handles_lock:
            if self._handles.get(handle.key) is not handle:
                return  # released already, or the key went with a release() or close()
        self.release(handle.key)

    def release(self, key: str) -> None:
        """Give the writer lock of ``key`` back; a no-op if not held.

        Never raises for I/O: if the server cannot be told, the connection
        is dropped, which releases the lock as surely.
        """
        check_key(key)
        with self._handles_lock:
            self._handles.pop(key, None)
        with _exit.busy():  # a signal landing meanwhile waits (see _session)
            if not self._mutex.acquire(timeout=self._busy_wait):
                return
            try:
                self._base.pop(key, None)
                self._fenced.pop(key, None)
                if key not in self._held:
                    return
                conn = self._conn
                if conn is None or conn.closed:
                    self._held.discard(key)
                    return
                try:
                    with self._watchdog.watch(conn.fileno(), self._deadline):
                        self._unlock(conn, key)
                except self._pg.Error:
                    self._drop()
            finally:
                self._mutex.release()

    def locked_by(self, key: str) -> str | None:
        """Who holds the writer lock of ``key`` (one line), or None if it is free.

        Only looks: never takes the lock.  This store's own lock counts.
        """
        check_key(key)
        lock_id = self._lock_id(key)
        hi, lo = (lock_id >> 32) & 0xFFFFFFFF, lock_id & 0xFFFFFFFF
        params = {"key": key, "hi": hi, "lo": lo}
        row = self._run(lambda c: c.execute(self._sql["holder"], params).fetchone())
        if row is None:
            return None
        if row[1] is None:
            return f"PostgreSQL backend {row[0]}"
        return (
            f"{LockHolder(pid=row[2], host=row[1], started_at=row[3]).describe()}, backend {row[0]}"
        )

    def held(self) -> frozenset[str]:
        """The keys whose writer lock this store holds (as far as it knows)."""
        return frozenset(self._held.copy())

    def probe(self) -> bool:
        """Whether the server answers again after this store lost it (``ProbingStore``).

        For a writer waiting out a retry backoff: True means retry now.
        False, without a round trip, when the store did not lose the server
        (its last failure was of another kind: the backoff stands) or a call
        is in progress; otherwise it connects (bounded by
        ``connect_timeout``) and keeps the connection for the retry.  Never
        raises.
        """
        if not self._lost:
            return False
        with _exit.busy():
            if not self._mutex.acquire(blocking=False):
                return False
            try:
                self._connection()
            except Exception:
                return False
            finally:
                self._mutex.release()
        self._lost = False
        return True

    # -- schema -------------------------------------------------------------

    def create_schema(self) -> int:
        """Create or upgrade the tables; return the schema version now in place.

        Raises:
            PostgresStoreError: the server cannot be reached, the user may not
                create the schema, or the schema is newer than this library.
        """
        with self._session(ensure=False) as conn:
            self._install(conn)
            self._schema_ok = True
        return SCHEMA_VERSION

    def schema_version(self) -> int | None:
        """The version of the tables in the database, or None if there are none."""
        with self._session(ensure=False) as conn:
            return self._version(conn)

    # -- lifecycle ----------------------------------------------------------

    def close(self) -> None:
        """Close the connection, which releases every lock this store holds.

        The store stays usable: a later call connects again.
        """
        with self._handles_lock:
            self._handles.clear()
        with _exit.busy(), self._mutex:
            self._drop()
            self._base.clear()
            self._fenced.clear()
            self._watchdog.close()

    def __del__(self) -> None:
        # A store dropped without close(): close its connection quietly
        # (psycopg would warn) and let the watchdog thread go.
        with contextlib.suppress(Exception):
            if self._mutex.acquire(blocking=False):
                try:
                    self._drop()
                    self._watchdog.close(wait=0)
                finally:
                    self._mutex.release()

    # -- internals ----------------------------------------------------------

    def _run(self, call: Callable[[psycopg.Connection[Any]], _T], *, ensure: bool = True) -> _T:
        """``call(conn)`` in a session; once more on a new connection after an idle loss.

        For calls that are safe to repeat (reads, idempotent statements).
        """
        try:
            with self._session(ensure=ensure) as conn:
                return call(conn)
        except _IdleLoss:
            with self._session(ensure=ensure) as conn:
                return call(conn)

    @contextlib.contextmanager
    def _session(
        self, *, ensure: bool = True, budget: float = 0.0
    ) -> Iterator[psycopg.Connection[Any]]:
        """The live connection, under the store's mutex and the watchdog.

        ``budget``: seconds the call may take on top of the usual deadline
        (a large write).  psycopg errors become ``PostgresStoreError``; a
        broken connection is dropped (with it every lock) and the next call
        reconnects.  A connection kept from an earlier call and found broken
        (lost while idle: a server restart, a failover, a pooler's idle
        timeout) fails as ``_IdleLoss``, which callers may retry at once.
        A signal that lands on this thread meanwhile is handled once the
        mutex is free again (``_exit.busy``): its flush needs the mutex.
        """
        with _exit.busy():
            if not self._mutex.acquire(timeout=self._busy_wait):
                raise PostgresStoreError(
                    f"{self._where}: the store's connection stayed busy for "
                    f"{self._busy_wait:g}s (a call in another thread is stuck); try again later"
                )
            try:
                reused = self._conn is not None and not self._conn.closed
                conn = self._connection()
                failure: PostgresStoreError | None = None
                try:
                    self._watching = self._deadline + budget
                    with self._watchdog.watch(conn.fileno(), self._watching):
                        if ensure and not self._schema_ok:
                            self._ensure_schema(conn)
                        yield conn
                except self._pg.Error as exc:
                    failure = self._failure(conn, exc, reused=reused)
                if failure is not None:
                    self._lost = conn.closed or conn.broken or self._watchdog.fired
                    if self._lost or self._suspect:
                        self._drop(orphan=True)
                    raise failure
                self._lost = False
            finally:
                self._mutex.release()

    def _connection(self) -> psycopg.Connection[Any]:
        current = self._conn
        if current is not None and not current.closed:
            return current
        self._drop()
        pg = self._pg
        try:
            conn: psycopg.Connection[Any] = pg.connect(
                self._dsn,
                autocommit=True,
                connect_timeout=max(2, math.ceil(self.connect_timeout)),
                application_name=self._application_name,
                keepalives=1,
                keepalives_idle=max(1, round(self.statement_timeout)),
                keepalives_interval=1,
                keepalives_count=3,
                tcp_user_timeout=round(self._deadline * 1000),
            )
        except pg.Error as exc:
            why = self._connect_failure(exc)
            # Not reached (down, restarting, unreachable), not refused (a login
            # or database that is wrong stays wrong): a probe may try again.
            self._lost = not any(w in why for w in ("password", "does not exist"))
            raise PostgresStoreError(why) from None
        try:
            with self._watchdog.watch(conn.fileno(), self._deadline):
                conn.execute(
                    b"SET statement_timeout = %d; SET lock_timeout = %d; "
                    b"SET idle_in_transaction_session_timeout = %d; "
                    # The server ends the session of a vanished host (and frees
                    # its locks) about statement_timeout + 6 s after it went.
                    b"SET tcp_keepalives_idle = %d; SET tcp_keepalives_interval = 2; "
                    b"SET tcp_keepalives_count = 3"
                    % (
                        round(self.statement_timeout * 1000),
                        round(self.lock_timeout * 1000),
                        round(self._deadline * 1000),
                        max(1, round(self.statement_timeout)),
                    )
                )
        except pg.Error as exc:
            conn.close()
            raise PostgresStoreError(
                f"{self._where}: connected, but setting the session up failed: "
                f"{_one_line(str(exc))}"
            ) from None
        info = conn.info
        self._where = _describe(
            {"host": info.host, "port": info.port, "dbname": info.dbname, "user": info.user}
        )
        self._conn = conn
        self._backend = info.backend_pid
        return conn

    def _drop(self, *, orphan: bool = False) -> None:
        """Forget the connection (closing it) and the locks it held.

        ``orphan``: dropped mid-call; its backend may still be running our
        statement (the server notices the closed socket only when it next
        reads or writes it), holding the key's lock a moment longer.
        """
        conn, self._conn = self._conn, None
        if orphan and conn is not None and self._backend is not None:
            self._orphans = [*self._orphans[-7:], self._backend]
        self._held.clear()
        self._suspect = False
        if conn is not None and self._pid == os.getpid():
            with contextlib.suppress(Exception):
                conn.close()

    def _after_fork(self) -> None:
        """In a forked child: become a fresh store, leaving the parent's session alone."""
        conn, self._conn = self._conn, None
        if conn is not None:
            _inherited.append(conn)  # never closed here: close() would send Terminate
            with contextlib.suppress(Exception):
                os.close(conn.pgconn.socket)
        watching = self._watchdog._fd
        if watching >= 0:
            with contextlib.suppress(OSError):
                os.close(watching)
        self._pid = os.getpid()
        self._mutex = threading.Lock()  # another thread of the parent may have held it
        self._watchdog = _Watchdog(f"checkpointer-pg-watchdog {self._where}")
        self._writer_id = uuid.uuid4().hex
        self._held.clear()
        self._base.clear()
        self._fenced.clear()
        self._suspect = False
        self._handles_lock = threading.Lock()
        self._handles.clear()  # the parent's lock objects: none of them is held here
        self._lost = False
        self._backend = None
        self._orphans = []  # the parent's backends: never ours to terminate

    def _failure(
        self, conn: psycopg.Connection[Any], exc: Exception, *, reused: bool = False
    ) -> PostgresStoreError:
        pg = self._pg
        text = _one_line(str(exc)) or type(exc).__name__
        if self._watchdog.fired:
            return PostgresStoreError(
                f"{self._where}: no answer within {self._watching:.3g}s "
                f"(statement_timeout={self.statement_timeout:g}s); dropped the connection, "
                "the next call reconnects"
            )
        if conn.closed or conn.broken:
            lost = _IdleLoss if reused else PostgresStoreError
            return lost(f"{self._where}: lost the connection ({text}); the next call reconnects")
        if isinstance(exc, pg.errors.QueryCanceled):
            return PostgresStoreError(
                f"{self._where}: a statement ran longer than statement_timeout="
                f"{self.statement_timeout:g}s ({text})"
            )
        if isinstance(exc, pg.errors.LockNotAvailable):
            return PostgresStoreError(
                f"{self._where}: waited longer than lock_timeout={self.lock_timeout:g}s ({text})"
            )
        if isinstance(exc, pg.errors.InsufficientPrivilege):
            return PostgresStoreError(
                f"{self._where}: permission denied ({text}); the tables need "
                f"`checkpointer pg-schema` once (an administrator), then for this user: "
                f"{grants_sql(self.schema, conn.info.user or 'this_user')}"
            )
        return PostgresStoreError(f"{self._where}: {text}")

    def _connect_failure(self, exc: Exception) -> str:
        text = _one_line(str(exc))
        low = text.lower()
        if "password authentication failed" in low or "no password supplied" in low:
            hint = "check the user and password (in the DSN, PGPASSWORD or ~/.pgpass)"
        elif "does not exist" in low and "database" in low:
            hint = "create the database (createdb) or fix dbname in the DSN"
        elif "does not exist" in low and "role" in low:
            hint = "create the role or fix user in the DSN"
        elif "refused" in low:
            hint = "is the server running and listening on that host and port?"
        elif "timeout" in low or "timed out" in low:
            hint = f"no answer within connect_timeout={self.connect_timeout:g}s"
        elif "resolve" in low or "name or service not known" in low:
            hint = "check host in the DSN"
        else:
            hint = "check the DSN"
        return f"cannot connect to PostgreSQL at {self._where}: {text}; {hint}"

    def _version(self, conn: psycopg.Connection[Any]) -> int | None:
        try:
            row = conn.execute(self._sql["version"]).fetchone()
        except (self._pg.errors.UndefinedTable, self._pg.errors.InvalidSchemaName):
            return None
        return None if row is None else int(row[0])

    def _ensure_schema(self, conn: psycopg.Connection[Any]) -> None:
        version = self._version(conn)
        if version == SCHEMA_VERSION:
            self._schema_ok = True
            return
        self._check_newer(version)
        if not self._create and version is not None:
            raise PostgresStoreError(
                f"{self._where}: schema {self.schema!r} has version {version}, older than "
                f"this library uses ({SCHEMA_VERSION}); upgrade it in place with "
                "`checkpointer pg-schema` or PostgresStore(...).create_schema()"
            )
        if not self._create:
            raise PostgresStoreError(
                f"{self._where}: no checkpointer tables in schema {self.schema!r}; create "
                f"them with `checkpointer pg-schema` or PostgresStore(...).create_schema()"
            )
        self._install(conn)
        self._schema_ok = True

    def _check_newer(self, version: int | None) -> None:
        if version is not None and version > SCHEMA_VERSION:
            raise PostgresStoreError(
                f"{self._where}: schema {self.schema!r} has version {version}, newer than "
                f"this library uses ({SCHEMA_VERSION}); upgrade agent-checkpointer"
            )

    def _install(self, conn: psycopg.Connection[Any]) -> None:
        with conn.transaction():
            # Concurrent first users wait here instead of racing on CREATE.
            conn.execute(
                self._sql["install_lock"], {"id": _int64(b"schema\0" + self._quoted.encode())}
            )
            version = self._version_in(conn)
            self._check_newer(version)
            if version is None:
                conn.execute(_SCHEMA_SQL.format(s=self._quoted).encode())
            if version is None or version < 2:
                conn.execute(_MIGRATE_2_SQL.format(s=self._quoted).encode())
            if version is None or version < 3:
                conn.execute(_MIGRATE_3_SQL.format(s=self._quoted).encode())
                # lz4 where the server has it (14+, built with lz4): for a
                # transcript of several MB, 3-4x quicker than the default pglz.
                with contextlib.suppress(self._pg.Error), conn.transaction():
                    conn.execute(_LZ4_SQL.format(s=self._quoted).encode())

    def _version_in(self, conn: psycopg.Connection[Any]) -> int | None:
        # Inside a transaction a failed statement would abort it: look first.
        row = conn.execute(b"SELECT to_regclass(%s)", [f"{self._quoted}.schema_version"]).fetchone()
        if row is None or row[0] is None:
            return None
        found = conn.execute(self._sql["version"]).fetchone()
        return None if found is None else int(found[0])

    def _lock_id(self, key: str) -> int:
        return _int64(self._quoted.encode() + b"\0" + key.encode())

    def _acquire(
        self, conn: psycopg.Connection[Any], key: str, *, fresh: bool
    ) -> KeyLockedError | None:
        """Take the key's lock on ``conn`` unless held; a refusal is returned.

        ``fresh``: a writer starts on the key now (``acquire``/``lock``) and
        will read it first, so whatever is stored becomes the base it may
        write over.  Otherwise (``write`` taking the lock again after a lost
        connection) the base stays what it was: a store that lost the key
        to a writer that wrote since is refused.
        """
        if key in self._held:
            return None
        lock_id = self._lock_id(key)
        try:
            row = conn.execute(
                self._sql["acquire"],
                {"id": lock_id, "key": key, "host": self._host, "pid": os.getpid()},
            ).fetchone()
            taken = row is not None and bool(row[0])
            if taken and (fresh or key not in self._base):
                # A statement of its own: its snapshot is taken after the lock.
                last = conn.execute(self._sql["last_writer"], {"key": key}).fetchone()
                self._base[key] = None if last is None else last[0]
                self._fenced.pop(key, None)
        except self._pg.Error:
            # The lock may be held now although we could not finish: only
            # closing the connection makes sure it is not kept unknowingly.
            self._suspect = True
            raise
        if taken:
            self._held.add(key)
            return None
        backend, refused = self._holder(conn, key, lock_id)
        if backend in self._orphans and refused.holder is not None and self._ours(refused.holder):
            # Our own old session, dropped mid-call (a cut-off large write),
            # still running its statement: end it, then take the lock.
            self._orphans.remove(backend)
            if self._end_backend(conn, backend):
                return self._acquire(conn, key, fresh=fresh)
        return refused

    def _ours(self, holder: LockHolder) -> bool:
        return holder.pid == os.getpid() and holder.host == self._host

    def _end_backend(self, conn: psycopg.Connection[Any], backend: int) -> bool:
        """Terminate a backend of ours and wait (lock_timeout at most) until it is gone."""
        try:
            conn.execute(b"SELECT pg_terminate_backend(%s)", [backend])
            deadline = time.monotonic() + self.lock_timeout
            while time.monotonic() < deadline:
                row = conn.execute(
                    b"SELECT 1 FROM pg_stat_activity WHERE pid = %s", [backend]
                ).fetchone()
                if row is None:
                    return True
                time.sleep(0.02)
        except self._pg.Error:
            if conn.broken:
                raise
        return False

    def _unlock(self, conn: psycopg.Connection[Any], key: str) -> None:
        self._held.discard(key)
        conn.execute(self._sql["release"], {"key": key, "id": self._lock_id(key)})

    def _holder(
        self, conn: psycopg.Connection[Any], key: str, lock_id: int
    ) -> tuple[int | None, KeyLockedError]:
        """The backend holding ``key``'s lock, and the refusal to raise."""
        hi, lo = (lock_id >> 32) & 0xFFFFFFFF, lock_id & 0xFFFFFFFF
        params = {"key": key, "hi": hi, "lo": lo}
        for _ in range(3):
            row = conn.execute(self._sql["holder"], params).fetchone()
            if row is None or row[1] is not None:
                break
            # The holder notes itself in the statement that takes the lock; its
            # row shows when that statement commits, a moment after the lock.
            time.sleep(0.02)
        where = self.location(key)
        if row is None:  # gone between our try and our look: a retry may take it
            return None, KeyLockedError(key, f"{where}, released a moment ago", None)
        holder = None
        if row[1] is not None:
            holder = LockHolder(pid=row[2], host=row[1], started_at=row[3])
        return row[0], KeyLockedError(key, f"{where}, held by PostgreSQL backend {row[0]}", holder)

    def _upsert(self, conn: psycopg.Connection[Any], params: dict[str, Any]) -> bool:
        """Run the fenced upsert inside the caller's transaction; True if applied."""
        return conn.execute(self._sql["upsert"], params).fetchone() is not None

    def _stale(self, conn: psycopg.Connection[Any], key: str, seq: int) -> str:
        row = conn.execute(self._sql["stored"], {"key": key}).fetchone()
        stored = "a newer checkpoint" if row is None else f"seq {row[0]}"
        return (
            f"refused a late write of {self.location(key)} (seq {seq}): the store holds "
            f"{stored}, written by another writer since this one last held the key; "
            "this writer lost the session: reload it with load() in a new writer"
        )

    def _split(self, key: str, chunks: Sequence[bytes]) -> tuple[int, bytes, bytes]:
        """The format, the meta JSON and the state JSON of an envelope."""
        if (
            len(chunks) >= 4
            and chunks[0] == PREFIX
            and chunks[2] == MIDDLE
            and chunks[-1] == SUFFIX
        ):
            # The writer's envelope: the meta, then the state in one or more
            # pieces (a transcript's cached messages), joined here in the
            # worker thread (bytes.join releases the GIL for large results).
            state = chunks[3] if len(chunks) == 5 else b"".join(chunks[3:-1])
            return FORMAT, bytes(chunks[1]), bytes(state)
        data = b"".join(chunks)
        try:
            checkpoint = decode_raw(data, self.location(key))
        except Exception as exc:
            raise ValueError(f"not a checkpoint envelope for {key!r}: {exc}") from None
        meta = msgspec.json.encode(checkpoint.meta)
        return _FORMAT_DECODER.decode(data).format, meta, bytes(checkpoint.state)


_stores: weakref.WeakSet[PostgresStore] = weakref.WeakSet()
_inherited: list[object] = []  # a forked child's copies of its parent's connections


def _after_fork_in_child() -> None:
    for store in list(_stores):
        store._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _describe(params: dict[str, Any]) -> str:
    """``postgresql://user@host:port/dbname`` for messages: never the password."""
    env = os.environ
    user = params.get("user") or env.get("PGUSER") or ""
    host = params.get("host") or params.get("hostaddr") or env.get("PGHOST") or "localhost"
    port = params.get("port") or env.get("PGPORT") or "5432"
    dbname = params.get("dbname") or env.get("PGDATABASE") or user
    if str(host).startswith("/"):
        host = f"[{host}]"
    return f"postgresql://{user}{'@' if user else ''}{host}:{port}/{dbname}"


# -- the `checkpointer pg-schema` command ------------------------------------


def add_command(commands: Any) -> None:
    """Add ``pg-schema`` to the CLI's subcommands (psycopg is not imported)."""
    cmd = commands.add_parser(
        "pg-schema",
        help="create or upgrade the PostgresStore tables",
        description="Create (or upgrade) the tables PostgresStore uses, in one "
        "transaction, and print the schema version; or print the SQL with --sql.",
    )
    cmd.add_argument(
        "dsn",
        nargs="?",
        default="",
        help="libpq connection string or URI (default: the PG* environment variables)",
    )
    cmd.add_argument("--schema", default="checkpointer", help="PostgreSQL schema (%(default)s)")
    cmd.add_argument("--sql", action="store_true", help="print the SQL instead of running it")
    cmd.set_defaults(run=run_command)


def run_command(args: argparse.Namespace) -> int:
    """Run ``pg-schema``; return the exit status."""
    try:
        if args.sql:
            sys.stdout.write(schema_sql(args.schema))
            return 0
        with PostgresStore(args.dsn, schema=args.schema) as store:
            version = store.create_schema()
            print(f"{store.location('')[:-1]}: schema version {version}")
    except (ImportError, ValueError, PostgresStoreError) as exc:
        print(f"checkpointer pg-schema: {exc}", file=sys.stderr)
        return 1
    return 0
