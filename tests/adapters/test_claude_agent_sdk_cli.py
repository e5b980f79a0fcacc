"""The real bundled Claude Code CLI, through the SDK, mirrored to a CheckpointSessionStore.

Each session is a child process (``tests/children/claude_child.py``): the
SDK and its CLI, an empty ``CLAUDE_CONFIG_DIR``, a scripted Messages API
on 127.0.0.1 (no network, no key).  A session killed by SIGKILL inside a
tool resumes in a new process from the store alone; a second process on
a live session and a delete from another process are refused by name.
Each child runs on asyncio or trio (the SDK runs on both through anyio).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("claude_agent_sdk")

from checkpointer import JournalStore, load
from checkpointer.claude_agent_sdk import session_key
from tests._support import HANG_GUARD, ROOT, Pumped, child_env
from tests.children.claude_child import CLI, MessagesServer

if not os.access(CLI, os.X_OK):
    pytest.skip(f"the SDK's bundled CLI is missing at {CLI}", allow_module_level=True)


@pytest.fixture
def api() -> Iterator[MessagesServer]:
    with MessagesServer() as server:
        yield server


def _child(*args: str) -> Pumped:
    argv = [sys.executable, "-m", "tests.children.claude_child", *args]
    os.chdir(ROOT)  # children import this checkout's tests and checkpointer
    os.environ.update(child_env())
    return Pumped(argv, new_session=True)


def _in_tool(flag: Path) -> str:
    """A Bash command that writes its pid to ``flag``, then sleeps as that pid (so it can be
    killed: the CLI starts its tools in a session of their own)."""
    return f"echo $$ > {flag} && exec sleep 120"


def _stop(child: Pumped, flag: Path | None = None) -> None:
    """SIGKILL the child, its CLI (its process group) and the tool it runs."""
    if child.proc.poll() is None:
        os.killpg(child.proc.pid, signal.SIGKILL)
    child.kill()
    if flag is not None and flag.exists() and flag.read_text().strip():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(flag.read_text()), signal.SIGKILL)


def _finish(child: Pumped) -> None:
    deadline = time.monotonic() + 2 * HANG_GUARD
    while child.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    child.kill()
    assert child.proc.returncode == 0, child.report()


def _stored(root: Path, project: str, session_id: str) -> list[Any] | None:
    checkpoint = load(
        JournalStore(root), session_key({"project_key": project, "session_id": session_id})
    )
    return None if checkpoint is None else list(checkpoint.state["messages"])


def _tool_uses(entries: list[Any]) -> list[dict[str, Any]]:
    return [
        block
        for entry in entries
        if entry.get("type") == "assistant"
        for block in entry["message"]["content"]
        if block.get("type") == "tool_use"
    ]


def _kill_in_tool(
    tmp_path: Path, api: MessagesServer, backend: str
) -> tuple[Path, str, str, list[Any]]:
    """A session inside its Bash tool once the store has the call, SIGKILLed with its CLI."""
    root = tmp_path / "store"
    root.mkdir()
    flag = tmp_path / "in-tool"
    child = _child(str(root), api.url, backend, f"first RUN: {_in_tool(flag)}")
    session_id = child.wait_line(lambda line: line.startswith("session "), "session").split()[1]
    deadline = time.monotonic() + HANG_GUARD
    project = entries = None
    while time.monotonic() < deadline:
        keys = JournalStore(root).keys()
        if flag.exists() and keys:
            checkpoint = load(JournalStore(root), keys[0])
            assert checkpoint is not None
            project, entries = checkpoint.state["project_key"], checkpoint.state["messages"]
            if _tool_uses(entries):
                break
        time.sleep(0.1)
    else:
        _stop(child, flag)
        pytest.fail(f"never in the tool with the call stored\n{child.report()}")
    _stop(child, flag)  # the SDK's process, its CLI, the tool
    assert child.proc.returncode == -signal.SIGKILL
    stored = _stored(root, project, session_id)
    assert stored is not None and len(stored) >= len(entries)
    return root, project, session_id, stored


@pytest.mark.parametrize(("killed", "resumed"), [("asyncio", "trio"), ("trio", "asyncio")])
def test_killed_in_tool_resumes_from_store_alone(
    tmp_path: Path, api: MessagesServer, killed: str, resumed: str
) -> None:
    """SIGKILL inside a tool: the store has the prompt and the call; a new process with an
    empty config dir resumes the conversation from the store and adds to it."""
    root, project, session_id, stored = _kill_in_tool(tmp_path, api, killed)
    prompts = [e for e in stored if e.get("type") == "user" and "first RUN:" in str(e["message"])]
    assert len(prompts) == 1
    [call] = _tool_uses(stored)
    assert call["name"] == "Bash" and call["input"]["command"].endswith("exec sleep 120")

    sent = len(api.requests)
    child = _child(str(root), api.url, resumed, "second RUN: echo after-resume", session_id)
    child.wait_line(lambda line: line.startswith("result "), "result")
    _finish(child)
    resumed_request = api.requests[sent]
    text = str(resumed_request["messages"])
    assert "first RUN:" in text and call["id"] in text  # the history came from the store
    after = _stored(root, project, session_id)
    assert after is not None
    assert after[: len(stored)] == stored  # what the killed process stored, unchanged
    assert "done: after-resume" in str(after[len(stored) :])


def test_second_process_on_a_live_session_is_told(tmp_path: Path, api: MessagesServer) -> None:
    """A second process resuming a session another holds gets a MirrorErrorMessage naming the
    lock; its entries are not mixed into the holder's transcript."""
    root = tmp_path / "store"
    root.mkdir()
    flag = tmp_path / "in-tool"
    holder = _child(str(root), api.url, "trio", f"first RUN: {_in_tool(flag)}")
    session_id = holder.wait_line(lambda line: line.startswith("session "), "session").split()[1]
    deadline = time.monotonic() + HANG_GUARD
    while not (flag.exists() and JournalStore(root).keys()) and time.monotonic() < deadline:
        time.sleep(0.1)
    second = _child(str(root), api.url, "asyncio", "second RUN: echo intruder", session_id)
    try:
        error = second.wait_line(lambda line: line.startswith("mirror-error "), "mirror-error")
        assert "is locked by another writer (pid" in error, error
        second.wait_line(lambda line: line.startswith("result "), "result")
        _finish(second)
        stored = JournalStore(root).keys()
        [key] = stored
        checkpoint = load(JournalStore(root), key)
        assert checkpoint is not None
        assert "intruder" not in str(checkpoint.state["messages"])
    finally:
        _stop(second)
        _stop(holder, flag)


