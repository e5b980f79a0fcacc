"""LangChain / LangGraph messages: objects, ``model_dump()`` or ``messages_to_dict`` dicts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..messages import CLOSED_CALL_TEXT, get_field
from .base import PLAIN, TURN, Reading, build, framework_class, seq
from .chat import _Chat

__all__ = ["LANGCHAIN", "TYPES"]

_NAMES = ("Human", "AI", "System", "Tool", "Function", "Chat")
TYPES = frozenset({"human", "ai", "system", "tool", "function", "chat", "remove"}).union(
    f"{name}MessageChunk" for name in _NAMES
)
"""Every LangChain message ``type``."""

_TURNS = frozenset({"ai", "AIMessageChunk"})


class _LangChain(_Chat):
    name: str = "langchain"
    kind: str = "type"
    results: frozenset[str] = frozenset({"tool", "ToolMessageChunk"})
    user: str = "human"

    def fields(self, message: Any) -> Any:
        if type(message) is dict and "content" not in message:
            data = message.get("data")
            if isinstance(data, dict):
                return data
        return message

    def read(self, message: Any) -> Reading:
        kind = get_field(message, "type")
        fields = self.fields(message)
        if kind in self.results:
            running = get_field(fields, "status") == "running"
            return ((get_field(fields, "tool_call_id"),), (), False, True, running)
        if kind not in _TURNS:
            return PLAIN
        calls = seq(get_field(fields, "tool_calls"))
        return ((), [get_field(c, "id") for c in calls], True, False, False) if calls else TURN

    def calls(self, message: Any) -> Sequence[Any]:
        return seq(get_field(self.fields(message), "tool_calls"))

    def answer(self, call_message: Any, call: Any, call_id: str) -> Any:
        result: dict[str, Any] = {
            "type": "tool",
            "content": CLOSED_CALL_TEXT,
            "tool_call_id": call_id,
            "status": "error",
        }
        if isinstance(get_field(call, "name"), str):
            result["name"] = get_field(call, "name")
        if type(call_message) is dict:
            wrapped = self.fields(call_message) is not call_message
            return {"type": "tool", "data": result} if wrapped else result
        cls = framework_class(call_message, "ToolMessage")
        return build(cls, result) if cls is not None else result


LANGCHAIN = _LangChain()
