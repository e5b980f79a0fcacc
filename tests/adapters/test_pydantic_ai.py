"""checkpointer.pydantic_ai: pydantic-ai's ConversationStore over CheckpointWriters.

The store's own operations (the framework's ``load``/``save``/``branch``/
``fork``/``delete`` over our five primitives) run on asyncio and trio: the
adapter is anyio.  The agent runs (``FunctionModel``, ``agent.iter``) are on
asyncio, where pydantic-ai's agents run.  The crash tests kill a real agent
process inside a tool (``tests/children/adapter_child.py``).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import pydantic
import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai.conversation import Conversation
from pydantic_ai.conversation_store import ConversationConflict
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from checkpointer import JournalStore, load
from checkpointer.pydantic_ai import (
    CheckpointConversationStore,
    CheckpointFailed,
    conversation_key,
    run_key,
)
from tests._support import ROOT
from tests.children.adapter_child import crash_in_tool, pydantic_agent, pydantic_problems

pytestmark = pytest.mark.anyio


def _turn(text: str) -> list[ModelMessage]:
    return [
        ModelRequest(parts=[UserPromptPart(text)]),
        ModelResponse(parts=[ToolCallPart("lookup", {"q": text}, tool_call_id=f"c-{text}")]),
        ModelRequest(parts=[ToolReturnPart("lookup", f"answer:{text}", tool_call_id=f"c-{text}")]),
        ModelResponse(parts=[TextPart(f"done {text}")]),
    ]


async def _saved(store: CheckpointConversationStore, cid: str, *texts: str) -> Conversation:
    conversation = await store.load(cid) or Conversation(conversation_id=cid)
    for text in texts:
        conversation.messages.extend(_turn(text))
    await store.save(conversation)
    return conversation


async def test_save_load_roundtrip(tmp_path: Path) -> None:
    """Saved messages load back equal, in a fresh store on the same root."""
    async with CheckpointConversationStore(JournalStore(tmp_path)) as store:
        saved = await _saved(store, "c1", "a", "b")
    fresh = CheckpointConversationStore(JournalStore(tmp_path))
    loaded = await fresh.load("c1")
    assert loaded is not None
    assert loaded.messages == saved.messages
    assert loaded.revision == saved.revision


async def test_a_save_that_adds_is_an_append(tmp_path: Path) -> None:
    """A second save appends its messages and the record; it is no compaction."""
    journal = JournalStore(tmp_path)
    async with CheckpointConversationStore(journal) as store:
        conversation = await _saved(store, "c1", "a")
        before = journal.statistics(conversation_key("c1"))
        conversation.messages.extend(_turn("b"))
        await store.save(conversation)
        after = journal.statistics(conversation_key("c1"))
    assert after.compactions == before.compactions
    assert after.rewrites == before.rewrites
    assert after.appends == before.appends + 1


async def test_binary_content_roundtrip(tmp_path: Path) -> None:
    """Bytes in a message (an image) load back as the framework's own JSON round trip gives."""
    image = BinaryContent(data=b"\x89PNG\x00\xff", media_type="image/png")
    message = ModelRequest(parts=[UserPromptPart(["look", image])])
    async with CheckpointConversationStore(JournalStore(tmp_path)) as store:
        await store.save(Conversation(conversation_id="c1", messages=[message]))
    loaded = await CheckpointConversationStore(JournalStore(tmp_path)).load("c1")
    assert loaded is not None
    own = ModelMessagesTypeAdapter.validate_json(ModelMessagesTypeAdapter.dump_json([message]))
    assert loaded.messages == own
    part: Any = loaded.messages[0].parts[0]
    assert part.content[1].data == b"\x89PNG\x00\xff"


