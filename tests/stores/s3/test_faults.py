"""The S3 stores under faults: outages, slow and hung endpoints, drops, bad setups, forks.

The faults are made by the tests' own proxy between the store and moto's
server (``tests/s3.py``): connections cut, answers late or never, an
upload cut halfway.  Skips only where moto cannot be imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import anyio
import pytest

from checkpointer import Failed, Limits, S3Store, Written, load
from checkpointer.stores import S3StoreError
from tests._support import ROOT, child_env
from tests.s3 import Place
from tests.stores.s3.test_store import KINDS, messages, saved, writer

GUARD = 60.0  # a hang guard for a child process, never a timing assertion


@pytest.fixture
def place() -> Iterator[Place]:
    p = Place()
    yield p
    p.close()


# -- the network ---------------------------------------------------------------------


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
    from tests.pg import free_port

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
    from tests.s3 import ENV, Server, start_error

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
    env = child_env(place.env)
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
