"""``checkpointer pg-schema``: create the tables a PostgresStore uses."""

from __future__ import annotations

import argparse
from typing import Any

from checkpointer import PostgresStore
from checkpointer.stores import PostgresStoreError

from . import report
from .roots import schema_sql


def add_command(commands: Any) -> None:
    """Add ``pg-schema`` to the parser's subcommands (psycopg is not imported)."""
    cmd = commands.add_parser(
        "pg-schema",
        help="create the PostgresStore tables",
        description="Create the tables PostgresStore uses (if they are not there), in one "
        "transaction, and print the schema version; or print the SQL with --sql.",
    )
    cmd.add_argument(
        "dsn",
        nargs="?",
        default="",
        help="libpq connection string or URI (default: the PG* environment variables)",
    )
    cmd.add_argument("--schema", default="checkpointer", help="PostgreSQL schema (%(default)s)")
    cmd.add_argument("--sql", action="store_true", help="print the SQL instead of running it")
    cmd.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run ``pg-schema``; return the exit status."""
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