async def test_stale_revision_is_a_conflict(tmp_path: Path) -> None:
    """Saving a copy loaded before another save raises ConversationConflict."""
    async with CheckpointConversationStore(JournalStore(tmp_path)) as store:
        await _saved(store, "c1", "a")
        first = await store.load("c1")
        second = await store.load("c1")
        assert first is not None and second is not None
        first.messages.extend(_turn("b"))
        await store.save(first)
        second.messages.extend(_turn("c"))
        with pytest.raises(ConversationConflict):
            await store.save(second)
        with pytest.raises(ConversationConflict):  # new, but one of that id exists
            await store.save(Conversation(conversation_id="c1", messages=_turn("d")))


async def test_concurrent_saves_one_wins(tmp_path: Path) -> None:
    """Two tasks saving copies of one revision at once: one is stored, the other conflicts."""
    import anyio

    async with CheckpointConversationStore(JournalStore(tmp_path)) as store:
        await _saved(store, "c1", "a")
        copies = [await store.load("c1") for _ in range(2)]
        outcomes: list[str] = []

        async def save(conversation: Conversation | None, text: str) -> None:
            assert conversation is not None
            conversation.messages.extend(_turn(text))
            try:
                await store.save(conversation)
                outcomes.append("saved")
            except ConversationConflict:
                outcomes.append("conflict")

        async with anyio.create_task_group() as tg:
            tg.start_soon(save, copies[0], "x")
            tg.start_soon(save, copies[1], "y")
        assert sorted(outcomes) == ["conflict", "saved"]
        loaded = await store.load("c1")
        assert loaded is not None and len(loaded.messages) == 8


async def test_branch_fork_delete_list(tmp_path: Path) -> None:
    """branch, fork, list and delete work through the framework's own methods."""
    async with CheckpointConversationStore(JournalStore(tmp_path)) as store:
        await _saved(store, "c1", "a", "b")
        loaded = await store.load("c1")
        assert loaded is not None
        fork = await store.fork("c1", at=4, new_conversation_id="f1")
        assert fork.messages == loaded.messages[:4]
        branched = await store.branch("c1", at=4, expected_revision=loaded.revision)
        branched.messages.extend(_turn("c"))
        await store.save(branched)
        record = await store.read_record("c1")
        assert record is not None and len(record.branches) == 1
        ids = {r.conversation_id for r in await store.list_conversations()}
        assert ids == {"c1", "f1"}
        await store.delete("c1")
        assert await store.load("c1") is None
        assert not (tmp_path / f"{conversation_key('c1')}.jsonl").exists()
    fresh = CheckpointConversationStore(JournalStore(tmp_path))
    forked = await fresh.load("f1")  # it copied what it forked: the source is gone
    assert forked is not None and forked.messages == loaded.messages[:4]


def test_conflict_across_processes(tmp_path: Path) -> None:
    """Another process's save of a held conversation, or of a stale copy, is a conflict."""
    import anyio

    script = textwrap.dedent(
        f"""
        import sys, anyio
        from pydantic_ai.conversation_store import ConversationConflict
        from checkpointer import JournalStore
        from checkpointer.pydantic_ai import CheckpointConversationStore
        from tests.adapters.test_pydantic_ai import _turn

        async def main():
            async with CheckpointConversationStore(JournalStore({str(tmp_path)!r})) as store:
                for line in sys.stdin:
                    conversation = await store.load("c1")
                    conversation.messages.extend(_turn(line.strip()))
                    try:
                        await store.save(conversation)
                        print("saved", flush=True)
                    except ConversationConflict:
                        print("conflict", flush=True)
                    await store.release("c1")
        anyio.run(main)
        """
    )

    async def scenario() -> None:
        async with CheckpointConversationStore(JournalStore(tmp_path)) as store:
            await _saved(store, "c1", "a")  # we hold c1's writer (and lock)
            # Blocking pipes on purpose: the child never needs this loop to answer.
            with subprocess.Popen(  # noqa: ASYNC220
                [sys.executable, "-c", script],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                cwd=ROOT,
                text=True,
            ) as child:
                assert child.stdin is not None and child.stdout is not None
                child.stdin.write("held\n")
                child.stdin.flush()
                assert child.stdout.readline().strip() == "conflict"  # locked by us
                stale = await store.load("c1")
                assert stale is not None
                await store.release("c1")
                child.stdin.write("free\n")
                child.stdin.flush()
                assert child.stdout.readline().strip() == "saved"
                child.stdin.close()
                assert child.wait(timeout=120) == 0
            stale.messages.extend(_turn("late"))
            with pytest.raises(ConversationConflict):
                await store.save(stale)  # the child saved after our load
            fresh = await store.load("c1")
            assert fresh is not None and len(fresh.messages) == 8
            fresh.messages.extend(_turn("ok"))
            await store.save(fresh)

    anyio.run(scenario)


