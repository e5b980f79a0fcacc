"""Case ``adapters``: each framework adapter against the framework's own persistence.

The same scripted run for both, on asyncio with the frameworks' offline
models (``benchmarks/_models.py``): a session prefilled with a
history, then turns of one tool call each.

* OpenAI Agents SDK: ``CheckpointSession`` on a ``JournalStore`` vs the SDK's
  ``SQLiteSession`` on a file;
* LangGraph: ``CheckpointSaver`` on a ``JournalStore`` vs LangGraph's
  ``AsyncSqliteSaver`` (``langgraph-checkpoint-sqlite``), durability
  ``"async"`` (LangGraph's default) for both;
* pydantic-ai: ``CheckpointConversationStore`` on a ``JournalStore`` vs
  pydantic-ai's ``InMemoryConversationStore`` with the conversation dumped
  to a file (``ConversationTypeAdapter``, atomic and fsynced) after each run.

The Agents SDK's run is also made with a session that keeps a list (the
SDK's own work, nothing stored): the floor of its stall.  Each run starts
after a full GC pass, so that a pass due from the runs before lands in none.

The Agents SDK adapter is also timed alone at 100 and 100,000 items
(``sizes``): one ``add_items`` of one item with ``durability="sync"``
(encode, append, fsync) and one ``get_items()``, each with the worst lag of
a 1 ms ticker beside it, then the lag of the caller dropping the items
``get_items()`` returned (freeing 100,000 dicts: any session's); the two
sessions interleaved.  Bar: a write at 100,000 items within 2x of one at 100.

Figures: bytes the process passed to write(2) during the turns
(``/proc/self/io``), the worst lag of a 1 ms ticker (the event-loop stall),
wall time per turn, and the longest a change waited before it was durable
(ours: the longest stretch the writer reported pending changes, polled each
tick; the peers write inside the call, so their wait is the longest call).
Bars: fewer bytes and less stall than each peer; a wait within the writer's
``max_wait`` plus one second.
"""

from __future__ import annotations

import gc
import math
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import msgspec

from ._harness import Cell, Report, Table, bytes_written, ratio, scratch_dir, stat, ticking

MAX_WAIT = 5.0  # the writer's default


class _Wait:
    """The longest stretch some writer had changes pending, sampled every tick."""

    def __init__(self) -> None:
        self.writers: list[Any] = []
        self.since: float | None = None
        self.longest = 0.0

    def sample(self) -> None:
        pending = any(w.statistics().pending for w in self.writers)
        now = time.perf_counter()
        if pending and self.since is None:
            self.since = now
        elif not pending and self.since is not None:
            self.longest = max(self.longest, now - self.since)
            self.since = None

    async def run(self) -> None:
        while True:
            self.sample()
            await anyio.sleep(0.001)


class _Timed:
    """The longest call of a peer's durable write (it is durable when it returns)."""

    def __init__(self) -> None:
        self.longest = 0.0

    async def __call__(self, call: Awaitable[Any]) -> Any:
        t0 = time.perf_counter()
        try:
            return await call
        finally:
            self.longest = max(self.longest, time.perf_counter() - t0)


def _wchar() -> int | None:
    """``bytes_written()``, read twice if the first read fails (None: not measured)."""
    value = bytes_written()
    return bytes_written() if value is None else value


_turns_done: list[float] = []  # perf_counter when the last turn returned (not the final flush)


async def _measure(turns: int, run: Callable[[], Awaitable[float]]) -> dict[str, float]:
    # A full GC pass (~150 ms over this process's heap) falls in whichever run
    # crosses its threshold, debt of the runs before included: each run starts
    # with none, and a pass its own allocations call for still counts.
    t0 = time.thread_time()
    gc.collect()
    full_gc = time.thread_time() - t0
    async with ticking() as ticker:
        mark = ticker.mark()
        before = _wchar()
        t0 = time.perf_counter()
        _turns_done.clear()
        wait = await run()
        wall = (_turns_done[-1] if _turns_done else time.perf_counter()) - t0
        after = _wchar()
        written = math.nan if before is None or after is None else after - before
        lags = ticker.since(mark)
    return {
        "bytes": float(written),
        "stall": max(lags, default=0.0),
        "turn": wall / turns,
        "wait": wait,
        "full gc": full_gc,
    }


# -- OpenAI Agents SDK ----------------------------------------------------------------


def _history(n: int) -> list[dict[str, Any]]:
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " + "x" * 200}
        for i in range(n)
    ]


