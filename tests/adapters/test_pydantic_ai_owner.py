"""checkpointer.pydantic_ai under the ownership contract: runs, deletes, other processes.

A conversation is two keys (``conversation_key``, ``run_key``); these tests
pin who may write or delete them.  The agents are pydantic-ai's own offline
models; the other processes are real ones (``tests/children/pydantic_child.py``)
on the same root, killed with SIGKILL inside a tool where a test says so.
Agent runs are on asyncio (pydantic-ai's agents run there); the store's own
operations on both backends.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent
from pydantic_ai.conversation import Conversation
from pydantic_ai.conversation_store import ConversationConflict
from pydantic_ai.messages import ModelRequest, ModelResponse, ToolCallPart, UserPromptPart
from pydantic_ai.models.test import TestModel

from checkpointer import FileStore, JournalStore
from checkpointer.pydantic_ai import (
    CheckpointConversationStore,
    CheckpointFailed,
    conversation_key,
    run_key,
)
from checkpointer.stores import Store
from tests._support import ROOT, child_env
from tests.children.adapter_child import pydantic_problems
from tests.children.pydantic_child import agent as child_agent

pytestmark = pytest.mark.anyio

STORES = {"file": FileStore, "journal": JournalStore}


@pytest.fixture(params=sorted(STORES))
def kind(request: pytest.FixtureRequest) -> str:
    """Each test runs on FileStore and JournalStore."""
    return str(request.param)


def _store(kind: str, root: Path) -> Store:
    store: Store = STORES[kind](root)
    return store


class _Child:
    """A ``pydantic_child`` process: lines in and out, killed if it outlives the test's patience."""

    def __init__(self, kind: str, root: Path, *args: str) -> None:
        command = [sys.executable, "-m", "tests.children.pydantic_child", args[0], f"{kind}:{root}"]
        self.proc = subprocess.Popen(
            [*command, *args[1:]],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=child_env(),
        )
        self._watchdog = threading.Timer(120, self.proc.kill)  # a hang fails, not the suite
        self._watchdog.start()

    def line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def wait(self) -> int:
        try:
            return self.proc.wait()
        finally:
            self._watchdog.cancel()


@contextmanager
def _child(kind: str, root: Path, *args: str) -> Iterator[_Child]:
    child = _Child(kind, root, *args)
    try:
        yield child
    finally:
        if child.proc.poll() is None:
            child.proc.kill()
        child.wait()
        for stream in (child.proc.stdin, child.proc.stdout):
            if stream is not None:
                stream.close()


def _kill_in_tool(kind: str, root: Path, prompt: str) -> None:
    with _child(kind, root, "run", prompt) as child:
        assert child.line() == f"in-tool {child.proc.pid}"
        os.kill(child.proc.pid, signal.SIGKILL)
        assert child.wait() == -signal.SIGKILL


def _prompts(messages: list[Any]) -> list[str]:
    return [
        str(part.content)
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, UserPromptPart)
    ]


def _calls(messages: list[Any]) -> int:
    return sum(
        isinstance(part, ToolCallPart)
        for message in messages
        if isinstance(message, ModelResponse)
        for part in message.parts
    )


# -- a run killed, resumed, killed again ------------------------------------------------


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_resumed_run_killed_again_keeps_both_runs(
    tmp_path: Path, kind: str, anyio_backend: str
) -> None:
    """SIGKILL in a tool, resume, SIGKILL in the next run's tool: resume() has both runs."""
    _kill_in_tool(kind, tmp_path, "first")
    _kill_in_tool(kind, tmp_path, "second")  # resumed the first run, then killed
    async with CheckpointConversationStore(_store(kind, tmp_path)) as store:
        resumed = await store.resume("chat")
        assert resumed is not None
        assert _prompts(resumed.messages) == ["first", "second"]
        assert _calls(resumed.messages) == 2
        assert not pydantic_problems(resumed.messages)
        result = await child_agent().run("third", conversation=resumed)
        await store.save(result)
    loaded = await CheckpointConversationStore(_store(kind, tmp_path)).load("chat")
    assert loaded is not None
    assert _prompts(loaded.messages) == ["first", "second", "third"]
    assert not pydantic_problems(loaded.messages)


