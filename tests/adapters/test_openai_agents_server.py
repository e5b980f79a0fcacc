"""checkpointer.openai_agents on a server: ``CheckpointSessions``, one ``SessionRegistry`` for
every user's session, and the checks a ``transcript=`` asks for.

A server process runs the real ``Runner`` (the SDK's offline model) for more sessions than
``ulimit -n 1024`` allows descriptors (``tests/children/openai_server_child.py``); every check
reads the bytes stored for each session.  Asyncio only, as the SDK.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

from agents import Runner

from checkpointer import CheckpointFailed, FileStore, JournalStore, Transcript, load
from checkpointer import openai_agents as oa
from checkpointer.messages import validate_history
from checkpointer.openai_agents import CheckpointSession, CheckpointSessions
from tests._support import HANG_GUARD, MANY, MAX_OPEN, ROOT, Pumped, child_env
from tests.children.adapter_child import responses_problems
from tests.children.openai_server_child import agent

pytestmark = pytest.mark.anyio

# More sessions than descriptors shows the bound; the 10,000 are the long run's.


@pytest.fixture
def anyio_backend() -> str:
    """The Agents SDK is asyncio-only."""
    return "asyncio"


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    """On tmpfs when there is one: descriptors are the subject here, not fsync."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        yield tmp_path / "store"
        return
    import tempfile

    with tempfile.TemporaryDirectory(dir=shm) as where:
        yield Path(where) / "store"


def _items(store: Any, session_id: str) -> list[Any] | None:
    checkpoint = load(store, oa.session_key(session_id))
    return None if checkpoint is None else list(checkpoint.state["messages"])


def test_a_server_holds_more_sessions_than_descriptors(root: Path) -> None:
    """``MANY`` users, one turn each with a tool call (64 at a time), in a process limited to
    fewer descriptors: every session's four items stored, the model's checks passed."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.children.openai_server_child", "many", str(root), str(MANY)],
        env=child_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    stats = json.loads(done.stdout.splitlines()[-1])
    # A key let go between a turn's calls (64 at once, the bound near it) reopens, fenced.
    assert stats["opened"] >= MANY and stats["failed"] == 0
    assert stats["evicted"] >= MANY - MAX_OPEN
    _check_turns(root, MANY)


def _check_turns(root: Path, n: int) -> None:
    """Each session ``s<i>`` holds its one turn: the input ``hi <i>``, a call, its output, the
    answer, as the model accepts them."""
    store, wrong = FileStore(root), []
    for i in range(n):
        items = _items(store, f"s{i}") or []
        kinds = [item.get("type", item.get("role")) for item in items]
        if kinds != ["user", "function_call", "function_call_output", "message"]:
            wrong.append((i, kinds))
        elif items[0]["content"] != f"hi {i}" or responses_problems(items):
            wrong.append((i, items))
    assert wrong == []


def test_sigterm_to_a_server_group_writes_every_open_session(root: Path) -> None:
    """SIGTERM to the process group of a server holding 200 sessions whose turns are debounced
    for an hour: the registry's one exit hook wrote each, and the process died of it."""
    server = Pumped(
        [sys.executable, "-m", "tests.children.openai_server_child", "hold", str(root), "200"],
        new_session=True,
    )
    try:
        server.wait_line(lambda line: line == "ready", "the server holding 200 sessions")
        os.killpg(server.proc.pid, signal.SIGTERM)
        server.proc.wait(HANG_GUARD)
    finally:
        server.kill()
    assert server.proc.returncode == -signal.SIGTERM, server.report()
    _check_turns(root, 200)