class _ListSession:
    """An Agents SDK session that keeps its items in a list: the SDK's own work, no persistence."""

    session_settings = None

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.items: list[Any] = []

    async def get_items(self, limit: int | None = None) -> list[Any]:
        return self.items[-limit:] if limit else self.items[:]

    async def add_items(self, items: list[Any]) -> None:
        self.items += items

    async def pop_item(self) -> Any:
        return self.items.pop() if self.items else None

    async def clear_session(self) -> None:
        self.items = []


async def _openai(root: str, history: int, turns: int, side: str) -> dict[str, float]:
    from agents import Runner
    from agents.memory import SQLiteSession

    from checkpointer import JournalStore
    from checkpointer.openai_agents import CheckpointSession

    from ._models import openai_agent

    agent = openai_agent()
    if side == "floor":
        floor = _ListSession("chat")
        await floor.add_items(_history(history))

        async def run_floor() -> float:
            for turn in range(turns):
                await Runner.run(agent, f"turn {turn}", session=floor)  # type: ignore[arg-type]
            return 0.0

        return await _measure(turns, run_floor)
    if side == "ours":
        async with CheckpointSession("chat", JournalStore(root), durability="sync") as session:
            await session.add_items(_history(history))  # type: ignore[arg-type]
        async with CheckpointSession("chat", JournalStore(root)) as session:
            wait = _Wait()
            wait.writers.append(session.writer)

            async def run_ours() -> float:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(wait.run)
                    for turn in range(turns):
                        await Runner.run(agent, f"turn {turn}", session=session)
                    _turns_done.append(time.perf_counter())
                    while session.writer.statistics().pending:  # noqa: ASYNC110 -- no event to wait on
                        await anyio.sleep(0.001)
                    wait.sample()
                    # The write begun is not yet counted in the bytes: wait for it (nothing
                    # changed since, so this writes nothing more).
                    await session.writer.write_now()
                    tg.cancel_scope.cancel()
                return wait.longest

            return await _measure(turns, run_ours)
    peer = SQLiteSession("chat", os.path.join(root, "sessions.db"))
    await peer.add_items(_history(history))  # type: ignore[arg-type]
    timed = _Timed()
    add = peer.add_items

    async def add_timed(items: Any) -> None:
        await timed(add(items))

    peer.add_items = add_timed  # type: ignore[method-assign]

    async def run_peer() -> float:
        for turn in range(turns):
            await Runner.run(agent, f"turn {turn}", session=peer)
        return timed.longest

    try:
        return await _measure(turns, run_peer)
    finally:
        peer.close()


async def _openai_sizes(root: str, sizes: tuple[int, ...], repeats: int) -> dict[str, Any]:
    """Per size: the wall time and worst ticker lag of a one-item write and of get_items."""
    from checkpointer import JournalStore
    from checkpointer.openai_agents import CheckpointSession

    out: dict[str, Any] = {f"{what}/{n}": [] for n in sizes for what in _SIZE_FIGURES}
    store = JournalStore(root)
    sessions = [CheckpointSession(f"chat-{n}", store, durability="sync") for n in sizes]
    for n, session in zip(sizes, sessions, strict=True):
        async with session:
            await session.add_items(_history(n))  # type: ignore[arg-type]
    item = {"type": "function_call_output", "call_id": "c", "output": "x" * 100}
    async with ticking() as ticker:
        for session in sessions:
            await session.__aenter__()
        try:
            for round_ in range(repeats):
                for n, session in zip(sizes, sessions, strict=True):
                    for what in ("write", "get_items"):
                        if what == "get_items" and round_ % 5:
                            continue  # a run start: fewer of them than writes
                        mark = ticker.mark()
                        t0 = time.perf_counter()
                        got = None
                        if what == "write":
                            await session.add_items([item])  # type: ignore[list-item]
                        else:
                            got = await session.get_items()
                        out[f"{what}/{n}"].append(time.perf_counter() - t0)
                        await anyio.sleep(0.003)  # the ticker's lag of this call lands
                        out[f"{what} stall/{n}"].append(max(ticker.since(mark), default=0.0))
                        if got is not None:  # the caller lets the items go: its stall
                            mark = ticker.mark()
                            del got
                            await anyio.sleep(0.003)
                            out[f"freed stall/{n}"].append(max(ticker.since(mark), default=0.0))
        finally:
            for session in sessions:
                await session.aclose()
    return out


_SIZE_FIGURES = ("write", "write stall", "get_items", "get_items stall", "freed stall")


# -- LangGraph --------------------------------------------------------------------


