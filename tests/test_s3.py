"""The S3 stores against a real S3 protocol server (moto's, on 127.0.0.1), through a proxy.

Fencing by conditional PUTs, a write whose answer was lost, deletes,
the journal's segments (uploads, compaction, sweeps), outages and hangs
made by the tests' own proxy (``tests/s3.py``), bad buckets, endpoints
and credentials, and forks.  Skips only where moto cannot be imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from checkpointer import (
    CheckpointError,
    CheckpointWriter,
    Failed,
    Limits,
    Meta,
    S3Store,
    Skipped,
    Snapshot,
    Written,
    load,
)
from checkpointer._stores.base import StaleWrite, new_revision
from checkpointer._stores.envelopes import state_store
from checkpointer._stores.s3 import journal as s3journal
from checkpointer.stores import S3StoreError

from .s3 import Place, unconditional

ROOT = Path(__file__).resolve().parent.parent
KINDS = ["s3", "s3journal"]
GUARD = 60.0  # a hang guard for a child process, never a timing assertion


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
                listed = {name.rsplit("/", 1)[1] for name, _, _ in store.listing("k.segments/")}
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
    assert orphan in {name for name, _, _ in fresh.listing("k.segments/")}  # young: kept
    monkeypatch.setattr(s3journal, "GRACE", 0.0)
    fresh = place.store("s3journal")
    fresh.read_meta("k")
    assert orphan not in {name for name, _, _ in fresh.listing("k.segments/")}
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


# -- faults --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_an_outage_fails_writes_then_the_last_state_lands_once_the_endpoint_answers(
    place: Place, kind: str
) -> None:
    """The endpoint cut mid-session: writes are Failed (write-failed), the writer backs off
    (retry_initial=600 s) and the probe ends the wait once the proxy passes again."""
    state = {"messages": messages(2)}

    async def run() -> None:
        w = writer(place.store(kind), "k", state, limits=Limits(retry_initial=600, retry_max=600))
        async with w:
            await saved(w)
            place.proxy.cut()
            state["messages"].append({"role": "user", "content": "during the outage"})
            failed = await w.write_now()
            assert isinstance(failed, Failed) and failed.reason == "write-failed", failed
            assert "cannot reach" in failed.error
            w.notify()
            await anyio.sleep(0.5)
            place.proxy.heal()
            with anyio.fail_after(GUARD):  # a hang guard: the backoff alone is 600 s
                while not isinstance(w.statistics().last_result, Written):  # noqa: ASYNC110
                    await anyio.sleep(0.05)

    anyio.run(run)
    stored = load(place.store(kind), "k")
    assert stored is not None and stored.state == state


@pytest.mark.parametrize("kind", KINDS)
def test_a_drop_mid_upload_keeps_the_old_checkpoint_whole(place: Place, kind: str) -> None:
    """The connection cut halfway through a large PUT: that write fails or is retried;
    what is stored is the old state or the new one, whole, never a mix."""
    state = {"messages": messages(2)}
    store = place.store(kind)

    async def run() -> None:
        async with writer(store, "k", state) as w:
            await saved(w)
            before = load(place.store(kind), "k")
            state["messages"].append({"role": "user", "content": "x" * 200_000})
            place.proxy.drop_after = 100_000
            result = await w.write_now()
            stored = load(place.store(kind), "k")
            assert stored is not None and before is not None
            assert stored.state in (before.state, state), result
            if not isinstance(result, Written):
                assert isinstance(await w.write_now(), Written)

    anyio.run(run)
    stored = load(place.store(kind), "k")
    assert stored is not None and stored.state == state


@pytest.mark.parametrize("kind", KINDS)
def test_a_slow_endpoint_is_waited_for_and_a_flush_deadline_is_kept(
    place: Place, kind: str
) -> None:
    """Answers 0.3 s late: a write waits and lands; flush_sync under exit_timeout=0.1 s is
    Failed within its deadline (its request lands later, fenced); the next write lands."""
    state = {"messages": messages(2)}

    async def run() -> None:
        w = writer(place.store(kind), "k", state, limits=Limits(exit_timeout=0.1))
        async with w:
            await saved(w)
            place.proxy.delay = 0.3
            state["messages"].append({"role": "user", "content": "slow"})
            assert isinstance(await w.write_now(), Written)
            state["messages"].append({"role": "user", "content": "flushed"})
            flushed = w.flush_sync("signal")
            assert isinstance(flushed, Failed) and "exit_timeout" in flushed.error, flushed
            place.proxy.delay = 0.0
            await anyio.sleep(1.0)  # the abandoned request lands meanwhile
            state["messages"].append({"role": "user", "content": "after"})
            assert isinstance(await w.write_now(), Written)

    anyio.run(run)
    stored = load(place.store(kind), "k")
    assert stored is not None and stored.state == state


def test_bad_bucket_endpoint_and_credentials_say_so(place: Place) -> None:
    """A bucket that does not exist, an endpoint nothing listens on, no credentials at all:
    S3StoreError naming the bucket or endpoint and the way out."""
    from .pg import free_port

    with pytest.raises(S3StoreError, match=r"no bucket 'no-such-bucket-here'.*create it"):
        S3Store("no-such-bucket-here", endpoint_url=place.proxy.url).keys()
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(S3StoreError, match="cannot reach s3://"):
        S3Store(place.bucket, endpoint_url=dead, connect_timeout=1).revision("k")
    with pytest.raises(ValueError, match="invalid bucket name 'No_Such'"):
        S3Store("No_Such")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_CONFIG_FILE="/nonexistent",
        AWS_SHARED_CREDENTIALS_FILE="/nonexistent",
        AWS_EC2_METADATA_DISABLED="true",
        AWS_DEFAULT_REGION="us-east-1",
        PYTHONPATH=str(ROOT),
    )
    code = (
        "from checkpointer import S3Store\n"
        f"S3Store({place.bucket!r}, endpoint_url={place.proxy.url!r}).keys()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=GUARD
    )
    assert proc.returncode == 1
    assert "no AWS credentials found: set AWS_ACCESS_KEY_ID" in proc.stderr, proc.stderr


def test_refused_credentials_say_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that checks credentials (moto with INITIAL_NO_AUTH_ACTION_COUNT=0) refuses
    an unknown key: S3StoreError 'access denied ... check the credentials'."""
    from .s3 import ENV, Server, start_error

    if start_error() is not None:
        pytest.skip(start_error() or "")
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    server = Server(checks_credentials=True)
    server.start()
    try:
        store = S3Store("any-bucket", endpoint_url=server.url, connect_timeout=2)
        with pytest.raises(S3StoreError, match=r"access denied \(InvalidAccessKeyId\)"):
            store.keys()
    finally:
        server.stop()


