"""The tables of the PostgreSQL store: their SQL, their versions, and installing them.

* **Versioned schema**, created on first use (or by ``create_schema()`` /
  ``checkpointer pg-schema``) under a transaction-level advisory lock, so
  concurrent first users do not race; ``<schema>.schema_version`` says which.
  Version 1: the checkpoints, their holders and what was moved aside;
  version 2: the journal (``PostgresJournalStore``); version 3: what keeps
  workers of version 1 off journal keys during a rolling upgrade, and lets
  workers of version 2 write on.

``QUERIES`` holds every statement the store runs (one round trip each);
``SchemaPart`` is the part of ``PostgresStore`` that checks and installs
the tables (``store.py`` says how the parts fit).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from typing import TYPE_CHECKING, Any

from .errors import PostgresStoreError

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "HEAD_FORMAT",
    "JOURNAL_FORMAT",
    "QUERIES",
    "SCHEMA_VERSION",
    "SchemaPart",
    "grants_sql",
    "int64",
    "quote_schema",
    "schema_sql",
]

SCHEMA_VERSION = 3
"""The version of the tables this library creates and the newest it uses."""

_SCHEMA_RE = re.compile(r"[a-z_][a-z0-9_]{0,62}")

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
# off them during a rolling upgrade, lets workers of version 2 write on, and
# lets plain table grants do.
# * A head cannot be deleted while it has rows (the foreign key), nor
#   rewritten as a plain row while it is a head (the check: a head says format
#   1 with an empty state, as version 2 writes it, or a newer format; a
#   version-1 upsert over it carries a state): a version-1 writer, which moves
#   a key it cannot read aside, fails instead.  Both NOT VALID: enforced from
#   now on, without scanning the tables.  A version-1 reader builds
#   ``{"format":1,"meta":...,"state":}`` from a head and refuses it.
# * Rows are numbered per key (the writer holds the key's lock), so the
#   journal needs no sequence, and no grant on one.  A worker of version 2
#   still running through the upgrade (a rolling upgrade) inserts its rows
#   without ``n`` (it had the sequence): a trigger numbers them per key, in
#   the order of its insert (a row trigger sees the rows before it in the
#   statement).  The function is the invoker's: no grant needed.
# * Heads keep version 2's shape, so a version-2 worker reads the keys
#   version 3 wrote (its rows are the same lines).  A pre-release schema 3
#   wrote heads of format 2 with a ``null`` state: still read, and turned into
#   format 1 when this SQL runs over them (a version-2 reader refuses format 2
#   as "newer").
_MIGRATE_3_SQL = """\
ALTER TABLE {s}.journal ALTER COLUMN n DROP DEFAULT;
DROP SEQUENCE IF EXISTS {s}.journal_n_seq;
CREATE OR REPLACE FUNCTION {s}.journal_row_of_version_2() RETURNS trigger
LANGUAGE plpgsql AS $f$
BEGIN
    NEW.n := coalesce((SELECT max(n) FROM {s}.journal WHERE key = NEW.key), 0) + 1;
    RETURN NEW;
END
$f$;
DROP TRIGGER IF EXISTS journal_row_of_version_2 ON {s}.journal;
CREATE TRIGGER journal_row_of_version_2 BEFORE INSERT ON {s}.journal
    FOR EACH ROW WHEN (NEW.n IS NULL) EXECUTE FUNCTION {s}.journal_row_of_version_2();
ALTER TABLE {s}.journal DROP CONSTRAINT IF EXISTS journal_key_needs_a_newer_checkpointer;
ALTER TABLE {s}.journal ADD CONSTRAINT journal_key_needs_a_newer_checkpointer
    FOREIGN KEY (key) REFERENCES {s}.checkpoints (key) NOT VALID;
ALTER TABLE {s}.checkpoints DROP CONSTRAINT IF EXISTS journal_head_needs_a_newer_checkpointer;
UPDATE {s}.checkpoints SET format = 1, state = ''::bytea WHERE journal AND format = 2;
ALTER TABLE {s}.checkpoints ADD CONSTRAINT journal_head_needs_a_newer_checkpointer
    CHECK (NOT journal OR format > 2 OR (format = 1 AND octet_length(state) = 0)) NOT VALID;
