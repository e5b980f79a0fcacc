"""pydantic-ai's ``ModelRequest`` / ``ModelResponse``, as objects or JSON."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from ..messages import CLOSED_CALL_TEXT, get_field, replaced
from .base import (
    PLAIN,
    Dialect,
    Reading,
    Window,
    build,
    framework_class,
    seq,
    short,
    text_of,
    tool_name,
)

__all__ = ["PYDANTIC_AI"]


def _answers(part: Any) -> bool:
    """Whether a part of a pydantic-ai request answers a call: a tool return, a tool-bound retry."""
    kind = get_field(part, "part_kind")
    return kind == "tool-return" or (
        kind == "retry-prompt" and get_field(part, "tool_name") is not None
    )


def _parts_of(message: Any, kind: str) -> list[Any]:
    return [p for p in seq(get_field(message, "parts")) if get_field(p, "part_kind") == kind]


class _PydanticAI(Dialect):
    name: str = "pydantic-ai"
    window: Window = "turn"
    defers: bool = True
    call_id: str = "tool_call_id"

    def read(self, message: Any) -> Reading:
        if get_field(message, "kind") == "response":
            ids = [get_field(p, "tool_call_id") for p in _parts_of(message, "tool-call")]
            return ((), ids, True, False, False)
        # A request of results only keeps the window: consecutive requests are one
        # turn for pydantic-ai; a prompt in it moves the conversation on.
        parts = seq(get_field(message, "parts"))
        results = [p for p in parts if _answers(p)]
        ids = [get_field(p, "tool_call_id") for p in results]
        return (ids, (), False, len(results) == len(parts), False) if results else PLAIN

    def calls(self, message: Any) -> Sequence[Any]:
        return seq(get_field(message, "parts"))

    def answer(self, call_message: Any, call: Any, call_id: str) -> Any:
        fields: dict[str, Any] = {
            "tool_name": tool_name(get_field(call, "tool_name")),
            "content": CLOSED_CALL_TEXT,
            "tool_call_id": call_id,
            "outcome": "interrupted",
        }
        if get_field(call, "tool_kind") is not None:
            fields["tool_kind"] = get_field(call, "tool_kind")
        timestamp = get_field(call_message, "timestamp")
        if timestamp is not None:  # as pydantic-ai's own repair: the response's, deterministic
            fields["timestamp"] = timestamp
        cls = None if type(call) is dict else framework_class(call_message, "ToolReturnPart")
        return build(cls, fields) if cls is not None else {"part_kind": "tool-return", **fields}

    def merge(self, follower: Any, answers: list[Any]) -> Any:
        if get_field(follower, "kind") != "request":
            return None
        parts = list(seq(get_field(follower, "parts")))
        at = 0  # after its own results, where pydantic-ai's repair puts them
        for i, part in enumerate(parts):
            if _answers(part):
                at = i + 1
        return replaced(follower, parts=[*parts[:at], *answers, *parts[at:]])

    def carrier(self, call_message: Any, answers: list[Any]) -> Any:
        cls = None if type(call_message) is dict else framework_class(call_message, "ModelRequest")
        if cls is None:
            return {"kind": "request", "parts": answers}
        return build(cls, {"parts": answers})

    def label(self, message: Any) -> str:
        return str(get_field(message, "kind"))

    def text(self, message: Any) -> str:
        said = []
        for part in seq(get_field(message, "parts")):
            kind = get_field(part, "part_kind")
            if kind in ("tool-return", "retry-prompt"):
                content = get_field(part, "content")
                body = text_of(content) or (
                    "" if content is None else msgspec.json.encode(content, enc_hook=repr).decode()
                )
                said.append(f"[{short(get_field(part, 'tool_call_id'))}] {body}")
            elif kind in ("user-prompt", "text", "system-prompt", "thinking"):
                said.append(text_of(get_field(part, "content")))
        return " ".join(s for s in said if s)

    def call_names(self, message: Any) -> list[str]:
        return [tool_name(get_field(p, "tool_name")) for p in _parts_of(message, "tool-call")]

    def user_text(self, message: Any) -> str | None:
        if get_field(message, "kind") != "request":
            return None
        prompts = _parts_of(message, "user-prompt")
        return " ".join(text_of(get_field(p, "content")) for p in prompts) if prompts else None


PYDANTIC_AI = _PydanticAI()
