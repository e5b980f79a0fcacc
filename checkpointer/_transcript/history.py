"""Agent transcripts: is a history sendable?  One pass over it says.

A history is *sendable* when a model API would accept it: every result
answers a call that is still open (no orphan), every call is answered before
the conversation moves on (none unclosed), and no id is used twice.

The rules of the one-pass scan (``scan_history``), over messages of any
dialect (``dialects.py``; each message's own, detected as it is read): a
call opens when its message is seen.  Results close open calls.  Any
message that does not keep the window open (a chat or LangChain ``tool``
message does) ends the *window* of the calls still open (after its own
results are taken), and those calls are unclosed; a result that comes
later is an orphan.  So for the Anthropic and pydantic-ai dialects the
window is the one message after the call, and for chat and LangChain it is
the run of ``tool`` messages after it, as the APIs require.  A Responses
call's window never ends (its output may come anywhere after it): it is
unclosed only if the history ends without its output.  A pydantic-ai
request keeps the window (consecutive requests are one turn there), and a
pydantic-ai call still open at the end of a history whose window already
answered others of its response's calls is *pending*, not unclosed: that is
how pydantic-ai persists a deferred tool (``requires_approval``, external),
and it answers it from ``deferred_tool_results`` on the next run.  So is a
Responses call still open at the end with only Responses items after it
(no user or assistant message): the Agents SDK's pause for a
``needs_approval`` tool, which its ``RunState`` answers on resume.
Closing either in a stored copy would lose the approval (and the answer
the framework adds on resume would then be a second one), so
``transcript_prepare`` keeps them open (``HistoryScan.pending``);
``validate_history`` still reports them (``unclosed-call``, saying
pending: the history is not sendable as it is, only resumable), and
``close_dangling_tool_calls`` closes them, for a caller who abandons the
paused run.  A message of a
shape no dialect recognises is reported (``unrecognised``) and otherwise
left out: it answers nothing and ends no window.

The scan is a left fold (``ScanState``, fed with ``feed``): the prepare
step's cache (``prepare.py``) keeps it for a history's settled prefix.
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
        """The scan of the ``count`` messages fed, as if they were the whole history."""
        end = self.count
        unclosed, pending = list(self.unclosed), list[Unclosed]()
        deferring, moved = self.deferring, self.moved
        for call_id, (at, of) in self.open_calls.items():
            (pending if deferring and of.defers else unclosed).append(
                Unclosed(at, end, call_id, of)
            )
        for call_id, (at, of) in self.free_calls.items():
            (pending if at > moved and of.defers else unclosed).append(
                Unclosed(at, end, call_id, of)
            )
        problems = self.problems + [
            HistoryProblem(
                kind="unclosed-call",
                index=u.call_index,
                call_id=u.call_id,
                detail=f"tool call {clipped(u.call_id)} has no result before the conversation "
                "goes on",
            )
            for u in unclosed
        ]
        problems += [
            HistoryProblem(
                kind="unclosed-call",
                index=u.call_index,
                call_id=u.call_id,
                detail=f"tool call {clipped(u.call_id)} is pending (a paused run: a deferred "
                "tool or an approval), answered when the framework resumes the run",
            )
            for u in pending
        ]
        problems.sort(key=lambda p: p.index)  # stable: per message, in the order found
        return HistoryScan(problems, unclosed, pending, list(self.running), self.turns)


def scan_history(messages: Sequence[Any]) -> HistoryScan:
    state = ScanState()
    feed(state, messages)
    return state.result()


def feed(state: ScanState, items: Sequence[Any]) -> None:
    """Scan ``items``, the messages after the first ``state.count``, on top of ``state``."""
    # The hot loop of every transcript write: a message costs its dialect's
    # detection (a few dict lookups) and reading, and a few more lookups
    # unless it carries calls or results.
    start = state.count
    problems = state.problems
    unclosed = state.unclosed
    running = state.running
    open_calls = state.open_calls
    free_calls = state.free_calls
    answered = state.answered
    answered_log = state.answered_log
    called = state.called
    called_log = state.called_log
    turns = state.turns
    deferring = state.deferring
    moved = state.moved
    read = classify
    for i, message in enumerate(items, start):
        dialect, (results, calls, turn, keeps, is_running) = read(message)
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
        if keeps:  # a chat "tool" message: the window of its calls stays open
            continue
        # Any other message ends the window of the calls still open.
        if open_calls:
            for call_id, (at, of) in open_calls.items():
                unclosed.append(Unclosed(at, i, call_id, of))
            open_calls.clear()
        deferring = False
        if turn:
            turns += 1
        if calls:
            into = free_calls if dialect.window == "free" else open_calls
            for call_id in calls:
                if type(call_id) is str and call_id not in called:
                    called.add(call_id)
                    called_log.append(call_id)
                    into[call_id] = (i, dialect)
                else:
                    _call(call_id, i, dialect, state)
    state.turns = turns
    state.deferring = deferring
    state.moved = moved
    state.count = start + len(items)


def _unrecognised(index: int, message: Any) -> HistoryProblem:
    return HistoryProblem(
        kind="unrecognised",
        index=index,
        call_id=None,
        detail=f"unrecognised message shape ({describe_shape(message)}): not checked",
    )


def _call(call_id: Any, index: int, dialect: Dialect, state: ScanState) -> None:
    if not isinstance(call_id, str):
        return  # an id-less call cannot be answered or checked
    if call_id in state.called:
        state.problems.append(
            HistoryProblem(
                kind="duplicate-id",
                index=index,
                call_id=call_id,
                detail=f"tool call id {clipped(call_id)} is used by an earlier call too",
            )
        )
        return
    state.called.add(call_id)
    state.called_log.append(call_id)
    (state.free_calls if dialect.window == "free" else state.open_calls)[call_id] = (index, dialect)


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
