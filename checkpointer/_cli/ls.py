"""``checkpointer ls``: one row per checkpoint of a root (``--json`` for scripts).

A key's summary checkpoint (``sessions/<key>/checkpoint.md``) is shown in a
SUMMARY column (its age), and a key with a summary but no checkpoint gets a
row of its own (kind ``summary``); corrupt files a writer moved aside are
named in a note after the table.  Neither changes the exit status.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from . import report
from .look import Row, inspect
from .roots import Extra, Root

__all__ = ["SORTS", "Listed", "run"]


class Listed(Row, kw_only=True):
    """A row of ``ls`` with its key's summary checkpoint, if it has one."""

    summary: str | None = None  # its path (sessions/<key>/checkpoint.md)
    summary_at: datetime | None = None  # when it was written (its file's time if unreadable)


SORTS: dict[str, Callable[[Row], Any]] = {
    "key": lambda r: r.key,
    "updated": lambda r: r.updated_at or r.mtime,
    "size": lambda r: r.size,
    "seq": lambda r: r.seq if r.seq is not None else -1,
    "turns": lambda r: r.turns if r.turns is not None else -1,
    "title": lambda r: r.title.casefold(),
}
_DESCENDING = {"updated", "size", "seq", "turns"}  # newest, biggest first
_NAMED = 3  # corrupt files named in the note; the rest counted
_ONLY = "(a summary only: no checkpoint)"  # the TITLE of a key's summary row


def run(root: Root, args: argparse.Namespace) -> int:
    """List the checkpoints of ``root``; 1 when some cannot be read (they are marked)."""
    rows = [_listed(inspect(root, entry).row) for entry in root.scan().entries]
    extras = root.extras()
    summaries = {e.entry.key: e for e in extras.found if e.entry.kind == "summary"}
    corrupt = [e.entry.path for e in extras.found if e.entry.kind == "corrupt" and not e.problem]
    for row in rows:
        _with_summary(row, summaries.get(row.key))
    keys = {r.key for r in rows}
    rows += [_summary_row(root, extra) for key, extra in summaries.items() if key not in keys]
    rows.sort(key=lambda r: r.key)
    rows.sort(key=SORTS[args.sort], reverse=(args.sort in _DESCENDING) != args.reverse)
    status = report.PROBLEM if any(r.error for r in rows) else report.OK
    for problem in extras.problems:
        report.warning("ls", problem)
    for extra in extras.found:  # something planted in place of one, or a damaged summary
        if extra.problem or extra.unreadable:
            report.warning("ls", extra.problem or f"{extra.entry.path}: {extra.unreadable}")
    if args.json:
        report.json_rows(rows)  # each unreadable one with its "error"
        _note(corrupt, stdout=False)
        return status
    if not rows:
        report.line(f"no checkpoints in {root.where}")
        _note(corrupt, stdout=True)
        return report.OK
    _table(rows, summaries)
    _note(corrupt, stdout=True)
    bad = sum(1 for r in rows if r.error)
    if bad:
        words = root.words
        message = words.unreadable.format(n=bad, where=root.where)
        report.warning("ls", message, stdout=words.unreadable_on_stdout)
    return status


def _table(rows: list[Listed], summaries: dict[str, Extra]) -> None:
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
                "-" if only else report.opt(r.seq),
                "-" if only else report.opt(r.turns) if r.error or r.turns is not None else "-",
                "-" if only else report.yes(r.live),
                "-" if only else report.yes(r.pinned),
                r.lock or "-",
                *([_age(summaries.get(r.key), now)] if summaries else []),
                _ONLY if only else f"! {r.error}" if r.error else r.title,
            ]
        )
    report.table(table, right={2 + kinds, 3 + kinds, 4 + kinds})  # size, seq, turns


def _listed(row: Row) -> Listed:
    return Listed(**{f: getattr(row, f) for f in row.__struct_fields__})


def _with_summary(row: Listed, extra: Extra | None) -> None:
    if extra is not None and extra.problem is None:
        row.summary, row.summary_at = extra.entry.path, extra.time


def _summary_row(root: Root, extra: Extra) -> Listed:
    """The row of a key that has a summary checkpoint and no checkpoint."""
    entry = extra.entry
    row = Listed(key=entry.key, kind="summary", path=entry.path, size=extra.size, mtime=extra.time)
    row.updated_at = extra.time if extra.problem is None else None
    _with_summary(row, extra)
    view = root.lock(entry.key)
    if view is not None:
        row.lock, row.lock_holder = view.state, view.holder
    return row


def _age(extra: Extra | None, now: datetime) -> str:
    """The SUMMARY cell: how old the key's summary is, ``!`` when it cannot be read."""
    if extra is None:
        return "-"
    if extra.problem or extra.unreadable:
        return "!"  # said on stderr
    return report.ago((now - extra.time).total_seconds()) + " ago"


def _note(corrupt: list[str], *, stdout: bool) -> None:
    """Name the corrupt files a writer moved aside, so a user knows they are there."""
    if not corrupt:
        return
    named = ", ".join(corrupt[:_NAMED])
    if len(corrupt) > _NAMED:
        named += f" and {len(corrupt) - _NAMED} more"
    note = (
        f"note: {len(corrupt)} corrupt file(s) a writer moved aside, kept for rescue by hand: "
        f"{named} (`checkpointer prune --corrupt` removes them)"
    )
    if stdout:
        report.line(note)
    else:  # --json: stdout is the array
        report.warning("ls", note)
