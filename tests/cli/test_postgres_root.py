"""The ``checkpointer`` console script with a PostgreSQL URI as ROOT, on a real cluster."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import pytest

from checkpointer import FileStore, Meta, PostgresJournalStore, PostgresStore, load
from checkpointer._cli import main as cli_main
from checkpointer._format.envelope import envelope_chunks
from tests.cli.test_commands import cli, cli_all
from tests.pg import PASSWORD, USER, Cluster
from tests.stores.postgres import test_store as _pg

pytestmark = _pg.pytestmark
cluster = _pg.cluster
pg = _pg.pg
schema = _pg.schema

NOW = datetime.now(UTC)
OLD = NOW - timedelta(days=30)


def meta(key: str, seq: int, *, when: datetime = NOW, pinned: bool = False) -> Meta:
    return Meta(
        key=key,
        seq=seq,
        created_at=when,
        updated_at=when,
        live=False,
        pinned=pinned,
        revision=f"r{seq}",
    )


def put(store: Any, meta: Meta, state: bytes, *, expected: str | None = None) -> None:
    """Write ``state`` as ``meta``'s checkpoint, over revision ``expected``."""
    chunks = envelope_chunks(meta, state)
    store.write(meta.key, chunks, revision=meta.revision, expected=expected)


def chat(n: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Find the bug in parser.py"}]
    messages += [{"role": "assistant", "content": f"step {i}"} for i in range(n)]
    return {"messages": messages}


@pytest.fixture
def fleet(pg: Cluster, schema: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A store with a journal key, old snapshot keys (one pinned, one locked), a bad history."""
    monkeypatch.setenv("PGPASSWORD", PASSWORD)
    journal = PostgresJournalStore(pg.dsn(), schema=schema)
    state = chat(2)
    journal.commit("alpha", meta("alpha", 1), journal.stage("alpha", state), expected=None)
    state["messages"].append({"role": "assistant", "content": "the last word"})
    journal.commit("alpha", meta("alpha", 2), journal.stage("alpha", state), expected="r1")
    plain = PostgresStore(pg.dsn(), schema=schema)
    for key, pinned in [("old", False), ("pinned", True), ("held", False)]:
        put(plain, meta(key, 1, when=OLD, pinned=pinned), b'{"v":1}')
    bad = {"messages": [{"role": "tool", "content": "no call", "tool_call_id": "c1"}]}
    put(plain, meta("bad", 1), json.dumps(bad).encode())
    plain.close()  # its writes took the keys' locks: give them back
    holder = PostgresStore(pg.dsn(), schema=schema)
    assert holder.acquire("held") is None  # a live writer's key
    yield f"postgresql://{USER}@127.0.0.1:{pg.port}/postgres"
    for store in (journal, holder):
        store.close()


def test_ls_show_verify_read_rows_through_the_store(fleet: str, schema: str) -> None:
    """ls, show and verify take a postgresql:// ROOT: journal and snapshot rows alike."""
    ls, js, show, verify = cli_all(
        ["ls", fleet, "--schema", schema],
        ["ls", fleet, "--schema", schema, "--json"],
        ["show", fleet, "alpha", "--schema", schema, "--last", "1"],
        ["verify", fleet, "--schema", schema],
    )
    assert ls.returncode == 0, ls.stderr
    lines = ls.stdout.splitlines()
    assert lines[0].split()[:3] == ["KEY", "UPDATED", "(UTC)"]
    assert [line.split()[0] for line in lines[1:]] == ["alpha", "bad", "held", "old", "pinned"]
    (alpha,) = [line for line in lines if line.startswith("alpha")]
    assert "Find the bug in parser.py" in alpha
    (held,) = [line for line in lines if line.startswith("held")]
    assert held.split()[-1] == "alive"
    rows = {r["key"]: r for r in json.loads(js.stdout)}
    assert rows["alpha"]["messages"] == 4 and rows["alpha"]["seq"] == 2
    assert rows["held"]["lock"] == "alive" and "pid" in rows["held"]["lock_holder"]
    assert rows["old"]["lock"] is None and rows["alpha"]["lock"] == "alive"  # journal's writer
    assert show.returncode == 0, show.stderr
    assert "assistant: the last word" in show.stdout and re.search(
        r"^messages +4$", show.stdout, re.M
    )
    assert f"/{schema}/alpha" in show.stdout
    assert verify.returncode == 1
    assert f"BAD  postgresql://{USER}@127.0.0.1:" in verify.stdout
    assert "5 checkpoint(s): 4 ok, 1 bad" in verify.stdout
    for done in (ls, js, show, verify):
        assert PASSWORD not in done.stdout + done.stderr


def test_prune_deletes_old_rows_whose_lock_is_free(fleet: str, schema: str) -> None:
    """prune removes old, unpinned keys it can lock; a live writer's key and a pinned one stay."""
    dry = cli("prune", fleet, "--schema", schema, "--older-than", "7d", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would remove" in dry.stdout and "/old (updated" in dry.stdout
    done = cli("prune", fleet, "--schema", schema, "--older-than", "7d")
    assert done.returncode == 0, done.stderr
    assert f"/{schema}/pinned: pinned" in done.stdout
    assert f"/{schema}/held: its lock holder is alive" in done.stdout
    assert "removed 1 checkpoint(s) older than 7d, kept 2" in done.stdout
    after = cli("ls", fleet, "--schema", schema, "--json")
    assert sorted(r["key"] for r in json.loads(after.stdout)) == ["alpha", "bad", "held", "pinned"]


def test_prune_summaries_and_corrupt_flags_have_nothing_to_do(fleet: str, schema: str) -> None:
    """--summaries/--corrupt over PostgreSQL: accepted, said to have nothing to do; prune runs."""
    done = cli("prune", fleet, "--schema", schema, "--older-than", "7d", "--summaries", "--corrupt")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("--summaries, --corrupt: nothing to do, postgresql://")
    assert lines[0].endswith(
        f"/{schema} holds no summary checkpoints or corrupt files (a store directory does)"
    )
    assert lines[-1] == "removed 1 checkpoint(s) older than 7d, kept 2"


def test_unknown_key_and_unreachable_server_are_clear(fleet: str, schema: str) -> None:
    """A missing key suggests a close one; a server that is not there names the way out."""
    show, gone = cli_all(
        ["show", fleet, "alpah", "--schema", schema],
        ["ls", "postgres://nobody@127.0.0.1:1/x", "--schema", schema],
    )
    assert show.returncode == 1 and "did you mean 'alpha'?" in show.stderr
    assert gone.returncode == 1
    assert "cannot connect to PostgreSQL at postgresql://nobody@127.0.0.1:1/x" in gone.stderr


def test_dsn_option_stands_in_for_root(fleet: str, schema: str, pg: Cluster) -> None:
    """--dsn takes a key=value connection string; ROOT is still required without it."""
    ls, show, both, neither = cli_all(
        ["ls", "--dsn", pg.dsn(), "--schema", schema],
        ["show", "--dsn", pg.dsn(), "alpha", "--schema", schema, "--last", "1"],
        ["verify", fleet, "--dsn", pg.dsn()],
        ["verify"],
    )
    assert ls.returncode == 0, ls.stderr
    assert [line.split()[0] for line in ls.stdout.splitlines()[1:]][:2] == ["alpha", "bad"]
    assert show.returncode == 0 and "assistant: the last word" in show.stdout
    assert PASSWORD not in ls.stdout + show.stdout + ls.stderr + show.stderr
    assert both.returncode == 2 and "give ROOT or --dsn, not both" in both.stderr
    assert neither.returncode == 2
    assert "checkpointer verify: error: the following arguments are required: ROOT" in (
        neither.stderr
    )


def test_a_row_with_timestamps_without_a_zone(fleet: str, schema: str, pg: Cluster) -> None:
    """A row whose meta times have no zone (hand-written; load accepts them) is read as
    UTC: ls sorts it among the others, prune ages it; no traceback."""
    naive = (OLD.replace(tzinfo=None)).isoformat()
    meta = {"key": "naive", "seq": 1, "created_at": naive, "updated_at": naive, "live": False}
    store = PostgresStore(pg.dsn(), schema=schema)
    envelope = json.dumps({"format": 1, "meta": meta, "state": {}}).encode()
    store.write("naive", [envelope], revision="r1", expected=None)
    store.close()
    ls, prune = cli_all(
        ["ls", fleet, "--schema", schema, "--sort", "updated"],
        ["prune", fleet, "--schema", schema, "--older-than", "7d", "--dry-run"],
    )
    assert ls.returncode == 0, ls.stderr
    assert f"{OLD:%Y-%m-%d %H:%M:%S}" in ls.stdout
    assert prune.returncode == 0, prune.stderr
    assert f"would remove postgresql://{USER}@127.0.0.1:{pg.port}/postgres/{schema}/naive" in (
        prune.stdout
    )


def damage(pg: Cluster, schema: str, key: str) -> None:
    """Garble the last row of a journal key (not what a crash can do: rows are transactional)."""
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute(
            f'UPDATE "{schema}".journal SET body = %s WHERE key = %s AND n = '
            f'(SELECT max(n) FROM "{schema}".journal WHERE key = %s)',
            [b"{garbled", key, key],
        )


def test_a_damaged_journal_key_is_reported_not_a_traceback(
    fleet: str, schema: str, pg: Cluster
) -> None:
    """ls, ls --json, show and prune report a garbled row as for a file; prune goes on."""
    damage(pg, schema, "alpha")
    plain = PostgresStore(pg.dsn(), schema=schema)
    for n in range(10):  # more old keys after the damaged one, all to be pruned
        put(plain, meta(f"z{n}", 1, when=OLD), b'{"v":1}')
    plain.close()
    ls, js, show, raw = cli_all(
        ["ls", fleet, "--schema", schema],
        ["ls", fleet, "--schema", schema, "--json"],
        ["show", fleet, "alpha", "--schema", schema],
        ["show", fleet, "alpha", "--schema", schema, "--raw"],
    )
    for done in (ls, js, show, raw):
        assert "Traceback" not in done.stderr, done.stderr
    assert ls.returncode == js.returncode == 1  # a key that cannot be read
    (alpha,) = [line for line in ls.stdout.splitlines() if line.startswith("alpha")]
    assert "! line 3 is not a journal row" in alpha
    assert "1 key(s) cannot be read" in ls.stdout
    rows = {r["key"]: r for r in json.loads(js.stdout)}
    assert "line 3 is not a journal row" in rows["alpha"]["error"]
    assert show.returncode == raw.returncode == 1
    assert f"/{schema}/alpha: line 3 is not a journal row" in show.stderr + raw.stderr
    done = cli("prune", fleet, "--schema", schema, "--older-than", "7d")
    assert done.returncode == 0, done.stderr
    assert "removed 11 checkpoint(s) older than 7d, kept 2" in done.stdout
    after = cli("ls", fleet, "--schema", schema, "--json")
    assert sorted(r["key"] for r in json.loads(after.stdout)) == ["alpha", "bad", "held", "pinned"]


def test_prune_keeps_a_key_written_after_it_was_listed(
    fleet: str, schema: str, pg: Cluster, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """A session resumed and written between prune's listing and its lock is not removed."""
    acquire = PostgresStore.acquire

    def resumed_first(self: PostgresStore, key: str) -> str | None:
        if key == "old":  # a writer resumes it just before prune takes its lock
            with PostgresStore(pg.dsn(), schema=schema) as writer:
                assert acquire(writer, key) is None
                put(writer, meta(key, 2), b'{"v":2}', expected="r1")
                # Given back on the server now: a closed connection's backend may
                # hold its advisory locks a moment longer ("its lock holder is alive").
                writer.release(key)
        return acquire(self, key)

    monkeypatch.setattr(PostgresStore, "acquire", resumed_first)
    assert cli_main(["prune", fleet, "--schema", schema, "--older-than", "7d"]) == 0
    out = capsys.readouterr().out
    assert f"/{schema}/old: written since it was listed" in out
    checkpoint = load(PostgresStore(pg.dsn(), schema=schema), "old")
    assert checkpoint is not None and checkpoint.meta.seq == 2


# -- one command, two roots ------------------------------------------------------


def the_same_keys(store: FileStore | PostgresStore) -> None:
    """A history, a bad one, an old key, an old pinned one: the same envelopes."""
    bad = {"messages": [{"role": "tool", "content": "no call", "tool_call_id": "c1"}]}
    for key, when, pinned, state in [
        ("alpha", NOW, False, chat(3)),
        ("bad", NOW, False, bad),
        ("old", OLD, False, chat(1)),
        ("pinned", OLD, True, {"v": 1}),
    ]:
        put(store, meta(key, 4, when=when, pinned=pinned), json.dumps(state).encode())


def test_a_directory_and_a_server_say_the_same(
    pg: Cluster, schema: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ls, ls --json, show, verify and prune say the same of the same keys in a
    directory and in PostgreSQL, but for each root's words for its own things."""
    the_same_keys(FileStore(tmp_path))
    with PostgresStore(pg.dsn(), schema=schema) as store:
        the_same_keys(store)  # closed: its writes' locks given back
    location = f"postgresql://{USER}@127.0.0.1:{pg.port}/postgres/{schema}/"
    roots = {
        "dir": ([str(tmp_path)], f"{tmp_path}/"),
        "pg": (["--dsn", pg.dsn(), "--schema", schema], location),
    }
    commands = [
        ["ls"],
        ["ls", "--json"],
        ["show", "alpha", "--last", "2"],
        ["verify"],
        ["prune", "--older-than", "7d", "--dry-run"],
        ["prune", "--older-than", "7d"],
        ["ls"],
    ]
    said: dict[str, list[tuple[int, list[str]]]] = {"dir": [], "pg": []}
    for name, (root, where) in roots.items():
        for command in commands:
            status = cli_main([command[0], *root, *command[1:]])
            out, err = capsys.readouterr()
            assert not err, err
            out = out.replace(where, "ROOT/").replace(".json", "")
            out = re.sub(r"\d+(\.\d)? (B|KiB)", "SIZE", out)  # an envelope of jsonb's spacing
            said[name].append((status, [" ".join(line.split()) for line in out.splitlines()]))
    (ls, js, show, verify, dry, prune, after) = zip(said["dir"], said["pg"], strict=True)
    for dir_, pg_ in (ls, verify, after):
        assert dir_ == pg_
    assert [s for s, _ in verify] == [1, 1] and "4 checkpoint(s): 3 ok, 1 bad" in verify[0][1]
    rows = [json.loads("\n".join(lines)) for _, lines in js]
    for row in (*rows[0], *rows[1]):
        del row["kind"], row["size"], row["mtime"]  # a file's, or the row's update time
    assert rows[0] == rows[1] and len(rows[0]) == 4
    (_, dir_show), (_, pg_show) = show
    assert dir_show[:2] == ["file ROOT/alpha (SIZE, snapshot)", "lock none"]
    assert pg_show[:2] == ["row ROOT/alpha (SIZE)", "lock free"]
    assert dir_show[2:] == pg_show[2:] and "[3] assistant: step 2" in dir_show
    for verb, ((dir_status, dir_lines), (pg_status, pg_lines)) in [
        ("would remove", dry),
        ("removed", prune),
    ]:
        assert dir_status == pg_status == 0
        assert (
            dir_lines[:-1]
            == pg_lines[:-1]
            == [
                f"{verb} ROOT/old (updated 30d ago)",
                "kept ROOT/pinned: pinned (updated 30d ago)",
            ]
        )
    assert dry[0][1][-1] == "would remove 1 file(s) older than 7d and 0 stale lock file(s), kept 1"
    assert dry[1][1][-1] == "would remove 1 checkpoint(s) older than 7d, kept 1"
    assert [line.split()[0] for line in after[0][1][1:]] == ["alpha", "bad", "pinned"]


def test_rows_whose_key_breaks_the_key_rule_are_reported_escaped(
    fleet: str, schema: str, pg: Cluster
) -> None:
    """Rows whose key no writer can use (put there by SQL) are listed escaped as unreadable
    by ls, ls --json, show and verify, as a damaged file is; prune goes on past them and
    leaves them; no traceback, no raw control character on the terminal."""
    bad_keys = ["a/b", "with space", "", "esc\x1b]52;c;x\x07"]
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        for key in bad_keys:
            conn.execute(
                f'INSERT INTO "{schema}".checkpoints (key, revision, format, meta, state) '
                "VALUES (%s, 'sql', 1, %s, '{}')",
                [key, msgspec.json.encode(meta("x", 1, when=OLD)).decode()],
            )
    ls, js, show, verify = cli_all(
        ["ls", fleet, "--schema", schema],
        ["ls", fleet, "--schema", schema, "--json"],
        ["show", fleet, "a/b", "--schema", schema],
        ["verify", fleet, "--schema", schema],
    )
    for done in (ls, js, show, verify):
        assert "Traceback" not in done.stderr, done.stderr
        assert "\x1b" not in done.stdout + done.stderr
    assert ls.returncode == js.returncode == 1  # keys that cannot be read, as for files
    assert "4 key(s) cannot be read" in ls.stdout
    rows = {r["key"]: r for r in json.loads(js.stdout)}
    assert "esc\\x1b]52;c;x\\x07" in rows
    assert all(
        "a row no writer can use (invalid key" in rows[k]["error"]
        for k in rows
        if k in bad_keys or k.startswith("esc")
    )
    assert show.returncode == 1 and f"/{schema}/a/b: a row no writer can use" in show.stderr
    assert verify.returncode == 1
    done = cli("prune", fleet, "--schema", schema, "--older-than", "7d")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        keys = {k for (k,) in conn.execute(f'SELECT key FROM "{schema}".checkpoints')}
    assert "old" not in keys and set(bad_keys) <= keys  # the healthy old key pruned
