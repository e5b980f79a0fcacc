"""PostgresJournalStore with encryption, on a private cluster: the tampering cases of every
store, and those of a journal kept under a head (rows moved, dropped, replayed)."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from checkpointer import PostgresJournalStore, PostgresStore, load
from checkpointer._cli import main
from checkpointer.stores import Encryption
from tests.pg import PASSWORD, USER, Cluster
from tests.stores import sealed_cases
from tests.stores.postgres.test_encryption import PgRig
from tests.stores.postgres.test_store import cluster, pg, pytestmark, schema  # noqa: F401


class PgJournalRig(PgRig):
    journal = True

    def store(self, encryption: Encryption | None, **kw: Any) -> PostgresJournalStore:
        made = PostgresJournalStore(self.dsn, schema=self.schema, encryption=encryption, **kw)
        self.made.append(made)
        return made

    def rows(self, key: str) -> list[bytes]:
        found = self._sql("SELECT body FROM {s}.journal WHERE key = %s ORDER BY n", key)
        return [bytes(row[0]) for row in found]

    def set_rows(self, key: str, rows: list[bytes]) -> None:
        kinds = ["compaction"] + ["message"] * (len(rows) - 1)
        self._sql("DELETE FROM {s}.journal WHERE key = %s", key)
        for n, (kind, body) in enumerate(zip(kinds, rows, strict=True), 1):
            self._sql("INSERT INTO {s}.journal VALUES (%s, %s, %s, %s)", key, n, kind, body)

    def get(self, key: str) -> bytes:  # the rows, one a line (a sealed row holds no newline)
        return b"\n".join(self.rows(key))

    def put(self, key: str, data: bytes) -> None:
        for n, body in enumerate(data.split(b"\n"), 1):
            self._sql("UPDATE {s}.journal SET body = %s WHERE key = %s AND n = %s", body, key, n)

    def copy(self, src: str, dst: str) -> None:  # the head and its rows
        self._sql("DELETE FROM {s}.journal WHERE key = %s", dst)
        self._sql(
            "INSERT INTO {s}.journal SELECT %s, n, kind, body FROM {s}.journal WHERE key = %s",
            dst,
            src,
        )
        super().copy(src, dst)


@pytest.fixture
def rig(pg: Cluster, schema: str) -> Iterator[PgJournalRig]:  # noqa: F811
    made = PgJournalRig(pg, schema)
    yield made
    for store in made.made:
        store.close()


@pytest.mark.parametrize("case", [*sealed_cases.CASES, *sealed_cases.HEADED_JOURNAL_CASES])
def test_tampering_is_refused(rig: PgJournalRig, case: Callable[[PgJournalRig], None]) -> None:
    """A flipped byte, a key's rows swapped for another's, plaintext planted, a row cut
    short, rows reordered, dropped or replayed from before a compaction."""
    case(rig)


@sealed_cases.WRONG
def test_a_writer_with_the_wrong_key_leaves_the_rows(
    rig: PgJournalRig, wrong: Callable[[], Encryption | None]
) -> None:
    """Never moved aside nor replaced: the write fails and the rows are as they were."""
    sealed_cases.wrong_key_writer(rig, wrong)


OLD, NEW = "old:" + "AQ" * 21 + "A=", Encryption.new_key("new")


def reencrypt(rig: PgJournalRig, tmp_path: Path, port: int, *args: str) -> tuple[int, str]:
    (tmp_path / "keys.txt").write_text(f"{NEW}\n{OLD}\n")
    root = f"postgresql://{USER}@127.0.0.1:{port}/postgres"
    argv = ["re-encrypt", root, "--schema", rig.schema, "--key-file", str(tmp_path / "keys.txt")]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        status = main([*argv, *args])
    return status, out.getvalue()


def test_re_encrypt_seals_journal_and_snapshot_keys_each_as_it_was(
    rig: PgJournalRig,
    pg: Cluster,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A journal key sealed with OLD is compacted at its revision with NEW (still a journal,
    its old rows gone); a snapshot row sealed again; a plaintext journal only with
    --plaintext; NEW alone opens everything after."""
    monkeypatch.setenv("PGPASSWORD", PASSWORD)
    old = Encryption.from_text(OLD)
    state = sealed_cases.chat(rig.store(old), 4, "chat")
    plain_state = sealed_cases.chat(rig.store(None), 2, "plain")
    snapshots = PostgresStore(rig.dsn, schema=rig.schema, encryption=old)
    sealed_cases.save(snapshots, "snap")
    snapshots.close()
    for store in rig.made:
        store.close()
    before = rig.store(old).revision("chat")
    status, out = reencrypt(rig, tmp_path, pg.port)
    assert status == 1 and "3 checkpoint(s): 2 sealed" in out and "plaintext" in out, out
    status, out = reencrypt(rig, tmp_path, pg.port, "--plaintext")
    assert status == 0 and "3 sealed" in out, out
    store = rig.store(Encryption.from_text(NEW))
    for key, expected in [("chat", state), ("plain", plain_state), ("snap", sealed_cases.STATE)]:
        loaded = load(store, key)
        assert loaded is not None and loaded.state == expected, key
    assert (store.is_journal("chat"), store.is_journal("plain"), store.is_journal("snap")) == (
        True,
        True,
        False,
    )
    assert store.revision("chat") == before
    assert len(rig.rows("chat")) == 1  # one compaction: the rows sealed with OLD are gone


def test_without_a_key_the_cli_lists_a_journal_key_as_encrypted(
    rig: PgJournalRig,
    pg: Cluster,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ls without a key: the key listed with its readable meta, said encrypted, never bad."""
    monkeypatch.setenv("PGPASSWORD", PASSWORD)
    monkeypatch.delenv("CHECKPOINTER_KEYS", raising=False)
    sealed_cases.chat(rig.store(Encryption.from_text(OLD)), 3, "chat")
    root = f"postgresql://{USER}@127.0.0.1:{pg.port}/postgres"
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        status = main(["ls", root, "--schema", rig.schema, "--json"])
    [row] = json.loads(out.getvalue())
    loaded = load(rig.store(Encryption.from_text(OLD)), "chat")
    assert loaded is not None
    assert status == 0 and row["seq"] == loaded.meta.seq and "encrypted" in json.dumps(row), row
    assert sealed_cases.SECRET not in out.getvalue()
