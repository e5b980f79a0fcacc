"""The ``checkpointer`` command line (also ``python -m checkpointer``).

Commands over a store directory: ``ls``, ``show``, ``verify``, ``prune``,
and ``demo``.  Exit status: 0 when all is well, 1 when something is wrong
with the store (a missing root, an unknown key, a bad file), 2 for a usage
error (argparse's own status: a bad option, a bad duration, an invalid key).

The file kinds a root holds are listed once (``_KINDS``): snapshots
``<key>.json`` and journals ``<key>.jsonl``.  Locks are the library's
(``checkpointer._lock``): ``ls`` and ``show`` look with ``probe_file_lock``,
which never takes a lock a writer could be reaching for; ``prune`` takes a
key's writer lock (``FileStore.lock``) before it removes anything of the key.
Histories are checked by ``validate_history``.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import logging
import os
import re
import stat
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple

import anyio
import msgspec

from . import _pgcli
from ._load import load
from ._stores.base import KEY_PATTERN, KeyLocked, check_key
from ._stores.files import FileStore
from ._stores.flock import LockProbe, probe_file_lock
from ._stores.journal.file import JournalStore
from ._stores.safefs import UnsafeFile, describe, read_checked
from ._transcript.history import validate_history
from ._transcript.messages import HistoryProblem
from ._values import CheckpointError

__all__ = ["main", "parse_duration"]

OK, PROBLEM, USAGE = 0, 1, 2


# -- what a root holds ---------------------------------------------------------


class Loaded(NamedTuple):
    """A decoded checkpoint of any kind: its meta and its state."""

    meta: Any
    state: Any


class Kind(NamedTuple):
    """One kind of checkpoint file: ``<key><suffix>`` in the root."""

    name: str
    suffix: str
    load: Callable[[str, str], Loaded | None]  # (root, key); raises CheckpointError


def _load_snapshot(root: str, key: str) -> Loaded | None:
    checkpoint = load(FileStore(root), key)
    return None if checkpoint is None else Loaded(checkpoint.meta, checkpoint.state)


def _load_journal(root: str, key: str) -> Loaded | None:
    checkpoint = load(JournalStore(root), key)
    return None if checkpoint is None else Loaded(checkpoint.meta, checkpoint.state)


_KINDS: tuple[Kind, ...] = (
    Kind("snapshot", FileStore.suffix, _load_snapshot),
    Kind("journal", JournalStore.suffix, _load_journal),
)

LOCK_SUFFIX = ".lock"


class File(NamedTuple):
    """A checkpoint file found in a root."""

    key: str
    kind: Kind
    path: str


def _scan(root: str) -> tuple[list[File], dict[str, str]]:
    """The checkpoint files of ``root`` and its lock files (key -> path).

    Raises:
        OSError: the root cannot be listed.
    """
    files: list[File] = []
    locks: dict[str, str] = {}
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if name.endswith(LOCK_SUFFIX) and KEY_PATTERN.fullmatch(name[: -len(LOCK_SUFFIX)]):
            locks[name[: -len(LOCK_SUFFIX)]] = path
            continue
        for kind in _KINDS:
            key = name[: -len(kind.suffix)]
            if name.endswith(kind.suffix) and KEY_PATTERN.fullmatch(key):
                files.append(File(key, kind, path))
                break
    return files, locks


def _open_root(command: str, root: str) -> tuple[list[File], dict[str, str]] | None:
    """``_scan`` the root, or say clearly why not (None)."""
    if not os.path.exists(root):
        _error(command, f"no such directory: {root} (a writer creates it on its first write)")
        return None
    if not os.path.isdir(root):
        _error(command, f"not a directory: {root}; give the directory a FileStore writes to")
        return None
    try:
        return _scan(root)
    except OSError as exc:
        _error(command, f"cannot list {root}: {_why(exc)}")
        return None


# -- the per-key lock ------------------------------------------------------------


def _lock_state(probe: LockProbe) -> Literal["alive", "stale", "unknown"]:
    return "unknown" if probe.alive is None else "alive" if probe.alive else "stale"


# -- reading one checkpoint ------------------------------------------------------


class Row(msgspec.Struct, kw_only=True):
    """One line of ``ls``: a checkpoint file and what it says (``--json`` too)."""

    key: str
    kind: str
    path: str
    size: int
    mtime: datetime
    updated_at: datetime | None = None
    created_at: datetime | None = None
    seq: int | None = None
    turns: int | None = None
    messages: int | None = None
    live: bool | None = None
    pinned: bool | None = None
    lock: Literal["alive", "stale", "unknown"] | None = None
    lock_holder: str | None = None
    title: str = ""
    error: str | None = None


def _messages(state: Any) -> list[Any] | None:
    """The agent history in a state (``state["messages"]``), if it has one."""
    if isinstance(state, dict):
        messages = state.get("messages")
        return messages if isinstance(messages, list) else None
    return None


def _text(content: Any) -> str:
    """The text of a message's content: a string, or a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = (p.get("text") if isinstance(p, dict) else p for p in content)
        return " ".join(p for p in parts if isinstance(p, str))
    return "" if content is None else str(content)


