"""PostgresJournalStore on a real throwaway cluster: rows per message, compactions, faults."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import pytest

from checkpointer import (
    CheckpointError,
    CheckpointWriter,
    Failed,
    FileStore,
    KeyLockedError,
    NewerVersionError,
    PostgresJournalStore,
    PostgresStore,
    PostgresStoreError,
    Snapshot,
    StaleWriteError,
    Written,
    load,
)
from checkpointer._stores.postgres.schema import _SCHEMA_SQL, SCHEMA_VERSION

from . import test_postgres as _pg
from .conftest import FakeClock
from .pg import Cluster
from .test_journal import Msg, Session, _agent_compaction, _truncate, as_json, meta, writer_for
from .test_postgres import admin, spawn, terminate

pytestmark = _pg.pytestmark
# The throwaway cluster and a fresh schema per test, as in test_postgres.py.
cluster = _pg.cluster
pg = _pg.pg
schema = _pg.schema


@pytest.fixture
def make_journal(pg: Cluster, schema: str) -> Iterator[Callable[..., PostgresJournalStore]]:
    """Build journal stores on this test's schema; all closed at the end."""
    made: list[PostgresJournalStore] = []

    def make(**kwargs: Any) -> PostgresJournalStore:
        options: dict[str, Any] = {"schema": schema, "connect_timeout": 2, "statement_timeout": 2}
        options.update(kwargs)
        store = PostgresJournalStore(pg.dsn(), **options)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


def rows(pg: Cluster, schema: str, key: str = "s1") -> list[tuple[int, str]]:
    """The key's journal rows, (n, kind), in order."""
    with admin(pg) as conn:
        found = conn.execute(
            f'SELECT n, kind FROM "{schema}".journal WHERE key = %s ORDER BY n', [key]
        ).fetchall()
    return [(int(n), str(kind)) for n, kind in found]


def kinds(pg: Cluster, schema: str, key: str = "s1") -> list[str]:
    return [kind for _, kind in rows(pg, schema, key)]


def state_of(store: Any, key: str = "s1") -> Any:
    checkpoint = load(store, key)
    assert checkpoint is not None
    return checkpoint.state


def test_appends_insert_one_row_per_new_message(
    pg: Cluster, schema: str, make_journal: Callable[..., PostgresJournalStore]
) -> None:
    """A checkpoint adding k messages inserts k rows (and a state row if the rest changed)."""
    store = make_journal()
    session = Session()
    session.add(3)
    store.commit("s1", meta(1), store.stage("s1", session.state))
    assert kinds(pg, schema) == ["compaction"]
    for seq, added in [(2, 1), (3, 5), (4, 2)]:
        before = rows(pg, schema)
        session.add(added)
        store.commit("s1", meta(seq), store.stage("s1", session.state))
        after = rows(pg, schema)
        assert after[: len(before)] == before  # nothing rewritten
        assert [kind for _, kind in after[len(before) :]] == ["message"] * added
        assert state_of(store) == as_json(session.state)
    session.state["title"] = "renamed"
    session.add(1)
    store.commit("s1", meta(5), store.stage("s1", session.state))
    assert kinds(pg, schema)[-2:] == ["message", "state"]
    assert store.compactions == 1 and store.appends == 4
    assert state_of(make_journal()) == as_json(session.state)
    assert state_of(PostgresStore(pg.dsn(), schema=schema)) == as_json(session.state)


def test_changed_history_replaces_the_rows_with_one_compaction(
    pg: Cluster, schema: str, make_journal: Callable[..., PostgresJournalStore]
) -> None:
    """An edited history deletes the key's rows and inserts one compaction row."""
    store = make_journal()
    session = Session()
    session.add(3)
    store.commit("s1", meta(1), store.stage("s1", session.state))
    session.add(4)
    store.commit("s1", meta(2), store.stage("s1", session.state))
    assert len(rows(pg, schema)) == 5
    session.messages[1] = Msg("user", "edited")
    store.commit("s1", meta(3), store.stage("s1", session.state))
    assert kinds(pg, schema) == ["compaction"]
    assert state_of(store)["messages"][1]["content"] == "edited"
    older = store.stage("s1", session.state)
    session.add()
    store.commit("s1", meta(4), store.stage("s1", session.state))
    store.commit("s1", meta(5), older)  # staged before the last commit: never duplicated
    assert kinds(pg, schema) == ["compaction"]
    assert state_of(store) == as_json(session.state) | {"messages": as_json(session.messages[:-1])}


