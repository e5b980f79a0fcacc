"""``checkpointer prune``: remove checkpoints not updated for a while, and stale locks.

Never anything of a key whose lock holder is alive (or may be), nor a
pinned checkpoint, nor what is not a file this library made.  The keys'
locks are looked at first (``Root.lock``); what is to go is then deleted
under the key's own writer lock (``Root.delete``), each checkpoint looked at
again once the lock is held, so a session resumed and written since the
listing stays.  A directory's stale lock files go too, whatever their age.

Summary checkpoints and corrupt files a writer moved aside (``Root.extras``)
stay unless asked for (prune says how many it kept, and the flag): with
``--summaries`` a key's summary goes with its last checkpoint (or when it has
none), once the summary is older than DURATION, under the key's lock like a
checkpoint; with ``--corrupt`` a corrupt file goes once moved aside (or
touched) more than DURATION ago.
"""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime
from typing import NamedTuple

from . import report
from .look import Row, inspect
from .roots import Entry, Extra, LockView, Recheck, Removal, Root

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
    wanted = {"summary": args.summaries, "corrupt": args.corrupt}
    flags = [flag for kind, flag in _FLAGS.items() if wanted[kind]]
    extras_by_key: dict[str, list[Extra]] = {}
    if flags and not root.has_extras:
        report.line(
            f"{', '.join(flags)}: nothing to do, {root.where} holds no summary checkpoints "
            "or corrupt files (a store directory does)"
        )
    elif root.has_extras:
        extras = root.extras()
        for problem in extras.problems if args.summaries else ():
            tally.refuse(problem)  # `sessions` planted: none of its summaries looked at
        for extra in extras.found:
            extras_by_key.setdefault(extra.entry.key, []).append(extra)
    for key in sorted(by_key.keys() | scan.lock_keys | extras_by_key.keys()):
        old: list[tuple[Entry, str]] = []  # (checkpoint, why) to remove
        listed: dict[str, Row | Extra] = {}
        stay = 0  # the key's checkpoints that stay: its summary stays with them
        for entry in by_key.get(key, []):
            planted = root.planted(entry)
            if planted is not None:  # a link, a FIFO, ...: not ours to remove
                tally.refuse(planted)
                stay += 1
                continue
            row = inspect(root, entry, lock=False).row
            updated = _updated(root, row)
            if updated is None:
                stay += 1
                continue  # unreadable and no time of its own: never guess its age
            age = (now - updated).total_seconds()
            if age <= limit.seconds:
                stay += 1
                continue
            if row.pinned:
                tally.keep(entry.path, f"pinned (updated {report.ago(age)} ago)")
                stay += 1
            else:
                old.append((entry, f"updated {report.ago(age)} ago"))
                listed[entry.path] = row
        for extra in extras_by_key.get(key, []):
            why = _extra_old(extra, now, limit, stay=stay, wanted=wanted[extra.entry.kind])
            if why is None:
                continue
            if not wanted[extra.entry.kind]:
                tally.aside(extra.entry.kind)  # kept, as always: counted, and the flag named
            elif extra.problem is not None:
                tally.refuse(extra.problem)
            elif why.startswith("kept: "):
                tally.keep(extra.entry.path, why.removeprefix("kept: "))
            else:
                old.append((extra.entry, why))
                listed[extra.entry.path] = extra
                tally.kinds[extra.entry.path] = extra.entry.kind
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


_FLAGS = {"summary": "--summaries", "corrupt": "--corrupt"}
_NOUNS = {"summary": "summary checkpoint(s)", "corrupt": "corrupt file(s)"}


def _extra_old(
    extra: Extra, now: datetime, limit: Duration, *, stay: int, wanted: bool
) -> str | None:
    """Why a summary or corrupt file may go (``kept: ...``: why it may not); None: young.

    A planted one, when asked for, is refused whatever its age, as a checkpoint is.
    """
    age = (now - extra.time).total_seconds()
    if age <= limit.seconds and not (wanted and extra.problem is not None):
        return None
    if extra.entry.kind == "corrupt":
        return f"a corrupt file, moved aside {report.ago(age)} ago"
    if stay:  # a resume may start from it and the checkpoint (resume_context)
        return "kept: a summary of a key whose checkpoint stays" if wanted else None
    return f"a summary, written {report.ago(age)} ago; its key has no checkpoint left"


def _recheck(root: Root, listed: dict[str, Row | Extra]) -> Recheck:
    """For ``Root.delete``: keep what was written (time, pin, size) since ``listed``."""

    def recheck(entry: Entry) -> str | None:
        # A writer may have resumed the key and written it between the
        # listing and the lock: look again, now that none can write.
        was = listed[entry.path]
        if isinstance(was, Extra):
            extra = root.extra(entry)
            if extra is not None and (extra.time, extra.size) != (was.time, was.size):
                return "written since it was listed"
            return None
        again = inspect(root, entry, lock=False).row
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
    else:
        for line in tally.lines:
            report.line(line)
        verb = "would remove" if tally.dry_run else "removed"
        summary = f"{verb} {tally.removed} {root.words.prune_noun} older than {limit.text}"
        summary += "".join(f", {n} {_NOUNS[kind]}" for kind, n in tally.extras.items() if n)
        if root.lock_files:
            summary += f" and {tally.locks} stale lock file(s)"
        summary += f", kept {tally.kept}"
        report.line(summary + (f", {tally.failed} could not be removed" if tally.failed else ""))
    asides = {kind: n for kind, n in tally.asides.items() if n}
    if asides:  # kept by default: say so, and how to include them
        kept = " and ".join(f"{n} {_NOUNS[kind]}" for kind, n in asides.items())
        flags = " ".join(_FLAGS[kind] for kind in asides)
        report.line(f"kept {kept} older than {limit.text}: add {flags} to remove them")
    return status


class _Tally:
    """What prune did, as lines to print and counts; errors said at once, on stderr."""

    def __init__(self, *, dry_run: bool) -> None:
        self.dry_run = dry_run
        self.lines: list[str] = []
        self.removed = self.locks = self.kept = self.failed = 0
        self.kinds: dict[str, str] = {}  # path -> "summary" or "corrupt" (else a checkpoint)
        self.extras = {"summary": 0, "corrupt": 0}  # removed
        self.asides = {"summary": 0, "corrupt": 0}  # kept, not asked for

    def keep(self, path: str, why: str) -> None:
        self.kept += 1
        self.lines.append(f"kept {path}: {why}")

    def aside(self, kind: str) -> None:
        """A summary or corrupt file old enough to go, kept as it was not asked for."""
        self.asides[kind] += 1

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
            kind = self.kinds.get(removal.path)
            if removal.lock:
                self.locks += 1
            elif kind is not None:
                self.extras[kind] += 1
            else:
                self.removed += 1
            verb = "would remove" if self.dry_run else "removed"
            self.lines.append(f"{verb} {removal.path} ({removal.why})")
