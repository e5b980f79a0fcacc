"""``ls``, ``show``, ``verify`` and ``prune`` over a PostgreSQL store.

``checkpointer ls postgresql://app@db/agents`` (or ``postgres://``): ROOT is
a libpq URI (or ``--dsn`` gives any libpq connection string instead), and
the commands go through the store API (``keys()``, ``read()``, ``load()``,
``delete()``), so snapshot rows and journal rows look alike.  Each key is
shown as ``store.location(key)`` (never the password).
Locks are the advisory writer locks: ``ls`` and ``show`` only look
(``PostgresStore.locked_by``); ``prune`` deletes a key only while it holds
the key's lock itself, so a live writer's key is never touched.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import msgspec

from . import _cli as cli
from ._load import load
from ._values import CheckpointError

if TYPE_CHECKING:
    from ._stores.postgres.store import PostgresStore

__all__ = ["is_dsn", "run", "settle_root"]

_SCHEMES = ("postgresql://", "postgres://")


def is_dsn(root: str) -> bool:
    """Whether a ROOT argument names a PostgreSQL server rather than a directory."""
    return root.startswith(_SCHEMES)


def settle_root(args: argparse.Namespace) -> None:
    """Check ROOT (and KEY) against ``--dsn``; with ``--dsn``, ROOT becomes the DSN.

    ROOT is optional on the parser only so that ``--dsn`` can stand in for it;
    without ``--dsn`` a missing ROOT is the same usage error as before (exit 2).
    """
    parser: argparse.ArgumentParser = args.parser
    has_key = hasattr(args, "key")
    if args.dsn is None:
        missing = ["ROOT"] if args.root is None else []
        if has_key and args.key is None:
            missing.append("KEY")
        if missing:
            parser.error(f"the following arguments are required: {', '.join(missing)}")
        return
    if has_key and args.key is None:  # `show --dsn DSN KEY`: the one positional is KEY
        args.root, args.key = None, args.root
    if args.root is not None:
        parser.error("give ROOT or --dsn, not both")
    if has_key and args.key is None:
        parser.error("the following arguments are required: KEY")
    args.root = args.dsn


def run(command: str, args: argparse.Namespace) -> int:
    """Run ``command`` against the store ``args.root`` names; the exit status."""
    try:
        from ._stores.postgres.errors import PostgresStoreError
        from ._stores.postgres.store import PostgresStore

        store = PostgresStore(args.root, schema=args.schema, create_schema=False)
    except (ImportError, ValueError) as exc:
        cli._error(command, str(exc))
        return cli.PROBLEM
    commands: dict[str, Callable[[PostgresStore, argparse.Namespace], int]] = {
        "ls": _ls,
        "show": _show,
        "verify": _verify,
        "prune": _prune,
    }
    try:
        with store:
            return commands[command](store, args)
    except PostgresStoreError as exc:
        cli._error(command, str(exc))
        return cli.PROBLEM


def _kind(store: PostgresStore) -> cli.Kind:
    def load_row(_root: str, key: str) -> cli.Loaded | None:
        checkpoint = load(store, key)
        return None if checkpoint is None else cli.Loaded(checkpoint.meta, checkpoint.state)

    return cli.Kind("row", "", load_row)


def _inspect(store: PostgresStore, key: str) -> tuple[cli.Row, cli.Loaded | None]:
    file = cli.File(key, _kind(store), store.location(key))
    row = cli.Row(key=key, kind="row", path=file.path, size=0, mtime=datetime.fromtimestamp(0, UTC))
    holder = store.locked_by(key)
    if holder is not None:
        row.lock, row.lock_holder = "alive", holder
    try:
        data = store.read(key)
    except CheckpointError as exc:  # a damaged journal row, as the file CLI reports a file
        row.error = exc.reason
        return row, None
    except OSError as exc:
        row.error = f"cannot be read: {exc}"
        return row, None
    row.size = 0 if data is None else len(data)
    loaded, row.error = cli._read(file)
    if loaded is None:
        return row, None
    meta = loaded.meta
    messages = cli._messages(loaded.state)
    row.updated_at, row.created_at = cli._utc(meta.updated_at), cli._utc(meta.created_at)
    row.mtime = row.updated_at
    row.seq, row.live, row.pinned = meta.seq, meta.live, meta.pinned
    row.turns = cli._turns(meta, messages)
    row.messages = None if messages is None else len(messages)
    row.title = cli._title(messages)
    return row, loaded


def _ls(store: PostgresStore, args: argparse.Namespace) -> int:
    keys = store.keys()  # a list from the server, not a dict
    rows = [_inspect(store, key)[0] for key in keys]
    rows.sort(key=cli._SORTS[args.sort], reverse=(args.sort in cli._DESCENDING) != args.reverse)
    if args.json:
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(rows)).decode() + "\n")
        return cli.OK
    where = store.location("")[:-1]
    if not rows:
        print(f"no checkpoints in {where}")
        return cli.OK
    table = [["KEY", "UPDATED (UTC)", "SIZE", "SEQ", "TURNS", "LIVE", "PINNED", "LOCK", "TITLE"]]
    table += (
        [
            r.key,
            cli._when(r.updated_at),
            cli._size(r.size),
            cli._opt(r.seq),
            cli._opt(r.turns) if r.error or r.turns is not None else "-",
            cli._yes(r.live),
            cli._yes(r.pinned),
            r.lock or "-",
            f"! {r.error}" if r.error else r.title,
        ]
        for r in rows
    )
    cli._print_table(table, right={2, 3, 4})
    bad = sum(1 for r in rows if r.error)
    if bad:
        print(f"checkpointer ls: {bad} key(s) cannot be read; `checkpointer verify` says why")
    return cli.OK


def _show(store: PostgresStore, args: argparse.Namespace) -> int:
    keys = store.keys()
    if args.key not in keys:
        why = f"no checkpoint {args.key!r} in {store.location('')[:-1]}"
        hint = difflib.get_close_matches(args.key, keys, n=1)
        if hint:
            why += f"; did you mean {hint[0]!r}?"
        cli._error("show", why)
        return cli.PROBLEM
    if args.raw:
        try:
            data = store.read(args.key) or b""
        except CheckpointError as exc:
            cli._error("show", f"{store.location(args.key)}: {exc.reason}")
            return cli.PROBLEM
        sys.stdout.flush()
        sys.stdout.buffer.write(data + b"\n")
        return cli.OK
    row, loaded = _inspect(store, args.key)
    fields = [("row", f"{row.path} ({cli._size(row.size)})")]
    fields.append(("lock", f"held by {row.lock_holder}" if row.lock else "free"))
    if loaded is None:
        cli._print_fields(fields)
        cli._error("show", f"{row.path}: {row.error}")
        return cli.PROBLEM
    return cli._show_loaded(fields, row, loaded, args.last)


def _verify(store: PostgresStore, args: argparse.Namespace) -> int:
    keys = store.keys()
    kind = _kind(store)
    bad = warned = 0
    for key in keys:
        file = cli.File(key, kind, store.location(key))
        outcome = cli.report_verdict(file.path, cli._verify(file), quiet=args.quiet)
        bad += outcome == "bad"
        warned += outcome == "warn"
    if not keys:
        print(f"no checkpoints in {store.location('')[:-1]}")
        return cli.OK
    ok = f"{len(keys) - bad} ok"
    if warned:
        ok += f" ({warned} with tool calls open at the end)"
    print(f"{len(keys)} checkpoint(s): {ok}, {bad} bad")
    return cli.PROBLEM if bad else cli.OK


def _prune(store: PostgresStore, args: argparse.Namespace) -> int:
    limit: cli.Duration = args.older_than
    now = datetime.now(UTC)
    removed = kept = 0
    lines: list[str] = []
    verb = "would remove" if args.dry_run else "removed"
    keys = store.keys()
    for key in keys:
        row, _ = _inspect(store, key)
        if row.updated_at is None:
            continue  # unreadable: verify reports it; prune never guesses its age
        age = (now - row.updated_at).total_seconds()
        if age <= limit.seconds:
            continue
        if row.pinned:
            kept += 1
            lines.append(f"kept {row.path}: pinned (updated {cli._ago(age)} ago)")
            continue
        # Held while deleting, so no writer starts on the key midway.
        holder = store.locked_by(key) if args.dry_run else store.acquire(key)
        if holder is not None:
            kept += 1
            lines.append(f"kept {row.path}: its lock holder is alive ({holder})")
            continue
        try:
            if not args.dry_run:
                # A writer may have resumed the key and written it between the
                # listing and the lock: look again, now that none can write.
                again, _ = _inspect(store, key)
                if again.updated_at != row.updated_at or again.pinned != row.pinned:
                    kept += 1
                    lines.append(f"kept {row.path}: written since it was listed")
                    continue
                store.delete(key)
        finally:
            store.release(key)
        removed += 1
        lines.append(f"{verb} {row.path} (updated {cli._ago(age)} ago)")
    if not lines:
        print(f"nothing older than {limit.text} in {store.location('')[:-1]}")
        return cli.OK
    for line in lines:
        print(line)
    print(f"{verb} {removed} checkpoint(s) older than {limit.text}, kept {kept}")
    return cli.OK
