"""Is a history sendable?  One pass says: every result answers an open call, every call is
answered within its window, no id is used twice.  The scan is a left fold (``feed``)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, TypeAlias

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


Call: TypeAlias = tuple[int, Dialect, str | None]
"""An open call: its message, its dialect, and its branch (ADK's; None: it sees all)."""


class HistoryScan(msgspec.Struct):
    problems: list[HistoryProblem]
    unclosed: list[Unclosed]
    pending: list[Unclosed]  # open at the end on purpose: a paused run (see above)
    running: list[int]  # indices of messages holding running results
    turns: int | None  # assistant messages; None: some message of a shape no dialect knows


class ScanState:
    """The scan after its first ``count`` messages: a left fold, fed more later (``feed``).

    ``mark`` and ``undo`` take a feed back, cheaply at any length: the id sets
    are not copied, and ``called_log`` / ``answered_log`` say what was added
    to them since (a call id is added once, when new; an answer once, when it
    closes an open call).  ``forget`` drops the logs, and the earlier marks.
    """

    __slots__ = (
        "answered",
        "answered_log",
        "called",
        "called_log",
        "count",
        "deferring",
        "free_calls",
        "last_turn",
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
        # id -> (call index, the call's dialect, its branch): calls in their window,
        # and calls whose window never ends (Responses), open until answered
        self.open_calls: dict[str, Call] = {}
        self.free_calls: dict[str, Call] = {}
        self.called: set[str] = set()
        self.answered: set[str] = set()
        self.called_log: list[str] = []
        self.answered_log: list[str] = []
        self.turns = 0
        self.last_turn: bool | str = False  # the last message's turn: a part of it continues it
        # some calls of the open window were answered: the rest may be deferred
        self.deferring = False
        # the last message of a dialect that does not defer (a user's, an assistant's)
        self.moved = -1

    def mark(self) -> tuple[ScanState, int, int]:
        saved = copy.copy(self)  # the few open calls copied; the id sets shared, logged
        saved.problems, saved.unclosed = [*self.problems], [*self.unclosed]
        saved.running, saved.open_calls = [*self.running], {**self.open_calls}
        saved.free_calls = {**self.free_calls}
        return saved, len(self.called_log), len(self.answered_log)

    def undo(self, mark: tuple[ScanState, int, int]) -> None:
        saved, called, answered = mark
        self.called.difference_update(self.called_log[called:])
        self.answered.difference_update(self.answered_log[answered:])
        for name in self.__slots__:
            if name not in ("called", "answered", "called_log", "answered_log"):
                setattr(self, name, getattr(saved, name))
        del self.called_log[called:], self.answered_log[answered:]

    def forget(self) -> None:
        self.called_log.clear()
        self.answered_log.clear()

    def result(self) -> HistoryScan:
        """The scan of the ``count`` messages fed, as if they were the whole history.

        A call still open at the end is *pending*, not unclosed, when its
        dialect defers and the run paused on it: a pydantic-ai call whose
        window answered others of its response (a deferred tool), or a
        Responses call with only Responses items after it (an Agents SDK
        approval).  Closing it in a stored copy would lose the approval.
        """
        end = self.count
        unclosed, pending = list(self.unclosed), list[Unclosed]()
        for call_id, (at, of, _) in self.open_calls.items():
            (pending if self.deferring and of.defers else unclosed).append(
                Unclosed(at, end, call_id, of)
            )
        for call_id, (at, of, _) in self.free_calls.items():
            (pending if at > self.moved and of.defers else unclosed).append(
                Unclosed(at, end, call_id, of)
            )
        problems = self.problems + [_unclosed(u, _NO_RESULT) for u in unclosed]
        problems += [_unclosed(u, _PENDING) for u in pending]
        problems.sort(key=lambda p: p.index)  # stable: per message, in the order found
        unknown = any(p.kind == "unrecognised" for p in self.problems)
        turns = None if unknown else self.turns
        return HistoryScan(problems, unclosed, pending, list(self.running), turns)


_NO_RESULT = "has no result before the conversation goes on"
_PENDING = (
    "is pending (a paused run: a deferred tool or an approval), answered when the "
    "framework resumes the run"
)


def _unclosed(u: Unclosed, what: str) -> HistoryProblem:
    return _problem(
        "unclosed-call", u.call_index, u.call_id, f"tool call {clipped(u.call_id)} {what}"
    )


def scan_history(messages: Sequence[Any]) -> HistoryScan:
    state = ScanState()
    feed(state, messages)
    return state.result()


def feed(state: ScanState, items: Sequence[Any]) -> None:
    """Scan ``items``, the messages after the first ``state.count``, on top of ``state``.

    Results close open calls of their own dialect (one of another is an
    orphan).  A message that does not keep the window (a ``tool`` message
    keeps it), and is not a part of the turn before (see ``Reading``), then
    ends the window of the calls still open: they are unclosed, and a later
    result is an orphan.  A *free* call
    (Responses) stays open until answered.
    """
    # The hot loop of every transcript write: state in locals.
    start = state.count
    problems, unclosed, running = state.problems, state.unclosed, state.running
    open_calls, free_calls = state.open_calls, state.free_calls
    answered, answered_log = state.answered, state.answered_log
    turns, deferring, moved, last_turn = state.turns, state.deferring, state.moved, state.last_turn
    for i, message in enumerate(items, start):
        dialect, (results, calls, turn, keeps, is_running) = classify(message)
        if dialect is None:  # left alone: answers nothing, ends no window
            shape = f"unrecognised message shape ({describe_shape(message)}): not checked"
            problems.append(_problem("unrecognised", i, None, shape))
            continue
        if not dialect.defers:
            moved = i
        branch = dialect.branch(message) if dialect.branched else None
        for call_id in results:
            call = None
            if isinstance(call_id, str):  # a list id answers nothing
                opened = open_calls if call_id in open_calls else free_calls
                call = opened.get(call_id)
            # the call's API takes only its own results, in a branch its call sees
            if call is None or call[1] is not dialect or not _sees(call[2], branch):
                problems.append(_stray(call_id, i, answered, (dialect, branch), call))
                continue
            del opened[call_id]
            answered.add(call_id)
            answered_log.append(call_id)
            deferring = True
        if is_running:
            running.append(i)
        if keeps:
            continue
        if turn is True or not turn or turn != last_turn:  # not a part of the message before
            if open_calls:
                ended = [c for c, call in open_calls.items() if _sees(call[2], branch)]
                for call_id in ended:
                    at, of, _ = open_calls.pop(call_id)
                    unclosed.append(Unclosed(at, i, call_id, of))
            deferring = False
            turns += bool(turn)
            last_turn = turn
        if calls:
            into = free_calls if dialect.window == "free" else open_calls
            _open(state, calls, i, (dialect, branch), into)
    state.turns, state.deferring, state.moved, state.last_turn = turns, deferring, moved, last_turn
    state.count = start + len(items)


def _open(
    state: ScanState, calls: Sequence[Any], i: int, of: tuple[Any, str | None], into: dict[str, Any]
) -> None:
    """Open message ``i``'s ``calls`` (of dialect and branch ``of``) in ``into``."""
    for call_id in calls:
        if not isinstance(call_id, str):  # it cannot be answered, nor checked
            detail = f"tool call without an id ({describe_shape(call_id)}): not checked"
            state.problems.append(_problem("unrecognised", i, None, detail))
            continue
        if call_id in state.called:
            detail = f"tool call id {clipped(call_id)} is used by an earlier call too"
            state.problems.append(_problem("duplicate-id", i, call_id, detail))
            continue
        state.called.add(call_id)
        state.called_log.append(call_id)
        into[call_id] = (i, *of)


def _problem(kind: ProblemKind, index: int, call_id: Any, detail: str) -> HistoryProblem:
    call_id = call_id if isinstance(call_id, str) else None
    return HistoryProblem(kind=kind, index=index, call_id=call_id, detail=detail)


def _sees(called: str | None, branch: str | None) -> bool:
    """Whether a call of branch ``called`` sees a message of ``branch``: ADK builds a branch's
    request of its own events, its ancestors' and those of no branch (not its siblings')."""
    return not called or not branch or called == branch or called.startswith(branch + ".")


def _stray(
    call_id: Any, index: int, answered: set[str], of: tuple[Dialect, str | None], call: Call | None
) -> HistoryProblem:
    """A result that answers no open call (a second answer, an orphan), or an open call of
    another dialect or a branch it does not see (its API refuses it: the call stays open)."""
    if call is not None:
        (dialect, branch), at = of, f"its call (message {call[0]})"
        if dialect is not call[1]:
            why = f"is {dialect.name}'s, but {at} is {call[1].name}'s, whose API does not take it"
        else:
            why = f"is of branch {clipped(branch)}, unseen by {at} of {clipped(call[2])}"
        detail = f"tool result for {clipped(call_id)} {why} (orphan result)"
        return _problem("orphan-result", index, call_id, detail)
    if isinstance(call_id, str) and call_id in answered:
        detail = f"tool call {clipped(call_id)} is answered a second time"
        return _problem("duplicate-id", index, call_id, detail)
    detail = f"tool result for {clipped(call_id)} answers no open tool call (orphan result)"
    return _problem("orphan-result", index, call_id, detail)


def validate_history(messages: Sequence[Any]) -> list[HistoryProblem]:
    """Every reason a model API would refuse ``messages``, in one pass.

    ``messages`` may mix every dialect the helpers know (chat-completions,
    Anthropic-style, OpenAI Responses / Agents SDK items, pydantic-ai,
    LangChain, Bedrock Converse / Strands, Gemini / ADK events, Claude Code
    transcript entries), as dicts, Structs or the frameworks' objects.  Returns the
    problems in message order, none for a sendable history (an empty one is);
    a message of an unknown shape is an ``"unrecognised"`` problem, not checked
    and not a reason to refuse.
    """
    return scan_history(messages).problems


def count_turns(messages: Sequence[Any]) -> int | None:
    """The turns in ``messages``: assistant messages (a response the Claude Code CLI split
    into entries is one), pydantic-ai responses, LangChain ``ai``, Gemini ``model`` contents;
    None when a message is of a shape no dialect recognises (the turns cannot be counted)."""
    return scan_history(messages).turns
