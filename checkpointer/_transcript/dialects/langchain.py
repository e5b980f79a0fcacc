"""Agent transcripts: LangChain / LangGraph messages (``type: "human" | "ai" | "tool" ...``).

As objects, ``model_dump()`` dicts, or ``messages_to_dict`` dicts (``{"type",
"data"}``).  An ``ai`` message's ``tool_calls`` are answered by the run of ``tool``
messages right after it; answers take the form of the call's message.
"""

from __future__ import annotations

from typing import Any

from ..messages import CLOSED_CALL_TEXT, get_field, replaced
from .base import (
    PLAIN,
    TURN,
    Dialect,
    Reading,
    Window,
    build,
    first_by_id,
    framework_class,
    seq,
    short,
    text_of,
    tool_name,
)

__all__ = ["LANGCHAIN", "TYPES"]

TYPES = frozenset(
    {
        "human",
        "ai",
        "system",
        "tool",
        "function",
        "chat",
        "remove",
        "HumanMessageChunk",
        "AIMessageChunk",
        "SystemMessageChunk",
        "ToolMessageChunk",
        "FunctionMessageChunk",
        "ChatMessageChunk",
    }
)
"""Every LangChain message ``type``."""

_RESULTS = frozenset({"tool", "ToolMessageChunk"})
_TURNS = frozenset({"ai", "AIMessageChunk"})


def _fields(message: Any) -> Any:
    """A LangChain message's fields: the message, or its ``data`` (``messages_to_dict``)."""
    if type(message) is dict and "content" not in message:
        data = message.get("data")
        if isinstance(data, dict):
            return data
    return message


def _call_id(call: Any) -> Any:
    return call.get("id") if type(call) is dict else get_field(call, "id")


class _LangChain(Dialect):
    name: str = "langchain"
    window: Window = "run"

    def read(self, message: Any) -> Reading:
        kind = get_field(message, "type")
        fields = _fields(message)
        if kind in _RESULTS:
            running = get_field(fields, "status") == "running"
            return ((get_field(fields, "tool_call_id"),), (), False, True, running)
        if kind not in _TURNS:
            return PLAIN
        calls = seq(get_field(fields, "tool_calls"))
        return ((), [_call_id(c) for c in calls], True, False, False) if calls else TURN

    def answer(self, call_message: Any, call_id: str) -> Any:
        return self.answers(call_message, [call_id])[0]

    def answers(self, call_message: Any, call_ids: list[str]) -> list[Any]:
        calls = first_by_id(seq(get_field(_fields(call_message), "tool_calls")), "id")
        return [self._answer(call_message, calls.get(c), c) for c in call_ids]

    def _answer(self, call_message: Any, call: Any, call_id: str) -> Any:
        fields = _fields(call_message)
        result: dict[str, Any] = {
            "type": "tool",
            "content": CLOSED_CALL_TEXT,
            "tool_call_id": call_id,
            "status": "error",
        }
        if isinstance(get_field(call, "name"), str):
            result["name"] = get_field(call, "name")
        if type(call_message) is dict:
            return {"type": "tool", "data": result} if fields is not call_message else result
        cls = framework_class(call_message, "ToolMessage")
        return build(cls, result) if cls is not None else result

    def settle(self, message: Any, reason: str) -> tuple[Any, int]:
        fields = _fields(message)
        if get_field(fields, "status") != "running":
            return message, 0
        settled = replaced(fields, status="error", content=reason)
        return (settled if fields is message else {**message, "data": settled}), 1

    def label(self, message: Any) -> str:
        kind = str(get_field(message, "type"))
        call_id = get_field(_fields(message), "tool_call_id")
        return f"{kind}[{short(call_id)}]" if kind in _RESULTS else kind

    def text(self, message: Any) -> str:
        return text_of(get_field(_fields(message), "content"))

    def call_names(self, message: Any) -> list[str]:
        calls = seq(get_field(_fields(message), "tool_calls"))
        return [tool_name(get_field(c, "name")) for c in calls]

    def user_text(self, message: Any) -> str | None:
        return self.text(message) if get_field(message, "type") == "human" else None


LANGCHAIN = _LangChain()
