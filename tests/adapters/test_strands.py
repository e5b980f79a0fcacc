"""checkpointer.strands: Strands' SessionManager over a KeyCommitter.

The model is a scripted ``strands.models.Model`` that calls a tool, then
answers, and refuses (as Bedrock does) a toolUse without its toolResult;
the crash tests kill a real agent process inside its tool
(``tests/children/strands_child.py``).  Strands' async path
(``invoke_async``) runs on asyncio only (its tool executor needs asyncio's
running loop); its sync call (``agent(prompt)``) runs its own asyncio loop
in a thread, so a trio program calls it from a worker thread: the async
tests take both backends that way.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest

pytest.importorskip("strands")

from strands.agent.conversation_manager import SlidingWindowConversationManager
from strands.session import SessionManager
from strands.types.exceptions import SessionException

from checkpointer import JournalStore, load
from checkpointer.strands import CheckpointFailed, CheckpointSessionManager, session_key
from tests._support import MANY, MAX_OPEN, ROOT, child_env, cli
from tests.adapters.conftest import serve_many
from tests.children.strands_child import WINDOW, converse_problems, scripted_agent, turn


def _stored(root: Path, session_id: str = "chat") -> dict[str, Any] | None:
    checkpoint = load(JournalStore(root), session_key(session_id))
    return None if checkpoint is None else dict(checkpoint.state)


def _child(root: Path, turns: int, *kill: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.children.strands_child",
            str(root),
            "chat",
            str(turns),
            *kill,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=child_env(),
    )


def _in_tool(root: Path, turns: int) -> subprocess.Popen[str]:
    """A child blocked inside its last turn's tool (it holds the key)."""
    child = _child(root, turns, "kill")
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line == f"in-tool {child.pid}\n", line + (child.stderr.read() if child.stderr else "")
    return child


def _kill(child: subprocess.Popen[str], signum: int = signal.SIGKILL) -> None:
    child.send_signal(signum)
    child.communicate(timeout=60)
    assert child.returncode == -signum


def test_is_a_strands_session_manager(tmp_path: Path) -> None:
    """Strands takes it as an Agent's session_manager; the key is the session id."""
    manager = CheckpointSessionManager("chat", JournalStore(tmp_path))
    assert isinstance(manager, SessionManager)
    assert manager.key == "chat" and session_key("a/b").startswith("session-")
    with pytest.raises(TypeError, match="debounce"):
        CheckpointSessionManager("chat", JournalStore(tmp_path), debounce=1.0)


def test_turns_resume_with_state_and_window(tmp_path: Path) -> None:
    """Messages, agent state and the window's state come back in a new agent, which goes on."""
    with CheckpointSessionManager("chat", JournalStore(tmp_path)) as manager:
        agent = scripted_agent(manager)
        for n in range(3):
            turn(agent, n)
        messages, removed = agent.messages, agent.conversation_manager.removed_message_count
    assert removed > 0  # the window trimmed: its state matters
    stored = _stored(tmp_path)
    assert stored is not None and stored["messages"] == messages
    with CheckpointSessionManager("chat", JournalStore(tmp_path)) as manager:
        agent = scripted_agent(manager)
        assert agent.messages == messages and agent.state.get("turns") == 3
        assert agent.conversation_manager.removed_message_count == removed
        turn(agent, 3)
        assert agent.messages[-1]["content"] == [{"text": "answer found:turn-3"}]


def test_bytes_come_back_as_bytes(tmp_path: Path) -> None:
    """An image block's bytes are stored as Strands stores them and come back as bytes."""
    image: Any = {"image": {"format": "png", "source": {"bytes": b"\x89PNG\x00"}}}
    with CheckpointSessionManager("chat", JournalStore(tmp_path)) as manager:
        scripted_agent(manager)([{"text": "look"}, image])
    with CheckpointSessionManager("chat", JournalStore(tmp_path)) as manager:
        agent = scripted_agent(manager)
    assert agent.messages[0]["content"][1] == image


def test_one_agent_per_manager(tmp_path: Path) -> None:
    """A second agent on one manager, or another agent_id than the stored one, is refused."""
    with CheckpointSessionManager("chat", JournalStore(tmp_path)) as manager:
        scripted_agent(manager)
        with pytest.raises(SessionException, match="one agent"):
            scripted_agent(manager, agent_id="other")
    with (
        CheckpointSessionManager("chat", JournalStore(tmp_path)) as manager,
        pytest.raises(SessionException, match="holds agent 'default'"),
    ):
        scripted_agent(manager, agent_id="other")


def test_a_graph_is_refused(tmp_path: Path) -> None:
    """A Graph built with it raises (Strands' NotImplementedError) instead of running unsaved."""
    from strands.multiagent import GraphBuilder

    builder = GraphBuilder()
    builder.add_node(scripted_agent(None), "only")
    builder.set_max_node_executions(1)
    builder.set_session_manager(CheckpointSessionManager("graph", JournalStore(tmp_path)))
    with pytest.raises(NotImplementedError, match="multi-agent"):
        builder.build()