def test_a_change_that_encodes_differently_is_a_compaction_and_tuples_append(
    pg: Cluster, schema: str, make_journal: Callable[..., PostgresJournalStore]
) -> None:
    """The shared staging on PostgreSQL: 2 -> 2.0 in place and a stale delta with other
    bytes are compactions; a tuple transcript inserts one row per new message."""
    store = make_journal()
    messages: list[Any] = [{"role": "tool", "n": 2}, {"role": "user", "n": 0}]
    state: dict[str, Any] = {"title": "t", "messages": messages}
    store.commit("s1", meta(1), store.stage("s1", state))
    messages.append({"role": "assistant", "content": "draft"})
    in_flight = store.stage("s1", state)
    messages[-1]["content"] = "FINAL ANSWER"
    flush = store.stage("s1", state)  # staged while in_flight was not yet committed
    store.commit("s1", meta(2), in_flight)
    assert flush.content() != in_flight.content()
    store.commit("s1", meta(3), flush)
    assert kinds(pg, schema) == ["compaction"]
    assert state_of(store)["messages"][-1]["content"] == "FINAL ANSWER"
    messages[0]["n"] = 2.0
    store.commit("s1", meta(4), store.stage("s1", state))
    assert kinds(pg, schema) == ["compaction"]
    assert state_of(store)["messages"][0]["n"] == 2.0
    state["messages"] = tuple(messages)
    store.commit("s1", meta(5), store.stage("s1", state))
    state["messages"] = (*messages, {"role": "user", "n": 1})
    staged = store.stage("s1", state)
    assert staged.content() == store.stage("s1", state).content()  # idle: unchanged
    store.commit("s1", meta(6), staged)
    assert kinds(pg, schema) == ["compaction", "message"]
    assert state_of(store) == as_json(state)


def test_rows_are_compacted_past_the_rewrite_threshold(
    pg: Cluster, schema: str, make_journal: Callable[..., PostgresJournalStore]
) -> None:
    """Rows never outgrow rewrite_factor times the last compaction (past the minimum)."""
    store = make_journal(rewrite_min_bytes=2000)
    session = Session()
    for seq in range(1, 60):
        session.state["title"] = f"t{seq}"  # a state row every time
        session.add()
        store.commit("s1", meta(seq), store.stage("s1", session.state))
        assert state_of(store) == as_json(session.state)
    with admin(pg) as conn:
        row = conn.execute(
            f'SELECT sum(length(body)) FROM "{schema}".journal WHERE key = %s', ["s1"]
        ).fetchone()
    assert row is not None and row[0] <= max(2000, 2 * 2000)
    assert store.compactions >= 2


@pytest.mark.anyio
async def test_journal_loads_equal_to_a_filestore_snapshot(
    tmp_path: Path, clock: FakeClock, make_journal: Callable[..., PostgresJournalStore]
) -> None:
    """The same session through the writer: journal rows and a snapshot file load equal."""
    session = Session()
    stores: list[Any] = [make_journal(rewrite_min_bytes=600), FileStore(tmp_path)]
    async with contextlib.AsyncExitStack() as stack:
        writers = [await stack.enter_async_context(writer_for(session, s, clock)) for s in stores]
        steps: list[Callable[[], object]] = [
            lambda: session.add(3),
            lambda: session.state.update(title="renamed"),
            lambda: session.messages.append({"role": "tool", "content": "a dict"}),
            lambda: _agent_compaction(session),
            lambda: session.add(5),
            lambda: _truncate(session),
            lambda: session.add(40),
        ]
        for step in steps:
            step()
            for w in writers:
                assert isinstance(await w.write_now(), Written)
            states = [state_of(s) for s in stores]
            assert states[0] == states[1] == as_json(session.state)
    closed = [load(s, "s1") for s in stores]
    assert closed[0] is not None and closed[1] is not None
    assert closed[0].state == closed[1].state
    assert (closed[0].meta.seq, closed[0].meta.live) == (closed[1].meta.seq, False)


