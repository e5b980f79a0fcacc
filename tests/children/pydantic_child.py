"""A pydantic-ai agent on a ``CheckpointConversationStore`` (``test_adapter_pydantic_ai_owner``).

    python -m tests.children.pydantic_child COMMAND STORE [PROMPT]

``STORE`` is ``file:ROOT`` or ``journal:ROOT``; the conversation is ``"chat"``:

* ``run PROMPT``: ``resume`` the conversation (or start it), then run the
  agent on PROMPT under ``checkpoint_run(durability="sync")``; its tool
  prints ``in-tool PID`` and blocks, for the parent to SIGKILL it.
* ``run-hold PROMPT``: the same, but the tool then waits for a line on
  stdin (the run holds its run key meanwhile); the run is saved inside the
  ``checkpoint_run`` block and ``saved`` printed.
* ``hold``: save one turn (this process's writer then holds the key),
  print ``held``, wait for a line on stdin, save another turn, print
  ``saved``.

The model is a ``FunctionModel`` that calls the tool for every user prompt
and answers after its return, checking its input as a provider's API does
(``pydantic_problems``): a resumed history must be one a model accepts.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from tests.children.adapter_child import pydantic_problems

_tool: dict[str, str] = {"mode": "free"}  # "block", "wait": see run()


def agent() -> Any:
    """An agent whose model calls ``lookup`` for each user prompt, then answers."""
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, UserPromptPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    def model(messages: list[Any], info: AgentInfo) -> ModelResponse:
        problems = pydantic_problems(messages)
        if problems:
            raise ValueError("; ".join(problems))
        prompts = [p for p in messages[-1].parts if isinstance(p, UserPromptPart)]
        if not prompts:
            return ModelResponse(parts=[TextPart("done")])
        call = ToolCallPart(
            "lookup", {"q": str(prompts[-1].content)}, tool_call_id=f"call-{len(messages)}"
        )
        return ModelResponse(parts=[call])

    built: Any = Agent(FunctionModel(model))

    @built.tool_plain  # type: ignore[untyped-decorator]
    async def lookup(q: str) -> str:
        mode = _tool["mode"]
        if mode != "free":
            os.write(1, f"in-tool {os.getpid()}\n".encode())
        if mode == "block":
            await asyncio.sleep(3600)
        elif mode == "wait":
            await asyncio.to_thread(sys.stdin.readline)
        return f"answer:{q}"

    return built


def _store(spec: str) -> Any:
    from checkpointer import FileStore, JournalStore

    kind, root = spec.split(":", 1)
    return {"file": FileStore, "journal": JournalStore}[kind](root)


async def run(spec: str, prompt: str, *, hold: bool) -> None:
    from pydantic_ai.conversation import Conversation

    from checkpointer.pydantic_ai import CheckpointConversationStore

    _tool["mode"] = "wait" if hold else "block"
    async with CheckpointConversationStore(_store(spec)) as store:
        conversation = await store.resume("chat") or Conversation(conversation_id="chat")
        async with store.checkpoint_run(conversation, durability="sync") as checkpoint:
            async with agent().iter(prompt, conversation=conversation) as agent_run:
                async for _node in checkpoint.nodes(agent_run):
                    pass
            assert agent_run.result is not None
            await store.save(agent_run.result)
    print("saved", flush=True)


async def hold(spec: str) -> None:
    from pydantic_ai.conversation import Conversation

    from checkpointer.pydantic_ai import CheckpointConversationStore

    async with CheckpointConversationStore(_store(spec)) as store:
        conversation = await store.load("chat") or Conversation(conversation_id="chat")
        for prompt in ("one", "two"):
            result = await agent().run(prompt, conversation=conversation)
            await store.save(result)
            conversation = result.conversation
            print("held" if prompt == "one" else "saved", flush=True)
            if prompt == "one":
                await asyncio.to_thread(sys.stdin.readline)


def main() -> None:
    command, spec = sys.argv[1], sys.argv[2]
    if command == "hold":
        asyncio.run(hold(spec))
    else:
        asyncio.run(run(spec, sys.argv[3], hold=command == "run-hold"))


if __name__ == "__main__":
    main()
