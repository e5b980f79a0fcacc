"""``checkpointer ls``: one row per checkpoint of a root (``--json`` for scripts); summary
checkpoints in a column (alone: a row), corrupt files in a note, neither changing the status.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from . import report
from .look import Row, inspect
from .roots import Extra, Root, not_ours

HELP = "list the checkpoints of a store"
DESCRIPTION = (
    "One row per checkpoint: key, last update (UTC), size, seq, turns, live (a writer had "
    "it open at its last write), pinned, lock (alive: a writer holds <key>.lock now; stale: "
    "the lock file was left by a writer that died), and a title (the first user message)."
)


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sort",
        choices=sorted(SORTS),
        default="key",
        help="order rows by this field (%(default)s); updated, size, seq and turns "
        "put the newest or largest first",
    )
    parser.add_argument("-r", "--reverse", action="store_true", help="reverse the order")
    parser.add_argument("--json", action="store_true", help="print a JSON array, for scripts")


SORTS: dict[str, Callable[[Row], Any]] = {
    "key": lambda r: r.key,
    "updated": lambda r: r.updated_at or r.mtime,
    "size": lambda r: r.size,
    "seq": lambda r: r.seq if r.seq is not None else -1,
    "turns": lambda r: r.turns if r.turns is not None else -1,
    "title": lambda r: r.title.casefold(),
}
_DESCENDING = {"updated", "size", "seq", "turns"}  # newest, biggest first
_ONLY = "(a summary only: no checkpoint)"  # the TITLE of a key's summary row


def run(root: Root, args: argparse.Namespace) -> int:
    """List the checkpoints of ``root``; 1 when some cannot be read (they are marked)."""
    rows = [inspect(root, entry).row for entry in root.scan()]
    extras = root.extras()
    summaries = {e.entry.key: e for e in extras.found if e.entry.kind == "summary"}
    corrupt = [e.entry.path for e in extras.found if e.entry.kind == "corrupt" and not e.problem]
    for row in rows:
        extra = summaries.get(row.key)
        if extra is not None and extra.problem is None:
            row.summary, row.summary_at = extra.entry.path, extra.time
    keys = {r.key for r in rows}
    rows += [_summary_row(root, extra) for key, extra in summaries.items() if key not in keys]
    rows.sort(key=lambda r: r.key)
    rows.sort(key=SORTS[args.sort], reverse=(args.sort in _DESCENDING) != args.reverse)
    for problem in extras.problems:
        report.error("ls", problem)
    for extra in extras.found:  # something planted in place of one, or a damaged summary
        if extra.problem or extra.unreadable:
            report.error("ls", extra.problem or f"{extra.entry.path}: {extra.unreadable}")
    bad = sum(1 for r in rows if r.error is not None and not not_ours(r.error))
    if args.json:
        report.json_rows(rows)  # each unreadable one with its "error"
    elif rows:
        _table(rows, summaries)
    else:
        report.line(f"no checkpoints in {root.where}")
    if corrupt:  # named, so a user knows they are there
        note = (
            f"note: {len(corrupt)} corrupt file(s) a writer moved aside, kept for rescue by "
            f"hand: {report.some(corrupt)} (`checkpointer prune --corrupt` removes them)"
        )
        if args.json:  # stdout is the array
            report.error("ls", note)
        else:
            report.line(note)
    if bad and not args.json:
        message = root.unreadable.format(n=bad, where=root.where)
        report.error("ls", message, stdout=root.unreadable_on_stdout)
    return report.PROBLEM if bad else report.OK


def _table(rows: list[Row], summaries: dict[str, Extra]) -> None:
    kinds = len({r.kind for r in rows}) > 1
    header = ["KEY", *(["KIND"] if kinds else []), "UPDATED (UTC)", "SIZE", "SEQ", "TURNS"]
    header += ["LIVE", "PINNED", "LOCK", *(["SUMMARY"] if summaries else []), "TITLE"]
    now = datetime.now(UTC)
    table = [header]
    for r in rows:
        only = r.kind == "summary"  # a summary without a checkpoint: nothing else to say
        table.append(
            [
                r.key,
                *([r.kind] if kinds else []),
                report.when(r.updated_at),
                report.size(r.size),
                "-" if only else report.value(r.seq),
                "-" if only else _turns(r),
                "-" if only else report.value(r.live),
                "-" if only else report.value(r.pinned),
                r.lock or "-",
                *([_age(summaries.get(r.key), now)] if summaries else []),
                _ONLY if only else f"! {r.error}" if r.error else r.title,
            ]
        )
    report.table(table, right={2 + kinds, 3 + kinds, 4 + kinds})  # size, seq, turns


def _summary_row(root: Root, extra: Extra) -> Row:
    entry = extra.entry
    row = Row(key=entry.key, kind="summary", path=entry.path, size=extra.size, mtime=extra.time)
    if extra.problem is None:
        row.updated_at, row.summary, row.summary_at = extra.time, entry.path, extra.time
    view = root.lock(entry.key)
    if view is not None:
        row.lock, row.lock_holder = view.state, view.holder
    return row


def _age(extra: Extra | None, now: datetime) -> str:
    if extra is None:
        return "-"
    if extra.problem or extra.unreadable:
        return "!"  # said on stderr
    return report.ago((now - extra.time).total_seconds()) + " ago"


def _turns(r: Row) -> str:
    """Its turns; ``?`` for a history with a message no dialect knows; ``-`` without one."""
    if r.error or r.turns is not None:
        return report.value(r.turns)
    return "-" if r.messages is None else report.UNCOUNTED
