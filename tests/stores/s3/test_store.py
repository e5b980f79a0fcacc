"""The S3 stores against a real S3 protocol server (moto's, on 127.0.0.1), through a proxy.

Fencing by conditional PUTs, a write whose answer was lost, deletes, and
the journal's segments (uploads, compaction, sweeps); the faults are in
``tests/stores/s3/test_faults.py``.  Skips only where moto cannot be imported.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import anyio
import pytest

from checkpointer import (
    CheckpointError,
    CheckpointWriter,
    Failed,
    Meta,
    Skipped,
    Snapshot,
    Written,
    load,
)
from checkpointer._stores.base import StaleWrite, new_revision
from checkpointer._stores.envelopes import state_store
from checkpointer._stores.s3 import journal as s3journal
from tests.s3 import Place, unconditional

KINDS = ["s3", "s3journal"]


@pytest.fixture
def place() -> Iterator[Place]:
    p = Place()
    yield p
    p.close()


def messages(n: int, start: int = 0) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"message {i}"} for i in range(start, start + n)]


def writer(store: Any, key: str, state: dict[str, Any], **kw: Any) -> CheckpointWriter[Any]:
    kw.setdefault("exit_hooks", False)
    return CheckpointWriter(lambda: Snapshot(key, state), store, **kw)


async def saved(w: CheckpointWriter[Any]) -> None:
    """The state is stored: written now, or at the writer's open (then unchanged)."""
    result = await w.write_now()
    assert isinstance(result, Written) or result == Skipped("unchanged"), result
    assert isinstance(w.statistics().last_result, Written | Skipped)


# -- one process -------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_writes_load_back_and_resume_from_another_store_object(place: Place, kind: str) -> None:
    """A session written, loaded through a new store object, resumed and written on."""
    state = {"messages": messages(3)}

    async def first() -> None:
        async with writer(place.store(kind), "chat", state) as w:
            state["messages"].append({"role": "assistant", "content": "four"})
            assert isinstance(await w.write_now(), Written)

    anyio.run(first)
    other = place.store(kind)
    loaded = load(other, "chat")
    assert loaded is not None and loaded.state == state
    assert other.revision("chat") == loaded.meta.revision  # a HEAD says the same
    assert other.keys() == ["chat"]
    resumed = {"messages": loaded.state["messages"]}

    async def second() -> None:
        async with writer(other, "chat", resumed, resume_from=loaded) as w:
            resumed["messages"].append({"role": "user", "content": "five"})
            assert isinstance(await w.write_now(), Written)

    anyio.run(second)
    again = load(place.store(kind), "chat")
    assert again is not None and again.state == resumed and again.meta.live is False


@pytest.mark.parametrize("kind", KINDS)
def test_a_stale_writer_is_a_conflict_naming_the_other_and_replaces_nothing(
    place: Place, kind: str
) -> None:
    """B resumes from an empty load after A wrote: Failed("conflict") naming A; A's work stays."""
    a_state = {"messages": messages(2)}
    b_state = {"messages": messages(1, 100)}

    async def run() -> None:
        async with writer(place.store(kind), "k", a_state) as a:
            await saved(a)
            async with writer(place.store(kind), "k", b_state, resume_from=None) as b:
                refused = await b.write_now()
                assert isinstance(refused, Failed) and refused.reason == "conflict", refused
                assert f"pid {os.getpid()}" in refused.error and "another writer" in refused.error
                a_state["messages"].append({"role": "user", "content": "more"})
                assert isinstance(await a.write_now(), Written)  # A goes on

    anyio.run(run)
    stored = load(place.store(kind), "k")
    assert stored is not None and stored.state == a_state


@pytest.mark.parametrize("kind", KINDS)
def test_the_mutant_that_puts_unconditionally_replaces_the_other_writers_work(
    place: Place, kind: str
) -> None:
    """The same story with a store whose PUTs carry no condition: A's work is lost (the
    fencing above is what prevents it)."""
    a_state = {"messages": messages(2)}
    b_state = {"messages": messages(1, 100)}

    async def run() -> None:
        async with writer(place.store(kind), "k", a_state) as a:
            await saved(a)
        mutant = place.store(kind)
        unconditional(mutant)
        async with writer(mutant, "k", b_state, resume_from=None) as b:
            await saved(b)

    anyio.run(run)
    stored = load(place.store(kind), "k")
    assert stored is not None and stored.state == b_state  # A's checkpoint replaced


