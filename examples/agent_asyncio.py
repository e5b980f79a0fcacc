"""An agent loop on asyncio whose session is checkpointed as it goes.

Each turn: the user's task, a model call that asks for tools, the tools run
in parallel, a model call that answers.  Every model or tool run that ends
fires a "run ended" event; the writer is attached to those events and
coalesces each burst into one durable write.

    python examples/agent_asyncio.py                 # 20 turns into ./.checkpoints
    python examples/agent_asyncio.py --turns 100     # press Ctrl-C, then run it again

Run it again after Ctrl-C, ``kill`` or even ``kill -9``: it resumes where the
file says, finishing a turn whose tools were still running.  ``--fresh``
starts over.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from collections.abc import Callable
from typing import Any

from checkpointer import CheckpointWriter, FileStore, Snapshot, load

Message = dict[str, Any]
TOOLS = ("search", "read_file", "run_tests", "fetch_url")


def is_final(message: Message) -> bool:
    """An assistant message without tool calls ends a turn."""
    return message["role"] == "assistant" and not message.get("tool_calls")


def open_calls(messages: list[Message]) -> list[Message]:
    """The tool calls of the last assistant message that have no result yet."""
    answered: set[str] = set()
    for message in reversed(messages):
        if message["role"] == "tool":
            answered.add(message["tool_call_id"])
        elif message["role"] == "assistant":
            return [c for c in message.get("tool_calls", []) if c["id"] not in answered]
    return []


def next_turn(messages: list[Message]) -> int:
    """The turn to run next: an unfinished one, else the one after the last."""
    users = sum(1 for m in messages if m["role"] == "user")
    return users - 1 if messages and not is_final(messages[-1]) else users


class Agent:
    """A simulated agent: the transcript, and the runs that grow it."""

    def __init__(self, key: str, messages: list[Message], *, pause: float, max_tools: int):
        self.key = key
        self.messages = messages
        self.pause = pause
        self.max_tools = max_tools
        self._listeners: list[Callable[..., None]] = []

    def subscribe(self, callback: Callable[..., None]) -> Callable[[], None]:
        """The agent's "run ended" event source: what ``writer.attach`` wires to."""
        self._listeners.append(callback)
        return lambda: self._listeners.remove(callback)

    def _run_ended(self, run: str) -> None:
        for callback in list(self._listeners):
            callback(run)

    def snapshot(self) -> Snapshot:
        """The writer's source: called at write time, never per event."""
        return Snapshot(self.key, {"messages": self.messages})

    async def turn(self, n: int) -> None:
        """Run turn ``n`` from wherever the transcript stands in it."""
        rng = random.Random(f"{self.key}/{n}")  # the same turn plays the same way
        if not self.messages or is_final(self.messages[-1]):
            self.messages.append({"role": "user", "content": f"task {n}: look into issue #{n}"})
        if self.messages[-1]["role"] == "user":
            await asyncio.sleep(self.pause)  # the model thinks
            calls = [
                {"id": f"call_{n}_{i}", "name": rng.choice(TOOLS), "arguments": {"n": n}}
                for i in range(rng.randint(0, self.max_tools))
            ]
            plan: Message = {"role": "assistant", "content": f"working on task {n}"}
            if calls:
                plan["tool_calls"] = calls
            self.messages.append(plan)
            self._run_ended("model")
            if not calls:
                return
        async with asyncio.TaskGroup() as tools:  # parallel tools end in a burst
            for call in open_calls(self.messages):
                tools.create_task(self.tool(call))
        await asyncio.sleep(self.pause)
        self.messages.append({"role": "assistant", "content": f"done with task {n}"})
        self._run_ended("model")

    async def tool(self, call: Message) -> None:
        await asyncio.sleep(self.pause * random.Random(call["id"]).uniform(0.1, 1.0))
        result = f"{call['name']} found {len(call['id'])} things " * 8
        self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        self._run_ended("tool")


async def main(args: argparse.Namespace) -> int:
    store = FileStore(args.root)
    if args.fresh:
        store.delete(args.key)
    previous = load(store, args.key)
    messages: list[Message] = previous.state["messages"] if previous else []
    start = next_turn(messages)
    if previous is not None:
        pending = len(open_calls(messages))
        print(
            f"resumed {args.key!r} at turn {start} from {store.location(args.key)} "
            f"(seq {previous.meta.seq}, {len(messages)} messages"
            + (f", {pending} tool call(s) to run again)" if pending else ")"),
            flush=True,
        )
    if start >= args.turns:
        print(f"all {args.turns} turns are done already; --turns {start + 10} goes on")
        return 0
    agent = Agent(args.key, messages, pause=args.pause, max_tools=args.max_tools)
    async with CheckpointWriter(
        agent.snapshot,
        store,
        debounce=args.debounce,
        min_interval=args.min_interval,
        max_wait=args.max_wait,
        resume_from=previous,  # what load() found (None: a new session): never replace a newer one
    ) as writer:
        writer.attach(agent.subscribe)
        for n in range(start, args.turns):
            await agent.turn(n)
            stats = writer.statistics()
            print(f"turn {n} done: {stats.events} events so far, {stats.writes} writes", flush=True)
    stats = writer.statistics()
    print(
        f"coalesced {stats.events} run-ended events into {stats.writes} writes "
        f"({stats.events / max(stats.writes, 1):.1f} events per write, "
        f"{stats.skipped} skipped as unchanged)"
    )
    final = load(store, args.key)
    assert final is not None
    print(
        f"on disk: {store.location(args.key)}: seq {final.meta.seq}, "
        f"{len(final.state['messages'])} messages, live={final.meta.live}"
    )
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--root", default=".checkpoints", help="store directory (%(default)s)")
    parser.add_argument("--key", default="agent-asyncio", help="session key (%(default)s)")
    parser.add_argument("--turns", type=int, default=20, help="turns in all (%(default)s)")
    parser.add_argument("--max-tools", type=int, default=4, help="tools per turn (%(default)s)")
    parser.add_argument("--pause", type=float, default=0.3, help="seconds per model call")
    parser.add_argument("--debounce", type=float, default=0.5, help="(%(default)s s)")
    parser.add_argument("--min-interval", type=float, default=1.0, help="(%(default)s s)")
    parser.add_argument("--max-wait", type=float, default=5.0, help="(%(default)s s)")
    parser.add_argument("--fresh", action="store_true", help="delete the checkpoint first")
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse_args()
    try:
        sys.exit(asyncio.run(main(arguments)))
    except KeyboardInterrupt:  # the writer's final write ran as `async with` unwound
        print("interrupted: the session is on disk; run again to resume", file=sys.stderr)
        sys.exit(130)