def test_a_forked_child_says_its_turn_is_not_saved(tmp_path: Path) -> None:
    """A forked child's turn raises (its parent holds the key), and leaves the key as it was."""
    with CheckpointSessionManager("chat", JournalStore(tmp_path)) as manager:
        agent = scripted_agent(manager)
        turn(agent, 0)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover -- the child
            try:
                turn(agent, 1)
                os.write(write, b"saved?")
            except RuntimeError as exc:
                os.write(write, str(exc).encode())
            os._exit(0)
        os.close(write)
        said = os.read(read, 4096).decode()
        os.waitpid(pid, 0)
        assert f"belongs to process {os.getpid()}" in said and "not saved" in said
        assert (_stored(tmp_path) or {})["state"] == {"turns": 1}
        turn(agent, 1)  # the parent goes on
    stored = _stored(tmp_path)
    assert stored is not None and stored["state"] == {"turns": 2}


def test_closed_manager_says_so(tmp_path: Path) -> None:
    """A turn after close() raises instead of running unsaved."""
    manager = CheckpointSessionManager("chat", JournalStore(tmp_path))
    agent = scripted_agent(manager)
    manager.close()
    with pytest.raises(RuntimeError, match="closed: this change is not saved"):
        turn(agent, 0)


@pytest.mark.anyio
async def test_from_an_async_program(tmp_path: Path, anyio_backend: str) -> None:
    """asyncio awaits invoke_async; trio calls the agent in a worker thread (its own loop)."""
    with CheckpointSessionManager("chat", JournalStore(tmp_path)) as manager:
        agent = scripted_agent(manager, conversation_manager=SlidingWindowConversationManager(40))
        if anyio_backend == "asyncio":
            await agent.invoke_async("turn-0")
        else:
            await anyio.to_thread.run_sync(agent, "turn-0")
    stored = _stored(tmp_path)
    assert stored is not None and len(stored["messages"]) == 4


# -- killed inside a tool; a second process; a delete from another process ----------


@pytest.fixture(scope="module", params=[signal.SIGKILL, signal.SIGTERM], ids=["KILL", "TERM"])
def killed(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    """A session of four turns whose fourth was killed inside its tool (SIGKILL, SIGTERM)."""
    root = tmp_path_factory.mktemp("killed")
    _kill(_in_tool(root, 4), request.param)
    return root


def test_killed_inside_a_tool_keeps_the_call(killed: Path) -> None:
    """What is stored: the turns before, the last turn's prompt and its toolUse, open (as
    Strands wrote it: it closes the call itself on resume), its state."""
    stored = _stored(killed)
    assert stored is not None and stored["state"] == {"turns": 4}
    messages = stored["messages"]
    prompt = next(i for i, m in enumerate(messages) if m["content"] == [{"text": "turn-3"}])
    assert "toolUse" in messages[prompt + 1]["content"][0]
    closing = [b["toolResult"]["status"] for m in messages[prompt + 2 :] for b in m["content"]]
    assert closing == []
    assert stored["conversation_manager_state"]["removed_message_count"] > 0
    assert len(messages) <= WINDOW


def test_resumed_in_a_new_process_after_a_kill(killed: Path, tmp_path: Path) -> None:
    """A new process resumes it: Strands closes the dangling call, the model accepts the
    history, the turn is stored."""
    root = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(killed), str(root)], check=True)
    child = _child(root, 1)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0 and out == "done\n", err
    stored = _stored(root)
    assert stored is not None and stored["state"] == {"turns": 5}
    assert converse_problems(stored["messages"]) == []
    assert stored["messages"][-1]["content"] == [{"text": "answer found:turn-4"}]
    closed = [
        b["toolResult"] for m in stored["messages"] for b in m["content"] if "toolResult" in b
    ]
    assert any(r["status"] == "error" for r in closed)  # the killed call, closed by Strands


def test_a_second_process_is_refused_and_delete_is_fenced(tmp_path: Path) -> None:
    """While a process holds the session, another is refused, naming it; its delete too;
    once it is gone, the delete goes through."""
    holder = _in_tool(tmp_path, 1)
    try:
        manager = CheckpointSessionManager("chat", JournalStore(tmp_path))
        with pytest.raises(CheckpointFailed) as raised:
            scripted_agent(manager)
        assert raised.value.result.reason == "locked"
        assert f"pid {holder.pid}" in str(raised.value) and "key=" in str(raised.value)
        with pytest.raises(CheckpointFailed) as raised:
            CheckpointSessionManager("chat", JournalStore(tmp_path)).delete()
        assert raised.value.result.reason == "locked" and f"pid {holder.pid}" in str(raised.value)
        assert _stored(tmp_path) is not None
    finally:
        _kill(holder)
    CheckpointSessionManager("chat", JournalStore(tmp_path)).delete()
    assert _stored(tmp_path) is None


