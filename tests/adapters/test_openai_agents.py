"""checkpointer.openai_agents: the Agents SDK's Session over a CheckpointWriter.

Asyncio only: the Agents SDK runs on asyncio (its runner, tools and
``Session`` calls), not on trio, so these tests do not take the trio
backend.  The model is the SDK's own offline ``agents.testing.ScriptedModel``
with a responder that checks its input as the Responses API does; the crash
tests kill a real agent process inside a tool
(``tests/children/adapter_child.py``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

from agents import Runner
from agents.memory import Session, SessionSettings

from checkpointer import Failed, FileStore, JournalStore, load
from checkpointer.messages import CLOSED_CALL_TEXT, close_dangling_tool_calls
from checkpointer.openai_agents import CheckpointFailed, CheckpointSession, session_key
from tests._support import ROOT, child_env
from tests.children.adapter_child import crash_in_tool, openai_agent, responses_problems

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    """The Agents SDK is asyncio-only (see the module docstring)."""
    return "asyncio"


def _on_disk(root: Path, session_id: str = "chat") -> list[Any] | None:
    checkpoint = load(JournalStore(root), session_key(session_id))
    return None if checkpoint is None else list(checkpoint.state["messages"])


async def test_is_an_sdk_session(tmp_path: Path) -> None:
    """The SDK's runtime-checkable Session protocol accepts it."""
    async with CheckpointSession("chat", JournalStore(tmp_path)) as session:
        assert isinstance(session, Session)


async def test_turns_resume_from_disk(tmp_path: Path) -> None:
    """Two turns with tool calls, closed, reopened: the SDK goes on from the stored items."""
    agent = openai_agent()
    async with CheckpointSession("chat", JournalStore(tmp_path)) as session:
        for turn in ("a", "b"):
            await Runner.run(agent, turn, session=session)
        items = await session.get_items()
    assert _on_disk(tmp_path) == items
    assert len(items) == 8
    async with CheckpointSession("chat", JournalStore(tmp_path)) as session:
        result = await Runner.run(openai_agent(), "c", session=session)
        assert result.final_output == "done: answer:c"
        assert not responses_problems(await session.get_items())
        assert len(await session.get_items()) == 12


async def test_add_items_is_an_append(tmp_path: Path) -> None:
    """On a JournalStore each written change appends its items, no compaction."""
    journal = JournalStore(tmp_path)
    async with CheckpointSession("chat", journal, durability="sync") as session:
        start = journal.statistics(session.key)
        for turn in ("a", "b"):
            await Runner.run(openai_agent(), turn, session=session)
        end = journal.statistics(session.key)
    assert end.compactions == start.compactions
    assert end.appends == start.appends + 6  # input, call+output, answer: per turn


async def test_durability_sync_waits_for_the_write(tmp_path: Path) -> None:
    """durability="sync": add_items returns with the items on disk, whatever the debounce."""
    store = JournalStore(tmp_path)
    options: dict[str, Any] = {"debounce": 1000, "max_wait": 1000}
    async with CheckpointSession("chat", store, durability="sync", **options) as session:
        await session.add_items([{"role": "user", "content": "hi"}])
        assert _on_disk(tmp_path) == [{"role": "user", "content": "hi"}]


async def test_durability_async_is_debounced_then_closed(tmp_path: Path) -> None:
    """durability="async": add_items is a notify; the close writes what was pending."""
    options: dict[str, Any] = {"debounce": 1000, "max_wait": 1000}
    async with CheckpointSession("chat", JournalStore(tmp_path), **options) as session:
        await session.add_items([{"role": "user", "content": "hi"}])
        assert _on_disk(tmp_path) == []  # the first write, on entry, only
        assert session.writer.statistics().pending
    assert _on_disk(tmp_path) == [{"role": "user", "content": "hi"}]


