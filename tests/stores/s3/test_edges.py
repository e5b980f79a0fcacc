"""The S3 stores at the edges: each framework adapter writes and resumes on them, and the
command line lists, shows, verifies and prunes an ``s3://bucket/prefix``."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from checkpointer import CheckpointWriter, Snapshot, load
from tests._support import child_env
from tests.s3 import Place

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

KINDS = ["s3", "s3journal"]


@pytest.fixture
def place() -> Iterator[Place]:
    p = Place()
    yield p
    p.close()


@pytest.mark.parametrize("kind", KINDS)
def test_openai_agents_session_writes_and_resumes(place: Place, kind: str) -> None:
    """Two SDK turns, closed; a new session on a new store object goes on from them."""
    from agents import Runner

    from checkpointer.openai_agents import CheckpointSession
    from tests.children.adapter_child import openai_agent

    async def run() -> None:
        async with CheckpointSession("chat", place.store(kind)) as session:
            for turn in ("a", "b"):
                await Runner.run(openai_agent(), turn, session=session)
            assert len(await session.get_items()) == 8
        async with CheckpointSession("chat", place.store(kind)) as session:
            result = await Runner.run(openai_agent(), "c", session=session)
            assert result.final_output == "done: answer:c"
            assert len(await session.get_items()) == 12

    anyio.run(run)


@pytest.mark.parametrize("kind", KINDS)
def test_pydantic_ai_conversation_store_writes_and_resumes(place: Place, kind: str) -> None:
    """Messages saved, loaded back equal by a fresh store, saved again on top."""
    from pydantic_ai.conversation import Conversation
    from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart

    from checkpointer.pydantic_ai import CheckpointConversationStore

    def turn(text: str) -> list[Any]:
        return [ModelRequest(parts=[UserPromptPart(text)]), ModelResponse(parts=[TextPart(text)])]

    async def run() -> None:
        async with CheckpointConversationStore(place.store(kind)) as store:
            conversation = Conversation(conversation_id="c1")
            conversation.messages.extend(turn("a"))
            await store.save(conversation)
        async with CheckpointConversationStore(place.store(kind)) as fresh:
            loaded = await fresh.load("c1")
            assert loaded is not None and loaded.messages == conversation.messages
            loaded.messages.extend(turn("b"))
            await fresh.save(loaded)
        again = await CheckpointConversationStore(place.store(kind)).load("c1")
        assert again is not None and len(again.messages) == 4

    anyio.run(run)


@pytest.mark.parametrize("kind", KINDS)
def test_langgraph_saver_writes_and_resumes(place: Place, kind: str) -> None:
    """Two graph turns; a fresh saver on a new store object has the same state and goes on."""
    from langchain_core.messages import HumanMessage

    from checkpointer.langgraph import CheckpointSaver
    from tests.children.adapter_child import CONFIG, langgraph_graph

    async def run() -> None:
        async with CheckpointSaver(place.store(kind)) as saver:
            graph = langgraph_graph(saver)
            for text in ("a", "b"):
                await graph.ainvoke({"messages": [HumanMessage(text)]}, CONFIG, durability="sync")
            before = (await graph.aget_state(CONFIG)).values["messages"]
        async with CheckpointSaver(place.store(kind)) as fresh:
            graph = langgraph_graph(fresh)
            assert (await graph.aget_state(CONFIG)).values["messages"] == before
            await graph.ainvoke({"messages": [HumanMessage("c")]}, CONFIG, durability="sync")
            assert len((await graph.aget_state(CONFIG)).values["messages"]) > len(before)

    anyio.run(run)


def _cli(place: Place, *args: str) -> subprocess.CompletedProcess[str]:
    env = child_env(place.env)
    command = [sys.executable, "-m", "checkpointer", *args, "--endpoint-url", place.proxy.url]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)


def test_the_commands_list_show_verify_and_prune_an_s3_prefix(place: Place) -> None:
    """ls lists both kinds, show reads a journal's segments, verify checks them, prune
    removes what is older than asked (and a journal's segments with its head)."""
    for kind in KINDS:
        store = place.store(kind)
        state = {"messages": [{"role": "user", "content": f"hello {kind}"}]}

        async def write(store: Any = store, state: dict[str, Any] = state) -> None:
            async with CheckpointWriter(lambda: Snapshot("k", state), store, exit_hooks=False):
                pass

        anyio.run(write)
    root = f"s3://{place.bucket}/agents"
    listed = _cli(place, "ls", root)
    assert listed.returncode == 0, listed.stderr
    assert "snapshot" in listed.stdout and "journal" in listed.stdout
    shown = _cli(place, "show", root, "k")
    assert shown.returncode == 0 and "hello" in shown.stdout, shown.stderr
    verified = _cli(place, "verify", root)
    assert verified.returncode == 0 and "2 ok, 0 bad" in verified.stdout, verified.stdout
    pruned = _cli(place, "prune", root, "--older-than", "0s")
    assert pruned.returncode == 0, pruned.stderr
    assert "removed 2 checkpoint(s)" in pruned.stdout, pruned.stdout
    journal = place.store("s3journal")
    assert load(journal, "k") is None and journal.listing("k.segments/") == []
    missing = _cli(place, "ls", "s3://no-such-bucket-here/x")
    assert missing.returncode == 1
    assert "no bucket 'no-such-bucket-here'" in missing.stderr, missing.stderr


def test_the_docs_s3_examples_run_twice(place: Place, tmp_path: Path) -> None:
    """The docs' S3 examples (docs-test: s3), against moto's server through
    AWS_ENDPOINT_URL_S3, each run twice in one directory (the second resumes the first)."""
    from tests.docblocks import pages, python_blocks, run_twice

    blocks = [b for page in pages() for b in python_blocks(page) if b.mode == "s3"]
    assert blocks, "the docs have no S3 example"
    client = place.server.client()
    for bucket in ("agent-sessions",):
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=bucket)
    old = os.environ.get("AWS_ENDPOINT_URL_S3")
    os.environ["AWS_ENDPOINT_URL_S3"] = place.proxy.url
    try:
        for block in blocks:
            run_twice(block, tmp_path)
    finally:
        if old is None:
            del os.environ["AWS_ENDPOINT_URL_S3"]
        else:
            os.environ["AWS_ENDPOINT_URL_S3"] = old
