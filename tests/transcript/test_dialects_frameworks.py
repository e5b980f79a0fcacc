"""Repaired histories go back through each framework's own model-request path, offline.

``close_dangling_tool_calls`` and ``settle_running`` produce messages of the
call's dialect; here each framework takes them back: pydantic-ai's agent
run with a ``FunctionModel`` (and pydantic-ai's own ``repair_messages``
finds nothing left to do), the Agents SDK's ``Runner`` with a
``ScriptedModel`` and its chat-completions converter, and a LangGraph graph
(``add_messages``, a ``ToolNode``).  The models check their input as a
provider's API does (``tests/children/adapter_child.py``).  Without the
repair each framework refuses the history, which shows the check can fail.
No network.  Asyncio only for the SDK's runner, which runs on asyncio.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")
pytest.importorskip("agents")
pytest.importorskip("langgraph")
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

from checkpointer import Transcript
from checkpointer.messages import (
    CLOSED_CALL_TEXT,
    close_dangling_tool_calls,
    settle_running,
    validate_history,
)
from tests.children.adapter_child import (
    langchain_problems,
    langgraph_graph,
    openai_agent,
    pydantic_agent,
    pydantic_problems,
    responses_problems,
)

# -- pydantic-ai ------------------------------------------------------------------------


def _pydantic_history(json: bool, follower: bool) -> list[Any]:
    """A response with two calls, one answered; then (``follower``) the user spoke again."""
    from pydantic_ai.messages import (
        ModelMessagesTypeAdapter,
        ModelRequest,
        ModelResponse,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )

    calls = [ToolCallPart("lookup", {"q": q}, tool_call_id=f"c-{q}") for q in ("a", "b")]
    history: list[Any] = [
        ModelRequest(parts=[UserPromptPart("hi")]),
        ModelResponse(parts=list(calls)),
    ]
    if follower:
        answered = ToolReturnPart("lookup", "answer:a", tool_call_id="c-a")
        history.append(ModelRequest(parts=[answered, UserPromptPart("hello?")]))
    return list(ModelMessagesTypeAdapter.dump_python(history, mode="json")) if json else history


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # where pydantic-ai's agents run
@pytest.mark.parametrize("json", [False, True], ids=["objects", "json"])
@pytest.mark.parametrize("follower", [False, True], ids=["at-the-end", "then-a-request"])
async def test_pydantic_ai_runs_on_the_repaired_history(
    json: bool, follower: bool, anyio_backend: str
) -> None:
    """pydantic-ai refuses a history with an unanswered call; the repaired one runs, and its
    ``repair_messages`` finds nothing left to repair."""
    from pydantic_ai.exceptions import UserError
    from pydantic_ai.messages import ModelMessagesTypeAdapter, ToolReturnPart, repair_messages

    history = _pydantic_history(json, follower)
    repaired, count = close_dangling_tool_calls(history)
    assert count == (1 if follower else 2)
    messages = list(ModelMessagesTypeAdapter.validate_python(repaired)) if json else repaired
    assert repair_messages(messages) == messages
    assert not pydantic_problems(messages)
    agent = pydantic_agent()
    unrepaired = list(ModelMessagesTypeAdapter.validate_python(history)) if json else history
    if not follower:
        with pytest.raises(UserError, match="unprocessed tool calls"):
            await agent.run("next", message_history=unrepaired)
    result = await agent.run("next", message_history=messages)
    assert result.output.startswith("done: ")  # the scripted model answered
    closed = [
        p
        for m in result.all_messages()
        for p in m.parts
        if isinstance(p, ToolReturnPart) and p.content == CLOSED_CALL_TEXT
    ]
    assert [p.tool_call_id for p in closed] == (["c-b"] if follower else ["c-a", "c-b"])
    assert all(p.outcome == "interrupted" for p in closed)


def _approval_agent() -> Any:
    """An agent whose model calls ``lookup`` and ``delete`` (which needs approval) at once."""
    from pydantic_ai import Agent, DeferredToolRequests
    from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    def model(messages: list[Any], info: AgentInfo) -> ModelResponse:
        if sum(isinstance(m, ModelRequest) for m in messages) == 1:
            calls = [ToolCallPart("lookup", {}, tool_call_id="A")]
            return ModelResponse(parts=[*calls, ToolCallPart("delete", {}, tool_call_id="D")])
        return ModelResponse(parts=[TextPart("done")])

    agent: Any = Agent(FunctionModel(model), output_type=[str, DeferredToolRequests])

    @agent.tool_plain  # type: ignore[untyped-decorator]
    def lookup() -> str:
        return "found"

    @agent.tool_plain(requires_approval=True)  # type: ignore[untyped-decorator]
    def delete() -> str:
        return "deleted"

    return agent


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # where pydantic-ai's agents run
@pytest.mark.parametrize("json", [False, True], ids=["objects", "json"])
async def test_pydantic_ai_approval_flow_is_sendable_and_stays_pending(
    json: bool, anyio_backend: str, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The call awaiting approval is reported pending and stored open (not closed as
    interrupted), the stored copy
    resumes with ``deferred_tool_results``, and the approved history (two requests in a row)
    passes ``validate_history``, ``transcript_prepare`` and ``verify``."""
    from pydantic_ai import DeferredToolRequests, DeferredToolResults
    from pydantic_ai.messages import ModelMessagesTypeAdapter, ToolReturnPart

    from checkpointer import CheckpointWriter, FileStore, Snapshot, load
    from checkpointer._cli import main
    from checkpointer._transcript.prepare import transcript_prepare as prepare
    from checkpointer._values import Prepared

    def form(messages: list[Any]) -> list[Any]:
        return (
            list(ModelMessagesTypeAdapter.dump_python(messages, mode="json")) if json else messages
        )

    agent = _approval_agent()
    waiting = await agent.run("go")
    assert isinstance(waiting.output, DeferredToolRequests)
    pending = form(waiting.all_messages())  # [request, response(A, D), request(return A)]
    assert [(p.kind, p.call_id, "pending" in p.detail) for p in validate_history(pending)] == [
        ("unclosed-call", "D", True)
    ]
    prepared = prepare()(Snapshot("k", {"messages": pending}))
    assert isinstance(prepared, Prepared) and prepared.repaired == 0
    store = FileStore(tmp_path)
    async with CheckpointWriter(
        lambda: Snapshot("k", {"messages": pending}),
        store,
        exit_hooks=False,
        transcript=Transcript(fingerprint=False),
    ) as writer:
        await writer.write_now()
    checkpoint = load(store, "k")  # what a killed process comes back with
    assert checkpoint is not None
    stored = list(ModelMessagesTypeAdapter.validate_python(checkpoint.state["messages"]))
    approved = await agent.run(
        message_history=stored, deferred_tool_results=DeferredToolResults(approvals={"D": True})
    )
    assert approved.output == "done"
    after = form(approved.all_messages())
    returns = [p for m in approved.all_messages() for p in m.parts if isinstance(p, ToolReturnPart)]
    assert [(p.tool_call_id, p.content) for p in returns] == [("A", "found"), ("D", "deleted")]
    assert validate_history(after) == []
    prepared = prepare()(Snapshot("k", {"messages": after}))
    assert isinstance(prepared, Prepared) and prepared.repaired == 0
    async with CheckpointWriter(
        lambda: Snapshot("k", {"messages": after}), store, exit_hooks=False
    ) as writer:
        await writer.write_now()
    capsys.readouterr()
    assert main(["verify", str(tmp_path)]) == 0
    assert "BAD" not in capsys.readouterr().out