async def test_get_pop_clear_and_limits(tmp_path: Path) -> None:
    """get_items(limit), session_settings.limit, pop_item and clear_session behave as the SDK's."""
    settings = SessionSettings(limit=2)
    store = JournalStore(tmp_path)
    async with CheckpointSession("chat", store, session_settings=settings) as opened:
        session: Any = opened  # items are the SDK's TypedDict union; plain dicts here
        await session.add_items([{"role": "user", "content": str(i)} for i in range(4)])
        assert [i["content"] for i in await session.get_items()] == ["2", "3"]
        assert [i["content"] for i in await session.get_items(limit=3)] == ["1", "2", "3"]
        assert await session.get_items(limit=0) == []
        got = await session.get_items(limit=1)
        got[0]["content"] = "changed"  # a copy
        assert (await session.pop_item()) == {"role": "user", "content": "3"}
        assert len(await session.get_items(limit=10)) == 3
        await session.clear_session()
        assert await session.get_items() == []
        assert await session.pop_item() is None
    assert _on_disk(tmp_path) == []


async def test_dangling_call_is_closed_on_load(tmp_path: Path) -> None:
    """A stored call without its output (another writer, a pop) gets an error output on load."""
    call: Any = {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"}
    async with CheckpointSession("chat", JournalStore(tmp_path), durability="sync") as session:
        await session.add_items([{"role": "user", "content": "hi"}, call])
    async with CheckpointSession("chat", JournalStore(tmp_path)) as session:
        items = await session.get_items()
        assert session.repaired == 1
        assert items[2] == {
            "type": "function_call_output",
            "call_id": "c1",
            "output": CLOSED_CALL_TEXT,
        }
        assert not responses_problems(items)
        result = await Runner.run(openai_agent(), "next", session=session)
        assert result.final_output == "done: answer:next"


def test_close_dangling_calls_leaves_answered_ones() -> None:
    """Only unanswered calls are closed, each right after its call; the input is not changed."""
    items = [
        {"type": "function_call", "call_id": "a"},
        {"type": "function_call", "call_id": "b"},
        {"type": "function_call_output", "call_id": "b", "output": "ok"},
    ]
    repaired, count = close_dangling_tool_calls(items)
    assert count == 1
    assert [(i["type"], i["call_id"]) for i in repaired] == [
        ("function_call", "a"),
        ("function_call_output", "a"),
        ("function_call", "b"),
        ("function_call_output", "b"),
    ]
    assert len(items) == 3


async def test_not_json_is_refused(tmp_path: Path) -> None:
    """An item that is not a JSON value is a TypeError saying what items must be."""
    async with CheckpointSession("chat", JournalStore(tmp_path)) as session:
        with pytest.raises(TypeError, match="JSON values"):
            await session.add_items([{"x": object()}])  # type: ignore[list-item]


async def test_unopened_session_says_how_to_open_it(tmp_path: Path) -> None:
    """A session used outside ``async with`` raises naming the way in."""
    with pytest.raises(RuntimeError, match="async with"):
        await CheckpointSession("chat", JournalStore(tmp_path)).get_items()


def test_session_keys() -> None:
    """A valid id is its own key; any other id maps to a digest key."""
    assert session_key("chat-1") == "chat-1"
    assert session_key("user/1").startswith("session-")
    assert session_key("") != session_key(".x")


# -- killed inside a tool ------------------------------------------------------------


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("openai-crash")
    assert crash_in_tool("openai_agents", str(base)) == {"KILL": -9, "TERM": -15}
    return base


async def _resume(root: Path) -> list[Any]:
    async with CheckpointSession("chat", JournalStore(root)) as session:
        resumed = await session.get_items()
        result = await Runner.run(openai_agent(), "fourth", session=session)
        assert result.final_output == "done: answer:fourth"
        items = await session.get_items()
    assert not responses_problems(items)
    assert items[: len(resumed)] == resumed
    return resumed


async def test_resume_after_sigkill_inside_a_tool(crashed: Path) -> None:
    """SIGKILL mid-tool: the two written turns resume; the SDK and the model accept them."""
    resumed = await _resume(crashed / "KILL")
    assert len(resumed) == 8


async def test_resume_after_sigterm_inside_a_tool(crashed: Path) -> None:
    """SIGTERM mid-tool: the third turn's input, still debounced, was flushed by the handler."""
    resumed = await _resume(crashed / "TERM")
    assert len(resumed) == 9
    assert resumed[-1] == {"role": "user", "content": "third"}


# -- a second process on the key; an approval resumed after a restart ----------------


def _child(command: str, store: str) -> Any:
    """``tests/children/session_child.py COMMAND STORE`` (``file:ROOT`` or ``journal:ROOT``)."""
    import subprocess
    import sys

    return subprocess.Popen(
        [sys.executable, "-m", "tests.children.session_child", command, store],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=child_env(),
    )


def _holder(root: Path) -> Any:
    return _child("hold", f"journal:{root}")


async def test_opening_a_locked_session_raises(tmp_path: Path) -> None:
    """Another process holds the key: entering raises, naming the key, the holder, the way out."""
    holder = _holder(tmp_path)
    try:
        assert holder.stdout.readline() == "open\n"
        with pytest.raises(CheckpointFailed) as raised:
            async with CheckpointSession("chat", JournalStore(tmp_path)):
                pass
        assert raised.value.result.reason == "locked"
        message = str(raised.value)
        assert "'chat'" in message and f"pid {holder.pid}" in message
        assert "lock_timeout=" in message and "key=" in message
    finally:
        holder.communicate("\n", timeout=120)
    assert holder.returncode == 0
    assert _on_disk(tmp_path) == [{"role": "user", "content": "from-holder"}]


async def test_a_conflict_at_close_raises(tmp_path: Path) -> None:
    """Another process wrote the key after this session loaded it: leaving the block raises."""
    async with CheckpointSession("chat", JournalStore(tmp_path), durability="sync") as first:
        await first.add_items([{"role": "user", "content": "first"}])
    session = CheckpointSession("chat", JournalStore(tmp_path), write_on_start=False)
    with pytest.raises(CheckpointFailed) as raised:
        async with session:
            holder = _holder(tmp_path)
            holder.communicate("\n", timeout=120)
            assert holder.returncode == 0
            await session.add_items([{"role": "user", "content": "from-me"}])
    assert raised.value.result.reason == "conflict"
    assert _on_disk(tmp_path) == [
        {"role": "user", "content": "first"},
        {"role": "user", "content": "from-holder"},
    ]


def _approval_agent() -> Any:
    from agents import Agent, function_tool
    from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

    @function_tool(needs_approval=True)
    async def delete_file(path: str) -> str:
        """Delete a file."""
        return f"deleted:{path}"

    def respond(call: Any) -> Any:
        items = call.input if isinstance(call.input, list) else []
        problems = responses_problems(items)
        if problems:
            raise ValueError("; ".join(problems))
        if items[-1].get("type") == "function_call_output":
            return [assistant_message(f"done: {items[-1]['output']}")]
        return [function_call("delete_file", {"path": "/tmp/x"}, call_id="call-1")]

    model = ScriptedModel([ModelStep.respond(respond) for _ in range(20)])
    return Agent(name="a", model=model, tools=[delete_file])


async def test_an_approval_resumed_after_a_restart_stores_one_output(tmp_path: Path) -> None:
    """A paused call, reopened (made-up output shown) then approved: disk has only the real one."""
    from agents import RunState

    async with CheckpointSession("chat", JournalStore(tmp_path)) as session:
        paused = await Runner.run(_approval_agent(), "delete it", session=session)
        assert paused.interruptions
        saved = paused.to_state().to_string()
    async with CheckpointSession("chat", JournalStore(tmp_path)) as session:
        assert session.repaired == 1  # shown, not stored
    assert [i.get("type", i.get("role")) for i in _on_disk(tmp_path) or []] == [
        "user",
        "function_call",
    ]
    agent = _approval_agent()
    async with CheckpointSession("chat", JournalStore(tmp_path)) as session:
        items: list[Any] = await session.get_items()
        assert items[2]["output"] == CLOSED_CALL_TEXT
        state = await RunState.from_string(agent, saved)
        for interruption in state.get_interruptions():
            state.approve(interruption)
        result = await Runner.run(agent, state, session=session)
        assert result.final_output == "done: deleted:/tmp/x"
        shown = await session.get_items()
    stored = _on_disk(tmp_path) or []
    assert stored == shown
    outputs = [i["output"] for i in stored if i.get("type") == "function_call_output"]
    assert outputs == ["deleted:/tmp/x"]
    assert not responses_problems(stored)


# -- the ownership contract: deletes, stale views, two processes on a new session -------

STORES = {"file": FileStore, "journal": JournalStore}


@pytest.fixture(params=sorted(STORES))
def kind(request: pytest.FixtureRequest) -> str:
    """Each test of the contract runs on FileStore and JournalStore."""
    return str(request.param)


def _stored(kind: str, root: Path) -> list[Any] | None:
    checkpoint = load(STORES[kind](root), "chat")
    return None if checkpoint is None else list(checkpoint.state["messages"])


def _answer(child: Any) -> str:
    out, _ = child.communicate("\n", timeout=120)
    assert child.returncode == 0
    return str(out).strip()


async def test_clear_or_delete_from_another_process_is_refused(tmp_path: Path, kind: str) -> None:
    """This session holds the key: another process's clear_session and Store.delete name us."""
    store = STORES[kind](tmp_path)
    async with CheckpointSession("chat", store, durability="sync") as session:
        await session.add_items([{"role": "user", "content": "mine"}])
        cleared = _answer(_child("clear", f"{kind}:{tmp_path}"))
        assert cleared.startswith("failed locked: ") and f"pid {os.getpid()}" in cleared
        deleted = _answer(_child("delete", f"{kind}:{tmp_path}"))
        assert deleted.startswith("refused: ") and f"pid {os.getpid()}" in deleted
        await session.add_items([{"role": "user", "content": "still mine"}])
    assert _stored(kind, tmp_path) == [
        {"role": "user", "content": "mine"},
        {"role": "user", "content": "still mine"},
    ]


@pytest.mark.parametrize("other", ["delete", "hold"])
async def test_a_session_changed_under_it_is_not_written(
    tmp_path: Path, kind: str, other: str
) -> None:
    """Deleted or written by another process before this session held it: refused, not undone."""
    store = STORES[kind](tmp_path)
    async with CheckpointSession("chat", store, durability="sync") as first:
        await first.add_items([{"role": "user", "content": "first"}])
    session = CheckpointSession("chat", store, write_on_start=False)  # loads, holds nothing yet
    with pytest.raises(CheckpointFailed) as at_close:
        async with session:
            assert _answer(_child(other, f"{kind}:{tmp_path}")) in ("deleted", "open")
            with pytest.raises(CheckpointFailed) as stale:
                await session.get_items()  # the items here are not what is stored
            assert stale.value.result.reason == "conflict"
            await session.add_items([{"role": "user", "content": "late"}])
            refused = await session.writer.write_now()
            assert isinstance(refused, Failed) and refused.reason == "conflict"
            with pytest.raises(CheckpointFailed):  # durability="async": the next change says so
                await session.add_items([{"role": "user", "content": "later"}])
    assert at_close.value.result.reason == "conflict"
    if other == "delete":
        assert "deleted" in str(stale.value) and "deleted" in str(at_close.value)
        assert _stored(kind, tmp_path) is None  # never written back
    else:
        assert _stored(kind, tmp_path) == [
            {"role": "user", "content": "first"},
            {"role": "user", "content": "from-holder"},
        ]


def test_two_processes_on_a_new_session(tmp_path: Path, kind: str) -> None:
    """Both load a new session (nothing there); the one that writes second is refused."""
    spec = f"{kind}:{tmp_path}"
    first, second = _child("late", spec), _child("late", spec)
    assert first.stdout.readline() == "ready\n"
    assert second.stdout.readline() == "ready\n"
    assert _answer(first) == "written"
    refused = _answer(second)
    assert refused.startswith("failed conflict: "), refused
    stored = _stored(kind, tmp_path)
    assert stored is not None and stored[0] == {"role": "user", "content": f"from-{first.pid}"}
    assert len(stored) == 4 and not responses_problems(stored)