# -- delete -------------------------------------------------------------------------------


def _test_agent() -> Any:
    agent: Any = Agent(TestModel())

    @agent.tool_plain  # type: ignore[untyped-decorator]
    def lookup(q: str) -> str:
        return f"answer:{q}"

    return agent


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_delete_removes_the_run_key_too(
    tmp_path: Path, kind: str, anyio_backend: str
) -> None:
    """The docs' example (saved after its run block), then delete: nothing resumes, no key stays."""
    async with CheckpointConversationStore(_store(kind, tmp_path)) as store:
        conversation = Conversation(conversation_id="c1")
        async with (
            store.checkpoint_run(conversation) as checkpoint,
            _test_agent().iter("hello", conversation=conversation) as run,
        ):
            async for _node in checkpoint.nodes(run):
                pass
        assert run.result is not None
        await store.save(run.result)
    async with CheckpointConversationStore(_store(kind, tmp_path)) as store:
        await store.delete("c1")
        assert await store.resume("c1") is None
    assert _store(kind, tmp_path).keys() == []


async def test_delete_of_a_conversation_never_saved_removes_its_run(
    tmp_path: Path, kind: str
) -> None:
    """A run of a new conversation that never reached save: delete() leaves nothing to resume."""
    async with CheckpointConversationStore(_store(kind, tmp_path)) as store:
        conversation = Conversation(conversation_id="c1")
        async with store.checkpoint_run(conversation, durability="sync") as checkpoint:
            await checkpoint.checkpoint([ModelRequest(parts=[UserPromptPart("hi")])])
        resumed = await store.resume("c1")
        assert resumed is not None and _prompts(resumed.messages) == ["hi"]
        await store.delete("c1")
        assert await store.resume("c1") is None
    assert _store(kind, tmp_path).keys() == []


def test_delete_while_another_process_saves_is_refused(tmp_path: Path, kind: str) -> None:
    """Another process holds the conversation: delete raises naming it, and its next save lands."""
    import anyio

    with _child(kind, tmp_path, "hold") as child:
        assert child.line() == "held"

        async def delete() -> None:
            async with CheckpointConversationStore(_store(kind, tmp_path)) as store:
                with pytest.raises(CheckpointFailed) as raised:
                    await store.delete("chat")
                assert raised.value.result.reason == "locked"
                assert f"pid {child.proc.pid}" in str(raised.value)
                assert "'chat'" in str(raised.value)

        anyio.run(delete)
        child.send("go")
        assert child.line() == "saved"
        assert child.wait() == 0
    loaded = anyio.run(CheckpointConversationStore(_store(kind, tmp_path)).load, "chat")
    assert loaded is not None and _prompts(loaded.messages) == ["one", "two"]


def test_delete_while_another_process_runs_is_refused(tmp_path: Path, kind: str) -> None:
    """A run in flight in another process (its conversation saved before): delete is refused."""
    import anyio

    with _child(kind, tmp_path, "hold") as holder:  # a first turn, saved
        assert holder.line() == "held"
        holder.send("go")
        assert holder.line() == "saved"
    with _child(kind, tmp_path, "run-hold", "three") as child:
        assert child.line() == f"in-tool {child.proc.pid}"

        async def delete() -> None:
            async with CheckpointConversationStore(_store(kind, tmp_path)) as store:
                with pytest.raises(CheckpointFailed) as raised:
                    await store.delete("chat")
                assert raised.value.result.reason == "locked"
                assert f"pid {child.proc.pid}" in str(raised.value)
                assert run_key("chat") in str(raised.value)

        anyio.run(delete)
        child.send("go")
        assert child.line() == "saved"
        assert child.wait() == 0
    loaded = anyio.run(CheckpointConversationStore(_store(kind, tmp_path)).load, "chat")
    assert loaded is not None and _prompts(loaded.messages) == ["one", "two", "three"]