def _title(messages: list[Any] | None) -> str:
    for message in messages or ():
        if isinstance(message, dict) and message.get("role") == "user":
            return _one_line(_text(message.get("content")), 48)
    return ""


def _turns(meta: Any, messages: list[Any] | None) -> int | None:
    turns = getattr(meta, "turns", None)
    if isinstance(turns, int):
        return turns
    if messages is None:
        return None
    return sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")


def _stat(path: str) -> os.stat_result | None:
    """The entry at ``path`` itself: a planted link's own size and time, never its target's."""
    try:
        return os.lstat(path)
    except OSError:
        return None


def _read(file: File) -> tuple[Loaded | None, str | None]:
    """Load a file: (what it holds, None) or (None, why it cannot be trusted)."""
    try:
        loaded = file.kind.load(os.path.dirname(file.path) or ".", file.key)
    except CheckpointError as exc:
        return None, exc.reason
    except OSError as exc:  # a directory in place of the file, no permission, ...
        return None, f"cannot be read: {_why(exc)}"
    if loaded is None:
        return None, "disappeared while reading (removed by a prune or a writer?)"
    return loaded, None


def _inspect(file: File, locks: dict[str, str]) -> tuple[Row, Loaded | None]:
    """Everything ``ls`` says about a file, and what it holds (None if unreadable)."""
    st = _stat(file.path)
    row = Row(
        key=file.key,
        kind=file.kind.name,
        path=file.path,
        size=st.st_size if st else 0,
        mtime=datetime.fromtimestamp(st.st_mtime if st else 0, UTC),
    )
    lock_path = locks.get(file.key)
    lock = probe_file_lock(lock_path) if lock_path else None
    if lock is not None:
        row.lock = _lock_state(lock)
        row.lock_holder = lock.holder.describe() if lock.holder is not None else ""
        row.lock_holder = lock.problem or row.lock_holder  # a link, a FIFO, ...: say so
    loaded, row.error = _read(file)
    if loaded is None:
        return row, None
    meta = loaded.meta
    messages = _messages(loaded.state)
    row.updated_at = _utc(meta.updated_at)
    row.created_at = _utc(meta.created_at)
    row.seq = meta.seq
    row.live = meta.live
    row.pinned = meta.pinned
    row.turns = _turns(meta, messages)
    row.messages = None if messages is None else len(messages)
    row.title = _title(messages)
    return row, loaded


# -- ls ------------------------------------------------------------------------

