"""A child program for ``tests/writer/test_conflict.py``: an agent checkpointing one key.

    python tests/children/conflict_child.py STORE KEY NAME [--resume] [--wait]

``STORE`` is ``file:ROOT``, ``journal:ROOT``, ``pg:SCHEMA`` or
``pgjournal:SCHEMA`` (PostgreSQL at ``$DSN``), ``s3:BUCKET@URL`` or
``s3journal:BUCKET@URL`` (the tests' S3 server: ``tests/s3.py``).  The
program loads the key, opens a ``CheckpointWriter`` on asyncio (exit hooks on, as a program has
them; with ``--resume`` it passes ``resume_from=`` the loaded checkpoint;
with ``--wait``, ``lock_timeout=60``, and it prints ``waiting`` when a
write begins to wait for the key's lock), and then follows its stdin, one
command a line (the first line, ``go``, starts it: a parent may start the
interpreter early, then the agent):

* ``append TEXT``: append a message ``NAME: TEXT``, ``notify()``, then
  ``write_now()``; print the result.
* ``close``: ``aclose()`` (the final write); print its result.

Each step prints one JSON line on stdout; warnings of the ``checkpointer``
logger go to stderr.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

import anyio

from checkpointer import (
    CheckpointWriter,
    FileStore,
    JournalStore,
    Limits,
    PostgresJournalStore,
    PostgresStore,
    Result,
    Snapshot,
    load,
)
from checkpointer.stores import Store


def say(**fields: object) -> None:
    sys.stdout.write(json.dumps({"pid": os.getpid(), **fields}) + "\n")
    sys.stdout.flush()


def make_store(spec: str) -> Store:
    kind, _, where = spec.partition(":")
    if kind == "file":
        return FileStore(where)
    if kind == "journal":
        return JournalStore(where)
    if kind == "pg":
        return PostgresStore(os.environ["DSN"], schema=where)
    if kind == "pgjournal":
        return PostgresJournalStore(os.environ["DSN"], schema=where)
    if kind in ("s3", "s3journal"):  # s3:BUCKET@URL, the tests' local server
        from tests.s3 import make_s3_store

        store: Store = make_s3_store(spec)
        return store
    raise SystemExit(f"unknown store {spec!r}")


def described(result: Result) -> dict[str, Any]:
    return {
        "result": type(result).__name__,
        "reason": getattr(result, "reason", None),
        "error": getattr(result, "error", None),
        "seq": getattr(result, "seq", None),
    }


def report_waits(store: Store) -> None:
    """Print ``waiting`` each time the writer waits for the key's lock (timeout > 0)."""
    lock = store.lock  # type: ignore[attr-defined]

    def waiting_lock(key: str, *, timeout: float = 0.0) -> object:
        if timeout > 0:
            say(step="waiting")
        return lock(key, timeout=timeout)

    store.lock = waiting_lock  # type: ignore[attr-defined]


async def main(spec: str, key: str, name: str, resume: bool, wait: bool) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if (await anyio.to_thread.run_sync(sys.stdin.readline)).strip() != "go":
        return 0
    store = make_store(spec)
    if wait:
        report_waits(store)
    loaded = load(store, key)
    messages: list[dict[str, str]] = [] if loaded is None else loaded.state["messages"]
    say(step="loaded", seq=None if loaded is None else loaded.meta.seq, n=len(messages))
    state = {"messages": messages}
    resumed: dict[str, Any] = {"resume_from": loaded} if resume else {}  # else: not given
    writer = CheckpointWriter(
        lambda: Snapshot(key, state),
        store,
        debounce=0.01,
        min_interval=0.0,
        max_wait=0.05,
        limits=Limits(retry_initial=0.05, retry_max=0.2, lock_timeout=60.0 if wait else 0.0),
        **resumed,
    )
    await writer.__aenter__()
    stats = writer.statistics()
    say(step="open", writes=stats.writes, failures=stats.failures)
    try:
        while True:
            line = (await anyio.to_thread.run_sync(sys.stdin.readline)).strip()
            command, _, text = line.partition(" ")
            if command != "append":  # "close", or the parent went away
                break
            messages.append({"role": "user", "content": f"{name}: {text}"})
            writer.notify()
            result = await writer.write_now()
            say(step="append", pending=writer.statistics().pending, **described(result))
    finally:
        final = await writer.aclose()  # what `async with` does on the way out
    stats = writer.statistics()
    say(step="closed", writes=stats.writes, failures=stats.failures, **described(final))
    close = getattr(store, "close", None)
    if callable(close):
        close()
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    resume, wait = "--resume" in args, "--wait" in args
    spec, key, name = [a for a in args if not a.startswith("--")][:3]
    sys.exit(anyio.run(main, spec, key, name, resume, wait))
