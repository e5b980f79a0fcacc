"""Agent transcripts: repairs on a copy (running results settled, dangling calls closed).

Repairs never mutate: ``settle_running`` and ``close_dangling_tool_calls``
return a new list in which only the messages they change are new objects,
built with ``dict`` copies or ``msgspec.structs.replace``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .history import Unclosed, scan_history
from .messages import (
    CLOSED_CALL_TEXT,
    INTERRUPTED_TEXT,
    ChatMessage,
    Message,
    TextBlock,
    ToolResultBlock,
    block_type,
    get_field,
    replaced,
)

__all__ = ["close_calls", "close_dangling_tool_calls", "settle_results", "settle_running"]


def settle_running(
    messages: Sequence[Any], *, reason: str = INTERRUPTED_TEXT
) -> tuple[list[Any], int]:
    """Settle results still marked ``status: "running"`` as errors, on a copy.

    A chat ``tool`` message, or a ``tool_result`` block, whose ``status`` is
    ``"running"`` gets ``status: "error"`` and ``reason`` as its content
    (blocks also ``is_error: True``).  Meant for a snapshot taken while a
    tool ran: whoever resumes it will never see that tool finish.

    Returns:
        ``(copy, count)``: a new list (only the changed messages are new
        objects; ``messages`` and its messages are never mutated) and the
        number of items settled.
    """
    return settle_results(list(messages), scan_history(messages).running, reason)


def close_dangling_tool_calls(messages: Sequence[Any]) -> tuple[list[Any], int]:
    """Answer every unclosed tool call with an error result, on a copy.

    Each call that gets no result before the conversation goes on is given
    one, saying ``CLOSED_CALL_TEXT``, where the API expects it: chat style,
    a ``tool`` message after the call's other results; messages style, a
    ``tool_result`` block at the start of the next user message (a new user
    message if the next one is not).  Orphan results and duplicate ids are
    not touched (``validate_history`` still reports them).

    Returns:
        ``(copy, count)``: a new list (only changed or added messages are new
        objects; ``messages`` and its messages are never mutated) and the
        number of calls closed.
    """
    unclosed = scan_history(messages).unclosed
    return close_calls(list(messages), unclosed), len(unclosed)


def settle_results(copy: list[Any], running: list[int], reason: str) -> tuple[list[Any], int]:
    count = 0
    for i in running:
        message = copy[i]
        if get_field(message, "role") == "tool":
            copy[i] = replaced(message, status="error", content=reason)
            count += 1
            continue
        content = get_field(message, "content")
        blocks = []
        for block in content:
            if block_type(block) == "tool_result" and get_field(block, "status") == "running":
                block = replaced(block, status="error", is_error=True, content=reason)
                count += 1
            blocks.append(block)
        copy[i] = replaced(message, content=type(content)(blocks))
    return copy, count


def close_calls(copy: list[Any], unclosed: list[Unclosed]) -> list[Any]:
    if not unclosed:
        return copy
    by_end: dict[int, list[Unclosed]] = {}
    for u in unclosed:
        by_end.setdefault(u.window_end, []).append(u)
    start = min(by_end)
    out = copy[:start]  # one copy of the history, not a slice copied again
    for end in sorted(by_end):
        out.extend(copy[start:end])
        group = by_end[end]
        follower = copy[end] if end < len(copy) else None
        out.extend(_tool_message(copy[u.call_index], u.call_id) for u in group if u.chat)
        blocks = [_result_block(copy[u.call_index], u.call_id) for u in group if not u.chat]
        start = end
        if blocks:
            if follower is not None and get_field(follower, "role") == "user":
                out.append(_prepend_blocks(follower, blocks))
                start = end + 1
            else:
                out.append(_user_message(copy[group[0].call_index], blocks))
    out.extend(copy[start:])
    return out


def _tool_message(call_message: Any, call_id: str) -> Any:
    if isinstance(call_message, ChatMessage):
        return ChatMessage(role="tool", tool_call_id=call_id, content=CLOSED_CALL_TEXT)
    return {"role": "tool", "tool_call_id": call_id, "content": CLOSED_CALL_TEXT}


def _result_block(call_message: Any, call_id: str) -> Any:
    if isinstance(call_message, Message):
        return ToolResultBlock(tool_use_id=call_id, content=CLOSED_CALL_TEXT, is_error=True)
    return {
        "type": "tool_result",
        "tool_use_id": call_id,
        "content": CLOSED_CALL_TEXT,
        "is_error": True,
    }


def _user_message(call_message: Any, blocks: list[Any]) -> Any:
    if isinstance(call_message, Message):
        return Message(role="user", content=tuple(blocks))
    return {"role": "user", "content": blocks}


def _prepend_blocks(message: Any, blocks: list[Any]) -> Any:
    content = get_field(message, "content")
    if isinstance(content, str):
        text: Any = TextBlock(content) if isinstance(message, Message) else _text_dict(content)
        existing: list[Any] = [text] if content else []
    else:
        existing = list(content or ())
    merged = blocks + existing
    as_tuple = isinstance(content, tuple) or isinstance(message, Message)
    return replaced(message, content=tuple(merged) if as_tuple else merged)


def _text_dict(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}