_SORTS: dict[str, Callable[[Row], Any]] = {
    "key": lambda r: r.key,
    "updated": lambda r: r.updated_at or r.mtime,
    "size": lambda r: r.size,
    "seq": lambda r: r.seq if r.seq is not None else -1,
    "turns": lambda r: r.turns if r.turns is not None else -1,
    "title": lambda r: r.title.casefold(),
}
_DESCENDING = {"updated", "size", "seq", "turns"}  # newest, biggest first


def cmd_ls(args: argparse.Namespace) -> int:
    if args.dsn is not None or _pgcli.is_dsn(args.root):
        return _pgcli.run("ls", args)
    scanned = _open_root("ls", args.root)
    if scanned is None:
        return PROBLEM
    files, locks = scanned
    rows = [_inspect(file, locks)[0] for file in files]
    rows.sort(key=lambda r: r.key)
    rows.sort(key=_SORTS[args.sort], reverse=(args.sort in _DESCENDING) != args.reverse)
    if args.json:
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(rows)).decode() + "\n")
        return OK
    if not rows:
        print(f"no checkpoints in {args.root}")
        return OK
    kinds = len({r.kind for r in rows}) > 1
    header = ["KEY", *(["KIND"] if kinds else []), "UPDATED (UTC)", "SIZE", "SEQ", "TURNS"]
    header += ["LIVE", "PINNED", "LOCK", "TITLE"]
    table = [header]
    table += (
        [
            r.key,
            *([r.kind] if kinds else []),
            _when(r.updated_at),
            _size(r.size),
            _opt(r.seq),
            _opt(r.turns) if r.error or r.turns is not None else "-",
            _yes(r.live),
            _yes(r.pinned),
            r.lock or "-",
            f"! {r.error}" if r.error else r.title,
        ]
        for r in rows
    )
    _print_table(table, right={2 + kinds, 3 + kinds, 4 + kinds})  # size, seq, turns
    bad = sum(1 for r in rows if r.error)
    if bad:
        print(
            f"checkpointer ls: {bad} file(s) cannot be read; "
            f"`checkpointer verify {args.root}` says why",
            file=sys.stderr,
        )
    return OK


def _print_table(table: list[list[str]], *, right: set[int]) -> None:
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        print("  ".join(cells).rstrip())


# -- show ------------------------------------------------------------------------


def cmd_show(args: argparse.Namespace) -> int:
    if args.dsn is not None or _pgcli.is_dsn(args.root):
        return _pgcli.run("show", args)
    try:
        check_key(args.key)
    except ValueError as exc:
        _error("show", str(exc))
        return USAGE
    scanned = _open_root("show", args.root)
    if scanned is None:
        return PROBLEM
    files, locks = scanned
    mine = [f for f in files if f.key == args.key]
    if not mine:
        keys = sorted({f.key for f in files})
        hint = difflib.get_close_matches(args.key, keys, n=1)
        why = f"no checkpoint {args.key!r} in {args.root}"
        if hint:
            why += f"; did you mean {hint[0]!r}?"
        elif keys:
            why += f"; `checkpointer ls {args.root}` lists the {len(keys)} there"
        _error("show", why)
        return PROBLEM
    status = OK
    for n, file in enumerate(mine):
        if n:
            print()
        if args.raw:
            status = max(status, _show_raw(file))
        else:
            status = max(status, _show(file, locks, args.last))
    return status


def _show_raw(file: File) -> int:
    try:
        # No link followed, no FIFO waited on; a journal may grow by an append meanwhile.
        data = read_checked(file.path, growing=file.kind.name == "journal")
    except OSError as exc:
        _error("show", f"{file.path}: cannot be read: {_why(exc)}")
        return PROBLEM
    if data is None:
        _error("show", f"{file.path}: disappeared while reading (removed by a prune or a writer?)")
        return PROBLEM
    sys.stdout.flush()
    sys.stdout.buffer.write(data if data.endswith(b"\n") else data + b"\n")
    return OK


