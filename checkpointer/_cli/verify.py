"""``checkpointer verify``: load every checkpoint of a root and check its agent history: bad
(exit 1); tool calls open at the end, a warning; what it cannot read, a note (not checked).
"""

from __future__ import annotations

import argparse
from typing import Any, NamedTuple

from checkpointer.messages import HistoryProblem
from checkpointer.stores import TornTail

from . import report
from .look import History, load, read, transcript
from .roots import (
    CHAT,
    FOREIGN,
    SEALED,
    Entry,
    Root,
    clipped,
    describe_shape,
    detect,
    not_ours,
    scan_history,
)

HELP = "load every checkpoint and check agent histories; exit 1 if any is bad"
DESCRIPTION = (
    "Load every checkpoint of ROOT; where the state has messages, check that a model API "
    "would accept the agent history (roles; every tool call answered, once, before the "
    "conversation goes on). Prints each bad file with its reason and exits with status 1 "
    "when any is bad. Tool calls still open at the end (saved while the tool ran) are a "
    "warning, not bad."
)


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-q", "--quiet", action="store_true", help="print only bad files")


def run(root: Root, args: argparse.Namespace) -> int:
    entries = root.scan()
    bad = unread = 0
    whys: set[str] = set()  # why those not checked were not
    names = (
        "with tool calls open at the end",
        "with a torn tail ignored",
        "with messages not checked",
    )
    counts = dict.fromkeys(names, 0)
    for entry in entries:
        said = verdict(root, entry)
        if said.problem is not None:
            report.line(f"BAD  {entry.path}: {said.problem}")
            bad += 1
            continue
        if not_ours(said.note):  # not damage: only not ours to read
            unread += 1
            whys.add("written through a store of your own" if said.note == FOREIGN else SEALED)
            if not args.quiet:
                report.line(f"note {entry.path}: {said.note}; not checked")
            continue
        for count, text in zip(counts, (said.warning, said.torn, said.note), strict=True):
            counts[count] += text is not None
        if not args.quiet:
            word = "warn" if said.warning or said.torn else "note" if said.note else "ok  "
            texts = [t for t in (said.summary, said.warning, said.torn, said.note) if t is not None]
            report.line(f"{word} {entry.path}: {'; '.join(texts)}")
    for path in root.asides():
        report.line(f"note {path}: a corrupt file a writer moved aside")
    if not entries:
        report.line(f"no checkpoints in {root.where}")
        return report.OK
    also = ", ".join(f"{n} {count}" for count, n in counts.items() if n)
    ok = f"{len(entries) - bad - unread} ok" + (f" ({also})" if also else "")
    not_read = f", {unread} not checked ({'; '.join(sorted(whys))})" if unread else ""
    report.line(f"{len(entries)} checkpoint(s): {ok}, {bad} bad{not_read}")
    return report.PROBLEM if bad else report.OK


class Verdict(NamedTuple):
    """``verify``'s word on one checkpoint: bad, or ok (with a warning, a note, a torn tail)."""

    problem: str | None  # why it is bad
    summary: str  # what a good one holds
    warning: str | None = None  # what a good one needs before it is sent to a model
    note: str | None = None  # what was not checked (unrecognised messages), and why
    torn: str | None = None  # a journal's unfinished last append, ignored by load()


def verdict(root: Root, entry: Entry) -> Verdict:
    """Load ``entry`` and check it: its meta names its key; its history is sendable."""
    got, error = read(root, lambda e: load(root, e), entry)
    if got is None:
        unread = not_ours(error)
        return Verdict(None, "", note=error) if unread else Verdict(error, "")
    loaded = got.checkpoint
    meta = loaded.meta
    if meta.key != entry.key:
        return Verdict(
            f"its meta says key {meta.key!r}, but the file is named for {entry.key!r}", ""
        )
    summary = f"seq {meta.seq}"
    torn = None if loaded.torn is None else torn_tail(loaded.torn)
    found = transcript(loaded.state, got.field)
    if found is None or found.messages is None:
        return Verdict(None, summary, note=None if found is None else found.note, torn=torn)
    return _check(found, summary)._replace(torn=torn)