# -- two runs of one conversation --------------------------------------------------------


async def test_a_second_run_in_this_process_raises(tmp_path: Path, kind: str) -> None:
    """Two checkpoint_run()s of one conversation at once: the second raises on entry, naming us."""
    async with CheckpointConversationStore(_store(kind, tmp_path)) as store:
        first = Conversation(conversation_id="c1")
        async with store.checkpoint_run(first, durability="sync") as checkpoint:
            with pytest.raises(CheckpointFailed) as raised:
                async with store.checkpoint_run(Conversation(conversation_id="c1")):
                    pytest.fail("a second run of c1 was let in")
            assert raised.value.result.reason == "locked"
            assert f"pid {os.getpid()}" in str(raised.value)
            await checkpoint.checkpoint([ModelRequest(parts=[UserPromptPart("mine")])])
        resumed = await store.resume("c1")
    assert resumed is not None and _prompts(resumed.messages) == ["mine"]


async def test_runs_entering_at_once_let_one_in(tmp_path: Path, kind: str) -> None:
    """Six runs of one conversation entering at the same moment, 20 times: one enters each time."""
    import anyio

    async with CheckpointConversationStore(_store(kind, tmp_path)) as store:
        for round_ in range(20):
            outcomes: list[str] = []
            entered = anyio.Event()

            async def run(outcomes: list[str] = outcomes, entered: anyio.Event = entered) -> None:
                try:
                    async with store.checkpoint_run(Conversation(conversation_id="c1")):
                        outcomes.append("entered")
                        if len(outcomes) < 6:
                            await entered.wait()  # in until every other run has tried
                except CheckpointFailed as exc:
                    outcomes.append(exc.result.reason)
                if len(outcomes) == 6:
                    entered.set()

            async with anyio.create_task_group() as tg:
                for _ in range(6):
                    tg.start_soon(run)
            assert sorted(outcomes).count("entered") == 1, (round_, outcomes)
            assert set(outcomes) <= {"entered", "locked", "conflict"}


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_run_while_another_process_runs_raises(
    tmp_path: Path, kind: str, anyio_backend: str
) -> None:
    """A run in flight in another process: checkpoint_run() raises on entry, naming it."""
    with _child(kind, tmp_path, "run-hold", "theirs") as child:
        assert child.line() == f"in-tool {child.proc.pid}"
        async with CheckpointConversationStore(_store(kind, tmp_path)) as store:
            with pytest.raises(CheckpointFailed) as raised:
                async with store.checkpoint_run(Conversation(conversation_id="chat")):
                    pytest.fail("a second run of chat was let in")
            assert raised.value.result.reason == "locked"
            assert f"pid {child.proc.pid}" in str(raised.value)
        child.send("go")
        assert child.line() == "saved"
        assert child.wait() == 0
    loaded = await CheckpointConversationStore(_store(kind, tmp_path)).load("chat")
    assert loaded is not None and _prompts(loaded.messages) == ["theirs"]


# -- deleted under a writer: never written back ---------------------------------------


async def test_a_run_whose_key_was_deleted_is_not_written_back(tmp_path: Path, kind: str) -> None:
    """The run key deleted under a run: its close raises, and the key stays deleted."""
    raw = _store(kind, tmp_path)
    async with CheckpointConversationStore(raw) as store:
        with pytest.raises(CheckpointFailed) as raised:
            async with store.checkpoint_run(Conversation(conversation_id="c1")) as checkpoint:
                raw.delete(run_key("c1"))  # this store object holds it: not refused
                checkpoint.update([ModelRequest(parts=[UserPromptPart("lost")])])
        assert raised.value.result.reason == "conflict"
        assert "deleted" in str(raised.value)
    assert raw.keys() == []


