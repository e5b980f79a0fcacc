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
import pytest

from checkpointer import (
    CheckpointError,
    CheckpointWriter,
    Failed,
    FileStore,
    NewerVersionError,
    PostgresJournalStore,
    PostgresStore,
    Snapshot,
    Written,
    load,
)
from checkpointer.stores import KeyLockedError, StaleWriteError
from tests.conftest import FakeClock
from tests.pg import Cluster
from tests.stores.postgres import test_store as _pg
from tests.stores.postgres.test_store import admin, spawn, terminate
from tests.stores.test_journal import (
    Msg,
    Session,
    _agent_compaction,
    _truncate,
    as_json,
    meta,
    prev,
    writer_for,
)

pytestmark = _pg.pytestmark
# The throwaway cluster and a fresh schema per test, as in tests/stores/postgres/test_store.py.
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
    session.grow(store, 3)
    assert kinds(pg, schema) == ["compaction"]
    for seq, added in [(2, 1), (3, 5), (4, 2)]:
        before = rows(pg, schema)
        session.add(added)
        session.commit(store, seq)
        after = rows(pg, schema)
        assert after[: len(before)] == before  # nothing rewritten
        assert [kind for _, kind in after[len(before) :]] == ["message"] * added
        assert state_of(store) == as_json(session.state)
    session.state["title"] = "renamed"
    session.add(1)
    session.commit(store, 5)
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
    session.grow(store, 3, 4)
    assert len(rows(pg, schema)) == 5
    session.messages[1] = Msg("user", "edited")
    session.commit(store, 3)
    assert kinds(pg, schema) == ["compaction"]
    assert state_of(store)["messages"][1]["content"] == "edited"
    older = store.stage("s1", session.state)
    session.add()
    session.commit(store, 4)
    # Staged before the last commit: never duplicated.
    store.commit("s1", meta(5), older, expected=prev(5))
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
    store.commit("s1", meta(1), store.stage("s1", state), expected=prev(1))
    messages.append({"role": "assistant", "content": "draft"})
    in_flight = store.stage("s1", state)
    messages[-1]["content"] = "FINAL ANSWER"
    flush = store.stage("s1", state)  # staged while in_flight was not yet committed
    store.commit("s1", meta(2), in_flight, expected=prev(2))
    assert flush.content() != in_flight.content()
    store.commit("s1", meta(3), flush, expected=prev(3))
    assert kinds(pg, schema) == ["compaction"]
    assert state_of(store)["messages"][-1]["content"] == "FINAL ANSWER"
    messages[0]["n"] = 2.0
    store.commit("s1", meta(4), store.stage("s1", state), expected=prev(4))
    assert kinds(pg, schema) == ["compaction"]
    assert state_of(store)["messages"][0]["n"] == 2.0
    state["messages"] = tuple(messages)
    store.commit("s1", meta(5), store.stage("s1", state), expected=prev(5))
    state["messages"] = (*messages, {"role": "user", "n": 1})
    staged = store.stage("s1", state)
    assert staged.content() == store.stage("s1", state).content()  # idle: unchanged
    store.commit("s1", meta(6), staged, expected=prev(6))
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
        session.commit(store, seq)
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