def _show(file: File, locks: dict[str, str], last: int) -> int:
    row, loaded = _inspect(file, locks)
    fields: list[tuple[str, str]] = [("file", f"{file.path} ({_size(row.size)}, {file.kind.name})")]
    if row.lock is None:
        fields.append(("lock", "none"))
    else:
        state = "cannot tell" if row.lock == "unknown" else row.lock
        fields.append(
            ("lock", f"{state} {row.lock_holder or ''}".rstrip() + f" ({locks[file.key]})")
        )
    if loaded is None:
        _print_fields(fields)
        _error("show", f"{file.path}: {row.error}")
        return PROBLEM
    return _show_loaded(fields, row, loaded, last)


def _show_loaded(fields: list[tuple[str, str]], row: Row, loaded: Loaded, last: int) -> int:
    """Print the meta and the last messages of a readable checkpoint (files and rows)."""
    for name, value in msgspec.structs.asdict(loaded.meta).items():
        if value is not None:  # None: a field this file's writer did not record
            fields.append((name, _value(value)))
    messages = _messages(loaded.state)
    if row.turns is not None and not any(name == "turns" for name, _ in fields):
        fields.append(("turns", f"{row.turns} (assistant messages)"))
    if messages is None:
        fields.append(("state", _one_line(msgspec.json.encode(loaded.state).decode(), 300)))
        _print_fields(fields)
        return OK
    fields.append(("messages", str(len(messages))))
    if row.title:
        fields.append(("title", row.title))
    _print_fields(fields)
    shown = messages[-last:] if last > 0 else []
    if shown:
        print(f"last {len(shown)} of {len(messages)} messages:")
        start = len(messages) - len(shown)
        width = len(str(len(messages) - 1))
        for i, message in enumerate(shown, start):
            print(f"  [{i:>{width}}] {_message_line(message)}")
    return OK


def _print_fields(fields: list[tuple[str, str]]) -> None:
    width = max(len(name) for name, _ in fields)
    for name, value in fields:
        print(f"{name:<{width}}  {value}")


def _message_line(message: Any, width: int = 100) -> str:
    if not isinstance(message, dict):
        return _one_line(msgspec.json.encode(message).decode(), width)
    role = str(message.get("role", "?"))
    if role == "tool" and "tool_call_id" in message:
        role = f"tool[{message['tool_call_id']}]"
    text = _text(message.get("content"))
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        names = ", ".join(_call_name(c) for c in calls)
        text = f"{text} -> {len(calls)} tool call(s): {names}".strip()
    return f"{role}: {_one_line(text, width)}"


def _call_name(call: Any) -> str:
    """The function name of a tool call, ``?`` when it has none (a hand-edited call)."""
    if not isinstance(call, dict):
        return "?"
    function = call.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    return str(name or call.get("name") or "?")


# -- verify ----------------------------------------------------------------------

_ROLES = ("system", "developer", "user", "assistant", "tool", "function")
_AT = "$.state.messages"


def _shape(messages: Any) -> str | None:
    """What ``validate_history`` takes for granted: a list of objects with a known role."""
    if not isinstance(messages, list):
        return f"{_AT}: is {_json_type(messages)}, not a list of messages"
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            return f"{_AT}[{i}]: is {_json_type(message)}, not a message object"
        role = message.get("role")
        if not isinstance(role, str):
            return f"{_AT}[{i}].role: is {_json_type(role)}, not a string"
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
        return f": is {_json_type(calls)}, not a list of tool calls"
    for j, call in enumerate(calls):
        if not isinstance(call, dict):
            return f"[{j}]: is {_json_type(call)}, not a tool call object"
        if "function" in call and not isinstance(call["function"], dict):
            return f"[{j}].function: is {_json_type(call['function'])}, not an object"
    return None


def _open_at_end(problem: HistoryProblem, messages: list[Any]) -> bool:
    """An unclosed call with nothing after it but tool results: saved while its tool ran."""
    return problem.kind == "unclosed-call" and all(
        m.get("role") == "tool" for m in messages[problem.index + 1 :]
    )


