"""The tables of the PostgreSQL store: their SQL (``QUERIES``: every statement the store
runs, one round trip each), and installing them on first use (or by ``pg-schema``).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from typing import TYPE_CHECKING, Any

from ..sealing import MAGIC
from .errors import PostgresStoreError

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "QUERIES",
    "SCHEMA_VERSION",
    "SchemaPart",
    "grants_sql",
    "int64",
    "quote_schema",
    "schema_sql",
]

SCHEMA_VERSION = 1  # of the tables this library creates and uses; a store refuses another

_SCHEMA_RE = re.compile(r"[a-z_][a-z0-9_]{0,62}")

# Idempotent (IF NOT EXISTS, ON CONFLICT): `pg-schema --sql` may be run again,
# or over tables the library made.
_SCHEMA_SQL = """\
CREATE SCHEMA IF NOT EXISTS {s};
CREATE TABLE IF NOT EXISTS {s}.schema_version (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    version integer NOT NULL,
    installed_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS {s}.checkpoints (
    key text PRIMARY KEY,
    revision text NOT NULL,
    format integer NOT NULL,
    meta jsonb NOT NULL,
    state bytea NOT NULL,
    journal boolean NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS {s}.journal (
    key text NOT NULL,
    n bigint NOT NULL,
    kind text NOT NULL,
    body bytea NOT NULL,
    PRIMARY KEY (key, n)
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
    revision text NOT NULL,
    format integer NOT NULL,
    meta jsonb NOT NULL,
    state bytea NOT NULL,
    updated_at timestamptz NOT NULL,
    moved_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (key, suffix)
);
INSERT INTO {s}.schema_version (version) VALUES ({version}) ON CONFLICT (one) DO NOTHING;
"""

_LZ4_SQL = (
    "ALTER TABLE {s}.checkpoints ALTER COLUMN state SET COMPRESSION lz4;"
    " ALTER TABLE {s}.journal ALTER COLUMN body SET COMPRESSION lz4;"
)

# What a write replaces, read by the statement that replaces it: the row locked, its
# state's first bytes.  Returned (below) only if sealed: the header line of its record
# (a snapshot's, or a head's end), for the writer to check that it holds the key that
# sealed it (``sealing.check_sealer``); a refusal rolls the transaction back.
_REPLACED = """
        WITH o AS (
            SELECT key, substring(state FOR 4096) AS head FROM {s}.checkpoints
            WHERE key = %(key)s AND revision = %(expected)s FOR UPDATE)"""
_SEALED_HEAD = f"""
        RETURNING CASE WHEN substring(o.head FOR {len(MAGIC)}) = '\\x{MAGIC.hex()}'::bytea
            THEN substring(o.head FOR coalesce(nullif(position('\\x0a'::bytea IN o.head), 0),
                4096)) END"""

# Each statement is one round trip.  {s} is the quoted schema name.
QUERIES = {
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
    # A delete's hold of the lock, for its transaction only.
    "lock_for_call": "SELECT pg_try_advisory_xact_lock(%(id)s)",
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
    "release_all": """
        WITH gone AS (DELETE FROM {s}.holders WHERE backend_pid = pg_backend_pid())
        SELECT pg_advisory_unlock_all()""",
    # The conditional writes: each applies only over the revision expected, checked
    # by the statement that writes (READ COMMITTED re-checks the row it waited for).
    # No checkpoint expected: an insert that a row already there stops.
    "insert": """
        INSERT INTO {s}.checkpoints (key, revision, format, meta, state, journal)
        VALUES (%(key)s, %(revision)s, %(format)s, %(meta)s::jsonb, %(state)b, %(journal)s)
        ON CONFLICT (key) DO NOTHING
        RETURNING NULL::bytea""",
    # A revision expected: an update of that revision only (a deleted row is not there).
    "update": _REPLACED
    + """
        UPDATE {s}.checkpoints c SET revision = %(revision)s, format = %(format)s,
            meta = %(meta)s::jsonb, state = %(state)b, journal = %(journal)s, updated_at = now()
        FROM o WHERE c.key = o.key"""
    + _SEALED_HEAD,
    # The meta alone (a journal's head, or a snapshot row: read() joins the meta column).
    "update_meta": _REPLACED
    + """
        UPDATE {s}.checkpoints c SET revision = %(revision)s, meta = %(meta)s::jsonb,
            updated_at = now()
        FROM o WHERE c.key = o.key"""
    + _SEALED_HEAD,
    "revision": "SELECT revision FROM {s}.checkpoints WHERE key = %(key)s",
    "journal": "SELECT journal FROM {s}.checkpoints WHERE key = %(key)s",
    # One statement, so the head and the rows come from one snapshot.
    "read": """
        SELECT c.format, c.meta::text, c.state, c.journal, j.body
        FROM {s}.checkpoints c
        LEFT JOIN {s}.journal j ON c.journal AND j.key = c.key AND j.n >= (
            SELECT max(n) FROM {s}.journal WHERE key = c.key AND kind = 'compaction')
        WHERE c.key = %(key)s
        ORDER BY j.n""",
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
        INSERT INTO {s}.aside AS a (key, suffix, revision, format, meta, state, updated_at)
        SELECT key, %(suffix)s, revision, format, meta,
            -- a journal key's rows go aside too: its lines, as they were, one per line
            CASE WHEN journal THEN coalesce(
                (SELECT string_agg(body, '\\x0a'::bytea ORDER BY n) FROM rows), ''::bytea)
            ELSE state END,
            updated_at
        FROM moved
        ON CONFLICT (key, suffix) DO UPDATE SET revision = EXCLUDED.revision,
            format = EXCLUDED.format, meta = EXCLUDED.meta, state = EXCLUDED.state,
            updated_at = EXCLUDED.updated_at, moved_at = now()
        RETURNING 1""",
}


def schema_sql(schema: str = "checkpointer") -> str:
    """The SQL that creates the tables, for an administrator (the store does it on first use)."""
    quoted = quote_schema(schema)
    lz4 = _LZ4_SQL.format(s=quoted)
    return (
        _SCHEMA_SQL.format(s=quoted, version=SCHEMA_VERSION)
        + "-- Optional, on PostgreSQL 14+ built with lz4 (what the store does when it can):\n"
        + "".join(f"-- {line};\n" for line in lz4.rstrip(";").split("; "))
    )


def grants_sql(schema: str = "checkpointer", role: str = "app") -> str:
    """What a role needs to use the tables ``pg-schema`` made as another user."""
    quoted = quote_schema(schema)
    who = role
    if re.fullmatch(r"[a-z_][a-z0-9_]*", role) is None:
        who = '"' + role.replace('"', '""') + '"'
    return (
        f"GRANT USAGE ON SCHEMA {quoted} TO {who}; "
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {quoted} TO {who};"
    )


def quote_schema(schema: str) -> str:
    if not isinstance(schema, str) or _SCHEMA_RE.fullmatch(schema) is None:
        raise ValueError(
            f"invalid schema name {schema!r}: use 1-63 lowercase letters, digits "
            "and '_', not starting with a digit"
        )
    return f'"{schema}"'


def int64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big", signed=True)


class SchemaPart:
    """The part of ``PostgresStore`` that checks (on first use) and creates its tables."""

    _pg: Any
    schema: str
    _quoted: str
    _create: bool
    _schema_ok: bool
    _sql: dict[str, bytes]
    _where: str

    def _version(self, conn: psycopg.Connection[Any]) -> int | None:
        # Looked for first: in a transaction a failed statement would abort it.
        row = conn.execute(b"SELECT to_regclass(%s)", [f"{self._quoted}.schema_version"]).fetchone()
        if row is None or row[0] is None:
            return None
        found = conn.execute(self._sql["version"]).fetchone()
        return None if found is None else int(found[0])

    def _ensure_schema(self, conn: psycopg.Connection[Any]) -> None:
        version = self._version(conn)
        if version is None and self._create:
            self._install(conn)
        elif version is None:
            raise PostgresStoreError(
                f"{self._where}: no checkpointer tables in schema {self.schema!r}; create "
                f"them with `checkpointer pg-schema` or PostgresStore(...).create_schema()"
            )
        else:
            self._check_version(version)
        self._schema_ok = True

    def _check_version(self, version: int | None) -> None:
        if version is not None and version != SCHEMA_VERSION:
            raise PostgresStoreError(
                f"{self._where}: schema {self.schema!r} has tables of version {version}, "
                f"this agent-checkpointer uses version {SCHEMA_VERSION}: upgrade "
                "agent-checkpointer, or use another schema"
            )

    def _install(self, conn: psycopg.Connection[Any]) -> None:
        with conn.transaction():
            # Concurrent first users wait here instead of racing on CREATE.
            conn.execute(
                self._sql["install_lock"], {"id": int64(b"schema\0" + self._quoted.encode())}
            )
            version = self._version(conn)
            self._check_version(version)
            if version is not None:
                return
            conn.execute(_SCHEMA_SQL.format(s=self._quoted, version=SCHEMA_VERSION).encode())
            # lz4 where the server has it (14+, built with lz4): for a transcript
            # of several MB, 3-4x quicker than the default pglz.
            with contextlib.suppress(self._pg.Error), conn.transaction():
                conn.execute(_LZ4_SQL.format(s=self._quoted).encode())