def test_two_processes_started_at_once_on_a_new_session(tmp_path: Path) -> None:
    """Two processes open a new session at the same moment, twenty times: each either runs
    its turn, stored, or is refused ("locked" or "conflict"); no stored turn is lost."""
    trials = 20
    out = subprocess.run(
        [sys.executable, "-m", "tests.children.strands_child", "race", str(tmp_path), f"{trials}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=child_env(),
        timeout=300,
        check=True,
    ).stdout
    ran = {int(n): int(k) for n, k in re.findall(r"^trial (\d+) ran (\d+)$", out, re.M)}
    assert len(ran) == trials, out
    for trial, count in ran.items():
        stored = _stored(tmp_path / str(trial))
        assert count >= 1 and stored is not None and stored["state"] == {"turns": count}, out
    assert "refused" in out  # the race was run: at least once both were live together


def test_verify_and_show_read_the_killed_session_as_converse(killed: Path) -> None:
    """``verify`` and ``show`` on the store a killed agent left: the turns counted in the
    Converse dialect, the call the kill left open said as a warning (what Strands wrote,
    closed by Strands on resume), no problem."""
    verified = cli("verify", killed)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "1 tool call(s) open at the end" in verified.stdout
    assert "unrecognised" not in verified.stdout and "0 bad" in verified.stdout
    shown = cli("show", killed, session_key("chat"))
    assert shown.returncode == 0, shown.stderr
    messages = _stored(killed)["messages"]  # type: ignore[index]
    turns = sum(m["role"] == "assistant" for m in messages)
    assert re.search(rf"^turns\s+{turns} \(assistant messages\)$", shown.stdout, re.M), shown.stdout
    assert "-> 1 tool call(s): lookup" in shown.stdout.splitlines()[-1]  # stored open


def test_bytes_per_turn_follow_the_change_across_tool_calls(tmp_path: Path) -> None:
    """On a ``JournalStore`` each turn (a prompt, a call, its result, an answer) appends
    about the same bytes at turn 20 as at turn 2: no commit rewrites the history."""
    from strands.agent.conversation_manager import NullConversationManager

    with CheckpointSessionManager("chat", JournalStore(tmp_path)) as manager:
        agent = scripted_agent(manager, conversation_manager=NullConversationManager())
        sizes = []
        for n in range(20):
            turn(agent, n)
            sizes.append((tmp_path / "chat.jsonl").stat().st_size)
    grown = [after - before for before, after in itertools.pairwise(sizes)]
    assert max(grown) < 1.2 * grown[0], grown


# -- a server's many sessions: descriptors, a lock let go ------------------------------


def test_a_server_holds_more_sessions_than_descriptors(shm_root: Path) -> None:
    """``MANY`` agents, each with its manager, open together in a process limited to
    ``DESCRIPTORS`` (fewer), each one turn with a tool call: every session's turn is stored."""
    store = serve_many("strands_child", shm_root)
    wrong = []
    for i in range(MANY):
        checkpoint = load(store, session_key(f"s{i}"))
        state = {} if checkpoint is None else checkpoint.state
        texts = [m["content"][0].get("text") for m in state.get("messages", [])[::3]]
        live = checkpoint is None or checkpoint.meta.live
        if live or (state["state"], texts) != (
            {"turns": 1},
            [f"turn-{i}", f"answer found:turn-{i}"],
        ):
            wrong.append(i)
    assert wrong == []


def test_a_session_let_go_then_written_elsewhere_is_refused_not_overwritten(
    tmp_path: Path,
) -> None:
    """Past the process's bound a session's lock is let go; another process then takes the
    session and writes it; the first one's next turn is refused ("conflict"), and what the
    other wrote stays."""
    past = str(MAX_OPEN + 8)  # sessions opened after chat's turn: past the bound, chat let go
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.children.strands_child", "let-go", str(tmp_path), past],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=child_env(),
    )
    try:
        assert server.stdout is not None and server.stdin is not None
        assert server.stdout.readline() == "let-go\n"
        other = _child(tmp_path, 1)  # resumes "chat" (one turn), adds one
        out, err = other.communicate(timeout=120)
        assert other.returncode == 0 and out == "done\n", err
        theirs = JournalStore(tmp_path).revision(session_key("chat"))
        server.stdin.write("go\n")
        server.stdin.flush()
        assert server.stdout.readline() == "refused conflict\n"
        server.communicate(timeout=120)
    finally:
        server.kill()
    assert server.returncode == 0
    stored = _stored(tmp_path)
    assert stored is not None and stored["state"] == {"turns": 2}
    assert JournalStore(tmp_path).revision(session_key("chat")) == theirs