class Verdict(NamedTuple):
    """``verify``'s word on one file: bad (``problem``), or ok, maybe with a warning."""

    problem: str | None  # why the file is bad
    summary: str  # what a good file holds
    warning: str | None = None  # what a good file needs before it is sent to a model


def _verify(file: File) -> Verdict:
    loaded, error = _read(file)
    if loaded is None:
        return Verdict(error, "")
    meta = loaded.meta
    if meta.key != file.key:
        return Verdict(
            f"its meta says key {meta.key!r}, but the file is named for {file.key!r}", ""
        )
    summary = f"seq {meta.seq}"
    state = loaded.state
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


_ASIDE = re.compile(r"\.corrupt-\d{8}T\d{6}(\.\d+)?Z$")


def report_verdict(path: str, verdict: Verdict, *, quiet: bool) -> Literal["bad", "warn", "ok"]:
    """Print one ``verify`` line for ``path`` (ok and warn lines unless quiet)."""
    if verdict.problem is not None:
        print(f"BAD  {path}: {verdict.problem}")
        return "bad"
    if verdict.warning is not None:
        if not quiet:
            print(f"warn {path}: {verdict.summary}; {verdict.warning}")
        return "warn"
    if not quiet:
        print(f"ok   {path}: {verdict.summary}")
    return "ok"


def cmd_verify(args: argparse.Namespace) -> int:
    if args.dsn is not None or _pgcli.is_dsn(args.root):
        return _pgcli.run("verify", args)
    scanned = _open_root("verify", args.root)
    if scanned is None:
        return PROBLEM
    files, _ = scanned
    bad = warned = 0
    for file in files:
        outcome = report_verdict(file.path, _verify(file), quiet=args.quiet)
        bad += outcome == "bad"
        warned += outcome == "warn"
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(args.root)):
            if _ASIDE.search(name):
                print(f"note {os.path.join(args.root, name)}: a corrupt file a writer moved aside")
    if not files:
        print(f"no checkpoints in {args.root}")
        return OK
    ok = f"{len(files) - bad} ok"
    if warned:
        ok += f" ({warned} with tool calls open at the end)"
    print(f"{len(files)} checkpoint(s): {ok}, {bad} bad")
    return PROBLEM if bad else OK


# -- prune -----------------------------------------------------------------------

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
    if not compact or _DURATION.sub("", compact):
        raise argparse.ArgumentTypeError(
            f"bad duration {text!r}: use a number and a unit (s, m, h, d, w), "
            "e.g. 7d, 12h, 30m or 1h30m"
        )
    seconds = sum(float(n) * _UNITS[unit] for n, unit in _DURATION.findall(compact))
    return Duration(seconds, text.strip())


