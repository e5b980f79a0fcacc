"""The S3 stores' move aside and a busy key, against a writer at the one moment that hurts.

Real requests to moto's server (``tests/s3.py``); the other writer's
requests are made from a hook on the store's own calls, so they land in
the window every run: a key created again between a move aside's read and
its DELETE, a key compacted each time a writer that expected none reads it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import anyio
import pytest

from checkpointer import CheckpointWriter, Failed, Meta, Snapshot, Written, load
from checkpointer._stores.base import new_revision
from checkpointer._stores.envelopes import state_store
from checkpointer._stores.s3 import journal as s3journal
from tests.s3 import Place


@pytest.fixture
def place() -> Iterator[Place]:
    p = Place()
    yield p
    p.close()


def messages(n: int, tag: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{tag} {i}"} for i in range(n)]


def write(store: Any, state: dict[str, Any], **options: Any) -> object:
    """A writer's first write of ``state`` at ``k``: what it was told."""

    async def run() -> object:
        w = CheckpointWriter(
            lambda: Snapshot("k", state), store, write_on_start=False, exit_hooks=False, **options
        )
        async with w:
            return await w.write_now()

    return anyio.run(run)


def before(store: Any, operation: str, action: Callable[[], None], *, times: int = 1) -> None:
    """Run ``action`` right before each of ``store``'s first ``times`` calls of ``operation``."""
    call = store.s3.call
    left = [times]

    def hooked(op: str, **params: Any) -> Any:
        if op == operation and left[0] > 0:
            left[0] -= 1
            action()
        return call(op, **params)

    store.s3.call = hooked


@pytest.mark.parametrize("kind", ["s3", "s3journal"])
def test_a_key_written_again_during_a_move_aside_keeps_its_checkpoint(
    place: Place, kind: str
) -> None:
    """A damaged checkpoint; B moves it aside and writes, told Written, while A is moving
    it aside (before A's DELETE): A deletes nothing, keeps no copy, says nothing moved."""
    name = f"agents/k.{'json' if kind == 's3' else 'journal'}"
    place.server.client().put_object(Bucket=place.bucket, Key=name, Body=b'{"format":1,"m')
    fresh = {"messages": messages(3, "B")}
    told: list[object] = []
    mover = place.store(kind)
    before(mover, "delete_object", lambda: told.append(write(place.store(kind), fresh)))
    moved = mover.move_aside("k", "corrupt-a")
    loaded = load(place.store(kind), "k")
    assert isinstance(told[0], Written) and loaded is not None and loaded.state == fresh
    assert moved is None
    asides = [item.name for item in place.store(kind).listing() if ".corrupt-" in item.name]
    assert len(asides) == 1 and asides != ["k.corrupt-a"]  # B's, of the damaged object
    aside = place.server.client().get_object(Bucket=place.bucket, Key=f"agents/{asides[0]}")
    assert aside["Body"].read() == b'{"format":1,"m'


def test_a_writer_refused_on_a_busy_key_it_expected_none_on_leaves_it_in_place(
    place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writes k, compacting each write; B, started with nothing to resume, is refused
    and reads k to see if it is damaged, but A compacts each time B reads, past B's
    patience: B's write is a conflict, and A's checkpoint is where it was, whole."""
    monkeypatch.setattr(s3journal, "_PATIENCE", 0.0)
    states = state_store(place.store("s3journal", max_segments=1))  # every commit compacts
    state = {"messages": messages(1, "A")}
    expected: list[str | None] = [None]

    def compact() -> None:
        state["messages"].append({"role": "user", "content": f"A {len(state['messages'])}"})
        now = datetime.now(UTC)
        meta = Meta(key="k", seq=len(state["messages"]), created_at=now, updated_at=now,
                    live=True, revision=new_revision())  # fmt: skip
        states.commit("k", meta, states.stage("k", state, None), expected=expected[0])
        expected[0] = meta.revision

    compact()
    b = place.store("s3journal")
    before(b, "get_object", compact, times=3)  # its read: the head, a segment, the head
    told = write(b, {"messages": messages(1, "B")}, resume_from=None)
    assert isinstance(told, Failed) and told.reason == "conflict", told
    loaded = load(place.store("s3journal"), "k")
    assert loaded is not None and loaded.state == state
    assert not [item for item in b.listing() if ".corrupt-" in item.name]
