"""The frameworks' offline scripted models the ``adapters`` case drives.

One agent per framework with one ``lookup`` tool: each user turn gets a tool
call, each tool result an answer, as a model of a provider would.  They are
the same shapes as ``tests/children/adapter_child.py`` builds, without its
input checks (the adapters' tests make those; a benchmark only needs the
traffic) and without its blocking tool, so the benchmarks import nothing
from ``tests``.
"""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

CONFIG: Any = {"configurable": {"thread_id": "chat"}}  # a LangGraph RunnableConfig


def openai_agent() -> Any:
    """An OpenAI Agents SDK agent with one tool on the SDK's ``ScriptedModel``."""
    from agents import Agent, function_tool
    from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

    @function_tool
    async def lookup(q: str) -> str:
        """Look something up."""
        return f"answer:{q}"

    count = [0]

    def respond(call: Any) -> Any:
        items = call.input if isinstance(call.input, list) else []
        count[0] += 1
        last = items[-1]
        if last.get("type") == "function_call_output":
            return [assistant_message(f"done: {last['output']}")]
        return [function_call("lookup", {"q": str(last.get("content"))}, call_id=f"c{count[0]}")]

    model = ScriptedModel([ModelStep.respond(respond) for _ in range(200)])
    return Agent(name="a", model=model, tools=[lookup])


def pydantic_agent() -> Any:
    """A pydantic-ai agent with one tool on a ``FunctionModel``."""
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
        return f"answer:{q}"

    return agent


def langgraph_graph(saver: Any) -> Any:
    """A LangGraph graph: a model node (a plain function) and a ``ToolNode``."""
    from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
    from langchain_core.tools import StructuredTool
    from langgraph.graph import END, START, StateGraph
    from langgraph.graph.message import add_messages
    from langgraph.prebuilt import ToolNode, tools_condition

    # The functional form: evaluated here, not a string annotation to resolve later.
    State = TypedDict("State", {"messages": Annotated[list[AnyMessage], add_messages]})  # noqa: UP013

    def slookup(q: str) -> str:
        return f"answer:{q}"

    async def alookup(q: str) -> str:
        return f"answer:{q}"

    lookup = StructuredTool.from_function(
        func=slookup, coroutine=alookup, name="lookup", description="Look something up."
    )

    def model(state: Any) -> dict[str, list[AIMessage]]:
        messages = state["messages"]
        last = messages[-1]
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