def test_conditional_puts_decide_every_case_of_the_contract(place: Place) -> None:
    """None expected on a new key writes; again refused; R expected with R stored writes;
    a stale R refused naming what is stored; the same write again is 'landed'."""
    store = place.store("s3")
    r1, r2, r3 = new_revision(), new_revision(), new_revision()
    body = [b'{"format":1}']
    store.write("k", body, revision=r1, expected=None)
    with pytest.raises(StaleWrite) as refused:
        store.write("k", body, revision=r2, expected=None)
    assert refused.value.stored == r1
    store.write("k", body, revision=r2, expected=r1)
    fresh = place.store("s3")  # no ETag remembered: learnt by a HEAD
    with pytest.raises(StaleWrite) as stale:
        fresh.write("k", body, revision=r3, expected=r1)
    assert (stale.value.expected, stale.value.stored) == (r1, r2)
    assert fresh.write("k", body, revision=r2, expected=r1) == len(body[0])  # landed already
    assert fresh.revision("k") == r2


def _meta(key: str, seq: int) -> Meta:
    now = datetime.now(UTC)
    return Meta(
        key=key, seq=seq, created_at=now, updated_at=now, live=True, revision=new_revision()
    )


@pytest.mark.parametrize("kind", KINDS)
def test_a_put_whose_answer_was_lost_is_recognised_as_this_writes_own(
    place: Place, kind: str
) -> None:
    """The server stores the PUT but its answer never arrives; botocore's retry meets 412
    against the store's own new ETag: the commit returns as written, no StaleWrite."""
    store = place.store(kind)
    states = state_store(store)
    first, second = _meta("k", 1), _meta("k", 2)
    states.commit("k", first, states.stage("k", {"messages": messages(2)}, None), expected=None)
    client = store.s3.client()
    put = client.put_object
    lost: list[str] = []

    def put_object(**params: Any) -> Any:
        answer = put(**params)
        if "IfMatch" in params and not lost:  # landed; the answer lost on the way back
            lost.append(params["Key"])
            return put(**params)  # botocore's retry of the same request: 412
        return answer

    client.put_object = put_object
    staged = states.stage("k", {"messages": messages(3)}, None)
    states.commit("k", second, staged, expected=first.revision)
    assert lost and store.revision("k") == second.revision
    loaded = load(place.store(kind), "k")
    assert loaded is not None and loaded.state == {"messages": messages(3)}


@pytest.mark.parametrize("kind", KINDS)
def test_a_writer_whose_key_was_deleted_never_brings_it_back(place: Place, kind: str) -> None:
    """store.delete() under a live writer: its next write is Failed('conflict', 'was
    deleted'); the key stays gone."""
    state = {"messages": messages(2)}

    async def run() -> None:
        async with writer(place.store(kind), "k", state) as w:
            await saved(w)
            assert place.store(kind).delete("k") is True
            state["messages"].append({"role": "user", "content": "after"})
            refused = await w.write_now()
            assert isinstance(refused, Failed) and refused.reason == "conflict"
            assert "was deleted" in refused.error

    anyio.run(run)
    store = place.store(kind)
    assert load(store, "k") is None and store.keys() == []
    assert store.delete("k") is False
    if kind == "s3journal":
        assert store.listing("k.segments/") == []  # the segments went with the head


# -- the journal -------------------------------------------------------------------