async def _langgraph(root: str, history: int, turns: int, side: str) -> dict[str, float]:
    from langchain_core.messages import AIMessage, HumanMessage

    from checkpointer import JournalStore
    from checkpointer.langgraph import CheckpointSaver

    from ._models import CONFIG, langgraph_graph

    prefill = [
        HumanMessage(m["content"]) if m["role"] == "user" else AIMessage(m["content"])
        for m in _history(history)
    ]

    async def drive(saver: Any) -> None:
        graph = langgraph_graph(saver)
        for turn in range(turns):
            await graph.ainvoke({"messages": [HumanMessage(f"turn {turn}")]}, CONFIG)

    if side == "ours":
        async with CheckpointSaver(JournalStore(root)) as saver:
            await langgraph_graph(saver).aupdate_state(CONFIG, {"messages": prefill})
            wait = _Wait()

            async def run_ours() -> float:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(wait.run)
                    await drive(saver)
                    _turns_done.append(time.perf_counter())
                    wait.writers = _lg_writers(saver)
                    while any(w.statistics().pending for w in wait.writers):  # noqa: ASYNC110
                        await anyio.sleep(0.001)
                    wait.sample()
                    tg.cancel_scope.cancel()
                return wait.longest

            # Writers appear at the first put: watch them from the prefill on.
            wait.writers = _lg_writers(saver)
            return await _measure(turns, run_ours)
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    async with AsyncSqliteSaver.from_conn_string(os.path.join(root, "graph.db")) as peer:
        await langgraph_graph(peer).aupdate_state(CONFIG, {"messages": prefill})
        timed = _Timed()
        aput = peer.aput

        async def aput_timed(*args: Any) -> Any:
            return await timed(aput(*args))

        peer.aput = aput_timed

        async def run_peer() -> float:
            await drive(peer)
            return timed.longest

        return await _measure(turns, run_peer)


# -- pydantic-ai --------------------------------------------------------------------