def test_fencing_and_the_lock_hold_for_journal_commits(
    pg: Cluster, schema: str, make_journal: Callable[..., PostgresJournalStore]
) -> None:
    """A second store is locked out; one that lost its session is refused, its rows not added."""
    first = make_journal(application_name="journal-first")
    second = make_journal()
    session = Session()
    session.add(2)
    assert first.acquire("s1") is None
    first.commit("s1", meta(1), first.stage("s1", session.state))
    assert "held by PostgreSQL backend" in (second.acquire("s1") or "")
    assert terminate(pg, "journal-first") == 1  # first loses its connection and lock
    assert second.acquire("s1") is None
    assert state_of(second) == as_json(session.state)
    session.add(1)
    second.commit("s1", meta(2), second.stage("s1", session.state))
    written = rows(pg, schema)
    late = Session()
    late.messages.extend(session.messages[:2])
    late.add(3)
    staged = first.stage("s1", late.state)
    with pytest.raises(KeyLockedError):
        first.commit("s1", meta(5), staged)  # at once on a new connection: locked
    second.release("s1")
    with pytest.raises(StaleWriteError, match="lost the session"):
        first.commit("s1", meta(5), staged)
    assert rows(pg, schema) == written
    assert state_of(second) == as_json(session.state)


STALLER = """
    import os, sys, time
    from checkpointer import PostgresJournalStore
    from checkpointer._values import Meta
    from datetime import UTC, datetime

    class Stalling(PostgresJournalStore):
        stall = False

        def _upsert(self, conn, params):
            applied = super()._upsert(conn, params)
            if self.stall:
                conn.execute(self._sql["journal_append"], {
                    "key": params["key"], "kinds": ["message"],
                    "bodies": [b'{"kind":"message","message":{"never":1}}']})
                print("in-transaction", flush=True)  # rows written, not committed
                time.sleep(60)
            return applied

    def meta(seq):
        now = datetime.now(UTC)
        return Meta(key="kill9", seq=seq, created_at=now, updated_at=now, live=True)

    store = Stalling(os.environ["DSN"], schema=sys.argv[1])
    state = {"messages": [{"v": "committed"}]}
    store.commit("kill9", meta(1), store.stage("kill9", state))
    state["messages"].append({"v": "never committed"})
    store.stall = True
    store.commit("kill9", meta(2), store.stage("kill9", state))
"""


def test_sigkill_mid_transaction_leaves_the_last_commit(
    pg: Cluster, schema: str, make_journal: Callable[..., PostgresJournalStore]
) -> None:
    """A journal writer killed inside its append: the last commit loads, the key is free."""
    proc = spawn(STALLER, pg.dsn(), schema)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "in-transaction", proc.stderr
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.communicate(timeout=20)
    store = make_journal()
    t0 = time.monotonic()
    while (holder := store.acquire("kill9")) is not None:
        assert time.monotonic() - t0 < 1.0, holder
        time.sleep(0.01)
    checkpoint = load(store, "kill9")
    assert checkpoint is not None and checkpoint.state == {"messages": [{"v": "committed"}]}
    assert checkpoint.meta.seq == 1
    assert kinds(pg, schema, "kill9") == ["compaction"]