def torn_tail(torn: TornTail) -> str:
    return (
        f"a torn tail was ignored: line {torn.line} on, {torn.nbytes} bytes at offset "
        f"{torn.offset} ({torn.reason}); the checkpoint is the last whole append before it, "
        "and the next writer to open the journal cuts the tail off"
    )


def _check(found: History, summary: str) -> Verdict:
    """The verdict on a history: bad, open calls at the end (a warning), unrecognised (a note)."""
    messages, at = found.messages, found.at
    assert messages is not None
    for i, message in enumerate(messages):
        if type(message) is dict and "tool_calls" in message and detect(message) is CHAT:
            wrong = _calls_shape(message["tool_calls"])
            if wrong is not None:
                return Verdict(f"invalid agent history: {at(i)}.tool_calls{wrong}", "")
    problems = _sorted(messages)
    if problems["bad"]:
        shown = report.some([f"{at(p.index)}: {p.detail}" for p in problems["bad"]], sep="; ")
        return Verdict(f"not sendable to a model API: {shown}", "")
    warnings: list[str] = []
    if calls := problems["open"]:
        ids = report.some(
            [f"{clipped(p.call_id)} ({at(p.index)})" if p.call_id else at(p.index) for p in calls]
        )
        warnings.append(
            f"{len(calls)} tool call(s) open at the end, saved while the tool ran: {ids}; "
            "run them again or close them before sending the history "
            "(a writer with transcript=Transcript() closes them as it writes)"
        )
    if calls := problems["pending"]:
        ids = report.some([f"{clipped(p.call_id)} ({at(p.index)})" for p in calls])
        warnings.append(
            f"{len(calls)} tool call(s) pending, a paused run (a deferred tool, an approval): "
            f"{ids}; the framework answers them when it resumes the run "
            "(close_dangling_tool_calls() closes them, to abandon it)"
        )
    note = None
    if unknown := problems["unknown"]:
        shapes = [f"{at(p.index)} ({describe_shape(messages[p.index])})" for p in unknown]
        note = f"unrecognised message shape at {report.some(shapes)}: not checked"
    summary += f", {len(messages)} messages"
    return Verdict(None, summary, "; ".join(warnings) or None, note)


def _sorted(messages: list[Any]) -> dict[str, list[HistoryProblem]]:
    """The problems of a history: bad, calls open at the end (saved while the tools ran: not
    damage), pending in a paused run, unrecognised."""
    scan = scan_history(messages)
    end = len(messages)
    calls: dict[tuple[int, str | None], str] = {
        (u.call_index, u.call_id): "open" for u in scan.unclosed if u.window_end == end
    }
    calls.update({(u.call_index, u.call_id): "pending" for u in scan.pending})
    found: dict[str, list[HistoryProblem]] = {"bad": [], "open": [], "pending": [], "unknown": []}
    for problem in scan.problems:
        kind = "unknown" if problem.kind == "unrecognised" else "bad"
        if problem.kind == "unclosed-call":  # pending in a paused run, or open at the end
            kind = calls.get((problem.index, problem.call_id), "bad")
        found[kind].append(problem)
    return found


def _calls_shape(calls: Any) -> str | None:
    """What is wrong with a chat message's ``tool_calls`` (a JSON path tail, why), or None."""
    if not isinstance(calls, list):
        return f": is {report.json_type(calls)}, not a list of tool calls"
    for j, call in enumerate(calls):
        if not isinstance(call, dict):
            return f"[{j}]: is {report.json_type(call)}, not a tool call object"
        if "function" in call and not isinstance(call["function"], dict):
            return f"[{j}].function: is {report.json_type(call['function'])}, not an object"
    return None