def test_a_journal_commit_lands_only_over_the_revision_it_expects(
    pg: Cluster, schema: str, make_journal: Callable[..., PostgresJournalStore]
) -> None:
    """The ownership table, on journal commits: a stale commit (another store wrote since,
    or the key was deleted) raises StaleWriteError and adds no row; its own landed commit
    returns as written; update_meta is conditional the same way."""
    first = make_journal(application_name="journal-first")
    second = make_journal()
    session = Session()
    session.add(2)
    first.commit("s1", meta(1), first.stage("s1", session.state), expected=None)
    landed = as_json(session.state)
    session.add(1)
    first.commit("s1", meta(1), first.stage("s1", session.state), expected=None)  # its own r1
    assert kinds(pg, schema) == ["compaction"] and state_of(first) == landed  # not written again
    del session.messages[-1]
    assert "held by PostgreSQL backend" in (second.acquire("s1") or "")
    assert terminate(pg, "journal-first") == 1  # first loses its connection and lock
    assert second.acquire("s1") is None
    session.add(1)
    second.commit("s1", meta(2), second.stage("s1", session.state), expected="r1")
    written = rows(pg, schema)
    late = Session()
    late.messages.extend(session.messages[:2])
    late.add(3)
    staged = first.stage("s1", late.state)
    with pytest.raises(KeyLockedError):
        first.commit("s1", meta(9), staged, expected="r1")  # at once, on a new connection
    second.release("s1")
    with pytest.raises(StaleWriteError) as info:
        first.commit("s1", meta(9), staged, expected="r1")
    assert (info.value.expected, info.value.stored) == ("r1", "r2")
    with pytest.raises(StaleWriteError):
        first.update_meta("s1", meta(9), expected="r1")
    first.release("s1")
    assert rows(pg, schema) == written and state_of(second) == as_json(session.state)
    second.update_meta("s1", meta(3, live=False), expected="r2")
    second.update_meta("s1", meta(3, live=False), expected="r2")  # its own: landed already
    checkpoint = load(second, "s1")
    assert checkpoint is not None and checkpoint.meta.revision == "r3"
    assert checkpoint.meta.live is False and checkpoint.state == as_json(session.state)
    assert second.delete("s1") is True
    with pytest.raises(StaleWriteError) as info:
        second.commit("s1", meta(4), second.stage("s1", session.state), expected="r3")
    assert (info.value.expected, info.value.stored) == ("r3", None)  # deleted: not recreated
    assert second.keys() == [] and rows(pg, schema) == []


STALLER = """
    import os, sys, time
    from checkpointer import PostgresJournalStore
    from checkpointer._values import Meta
    from datetime import UTC, datetime

    class Stalling(PostgresJournalStore):
        stall = False

        def _apply(self, conn, key, statement, params):
            applied = super()._apply(conn, key, statement, params)
            if self.stall:
                conn.execute(self._sql["journal_append"], {
                    "key": params["key"], "kinds": ["message"],
                    "bodies": [b'{"kind":"message","message":{"never":1}}']})
                print("in-transaction", flush=True)  # rows written, not committed
                time.sleep(60)
            return applied

    def meta(seq):
        now = datetime.now(UTC)
        return Meta(
            key="kill9", seq=seq, created_at=now, updated_at=now, live=True, revision=f"r{seq}"
        )

    store = Stalling(os.environ["DSN"], schema=sys.argv[1])
    state = {"messages": [{"v": "committed"}]}
    store.commit("kill9", meta(1), store.stage("kill9", state), expected=None)
    state["messages"].append({"v": "never committed"})
    store.stall = True
    store.commit("kill9", meta(2), store.stage("kill9", state), expected="r1")
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


def test_delete_removes_the_rows(
    pg: Cluster, schema: str, make_journal: Callable[..., PostgresJournalStore]
) -> None:
    """Deleting a journal key removes its head and its rows."""
    store = make_journal()
    session = Session()
    session.grow(store, 2, 2)
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
    session.grow(store, 2, 1)
    assert store.move_aside("s1", "corrupt-x") is not None
    assert rows(pg, schema) == [] and load(store, "s1") is None
    with admin(pg) as conn:
        row = conn.execute(f'SELECT state FROM "{schema}".aside WHERE key = %s', ["s1"]).fetchone()
    assert row is not None
    lines = [msgspec.json.decode(line) for line in bytes(row[0]).split(b"\n")]
    assert [line["kind"] for line in lines] == ["compaction", "message"]
    assert lines[1]["message"]["content"] == "m2"


# -- idle losses, damage, large sessions ---------------------------------------------


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
    session.grow(first, 2, 1)
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
        assert store.commit("big", meta(seq, key="big"), staged, expected=prev(seq)) > 150 << 20
        times.append(time.perf_counter() - t0)
        store._tracks.clear()  # the second is a compaction again, over the first
    with capsys.disabled():
        print(f"\n200 MB compaction: {times[0]:.2f} s, again over it: {times[1]:.2f} s")
    assert load(store, "big") is not None


# -- written by a newer version ------------------------------------------------------


def _stored(pg: Cluster, schema: str) -> list[list[Any]]:
    """Every row of the schema's checkpoints, journal and aside tables."""
    queries = [
        "SELECT key, revision, format, meta::text, state, journal FROM {s}.checkpoints"
        " ORDER BY key",
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
