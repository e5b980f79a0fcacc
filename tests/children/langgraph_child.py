"""LangGraph agents in processes of their own, for ``tests/adapters/test_langgraph_owners.py``.

    python -m tests.children.langgraph_child serve STORE THREAD [IDLE_TIMEOUT]
    python -m tests.children.langgraph_child race STORE ROOT REPEATS [AT_ONCE]
    python -m tests.children.langgraph_child many ROOT N
    python -m tests.children.langgraph_child zygote FD

``STORE`` is ``file``, ``journal``, ``unlocked-file`` or ``unlocked-journal``
(a store of one's own that forwards every method but ``lock()``: it fences
its writes, and a live writer does not keep a delete out); with ``serve``
it is followed by ``:ROOT``.  The graph is ``adapter_child.langgraph_graph``:
plain LangGraph nodes, no network; a turn adds four messages.

``serve`` keeps one ``CheckpointSaver`` open (``async with``) on thread
``THREAD``, prints ``{"step": "ready", "pid": ...}``, then follows its
stdin, one command a line, and answers each with one JSON line:

* ``turn TEXT``: one turn (``durability="sync"``): the messages after it,
  or the ``CheckpointFailed`` it raised (``reason``, ``error``);
* ``state``: the messages ``aget_state`` shows;
* ``delete``: ``adelete_thread``;
* ``idle``: wait until the saver's registry has closed every thread's writer
  (``IDLE_TIMEOUT``, seconds, is the saver's ``idle_timeout``);
* ``close``: leave the ``async with`` (what its exit raised, if anything).

``race`` imports LangGraph once, then for each repetition forks two agents,
``a`` and ``b``, on thread ``chat`` of ``ROOT/<n>``, released at the same
moment; ``AT_ONCE`` repetitions (default 1) run side by side, so their waits
overlap and each pair races under the others' load.  Each agent reads the
thread (a UI showing it), waits 0 to 0.2 s, plus 1 s half of the time (at
random), runs three turns (``"a-0"``...) and closes its saver, then prints
``{"rep": n, "name": ..., "turns": [...], "failed": ..., "started": t0,
"closed": t1}``: the turns that returned, the first ``CheckpointFailed`` (or
None), and when its first turn began and its saver had closed
(``time.monotonic()``: one clock for every process of the machine).

``zygote`` imports LangGraph and the saver once, then forks a ``serve``
agent for each request on the ``SOCK_SEQPACKET`` socket ``FD``: a JSON
``["spawn", [ARG, ...]]`` with two descriptors, the agent's stdin and
stdout, answered with its pid; ``["reap", PID]`` waits for that agent and
answers its exit code.  The tests' agents start in a moment, not an
interpreter's and LangGraph's start each: processes of their own all the same.

``many`` is a server under ``ulimit -n 1024``: one saver on the ``FileStore``
at ``ROOT``, threads ``t0`` ... ``t<N-1>`` one turn each (``"hi <i>"``,
``durability="sync"``: each thread's key taken as its run puts), 64 runs at a
time; then it closes the saver and prints the registry's statistics.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import random
import socket
import sys
import time
import traceback
from typing import Any

from checkpointer import CheckpointFailed, FileStore, JournalStore
from checkpointer.stores import Store

CONFIG: Any = {"configurable": {"thread_id": "chat"}}


class Unlocked:
    """A store of one's own around a FileStore or JournalStore, without ``lock()``."""

    def __init__(self, inner: Store) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name == "lock":
            raise AttributeError(name)
        return getattr(self._inner, name)


def make_store(kind: str, root: str) -> Any:
    inner = JournalStore(root) if kind.endswith("journal") else FileStore(root)
    return Unlocked(inner) if kind.startswith("unlocked-") else inner


def say(**fields: object) -> None:
    sys.stdout.write(json.dumps({"pid": os.getpid(), **fields}) + "\n")
    sys.stdout.flush()


def failure(exc: CheckpointFailed) -> dict[str, str]:
    return {"reason": exc.result.reason, "error": exc.result.error}


async def serve(spec: str, thread_id: str, idle_timeout: float) -> None:
    from langchain_core.messages import HumanMessage

    from checkpointer.langgraph import CheckpointSaver
    from tests.children.adapter_child import langgraph_graph

    kind, _, root = spec.partition(":")
    config: Any = {"configurable": {"thread_id": thread_id}}
    saver = CheckpointSaver(make_store(kind, root), idle_timeout=idle_timeout)
    await saver.__aenter__()
    graph = langgraph_graph(saver)
    say(step="ready")
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        command, _, text = line.strip().partition(" ")
        try:
            if command == "turn":
                inputs = {"messages": [HumanMessage(text)]}
                result = await graph.ainvoke(inputs, config, durability="sync")
                say(step="turn", messages=[m.content for m in result["messages"]])
            elif command == "state":
                state = await graph.aget_state(config)
                say(step="state", messages=[m.content for m in state.values.get("messages", [])])
            elif command == "idle":
                while saver._threads.registry.statistics().open:  # noqa: ASYNC110 -- a counter
                    await asyncio.sleep(0.01)
                say(step="idle")
            elif command == "delete":
                await saver.adelete_thread(thread_id)
                say(step="delete")
            elif command == "close":
                await saver.__aexit__(None, None, None)
                say(step="close")
                return
        except CheckpointFailed as exc:
            say(step=command, failed=failure(exc))
            if command == "close":
                return


