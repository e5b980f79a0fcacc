"""A Google ADK agent over ``CheckpointSessionService``: for ``tests/adapters/test_google_adk*.py``.

    python -m tests.children.adk_child COMMAND ROOT

On a ``JournalStore(ROOT)``, session ``APP``/``USER``/``SESSION``:

* ``crash``: one turn with a tool call (the tool sets ``user:``, ``app:``,
  session and ``temp:`` state), then a second turn whose tool prints
  ``in-tool PID`` and blocks: the test kills it there.
* ``hold``: create the session (which takes its key), print ``holding``,
  wait for a line on stdin, close.
* ``append`` / ``delete``: append one event to the session (or delete it)
  and print ``ok``, or the error's class name and message on one line.
* ``many N``: a server under ``ulimit -n DESCRIPTORS`` (``tests._support``,
  ``limit_descriptors``; so is ``let-go``): ``N`` sessions ``s<i>``
  created, each given one user message ``q<i>`` (an event, no model call:
  a Runner's turn costs 0.1 s of CPU), the service closed; print ``done``.
* ``let-go N``: one turn of the session, then ``N`` other sessions created
  (its key's lock let go past the process's bound); print ``let-go``; wait
  for a line on stdin (another process appends); a turn (print ``saved`` or
  the error's class name), then the turn again; print ``saved``.

The model is a ``BaseLlm`` of ours, offline: a ``function_call`` (with an
id) to the tool, then text once the tool's ``function_response`` is in the
request; it raises, as Gemini's API would, on a call without its response.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncGenerator
from typing import Any

from google.adk.agents import LlmAgent
from google.adk.events import Event, EventActions
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.tools.tool_context import ToolContext
from google.genai import types

from checkpointer import JournalStore
from checkpointer.google_adk import CheckpointSessionService
from tests._support import limit_descriptors

APP, USER, SESSION = "app", "user-1", "chat"
_block = {"on": False}


def gemini_problems(contents: list[types.Content]) -> list[str]:
    """What Gemini would reject: a function_call not answered in the next content, an orphan."""
    problems: list[str] = []
    open_ids: set[str | None] = set()
    for content in contents:
        parts = content.parts or []
        answered = {p.function_response.id for p in parts if p.function_response}
        problems.extend(f"function_response without its call: {i}" for i in answered - open_ids)
        problems.extend(f"function_call without its response: {i}" for i in open_ids - answered)
        open_ids = {p.function_call.id for p in parts if p.function_call}
    return problems


class ScriptedLlm(BaseLlm):
    """Call ``lookup`` once per user message, then answer with the tool's result."""

    model: str = "scripted"

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        contents = llm_request.contents
        problems = gemini_problems(contents)
        if problems:
            raise ValueError("; ".join(problems))
        parts = contents[-1].parts or []
        answer = next((p.function_response for p in parts if p.function_response), None)
        if answer is not None:
            text = f"done: {(answer.response or {}).get('result')}"
            yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text=text)]))
            return
        call = types.FunctionCall(
            id=f"call-{len(contents)}", name="lookup", args={"q": parts[0].text or ""}
        )
        yield LlmResponse(
            content=types.Content(role="model", parts=[types.Part(function_call=call)])
        )


async def lookup(q: str, tool_context: ToolContext) -> str:
    """Look something up; count the lookups in user, app and session state."""
    state = tool_context.state
    state["user:lookups"] = state.get("user:lookups", 0) + 1
    state["app:last_query"] = q
    state["turn_query"] = q
    state["temp:scratch"] = "never stored"
    if _block["on"]:
        os.write(1, f"in-tool {os.getpid()}\n".encode())
        await asyncio.sleep(3600)
    return f"answer:{q}"


def runner(service: CheckpointSessionService) -> Runner:
    agent = LlmAgent(name="a", model=ScriptedLlm(), tools=[lookup])
    return Runner(agent=agent, app_name=APP, session_service=service)


async def turn(
    service: CheckpointSessionService, text: str, session_id: str = SESSION
) -> list[Event]:
    """Run one user turn; the events it produced."""
    message = types.Content(role="user", parts=[types.Part(text=text)])
    return [
        event
        async for event in runner(service).run_async(
            user_id=USER, session_id=session_id, new_message=message
        )
    ]


async def server(service: CheckpointSessionService, command: str, n: int) -> None:
    """``many`` and ``let-go``: a server's many sessions."""
    if command == "let-go":
        await service.create_session(app_name=APP, user_id=USER, session_id=SESSION)
        await turn(service, "first")
    for i in range(n):
        session = await service.create_session(app_name=APP, user_id=USER, session_id=f"s{i}")
        if command == "many":
            text = types.Content(role="user", parts=[types.Part(text=f"q{i}")])
            await service.append_event(session, Event(author="user", content=text))
    if command == "many":
        print("done", flush=True)
        return
    print("let-go", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    try:
        await turn(service, "second")
    except Exception as exc:  # told to the test on stdout
        print(type(exc).__name__, flush=True)
    else:
        print("saved", flush=True)
    await turn(service, "third")
    print("saved", flush=True)


async def main(command: str, root: str, *n: str) -> None:
    if n:
        limit_descriptors()
    async with CheckpointSessionService(JournalStore(root)) as service:
        if n:
            await server(service, command, int(n[0]))
        elif command == "crash":
            await service.create_session(app_name=APP, user_id=USER, session_id=SESSION)
            await turn(service, "first")
            _block["on"] = True
            await turn(service, "second")
        elif command == "hold":
            await service.create_session(app_name=APP, user_id=USER, session_id=SESSION)
            print("holding", flush=True)
            sys.stdin.readline()
        else:
            try:
                if command == "append":
                    session: Any = await service.get_session(
                        app_name=APP, user_id=USER, session_id=SESSION
                    )
                    event = Event(
                        author="user", actions=EventActions(state_delta={"x": 1, "user:x": 1})
                    )
                    await service.append_event(session, event)
                else:
                    await service.delete_session(app_name=APP, user_id=USER, session_id=SESSION)
            except Exception as exc:  # told to the test on stdout
                print(type(exc).__name__, str(exc).replace("\n", " "), flush=True)
            else:
                print("ok", flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