def cmd_prune(args: argparse.Namespace) -> int:
    if args.dsn is not None or _pgcli.is_dsn(args.root):
        return _pgcli.run("prune", args)
    scanned = _open_root("prune", args.root)
    if scanned is None:
        return PROBLEM
    files, locks = scanned
    limit: Duration = args.older_than
    now = datetime.now(UTC)
    by_key: dict[str, list[File]] = {}
    for file in files:
        by_key.setdefault(file.key, []).append(file)
    tally = _Tally(dry_run=args.dry_run)
    store = FileStore(args.root)
    for key in sorted(by_key.keys() | locks.keys()):
        old: list[tuple[str, str]] = []  # (checkpoint file, why) to remove
        for file in by_key.get(key, []):
            planted = _not_a_file(file.path)
            if planted is not None:  # a link, a FIFO, ...: not ours to remove
                tally.refuse(planted)
                continue
            row, _ = _inspect(file, {})
            age = (now - (row.updated_at or row.mtime)).total_seconds()
            if age <= limit.seconds:
                continue
            if row.pinned:
                tally.keep(file.path, f"pinned (updated {_ago(age)} ago)")
            else:
                old.append((file.path, f"updated {_ago(age)} ago"))
        lock_path = locks.get(key)
        lock = probe_file_lock(lock_path) if lock_path else None
        if lock is not None and lock.problem is not None:
            # Not a lock file this library made: leave it and the key alone.
            tally.refuse(lock.problem)
            for path, _ in old:
                tally.keep(path, f"its lock file {lock_path} is not one this library made")
            continue
        if lock is not None and lock.alive is not False:
            # A live writer's key (its lock is not news), or one we cannot
            # tell about: leave all of it alone, without touching its lock.
            why = "its lock holder is alive" if lock.alive else "cannot tell if its lock is held"
            for path, _ in old:
                tally.keep(path, why)
            continue
        stale = None if lock is None else "its lock file" if old else "stale lock, holder gone"
        if not old and stale is None:
            continue
        if args.dry_run:
            for path, why in old:
                tally.remove(path, why)
            if lock_path and stale:
                tally.remove(lock_path, stale, lock=True)
            continue
        _prune_key(store, key, old, lock_path, stale, tally)
    if not tally.lines:
        print(f"nothing older than {limit.text} and no stale locks in {args.root}")
        return PROBLEM if tally.failed else OK  # failed: something planted, said on stderr
    for line in tally.lines:
        print(line)
    verb = "would remove" if args.dry_run else "removed"
    summary = (
        f"{verb} {tally.removed} file(s) older than {limit.text} and "
        f"{tally.locks} stale lock file(s), kept {tally.kept}"
    )
    print(summary + (f", {tally.failed} could not be removed" if tally.failed else ""))
    return PROBLEM if tally.failed else OK


def _prune_key(
    store: FileStore,
    key: str,
    old: list[tuple[str, str]],
    lock_path: str | None,
    stale: str | None,
    tally: _Tally,
) -> None:
    """Remove ``old`` files of ``key`` and its stale lock file, holding the key's lock.

    Holding the writer lock keeps a writer from starting on the key midway;
    releasing it unlinks the lock file (the library's release, which a
    writer waiting on the old file notices and starts over).
    """
    try:
        held = store.lock(key)
    except KeyLocked:  # a writer took the key since the probe
        for path, _ in old:
            tally.keep(path, "its lock holder is alive")
        return
    except OSError as exc:
        tally.fail(lock_path or os.path.join(store.root, key + LOCK_SUFFIX), exc, "lock")
        return
    try:
        for path, why in old:
            tally.remove(path, why)
    finally:
        try:
            held.release()
        except OSError as exc:
            tally.fail(lock_path or os.path.join(store.root, key + LOCK_SUFFIX), exc, "remove")
        else:
            if lock_path and stale:
                tally.remove(lock_path, stale, lock=True, unlink=False)


class _Tally:
    """What prune did, as lines to print and counts."""

    def __init__(self, *, dry_run: bool) -> None:
        self.dry_run = dry_run
        self.lines: list[str] = []
        self.removed = self.locks = self.kept = self.failed = 0

    def keep(self, path: str, why: str) -> None:
        self.kept += 1
        self.lines.append(f"kept {path}: {why}")

    def fail(self, path: str, exc: OSError, what: str) -> None:
        self.failed += 1
        _error("prune", f"cannot {what} {path}: {_why(exc)}")

    def refuse(self, problem: str) -> None:
        """Something planted in the root (``UnsafeFile``'s text): left, and counted as failed."""
        self.failed += 1
        _error("prune", problem)

    def remove(self, path: str, why: str, *, lock: bool = False, unlink: bool = True) -> None:
        if unlink and not self.dry_run:
            try:
                os.unlink(path)
            except FileNotFoundError:  # gone already: not ours to report
                return
            except OSError as exc:
                self.fail(path, exc, "remove")
                return
        if lock:
            self.locks += 1
        else:
            self.removed += 1
        self.lines.append(f"{'would remove' if self.dry_run else 'removed'} {path} ({why})")


