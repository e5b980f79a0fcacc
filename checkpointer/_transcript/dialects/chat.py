"""Role messages: chat-completions style, and Anthropic style (tool blocks in the content)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..messages import (
    CLOSED_CALL_TEXT,
    ChatMessage,
    Message,
    TextBlock,
    ToolResultBlock,
    block_type,
    get_field,
    replaced,
)
from .base import (
    NONE,
    PLAIN,
    TURN,
    Classified,
    Dialect,
    Reading,
    Window,
    seq,
    short,
    text_of,
    tool_name,
)
from .converse import read_converse

__all__ = ["ANTHROPIC", "ANTHROPIC_BLOCKS", "CHAT", "read_role", "tool_blocks"]


class _Chat(Dialect):
    name: str = "chat"
    window: Window = "run"
    kind: str = "role"  # the field that says who speaks; LangChain's is "type"
    results: frozenset[str] = frozenset({"tool"})
    user: str = "user"

    def fields(self, message: Any) -> Any:
        """Where the message's fields are (LangChain's dicts may wrap them in ``data``)."""
        return message

    def read(self, message: Any) -> Reading:
        role, calls = get_field(message, "role"), get_field(message, "tool_calls")
        return read_role(role, calls, get_field(message, "content"), message)[1]

    def answer(self, call_message: Any, call: Any, call_id: str) -> Any:
        if isinstance(call_message, ChatMessage):
            return ChatMessage(role="tool", tool_call_id=call_id, content=CLOSED_CALL_TEXT)
        return {"role": "tool", "tool_call_id": call_id, "content": CLOSED_CALL_TEXT}

    def settle(self, message: Any, reason: str) -> tuple[Any, int]:
        fields = self.fields(message)
        if get_field(fields, "status") != "running":
            return message, 0
        settled = replaced(fields, status="error", content=reason)
        return (settled if fields is message else {**message, "data": settled}), 1

    def label(self, message: Any) -> str:
        kind = str(get_field(message, self.kind))
        call_id = get_field(self.fields(message), "tool_call_id")
        return f"{kind}[{short(call_id)}]" if kind in self.results and call_id is not None else kind

    def text(self, message: Any) -> str:
        return text_of(get_field(self.fields(message), "content"))

    def call_names(self, message: Any) -> list[str]:
        names = []
        for call in seq(get_field(self.fields(message), "tool_calls")):
            function = get_field(call, "function")
            name = get_field(function, "name") if function is not None else None
            names.append(tool_name(name or get_field(call, "name")))
        return names

    def user_text(self, message: Any) -> str | None:
        return self.text(message) if get_field(message, self.kind) == self.user else None


class _Anthropic(_Chat):
    """Read as chat (``read_role``); answered with ``tool_result`` blocks in the next user
    message (never role ``tool``: such a message is chat's)."""

    name: str = "anthropic"
    window: Window = "next"

    def answer(self, call_message: Any, call: Any, call_id: str) -> Any:
        if isinstance(call_message, Message):
            return ToolResultBlock(tool_use_id=call_id, content=CLOSED_CALL_TEXT, is_error=True)
        return {
            "type": "tool_result",
            "tool_use_id": call_id,
            "content": CLOSED_CALL_TEXT,
            "is_error": True,
        }

    def merge(self, follower: Any, answers: list[Any]) -> Any:
        if get_field(follower, "role") != "user":
            return None
        content = get_field(follower, "content")
        struct = isinstance(follower, Message)
        if isinstance(content, str):
            text: Any = TextBlock(content) if struct else {"type": "text", "text": content}
            existing: list[Any] = [text] if content else []
        else:
            existing = list(content or ())
        merged = answers + existing
        as_tuple = isinstance(content, tuple) or struct
        return replaced(follower, content=tuple(merged) if as_tuple else merged)

    def carrier(self, call_message: Any, answers: list[Any]) -> Any:
        if isinstance(call_message, Message):
            return Message(role="user", content=tuple(answers))
        return {"role": "user", "content": answers}

    def settle(self, message: Any, reason: str) -> tuple[Any, int]:
        content = get_field(message, "content")
        blocks, count = [], 0
        for block in seq(content):
            if block_type(block) == "tool_result" and get_field(block, "status") == "running":
                block = replaced(block, status="error", is_error=True, content=reason)
                count += 1
            blocks.append(block)
        if not count:
            return message, 0
        return replaced(message, content=type(content)(blocks)), count

    def text(self, message: Any) -> str:
        content = get_field(message, "content")
        said = [text_of(content)]
        said.extend(
            f"[{short(get_field(block, 'tool_use_id'))}] {text_of(get_field(block, 'content'))}"
            for block in seq(content)
            if block_type(block) == "tool_result"
        )
        return " ".join(s for s in said if s)

    def call_names(self, message: Any) -> list[str]:
        blocks = seq(get_field(message, "content"))
        return [tool_name(get_field(b, "name")) for b in blocks if block_type(b) == "tool_use"]


ANTHROPIC_BLOCKS = frozenset(
    {
        *("text", "image", "document", "search_result", "tool_use", "tool_result", "thinking"),
        *("redacted_thinking", "server_tool_use", "web_search_tool_result", "container_upload"),
        *("web_fetch_tool_result", "code_execution_tool_result", "mcp_tool_use", "mcp_tool_result"),
        *("bash_code_execution_tool_result", "text_editor_code_execution_tool_result"),
        *("tool_search_tool_result", "tool_reference"),
    }
)
"""Anthropic's content block types (the ones the server answers itself included)."""
_PARTS = ANTHROPIC_BLOCKS.union(
    ("image_url", "input_audio", "file", "refusal"),  # chat-completions' content parts
    ("input_text", "input_image", "input_file", "output_text"),  # Responses' message content
)

CHAT = _Chat()
ANTHROPIC = _Anthropic()

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_CHAT_PLAIN: Classified = (CHAT, PLAIN)
_CHAT_TURN: Classified = (CHAT, TURN)


def read_role(role: Any, calls: Any, content: Any, message: Any) -> Classified:
    """A role message's dialect (chat, or Anthropic when its content holds tool blocks) and
    reading, in one pass: the hot path of the scan."""
    if role == "assistant":
        if calls:
            if isinstance(calls, (list, tuple)):
                return CHAT, ((), [get_field(c, "id") for c in calls], True, False, False)
            return _CHAT_TURN
        if content is None or type(content) is str:
            return _CHAT_TURN
    elif role == "tool":
        call_id, status = get_field(message, "tool_call_id"), get_field(message, "status")
        return CHAT, ((call_id,), (), False, True, status == "running")
    elif not isinstance(role, str) or role not in _ROLES:
        return NONE
    elif calls or content is None or type(content) is str:
        return _CHAT_PLAIN
    assistant = role == "assistant"
    if not content or not isinstance(content, (list, tuple)):
        return _CHAT_TURN if assistant else _CHAT_PLAIN
    return _read_blocks(role, content, assistant)


def _read_blocks(role: str, content: Any, assistant: bool) -> Classified:
    """A role message with a list of content blocks: Converse's if a block has no ``type``
    (it says its kind by its key); else Anthropic's if it holds tool blocks, else chat's."""
    if any(type(block) is dict and "type" not in block for block in content):
        return read_converse(role, content)
    found = tool_blocks(role, content, _PARTS)
    if found is None:
        return NONE
    ids, running = found
    if not ids:
        return _CHAT_TURN if assistant else _CHAT_PLAIN
    if assistant:
        return ANTHROPIC, ((), ids, True, False, False)
    return ANTHROPIC, (ids, (), False, False, running)


def tool_blocks(role: Any, content: Sequence[Any], kinds: frozenset[str]) -> Any:
    """The ids of an Anthropic content's tool blocks (calls from the assistant, results from
    the user) and whether a result is running, or None (not understood: unrecognised) when a
    block's type is not of ``kinds``, or a tool block is in the wrong role or has no id."""
    ids, running = [], False
    for block in content:
        kind = block_type(block)
        if kind == "tool_use" or kind == "tool_result":
            if role != ("assistant" if kind == "tool_use" else "user"):
                return None
            call_id = get_field(block, "id" if kind == "tool_use" else "tool_use_id")
            if not isinstance(call_id, str):
                return None
            ids.append(call_id)
            running = running or (kind == "tool_result" and get_field(block, "status") == "running")
        elif not isinstance(kind, str) or kind not in kinds:
            return None
    return ids, running
