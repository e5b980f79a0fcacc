"""PostgresStore with encryption, on a private cluster: the tampering cases of every store."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from checkpointer import CheckpointError, PostgresStore, load
from checkpointer.stores import Encryption
from tests.pg import Cluster
from tests.stores import sealed_cases
from tests.stores.postgres.test_store import cluster, pg, pytestmark, schema  # noqa: F401


class PgRig:
    """The sealed cases' access to a schema's rows (``tests/stores/sealed_cases.py``)."""

    def __init__(self, server: Cluster, name: str) -> None:
        self.dsn, self.schema = server.dsn(), name
        self.made: list[PostgresStore] = []

    def store(self, encryption: Encryption | None) -> PostgresStore:
        self.made.append(PostgresStore(self.dsn, schema=self.schema, encryption=encryption))
        return self.made[-1]

    def _sql(self, sql: str, *args: object) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cursor = conn.execute(sql.replace("{s}", self.schema), args)
            return cursor.fetchall() if cursor.description else []

    def get(self, key: str) -> bytes:
        state = self._sql("SELECT state FROM {s}.checkpoints WHERE key = %s", key)[0][0]
        assert isinstance(state, bytes)
        return state

    def put(self, key: str, data: bytes) -> None:
        self._sql("UPDATE {s}.checkpoints SET state = %s WHERE key = %s", data, key)

    def copy(self, src: str, dst: str) -> None:  # the checkpoints row
        self._sql(
            "UPDATE {s}.checkpoints d SET revision = c.revision, meta = c.meta, state = c.state "
            "FROM {s}.checkpoints c WHERE c.key = %s AND d.key = %s",
            src,
            dst,
        )


@pytest.fixture
def rig(pg: Cluster, schema: str) -> Iterator[PgRig]:  # noqa: F811
    made = PgRig(pg, schema)
    yield made
    for store in made.made:
        store.close()


@pytest.mark.parametrize("case", sealed_cases.CASES)
def test_tampering_is_refused(rig: PgRig, case: Callable[[PgRig], None]) -> None:
    """A flipped byte, a row swapped between keys, plaintext planted, a cut state."""
    case(rig)


@sealed_cases.WRONG
def test_a_writer_with_the_wrong_key_leaves_the_row(
    rig: PgRig, wrong: Callable[[], Encryption | None]
) -> None:
    """Never moved aside nor replaced: the write fails and the row is as it was."""
    sealed_cases.wrong_key_writer(rig, wrong)


def test_a_meta_column_with_a_revision_of_another_type_is_a_checkpoint_error(
    rig: PgRig,
) -> None:
    """Edited by hand: load raises CheckpointError naming the row, not msgspec's error."""
    sealed_cases.save(rig.store(sealed_cases.enc()))
    rig._sql("UPDATE {s}.checkpoints SET meta = jsonb_set(meta, '{revision}', '5')")
    with pytest.raises(CheckpointError, match="meta column"):
        load(rig.store(sealed_cases.enc()), "s1")
