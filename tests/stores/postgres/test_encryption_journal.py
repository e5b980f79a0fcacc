"""PostgresJournalStore with encryption, on a private cluster: the tampering cases of every
store, and those of a journal kept under a head (rows moved, dropped, replayed)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from checkpointer import PostgresJournalStore
from checkpointer.stores import Encryption
from tests.pg import Cluster
from tests.stores import sealed_cases
from tests.stores.postgres.test_store import cluster, pg, pytestmark, schema  # noqa: F401


class PgJournalRig:
    journal = True

    def __init__(self, server: Cluster, name: str) -> None:
        self.dsn, self.schema = server.dsn(), name
        self.made: list[PostgresJournalStore] = []

    def store(self, encryption: Encryption | None, **kw: Any) -> PostgresJournalStore:
        made = PostgresJournalStore(self.dsn, schema=self.schema, encryption=encryption, **kw)
        self.made.append(made)
        return made

    def _sql(self, sql: str, *args: object) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cursor = conn.execute(sql.replace("{s}", self.schema), args)
            return cursor.fetchall() if cursor.description else []

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
        self._sql(
            "UPDATE {s}.checkpoints d SET revision = c.revision, meta = c.meta, state = c.state "
            "FROM {s}.checkpoints c WHERE c.key = %s AND d.key = %s",
            src,
            dst,
        )


@pytest.fixture
def rig(pg: Cluster, schema: str) -> Iterator[PgJournalRig]:  # noqa: F811
    made = PgJournalRig(pg, schema)
    yield made
    for store in made.made:
        store.close()


@pytest.mark.parametrize("case", sealed_cases.CASES + sealed_cases.HEADED_JOURNAL_CASES)
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
