"""Repairs on a copy: running results settled, dangling calls closed, by the call's dialect."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .dialects import Dialect, detect
from .history import Unclosed, scan_history
from .messages import INTERRUPTED_TEXT

__all__ = ["close_calls", "close_dangling_tool_calls", "settle_results", "settle_running"]


def settle_running(
    messages: Sequence[Any], *, reason: str = INTERRUPTED_TEXT
) -> tuple[list[Any], int]:
    """Settle results still marked running as errors, on a copy.

    A chat ``tool`` message or a ``tool_result`` block with ``status:
    "running"`` gets ``status: "error"`` and ``reason`` as its content; a
    Responses output item ``"in_progress"`` (or ``"running"``) gets ``status:
    "incomplete"`` and ``reason`` as its output.

    Returns:
        ``(copy, count)``: a new list (only changed messages are new objects)
        and the number of items settled.
    """
    return settle_results(list(messages), scan_history(messages).running, reason)


def close_dangling_tool_calls(messages: Sequence[Any]) -> tuple[list[Any], int]:
    """Answer every unclosed tool call with an error result, on a copy.

    Each call without a result in time gets one saying ``CLOSED_CALL_TEXT``,
    in its own dialect and where its API expects it: a ``tool`` message after
    the call's other results (chat, LangChain); a ``tool_result`` block at the
    start of the next user message (Anthropic); a ``tool-return`` part after
    the next request's results (pydantic-ai); the output item right after the
    call (Responses).  Orphan results and duplicate ids are left alone.  Calls
    pending in a paused run are closed too: call this to abandon the run.

    Returns:
        ``(copy, count)``: a new list (only changed or added messages are new
        objects) and the number of calls closed.
    """
    scan = scan_history(messages)
    unclosed = sorted([*scan.unclosed, *scan.pending], key=lambda u: u.call_index)
    return close_calls(list(messages), unclosed), len(unclosed)


def settle_results(copy: list[Any], running: list[int], reason: str) -> tuple[list[Any], int]:
    count = 0
    for i in running:
        message = copy[i]
        dialect = detect(message)
        if dialect is not None:
            copy[i], settled = dialect.settle(message, reason)
            count += settled
    return copy, count


def _position(u: Unclosed) -> int:
    """Where the answer to ``u`` goes: at the end of its window, or right after a free call
    or a *turn* call (into the request after it, where pydantic-ai's own repair puts it)."""
    return u.call_index + 1 if u.dialect.window in ("free", "turn") else u.window_end


_PARTS = ("next", "turn")
"""Windows whose answers are parts of a message (merged into the follower, or a carrier)."""


def close_calls(copy: list[Any], unclosed: list[Unclosed]) -> list[Any]:
    if not unclosed:
        return copy
    at: dict[int, list[Unclosed]] = {}
    for u in unclosed:
        at.setdefault(_position(u), []).append(u)
    start = min(at)
    out = copy[:start]  # one copy of the history, not a slice copied again
    for position in sorted(at):
        out.extend(copy[start:position])
        start = position
        group = at[position]
        answers = _answers(copy, group)
        # Answers that are messages of their own go in the order of their calls ...
        out.extend(a for u, a in zip(group, answers, strict=True) if u.dialect.window not in _PARTS)
        # ... then those a *next* window wants in the following message, per dialect.
        batches: dict[Dialect, tuple[Any, list[Any]]] = {}
        for u, answer in zip(group, answers, strict=True):
            if u.dialect.window in _PARTS:
                batch = batches.setdefault(u.dialect, (copy[u.call_index], []))
                batch[1].append(answer)
        for dialect, (call_message, answers) in batches.items():
            follower = copy[position] if start == position < len(copy) else None
            merged = None if follower is None else dialect.merge(follower, answers)
            if merged is not None:
                out.append(merged)
                start = position + 1
            else:
                out.append(dialect.carrier(call_message, answers))
    out.extend(copy[start:])
    return out


def _answers(copy: list[Any], group: list[Unclosed]) -> list[Any]:
    """The answers to ``group``, in its order: one ``Dialect.answers`` per call message, so
    that K calls of one message cost O(K), not a search of its K calls each."""
    by_message: dict[int, list[int]] = {}
    for n, u in enumerate(group):
        by_message.setdefault(u.call_index, []).append(n)
    answers: list[Any] = [None] * len(group)
    for index, members in by_message.items():
        dialect = group[members[0]].dialect
        made = dialect.answers(copy[index], [group[n].call_id for n in members])
        for n, answer in zip(members, made, strict=True):
            answers[n] = answer
    return answers
