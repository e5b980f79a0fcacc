"""``checkpointer verify``: load every checkpoint of a root and check its agent history.

A history is checked by ``validate_history``, after a check of what it
takes for granted (a list of objects with a known role, tool calls as a list
of objects).  Tool calls left open at the end (saved while the tool ran)
are a warning; anything else a model API would refuse is bad (exit 1).
"""

from __future__ import annotations

import argparse
from typing import Any, Literal, NamedTuple

from checkpointer import HistoryProblem, TornTail, validate_history

from . import report
from .look import read
from .roots import Entry, Root

__all__ = ["Verdict", "run", "torn_tail", "verdict"]

_ROLES = ("system", "developer", "user", "assistant", "tool", "function")
_AT = "$.state.messages"


def run(root: Root, args: argparse.Namespace) -> int:
    """Check every checkpoint of ``root``; 1 when any is bad."""
    entries = root.scan().entries
    bad = warned = torn = 0
    for entry in entries:
        verdict_ = verdict(root, entry)
        outcome = _report(entry.path, verdict_, quiet=args.quiet)
        bad += outcome == "bad"
        warned += outcome == "warn" and verdict_.warning is not None
        torn += outcome == "warn" and verdict_.torn is not None
    for path in root.asides():
        report.line(f"note {path}: a corrupt file a writer moved aside")
    if not entries:
        report.line(f"no checkpoints in {root.where}")
        return report.OK
    ok = f"{len(entries) - bad} ok"
    notes = [f"{warned} with tool calls open at the end"] if warned else []
    notes += [f"{torn} with a torn tail ignored"] if torn else []
    if notes:
        ok += f" ({', '.join(notes)})"
    report.line(f"{len(entries)} checkpoint(s): {ok}, {bad} bad")
    return report.PROBLEM if bad else report.OK


class Verdict(NamedTuple):
    """``verify``'s word on one checkpoint: bad (``problem``), or ok, maybe with a warning."""

    problem: str | None  # why it is bad
    summary: str  # what a good one holds
    warning: str | None = None  # what a good one needs before it is sent to a model
    torn: str | None = None  # a journal's unfinished last append, ignored by load()


def _report(path: str, verdict_: Verdict, *, quiet: bool) -> Literal["bad", "warn", "ok"]:
    """Print one ``verify`` line for ``path`` (ok and warn lines unless quiet)."""
    if verdict_.problem is not None:
        report.line(f"BAD  {path}: {verdict_.problem}")
        return "bad"
    if verdict_.warning is not None or verdict_.torn is not None:
        if not quiet:
            said = "; ".join(w for w in (verdict_.warning, verdict_.torn) if w is not None)
            report.line(f"warn {path}: {verdict_.summary}; {said}")
        return "warn"
    if not quiet:
        report.line(f"ok   {path}: {verdict_.summary}")
    return "ok"


def verdict(root: Root, entry: Entry) -> Verdict:
    """Load ``entry`` and check it: its meta names its key; its history is sendable."""
    loaded, error = read(root, entry)
    if loaded is None:
        return Verdict(error, "")
    meta = loaded.meta
    if meta.key != entry.key:
        return Verdict(
            f"its meta says key {meta.key!r}, but the file is named for {entry.key!r}", ""
        )
    summary = f"seq {meta.seq}"
    torn = None if loaded.torn is None else torn_tail(loaded.torn)
    return _history(loaded.state, summary)._replace(torn=torn)


def torn_tail(torn: TornTail) -> str:
    """What a journal's torn tail dropped, and what becomes of it."""
    return (
        f"a torn tail was ignored: line {torn.line} on, {torn.nbytes} bytes at offset "
        f"{torn.offset} ({torn.reason}); the checkpoint is the last whole append before it, "
        "and the next writer to open the journal cuts the tail off"
    )


def _history(state: Any, summary: str) -> Verdict:
    """The verdict on a state's agent history (a state without one is fine)."""
    if not (isinstance(state, dict) and "messages" in state):
        return Verdict(None, summary)
    messages = state["messages"]
    shape = _shape(messages)
    if shape is not None:
        return Verdict(f"invalid agent history: {shape}", "")
    summary += f", {len(messages)} messages"
    problems = validate_history(messages)
    # Calls left open at the end are not damage: a writer without prepare
    # saved the session while its tools ran (transcript_prepare() closes
    # them as it writes).  Sendable only once they are run again or closed,
    # so they are a warning; anything else a model API would refuse is bad.
    open_calls: list[HistoryProblem] = []
    bad: list[HistoryProblem] = []
    for problem in problems:
        (open_calls if _open_at_end(problem, messages) else bad).append(problem)
    if bad:
        shown = "; ".join(p.describe(_AT) for p in bad[:3])
        more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
        return Verdict(f"not sendable to a model API: {shown}{more}", "")
    if not open_calls:
        return Verdict(None, summary)
    ids = ", ".join(
        f"{p.call_id!r} ({_AT}[{p.index}])" if p.call_id else f"{_AT}[{p.index}]"
        for p in open_calls
    )
    return Verdict(
        None,
        summary,
        f"{len(open_calls)} tool call(s) open at the end, saved while the tool ran: {ids}; "
        "run them again or close them before sending the history "
        "(a writer with prepare=transcript_prepare() closes them as it writes)",
    )


def _shape(messages: Any) -> str | None:
    """What ``validate_history`` takes for granted: a list of objects with a known role."""
    if not isinstance(messages, list):
        return f"{_AT}: is {report.json_type(messages)}, not a list of messages"
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            return f"{_AT}[{i}]: is {report.json_type(message)}, not a message object"
        role = message.get("role")
        if not isinstance(role, str):
            return f"{_AT}[{i}].role: is {report.json_type(role)}, not a string"
        if role not in _ROLES:
            return f"{_AT}[{i}].role: unknown role {role!r} (expected one of {', '.join(_ROLES)})"
        calls = message.get("tool_calls")
        if calls is not None:
            wrong = _calls_shape(calls)
            if wrong is not None:
                return f"{_AT}[{i}].tool_calls{wrong}"
    return None


def _calls_shape(calls: Any) -> str | None:
    """What is wrong with a message's ``tool_calls`` (a JSON path tail and why), or None."""
    if not isinstance(calls, list):
        return f": is {report.json_type(calls)}, not a list of tool calls"
    for j, call in enumerate(calls):
        if not isinstance(call, dict):
            return f"[{j}]: is {report.json_type(call)}, not a tool call object"
        if "function" in call and not isinstance(call["function"], dict):
            return f"[{j}].function: is {report.json_type(call['function'])}, not an object"
    return None


def _open_at_end(problem: HistoryProblem, messages: list[Any]) -> bool:
    """An unclosed call with nothing after it but tool results: saved while its tool ran."""
    return problem.kind == "unclosed-call" and all(
        m.get("role") == "tool" for m in messages[problem.index + 1 :]
    )