@pytest.mark.parametrize("kind", KINDS)
def test_a_hung_endpoint_never_hangs_the_signal_flush(place: Place, kind: str) -> None:
    """A child whose endpoint accepts and never answers (read_timeout=300 s) gets SIGTERM:
    its exit flush gives up after exit_timeout and the process dies of the signal."""
    child = (
        "import os, sys, time, anyio\n"
        "from checkpointer import CheckpointWriter, Limits, Snapshot\n"
        "from tests.s3 import make_s3_store\n"
        "store = make_s3_store(sys.argv[1])\n"
        "store.s3.read_timeout = 300.0\n"
        "state = {'messages': [{'role': 'user', 'content': 'hello'}]}\n"
        "async def main():\n"
        "    w = CheckpointWriter(lambda: Snapshot('k', state), store, debounce=60,\n"
        "                         max_wait=60, limits=Limits(exit_timeout=1.0))\n"
        "    async with w:\n"
        "        await w.write_now()\n"
        "        state['messages'].append({'role': 'user', 'content': 'unsaved'})\n"
        "        print('ready', flush=True)\n"
        "        await anyio.sleep(3600)\n"
        "anyio.run(main)\n"
    )
    env = {**place.env, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", child, place.spec(kind)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        place.proxy.hang()
        proc.terminate()
        _, err = proc.communicate(timeout=GUARD)  # 300 s read timeout if unbounded
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == -15, err
    assert "no answer within the flush's timeout" in err, err


# -- forks ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_forked_child_writes_through_the_store_it_inherited(place: Place, kind: str) -> None:
    """The parent uses the store, forks; the child writes another key through the same
    object (a client of its own) and exits; the parent's client still works."""
    store = place.store(kind)
    state = {"messages": messages(2)}

    async def write(key: str) -> None:
        async with writer(store, key, state) as w:
            await saved(w)

    anyio.run(write, "parent")
    parent_client = store.s3.client()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            anyio.run(write, "child")
            code = 0 if store.s3.client() is not parent_client else 3
            store = place.store(kind)  # and a store made in the child
            anyio.run(write, "child2")
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store.s3.client() is parent_client
    state["messages"].append({"role": "user", "content": "parent again"})
    anyio.run(write, "parent2")
    assert store.keys() == ["child", "child2", "parent", "parent2"]