async def race_agent(kind: str, root: str, name: str) -> dict[str, Any]:
    from langchain_core.messages import HumanMessage

    from checkpointer.langgraph import CheckpointSaver
    from tests.children.adapter_child import langgraph_graph

    turns: list[str] = []
    failed: dict[str, str] | None = None
    started = None
    try:
        async with CheckpointSaver(make_store(kind, root)) as saver:
            graph = langgraph_graph(saver)
            await graph.aget_state(CONFIG)
            # Often at once, often past the other's whole run (its close).
            await asyncio.sleep(random.uniform(0, 0.2) + random.choice((0.0, 1.0)))
            started = time.monotonic()
            for i in range(3):
                text = f"{name}-{i}"
                inputs = {"messages": [HumanMessage(text)]}
                await graph.ainvoke(inputs, CONFIG, durability="sync")
                turns.append(text)
    except CheckpointFailed as exc:
        failed = failure(exc)
    return {"turns": turns, "failed": failed, "started": started, "closed": time.monotonic()}


def race(kind: str, base: str, repeats: int, at_once: int = 1) -> None:
    import langgraph.graph  # noqa: F401 -- imported once, before the forks

    for first in range(0, repeats, at_once):
        pids: dict[int, int] = {}  # pid: repetition
        starts: list[int] = []  # their start pipes' write ends
        for rep in range(first, min(first + at_once, repeats)):
            start_r, start_w = os.pipe()
            for name in ("a", "b"):
                pids[_race_agent_forked(kind, base, rep, name, start_r, [*starts, start_w])] = rep
            os.close(start_r)
            starts.append(start_w)
        for start_w in starts:
            os.write(start_w, b"go")  # a repetition's two agents, released by one write
            os.close(start_w)
        for pid, rep in pids.items():
            _, status = os.waitpid(pid, 0)
            if os.waitstatus_to_exitcode(status) != 0:
                raise SystemExit(f"agent {pid} of repetition {rep} exited with {status}")


def _race_agent_forked(
    kind: str, base: str, rep: int, name: str, start_r: int, writers: list[int]
) -> int:
    """Fork agent ``name`` of repetition ``rep``: it waits for its start, runs, says how it went.

    ``writers``: the start pipes' write ends open here, closed in the agent."""
    pid = os.fork()
    if pid == 0:
        for start_w in writers:
            os.close(start_w)
        random.seed()  # not the parent's sequence: each agent waits its own time
        try:
            os.read(start_r, 1)
            root = os.path.join(base, str(rep))
            say(rep=rep, name=name, **asyncio.run(race_agent(kind, root, name)))
        finally:
            os._exit(0)
    return pid


async def many(root: str, n: int) -> None:
    import msgspec
    from langchain_core.messages import HumanMessage

    from checkpointer.langgraph import CheckpointSaver
    from tests._support import limit_descriptors
    from tests.children.adapter_child import langgraph_graph

    limit_descriptors()  # the saver's default max_open follows it
    ids = iter(range(n))
    saver = CheckpointSaver(FileStore(root))
    graph = langgraph_graph(saver)

    async def runs() -> None:  # a server's: many threads asked for at once
        for i in ids:
            config: Any = {"configurable": {"thread_id": f"t{i}"}}
            inputs = {"messages": [HumanMessage(f"hi {i}")]}
            await graph.ainvoke(inputs, config, durability="sync")

    async with saver:
        await asyncio.gather(*(runs() for _ in range(64)))
    say(step="done", **msgspec.to_builtins(saver._threads.registry.statistics()))


def zygote(fd: int) -> None:
    import langchain_core.messages  # noqa: F401 -- imported once, before the forks
    import langgraph.graph  # noqa: F401

    import checkpointer.langgraph  # noqa: F401
    import tests.children.adapter_child  # noqa: F401

    requests = socket.socket(fileno=fd)
    while True:
        message, fds, _, _ = socket.recv_fds(requests, 65536, 2)
        if not message:  # the test process let go of its end
            return
        what, arg = json.loads(message)
        if what == "spawn":
            pid = os.fork()
            if pid == 0:
                requests.close()
                _forked(arg, fds)
            for passed in fds:
                os.close(passed)
            requests.send(str(pid).encode())
        else:
            _, status = os.waitpid(arg, 0)
            requests.send(str(os.waitstatus_to_exitcode(status)).encode())


def _forked(argv: list[str], fds: list[int]) -> None:
    """In a forked agent: ``fds`` become stdin and stdout, ``argv`` runs, the process ends."""
    code = 1
    try:
        os.dup2(fds[0], 0)
        os.dup2(fds[1], 1)
        for passed in fds:
            os.close(passed)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 -- fresh buffers, not the zygote's
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.argv = [sys.argv[0], *argv]
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        atexit._run_exitfuncs()  # as the end of an interpreter would
        sys.stdout.flush()
        os._exit(code)


def main() -> None:
    if sys.argv[1] == "zygote":
        zygote(int(sys.argv[2]))
    elif sys.argv[1] == "serve":
        idle = float(sys.argv[4]) if len(sys.argv) > 4 else 300.0
        asyncio.run(serve(sys.argv[2], sys.argv[3], idle))
    elif sys.argv[1] == "many":
        asyncio.run(many(sys.argv[2], int(sys.argv[3])))
    else:
        at_once = int(sys.argv[5]) if len(sys.argv) > 5 else 1
        race(sys.argv[2], sys.argv[3], int(sys.argv[4]), at_once)


if __name__ == "__main__":
    main()