UPDATE {s}.schema_version SET version = 3, installed_at = now() WHERE version < 3;
"""

# Run with every install and upgrade: a role granted the tables of an older
# version (``grants_sql``, ``ON ALL TABLES`` names the tables there then) gets
# the same on the journal, which version 2 added; so an upgraded fleet needs no
# second round of grants.  Idempotent, as the whole script is (the SQL of
# ``pg-schema --sql`` may be run again, or over tables the library made).
_GRANTS_FOLLOW_SQL = """DO $grants$
DECLARE g record;
BEGIN
    FOR g IN
        SELECT a.privilege_type AS what,
            CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END AS who
        FROM pg_class c
        CROSS JOIN LATERAL aclexplode(c.relacl) a
        LEFT JOIN pg_roles r ON r.oid = a.grantee
        WHERE c.oid = '{s}.checkpoints'::regclass AND a.grantee <> c.relowner
          AND a.privilege_type IN ('SELECT', 'INSERT', 'UPDATE', 'DELETE')
    LOOP
        BEGIN  -- a user that may not grant (not the tables' owner) changes nothing
            EXECUTE format('GRANT %s ON {s}.journal TO %s', g.what, g.who);
        EXCEPTION WHEN insufficient_privilege THEN NULL;
        END;
    END LOOP;
END
$grants$;
"""

JOURNAL_FORMAT = 2
"""The newest ``format`` of a journal key's head row this library reads.

It writes 1 (with an empty state; the rows hold it), as version 2 did, so
version 2 reads its keys; a release whose rows older ones cannot read
writes a higher one, and this one refuses it as newer."""

HEAD_FORMAT = 1
"""The ``format`` this library writes in a journal key's head row."""

_LZ4_SQL = (
    "ALTER TABLE {s}.checkpoints ALTER COLUMN state SET COMPRESSION lz4;"
    " ALTER TABLE {s}.journal ALTER COLUMN body SET COMPRESSION lz4;"
)

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
        WHERE (c.seq < EXCLUDED.seq
               AND (c.writer IS NOT DISTINCT FROM %(base)s::text OR c.writer = EXCLUDED.writer))
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


def schema_sql(schema: str = "checkpointer") -> str:
    """The SQL that creates the tables (version ``SCHEMA_VERSION``).

    For a database administrator who prefers to run it; the store creates
    the same on first use unless ``create_schema=False``.
    """
    quoted = quote_schema(schema)
    lz4 = _LZ4_SQL.format(s=quoted)
    return (
        _SCHEMA_SQL.format(s=quoted)
        + _MIGRATE_2_SQL.format(s=quoted)
        + _MIGRATE_3_SQL.format(s=quoted)
        + _GRANTS_FOLLOW_SQL.format(s=quoted)
        + "-- Optional, on PostgreSQL 14+ built with lz4 (what the store does when it can):\n"
        + "".join(f"-- {line};\n" for line in lz4.rstrip(";").split("; "))
    )


def grants_sql(schema: str = "checkpointer", role: str = "app") -> str:
    """What a role needs to use tables ``pg-schema`` made (as another user).

    Every store works through these: reading and writing rows, and the
    advisory locks, which need no grant.
    """
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
    """The part of ``PostgresStore`` that checks, creates and upgrades its tables.

    Works on the connection it is given; ``ConnectionPart._session`` calls
    ``_ensure_schema`` on first use.
    """

    _pg: Any
    schema: str
    _quoted: str
    _create: bool
    _schema_ok: bool
    _sql: dict[str, bytes]
    _where: str

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
                self._sql["install_lock"], {"id": int64(b"schema\0" + self._quoted.encode())}
            )
            version = self._version_in(conn)
            self._check_newer(version)
            if version is not None and version < SCHEMA_VERSION:
                # A writer locks a key's head, then its rows: so does the upgrade,
                # before it alters them (rows first would deadlock with a writer of
                # the running release between the two); it waits for those writing.
                names = ("checkpoints", "journal") if version >= 2 else ("checkpoints",)
                tables = ", ".join(f"{self._quoted}.{name}" for name in names)
                conn.execute(f"LOCK TABLE {tables} IN ACCESS EXCLUSIVE MODE".encode())
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
            conn.execute(_GRANTS_FOLLOW_SQL.format(s=self._quoted).encode())

    def _version_in(self, conn: psycopg.Connection[Any]) -> int | None:
        # Inside a transaction a failed statement would abort it: look first.
        row = conn.execute(b"SELECT to_regclass(%s)", [f"{self._quoted}.schema_version"]).fetchone()
        if row is None or row[0] is None:
            return None
        found = conn.execute(self._sql["version"]).fetchone()
        return None if found is None else int(found[0])
