"""Builders of agent histories in both message styles, as dicts and as Structs."""

from __future__ import annotations

from typing import Any

from checkpointer.messages import (
    ChatMessage,
    Message,
    TextBlock,
    ToolCall,
    ToolFunction,
    ToolResultBlock,
    ToolUseBlock,
)


class Chat:
    """Chat-completions style: tool_calls answered by role "tool" messages."""

    def __init__(self, struct: bool) -> None:
        self.struct = struct
        self.name = "chat-struct" if struct else "chat-dict"

    def user(self, text: str) -> list[Any]:
        if self.struct:
            return [ChatMessage(role="user", content=text)]
        return [{"role": "user", "content": text}]

    def answer(self, text: str, id: str | None = None) -> list[Any]:
        if self.struct:
            return [ChatMessage(role="assistant", content=text, id=id)]
        return [{"role": "assistant", "content": text, "id": id}]

    def call(self, *ids: str) -> list[Any]:
        if self.struct:
            calls = tuple(ToolCall(id=i, function=ToolFunction(name="search")) for i in ids)
            return [ChatMessage(role="assistant", tool_calls=calls)]
        return [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": i, "type": "function", "function": {"name": "search", "arguments": "{}"}}
                    for i in ids
                ],
            }
        ]

    def results(self, *ids: str, running: tuple[str, ...] = ()) -> list[Any]:
        out: list[Any] = []
        for i in ids:
            status = "running" if i in running else None
            if self.struct:
                out.append(
                    ChatMessage(role="tool", tool_call_id=i, content=f"result {i}", status=status)
                )
            else:
                message: dict[str, Any] = {"role": "tool", "tool_call_id": i, "content": f"r {i}"}
                if status:
                    message["status"] = status
                out.append(message)
        return out


class Messages:
    """Messages style: tool_use blocks answered by tool_result blocks in a user message."""

    def __init__(self, struct: bool) -> None:
        self.struct = struct
        self.name = "messages-struct" if struct else "messages-dict"

    def user(self, text: str) -> list[Any]:
        if self.struct:
            return [Message(role="user", content=text)]
        return [{"role": "user", "content": text}]

    def answer(self, text: str, id: str | None = None) -> list[Any]:
        if self.struct:
            return [Message(role="assistant", content=(TextBlock(text),), id=id)]
        return [{"role": "assistant", "content": [{"type": "text", "text": text}], "id": id}]

    def call(self, *ids: str) -> list[Any]:
        if self.struct:
            blocks = tuple(ToolUseBlock(id=i, name="search", input={"q": i}) for i in ids)
            return [Message(role="assistant", content=(TextBlock("let me look"), *blocks))]
        return [
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "let me look"},
                    *({"type": "tool_use", "id": i, "name": "search", "input": {}} for i in ids),
                ],
            }
        ]

    def results(self, *ids: str, running: tuple[str, ...] = ()) -> list[Any]:
        if self.struct:
            blocks = tuple(
                ToolResultBlock(
                    tool_use_id=i,
                    content=f"result {i}",
                    status="running" if i in running else None,
                )
                for i in ids
            )
            return [Message(role="user", content=blocks)]
        content: list[dict[str, Any]] = []
        for i in ids:
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": i, "content": f"r {i}"}
            if i in running:
                block["status"] = "running"
            content.append(block)
        return [{"role": "user", "content": content}]


Style = Chat | Messages
STYLES: list[Style] = [Chat(False), Chat(True), Messages(False), Messages(True)]


def role_of(message: Any) -> Any:
    return message.get("role") if isinstance(message, dict) else message.role


def field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