def test_a_journal_checkpoint_uploads_one_segment_and_the_head(place: Place) -> None:
    """Adding a message to a 1,000-message session: two PUTs (the segment, the head) whose
    bytes are a small fraction of the session; S3Store uploads it all."""
    sent: dict[str, tuple[int, int]] = {}
    for kind in KINDS:
        state = {"messages": messages(1000)}

        async def run(kind: str = kind, state: dict[str, Any] = state) -> None:
            async with writer(place.store(kind), "k" + kind, state) as w:
                await w.write_now()
                state["messages"].append({"role": "user", "content": "one more"})
                assert isinstance(await w.write_now(), Written)  # warm: the track is known
                state["messages"].append({"role": "user", "content": "and one more"})
                place.proxy.reset_counts()
                assert isinstance(await w.write_now(), Written)
                requests, nbytes, _ = place.proxy.counts()
                sent[kind] = (requests, nbytes)

        anyio.run(run)
    assert sent["s3journal"][0] == 2, sent
    assert sent["s3"][0] == 1, sent
    assert sent["s3journal"][1] * 10 < sent["s3"][1], sent


def test_a_meta_only_change_of_a_journal_is_one_put_of_the_head(place: Place) -> None:
    """write_now(pin=True) with the messages unchanged: the head alone (no empty segment)."""
    store = place.store("s3journal")
    state = {"messages": messages(3)}

    async def run() -> None:
        async with writer(store, "k", state) as w:
            await saved(w)
            state["messages"].append({"role": "user", "content": "one more"})
            assert isinstance(await w.write_now(), Written)  # the track is known
            place.proxy.reset_counts()
            assert isinstance(await w.write_now(pin=True), Written)
            assert place.proxy.counts()[0] == 1

    anyio.run(run)
    loaded = load(place.store("s3journal"), "k")
    assert loaded is not None and loaded.meta.pinned and loaded.state == state


def test_a_journal_compacts_at_max_segments_and_removes_what_it_replaced(place: Place) -> None:
    """With max_segments=3 the head never names more than 3 segments; replaced ones are
    deleted; every state loads whole."""
    store = place.store("s3journal", max_segments=3)
    state = {"messages": messages(1)}

    async def run() -> None:
        async with writer(store, "k", state) as w:
            for i in range(8):
                state["messages"].append({"role": "user", "content": f"turn {i}"})
                assert isinstance(await w.write_now(), Written)
                head = store._get_head("k")
                assert head is not None and 1 <= len(head.segments) <= 3
                listed = {name.rsplit("/", 1)[1] for name, *_ in store.listing("k.segments/")}
                assert listed == {name for name, _ in head.segments}
                loaded = load(place.store("s3journal"), "k")
                assert loaded is not None and loaded.state == state

    anyio.run(run)
    assert store.compactions >= 2 and store.appends >= 4


def test_segments_no_head_names_are_swept_once_old_enough(
    place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An orphan segment (a crash between segment and head) is removed at the next open
    once older than GRACE; the segments the head names are kept."""
    store = place.store("s3journal")
    state = {"messages": messages(3)}

    async def write() -> None:
        async with writer(store, "k", state) as w:
            await saved(w)

    anyio.run(write)
    orphan = "k.segments/000000000099-orphan.jsonl"
    place.server.client().put_object(Bucket=place.bucket, Key="agents/" + orphan, Body=b"{}\n")
    fresh = place.store("s3journal")
    fresh.read_meta("k")
    assert orphan in {item.name for item in fresh.listing("k.segments/")}  # young: kept
    monkeypatch.setattr(s3journal, "GRACE", 0.0)
    fresh = place.store("s3journal")
    fresh.read_meta("k")
    assert orphan not in {item.name for item in fresh.listing("k.segments/")}
    loaded = load(fresh, "k")
    assert loaded is not None and loaded.state == state


def test_a_missing_segment_is_a_checkpoint_error_naming_it(place: Place) -> None:
    """A head naming a segment that is gone (and stays gone) cannot be trusted."""
    store = place.store("s3journal")
    state = {"messages": messages(2)}

    async def write() -> None:
        async with writer(store, "k", state) as w:
            await saved(w)

    anyio.run(write)
    head = store._get_head("k")
    assert head is not None
    name = head.segments[0][0]
    place.server.client().delete_object(Bucket=place.bucket, Key=f"agents/k.segments/{name}")
    with pytest.raises(CheckpointError, match=f"segment k.segments/{name}.*missing"):
        load(place.store("s3journal"), "k")
