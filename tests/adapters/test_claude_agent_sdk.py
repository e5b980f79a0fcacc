"""checkpointer.claude_agent_sdk: the Claude Agent SDK's SessionStore over checkpointer keys.

The SDK drives its CLI through anyio, so these tests run on asyncio and
trio.  The SDK's own conformance suite runs against the adapter on both
file stores; the tests with the real CLI are in
``test_claude_agent_sdk_cli.py``.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("claude_agent_sdk")

from claude_agent_sdk.testing.session_store_conformance import run_session_store_conformance
from claude_agent_sdk.types import SessionKey

from checkpointer import FileStore, JournalStore, load
from checkpointer.claude_agent_sdk import CheckpointFailed, CheckpointSessionStore, session_key
from checkpointer.stores import Store
from tests._support import MANY, ROOT, child_env

pytestmark = pytest.mark.anyio

KEY: SessionKey = {
    "project_key": "-work-proj",
    "session_id": "0b6a5c1e-1d1f-4c1e-9a59-3d6a0c8f0e11",
}


def _entry(uuid: str, text: str = "hi") -> Any:
    return {
        "type": "user",
        "uuid": uuid,
        "parentUuid": None,
        "message": {"role": "user", "content": [{"type": "text", "text": text}]},
    }


@pytest.mark.parametrize("kind", [FileStore, JournalStore])
async def test_sdk_conformance(tmp_path: Path, kind: type[Store]) -> None:
    """The SDK's own 14 SessionStore contracts hold, each on a fresh store root."""
    roots = iter(range(100))
    stores: list[CheckpointSessionStore] = []

    def make() -> CheckpointSessionStore:
        store = CheckpointSessionStore(kind(tmp_path / str(next(roots))))  # type: ignore[call-arg]
        stores.append(store)
        return store

    try:
        await run_session_store_conformance(make)
    finally:
        for store in stores:
            assert await store.aclose() == []


def test_session_keys() -> None:
    """Keys keep readable parts, start with '-' as the SDK's project keys do, never collide."""
    assert session_key(KEY) == f"-work-proj.{KEY['session_id']}"
    sub = session_key({**KEY, "subpath": "subagents/agent-a1"})
    assert sub == f"-work-proj.{KEY['session_id']}.subagents.agent-a1"
    odd = [
        {"project_key": "a.b", "session_id": "c"},
        {"project_key": "a", "session_id": "b.c"},
        {"project_key": "a", "session_id": "b", "subpath": "c"},
        {"project_key": "_" + "0" * 32, "session_id": "b"},
        {"project_key": "/" * 300, "session_id": "b", "subpath": "x/" * 120},
    ]
    keys = [session_key(k) for k in odd]  # type: ignore[arg-type]
    assert len(set(keys)) == len(keys)
    for key in keys:
        FileStore.validate_key(FileStore, key)  # type: ignore[arg-type]


async def test_appends_are_journal_appends(tmp_path: Path) -> None:
    """On a JournalStore a turn's append writes its new entries only, not the transcript again."""
    store = JournalStore(tmp_path)
    async with CheckpointSessionStore(store, durability="sync") as sessions:
        await sessions.append(KEY, [_entry(f"u{i}", "x" * 2000) for i in range(50)])
        before = store.statistics().bytes_written
        await sessions.append(KEY, [_entry("last")])
        grew = store.statistics().bytes_written - before
    assert grew < 1000
    stored = load(store, session_key(KEY))
    assert stored is not None and len(stored.state["messages"]) == 51


async def test_retried_batch_is_not_doubled(tmp_path: Path) -> None:
    """A batch the SDK sends again (its retry) adds its uuid'd entries once; others are kept."""
    async with CheckpointSessionStore(FileStore(tmp_path)) as sessions:
        batch: list[Any] = [_entry("a"), {"type": "custom-title", "customTitle": "t"}]
        await sessions.append(KEY, batch)
        await sessions.append(KEY, batch)
        loaded = await sessions.load(KEY)
    assert loaded is not None
    assert [e.get("uuid") for e in loaded] == ["a", None, None]


async def test_load_returns_copies(tmp_path: Path) -> None:
    """What load returns and what append took are copies: changing them changes nothing stored."""
    async with CheckpointSessionStore(FileStore(tmp_path)) as sessions:
        entry = _entry("a")
        await sessions.append(KEY, [entry])
        entry["message"]["content"] = "changed"
        loaded = await sessions.load(KEY)
        assert loaded is not None
        loaded[0]["type"] = "changed"
        assert await sessions.load(KEY) == [_entry("a")]


async def test_second_store_on_an_open_session_is_refused(tmp_path: Path) -> None:
    """A second store object on a session this one holds is refused ('locked'), then takes it."""
    async with CheckpointSessionStore(FileStore(tmp_path)) as first:
        await first.append(KEY, [_entry("a")])
        second = CheckpointSessionStore(FileStore(tmp_path))
        assert await second.load(KEY) == [_entry("a")]  # reading is fine
        with pytest.raises(CheckpointFailed) as info:
            await second.append(KEY, [_entry("b")])
        assert info.value.result.reason == "locked"
        with pytest.raises(CheckpointFailed) as info:
            await second.delete(KEY)
        assert info.value.result.reason == "locked"
    await second.append(KEY, [_entry("b")])  # fenced on what it loaded: still that revision
    assert await second.load(KEY) == [_entry("a"), _entry("b")]
    assert await second.aclose() == []


