"""The S3 stores' deletes and reads racing a writer, each at the one moment that can hurt.

Real requests to moto's server (``tests/s3.py``); the other writer's
requests are made from a hook on the store's own calls, so they land in
the window exactly, every run: a key created again between a delete's
head and its segments, a session resumed between prune's recheck and its
DELETE, compactions while a reader fetches the segments of a head.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import anyio
import pytest

from checkpointer import CheckpointError, CheckpointWriter, Meta, Snapshot, load
from checkpointer._cli import main
from checkpointer._stores.base import new_revision
from checkpointer._stores.envelopes import state_store
from checkpointer._stores.s3 import journal as s3journal
from checkpointer._stores.s3.client import S3Client
from tests.s3 import Place


@pytest.fixture
def place() -> Iterator[Place]:
    p = Place()
    yield p
    p.close()


def messages(n: int, tag: str = "m") -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{tag} {i}"} for i in range(n)]


def resume_and_write(store: Any, state: dict[str, Any]) -> None:
    """What a worker does: load the session, resume from it, write ``state``, close."""

    async def run() -> None:
        w = CheckpointWriter(
            lambda: Snapshot("k", state), store, resume_from=load(store, "k"), exit_hooks=False
        )
        async with w:
            await w.write_now()  # or written at the open already
        told = w.statistics()
        assert told.writes and not told.failures, told.last_result

    anyio.run(run)


def hook(store: Any, operation: str, action: Callable[[], None], *, times: int = 1) -> None:
    """Run ``action`` right after each of ``store``'s first ``times`` calls of ``operation``."""
    call = store.s3.call
    left = [times]

    def hooked(op: str, **params: Any) -> Any:
        answer = call(op, **params)
        if op == operation and left[0] > 0:
            left[0] -= 1
            action()
        return answer

    store.s3.call = hooked


def test_a_key_created_again_while_a_delete_runs_keeps_its_segments(place: Place) -> None:
    """A new session writes the key between the delete's removal of the head and of the
    segments: it was told Written, and it loads (the delete took only what its head named)."""
    resume_and_write(place.store("s3journal"), {"messages": messages(3, "old")})
    old = {item.name for item in place.store("s3journal").listing("k.segments/")}
    fresh = {"messages": messages(2, "new")}
    deleter = place.store("s3journal")
    hook(deleter, "delete_object", lambda: resume_and_write(place.store("s3journal"), fresh))
    assert deleter.delete("k") is True
    loaded = load(place.store("s3journal"), "k")
    assert loaded is not None and loaded.state == fresh
    left = {item.name for item in place.store("s3journal").listing("k.segments/")}
    assert left and not left & old  # the old session's segments went with its head


@pytest.mark.parametrize("kind", ["s3", "s3journal"])
def test_prune_keeps_a_session_resumed_and_written_after_its_recheck(
    place: Place, kind: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A worker resumes the session and writes after prune looked at it again and before
    its DELETE: the DELETE (If-Match on the ETag listed) is refused, and prune says kept."""
    resume_and_write(place.store(kind), {"messages": messages(3)})
    resumed = {"messages": messages(4)}
    call = S3Client.call
    writes = [lambda: resume_and_write(place.store(kind), resumed)]

    def before_delete(self: S3Client, operation: str, **params: Any) -> Any:
        if operation == "delete_object" and writes:
            writes.pop()()
        return call(self, operation, **params)

    monkeypatch.setattr(S3Client, "call", before_delete)
    root = f"s3://{place.bucket}/agents"
    assert main(["prune", root, "--older-than", "0s", "--endpoint-url", place.proxy.url]) == 0
    assert f"kept {root}/k.{'json' if kind == 's3' else 'journal'}: written since" in (
        capsys.readouterr().out
    )
    loaded = load(place.store(kind), "k")
    assert loaded is not None and loaded.state == resumed


def test_prune_on_a_prefix_shared_with_other_data_removes_only_old_checkpoints(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another application's config.json and notes.journal, and a head that does not
    decode, under the prefix: prune leaves them (no age of their own to trust), no error."""
    resume_and_write(place.store("s3"), {"messages": messages(1)})
    client = place.server.client()
    others = {"agents/config.json": b'{"db": "x"}', "agents/notes.journal": b"my own\n"}
    others["agents/bad.journal"] = b'{"format":1,"meta":{},"segments":[]}'
    for name, body in others.items():
        client.put_object(Bucket=place.bucket, Key=name, Body=body)
    root = f"s3://{place.bucket}/agents"
    assert main(["prune", root, "--older-than", "0s", "--endpoint-url", place.proxy.url]) == 0
    assert "removed 1 checkpoint(s)" in capsys.readouterr().out
    listed = {o["Key"] for o in client.list_objects_v2(Bucket=place.bucket)["Contents"]}
    assert listed == set(others)


def test_a_reader_reads_on_while_compactions_remove_the_segments_it_was_about_to_get(
    place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each time the reader has fetched the head, a compaction moves the head on and
    removes the segments that head named, five times in a row: the load is the newest
    state, not "missing".  Past the patience it says so (a TimeoutError), never damage."""
    writer = place.store("s3journal", max_segments=1)  # every commit compacts
    states = state_store(writer)
    state = {"messages": messages(1)}
    expected: list[str | None] = [None]

    def compact() -> None:
        state["messages"].append({"role": "user", "content": f"w {len(state['messages'])}"})
        now = datetime.now(UTC)
        meta = Meta(key="k", seq=len(state["messages"]), created_at=now, updated_at=now,
                    live=True, revision=new_revision())  # fmt: skip
        states.commit("k", meta, states.stage("k", state, None), expected=expected[0])
        expected[0] = meta.revision

    compact()
    reader = place.store("s3journal")
    hook(reader, "get_object", compact, times=10)  # the head's GET, then each segment's
    loaded = load(reader, "k")
    assert loaded is not None and loaded.state == state and writer.compactions > 4
    monkeypatch.setattr(s3journal, "_PATIENCE", 0.0)
    reader = place.store("s3journal")
    hook(reader, "get_object", compact)
    with pytest.raises(TimeoutError, match="compacted again") as refused:
        load(reader, "k")  # a busy key, no damage: not the CheckpointError of load()
    assert not isinstance(refused.value, CheckpointError)
    assert str(refused.value).count("k.journal") == 1 and "missing" not in str(refused.value)