def test_version_1_schema_is_migrated_and_its_rows_kept(
    pg: Cluster, schema: str, make_journal: Callable[..., PostgresJournalStore]
) -> None:
    """A version-1 schema gains the journal table; its snapshot rows load and become journals."""
    old: dict[str, Any] = {"title": "v1", "messages": [{"c": 0}]}
    with admin(pg) as conn:
        conn.execute(_SCHEMA_SQL.format(s=f'"{schema}"').encode())
        conn.execute(
            f'INSERT INTO "{schema}".checkpoints (key, seq, format, meta, state, writer) '
            "VALUES ('s1', 1, 1, %s::jsonb, %s, 'someone')",
            [msgspec.json.encode(meta(1)).decode(), msgspec.json.encode(old)],
        )
    with pytest.raises(PostgresStoreError, match=r"version 1, older .* `checkpointer pg-schema`"):
        make_journal(create_schema=False).open()
    store = make_journal()
    assert state_of(store) == old
    assert store.schema_version() == SCHEMA_VERSION == 3
    assert store.acquire("s1") is None
    old["messages"].append({"c": 1})
    store.commit("s1", meta(2), store.stage("s1", old))
    assert kinds(pg, schema) == ["compaction"]
    assert state_of(store) == old
    assert state_of(PostgresStore(pg.dsn(), schema=schema)) == old
    with pytest.raises(psycopg.errors.DuplicateTable), admin(pg) as conn:
        conn.execute(f'CREATE TABLE "{schema}".journal (x int)')


def test_delete_removes_the_rows(
    pg: Cluster, schema: str, make_journal: Callable[..., PostgresJournalStore]
) -> None:
    """Deleting a journal key removes its head and its rows."""
    store = make_journal()
    session = Session()
    session.add(2)
    store.commit("s1", meta(1), store.stage("s1", session.state))
    session.add(2)
    store.commit("s1", meta(2), store.stage("s1", session.state))
    assert store.keys() == ["s1"] and len(rows(pg, schema)) == 3
    assert store.delete("s1")
    assert store.keys() == [] and rows(pg, schema) == []
    assert load(store, "s1") is None


def test_writer_on_the_journal_store(make_journal: Callable[..., PostgresJournalStore]) -> None:
    """CheckpointWriter takes the journal store unchanged (flush_sync, close)."""
    store = make_journal()
    session = Session()
    writer: CheckpointWriter[Any] = CheckpointWriter(session.snapshot, store, exit_hooks=False)
    writer.open()
    session.add(3)
    assert isinstance(writer.flush_sync(), Written)
    session.add(1)
    assert isinstance(writer.flush_sync(), Written)
    writer.close()
    checkpoint = load(make_journal(), "s1")
    assert checkpoint is not None and checkpoint.state == as_json(session.state)
    assert store.appends >= 1


def test_move_aside_keeps_a_journal_rows(
    pg: Cluster, schema: str, make_journal: Callable[..., PostgresJournalStore]
) -> None:
    """Moving a journal key aside takes its rows along, as lines; the key is then free."""
    store = make_journal()
    session = Session()
    session.add(2)
    store.commit("s1", meta(1), store.stage("s1", session.state))
    session.add(1)
    store.commit("s1", meta(2), store.stage("s1", session.state))
    assert store.move_aside("s1", "corrupt-x") is not None
    assert rows(pg, schema) == [] and load(store, "s1") is None
    with admin(pg) as conn:
        row = conn.execute(f'SELECT state FROM "{schema}".aside WHERE key = %s', ["s1"]).fetchone()
    assert row is not None
    lines = [msgspec.json.decode(line) for line in bytes(row[0]).split(b"\n")]
    assert [line["kind"] for line in lines] == ["compaction", "message"]
    assert lines[1]["message"]["content"] == "m2"


# -- idle losses, damage, rolling upgrades, large sessions ---------------------------


def test_a_commit_after_an_idle_connection_loss_lands_at_once(
    pg: Cluster, schema: str, make_journal: Callable[..., PostgresJournalStore]
) -> None:
    """pg_terminate_backend while idle: the next append reconnects and lands, rows in order."""
    store = make_journal(application_name="journal-idle")
    session = Session()
    writer: CheckpointWriter[Any] = CheckpointWriter(session.snapshot, store, exit_hooks=False)
    writer.open()
    for _ in range(2):
        assert terminate(pg, "journal-idle") == 1
        session.add(2)
        assert isinstance(writer.flush_sync(), Written)
    assert terminate(pg, "journal-idle") == 1
    session.add(1)
    assert isinstance(writer.close(), Written)  # the final write too
    assert writer.statistics().failures == 0
    checkpoint = load(make_journal(), "s1")
    assert checkpoint is not None and checkpoint.state == as_json(session.state)
    assert checkpoint.meta.live is False
    assert kinds(pg, schema)[0] == "compaction" and "message" in kinds(pg, schema)


