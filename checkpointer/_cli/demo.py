"""``checkpointer demo``: a simulated agent whose "run ended" events (each turn: the model,
then a burst of tool calls) a CheckpointWriter coalesces into a few durable writes.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from typing import Any

import anyio

from checkpointer import CheckpointWriter, FileStore, Snapshot, load

from . import report


def arguments(demo: argparse.ArgumentParser) -> None:
    demo.add_argument("--root", default=".checkpoints", help="store directory (%(default)s)")
    demo.add_argument("--key", default="demo-session", help="session key (%(default)s)")
    demo.add_argument("--turns", type=int, default=40, help="agent turns (%(default)s)")
    demo.add_argument(
        "--backend", choices=["asyncio", "trio"], default="asyncio", help="(%(default)s)"
    )


def run(args: argparse.Namespace) -> int:
    if args.turns < 1:
        report.error("demo", "--turns must be at least 1")
        return report.USAGE
    status: int = anyio.run(_demo, args, backend=args.backend)
    return status


class SimulatedAgent:
    """An agent session whose history grows by turns, firing "run ended" events."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.rng = random.Random(7)
        self.messages: list[dict[str, Any]] = []
        self.subscribers: list[Callable[..., None]] = []

    def subscribe(self, callback: Callable[..., None]) -> Callable[[], None]:
        self.subscribers.append(callback)
        return lambda: self.subscribers.remove(callback)

    def snapshot(self) -> Snapshot:
        return Snapshot(self.key, {"messages": self.messages})

    def emit(self, run: str) -> None:
        for callback in list(self.subscribers):
            callback("run_ended", run=run)

    async def turn(self, n: int, pause: float = 0.02) -> None:
        """One user turn: a model call, a burst of tool calls, a final answer."""
        self.messages.append({"role": "user", "content": f"task {n}"})
        calls = [{"id": f"call_{n}_{i}", "name": "search"} for i in range(self.rng.randint(2, 8))]
        self.messages.append({"role": "assistant", "content": "", "tool_calls": calls})
        self.emit("model")
        await anyio.sleep(pause)
        for call in calls:  # tool runs finish in a burst, milliseconds apart
            self.messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": "result " * 20}
            )
            self.emit("tool")
            await anyio.sleep(pause / 50)
        self.messages.append({"role": "assistant", "content": f"answer {n}"})
        self.emit("model")
        await anyio.sleep(pause)


async def _demo(args: argparse.Namespace) -> int:
    """Run the simulated agent; 0 when the checkpoint on disk is whole."""
    store, key, turns = FileStore(args.root), args.key, args.turns
    agent = SimulatedAgent(key)
    previous = load(store, key)
    if previous is not None:
        agent.messages = list(previous.state["messages"])
        report.line(
            f"resumed {key!r} from {store.location(key)}: "
            f"{len(agent.messages)} messages, seq {previous.meta.seq}"
        )
    async with CheckpointWriter(
        agent.snapshot, store, debounce=0.05, min_interval=0.1, max_wait=0.5
    ) as writer:
        writer.attach(agent.subscribe)
        done = sum(1 for m in agent.messages if m.get("role") == "user")
        for n in range(done, done + turns):  # a resumed session numbers on
            await agent.turn(n)
    stats = writer.statistics()
    checkpoint = load(store, key)
    ok = checkpoint is not None and checkpoint.state["messages"] == agent.messages
    report.line(f"agent: {turns} turns, {stats.events} run-ended events")
    report.line(
        f"writer: {stats.writes} writes ({stats.events / max(stats.writes, 1):.1f} events "
        f"per write), {stats.skipped} skipped as unchanged, {stats.failures} failed, "
        f"{stats.bytes_written / 1024:.1f} KiB written"
    )
    if checkpoint is not None:
        meta = checkpoint.meta
        report.line(
            f"on disk: {store.location(key)}: {len(checkpoint.state['messages'])} messages, "
            f"seq {meta.seq}, live={meta.live}, created {meta.created_at:%Y-%m-%d %H:%M:%S}Z"
        )
    said = "checkpoint matches the session in memory" if ok else "MISMATCH: checkpoint differs"
    report.line(said)
    return 0 if ok else 1