async def test_a_conversation_deleted_under_its_writer_is_not_written_back(
    tmp_path: Path, kind: str
) -> None:
    """The conversation key deleted under this process's writer: the next save conflicts."""
    raw = _store(kind, tmp_path)
    async with CheckpointConversationStore(raw) as store:
        conversation = Conversation(
            conversation_id="c1", messages=[ModelRequest(parts=[UserPromptPart("a")])]
        )
        await store.save(conversation)
        raw.delete(conversation_key("c1"))
        conversation.messages.append(ModelRequest(parts=[UserPromptPart("b")]))
        with pytest.raises(ConversationConflict) as raised:
            await store.save(conversation)
        assert isinstance(raised.value.__cause__, CheckpointFailed)
        assert "deleted" in str(raised.value.__cause__)
        assert await store.load("c1") is None
    assert raw.keys() == []


# -- an empty first look is fenced ------------------------------------------------------


def _pausing(
    kind: str, root: Path, paused: str, looked: threading.Event, go: threading.Event
) -> Store:
    """A store whose first read of key ``paused`` waits, once read, until ``go`` is set."""

    def pause(key: str) -> None:
        if key == paused and not looked.is_set():
            looked.set()
            go.wait(60)

    class PausingFile(FileStore):
        def read(self, key: str) -> bytes | None:
            data = super().read(key)
            pause(key)
            return data

    class PausingJournal(JournalStore):
        def read_checkpoint(self, key: str) -> Any:
            checkpoint = super().read_checkpoint(key)
            pause(key)
            return checkpoint

    store: Store = PausingFile(root) if kind == "file" else PausingJournal(root)
    return store


async def test_a_new_conversation_saved_by_another_meanwhile_is_refused(
    tmp_path: Path, kind: str
) -> None:
    """Looked, found nothing; another store saves it and lets go; this write is refused."""
    import anyio
    from pydantic_ai.conversation_store import ConversationEntry, ConversationRecord

    looked, go = threading.Event(), threading.Event()
    late = CheckpointConversationStore(_pausing(kind, tmp_path, conversation_key("c1"), looked, go))
    entry = ConversationEntry(parent_id=None, message=ModelRequest(parts=[UserPromptPart("late")]))
    record = ConversationRecord(conversation_id="c1", head_id=entry.id)
    outcome: list[BaseException] = []

    async def write_late() -> None:
        try:
            await late.write_record(record, new_entries=[entry], expected_revision=None)
        except ConversationConflict as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(write_late)
        await anyio.to_thread.run_sync(looked.wait)  # it found no c1: a new conversation
        async with CheckpointConversationStore(_store(kind, tmp_path)) as first:
            await first.save(Conversation(conversation_id="c1", messages=_turn_of("first")))
        go.set()
    await late.aclose()
    assert len(outcome) == 1 and "another writer" in str(outcome[0].__cause__)
    loaded = await CheckpointConversationStore(_store(kind, tmp_path)).load("c1")
    assert loaded is not None and _prompts(loaded.messages) == ["first"]


def _turn_of(text: str) -> list[Any]:
    return [ModelRequest(parts=[UserPromptPart(text)])]


async def test_a_run_whose_key_was_written_meanwhile_is_refused(tmp_path: Path, kind: str) -> None:
    """A run read its key; another run of c1 wrote it and ended; this run raises on entry."""
    import anyio

    looked, go = threading.Event(), threading.Event()
    late = CheckpointConversationStore(_pausing(kind, tmp_path, run_key("c1"), looked, go))
    outcome: list[CheckpointFailed] = []

    async def run_late() -> None:
        try:
            async with late.checkpoint_run(Conversation(conversation_id="c1")):
                pytest.fail("a run entered over another run's messages")
        except CheckpointFailed as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(run_late)
        await anyio.to_thread.run_sync(looked.wait)
        async with CheckpointConversationStore(_store(kind, tmp_path)) as first:
            conversation = Conversation(conversation_id="c1")
            async with first.checkpoint_run(conversation, durability="sync") as checkpoint:
                await checkpoint.checkpoint(_turn_of("first"))
        go.set()
    await late.aclose()
    assert len(outcome) == 1 and outcome[0].result.reason == "conflict"
    resumed = await CheckpointConversationStore(_store(kind, tmp_path)).resume("c1")
    assert resumed is not None and _prompts(resumed.messages) == ["first"]
