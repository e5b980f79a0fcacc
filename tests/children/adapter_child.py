"""Agents of the three frameworks, killed inside a tool: for ``tests/adapters/test_*.py``.

    python -m tests.children.adapter_child FRAMEWORK ROOT

``FRAMEWORK`` is ``openai_agents``, ``pydantic_ai`` or ``langgraph``.  The
program imports the framework once, then forks its agents (``AGENTS``): one
for ``KILL`` and one for ``TERM``, and for LangGraph an ``UNPUT`` one too
(see ``langgraph_crash``), each under ``ROOT/<name>`` on a ``JournalStore``.
Each agent runs two turns with a tool call each, made durable, then a third
turn whose tool announces ``in-tool SIG PID`` on stdout and blocks: the
parent test sends that signal to that pid.  This program reaps them and
prints ``exit NAME CODE`` for each, then exits 0.

The scripted models here are the frameworks' own offline test models
(``agents.testing.ScriptedModel``, pydantic-ai's ``FunctionModel``, and a
plain LangGraph node), each checking its input the way a provider's API
does: a tool call without its result, or a result without its call, is an
error, as OpenAI's "No tool output found for function call" is.  The tests
import these builders to resume the sessions in-process.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, TypedDict

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

TURNS = ["first", "second", "third"]
SLOW: dict[str, Any] = {
    "debounce": 1000.0,
    "max_wait": 1000.0,
}  # nothing written by the timer: only what we say
_block: dict[str, str | None] = {"signal": None}
_ready: list[asyncio.Event] = []  # set: announce only once it is set (LangGraph)


async def _in_tool() -> None:
    """Block inside the tool when asked to: announce it, then wait for the signal."""
    signame = _block["signal"]
    if signame is None:
        return
    for ready in _ready:
        await ready.wait()
    os.write(1, f"in-tool {signame} {os.getpid()}\n".encode())
    await asyncio.sleep(3600)


# -- OpenAI Agents SDK -------------------------------------------------------------


def responses_problems(items: list[Any]) -> list[str]:
    """What the Responses API would reject: outputs without a call, calls without an output."""
    calls: list[str] = []
    problems: list[str] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call":
            calls.append(item["call_id"])
        elif item.get("type") == "function_call_output":
            if item["call_id"] not in calls:
                problems.append(f"No tool call found for function call output {item['call_id']}")
            else:
                calls.remove(item["call_id"])
    problems.extend(f"No tool output found for function call {call}" for call in calls)
    return problems


def openai_agent() -> Any:
    """An agent with one tool on a ScriptedModel that checks its input as the API would."""
    from agents import Agent, function_tool
    from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

    @function_tool
    async def lookup(q: str) -> str:
        """Look something up."""
        await _in_tool()
        return f"answer:{q}"

    count = [0]

    def respond(call: Any) -> Any:
        items = call.input if isinstance(call.input, list) else []
        problems = responses_problems(items)
        if problems:
            raise ValueError("; ".join(problems))
        count[0] += 1
        last = items[-1]
        if last.get("type") == "function_call_output":
            return [assistant_message(f"done: {last['output']}")]
        return [function_call("lookup", {"q": str(last.get("content"))}, call_id=f"c{count[0]}")]

    model = ScriptedModel([ModelStep.respond(respond) for _ in range(200)])
    return Agent(name="a", model=model, tools=[lookup])


async def openai_crash(root: str, signame: str) -> None:
    from agents import Runner

    from checkpointer import JournalStore
    from checkpointer.openai_agents import CheckpointSession

    agent = openai_agent()
    async with CheckpointSession("chat", JournalStore(root), **SLOW) as session:
        for turn in TURNS[:2]:
            await Runner.run(agent, turn, session=session)
        await session.writer.write_now()
        _block["signal"] = signame
        await Runner.run(agent, TURNS[2], session=session)


# -- pydantic-ai -------------------------------------------------------------------


def pydantic_problems(messages: list[Any]) -> list[str]:
    """Tool calls of a response not answered in the request right after it, and orphans."""
    from pydantic_ai.messages import ModelResponse, ToolCallPart, ToolReturnPart

    problems: list[str] = []
    open_calls: set[str] = set()
    for message in messages:
        if isinstance(message, ModelResponse):
            problems.extend(f"No tool output found for tool call {c}" for c in sorted(open_calls))
            open_calls = {p.tool_call_id for p in message.parts if isinstance(p, ToolCallPart)}
        else:
            for part in message.parts:
                if isinstance(part, ToolReturnPart):
                    if part.tool_call_id not in open_calls:
                        problems.append(f"No tool call found for output {part.tool_call_id}")
                    open_calls.discard(part.tool_call_id)
            if open_calls:
                problems.extend(f"No tool output found for tool call {c}" for c in open_calls)
                open_calls = set()
    return problems


def pydantic_agent() -> Any:
    """An agent with one tool on a FunctionModel that checks its input as an API would."""
    from pydantic_ai import Agent
    from pydantic_ai.messages import (
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    def model(messages: list[Any], info: AgentInfo) -> ModelResponse:
        problems = pydantic_problems(messages)
        if problems:
            raise ValueError("; ".join(problems))
        last = messages[-1]
        returns = [p for p in last.parts if isinstance(p, ToolReturnPart)]
        if returns:
            return ModelResponse(parts=[TextPart(f"done: {returns[-1].content}")])
        prompt = next(p.content for p in last.parts if isinstance(p, UserPromptPart))
        call = ToolCallPart("lookup", {"q": str(prompt)}, tool_call_id=f"call-{len(messages)}")
        return ModelResponse(parts=[call])

    agent: Any = Agent(FunctionModel(model))

    @agent.tool_plain  # type: ignore[untyped-decorator]
    async def lookup(q: str) -> str:
        await _in_tool()
        return f"answer:{q}"

    return agent


async def pydantic_crash(root: str, signame: str) -> None:
    from pydantic_ai.conversation import Conversation

    from checkpointer import JournalStore
    from checkpointer.pydantic_ai import CheckpointConversationStore

    agent = pydantic_agent()
    async with CheckpointConversationStore(JournalStore(root), **SLOW) as store:
        conversation = Conversation(conversation_id="chat")
        for turn in TURNS[:2]:
            result = await agent.run(turn, conversation=conversation)
            await store.save(result)
            conversation = result.conversation
        _block["signal"] = signame
        async with (
            store.checkpoint_run(conversation) as checkpoint,
            agent.iter(TURNS[2], conversation=conversation) as run,
        ):
            async for _node in checkpoint.nodes(run):
                pass


# -- LangGraph -------------------------------------------------------------------


def langchain_problems(messages: list[Any]) -> list[str]:
    """AI tool calls not answered by the ToolMessages right after them, and orphans."""
    from langchain_core.messages import AIMessage, ToolMessage

    problems: list[str] = []
    open_calls: set[str] = set()
    for message in messages:
        if isinstance(message, ToolMessage):
            if message.tool_call_id not in open_calls:
                problems.append(f"No tool call found for output {message.tool_call_id}")
            open_calls.discard(message.tool_call_id)
            continue
        problems.extend(f"No tool output found for tool call {c}" for c in sorted(open_calls))
        open_calls = set()
        if isinstance(message, AIMessage):
            open_calls = {str(call["id"]) for call in message.tool_calls}
    return problems


def langgraph_graph(saver: Any, calls: list[str] | None = None) -> Any:
    """A model node and a ToolNode, the model a plain function checking its input.

    ``calls``, if given, gets the last message's text at each model call.
    """
    from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
    from langchain_core.tools import StructuredTool
    from langgraph.graph import END, START, StateGraph
    from langgraph.graph.message import add_messages
    from langgraph.prebuilt import ToolNode, tools_condition

    # The functional form: evaluated here, not a string annotation to resolve later.
    State = TypedDict("State", {"messages": Annotated[list[AnyMessage], add_messages]})  # noqa: UP013

    async def alookup(q: str) -> str:
        await _in_tool()
        return f"answer:{q}"

    def slookup(q: str) -> str:
        return f"answer:{q}"

    lookup = StructuredTool.from_function(
        func=slookup, coroutine=alookup, name="lookup", description="Look something up."
    )

    def model(state: Any) -> dict[str, list[AIMessage]]:
        messages = state["messages"]
        problems = langchain_problems(messages)
        if problems:
            raise ValueError("; ".join(problems))
        last = messages[-1]
        if calls is not None:
            calls.append(str(last.content))
        if isinstance(last, ToolMessage):
            return {"messages": [AIMessage(f"done: {last.content}")]}
        call = {"name": "lookup", "args": {"q": str(last.content)}, "id": f"call-{len(messages)}"}
        return {"messages": [AIMessage("", tool_calls=[call])]}

    builder = StateGraph(State)
    builder.add_node("model", model)
    builder.add_node("tools", ToolNode([lookup]))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=saver)


CONFIG: Any = {"configurable": {"thread_id": "chat"}}  # a RunnableConfig


async def langgraph_crash(root: str, signame: str) -> None:
    """Two durable turns, then a third, ``"async"``, signalled in its tool.

    LangGraph's ``"async"`` durability puts a step's checkpoint from a
    background task chained after the previous put, so the tool node can be
    running before the checkpoint that schedules it reaches ``aput`` at all.
    The tool waits for that ``aput``, and that ``aput`` finds the worker
    threads busy (their limiter held), as on a loaded machine: the signal
    lands after LangGraph handed the checkpoint over and before a worker
    thread encoded it, each time.
    """
    await _langgraph_run(root, signame, hand_over=True)


async def langgraph_crash_unput(root: str, signame: str) -> None:
    """``langgraph_crash``, but the signal lands before that checkpoint reaches the saver.

    As when LangGraph's background put still waits for the previous one:
    ``aput`` of the checkpoint that schedules the tool node never returns
    and never calls the saver's.
    """
    await _langgraph_run(root, signame, hand_over=False)


async def _langgraph_run(root: str, signame: str, *, hand_over: bool) -> None:
    import anyio.to_thread
    from langchain_core.messages import HumanMessage

    from checkpointer import JournalStore
    from checkpointer.langgraph import CheckpointSaver

    ready = asyncio.Event()
    _ready.append(ready)

    class Saver(CheckpointSaver):
        async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            if _block["signal"] is not None and "branch:to:tools" in new_versions:
                if not hand_over:
                    ready.set()
                    await asyncio.Event().wait()
                limiter = anyio.to_thread.current_default_thread_limiter()
                limiter.total_tokens = 1
                await limiter.acquire_on_behalf_of(ready)  # never released
                ready.set()
            return await super().aput(config, checkpoint, metadata, new_versions)

    async with Saver(JournalStore(root), **SLOW) as saver:
        graph = langgraph_graph(saver)
        for turn in TURNS[:2]:
            await graph.ainvoke({"messages": [HumanMessage(turn)]}, CONFIG, durability="sync")
        _block["signal"] = signame
        await graph.ainvoke({"messages": [HumanMessage(TURNS[2])]}, CONFIG, durability="async")


Crash = Callable[[str, str], Coroutine[Any, Any, None]]  # (root, signal name)

# Each framework's agents: (name, the signal it gets, the agent), under ROOT/<name>.
AGENTS: dict[str, list[tuple[str, str, Crash]]] = {
    "openai_agents": [("KILL", "KILL", openai_crash), ("TERM", "TERM", openai_crash)],
    "pydantic_ai": [("KILL", "KILL", pydantic_crash), ("TERM", "TERM", pydantic_crash)],
    "langgraph": [
        ("KILL", "KILL", langgraph_crash),
        ("TERM", "TERM", langgraph_crash),
        ("UNPUT", "TERM", langgraph_crash_unput),
    ],
}


def crash_in_tool(framework: str, base: str, *, timeout: float = 300.0) -> dict[str, int]:
    """Run this program; signal each agent once it is inside its tool; return the exit codes.

    Returns:
        Each agent's exit code (``-9``, ``-15``) by its name in ``AGENTS``.

    Raises:
        AssertionError: the program did not get there (its stderr is in the message).
    """
    import signal
    import subprocess
    import tempfile
    import threading

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "OPENAI_AGENTS_DISABLE_TRACING": "1", "PYTHONPATH": root}
    with tempfile.TemporaryFile() as errors:
        with subprocess.Popen(
            [sys.executable, "-m", "tests.children.adapter_child", framework, base],
            stdout=subprocess.PIPE,
            stderr=errors,
            cwd=root,
            env=env,
        ) as proc:
            watchdog = threading.Timer(timeout, proc.kill)  # a hang fails the test, not the suite
            watchdog.start()
            codes: dict[str, int] = {}
            try:
                assert proc.stdout is not None
                for raw in proc.stdout:
                    word, name, number = raw.decode().split()
                    if word == "in-tool":
                        os.kill(int(number), getattr(signal, "SIG" + name))
                    elif word == "exit":
                        codes[name] = int(number)
                proc.wait()
            finally:
                watchdog.cancel()
        errors.seek(0)
        done = proc.returncode == 0 and len(codes) == len(AGENTS[framework])
        assert done, errors.read().decode()[-3000:]
    return codes


def main() -> None:
    framework, base = sys.argv[1], sys.argv[2]
    if framework == "openai_agents":
        import agents  # noqa: F401 -- imported once, before the forks
    elif framework == "pydantic_ai":
        import pydantic_ai  # noqa: F401
    else:
        import langgraph.graph  # noqa: F401
    pids: dict[str, int] = {}
    for name, signame, crash in AGENTS[framework]:
        pid = os.fork()
        if pid == 0:
            try:
                asyncio.run(crash(os.path.join(base, name), signame))
            finally:
                os._exit(3)  # the agent returned or raised: it should have been killed
        pids[name] = pid
    for name, pid in pids.items():
        _, status = os.waitpid(pid, 0)
        os.write(1, f"exit {name} {os.waitstatus_to_exitcode(status)}\n".encode())


if __name__ == "__main__":
    main()
