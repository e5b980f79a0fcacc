"""The ``checkpointer`` command line (also ``python -m checkpointer``): ``ls``, ``show``,
``verify``, ``prune`` and ``re-encrypt``, each written once over a ``Root``
(``roots.py``); ``demo``; ``pg-schema``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import sys
from collections.abc import Sequence

from .. import PostgresStore
from .. import __version__ as VERSION
from ..stores import Encryption, PostgresStoreError
from . import demo, ls, prune, reencrypt, report, show, verify
from .directory import DirectoryRoot
from .prune import parse_duration
from .roots import (
    PG_SCHEMES,
    S3_SCHEME,
    PostgresRoot,
    Root,
    RootError,
    S3Root,
    schema_sql,
)

__all__ = ["main", "parse_duration"]


def main(argv: Sequence[str] | None = None) -> int:
    parser, commands = _build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # After "--" only positionals (a key may start with "-"); argparse would fill them only
    # if no option came between ROOT and "--", so they are filled here.
    tail = argv[argv.index("--") + 1 :] if "--" in argv else []
    args, extras = parser.parse_known_args(argv[: len(argv) - len(tail) - bool(tail)])
    for name in ("root", "key"):
        if tail and name in args and getattr(args, name) is None:
            setattr(args, name, tail.pop(0))
    extras += tail
    if extras:  # said by the command's own parser, in the user's words
        commands.choices[args.command].error(f"unrecognized arguments: {' '.join(extras)}")
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
    _settle_root(args)
    try:
        root = _open(args)
    except RootError as exc:  # no psycopg, a bad DSN
        report.error(args.command, str(exc))
        return report.PROBLEM
    failures: tuple[type[Exception], ...] = (RootError, *root.failure)
    try:
        with contextlib.closing(root):
            status: int = args.on_root(root, args)
            return status
    except failures as exc:  # no such directory; the server failed
        report.error(args.command, str(exc))
        return report.PROBLEM


def _open(args: argparse.Namespace) -> Root:
    keys = _keys(args.key_file, args.command)
    if args.root.startswith(S3_SCHEME):
        return S3Root(args.root, args.endpoint_url, keys)
    if args.dsn is not None or args.root.startswith(PG_SCHEMES):
        return PostgresRoot(args.root, args.schema, keys)
    return DirectoryRoot(args.root, keys)


def _keys(key_file: str | None, command: str) -> Encryption | None:
    """The keys of --key-file, else of CHECKPOINTER_KEYS, else None (RootError if bad).

    A key file others may read is used, with a warning: the keys open every checkpoint.
    """
    where, text = "CHECKPOINTER_KEYS", os.environ.get("CHECKPOINTER_KEYS")
    if key_file is not None:
        where = key_file
        try:
            with open(key_file, encoding="utf-8-sig") as file:  # a BOM (Notepad) is no key
                mode = os.fstat(file.fileno()).st_mode
                text = file.read()
        except OSError as exc:
            raise RootError(f"cannot read the key file {key_file}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise RootError(
                f"{key_file}: not a key file (binary); write each key as id:base64, one a "
                "line (Encryption.new_key makes one)"
            ) from None
        if mode & 0o077:
            report.error(
                command,
                f"warning: the key file {key_file} is open to others (mode "
                f"{mode & 0o777:04o}); chmod 600 it",
            )
        if not text.strip():
            raise RootError(f"{key_file}: no key in it; write each key as id:base64, one a line")
    if not text:
        return None
    try:
        return Encryption.from_text(text)
    except (ValueError, ImportError) as exc:
        raise RootError(f"{where}: {exc}") from None


def _settle_root(args: argparse.Namespace) -> None:
    """Check ROOT (optional on the parser only for ``--dsn``) and KEY; ``--dsn`` becomes ROOT."""
    parser: argparse.ArgumentParser = args.parser
    if args.dsn is not None:
        if getattr(args, "key", "") is None:  # `show --dsn DSN KEY`: the one positional is KEY
            args.root, args.key = None, args.root
        if args.root is not None:
            parser.error("give ROOT or --dsn, not both")
        args.root = args.dsn
    given = (("ROOT", args.root), ("KEY", getattr(args, "key", "")))
    if missing := [name for name, value in given if value is None]:
        parser.error(f"the following arguments are required: {', '.join(missing)}")


_ROOT = (
    "a store directory, an S3 prefix (s3://bucket/prefix), or a PostgreSQL URI "
    "(postgresql://user@host:port/dbname; a password from PGPASSWORD or ~/.pgpass)"
)
_SCHEMA = "with a PostgreSQL ROOT: the schema of the store's tables (%(default)s)"
_DSN = (
    "a libpq connection string (host=db dbname=agents user=app) or URI, in place of ROOT: "
    "look at the PostgresStore there"
)
_KEY_FILE = (
    "a file of the keys of an encrypted store, id:base64 each (the current one first); "
    "else the CHECKPOINTER_KEYS environment variable holds them"
)
_ENDPOINT = (
    "with an s3://bucket/prefix ROOT: an S3-compatible endpoint (MinIO, R2, ...) instead "
    "of AWS; credentials and region as the AWS SDKs read them"
)


def _build_parser() -> tuple[
    argparse.ArgumentParser, argparse._SubParsersAction[argparse.ArgumentParser]
]:
    """The parser, and its commands (each command's own parser is ``commands.choices[name]``)."""
    parser = argparse.ArgumentParser(
        prog="checkpointer",
        description="Debounced, durable checkpoints for async agent sessions. "
        "Look inside a store, check it, prune it, or run the demo.",
        epilog="Exit status: 0 all well, 1 a problem with the store (missing root, "
        "unknown key, bad file), 2 a usage error.",
    )
    parser.add_argument("--version", action="version", version=f"agent-checkpointer {VERSION}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    named = (("ls", ls), ("show", show), ("verify", verify), ("prune", prune))
    for name, command in (*named, ("re-encrypt", reencrypt)):
        sub = commands.add_parser(name, help=command.HELP, description=command.DESCRIPTION)
        # A value may start with "-" and a digit (--older-than -1d): argparse
        # would take it for an option and say only "expected one argument".
        sub._negative_number_matcher = re.compile(r"^-\d")
        sub.add_argument("root", metavar="ROOT", nargs="?", help=_ROOT)  # or --dsn
        command.arguments(sub)
        sub.add_argument("--schema", default="checkpointer", help=_SCHEMA)
        sub.add_argument("--dsn", help=_DSN)
        sub.add_argument("--endpoint-url", help=_ENDPOINT)
        sub.add_argument("--key-file", help=_KEY_FILE)
        sub.set_defaults(run=_on_a_root, on_root=command.run, parser=sub)
    sub = commands.add_parser(
        "demo",
        help="run a simulated agent loop checkpointed to a local directory",
        description="Run a simulated agent whose run-ended events are coalesced into "
        "durable checkpoint writes, then load the file back and compare.",
    )
    demo.arguments(sub)
    sub.set_defaults(run=demo.run)
    pg = commands.add_parser(
        "pg-schema",
        help="create the PostgresStore tables",
        description="Create the tables PostgresStore uses (if they are not there), in one "
        "transaction, and print the schema version; or print the SQL with --sql.",
    )
    pg.add_argument(
        "dsn",
        nargs="?",
        default="",
        help="libpq connection string or URI (default: the PG* environment variables)",
    )
    pg.add_argument("--schema", default="checkpointer", help="PostgreSQL schema (%(default)s)")
    pg.add_argument("--sql", action="store_true", help="print the SQL instead of running it")
    pg.set_defaults(run=_pg_schema)
    return parser, commands


def _pg_schema(args: argparse.Namespace) -> int:
    try:
        if args.sql:
            report.line(schema_sql(args.schema).removesuffix("\n"))
            return report.OK
        with PostgresStore(args.dsn, schema=args.schema) as store:
            version = store.create_schema()
            report.line(f"{store.location('')[:-1]}: schema version {version}")
    except (ImportError, ValueError, PostgresStoreError) as exc:
        report.error("pg-schema", str(exc))
        return report.PROBLEM
    return report.OK
