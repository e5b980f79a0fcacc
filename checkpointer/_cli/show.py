"""``checkpointer show``: one checkpoint's meta, its lock and its last messages (or ``--raw``)."""

from __future__ import annotations

import argparse
import difflib

import msgspec

from . import report
from .look import inspect, read
from .roots import Entry, LockView, Root
from .verify import torn_tail

HELP = "show one checkpoint: its meta and its last messages"
DESCRIPTION = (
    "Print the meta of KEY's checkpoint, its lock, and a short view of the state: "
    "the message count and the last messages, truncated."
)


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("key", metavar="KEY", nargs="?", help="the session key")
    parser.add_argument(
        "--last", type=_count, default=5, metavar="N", help="messages to show (%(default)s)"
    )
    parser.add_argument(
        "--raw", action="store_true", help="print the file's bytes as they are, undecoded"
    )


def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"{n} is negative: give 0 or more (0: no messages)")
    return n


def run(root: Root, args: argparse.Namespace) -> int:
    """Show ``args.key`` (each of its files: a snapshot and a journal may share a key)."""
    try:
        root.validate_key(args.key)
    except ValueError as exc:
        report.error("show", str(exc))
        return report.USAGE
    entries = root.scan()
    mine = [e for e in entries if e.key == args.key]
    if not mine:
        keys = sorted({e.key for e in entries})
        hint = difflib.get_close_matches(args.key, keys, n=1)
        message = f"no checkpoint {args.key!r} in {root.where}"
        if hint:
            message += f"; did you mean {hint[0]!r}?"
        elif keys and root.count_hint:
            message += f"; `checkpointer ls {root.where}` lists the {len(keys)} there"
        report.error("show", message)
        return report.PROBLEM
    status = report.OK
    for n, entry in enumerate(mine):
        if n:
            report.line()
        status = max(status, _raw(root, entry) if args.raw else _show(root, entry, args.last))
    return status


def _raw(root: Root, entry: Entry) -> int:
    data, error = read(root, root.raw, entry)
    if data is None:
        report.error("show", f"{entry.path}: {error}")
        return report.PROBLEM
    report.raw(data)
    return report.OK


def _show(root: Root, entry: Entry, last: int) -> int:
    look = inspect(root, entry)
    row, loaded = look.row, look.loaded
    kind = f", {entry.kind}" if len(root.stores) > 1 else ""
    fields = [(root.noun, f"{entry.path} ({report.size(row.size)}{kind})")]
    fields.append(("lock", _lock(root, look.lock)))
    if loaded is None:
        report.fields(fields)
        report.error("show", f"{entry.path}: {row.error}")
        return report.PROBLEM
    for name, value in msgspec.structs.asdict(loaded.meta).items():
        if value is not None:  # None: a field this file's writer did not record
            fields.append((name, report.value(value)))
    if loaded.torn is not None:  # what load() dropped (the whole story on stderr, after)
        fields.append(("torn tail", f"line {loaded.torn.line} on, {loaded.torn.nbytes} bytes"))
    found = look.history
    if not any(name == "turns" for name, _ in fields):
        if row.turns is not None:
            fields.append(("turns", f"{row.turns} (assistant messages)"))
        elif found is not None and found.messages is not None:
            fields.append(("turns", f"{report.UNCOUNTED} (a message of a shape no dialect knows)"))
    listed = [] if found is None or found.messages is None else found.messages
    if found is None or found.messages is None:
        state = msgspec.json.encode(loaded.state).decode()
        fields.append(("state", report.one_line(state, 300)))
        if found is not None and found.note is not None:
            fields.append(("note", found.note))
    else:
        fields.append(("messages", str(len(listed))))
        if row.title:
            fields.append(("title", row.title))
    report.fields(fields)
    start = max(len(listed) - last, 0)
    if start < len(listed):
        report.line(f"last {len(listed) - start} of {len(listed)} messages:")
        width = len(str(len(listed) - 1))
        for i in range(start, len(listed)):
            report.line(f"  [{i:>{width}}] {report.message_line(listed[i])}")
    if loaded.torn is not None:
        report.flush()  # the view first, then the warning
        report.error("show", f"{row.path}: {torn_tail(loaded.torn)}")
    return report.OK


def _lock(root: Root, lock: LockView | None) -> str:
    """The lock field: a lock file's state, holder and path; an advisory lock's holder."""
    if lock is None:
        return "none" if root.lock_files else "free"
    if lock.path is None:
        return f"held by {lock.holder}"
    state = "cannot tell" if lock.state == "unknown" else lock.state
    return f"{state} {lock.holder}".rstrip() + f" ({lock.path})"
