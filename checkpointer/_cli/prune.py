"""``checkpointer prune``: remove checkpoints not updated for a while, and stale locks.

Never anything of a key whose lock holder is alive (or may be), a pinned checkpoint, or
what this library did not make; each checkpoint is looked at again under the key's writer
lock, so a session written since the listing stays.
"""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime
from typing import NamedTuple

from . import report
from .look import Row, inspect
from .roots import FOREIGN, SEALED, Entry, Extra, Recheck, Removal, Root

HELP = "remove checkpoints not updated for a while, and stale locks"
DESCRIPTION = (
    "Remove checkpoints last updated more than DURATION ago, with their lock files, and "
    "every stale lock file (its holder is gone), whatever its age. Never removes anything "
    "of a key whose lock holder is alive, nor a pinned checkpoint. Lists what it removes. "
    "Summary checkpoints and corrupt files a writer moved aside are kept unless --summaries "
    "or --corrupt asks for them."
)
_FLAGS = {"summary": "--summaries", "corrupt": "--corrupt"}
_NOUNS = {"summary": "summary checkpoint(s)", "corrupt": "corrupt file(s)"}
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


class Duration(NamedTuple):  # a parsed ``--older-than``
    seconds: float
    text: str


def parse_duration(text: str) -> Duration:
    """Parse ``7d``, ``12h``, ``30m``, ``1h30m`` (s, m, h, d, w); ArgumentTypeError if bad."""
    compact = text.strip().lower()
    forms = "use a number and a unit (s, m, h, d, w), e.g. 7d, 12h, 30m or 1h30m"
    if compact.startswith("-"):
        raise argparse.ArgumentTypeError(
            f"bad duration {text!r}: a duration is not negative; {forms}"
        )
    if not compact or _DURATION.sub("", compact):
        raise argparse.ArgumentTypeError(f"bad duration {text!r}: {forms}")
    seconds = sum(float(n) * _UNITS[unit] for n, unit in _DURATION.findall(compact))
    return Duration(seconds, text.strip())


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--older-than",
        required=True,
        type=parse_duration,
        metavar="DURATION",
        help="e.g. 7d, 12h, 30m, 1h30m (units s, m, h, d, w)",
    )
    parser.add_argument(
        "-n", "--dry-run", action="store_true", help="list what would go, remove nothing"
    )
    parser.add_argument(
        "--summaries",
        action="store_true",
        help="also remove summary checkpoints (sessions/KEY/checkpoint.md) older than "
        "DURATION whose key has no checkpoint left after the prune (kept by default)",
    )
    parser.add_argument(
        "--corrupt",
        action="store_true",
        help="also remove corrupt files a writer moved aside (KEY.corrupt-<UTC time>) "
        "more than DURATION ago (kept by default)",
    )


def run(root: Root, args: argparse.Namespace) -> int:
    """Prune ``root``; 1 when something could not be removed or was refused (on stderr)."""
    prune = _Prune(root, args)
    by_key: dict[str, list[Entry]] = {}
    for entry in root.scan():
        by_key.setdefault(entry.key, []).append(entry)
    extras: dict[str, list[Extra]] = {}
    flags = [flag for kind, flag in _FLAGS.items() if prune.wanted[kind]]
    if flags and not root.has_extras:
        report.line(
            f"{', '.join(flags)}: nothing to do, {root.where} holds no summary checkpoints "
            "or corrupt files (a store directory does)"
        )
    elif root.has_extras:
        found = root.extras()
        for problem in found.problems if args.summaries else ():
            prune.refuse(problem)  # `sessions` planted: none of its summaries looked at
        for extra in found.found:
            extras.setdefault(extra.entry.key, []).append(extra)
    for key in sorted(by_key.keys() | root.lock_keys | extras.keys()):
        prune.key(key, by_key.get(key, []), extras.get(key, []))
    return prune.summary()


