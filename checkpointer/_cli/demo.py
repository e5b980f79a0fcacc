"""``checkpointer demo``: a simulated agent loop checkpointed by a CheckpointWriter.

A fake agent runs turns; each turn ends several runs (the model, then tool
calls that finish in a burst), and each run end fires an event.  The writer
is attached to those events and coalesces them into a few durable writes.
Only the public API is used, as a user's loop would; its lines go through
``print_`` (``report.line`` by default).
"""

from __future__ import annotations

import argparse
import functools
import random
from collections.abc import Callable
from typing import Any

import anyio

from checkpointer import CheckpointWriter, FileStore, Snapshot, load

from . import report


def add_command(commands: Any) -> None:
    """Add ``demo`` to the parser's commands."""
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
    demo.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo as ``checkpointer demo`` asks (``--turns`` at least 1: else a usage error)."""
    if args.turns < 1:
        report.error("demo", "--turns must be at least 1")
        return report.USAGE
    demo = functools.partial(run_demo, args.root, key=args.key, turns=args.turns)
    status: int = anyio.run(demo, backend=args.backend)
    return status


class EventBus:
    """A minimal "run ended" event source with subscribe/unsubscribe."""

    def __init__(self) -> None:
        self._subscribers: list[Callable[..., None]] = []

    def subscribe(self, callback: Callable[..., None]) -> Callable[[], None]:
        self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback)

    def emit(self, event: str, **data: Any) -> None:
        for callback in list(self._subscribers):
            callback(event, **data)


class SimulatedAgent:
    """An agent session whose history grows by model turns and tool calls."""

    def __init__(self, key: str, bus: EventBus, rng: random.Random) -> None:
        self.key = key
        self.bus = bus
        self.rng = rng
        self.messages: list[dict[str, Any]] = []

    def snapshot(self) -> Snapshot:
        return Snapshot(self.key, {"messages": self.messages})

    async def turn(self, n: int, pause: float) -> int:
        """One user turn: a model call, a burst of tool calls, a final answer."""
        self.messages.append({"role": "user", "content": f"task {n}"})
        tools = self.rng.randint(2, 8)
        calls = [{"id": f"call_{n}_{i}", "name": "search"} for i in range(tools)]
        self.messages.append({"role": "assistant", "content": "", "tool_calls": calls})
        self.bus.emit("run_ended", run="model")
        await anyio.sleep(pause)
        for call in calls:  # tool runs finish in a burst, milliseconds apart
            self.messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": "result " * 20}
            )
            self.bus.emit("run_ended", run="tool")
            await anyio.sleep(pause / 50)
        self.messages.append({"role": "assistant", "content": f"answer {n}"})
        self.bus.emit("run_ended", run="model")
        await anyio.sleep(pause)
        return tools + 2


async def run_demo(
    root: str = ".checkpoints",
    *,
    key: str = "demo-session",
    turns: int = 40,
    pause: float = 0.02,
    print_: Callable[[str], None] = report.line,
) -> int:
    """Run the simulated agent; return 0 when the checkpoint on disk is whole."""
    store = FileStore(root)
    bus = EventBus()
    agent = SimulatedAgent(key, bus, random.Random(7))
    previous = load(store, key)
    if previous is not None:
        agent.messages = list(previous.state["messages"])
        print_(
            f"resumed {key!r} from {store.location(key)}: "
            f"{len(agent.messages)} messages, seq {previous.meta.seq}"
        )
    async with CheckpointWriter(
        agent.snapshot, store, debounce=0.05, min_interval=0.1, max_wait=0.5
    ) as writer:
        writer.attach(bus.subscribe)
        done = sum(1 for m in agent.messages if m.get("role") == "user")
        for n in range(done, done + turns):  # a resumed session numbers on
            await agent.turn(n, pause)
    stats = writer.statistics()
    checkpoint = load(store, key)
    ok = checkpoint is not None and checkpoint.state["messages"] == agent.messages
    print_(f"agent: {turns} turns, {stats.events} run-ended events")
    print_(
        f"writer: {stats.writes} writes ({stats.events / max(stats.writes, 1):.1f} events "
        f"per write), {stats.skipped} skipped as unchanged, {stats.failures} failed, "
        f"{stats.bytes_written / 1024:.1f} KiB written"
    )
    if checkpoint is not None:
        meta = checkpoint.meta
        print_(
            f"on disk: {store.location(key)}: {len(checkpoint.state['messages'])} messages, "
            f"seq {meta.seq}, live={meta.live}, created {meta.created_at:%Y-%m-%d %H:%M:%S}Z"
        )
    print_("checkpoint matches the session in memory" if ok else "MISMATCH: checkpoint differs")
    return 0 if ok else 1
