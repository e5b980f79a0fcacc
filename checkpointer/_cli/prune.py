"""``checkpointer prune``: remove checkpoints not updated for a while, and stale locks.

Never anything of a key whose lock holder is alive (or may be), nor a
pinned checkpoint, nor what is not a file this library made.  The keys'
locks are looked at first (``Root.lock``); what is to go is then deleted
under the key's own writer lock (``Root.delete``), each checkpoint looked at
again once the lock is held, so a session resumed and written since the
listing stays.  A directory's stale lock files go too, whatever their age.
"""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime
from typing import NamedTuple

from . import report
from .look import Row, inspect
from .roots import Entry, LockView, Recheck, Removal, Root

__all__ = ["Duration", "parse_duration", "run"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


class Duration(NamedTuple):
    """A parsed ``--older-than``: seconds, and the text the user wrote."""

    seconds: float
    text: str


def parse_duration(text: str) -> Duration:
    """Parse a number and a unit, or several: ``7d``, ``12h``, ``30m``, ``1h30m``.

    Units: ``s``, ``m``, ``h``, ``d``, ``w``.

    Raises:
        argparse.ArgumentTypeError: naming the text and the accepted forms.
    """
    compact = text.strip().lower()
    if compact.startswith("-"):
        raise argparse.ArgumentTypeError(
            f"bad duration {text!r}: a duration is not negative; "
            "use a number and a unit (s, m, h, d, w), e.g. 7d, 12h, 30m or 1h30m"
        )
    if not compact or _DURATION.sub("", compact):
        raise argparse.ArgumentTypeError(
            f"bad duration {text!r}: use a number and a unit (s, m, h, d, w), "
            "e.g. 7d, 12h, 30m or 1h30m"
        )
    seconds = sum(float(n) * _UNITS[unit] for n, unit in _DURATION.findall(compact))
    return Duration(seconds, text.strip())


def run(root: Root, args: argparse.Namespace) -> int:
    """Prune ``root``; 1 when something could not be removed or was refused (on stderr)."""
    limit: Duration = args.older_than
    now = datetime.now(UTC)
    scan = root.scan()
    by_key: dict[str, list[Entry]] = {}
    for entry in scan.entries:
        by_key.setdefault(entry.key, []).append(entry)
    tally = _Tally(dry_run=args.dry_run)
    for key in sorted(by_key.keys() | scan.lock_keys):
        old: list[tuple[Entry, str]] = []  # (checkpoint, why) to remove
        listed: dict[str, Row] = {}
        for entry in by_key.get(key, []):
            planted = root.planted(entry)
            if planted is not None:  # a link, a FIFO, ...: not ours to remove
                tally.refuse(planted)
                continue
            row = inspect(root, entry, lock=False).row
            updated = _updated(root, row)
            if updated is None:
                continue  # unreadable and no time of its own: never guess its age
            age = (now - updated).total_seconds()
            if age <= limit.seconds:
                continue
            if row.pinned:
                tally.keep(entry.path, f"pinned (updated {report.ago(age)} ago)")
            else:
                old.append((entry, f"updated {report.ago(age)} ago"))
                listed[entry.path] = row
        if not old and not root.lock_files:
            continue  # an advisory lock leaves nothing behind to clean up
        lock = root.lock(key)
        if lock is not None and lock.problem is not None:
            # Not a lock file this library made: leave it and the key alone.
            tally.refuse(lock.problem)
            for entry, _ in old:
                tally.keep(entry.path, f"its lock file {lock.path} is not one this library made")
            continue
        if lock is not None and lock.state != "stale":
            # A live writer's key (its lock is not news), or one we cannot
            # tell about: leave all of it alone, without touching its lock.
            for entry, _ in old:
                tally.keep(entry.path, _held(root, lock))
            continue
        stale = None if lock is None else "its lock file" if old else "stale lock, holder gone"
        if not old and stale is None:
            continue
        if args.dry_run:
            for entry, why in old:
                tally.record(Removal(entry.path, "removed", why))
            if lock is not None and lock.path is not None and stale is not None:
                tally.record(Removal(lock.path, "removed", stale, lock=True))
            continue
        for removal in root.delete(key, old, recheck=_recheck(root, listed), stale=stale):
            tally.record(removal)
    return _summary(root, limit, tally)


def _recheck(root: Root, listed: dict[str, Row]) -> Recheck:
    """For ``Root.delete``: keep a checkpoint whose time or pin changed since ``listed``."""

    def recheck(entry: Entry) -> str | None:
        # A writer may have resumed the key and written it between the
        # listing and the lock: look again, now that none can write.
        again = inspect(root, entry, lock=False).row
        was = listed[entry.path]
        if (_updated(root, again), again.pinned) != (_updated(root, was), was.pinned):
            return "written since it was listed"
        return None

    return recheck


def _updated(root: Root, row: Row) -> datetime | None:
    """When a checkpoint was last written: its meta says, or (unreadable) its file's time."""
    return row.updated_at or (row.mtime if root.mtimes else None)


def _held(root: Root, lock: LockView) -> str:
    if lock.state == "unknown":
        return "cannot tell if its lock is held"
    if root.lock_files:
        return "its lock holder is alive"  # `show` names it, with the lock file
    return f"its lock holder is alive ({lock.holder})"


def _summary(root: Root, limit: Duration, tally: _Tally) -> int:
    status = report.PROBLEM if tally.failed else report.OK  # failed: said on stderr
    locks = " and no stale locks" if root.lock_files else ""
    if not tally.lines:
        report.line(f"nothing older than {limit.text}{locks} in {root.where}")
        return status
    for line in tally.lines:
        report.line(line)
    verb = "would remove" if tally.dry_run else "removed"
    summary = f"{verb} {tally.removed} {root.words.prune_noun} older than {limit.text}"
    if root.lock_files:
        summary += f" and {tally.locks} stale lock file(s)"
    summary += f", kept {tally.kept}"
    report.line(summary + (f", {tally.failed} could not be removed" if tally.failed else ""))
    return status


class _Tally:
    """What prune did, as lines to print and counts; errors said at once, on stderr."""

    def __init__(self, *, dry_run: bool) -> None:
        self.dry_run = dry_run
        self.lines: list[str] = []
        self.removed = self.locks = self.kept = self.failed = 0

    def keep(self, path: str, why: str) -> None:
        self.kept += 1
        self.lines.append(f"kept {path}: {why}")

    def refuse(self, problem: str) -> None:
        """Something planted in the root (``UnsafeFile``'s text): left, and counted as failed."""
        self.failed += 1
        report.error("prune", problem)

    def record(self, removal: Removal) -> None:
        if removal.outcome == "kept":
            self.keep(removal.path, removal.why)
        elif removal.outcome == "failed":
            self.failed += 1
            report.error("prune", removal.why)
        else:
            if removal.lock:
                self.locks += 1
            else:
                self.removed += 1
            verb = "would remove" if self.dry_run else "removed"
            self.lines.append(f"{verb} {removal.path} ({removal.why})")