class _Prune:
    """One prune: what it removes, keeps and refuses, as lines to print and counts."""

    def __init__(self, root: Root, args: argparse.Namespace) -> None:
        self.root, self.limit, self.dry_run = root, args.older_than, args.dry_run
        self.wanted = {"summary": args.summaries, "corrupt": args.corrupt}
        self.now = datetime.now(UTC)
        self.lines: list[str] = []
        self.kept = self.failed = 0
        self.kinds: dict[str, str] = {}  # path -> "summary" or "corrupt" (else a checkpoint)
        self.gone = {"checkpoint": 0, "summary": 0, "corrupt": 0, "lock": 0}
        self.asides = {"summary": 0, "corrupt": 0}  # old enough, kept as not asked for

    def key(self, key: str, entries: list[Entry], extras: list[Extra]) -> None:
        """Remove what of ``key`` is old, unless its lock holder is alive (or may be)."""
        old: list[tuple[Entry, str]] = []  # (entry, why) to remove
        listed: dict[str, Row | Extra] = {}  # each as it was listed, for the recheck
        for entry in entries:
            planted = self.root.planted(entry)
            if planted is not None:  # a link, a FIFO, ...: not ours to remove
                self.refuse(planted)
                continue
            row = inspect(self.root, entry, lock=False).row
            updated = _updated(self.root, row)
            if updated is None:
                continue  # unreadable and no time of its own: never guess its age
            age = (self.now - updated).total_seconds()
            if age > self.limit.seconds and row.error == FOREIGN:
                self.keep(entry.path, f"{FOREIGN}; its pin and age are unknown")
            elif age > self.limit.seconds and (row.error or "").startswith(SEALED):
                self.keep(entry.path, f"{row.error}; never removed unopened")
            elif age > self.limit.seconds and row.pinned:
                self.keep(entry.path, f"pinned (updated {report.ago(age)} ago)")
            elif age > self.limit.seconds:
                old.append((entry, f"updated {report.ago(age)} ago"))
                listed[entry.path] = row
        stay = len(entries) > len(old)  # a checkpoint of the key stays: so does its summary
        for extra in extras:
            why = self._old_extra(extra, stay=stay)
            if why is not None:
                old.append((extra.entry, why))
                listed[extra.entry.path] = extra
                self.kinds[extra.entry.path] = extra.entry.kind
        if old or self.root.lock_files:  # an advisory lock leaves nothing behind
            self._remove(key, old, listed)

    def _old_extra(self, extra: Extra, *, stay: bool) -> str | None:
        """Why a summary or corrupt file goes; None: it stays (counted or said, if old)."""
        kind, path = extra.entry.kind, extra.entry.path
        wanted = self.wanted[kind]
        age = (self.now - extra.time).total_seconds()
        if age <= self.limit.seconds and not (wanted and extra.problem is not None):
            return None  # young; a planted one, when asked for, is refused whatever its age
        summary_stays = kind == "summary" and stay  # a resume may start from both
        if not wanted:
            self.asides[kind] += not summary_stays  # kept, as always: counted, the flag named
        elif extra.problem is not None:
            self.refuse(extra.problem)
        elif summary_stays:
            self.keep(path, "a summary of a key whose checkpoint stays")
        elif kind == "corrupt":
            return f"a corrupt file, moved aside {report.ago(age)} ago"
        else:
            return f"a summary, written {report.ago(age)} ago; its key has no checkpoint left"
        return None

    def _remove(
        self, key: str, old: list[tuple[Entry, str]], listed: dict[str, Row | Extra]
    ) -> None:
        lock = self.root.lock(key)
        held = None
        if lock is not None and lock.problem is not None:
            self.refuse(lock.problem)
            held = f"its lock file {lock.path} is not one this library made"
        elif lock is not None and lock.state != "stale":
            # A live writer's key, or one we cannot tell about: all of it stays, lock too.
            held = "its lock holder is alive"
            if lock.state == "unknown":
                held = "cannot tell if its lock is held"
            elif not self.root.lock_files:
                held += f" ({lock.holder})"
        if held is not None:
            for entry, _ in old:
                self.keep(entry.path, held)
            return
        stale = None if lock is None else "its lock file" if old else "stale lock, holder gone"
        if not old and stale is None:
            return
        if not self.dry_run:
            recheck = _recheck(self.root, listed)
            done = self.root.delete(key, old, recheck=recheck, stale=stale)
        else:
            done = [Removal(entry.path, "removed", why) for entry, why in old]
            if lock is not None and lock.path is not None and stale is not None:
                done.append(Removal(lock.path, "removed", stale, lock=True))
        for removal in done:
            self.record(removal)

    def keep(self, path: str, why: str) -> None:
        self.kept += 1
        self.lines.append(f"kept {path}: {why}")

    def refuse(self, problem: str) -> None:
        """Something planted in the root: left, and counted as failed (said on stderr)."""
        self.failed += 1
        report.error("prune", problem)

    def record(self, removal: Removal) -> None:
        if removal.outcome == "kept":
            self.keep(removal.path, removal.why)
        elif removal.outcome == "failed":
            self.refuse(removal.why)
        else:
            self.gone["lock" if removal.lock else self.kinds.get(removal.path, "checkpoint")] += 1
            verb = "would remove" if self.dry_run else "removed"
            self.lines.append(f"{verb} {removal.path} ({removal.why})")

    def summary(self) -> int:
        """Print what was done, and what was kept as not asked for; the exit status."""
        root, limit = self.root, self.limit.text
        locks = " and no stale locks" if root.lock_files else ""
        if not self.lines:
            report.line(f"nothing older than {limit}{locks} in {root.where}")
        else:
            for line in self.lines:
                report.line(line)
            verb = "would remove" if self.dry_run else "removed"
            gone = self.gone
            said = f"{verb} {gone['checkpoint']} {root.prune_noun} older than {limit}"
            said += "".join(f", {gone[kind]} {_NOUNS[kind]}" for kind in _NOUNS if gone[kind])
            if root.lock_files:
                said += f" and {gone['lock']} stale lock file(s)"
            said += f", kept {self.kept}"
            report.line(said + (f", {self.failed} could not be removed" if self.failed else ""))
        asides = {kind: n for kind, n in self.asides.items() if n}
        if asides:  # kept by default: say so, and how to include them
            kept = " and ".join(f"{n} {_NOUNS[kind]}" for kind, n in asides.items())
            flags = " ".join(_FLAGS[kind] for kind in asides)
            report.line(f"kept {kept} older than {limit}: add {flags} to remove them")
        return report.PROBLEM if self.failed else report.OK  # failed: said on stderr


def _recheck(root: Root, listed: dict[str, Row | Extra]) -> Recheck:
    """For ``Root.delete``, once no writer can write: keep what a writer that resumed the key
    wrote (time, pin, size) since ``listed``."""

    def recheck(entry: Entry) -> str | None:
        was = listed[entry.path]
        if isinstance(was, Extra):
            extra = root.extra(entry)
            changed = extra is not None and (extra.time, extra.size) != (was.time, was.size)
        else:
            again = inspect(root, entry, lock=False).row
            changed = (_updated(root, again), again.pinned) != (_updated(root, was), was.pinned)
        return "written since it was listed" if changed else None

    return recheck


def _updated(root: Root, row: Row) -> datetime | None:
    """When a checkpoint was last written: its meta says, or (unreadable) its file's time."""
    return row.updated_at or (row.mtime if root.mtimes else None)
