"""The ``checkpointer pg-schema`` command: create or upgrade the PostgresStore tables.

Out of the store (a store never prints); folded into the CLI with the rest
of its commands.  Importing it imports no psycopg.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from ._stores.postgres.errors import PostgresStoreError
from ._stores.postgres.schema import schema_sql
from ._stores.postgres.store import PostgresStore

if TYPE_CHECKING:
    import argparse

__all__ = ["add_command", "run_command"]


def add_command(commands: Any) -> None:
    """Add ``pg-schema`` to the CLI's subcommands (psycopg is not imported)."""
    cmd = commands.add_parser(
        "pg-schema",
        help="create or upgrade the PostgresStore tables",
        description="Create (or upgrade) the tables PostgresStore uses, in one "
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
    cmd.set_defaults(run=run_command)


def run_command(args: argparse.Namespace) -> int:
    """Run ``pg-schema``; return the exit status."""
    try:
        if args.sql:
            sys.stdout.write(schema_sql(args.schema))
            return 0
        with PostgresStore(args.dsn, schema=args.schema) as store:
            version = store.create_schema()
            print(f"{store.location('')[:-1]}: schema version {version}")
    except (ImportError, ValueError, PostgresStoreError) as exc:
        print(f"checkpointer pg-schema: {exc}", file=sys.stderr)
        return 1
    return 0