# -- OpenAI Agents SDK ---------------------------------------------------------------------

CALLS: list[dict[str, Any]] = [
    {"type": "function_call", "call_id": "f", "name": "lookup", "arguments": "{}"},
    {"type": "custom_tool_call", "call_id": "cu", "name": "patch", "input": "abc"},
    {
        "type": "computer_call",
        "call_id": "co",
        "id": "cc1",
        "action": {"type": "click", "button": "left", "x": 1, "y": 2},
        "pending_safety_checks": [],
        "status": "completed",
    },
    {"type": "shell_call", "call_id": "sh", "action": {"commands": ["ls"]}},
    {
        "type": "apply_patch_call",
        "call_id": "ap",
        "operation": {"type": "delete_file", "path": "a"},
        "status": "completed",
    },
]


@pytest.mark.parametrize("call", CALLS, ids=[c["type"] for c in CALLS])
def test_responses_outputs_are_valid_input_items(call: dict[str, Any]) -> None:
    """Each call type is answered by the output item the Responses API's own input type
    takes (``ResponseInputItemParam``); a settled output in progress is one too."""
    import pydantic
    from openai.types.responses import ResponseInputItemParam

    items = pydantic.TypeAdapter(list[ResponseInputItemParam])
    history = [{"role": "user", "content": "go"}, call]
    repaired, count = close_dangling_tool_calls(history)
    assert count == 1
    items.validate_python(repaired)
    running = {**repaired[2], "status": "in_progress"}
    settled, count = settle_running([*history, running])
    assert count == 1
    items.validate_python(settled)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_agents_sdk_runs_on_the_repaired_session(anyio_backend: str) -> None:
    """The SDK's runner hands the model the repaired call and its output (it would drop a
    call without one); its chat-completions converter makes a sendable chat history of it."""
    from agents import Runner
    from agents.memory import SQLiteSession
    from agents.models.chatcmpl_converter import Converter

    items: list[Any] = [
        {"role": "user", "content": "delete it"},
        {"type": "function_call", "call_id": "c0", "name": "lookup", "arguments": "{}"},
    ]
    assert responses_problems(items)
    repaired, count = close_dangling_tool_calls(items)
    assert count == 1 and not responses_problems(repaired)
    chat = Converter.items_to_messages(repaired)
    assert validate_history(list(chat)) == []
    session = SQLiteSession("s")  # in memory
    await session.add_items(repaired)
    agent = openai_agent()
    result = await Runner.run(agent, "next", session=session)
    assert result.final_output == "done: answer:next"
    first = list(agent.model.calls[0].input)  # what the model was sent first
    assert first[:3] == repaired
    assert first[2]["output"] == CLOSED_CALL_TEXT


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_agents_sdk_approval_pause_is_stored_open_and_resumes(
    anyio_backend: str, tmp_path: Any
) -> None:
    """The SDK's pause for a ``needs_approval`` tool is stored as the SDK keeps it (the call
    open, not closed as interrupted), and its RunState resumes on the stored items with one
    output for the call, not two."""
    from agents import Agent, Runner, function_tool
    from agents.memory import SQLiteSession
    from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

    from checkpointer import CheckpointWriter, FileStore, Snapshot, load

    @function_tool(needs_approval=True)
    def delete(path: str) -> str:
        """Delete a file."""
        return f"deleted {path}"

    model = ScriptedModel(
        [
            ModelStep.respond(lambda call: [function_call("delete", {"path": "/x"}, call_id="D")]),
            ModelStep.respond(lambda call: [assistant_message("done")]),
        ]
    )
    agent = Agent(name="a", model=model, tools=[delete])
    session = SQLiteSession("s")
    paused = await Runner.run(agent, "delete it", session=session)
    assert paused.interruptions
    items: list[Any] = list(await session.get_items())
    store = FileStore(tmp_path)
    async with CheckpointWriter(
        lambda: Snapshot("k", {"messages": items}),
        store,
        exit_hooks=False,
        transcript=Transcript(fingerprint=False),
    ) as writer:
        written = await writer.write_now(force=True)
    assert getattr(written, "repaired", None) == 0
    checkpoint = load(store, "k")
    assert checkpoint is not None and checkpoint.state["messages"] == items
    resumed = SQLiteSession("s2")  # a new process: the stored items, the saved RunState
    await resumed.add_items(checkpoint.state["messages"])
    state = paused.to_state()
    for interruption in paused.interruptions:
        state.approve(interruption)
    result = await Runner.run(agent, state, session=resumed)
    assert result.final_output == "done"
    after: list[Any] = list(await resumed.get_items())
    outputs = [i for i in after if i.get("type") == "function_call_output"]
    assert [(o["call_id"], o["output"]) for o in outputs] == [("D", "deleted /x")]
    assert validate_history(after) == []