def test_a_damaged_row_moves_the_key_aside_not_away(
    pg: Cluster, schema: str, make_journal: Callable[..., PostgresJournalStore]
) -> None:
    """A resuming writer meets a garbled row: the key goes aside with all its rows, then afresh."""
    first = make_journal()
    session = Session()
    session.add(2)
    first.commit("s1", meta(1), first.stage("s1", session.state))
    session.add(1)
    first.commit("s1", meta(2), first.stage("s1", session.state))
    first.close()
    with admin(pg) as conn:
        garble = "UPDATE {}.journal SET body = 'garbled' WHERE key = 's1' AND kind = 'message'"
        conn.execute(garble.format(f'"{schema}"'))
    store = make_journal()
    with pytest.raises(CheckpointError, match="line 3"):
        store.read_meta("s1")
    fresh = Session()
    fresh.add(1)
    writer: CheckpointWriter[Any] = CheckpointWriter(fresh.snapshot, store, exit_hooks=False)
    writer.open()  # its first write resolves the key: it cannot be trusted
    assert isinstance(writer.close(), Written)
    with admin(pg) as conn:
        aside = conn.execute(
            f'SELECT state FROM "{schema}".aside WHERE key = %s', ["s1"]
        ).fetchone()
    assert aside is not None
    lines = bytes(aside[0]).split(b"\n")
    assert lines[1] == b"garbled" and msgspec.json.decode(lines[0])["kind"] == "compaction"
    assert state_of(store) == as_json(fresh.state)


# The statements of version 1 (schema 1, before journals), as released.
V1_READ = "SELECT format, meta::text, state FROM {s}.checkpoints WHERE key = %(key)s"
V1_DELETE = "DELETE FROM {s}.checkpoints WHERE key = %(key)s RETURNING 1"
V1_MOVE_ASIDE = """
    WITH moved AS (DELETE FROM {s}.checkpoints WHERE key = %(key)s RETURNING *)
    INSERT INTO {s}.aside AS a (key, suffix, seq, format, meta, state, writer, updated_at)
    SELECT key, %(suffix)s, seq, format, meta, state, writer, updated_at FROM moved
    ON CONFLICT (key, suffix) DO UPDATE SET seq = EXCLUDED.seq, format = EXCLUDED.format,
        meta = EXCLUDED.meta, state = EXCLUDED.state, writer = EXCLUDED.writer,
        updated_at = EXCLUDED.updated_at, moved_at = now()
    RETURNING 1"""
V1_UPSERT = """
    INSERT INTO {s}.checkpoints AS c (key, seq, format, meta, state, writer, updated_at)
    VALUES (%(key)s, %(seq)s, %(format)s, %(meta)s::jsonb, %(state)b, %(writer)s, now())
    ON CONFLICT (key) DO UPDATE SET seq = EXCLUDED.seq, format = EXCLUDED.format,
        meta = EXCLUDED.meta, state = EXCLUDED.state, writer = EXCLUDED.writer,
        updated_at = EXCLUDED.updated_at
    WHERE (c.seq < EXCLUDED.seq AND c.writer IS NOT DISTINCT FROM %(base)s::text)
       OR (c.seq = EXCLUDED.seq AND c.writer = EXCLUDED.writer)
    RETURNING c.seq"""