def test_delete_from_another_process(tmp_path: Path, api: MessagesServer) -> None:
    """The SDK's delete_session_via_store from another process is refused while a session holds
    the key, and deletes it once that process is gone."""
    root, project, session_id, _ = _kill_in_tool(tmp_path, api, "asyncio")
    key = session_key({"project_key": project, "session_id": session_id})
    killed = JournalStore(root).revision(key)
    flag = tmp_path / "in-tool-again"
    child = _child(str(root), api.url, "trio", f"again RUN: {_in_tool(flag)}", session_id)
    deadline = time.monotonic() + HANG_GUARD
    try:
        # Inside its tool, having written: its writer holds the key.
        while not flag.exists() or JournalStore(root).revision(key) == killed:
            assert time.monotonic() < deadline, child.report()
            time.sleep(0.1)
        deleter = _child("delete", str(root), session_id, "asyncio")
        assert deleter.wait_line(lambda line: True, "answer") == "refused locked"
        _finish(deleter)
    finally:
        _stop(child, flag)
    deleter = _child("delete", str(root), session_id, "trio")
    assert deleter.wait_line(lambda line: True, "answer") == "deleted"
    _finish(deleter)
    assert _stored(root, project, session_id) is None


def test_verify_and_show_read_the_killed_transcript(tmp_path: Path, api: MessagesServer) -> None:
    """``verify`` and ``show`` on the store a SIGKILLed session left: the CLI's entries read in
    the claude-code dialect (the responses counted), the call the kill left open said as a
    warning (the CLI closes it itself on resume), no problem, nothing unrecognised."""
    root, project, session_id, stored = _kill_in_tool(tmp_path, api, "asyncio")

    def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "checkpointer", *map(str, args)]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)

    verified = cli("verify", root)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "1 tool call(s) open at the end" in verified.stdout, verified.stdout
    assert "unrecognised" not in verified.stdout and "0 bad" in verified.stdout
    key = session_key({"project_key": project, "session_id": session_id})
    shown = cli("show", root, "--", key)
    assert shown.returncode == 0, shown.stderr
    responses = {e["message"]["id"] for e in stored if e.get("type") == "assistant"}
    assert f"turns            {len(responses)} (assistant messages)" in shown.stdout, shown.stdout