# -- agent runs (asyncio) ------------------------------------------------------------


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_checkpoint_run_is_removed_after_save(tmp_path: Path, anyio_backend: str) -> None:
    """A run checkpointed per node and then saved leaves no run key behind."""
    agent = pydantic_agent()
    async with CheckpointConversationStore(JournalStore(tmp_path)) as store:
        conversation = Conversation(conversation_id="c1")
        async with store.checkpoint_run(conversation, durability="sync") as checkpoint:
            async with agent.iter("hello", conversation=conversation) as run:
                async for _node in checkpoint.nodes(run):
                    assert (tmp_path / f"{run_key('c1')}.jsonl").exists()
            assert run.result is not None
            await store.save(run.result)
    assert not (tmp_path / f"{run_key('c1')}.jsonl").exists()
    loaded = await CheckpointConversationStore(JournalStore(tmp_path)).load("c1")
    assert loaded is not None and len(loaded.messages) == 4


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_signal_handlers_restored_after_close(tmp_path: Path, anyio_backend: str) -> None:
    """A run checkpoint and conversation writers, all closed: SIGTERM/SIGHUP are as before."""
    import signal

    before = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)]
    agent = pydantic_agent()
    async with CheckpointConversationStore(JournalStore(tmp_path)) as store:
        conversation = Conversation(conversation_id="c1")
        async with store.checkpoint_run(conversation) as checkpoint:
            async with agent.iter("hello", conversation=conversation) as run:
                async for _node in checkpoint.nodes(run):
                    pass
            assert run.result is not None
            await store.save(run.result)
    assert [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)] == before


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("pydantic-crash")
    assert crash_in_tool("pydantic_ai", str(base)) == {"KILL": -9, "TERM": -15}
    return base


async def _continue(store: CheckpointConversationStore, conversation: Conversation) -> Any:
    agent = pydantic_agent()
    result = await agent.run("fourth", conversation=conversation)
    assert not pydantic_problems(result.all_messages())
    await store.save(result)
    return result


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_resume_after_sigkill_inside_a_tool(crashed: Path, anyio_backend: str) -> None:
    """SIGKILL mid-tool: the two saved turns resume, and the agent goes on from them."""
    async with CheckpointConversationStore(JournalStore(crashed / "KILL")) as store:
        conversation = await store.resume("chat")
        assert conversation is not None and len(conversation.messages) == 8
        await _continue(store, conversation)
        reloaded = await store.load("chat")
    assert reloaded is not None and len(reloaded.messages) == 12


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_resume_after_sigterm_inside_a_tool(crashed: Path, anyio_backend: str) -> None:
    """SIGTERM mid-tool: the run's messages were flushed; resumed, repaired, accepted, saved."""
    root = crashed / "TERM"
    assert load(JournalStore(root), run_key("chat")) is not None
    async with CheckpointConversationStore(JournalStore(root)) as store:
        conversation = await store.resume("chat")
        assert conversation is not None
        assert conversation.new_message_index == 8
        tail = conversation.messages[8:]
        assert isinstance(tail[1], ModelResponse) and isinstance(tail[1].parts[0], ToolCallPart)
        returned = tail[2].parts[0]
        assert isinstance(returned, ToolReturnPart)  # synthesized by repair_messages
        assert returned.tool_call_id == tail[1].parts[0].tool_call_id
        result = await _continue(store, conversation)
        reloaded = await store.load("chat")
    assert reloaded is not None
    assert reloaded.messages == result.all_messages()
    assert not pydantic_problems(reloaded.messages)
    assert len(reloaded.messages) > 11