def test_a_session_closed_for_idleness_reopens_from_another_process_write(root: Path) -> None:
    """The server's key closed for idleness; another process adds an item; the server's next
    call resumes from it, and its turn is stored after it, never over it."""
    server = Pumped(
        [sys.executable, "-m", "tests.children.openai_server_child", "reopen", str(root)],
        stdin=subprocess.PIPE,
    )
    try:
        server.wait_line(lambda line: line == "idle", "the key closed for idleness")
        other = subprocess.Popen(
            [sys.executable, "-m", "tests.children.session_child", "hold", f"file:{root}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=child_env(),
        )
        assert other.communicate("\n", timeout=HANG_GUARD)[0] == "open\n"
        assert server.proc.stdin is not None
        server.proc.stdin.write("go\n")
        server.proc.stdin.close()
        shown = server.wait_line(lambda line: line.startswith("["), "the reopened items")
        assert json.loads(shown) == ["first", "from-holder"]
        server.proc.wait(HANG_GUARD)
    finally:
        server.kill()
    assert server.proc.returncode == 0, server.report()
    items = _items(FileStore(root), "chat") or []
    assert [i.get("content") for i in items[:3]] == ["first", "from-holder", "after"]
    assert len(items) == 6 and not responses_problems(items)


async def test_sessions_evicted_and_reopened_in_process(tmp_path: Path) -> None:
    """Three users on a registry that keeps one key open: each turn reopens its key from disk
    (the others' evicted, final write done), and each user's history is whole."""
    async with CheckpointSessions(JournalStore(tmp_path), max_open=1) as sessions:
        for turn in range(2):
            for user in ("a", "b", "c"):
                session = CheckpointSession(user, sessions)
                await Runner.run(agent(), f"{user}{turn}", session=session)
        stats = sessions.registry.statistics()
        assert (stats.opened, stats.evicted) == (6, 5)
        shown = await CheckpointSession("a", sessions).get_items()
    for user in ("a", "b", "c"):
        items = _items(JournalStore(tmp_path), user) or []
        assert [i.get("content") for i in items if i.get("role") == "user"] == [
            f"{user}0",
            f"{user}1",
        ]
        assert len(items) == 8 and not responses_problems(items)
    assert shown == _items(JournalStore(tmp_path), "a")


async def test_a_shared_session_takes_no_async_with_nor_writer_options(tmp_path: Path) -> None:
    """A session of a ``CheckpointSessions`` is used as it is: ``async with`` says so, and its
    writer options belong to the sessions object."""
    async with CheckpointSessions(JournalStore(tmp_path)) as sessions:
        with pytest.raises(RuntimeError, match="CheckpointSessions"):
            async with CheckpointSession("a", sessions):
                pass
        with pytest.raises(TypeError, match="CheckpointSessions"):
            CheckpointSession("a", sessions, debounce=1.0)


# -- transcript=: the items a model API would refuse are refused --------------------------

CALL = {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"}
OUTPUT = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
USER = {"role": "user", "content": "hi"}


async def test_transcript_refuses_an_orphan_output_and_a_second_answer(tmp_path: Path) -> None:
    """With ``transcript=Transcript()``, an output that answers no call (or a call answered
    already, after a pop too) is ``CheckpointFailed("not-sendable")``: not added, not stored."""
    store = JournalStore(tmp_path)
    opened = CheckpointSession("chat", store, durability="sync", transcript=Transcript())
    async with opened as session:
        add: Any = session.add_items
        with pytest.raises(CheckpointFailed) as orphan:
            await add([USER, {**OUTPUT, "call_id": "nobody"}])
        assert orphan.value.result.reason == "not-sendable"
        assert "item 1" in str(orphan.value) and "orphan" in str(orphan.value)
        await add([USER, CALL, OUTPUT])
        with pytest.raises(CheckpointFailed, match="orphan"):
            await add([OUTPUT])
        assert await session.pop_item() == OUTPUT
        await add([OUTPUT])  # its call is open again after the pop
        with pytest.raises(CheckpointFailed, match="used by an earlier call"):
            await add([{**CALL, "call_id": "c2"}, {**CALL, "call_id": "c2"}])
    assert _items(store, "chat") == [USER, CALL, OUTPUT]


async def test_transcript_checks_the_new_items_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check reads the new items and the calls still open, never the whole history; the
    real Runner's items pass it, with no 'unrecognised shape' warning."""
    seen: list[int] = []
    validate = validate_history

    def spy(items: Any) -> Any:
        seen.append(len(items))
        return validate(items)

    monkeypatch.setattr(oa, "validate_history", spy)
    options: dict[str, Any] = {"transcript": Transcript()}
    async with CheckpointSession("chat", JournalStore(tmp_path), **options) as session:
        add: Any = session.add_items
        await add([{"role": "user", "content": str(i)} for i in range(2000)])
        seen.clear()
        for turn in range(3):
            await Runner.run(agent(), f"t{turn}", session=session)
    assert seen and max(seen) <= 2, seen
    items = _items(JournalStore(tmp_path), "chat") or []
    assert len(items) == 2012 and not responses_problems(items)
