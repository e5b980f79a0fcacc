"""Agent transcripts: is a history sendable?  One pass over it says.

A history is *sendable* when a model API would accept it: every result
answers a call that is still open (no orphan), every call is answered before
the conversation moves on (none unclosed), and no id is used twice.

The rules of the one-pass scan (``scan_history``): a call opens when its assistant
message is seen.  Results close open calls.  Any message that is not a
chat-style ``tool`` message ends the *window* of the calls still open (after
its own results are taken), and those calls are unclosed; a result that
comes later is an orphan.  So for the messages style the window is the one
user message after the call, and for the chat style it is the run of
``tool`` messages after it, as the APIs require.

The scan is a left fold (``ScanState``, fed with ``feed``): the prepare
step's cache (``prepare.py``) keeps it for a history's settled prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import msgspec

from .messages import HistoryProblem, ProblemKind, block_type, get_field

__all__ = [
    "HistoryScan",
    "ScanState",
    "Unclosed",
    "count_turns",
    "feed",
    "scan_history",
    "validate_history",
]


class Unclosed(msgspec.Struct, frozen=True):
    call_index: int  # the assistant message with the call
    window_end: int  # the message that closed its window (len(messages) at the end)
    call_id: str
    chat: bool  # chat-completions style (else messages style)


class HistoryScan(msgspec.Struct):
    problems: list[HistoryProblem]
    unclosed: list[Unclosed]
    running: list[int]  # indices of messages holding running results
    turns: int  # assistant messages


class _Mark(NamedTuple):
    """Where a ``ScanState`` was, to go back there (``ScanState.undo``)."""

    fed: int
    problems: int
    unclosed: int
    running: int
    called: int
    answered: int
    turns: int
    open_calls: dict[str, tuple[int, bool]]


class ScanState:
    """The scan after its first ``count`` messages.

    A left fold: it depends on those messages only, so it can be kept and
    fed more messages later.  ``called_log`` and ``answered_log`` list the
    ids added to ``called`` and ``answered`` since ``forget()``, so that a
    feed can be undone exactly (``mark`` / ``undo``): a call id is added to
    ``called`` only when it is not there, and to ``answered`` only when its
    open call is answered, which happens once.
    """

    __slots__ = (
        "answered",
        "answered_log",
        "called",
        "called_log",
        "count",
        "open_calls",
        "problems",
        "running",
        "turns",
        "unclosed",
    )

    def __init__(self) -> None:
        self.count = 0
        self.problems: list[HistoryProblem] = []  # found in the loop, in message order
        self.unclosed: list[Unclosed] = []  # windows closed without an answer
        self.running: list[int] = []
        self.open_calls: dict[str, tuple[int, bool]] = {}  # id -> (call index, chat style)
        self.called: set[str] = set()
        self.answered: set[str] = set()
        self.called_log: list[str] = []
        self.answered_log: list[str] = []
        self.turns = 0

    def mark(self) -> _Mark:
        return _Mark(
            self.count,
            len(self.problems),
            len(self.unclosed),
            len(self.running),
            len(self.called_log),
            len(self.answered_log),
            self.turns,
            dict(self.open_calls),  # the calls of one window: a few
        )

    def undo(self, mark: _Mark) -> None:
        """Back to ``mark``, taken since the last ``forget()``."""
        self.called.difference_update(self.called_log[mark.called :])
        del self.called_log[mark.called :]
        self.answered.difference_update(self.answered_log[mark.answered :])
        del self.answered_log[mark.answered :]
        del self.problems[mark.problems :]
        del self.unclosed[mark.unclosed :]
        del self.running[mark.running :]
        self.open_calls.clear()
        self.open_calls.update(mark.open_calls)
        self.turns = mark.turns
        self.count = mark.fed

    def forget(self) -> None:
        """Keep what was fed: earlier marks can no longer be undone to."""
        self.called_log.clear()
        self.answered_log.clear()

    def result(self) -> HistoryScan:
        """The scan of the ``count`` messages fed, as if they were the whole history."""
        end = self.count
        unclosed = self.unclosed + [
            Unclosed(at, end, call_id, chat) for call_id, (at, chat) in self.open_calls.items()
        ]
        problems = self.problems + [
            HistoryProblem(
                kind="unclosed-call",
                index=u.call_index,
                call_id=u.call_id,
                detail=f"tool call {u.call_id!r} has no result before the conversation goes on",
            )
            for u in unclosed
        ]
        problems.sort(key=lambda p: p.index)  # stable: per message, in the order found
        return HistoryScan(problems, unclosed, list(self.running), self.turns)


def scan_history(messages: Sequence[Any]) -> HistoryScan:
    state = ScanState()
    feed(state, messages)
    return state.result()


def feed(state: ScanState, items: Sequence[Any]) -> None:
    """Scan ``items``, the messages after the first ``state.count``, on top of ``state``."""
    # The hot loop of every transcript write: dicts are read inline, and a
    # message costs a few dict lookups unless it carries calls or results.
    start = state.count
    problems = state.problems
    unclosed = state.unclosed
    running = state.running
    open_calls = state.open_calls
    called = state.called
    answered = state.answered
    called_log = state.called_log
    answered_log = state.answered_log
    turns = state.turns
    for i, message in enumerate(items, start):
        fields = message if type(message) is dict else None
        role = fields.get("role") if fields is not None else getattr(message, "role", None)
        if role == "tool":  # chat style: answers, and keeps the window open
            if fields is not None:
                call_id, status = fields.get("tool_call_id"), fields.get("status")
            else:
                call_id, status = get_field(message, "tool_call_id"), get_field(message, "status")
            if isinstance(call_id, str) and call_id in open_calls:  # a list id answers nothing
                del open_calls[call_id]
                answered.add(call_id)
                answered_log.append(call_id)
            else:
                _stray(call_id, i, answered, problems)
            if status == "running":
                running.append(i)
            continue
        content = fields.get("content") if fields is not None else getattr(message, "content", None)
        blocks = content if isinstance(content, (list, tuple)) else ()
        if role != "assistant" and blocks:
            is_running = False
            for block in blocks:
                if block_type(block) == "tool_result":
                    call_id = get_field(block, "tool_use_id")
                    if isinstance(call_id, str) and call_id in open_calls:
                        del open_calls[call_id]
                        answered.add(call_id)
                        answered_log.append(call_id)
                    else:
                        _stray(call_id, i, answered, problems)
                    is_running = is_running or get_field(block, "status") == "running"
            if is_running:
                running.append(i)
        # Any message but a chat "tool" message ends the window of open calls.
        if open_calls:
            for call_id, (at, chat) in open_calls.items():
                unclosed.append(Unclosed(at, i, call_id, chat))
            open_calls.clear()
        if role == "assistant":
            turns += 1
            calls = (
                fields.get("tool_calls") if fields is not None else get_field(message, "tool_calls")
            )
            if calls and isinstance(calls, (list, tuple)):
                for call in calls:
                    call_id = call.get("id") if type(call) is dict else get_field(call, "id")
                    if type(call_id) is str and call_id not in called:
                        called.add(call_id)
                        called_log.append(call_id)
                        open_calls[call_id] = (i, True)
                    else:
                        _call(call_id, i, True, state)
            for block in blocks:
                if block_type(block) == "tool_use":
                    _call(get_field(block, "id"), i, False, state)
    state.turns = turns
    state.count = start + len(items)


def _call(call_id: Any, index: int, chat: bool, state: ScanState) -> None:
    if not isinstance(call_id, str):
        return  # an id-less call cannot be answered or checked
    if call_id in state.called:
        state.problems.append(
            HistoryProblem(
                kind="duplicate-id",
                index=index,
                call_id=call_id,
                detail=f"tool call id {call_id!r} is used by an earlier call too",
            )
        )
        return
    state.called.add(call_id)
    state.called_log.append(call_id)
    state.open_calls[call_id] = (index, chat)


def _stray(call_id: Any, index: int, answered: set[str], problems: list[HistoryProblem]) -> None:
    """A result that answers no open call: a second answer, or an orphan."""
    if isinstance(call_id, str) and call_id in answered:
        kind: ProblemKind = "duplicate-id"
        detail = f"tool call {call_id!r} is answered a second time"
    else:
        kind = "orphan-result"
        detail = f"tool result for {call_id!r} answers no open tool call (orphan result)"
    problems.append(
        HistoryProblem(
            kind=kind,
            index=index,
            call_id=call_id if isinstance(call_id, str) else None,
            detail=detail,
        )
    )


def validate_history(messages: Sequence[Any]) -> list[HistoryProblem]:
    """Every reason a model API would refuse ``messages``, in one pass.

    Args:
        messages: chat-completions or messages-style messages, as dicts or
            Structs.

    Returns:
        The problems in message order; empty when the history is sendable
        (an empty history is).
    """
    return scan_history(messages).problems


def count_turns(messages: Sequence[Any]) -> int:
    """The number of assistant messages in ``messages``."""
    return scan_history(messages).turns