# -- values msgspec cannot encode, and close against a save ---------------------------


class Weather(pydantic.BaseModel):
    city: str
    temp: float


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_tool_returning_a_pydantic_model_is_saved(
    tmp_path: Path, anyio_backend: str
) -> None:
    """A BaseModel a tool returns (and one in metadata) is saved as the framework dumps it."""
    from pydantic_ai import Agent
    from pydantic_ai.models.test import TestModel

    agent: Any = Agent(TestModel())

    @agent.tool_plain  # type: ignore[untyped-decorator]
    def weather(city: str) -> Weather:
        return Weather(city=city, temp=12.5)

    async with CheckpointConversationStore(JournalStore(tmp_path)) as store:
        conversation = Conversation(conversation_id="c1")
        async with (
            store.checkpoint_run(conversation, durability="sync") as checkpoint,
            agent.iter("weather?", conversation=conversation) as run,
        ):
            async for _node in checkpoint.nodes(run):
                pass
        assert run.result is not None
        returned: Any = run.result.all_messages()[2].parts[0]
        returned.metadata = Weather(city="m", temp=1.0)
        await store.save(run.result)
        expected = ModelMessagesTypeAdapter.validate_json(run.result.all_messages_json())
    loaded = await CheckpointConversationStore(JournalStore(tmp_path)).load("c1")
    assert loaded is not None and loaded.messages == expected
    part: Any = loaded.messages[2].parts[0]
    assert part.content == {"city": "a", "temp": 12.5}


async def test_a_value_nothing_can_encode_is_a_failed_not_an_error(tmp_path: Path) -> None:
    """A run message nobody can encode: update() returns Failed("encode-failed"), logged."""
    conversation = Conversation(conversation_id="c1")
    messages = [*_turn("a")]
    messages[2] = ModelRequest(parts=[ToolReturnPart("lookup", object(), tool_call_id="c-a")])
    async with CheckpointConversationStore(JournalStore(tmp_path)) as store:
        async with store.checkpoint_run(conversation, durability="sync") as checkpoint:
            assert await checkpoint.checkpoint(messages[:2]) is None
            failed = await checkpoint.checkpoint(messages)
            assert failed is not None and failed.reason == "encode-failed"
            assert run_key("c1") in failed.error
        stored = load(JournalStore(tmp_path), run_key("c1"))
        assert stored is not None and len(stored.state["messages"]) == 2
        conversation.messages.extend(messages)
        with pytest.raises(CheckpointFailed) as raised:
            await store.save(conversation)
        assert raised.value.result.reason == "encode-failed"
        assert "'c1'" in str(raised.value)


@pytest.mark.parametrize("closing", ["aclose", "release"])
async def test_close_during_a_save_is_no_conflict(tmp_path: Path, closing: str) -> None:
    """aclose()/release() from another task while a save runs: the save lands, no conflict."""
    store = CheckpointConversationStore(JournalStore(tmp_path))
    await _saved(store, "c", "first")
    conversation = await store.load("c")
    assert conversation is not None
    for i in range(300):
        conversation.messages.extend(_turn(f"t{i}" + "x" * 200))
    started = anyio.Event()
    real = store._write

    def write(*args: Any) -> Any:
        anyio.from_thread.run_sync(started.set)
        return real(*args)

    store._write = write  # type: ignore[method-assign,assignment]
    async with anyio.create_task_group() as tg:
        tg.start_soon(store.save, conversation)
        await started.wait()  # the save holds the write lock from here on
        await (store.aclose() if closing == "aclose" else store.release("c"))
    await store.aclose()
    loaded = await CheckpointConversationStore(JournalStore(tmp_path)).load("c")
    assert loaded is not None and len(loaded.messages) == 4 + 1200
