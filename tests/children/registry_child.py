"""A server's ``SessionRegistry`` in a process of its own (``test_registry_processes.py``).

    python -m tests.children.registry_child COMMAND ROOT N BACKEND

Each key ``k<i>`` (``i < N``) of the ``FileStore`` at ``ROOT`` holds ``{"n": n}``.

* ``many``: under ``ulimit -n DESCRIPTORS``, at most ``MAX_OPEN`` open
  (``tests._support``), use every key once (``n`` + 1), 64 requests at a
  time, then close; print the registry's statistics as JSON.
* ``pydantic``: as ``many``, through a pydantic-ai ``CheckpointConversationStore``:
  conversation ``c<i>`` saved with one message ``hi <i>``.
* ``hold``: open every key (written ``n`` = 0), set ``n`` = 1 and notify with a
  debounce of an hour; print ``ready``; sleep (the test sends SIGTERM).
* ``fork``: open every key at ``n`` = 1, then a ``fork`` pool whose workers
  close their copy of the registry (and are terminated); check each key is
  still held, write ``n`` = 2, close; print ``ok``.
* ``reopen``: use ``k0`` (``n`` = 1), wait until it closes for idleness; print
  ``idle``; wait for a line on stdin (another process writes meanwhile); use
  it again (``n`` + 1), close; print what it resumed from.
"""

from __future__ import annotations

import json
import multiprocessing
import sys
import threading
from typing import Any

import anyio

from checkpointer import FileStore, SessionRegistry, Snapshot, load
from checkpointer.stores import KeyLocked
from tests._support import MAX_OPEN, limit_descriptors


class Server:
    def __init__(self, root: str, **options: Any) -> None:
        self.store = FileStore(root)
        self.n: dict[str, int] = {}
        self.registry = SessionRegistry(
            self.source, self.store, resume=self.resume, on_close=self.drop, **options
        )

    def source(self, key: str) -> Snapshot | None:
        return Snapshot(key, {"n": self.n[key]}) if key in self.n else None

    def resume(self, key: str) -> Any:
        checkpoint = load(self.store, key)
        self.n[key] = 0 if checkpoint is None else checkpoint.state["n"]
        return checkpoint

    def drop(self, key: str, _result: object) -> None:
        del self.n[key]

    async def bump(self, key: str) -> None:
        async with self.registry.session(key) as writer:
            self.n[key] += 1
            writer.notify()


async def many(root: str, n: int) -> None:
    limit_descriptors()
    options: dict[str, Any] = {"debounce": 3600.0, "max_wait": 3600.0, "max_open": MAX_OPEN}
    server = Server(root, **options)  # each open one holds its lock
    keys = iter(range(n))

    async def requests() -> None:  # a server's: many sessions asked for at once
        for i in keys:
            await server.bump(f"k{i}")

    async with server.registry, anyio.create_task_group() as tg:
        for _ in range(64):
            tg.start_soon(requests)
    print(json.dumps(msgspec_dict(server.registry.statistics())), flush=True)


def msgspec_dict(value: Any) -> dict[str, Any]:
    import msgspec

    return msgspec.to_builtins(value)  # type: ignore[no-any-return]


async def pydantic(root: str, n: int) -> None:
    from pydantic_ai.conversation import Conversation
    from pydantic_ai.messages import ModelRequest, UserPromptPart

    from checkpointer.pydantic_ai import CheckpointConversationStore

    limit_descriptors()
    keys = iter(range(n))

    async def requests() -> None:
        for i in keys:
            conversation = Conversation(conversation_id=f"c{i}")
            conversation.messages.append(ModelRequest(parts=[UserPromptPart(f"hi {i}")]))
            await conversations.save(conversation)

    async with CheckpointConversationStore(FileStore(root), max_open=MAX_OPEN) as conversations:
        async with anyio.create_task_group() as tg:
            for _ in range(64):
                tg.start_soon(requests)
        print(json.dumps(msgspec_dict(conversations._registry.statistics())), flush=True)


async def hold(root: str, n: int) -> None:
    server = Server(root, debounce=3600.0, max_wait=3600.0, max_open=n)
    await server.registry.__aenter__()
    for i in range(n):
        await server.bump(f"k{i}")
    print("ready", flush=True)
    await anyio.sleep_forever()


def _in_worker(_: int) -> str:
    """A pool worker's turn: use, then close, the registry it inherited (not its own)."""
    said: list[str] = []

    async def turn() -> None:
        try:
            async with SERVER.registry.session("k0"):
                said.append("opened")
        except RuntimeError as exc:
            said.append("refused" if "belongs to process" in str(exc) else str(exc))
        await SERVER.registry.aclose()

    # A thread of its own: the parent's event loop, copied by the fork, is not running here.
    done = threading.Thread(target=anyio.run, args=(turn,))
    done.start()
    done.join()
    return " ".join(said)


SERVER: Server


async def fork(root: str, n: int) -> None:
    global SERVER
    server = SERVER = Server(root, max_open=n)
    async with server.registry:
        for i in range(n):
            async with server.registry.session(f"k{i}") as writer:
                server.n[f"k{i}"] = 1
                await writer.write_now()
        pool = multiprocessing.get_context("fork").Pool(4)
        said = pool.map(_in_worker, range(8))
        assert said == ["refused"] * 8, said
        pool.terminate()
        pool.join()
        other = FileStore(root)
        for i in range(n):
            try:
                other.lock(f"k{i}", timeout=0).release()
            except KeyLocked:
                continue
            raise AssertionError(f"k{i} was let go by a forked child")
        for i in range(n):
            async with server.registry.session(f"k{i}") as writer:
                server.n[f"k{i}"] = 2
                await writer.write_now()
    print("ok", flush=True)


async def reopen(root: str) -> None:
    server = Server(root, idle_timeout=0.05)
    async with server.registry:
        await server.bump("k0")
        while server.registry.statistics().closed_idle == 0:  # noqa: ASYNC110 -- a counter
            await anyio.sleep(0.01)
        print("idle", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        async with server.registry.session("k0") as writer:
            print(f"resumed {server.n['k0']}", flush=True)
            server.n["k0"] += 1
            writer.notify()


def main(command: str, root: str, n: int, backend: str) -> None:
    if command == "many":
        anyio.run(many, root, n, backend=backend)
    elif command == "pydantic":
        anyio.run(pydantic, root, n, backend=backend)
    elif command == "hold":
        anyio.run(hold, root, n, backend=backend)
    elif command == "fork":
        anyio.run(fork, root, n, backend=backend)
    else:
        anyio.run(reopen, root, backend=backend)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
