"""``checkpointer ls``: one row per checkpoint of a root (``--json`` for scripts)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from . import report
from .look import Row, inspect
from .roots import Root

__all__ = ["SORTS", "run"]

SORTS: dict[str, Callable[[Row], Any]] = {
    "key": lambda r: r.key,
    "updated": lambda r: r.updated_at or r.mtime,
    "size": lambda r: r.size,
    "seq": lambda r: r.seq if r.seq is not None else -1,
    "turns": lambda r: r.turns if r.turns is not None else -1,
    "title": lambda r: r.title.casefold(),
}
_DESCENDING = {"updated", "size", "seq", "turns"}  # newest, biggest first


def run(root: Root, args: argparse.Namespace) -> int:
    """List the checkpoints of ``root``; 1 when some cannot be read (they are marked)."""
    rows = [inspect(root, entry).row for entry in root.scan().entries]
    rows.sort(key=lambda r: r.key)
    rows.sort(key=SORTS[args.sort], reverse=(args.sort in _DESCENDING) != args.reverse)
    status = report.PROBLEM if any(r.error for r in rows) else report.OK
    if args.json:
        report.json_rows(rows)  # each unreadable one with its "error"
        return status
    if not rows:
        report.line(f"no checkpoints in {root.where}")
        return report.OK
    kinds = len({r.kind for r in rows}) > 1
    header = ["KEY", *(["KIND"] if kinds else []), "UPDATED (UTC)", "SIZE", "SEQ", "TURNS"]
    header += ["LIVE", "PINNED", "LOCK", "TITLE"]
    table = [header]
    table += (
        [
            r.key,
            *([r.kind] if kinds else []),
            report.when(r.updated_at),
            report.size(r.size),
            report.opt(r.seq),
            report.opt(r.turns) if r.error or r.turns is not None else "-",
            report.yes(r.live),
            report.yes(r.pinned),
            r.lock or "-",
            f"! {r.error}" if r.error else r.title,
        ]
        for r in rows
    )
    report.table(table, right={2 + kinds, 3 + kinds, 4 + kinds})  # size, seq, turns
    bad = sum(1 for r in rows if r.error)
    if bad:
        words = root.words
        message = words.unreadable.format(n=bad, where=root.where)
        report.warning("ls", message, stdout=words.unreadable_on_stdout)
    return status
