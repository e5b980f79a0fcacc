"""The ``checkpointer`` command line (also ``python -m checkpointer``).

Commands over a store: ``ls``, ``show``, ``verify``, ``prune``; and ``demo``
and ``pg-schema``.  ROOT is a store directory, an ``s3://bucket/prefix``
(``--endpoint-url`` for an S3-compatible service), or a ``postgresql://`` URI
(``--dsn`` gives any libpq connection string instead): each command is
written once, over a ``Root`` (``roots.py``), and a module per command says
what it does (``ls.py``, ``show.py``, ``verify.py``, ``prune.py``,
``demo.py``, ``pg_schema.py``).  All output goes through ``report.py``.

Exit status: 0 when all is well, 1 when something is wrong with the store (a
missing root, an unknown key, a bad file, a server that cannot be reached),
2 for a usage error (argparse's own status: a bad option, a bad duration, an
invalid key).

This module reads the arguments, opens the root, runs the command and turns
a closed stdout (`show ... | head`) into a quiet exit, status 0.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Callable, Sequence

from .. import __version__ as VERSION
from . import demo, ls, pg_schema, prune, report, show, verify
from .prune import parse_duration
from .roots import Root, RootError, open_root
from .s3root import S3Root, is_s3

__all__ = ["main", "parse_duration"]

_ON_A_ROOT: dict[str, Callable[[Root, argparse.Namespace], int]] = {
    "ls": ls.run,
    "show": show.run,
    "verify": verify.run,
    "prune": prune.run,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser, commands = _build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    args, extras = parser.parse_known_args(_join_negative_values(words, commands))
    if extras:  # said by the command's own parser, in the user's words
        commands.choices[args.command].error(f"unrecognized arguments: {' '.join(extras)}")
    if args.command in _ON_A_ROOT:
        _settle_root(args)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        status: int = args.run(args)
        report.flush()  # a closed pipe shows here, not at interpreter exit
    except BrokenPipeError:  # `checkpointer show ROOT KEY | head`: the reader had enough
        report.silence()
        return report.OK
    return status


def _on_a_root(args: argparse.Namespace) -> int:
    """Open ROOT and run the command over it: a root that cannot be used is status 1."""
    command = args.command
    try:
        if is_s3(args.root):
            root: Root = S3Root(args.root, args.endpoint_url)
        else:
            root = open_root(args.root, dsn=args.dsn, schema=args.schema)
    except RootError as exc:  # no psycopg, a bad DSN
        report.error(command, str(exc))
        return report.PROBLEM
    failures: tuple[type[Exception], ...] = (RootError, *root.failure)
    try:
        with contextlib.closing(root):
            return _ON_A_ROOT[command](root, args)
    except failures as exc:  # no such directory; the server failed
        report.error(command, str(exc))
        return report.PROBLEM


# The options whose value may start with "-" and a digit, per command.
_VALUED = {"prune": "--older-than", "show": "--last"}


def _join_negative_values(
    argv: list[str], commands: argparse._SubParsersAction[argparse.ArgumentParser]
) -> list[str]:
    """``--older-than -1d`` as ``--older-than=-1d``, so the value's own check says what is wrong.

    argparse takes ``-1d`` for an option and says only "expected one argument".
    Only the command's own option is joined, under any abbreviation argparse
    would take for it (``--older -1d``), keeping the user's spelling of it.
    """
    command = next((arg for arg in argv if arg[:1] != "-"), None)
    valued = _VALUED.get(command or "")
    if valued is None:
        return list(argv)
    parser = commands.choices[command or ""]
    longs = [o for o in parser._option_string_actions if o.startswith("--")]
    out: list[str] = []
    for arg in argv:
        prev = out[-1] if out else ""
        named = prev == valued or (
            prev[:2] == "--" and [o for o in longs if o.startswith(prev)] == [valued]
        )
        if named and arg[:1] == "-" and arg[1:2].isdigit():
            out[-1] = f"{prev}={arg}"
        else:
            out.append(arg)
    return out


def _count(text: str) -> int:
    """A count of things to show: a whole number, 0 or more."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"{n} is negative: give 0 or more (0: no messages)")
    return n


def _settle_root(args: argparse.Namespace) -> None:
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


# -- the parser ------------------------------------------------------------------


_PG_ROOT = (
    "a PostgreSQL URI (postgresql://user@host:port/dbname; a password from "
    "PGPASSWORD or ~/.pgpass) to look at a PostgresStore"
)
_PG_DSN = (
    "a libpq connection string (host=db dbname=agents user=app) or URI, in place "
    "of ROOT: look at the PostgresStore there"
)
_S3_ENDPOINT = (
    "with an s3://bucket/prefix ROOT: an S3-compatible endpoint (MinIO, R2, ...) "
    "instead of AWS; credentials and region as the AWS SDKs read them"
)
_PG_SCHEMA = "with a PostgreSQL ROOT: the schema of the store's tables (%(default)s)"


def _root_arguments(parser: argparse.ArgumentParser, help_: str) -> None:
    """ROOT, first: optional, as ``--dsn`` may stand in for it (``_settle_root``)."""
    parser.add_argument("root", metavar="ROOT", nargs="?", help=help_)


