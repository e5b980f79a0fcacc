"""An Agents SDK session in another process, for ``tests/adapters/test_openai_agents.py``.

    python -m tests.children.session_child COMMAND STORE

``STORE`` is ``file:ROOT`` or ``journal:ROOT``; the session is ``"chat"``
(its key is ``"chat"`` too).  Each command prints one line per step:

* ``hold``: open a ``CheckpointSession`` (``durability="sync"``), add an
  item ``from-holder``, print ``open``, wait for a line on stdin, close.
* ``late``: open one with ``write_on_start=False`` (it loads, and holds
  nothing yet), print ``ready``, wait for a line on stdin, then run the
  agent one turn with the session (``durability="sync"``) and close;
  print ``written``, or ``failed REASON: ERROR``.
* ``clear``: open one, ``clear_session()``, close; print ``cleared``, or
  ``failed REASON: ERROR``.
* ``delete``: ``Store.delete("chat")``; print ``deleted``, or ``refused: ERROR``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")


def _store(spec: str) -> Any:
    from checkpointer import FileStore, JournalStore

    kind, root = spec.split(":", 1)
    return {"file": FileStore, "journal": JournalStore}[kind](root)


async def main(command: str, spec: str) -> None:
    from checkpointer.openai_agents import CheckpointFailed, CheckpointSession
    from checkpointer.stores import KeyLocked

    store = _store(spec)
    if command == "delete":
        try:
            store.delete("chat")
        except KeyLocked as exc:
            print(f"refused: {exc}", flush=True)
        else:
            print("deleted", flush=True)
        return
    try:
        if command == "hold":
            async with CheckpointSession("chat", store, durability="sync") as session:
                await session.add_items([{"role": "user", "content": "from-holder"}])
                print("open", flush=True)
                await asyncio.to_thread(sys.stdin.readline)
        elif command == "late":
            from agents import Runner  # imported only here: it takes seconds

            from tests.children.adapter_child import openai_agent

            session = CheckpointSession("chat", store, durability="sync", write_on_start=False)
            async with session:
                print("ready", flush=True)
                await asyncio.to_thread(sys.stdin.readline)
                await Runner.run(openai_agent(), f"from-{os.getpid()}", session=session)
            print("written", flush=True)
        else:
            async with CheckpointSession("chat", store) as session:
                await session.clear_session()
            print("cleared", flush=True)
    except CheckpointFailed as exc:
        print(f"failed {exc.result.reason}: {exc}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