# -- LangChain / LangGraph -------------------------------------------------------------


def _langchain_history(form: str) -> list[Any]:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage, messages_to_dict

    calls: list[Any] = [{"name": "lookup", "args": {"q": q}, "id": f"c-{q}"} for q in "ab"]
    history = [
        HumanMessage("hi"),
        AIMessage("", tool_calls=calls),
        ToolMessage("answer:a", tool_call_id="c-a", name="lookup"),
    ]
    if form == "dump":
        return [m.model_dump() for m in history]
    if form == "dict":
        return list(messages_to_dict(history))
    return list(history)


def _as_messages(form: str, messages: list[Any]) -> list[Any]:
    """What a LangChain user does with stored dicts: ``messages_from_dict`` for its own form;
    ``model_dump`` dicts go into the graph as they are (``add_messages`` converts them)."""
    from langchain_core.messages import messages_from_dict

    return list(messages_from_dict(messages)) if form == "dict" else messages


@pytest.mark.parametrize("form", ["objects", "dump", "dict"])
def test_langgraph_runs_on_the_repaired_messages(form: str) -> None:
    """A LangGraph graph refuses messages with an unanswered call; the repaired ones run."""
    from langchain_core.messages import HumanMessage, ToolMessage

    history = _langchain_history(form)
    repaired, count = close_dangling_tool_calls(history)
    assert count == 1
    graph = langgraph_graph(None)
    with pytest.raises(ValueError, match="No tool output found for tool call c-b"):
        graph.invoke({"messages": [*_as_messages(form, history), HumanMessage("next")]})
    out = graph.invoke({"messages": [*_as_messages(form, repaired), HumanMessage("next")]})
    messages = out["messages"]
    assert not langchain_problems(messages)
    assert messages[-1].content == "done: answer:next"
    closed = messages[3]
    assert isinstance(closed, ToolMessage)
    assert (closed.tool_call_id, closed.status) == ("c-b", "error")
    assert closed.content == CLOSED_CALL_TEXT


@pytest.mark.parametrize("form", ["dump", "dict"])
def test_langchain_takes_a_settled_tool_message_back(form: str) -> None:
    """A stored ToolMessage dict still ``running`` (no object can be) settles to an ``error``
    one that langchain-core converts back, and the graph runs on."""
    from langchain_core.messages import HumanMessage, ToolMessage

    history = _langchain_history(form)[:2]
    for call_id in ("c-a", "c-b"):
        fields = {"type": "tool", "content": "", "tool_call_id": call_id, "status": "running"}
        history.append({"type": "tool", "data": fields} if form == "dict" else fields)
    settled, count = settle_running(history)
    assert count == 2
    messages = _as_messages(form, settled)
    out = langgraph_graph(None).invoke({"messages": [*messages, HumanMessage("next")]})
    tools = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [m.status for m in tools[:2]] == ["error", "error"]
    assert out["messages"][-1].content == "done: answer:next"
