"""Our own message Structs, the fixed texts, and reading fields of any message."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, TypeAlias

import msgspec

__all__ = [
    "CLOSED_CALL_TEXT",
    "INTERRUPTED_TEXT",
    "ChatMessage",
    "ContentBlock",
    "HistoryProblem",
    "Message",
    "ProblemKind",
    "TextBlock",
    "ToolCall",
    "ToolFunction",
    "ToolResultBlock",
    "ToolUseBlock",
    "block_type",
    "clipped",
    "get_field",
    "replaced",
]

CLOSED_CALL_TEXT = (
    "The tool call did not complete: the session stopped before it returned a result."
)
"""The one fixed sentence of the error result that closes a dangling call."""

INTERRUPTED_TEXT = (
    "Interrupted: the tool was still running when the session was checkpointed and did not finish."
)
"""The reason given to a running item when it is settled as an error."""


class ToolFunction(msgspec.Struct, frozen=True):
    """The function of a chat-completions tool call: name and JSON arguments."""

    name: str
    arguments: str = "{}"


class ToolCall(msgspec.Struct, frozen=True):
    """One entry of an assistant message's ``tool_calls``."""

    id: str
    function: ToolFunction
    type: str = "function"


class ChatMessage(msgspec.Struct, frozen=True, omit_defaults=True):
    """A chat-completions message (system, developer, user, assistant, tool).

    ``status`` is ours, not the API's: ``"running"`` while the tool runs
    (``settle_running`` makes it ``"error"``).  Fields left at None are not written.
    """

    role: str
    content: str | list[dict[str, Any]] | None = None
    tool_calls: tuple[ToolCall, ...] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    id: str | None = None
    status: str | None = None


class TextBlock(msgspec.Struct, frozen=True, tag_field="type", tag="text"):
    """A text content block."""

    text: str


class ToolUseBlock(msgspec.Struct, frozen=True, tag_field="type", tag="tool_use"):
    """A tool call in an assistant message (messages style)."""

    id: str
    name: str
    input: dict[str, Any] = {}


class ToolResultBlock(
    msgspec.Struct, frozen=True, omit_defaults=True, tag_field="type", tag="tool_result"
):
    """A tool result in a user message (messages style); ``status`` as ``ChatMessage``'s."""

    tool_use_id: str
    content: str | list[dict[str, Any]] = ""
    is_error: bool = False
    status: str | None = None


ContentBlock: TypeAlias = TextBlock | ToolUseBlock | ToolResultBlock


class Message(msgspec.Struct, frozen=True, omit_defaults=True):
    """A messages-style message: a role and a string or content blocks.

    For block types beyond text, tool use and tool result (images,
    thinking, ...) keep plain dicts: every function here takes those too.
    """

    role: str
    content: str | tuple[ContentBlock, ...]
    id: str | None = None


ProblemKind: TypeAlias = Literal["orphan-result", "unclosed-call", "duplicate-id", "unrecognised"]


class HistoryProblem(msgspec.Struct, frozen=True, kw_only=True):
    """Why a history would be refused by a model API.

    Attributes:
        kind: ``"orphan-result"`` (a result answers no open call),
            ``"unclosed-call"`` (a call is never answered in time),
            ``"duplicate-id"`` (a call id used twice, or a call answered twice),
            or ``"unrecognised"`` (a message of a shape no dialect knows: not
            checked, and no reason to refuse the history).
        index: the message where it is (the call's message for an unclosed
            call, the result's message otherwise).
        call_id: the tool call id concerned (None if the result has none).
        detail: one sentence saying what is wrong.
    """

    kind: ProblemKind
    index: int
    call_id: str | None
    detail: str

    def describe(self, path: str = "$") -> str:
        """The problem with its JSON path, e.g. ``$.messages[3]: ...``."""
        return f"{path}[{self.index}]: {self.detail}"


def get_field(obj: Any, name: str) -> Any:
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


def block_type(block: Any) -> Any:
    if isinstance(block, dict):
        return block.get("type")
    if isinstance(block, msgspec.Struct):
        return block.__struct_config__.tag
    return getattr(block, "type", None)


def replaced(obj: Any, **changes: Any) -> Any:
    """A copy of ``obj`` with ``changes``; fields a Struct lacks are left out."""
    if isinstance(obj, dict):
        return {**obj, **changes}
    if isinstance(obj, msgspec.Struct):
        fields = obj.__struct_fields__
        return msgspec.structs.replace(obj, **{k: v for k, v in changes.items() if k in fields})
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        names = {f.name for f in dataclasses.fields(obj)}
        return dataclasses.replace(obj, **{k: v for k, v in changes.items() if k in names})
    declared = getattr(type(obj), "model_fields", None)  # a pydantic model (LangChain's)
    if isinstance(declared, dict) and callable(getattr(obj, "model_copy", None)):
        return obj.model_copy(update={k: v for k, v in changes.items() if k in declared})
    raise TypeError(f"cannot copy a {type(obj).__name__} message; use dicts or msgspec Structs")


def clipped(value: Any, width: int = 40) -> str:
    """``repr(value)`` of an id, a role or a key, cut as message texts are: a 2 MB call id is
    its first characters, ``...`` and its length, not 2 MB of a problem's detail."""
    if isinstance(value, str) and len(value) > width:
        return f"{value[: width - 3] + '...'!r} ({len(value)} characters)"
    text = repr(value)
    return text if len(text) <= width else f"{text[: width - 3]}..."
