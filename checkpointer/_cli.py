"""The ``checkpointer`` command line (also ``python -m checkpointer``)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

import anyio

__all__ = ["main"]


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="checkpointer",
        description="Debounced, durable checkpoints for async agent sessions.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
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
    from ._postgres import add_command  # imports no psycopg

    add_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    args = _build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    if args.command == "demo":
        from ._demo import run_demo

        if args.turns < 1:
            print("checkpointer demo: --turns must be at least 1", file=sys.stderr)
            return 2

        async def demo() -> int:
            return await run_demo(args.root, key=args.key, turns=args.turns)

        return anyio.run(demo, backend=args.backend)
    if args.command == "pg-schema":
        from ._postgres import run_command

        return run_command(args)
    raise AssertionError(f"unhandled command {args.command!r}")  # pragma: no cover
