"""A child program for ``tests/writer/test_conflict.py``: terminals opening sessions at once.

    python -m tests.children.start_child STORE NAME TURNS KEY...

``STORE`` is ``file:ROOT``, ``journal:ROOT``, ``pg:SCHEMA`` or
``pgjournal:SCHEMA`` (PostgreSQL at ``$DSN``).  The program waits for a line
on stdin (so a parent can start its interpreters first, then all the agents
at one moment), then, for every KEY at once, does what the resuming guide
says: ``load`` the key, open a ``CheckpointWriter`` with ``resume_from=``
what it loaded (None for a new session), append ``TURNS`` messages
``NAME: i``, each followed by ``write_now()``, and close.  Between the
load and the writer's first write it waits a random moment, as a person
does before the first turn.  It prints one JSON
line: per key, every result and the messages it ended with.
"""

from __future__ import annotations

import json
import random
import sys

import anyio

from checkpointer import CheckpointError, CheckpointWriter, Limits, Result, Snapshot, load
from checkpointer.stores import Store

from .conflict_child import make_store


def described(result: Result) -> str:
    return type(result).__name__ + ":" + str(getattr(result, "reason", ""))


async def main(spec: str, name: str, turns: int, keys: list[str]) -> None:
    await anyio.to_thread.run_sync(sys.stdin.readline)
    store = make_store(spec)
    ran: dict[str, object] = {}
    async with anyio.create_task_group() as tg:
        for key in keys:
            tg.start_soon(session, store, key, name, turns, ran)
    sys.stdout.write(json.dumps(ran) + "\n")
    close = getattr(store, "close", None)
    if callable(close):
        close()


async def session(store: Store, key: str, name: str, turns: int, ran: dict[str, object]) -> None:
    try:
        loaded = await anyio.to_thread.run_sync(load, store, key)
    except CheckpointError:
        loaded = None  # unreadable: start afresh, as the resuming guide says
    # A person reads, thinks, types: the first write comes a while after the load.
    await anyio.sleep(random.uniform(0.0, 0.3))
    messages: list[str] = [] if loaded is None else loaded.state["messages"]
    results: list[str] = []
    writer = CheckpointWriter(
        lambda: Snapshot(key, {"messages": messages}),
        store,
        debounce=0.01,
        min_interval=0.0,
        max_wait=0.05,
        limits=Limits(retry_initial=0.01, retry_max=0.05),
        resume_from=loaded,
    )
    async with writer:
        for i in range(turns):
            messages.append(f"{name}: {i}")
            results.append(described(await writer.write_now()))
            await anyio.sleep(0.01)
    last = writer.statistics().last_result
    assert last is not None
    results.append(described(last))
    ran[key] = {"results": results, "messages": messages}


if __name__ == "__main__":
    spec, name, turns, *keys = sys.argv[1:]
    anyio.run(main, spec, name, int(turns), keys)
