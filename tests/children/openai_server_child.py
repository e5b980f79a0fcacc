"""An Agents SDK server in a process of its own (``test_openai_agents_server.py``).

    python -m tests.children.openai_server_child COMMAND ROOT N

One ``CheckpointSessions`` over the ``FileStore`` at ``ROOT``; session ``s<i>``
(``i < N``) is a user's.

* ``many``: under ``tests._support.limit_descriptors()``, run one turn of the real ``Runner``
  (the offline model, a tool call) for every session, 64 requests at a time,
  then close; print the registry's statistics as JSON.
* ``hold``: run one turn for every session with changes debounced for an hour,
  keeping every key open; print ``ready``; sleep (the test sends SIGTERM).
* ``reopen``: add an item ``first`` to session ``chat``, wait until its key
  closes for idleness; print ``idle``; wait for a line on stdin (another
  process writes the session meanwhile); print the items' contents as JSON;
  run one turn; close; print ``done``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

from agents import Runner

from checkpointer import FileStore
from checkpointer.openai_agents import CheckpointSession, CheckpointSessions
from tests._support import MAX_OPEN, limit_descriptors
from tests.children.adapter_child import responses_problems


def agent() -> Any:
    """One turn's agent: the offline model calls the tool, then answers with its output; it
    refuses an input the Responses API would (a call without output, an output without call)."""
    from agents import Agent, function_tool
    from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

    @function_tool
    def lookup(q: str) -> str:
        """Look something up."""
        return f"answer:{q}"

    def respond(call: Any) -> Any:
        items = call.input if isinstance(call.input, list) else []
        if problems := responses_problems(items):
            raise ValueError("; ".join(problems))
        last = items[-1]
        if last.get("type") == "function_call_output":
            return [assistant_message(f"done: {last['output']}")]
        return [function_call("lookup", {"q": last["content"]}, call_id=f"c{len(items)}")]

    return Agent(name="a", model=ScriptedModel([ModelStep.respond(respond)] * 2), tools=[lookup])


async def many(root: str, n: int) -> None:
    limit_descriptors()
    keys = iter(range(n))

    async def requests() -> None:  # a server's: many users at once
        for i in keys:
            session = CheckpointSession(f"s{i}", sessions)
            result = await Runner.run(agent(), f"hi {i}", session=session)
            assert result.final_output == f"done: answer:hi {i}", result.final_output

    # Debounced for an hour: what reaches disk is each key's final write, at its eviction.
    options: dict[str, Any] = {"debounce": 3600.0, "max_wait": 3600.0, "max_open": MAX_OPEN}
    async with CheckpointSessions(FileStore(root), **options) as sessions:
        async with asyncio.TaskGroup() as tg:
            for _ in range(64):
                tg.create_task(requests())
        stats = sessions.registry.statistics()
    print(json.dumps({"opened": stats.opened, "evicted": stats.evicted, "failed": stats.failed}))


async def hold(root: str, n: int) -> None:
    options: dict[str, Any] = {"debounce": 3600.0, "max_wait": 3600.0, "max_open": n}
    async with CheckpointSessions(FileStore(root), **options) as sessions:
        for i in range(n):
            await Runner.run(agent(), f"hi {i}", session=CheckpointSession(f"s{i}", sessions))
        print("ready", flush=True)
        await asyncio.sleep(3600)


async def reopen(root: str) -> None:
    sessions = CheckpointSessions(FileStore(root), idle_timeout=0.05)
    session: Any = CheckpointSession("chat", sessions)
    async with sessions:
        await session.add_items([{"role": "user", "content": "first"}])
        while sessions.registry.statistics().closed_idle == 0:  # noqa: ASYNC110 -- a counter
            await asyncio.sleep(0.01)
        print("idle", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        print(json.dumps([i.get("content") for i in await session.get_items()]), flush=True)
        await Runner.run(agent(), "after", session=session)
    print("done", flush=True)


if __name__ == "__main__":
    command, root = sys.argv[1], sys.argv[2]
    if command in ("many", "hold"):
        asyncio.run((many if command == "many" else hold)(root, int(sys.argv[3])))
    else:
        asyncio.run(reopen(root))