def test_a_version_1_worker_refuses_a_journal_key(
    pg: Cluster, schema: str, make_journal: Callable[..., PostgresJournalStore]
) -> None:
    """Version 1's read finds no state in the head; its move-aside, delete and upsert fail;
    key intact."""
    from checkpointer._format.envelope import MIDDLE, SUFFIX, decode_checkpoint
    from checkpointer._values import CheckpointError

    store = make_journal()
    session = Session()
    session.add(2)
    store.commit("s1", meta(1), store.stage("s1", session.state))
    session.add(1)
    store.commit("s1", meta(2), store.stage("s1", session.state))
    q = f'"{schema}"'
    with admin(pg) as conn:
        found = conn.execute(V1_READ.format(s=q), {"key": "s1"}, binary=True).fetchone()
        assert found is not None
        fmt, meta_json, state = found
        envelope = b"".join([b'{"format":%d,"meta":' % fmt, meta_json.encode(), MIDDLE, state])
        with pytest.raises(CheckpointError):
            decode_checkpoint(envelope + SUFFIX, "v1")  # what load() of version 1 raised
        # ... and what its writer did next (it moves a key it cannot read aside):
        for sql, params in (
            (V1_MOVE_ASIDE, {"key": "s1", "suffix": "corrupt-x"}),
            (V1_DELETE, {"key": "s1"}),
        ):
            with pytest.raises(psycopg.errors.ForeignKeyViolation, match="newer_checkpointer"):
                conn.execute(sql.format(s=q), params)
        writer = conn.execute(f"SELECT writer FROM {q}.checkpoints").fetchone()
        with pytest.raises(psycopg.errors.CheckViolation, match="newer_checkpointer"):
            conn.execute(
                V1_UPSERT.format(s=q),
                {"key": "s1", "seq": 3, "format": 1, "meta": msgspec.json.encode(meta(3)).decode(),
                 "state": b"{}", "writer": "v1", "base": writer[0] if writer else None},
            )  # fmt: skip
    checkpoint = load(make_journal(), "s1")
    assert checkpoint is not None and checkpoint.meta.seq == 2
    assert checkpoint.state == as_json(session.state)


def test_an_early_version_2_schema_is_migrated_to_3(
    pg: Cluster, schema: str, make_journal: Callable[..., PostgresJournalStore]
) -> None:
    """Schema 2 as first made (a row sequence, heads of format 1): rows kept, appends go on."""
    from checkpointer._stores.postgres.schema import _MIGRATE_2_SQL

    q = f'"{schema}"'
    old = make_journal()
    with admin(pg) as conn:
        conn.execute(_SCHEMA_SQL.format(s=q).encode())
        conn.execute(_MIGRATE_2_SQL.format(s=q).encode())
        head = msgspec.json.encode(meta(1)).decode()
        conn.execute(
            f"INSERT INTO {q}.checkpoints (key, seq, format, meta, state, writer, journal) "
            "VALUES ('s1', 1, 1, %s::jsonb, '', 'early', true)",
            [head],
        )
        body = b'{"kind":"compaction","meta":%s,"transcript":"messages","state":{"messages":[]}}'
        conn.execute(f"SELECT nextval('{q}.journal_n_seq') FROM generate_series(1, 5)")
        conn.execute(
            f"INSERT INTO {q}.journal (key, kind, body) VALUES ('s1', 'compaction', %s)",
            [body % head.encode()],
        )
    assert old.schema_version() == 2
    store = make_journal()
    assert state_of(store) == {"messages": []}
    assert store.schema_version() == 3
    with admin(pg) as conn:
        assert conn.execute(f"SELECT format FROM {q}.checkpoints").fetchone() == (1,)
        assert conn.execute("SELECT to_regclass(%s)", [f"{q}.journal_n_seq"]).fetchone() == (None,)
        compression = conn.execute(
            "SELECT attrelid::regclass::text, attcompression FROM pg_attribute "
            "WHERE attname IN ('state', 'body') AND attrelid = ANY(%s::regclass[])",
            [[f"{q}.checkpoints", f"{q}.journal"]],
        ).fetchall()
    assert len({c for _, c in compression}) == 1, compression  # lz4 on both, or on neither
    assert store.acquire("s1") is None
    session = Session()
    session.add(1)
    store.commit("s1", meta(2), store.stage("s1", session.state))  # a compaction
    session.add(2)
    store.commit("s1", meta(3), store.stage("s1", session.state))  # an append
    assert rows(pg, schema) == [(1, "compaction"), (2, "message"), (3, "message")]
    assert state_of(make_journal()) == as_json(session.state)