def _not_a_file(path: str) -> str | None:
    """Why prune leaves ``path`` alone (a link, a FIFO, ...), or None for a regular file."""
    try:
        st = os.lstat(path)
    except OSError:
        return None  # gone: nothing to remove, the unlink will say so
    if stat.S_ISREG(st.st_mode):
        return None
    return str(UnsafeFile(path, describe(st, path)))


# -- small formatting helpers ----------------------------------------------------


def _why(exc: OSError) -> str:
    return os.strerror(exc.errno) if exc.errno else str(exc)


def _error(command: str, message: str) -> None:
    print(f"checkpointer {command}: {message}", file=sys.stderr)


def _one_line(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "missing or null"
    return names.get(type(value), "a number" if isinstance(value, (int, float)) else "?")


def _utc(value: datetime) -> datetime:
    """A meta time as UTC: one without a zone (hand-written) is UTC, as the writer's are."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def _when(value: datetime | None, suffix: str = "") -> str:
    if value is None:
        return "?"
    try:
        return f"{_utc(value).astimezone(UTC):%Y-%m-%d %H:%M:%S}{suffix}"
    except OverflowError:  # outside the calendar once in UTC: as written
        return str(value)


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    size = n / 1024
    for unit in ("KiB", "MiB"):
        if size < 1024:
            return f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def _opt(value: int | None) -> str:
    return "?" if value is None else str(value)


def _yes(value: bool | None) -> str:
    return "?" if value is None else "yes" if value else "no"


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return _yes(value)
    if isinstance(value, datetime):
        return _when(value, " UTC")
    if isinstance(value, msgspec.Struct):
        value = msgspec.structs.asdict(value)
    if isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def _ago(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{max(seconds, 0):.0f}s"


# -- the parser ------------------------------------------------------------------


_PG_ROOT = (
    "a PostgreSQL URI (postgresql://user@host:port/dbname; a password from "
    "PGPASSWORD or ~/.pgpass) to look at a PostgresStore"
)
_PG_DSN = (
    "a libpq connection string (host=db dbname=agents user=app) or URI, in place "
    "of ROOT: look at the PostgresStore there"
)
_PG_SCHEMA = "with a PostgreSQL ROOT: the schema of the store's tables (%(default)s)"


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="checkpointer",
        description="Debounced, durable checkpoints for async agent sessions. "
        "Look inside a store directory, check it, prune it, or run the demo.",
        epilog="Exit status: 0 all well, 1 a problem with the store (missing root, "
        "unknown key, bad file), 2 a usage error.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    ls = commands.add_parser(
        "ls",
        help="list the checkpoints of a store directory",
        description="One row per checkpoint: key, last update (UTC), size, seq, turns, "
        "live (a writer had it open at its last write), pinned, lock (alive: a writer "
        "holds <key>.lock now; stale: the lock file was left by a writer that died), and "
        "a title (the first user message).",
    )
    ls.add_argument(
        "root",
        metavar="ROOT",
        nargs="?",
        help="the store directory (FileStore root), or " + _PG_ROOT,
    )
    ls.add_argument(
        "--sort",
        choices=sorted(_SORTS),
        default="key",
        help="order rows by this field (%(default)s); updated, size, seq and turns "
        "put the newest or largest first",
    )
    ls.add_argument("-r", "--reverse", action="store_true", help="reverse the order")
    ls.add_argument("--json", action="store_true", help="print a JSON array, for scripts")
    ls.add_argument("--schema", default="checkpointer", help=_PG_SCHEMA)
    ls.add_argument("--dsn", help=_PG_DSN)
    ls.set_defaults(run=cmd_ls, parser=ls)

    show = commands.add_parser(
        "show",
        help="show one checkpoint: its meta and its last messages",
        description="Print the meta of KEY's checkpoint, its lock, and a short view of "
        "the state: the message count and the last messages, truncated.",
    )
    show.add_argument("root", metavar="ROOT", nargs="?", help="the store directory, or " + _PG_ROOT)
    show.add_argument("key", metavar="KEY", nargs="?", help="the session key")
    show.add_argument(
        "--last", type=int, default=5, metavar="N", help="messages to show (%(default)s)"
    )
    show.add_argument(
        "--raw", action="store_true", help="print the file's bytes as they are, undecoded"
    )
    show.add_argument("--schema", default="checkpointer", help=_PG_SCHEMA)
    show.add_argument("--dsn", help=_PG_DSN)
    show.set_defaults(run=cmd_show, parser=show)

    verify = commands.add_parser(
        "verify",
        help="load every checkpoint and check agent histories; exit 1 if any is bad",
        description="Load every checkpoint of ROOT; where the state has messages, check "
        "that a model API would accept the agent history (roles; every tool call "
        "answered, once, before the conversation goes on). Prints each bad file with its "
        "reason and exits with status 1 when any is bad. Tool calls still open at the "
        "end (saved while the tool ran) are a warning, not bad.",
    )
    verify.add_argument(
        "root", metavar="ROOT", nargs="?", help="the store directory, or " + _PG_ROOT
    )
    verify.add_argument("-q", "--quiet", action="store_true", help="print only bad files")
    verify.add_argument("--schema", default="checkpointer", help=_PG_SCHEMA)
    verify.add_argument("--dsn", help=_PG_DSN)
    verify.set_defaults(run=cmd_verify, parser=verify)

    prune = commands.add_parser(
        "prune",
        help="remove checkpoints not updated for a while, and stale locks",
        description="Remove checkpoints last updated more than DURATION ago, with their "
        "lock files, and every stale lock file (its holder is gone), whatever its age. "
        "Never removes anything of a key whose lock holder is alive, nor a pinned "
        "checkpoint. Lists what it removes.",
    )
    prune.add_argument(
        "root", metavar="ROOT", nargs="?", help="the store directory, or " + _PG_ROOT
    )
    prune.add_argument(
        "--older-than",
        required=True,
        type=parse_duration,
        metavar="DURATION",
        help="e.g. 7d, 12h, 30m, 1h30m (units s, m, h, d, w)",
    )
    prune.add_argument(
        "-n", "--dry-run", action="store_true", help="list what would go, remove nothing"
    )
    prune.add_argument("--schema", default="checkpointer", help=_PG_SCHEMA)
    prune.add_argument("--dsn", help=_PG_DSN)
    prune.set_defaults(run=cmd_prune, parser=prune)

    demo = commands.add_parser(
        "demo",
        help="run a simulated agent loop checkpointed to a local directory",
        description="Run a simulated agent whose run-ended events are coalesced into "
        "durable checkpoint writes, then load the file back and compare.",
    )
    demo.add_argument("--root", default=".checkpoints", help="store directory (%(default)s)")
    demo.add_argument("--key", default="demo-session", help="session key (%(default)s)")
    demo.add_argument("--turns", type=int, default=40, help="agent turns (%(default)s)")
    demo.add_argument(
        "--backend", choices=["asyncio", "trio"], default="asyncio", help="(%(default)s)"
    )
    demo.set_defaults(run=cmd_demo)
    from ._pgcommand import add_command  # imports no psycopg

    add_command(commands)
    return parser


def cmd_demo(args: argparse.Namespace) -> int:
    from ._demo import run_demo

    if args.turns < 1:
        print("checkpointer demo: --turns must be at least 1", file=sys.stderr)
        return USAGE

    async def demo() -> int:
        return await run_demo(args.root, key=args.key, turns=args.turns)

    return anyio.run(demo, backend=args.backend)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    args = _build_parser().parse_args(argv)
    if hasattr(args, "parser"):  # ls, show, verify, prune: ROOT or --dsn
        _pgcli.settle_root(args)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        status: int = args.run(args)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
    except BrokenPipeError:  # `checkpointer ls ROOT | head`
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return PROBLEM
    return status
