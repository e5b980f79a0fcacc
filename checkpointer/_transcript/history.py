"""Agent transcripts: is a history sendable?  One pass over it says.

A history is *sendable* when a model API would accept it: every result answers
a call still open, every call is answered within its window (``Window``), and
no id is used twice.  The scan is a left fold (``ScanState``, fed with
``feed``), so the prepare step can keep its state for a history's settled prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import msgspec

from .dialects import Dialect, classify, describe_shape
from .messages import HistoryProblem, ProblemKind, clipped

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
    call_index: int  # the message with the call
    window_end: int  # the message that closed its window (len(messages) at the end)
    call_id: str
    dialect: Dialect  # the call's: where its answer goes, and what it is


class HistoryScan(msgspec.Struct):
    problems: list[HistoryProblem]
    unclosed: list[Unclosed]
    pending: list[Unclosed]  # open at the end on purpose: a paused run (see above)
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
    deferring: bool
    moved: int
    open_calls: dict[str, tuple[int, Dialect]]
    free_calls: dict[str, tuple[int, Dialect]]


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
        "deferring",
        "free_calls",
        "moved",
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
        # id -> (call index, the call's dialect): calls in their window, and
        # calls whose window never ends (Responses), open until answered
        self.open_calls: dict[str, tuple[int, Dialect]] = {}
        self.free_calls: dict[str, tuple[int, Dialect]] = {}
        self.called: set[str] = set()
        self.answered: set[str] = set()
        self.called_log: list[str] = []
        self.answered_log: list[str] = []
        self.turns = 0
        # some calls of the open window were answered: the rest may be deferred
        self.deferring = False
        # the last message of a dialect that does not defer (a user's, an assistant's)
        self.moved = -1

    def mark(self) -> _Mark:
        return _Mark(
            self.count,
            len(self.problems),
            len(self.unclosed),
            len(self.running),
            len(self.called_log),
            len(self.answered_log),
            self.turns,
            self.deferring,
            self.moved,
            dict(self.open_calls),  # the calls of one window: a few
            dict(self.free_calls),  # Responses calls awaiting their output: a few
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
        self.free_calls.clear()
        self.free_calls.update(mark.free_calls)
        self.turns = mark.turns
        self.deferring = mark.deferring
        self.moved = mark.moved
        self.count = mark.fed

    def forget(self) -> None:
        """Keep what was fed: earlier marks can no longer be undone to."""
        self.called_log.clear()
        self.answered_log.clear()

    def result(self) -> HistoryScan:
        """The scan of the ``count`` messages fed, as if they were the whole history.

        A call still open at the end is *pending*, not unclosed, when its
        dialect defers and the run paused on it: a pydantic-ai call whose
        window already answered others of its response (a deferred tool,
        answered from ``deferred_tool_results`` on the next run), or a
        Responses call with only Responses items after it (an Agents SDK
        approval, answered from its ``RunState``).  Closing either in a stored
        copy would lose the approval, so ``transcript_prepare`` stores it
        open; it is still a problem (``unclosed-call``, saying pending).
        """
        end = self.count
        unclosed, pending = list(self.unclosed), list[Unclosed]()
        for call_id, (at, of) in self.open_calls.items():
            (pending if self.deferring and of.defers else unclosed).append(
                Unclosed(at, end, call_id, of)
            )
        for call_id, (at, of) in self.free_calls.items():
            (pending if at > self.moved and of.defers else unclosed).append(
                Unclosed(at, end, call_id, of)
            )
        problems = self.problems + [_unclosed(u, _NO_RESULT) for u in unclosed]
        problems += [_unclosed(u, _PENDING) for u in pending]
        problems.sort(key=lambda p: p.index)  # stable: per message, in the order found
        return HistoryScan(problems, unclosed, pending, list(self.running), self.turns)


_NO_RESULT = "has no result before the conversation goes on"
_PENDING = (
    "is pending (a paused run: a deferred tool or an approval), answered when the "
    "framework resumes the run"
)


def _unclosed(u: Unclosed, what: str) -> HistoryProblem:
    detail = f"tool call {clipped(u.call_id)} {what}"
    return HistoryProblem(
        kind="unclosed-call", index=u.call_index, call_id=u.call_id, detail=detail
    )


def scan_history(messages: Sequence[Any]) -> HistoryScan:
    state = ScanState()
    feed(state, messages)
    return state.result()


def feed(state: ScanState, items: Sequence[Any]) -> None:
    """Scan ``items``, the messages after the first ``state.count``, on top of ``state``.

    A call opens when its message is seen, and results close open calls.  A
    message that does not keep the window (a chat or LangChain ``tool``
    message keeps it) ends the window of the calls still open, after its own
    results are taken: those calls are unclosed, and a result that comes
    later is an orphan.  A *free* call (Responses) stays open until answered.
    """
    # The hot loop of every transcript write: state in locals, and a message
    # without calls or results costs its classification and a few lookups.
    start = state.count
    problems, unclosed, running = state.problems, state.unclosed, state.running
    open_calls, free_calls = state.open_calls, state.free_calls
    answered, answered_log = state.answered, state.answered_log
    called, called_log = state.called, state.called_log
    turns, deferring, moved = state.turns, state.deferring, state.moved
    for i, message in enumerate(items, start):
        dialect, (results, calls, turn, keeps, is_running) = classify(message)
        if dialect is None:  # left alone: answers nothing, ends no window
            problems.append(_unrecognised(i, message))
            continue
        if not dialect.defers:
            moved = i
        for call_id in results:
            if isinstance(call_id, str) and call_id in open_calls:  # a list id answers nothing
                del open_calls[call_id]
            elif isinstance(call_id, str) and call_id in free_calls:
                del free_calls[call_id]
            else:
                _stray(call_id, i, answered, problems)
                continue
            answered.add(call_id)
            answered_log.append(call_id)
            deferring = True
        if is_running:
            running.append(i)
        if keeps:
            continue
        if open_calls:
            unclosed.extend(Unclosed(at, i, c, of) for c, (at, of) in open_calls.items())
            open_calls.clear()
        deferring = False
        if turn:
            turns += 1
        if calls:
            into = free_calls if dialect.window == "free" else open_calls
            for call_id in calls:
                if not isinstance(call_id, str):
                    continue  # an id-less call cannot be answered or checked
                if call_id in called:
                    problems.append(_duplicate_call(call_id, i))
                    continue
                called.add(call_id)
                called_log.append(call_id)
                into[call_id] = (i, dialect)
    state.turns, state.deferring, state.moved = turns, deferring, moved
    state.count = start + len(items)


def _unrecognised(index: int, message: Any) -> HistoryProblem:
    return HistoryProblem(
        kind="unrecognised",
        index=index,
        call_id=None,
        detail=f"unrecognised message shape ({describe_shape(message)}): not checked",
    )


def _duplicate_call(call_id: str, index: int) -> HistoryProblem:
    detail = f"tool call id {clipped(call_id)} is used by an earlier call too"
    return HistoryProblem(kind="duplicate-id", index=index, call_id=call_id, detail=detail)


def _stray(call_id: Any, index: int, answered: set[str], problems: list[HistoryProblem]) -> None:
    """A result that answers no open call: a second answer, or an orphan."""
    if isinstance(call_id, str) and call_id in answered:
        kind: ProblemKind = "duplicate-id"
        detail = f"tool call {clipped(call_id)} is answered a second time"
    else:
        kind = "orphan-result"
        detail = f"tool result for {clipped(call_id)} answers no open tool call (orphan result)"
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
        messages: messages of any dialect the helpers know (chat-completions,
            Anthropic-style, OpenAI Responses / Agents SDK items, pydantic-ai,
            LangChain), as dicts, Structs or the frameworks' objects, detected
            per message.

    Returns:
        The problems in message order; empty when the history is sendable
        (an empty history is).  A message of an unknown shape is a problem of
        kind ``"unrecognised"``: not checked, not a reason to refuse.
    """
    return scan_history(messages).problems


def count_turns(messages: Sequence[Any]) -> int:
    """The turns in ``messages``: assistant messages, pydantic-ai responses, LangChain ``ai``."""
    return scan_history(messages).turns