async def _pydantic(root: str, history: int, turns: int, side: str) -> dict[str, float]:
    from pydantic_ai.conversation import Conversation, ConversationTypeAdapter
    from pydantic_ai.conversation_store import InMemoryConversationStore
    from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart

    from checkpointer import JournalStore
    from checkpointer.pydantic_ai import CheckpointConversationStore

    from ._models import pydantic_agent

    agent = pydantic_agent()
    prefill: list[Any] = []
    for m in _history(history):
        if m["role"] == "user":
            prefill.append(ModelRequest(parts=[UserPromptPart(m["content"])]))
        else:
            prefill.append(ModelResponse(parts=[TextPart(m["content"])]))
    timed = _Timed()
    if side == "ours":
        async with CheckpointConversationStore(JournalStore(root)) as store:
            await store.save(Conversation(conversation_id="chat", messages=prefill))

            async def run_ours() -> float:
                conversation = await store.load("chat")
                for turn in range(turns):
                    result = await agent.run(f"turn {turn}", conversation=conversation)
                    await timed(store.save(result))
                    conversation = result.conversation
                return timed.longest

            return await _measure(turns, run_ours)
    memory = InMemoryConversationStore()
    path = os.path.join(root, "chat.json")

    def dump(conversation: Any) -> None:
        data = ConversationTypeAdapter.dump_json(conversation)
        with open(path + ".tmp", "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)
        fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    async def save_and_dump(result: Any) -> None:
        await memory.save(result)
        dump(result.conversation)

    await memory.save(Conversation(conversation_id="chat", messages=prefill))

    async def run_peer() -> float:
        conversation = await memory.load("chat")
        for turn in range(turns):
            result = await agent.run(f"turn {turn}", conversation=conversation)
            await timed(save_and_dump(result))
            conversation = result.conversation
        return timed.longest

    return await _measure(turns, run_peer)


_CASES = {
    "openai-agents": (_openai, "SQLiteSession"),
    "langgraph": (_langgraph, "AsyncSqliteSaver"),
    "pydantic-ai": (_pydantic, "in-memory store saved per run"),
}


# The framework's own work with no persistence: what a turn stalls the loop anyway.
_FLOORS = {"openai-agents": "SDK alone (a list, nothing stored)"}


def _run(kind: str, history: int, turns: int, side: str) -> dict[str, float]:
    """One run of ``kind``; ``side``: "ours", "peer" or "floor"."""
    case, _ = _CASES[kind]
    with scratch_dir(f"adapters-{kind}-") as root:
        return anyio.run(case, root, history, turns, side)


def main(quick: bool) -> dict[str, Any]:
    """One table per framework, and the bars; a ``Report`` as a dict."""
    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
    history, turns, repeats = (100, 3, 1) if quick else (2000, 20, 3)
    report = Report(title="Framework adapters vs each framework's own persistence")
    for kind, (_, peer_name) in _CASES.items():
        try:
            # A framework's first run in a process builds its schemas (hundreds of
            # ms on the loop): pay it once, for neither side.
            sides = ["ours", "peer", *(["floor"] if kind in _FLOORS else [])]
            for side in sides:
                _run(kind, 2, 1, side)
            runs = [[_run(kind, history, turns, side) for side in sides] for _ in range(repeats)]
            ours, peer, *floor = (_median([run[at] for run in runs]) for at in range(len(sides)))
        except ImportError as exc:
            report.notes.append(f"{kind}: not run ({exc})")
            continue
        report.tables.append(
            Table(
                title=(
                    f"{kind}: {turns} turns with a tool call, after {history} messages "
                    f"(medians of {repeats})"
                ),
                columns=["persistence", "bytes written", "worst stall", "time per turn", "wait"],
                rows=[
                    [f"checkpointer ({kind})", *(_cells(ours))],
                    [peer_name, *(_cells(peer))],
                    *([_FLOORS[kind], *_cells(run)] for run in floor),
                ],
            )
        )
        report.notes.append(
            f"{kind}: a full GC pass over this process's heap took "
            f"{ours['full gc'] * 1e3:.0f} ms of CPU (done before each run)"
        )
        if floor:
            report.ratios.append(
                ratio(
                    f"{kind}: worst stall checkpointer / {_FLOORS[kind]}",
                    ours["stall"] / floor[0]["stall"] if floor[0]["stall"] else None,
                    note=f"the framework's own steps with nothing stored; "
                    f"{ours['stall'] * 1e3:.1f} ms vs {floor[0]['stall'] * 1e3:.1f} ms",
                )
            )
        report.ratios += [
            ratio(
                f"{kind}: bytes checkpointer / {peer_name}", ours["bytes"] / peer["bytes"], "<", 1
            ),
            ratio(
                f"{kind}: worst stall checkpointer / {peer_name}",
                ours["stall"] / peer["stall"] if peer["stall"] else None,
                "<",
                1,
                note=f"{ours['stall'] * 1e3:.1f} ms vs {peer['stall'] * 1e3:.1f} ms",
            ),
            ratio(
                f"{kind}: longest wait to disk (s), bound max_wait + 1",
                ours["wait"],
                "<=",
                MAX_WAIT + 1,
            ),
        ]
    _report_sizes(report, quick)
    return msgspec.to_builtins(report)  # type: ignore[no-any-return]


def _report_sizes(report: Report, quick: bool) -> None:
    """The Agents SDK adapter alone at a small and a large history."""
    sizes, repeats = ((100, 1_000), 5) if quick else ((100, 100_000), 40)
    try:
        with scratch_dir("adapters-sizes-") as root:
            figures = anyio.run(_openai_sizes, root, sizes, repeats)
    except ImportError as exc:
        report.notes.append(f"openai-agents sizes: not run ({exc})")
        return
    report.tables.append(
        Table(
            title="openai-agents: CheckpointSession on a JournalStore alone, by history length "
            "(add_items of one item, durability='sync'; get_items of all; freed: the "
            "caller dropping what get_items returned, as any session's items)",
            columns=["items", *_SIZE_FIGURES, "repeats"],
            rows=[
                [f"{n:,}", *(stat(figures[f"{w}/{n}"]) for w in _SIZE_FIGURES), repeats]
                for n in sizes
            ],
        )
    )
    small, large = (statistics.median(figures[f"write/{n}"]) for n in sizes)
    report.ratios.append(
        ratio(
            f"openai-agents: write @{sizes[1]:,} / @{sizes[0]:,} items",
            large / small,
            "<=",
            2,
            note="one item added: encoded once, its prefix checked by pointer",
        )
    )


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def _cells(figures: dict[str, float]) -> list[Cell]:
    return [
        f"{figures['bytes'] / 1024:.1f} KiB",
        f"{figures['stall'] * 1e3:.1f} ms",
        f"{figures['turn'] * 1e3:.1f} ms",
        f"{figures['wait'] * 1e3:.1f} ms",
    ]


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(main("--quick" in sys.argv), indent=1)[:20000])


def _lg_writers(saver: Any) -> list[Any]:
    """The writers open in a LangGraph saver's registry."""
    entries = saver._threads.registry._entries.values()
    return [entry.writer for entry in entries if entry.writer is not None]