async def test_stale_resume_is_a_conflict(tmp_path: Path) -> None:
    """A process resumed from a load that another process has written past is refused."""
    stale = CheckpointSessionStore(FileStore(tmp_path))
    assert await stale.load(KEY) is None  # the SDK's resume load: "absent"
    async with CheckpointSessionStore(FileStore(tmp_path)) as other:
        await other.append(KEY, [_entry("other")])
    with pytest.raises(CheckpointFailed) as info:
        await stale.append(KEY, [_entry("mine")])
    assert info.value.result.reason == "conflict"
    await stale.aclose()
    checkpoint = load(FileStore(tmp_path), session_key(KEY))
    assert checkpoint is not None and checkpoint.state["messages"] == [_entry("other")]


def _turn(n: int) -> list[Any]:
    """One turn as the CLI mirrors it: a prompt, a tool call, its result, an answer."""
    call = f"toolu_{n:03d}"

    def entry(kind: str, uuid: str, parent: str, message: Any) -> Any:
        return {"type": kind, "uuid": uuid, "parentUuid": parent, "message": message}

    said = {"role": "assistant", "id": f"msg_{n}a"}
    return [
        entry("user", f"{n}-1", f"{n - 1}-4", {"role": "user", "content": f"q{n:03d} " * 40}),
        entry(
            "assistant",
            f"{n}-2",
            f"{n}-1",
            {**said, "content": [{"type": "tool_use", "id": call, "name": "Bash", "input": {}}]},
        ),
        entry(
            "user",
            f"{n}-3",
            f"{n}-2",
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call, "content": "ok " * 40}],
            },
        ),
        entry(
            "assistant",
            f"{n}-4",
            f"{n}-3",
            {"role": "assistant", "id": f"msg_{n}b", "content": [{"type": "text", "text": "done"}]},
        ),
    ]


async def test_bytes_per_turn_follow_the_change_across_tool_calls(tmp_path: Path) -> None:
    """Mirrored as the CLI appends (the call, then its result, each durable), a turn costs
    about the same bytes at turn 20 as at turn 2 on a ``JournalStore``: an append of its
    entries, never a rewrite of the transcript."""
    path = tmp_path / f"{session_key(KEY)}.jsonl"
    async with CheckpointSessionStore(JournalStore(tmp_path), durability="sync") as store:
        sizes = []
        for n in range(20):
            entries = _turn(n)
            for batch in (entries[:2], entries[2:3], entries[3:]):  # a write with the call open
                await store.append(KEY, batch)
            sizes.append(path.stat().st_size)
    grown = [after - before for before, after in itertools.pairwise(sizes)]
    assert max(grown) < 1.2 * grown[0], grown


# -- a server's many sessions: descriptors, a session closed for idleness --------------


def _run(*args: str, **kw: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.children.claude_child", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=child_env(),
        **kw,
    )


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_server_holds_more_sessions_than_descriptors(shm_root: Path, backend: str) -> None:
    """``MANY`` sessions, each given an entry (64 at a time) by one store in a process limited
    to fewer descriptors: every session's entry is stored, not live."""
    child = _run("many", str(shm_root), str(MANY), backend)
    out, err = child.communicate(timeout=1800)
    assert child.returncode == 0, err[-3000:]
    stats = json.loads(out.splitlines()[-1])
    assert (stats["opened"], stats["failed"]) == (MANY, 0)
    store = JournalStore(shm_root)
    wrong = []
    for i in range(MANY):
        checkpoint = load(store, session_key({"project_key": "proj", "session_id": f"s{i}"}))
        uuids = [] if checkpoint is None else [e["uuid"] for e in checkpoint.state["messages"]]
        if checkpoint is None or checkpoint.meta.live or uuids != [f"u{i}"]:
            wrong.append(i)
    assert wrong == []


OTHER_PROCESS = """
import sys, anyio
from checkpointer import JournalStore
from checkpointer.claude_agent_sdk import CheckpointSessionStore
from tests.children.claude_child import entry

async def main() -> None:
    key = {"project_key": "proj", "session_id": "s0"}
    async with CheckpointSessionStore(JournalStore(sys.argv[1])) as sessions:
        await sessions.load(key)  # the SDK's resume
        await sessions.append(key, [entry("other")])

anyio.run(main)
"""


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_session_closed_for_idleness_resumes_from_another_process_write(
    tmp_path: Path, backend: str
) -> None:
    """Closed for idleness, appended to by another process, appended to again: the server
    resumes from the other's entries and adds to them, never over them."""
    server = _run("reopen", str(tmp_path), backend, stdin=subprocess.PIPE)
    try:
        assert server.stdout is not None and server.stdin is not None
        assert server.stdout.readline() == "idle\n"
        subprocess.run(
            [sys.executable, "-c", OTHER_PROCESS, str(tmp_path)],
            cwd=ROOT,
            env=child_env(),
            check=True,
            timeout=120,
        )
        server.stdin.write("go\n")
        server.stdin.flush()
        assert server.stdout.readline() == "resumed first other mine\n"
        server.communicate(timeout=120)
    finally:
        server.kill()
    assert server.returncode == 0
    key = session_key({"project_key": "proj", "session_id": "s0"})
    checkpoint = load(JournalStore(tmp_path), key)
    assert checkpoint is not None
    assert [e["uuid"] for e in checkpoint.state["messages"]] == ["first", "other", "mine"]
