"""``checkpointer verify``: load every checkpoint of a root and check its agent history.

A history (``look.history``: in any layout an adapter stores) is scanned by
the transcript helpers, each message in its own dialect.  Tool calls left
open at the end (saved while the tool ran) are a warning; a message of a
shape no dialect recognises, or a history this tool cannot decode (a
LangGraph thread log), is a note: not checked, and not bad; anything else a
model API would refuse is bad (exit 1).
"""

from __future__ import annotations

import argparse
from typing import Any, Literal, NamedTuple

from checkpointer.stores import TornTail

from . import report
from .look import History, history, read
from .roots import CHAT, Entry, Root, clipped, describe_shape, detect, scan_history

__all__ = ["Verdict", "run", "torn_tail", "verdict"]


def run(root: Root, args: argparse.Namespace) -> int:
    """Check every checkpoint of ``root``; 1 when any is bad."""
    entries = root.scan().entries
    bad = warned = torn = noted = 0
    for entry in entries:
        verdict_ = verdict(root, entry)
        outcome = _report(entry.path, verdict_, quiet=args.quiet)
        bad += outcome == "bad"
        good = outcome != "bad"
        warned += good and verdict_.warning is not None
        torn += good and verdict_.torn is not None
        noted += good and verdict_.note is not None
    for path in root.asides():
        report.line(f"note {path}: a corrupt file a writer moved aside")
    if not entries:
        report.line(f"no checkpoints in {root.where}")
        return report.OK
    ok = f"{len(entries) - bad} ok"
    also = []
    if warned:
        also.append(f"{warned} with tool calls open at the end")
    if torn:
        also.append(f"{torn} with a torn tail ignored")
    if noted:
        also.append(f"{noted} with messages not checked")
    if also:
        ok += f" ({', '.join(also)})"
    report.line(f"{len(entries)} checkpoint(s): {ok}, {bad} bad")
    return report.PROBLEM if bad else report.OK


class Verdict(NamedTuple):
    """``verify``'s word on one checkpoint: bad (``problem``), or ok, with a warning or a note."""

    problem: str | None  # why it is bad
    summary: str  # what a good one holds
    warning: str | None = None  # what a good one needs before it is sent to a model
    note: str | None = None  # what was not checked (unrecognised messages), and why
    torn: str | None = None  # a journal's unfinished last append, ignored by load()


_Outcome = Literal["bad", "warn", "note", "ok"]


def _report(path: str, verdict_: Verdict, *, quiet: bool) -> _Outcome:
    """Print one ``verify`` line for ``path`` (ok, warn and note lines unless quiet)."""
    if verdict_.problem is not None:
        report.line(f"BAD  {path}: {verdict_.problem}")
        return "bad"
    said = [s for s in (verdict_.warning, verdict_.torn, verdict_.note) if s is not None]
    outcome: _Outcome = "ok"
    if verdict_.warning is not None or verdict_.torn is not None:
        outcome = "warn"
    elif verdict_.note is not None:
        outcome = "note"
    if not quiet:
        word = {"ok": "ok  ", "note": "note", "warn": "warn"}[outcome]
        report.line(f"{word} {path}: {'; '.join([verdict_.summary, *said])}")
    return outcome


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
    found = history(state)
    if found is None:
        return Verdict(None, summary)
    if found.messages is None:
        return Verdict(None, summary, note=found.note)
    return _check(found, summary)


def _check(found: History, summary: str) -> Verdict:
    """The verdict on a history: bad, open calls at the end (a warning), unrecognised (a note)."""
    messages = found.messages
    assert messages is not None
    at = found.at
    summary += f", {len(messages)} messages"
    for i, message in enumerate(messages):
        if type(message) is dict and "tool_calls" in message and detect(message) is CHAT:
            wrong = _calls_shape(message["tool_calls"])
            if wrong is not None:
                return Verdict(f"invalid agent history: {at(i)}.tool_calls{wrong}", "")
    scan = scan_history(messages)
    # Calls left open at the end are not damage: a writer without prepare
    # saved the session while its tools ran (transcript_prepare() closes
    # them as it writes).  Sendable only once they are run again or closed,
    # so they are a warning; anything else a model API would refuse is bad.
    end = len(messages)
    still_open = {(u.call_index, u.call_id) for u in scan.unclosed if u.window_end == end}
    paused = {(u.call_index, u.call_id) for u in scan.pending}
    open_calls, pending, bad, unknown = [], [], [], []
    for problem in scan.problems:
        if problem.kind == "unrecognised":
            unknown.append(problem)
        elif problem.kind == "unclosed-call" and (problem.index, problem.call_id) in paused:
            pending.append(problem)
        elif problem.kind == "unclosed-call" and (problem.index, problem.call_id) in still_open:
            open_calls.append(problem)
        else:
            bad.append(problem)
    if bad:
        shown = "; ".join(f"{at(p.index)}: {p.detail}" for p in bad[:3])
        more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
        return Verdict(f"not sendable to a model API: {shown}{more}", "")
    warnings: list[str] = []
    if open_calls:
        ids = ", ".join(
            f"{clipped(p.call_id)} ({at(p.index)})" if p.call_id else at(p.index)
            for p in open_calls[:3]
        )
        ids += f" and {len(open_calls) - 3} more" if len(open_calls) > 3 else ""
        warnings.append(
            f"{len(open_calls)} tool call(s) open at the end, saved while the tool ran: {ids}; "
            "run them again or close them before sending the history "
            "(a writer with transcript=Transcript() closes them as it writes)"
        )
    if pending:
        ids = ", ".join(f"{clipped(p.call_id)} ({at(p.index)})" for p in pending[:3])
        ids += f" and {len(pending) - 3} more" if len(pending) > 3 else ""
        warnings.append(
            f"{len(pending)} tool call(s) pending, a paused run (a deferred tool, an "
            f"approval): {ids}; the framework answers them when it resumes the run "
            "(close_dangling_tool_calls() closes them, to abandon it)"
        )
    warning = "; ".join(warnings) if warnings else None
    note = None
    if unknown:
        shown = ", ".join(
            f"{at(p.index)} ({describe_shape(messages[p.index])})" for p in unknown[:3]
        )
        more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
        note = f"unrecognised message shape at {shown}{more}: not checked"
    return Verdict(None, summary, warning, note)


def _calls_shape(calls: Any) -> str | None:
    """What is wrong with a chat message's ``tool_calls`` (a JSON path tail and why), or None."""
    if not isinstance(calls, list):
        return f": is {report.json_type(calls)}, not a list of tool calls"
    for j, call in enumerate(calls):
        if not isinstance(call, dict):
            return f"[{j}]: is {report.json_type(call)}, not a tool call object"
        if "function" in call and not isinstance(call["function"], dict):
            return f"[{j}].function: is {report.json_type(call['function'])}, not an object"
    return None