def _pg_arguments(parser: argparse.ArgumentParser) -> None:
    """``--schema`` and ``--dsn``, last, and the run over a root."""
    parser.add_argument("--schema", default="checkpointer", help=_PG_SCHEMA)
    parser.add_argument("--dsn", help=_PG_DSN)
    parser.add_argument("--endpoint-url", help=_S3_ENDPOINT)
    parser.set_defaults(run=_on_a_root, parser=parser)


def _build_parser() -> tuple[
    argparse.ArgumentParser, argparse._SubParsersAction[argparse.ArgumentParser]
]:
    """The parser, and its commands (each command's own parser is ``commands.choices[name]``)."""
    parser = argparse.ArgumentParser(
        prog="checkpointer",
        description="Debounced, durable checkpoints for async agent sessions. "
        "Look inside a store directory, check it, prune it, or run the demo.",
        epilog="Exit status: 0 all well, 1 a problem with the store (missing root, "
        "unknown key, bad file), 2 a usage error.",
    )
    parser.add_argument("--version", action="version", version=f"agent-checkpointer {VERSION}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    ls_ = commands.add_parser(
        "ls",
        help="list the checkpoints of a store directory",
        description="One row per checkpoint: key, last update (UTC), size, seq, turns, "
        "live (a writer had it open at its last write), pinned, lock (alive: a writer "
        "holds <key>.lock now; stale: the lock file was left by a writer that died), and "
        "a title (the first user message).",
    )
    _root_arguments(
        ls_,
        "the store directory (FileStore root), an S3 prefix (s3://bucket/prefix), or " + _PG_ROOT,
    )
    ls_.add_argument(
        "--sort",
        choices=sorted(ls.SORTS),
        default="key",
        help="order rows by this field (%(default)s); updated, size, seq and turns "
        "put the newest or largest first",
    )
    ls_.add_argument("-r", "--reverse", action="store_true", help="reverse the order")
    ls_.add_argument("--json", action="store_true", help="print a JSON array, for scripts")
    _pg_arguments(ls_)

    show_ = commands.add_parser(
        "show",
        help="show one checkpoint: its meta and its last messages",
        description="Print the meta of KEY's checkpoint, its lock, and a short view of "
        "the state: the message count and the last messages, truncated.",
    )
    _root_arguments(show_, "the store directory, an S3 prefix (s3://bucket/prefix), or " + _PG_ROOT)
    show_.add_argument("key", metavar="KEY", nargs="?", help="the session key")
    show_.add_argument(
        "--last", type=_count, default=5, metavar="N", help="messages to show (%(default)s)"
    )
    show_.add_argument(
        "--raw", action="store_true", help="print the file's bytes as they are, undecoded"
    )
    _pg_arguments(show_)

    verify_ = commands.add_parser(
        "verify",
        help="load every checkpoint and check agent histories; exit 1 if any is bad",
        description="Load every checkpoint of ROOT; where the state has messages, check "
        "that a model API would accept the agent history (roles; every tool call "
        "answered, once, before the conversation goes on). Prints each bad file with its "
        "reason and exits with status 1 when any is bad. Tool calls still open at the "
        "end (saved while the tool ran) are a warning, not bad.",
    )
    _root_arguments(
        verify_, "the store directory, an S3 prefix (s3://bucket/prefix), or " + _PG_ROOT
    )
    verify_.add_argument("-q", "--quiet", action="store_true", help="print only bad files")
    _pg_arguments(verify_)

    prune_ = commands.add_parser(
        "prune",
        help="remove checkpoints not updated for a while, and stale locks",
        description="Remove checkpoints last updated more than DURATION ago, with their "
        "lock files, and every stale lock file (its holder is gone), whatever its age. "
        "Never removes anything of a key whose lock holder is alive, nor a pinned "
        "checkpoint. Lists what it removes. Summary checkpoints and corrupt files a "
        "writer moved aside are kept unless --summaries or --corrupt asks for them.",
    )
    _root_arguments(
        prune_, "the store directory, an S3 prefix (s3://bucket/prefix), or " + _PG_ROOT
    )
    prune_.add_argument(
        "--older-than",
        required=True,
        type=parse_duration,
        metavar="DURATION",
        help="e.g. 7d, 12h, 30m, 1h30m (units s, m, h, d, w)",
    )
    prune_.add_argument(
        "-n", "--dry-run", action="store_true", help="list what would go, remove nothing"
    )
    prune_.add_argument(
        "--summaries",
        action="store_true",
        help="also remove summary checkpoints (sessions/KEY/checkpoint.md) older than "
        "DURATION whose key has no checkpoint left after the prune (kept by default)",
    )
    prune_.add_argument(
        "--corrupt",
        action="store_true",
        help="also remove corrupt files a writer moved aside (KEY.corrupt-<UTC time>) "
        "more than DURATION ago (kept by default)",
    )
    _pg_arguments(prune_)

    demo_ = commands.add_parser(
        "demo",
        help="run a simulated agent loop checkpointed to a local directory",
        description="Run a simulated agent whose run-ended events are coalesced into "
        "durable checkpoint writes, then load the file back and compare.",
    )
    demo_.add_argument("--root", default=".checkpoints", help="store directory (%(default)s)")
    demo_.add_argument("--key", default="demo-session", help="session key (%(default)s)")
    demo_.add_argument("--turns", type=int, default=40, help="agent turns (%(default)s)")
    demo_.add_argument(
        "--backend", choices=["asyncio", "trio"], default="asyncio", help="(%(default)s)"
    )
    demo_.set_defaults(run=demo.run)

    pg_schema.add_command(commands)
    return parser, commands