@pytest.mark.skipif(
    os.environ.get("CHECKPOINTER_LONG_TESTS") != "1",
    reason="a 200 MB compaction: set CHECKPOINTER_LONG_TESTS=1",
)
def test_a_200_mb_compaction_is_stored(
    make_journal: Callable[..., PostgresJournalStore], capsys: pytest.CaptureFixture[str]
) -> None:
    """A 200 MB session is one compaction row, with the default timeouts, at the first try."""
    from benchmarks.bench_postgres import _session

    store = make_journal(statement_timeout=10, connect_timeout=5)
    state = _session(200 << 20)
    times = []
    for seq in (1, 2):
        staged = store.stage("big", state)
        t0 = time.perf_counter()
        assert store.commit("big", meta(seq, key="big"), staged) > 150 << 20
        times.append(time.perf_counter() - t0)
        store._tracks.clear()  # the second is a compaction again, over the first
    with capsys.disabled():
        print(f"\n200 MB compaction: {times[0]:.2f} s, again over it: {times[1]:.2f} s")
    assert load(store, "big") is not None


# -- written by a newer version ------------------------------------------------------


def _stored(pg: Cluster, schema: str) -> list[list[Any]]:
    """Every row of the schema's checkpoints, journal and aside tables."""
    queries = [
        "SELECT key, seq, format, meta::text, state, journal FROM {s}.checkpoints ORDER BY key",
        "SELECT key, n, kind, body FROM {s}.journal ORDER BY key, n",
        "SELECT key, suffix FROM {s}.aside ORDER BY key, suffix",
    ]
    with admin(pg) as conn:
        return [conn.execute(q.format(s=f'"{schema}"')).fetchall() for q in queries]


def _newer_journal_key(
    pg: Cluster, schema: str, make: Callable[..., PostgresJournalStore], how: str
) -> None:
    """Key s1, a journal written by this version, then made one that agent-checkpointer 9.9.9
    wrote: a head of format 3 (``head``), or a row of a kind this version does not know
    after the compaction (``row``)."""
    store = make()
    session = {"messages": [{"role": "user", "content": "new"}]}
    writer = CheckpointWriter(lambda: Snapshot("s1", session), store, exit_hooks=False)
    writer.open()
    writer.close()
    store.close()
    with admin(pg) as conn:
        if how == "head":
            conn.execute(
                f'UPDATE "{schema}".checkpoints SET format = 3, '
                "meta = jsonb_set(meta, '{library_version}', '\"9.9.9\"') WHERE key = 's1'"
            )
        else:
            conn.execute(
                f'INSERT INTO "{schema}".journal (key, n, kind, body) VALUES '
                "('s1', 100, 'delta', %s)",
                [b'{"kind":"delta","format":3,"meta":{"library_version":"9.9.9"},"ops":[]}'],
            )


@pytest.mark.parametrize("plain", [False, True], ids=["journal-store", "plain-store"])
@pytest.mark.parametrize("how", ["head", "row"])
def test_a_journal_key_a_newer_version_wrote_is_newer_not_damaged(
    pg: Cluster,
    schema: str,
    make_journal: Callable[..., PostgresJournalStore],
    how: str,
    plain: bool,
) -> None:
    """A journal key whose head is of a newer format, or with a row of a kind this version
    does not know, is a NewerVersionError naming 9.9.9 on load (either store), and
    Failed("newer-version") for a writer: every row kept, nothing moved aside."""
    _newer_journal_key(pg, schema, make_journal, how)
    before = _stored(pg, schema)
    store = PostgresStore(pg.dsn(), schema=schema) if plain else make_journal()
    with pytest.raises(NewerVersionError) as info:
        load(store, "s1")
    assert info.value.library_version == "9.9.9"
    assert "9.9.9" in info.value.reason and "upgrade" in info.value.reason
    writer = CheckpointWriter(
        lambda: Snapshot("s1", {"messages": []}), store, exit_hooks=False, write_on_start=False
    )
    writer.open()
    result = writer.flush_sync()
    writer.close()
    store.close()
    assert isinstance(result, Failed) and result.reason == "newer-version", result
    assert _stored(pg, schema) == before
