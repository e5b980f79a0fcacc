"""Resume an agent session that an earlier run of this script checkpointed.

Run it twice (the session is kept in ``.checkpoints`` unless ``--root`` says
otherwise)::

    python examples/resume_session.py
    python examples/resume_session.py

The first run starts a session and stops in the middle of a tool call (the
tool is still running, another call has no result yet).  The writer's
``transcript=Transcript()`` writes that history repaired, so the file is a
session a model API accepts.  Every later run loads it, checks it is
sendable, collapses the older part into a summary checkpoint, builds the
context to send (the summary, then the tail), and goes on for a few turns.

The "model" and the "tools" are simulated, so it runs offline.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import anyio

from checkpointer import CheckpointWriter, FileStore, Snapshot, Transcript, load
from checkpointer.messages import validate_history
from checkpointer.summaries import SummaryFailed, collapse, load_summary, resume_context


class Session:
    """The live session: chat-completions style messages, as plain dicts."""

    def __init__(self, key: str, messages: list[dict[str, Any]]) -> None:
        self.key = key
        self.messages = messages

    def snapshot(self) -> Snapshot:
        return Snapshot(self.key, {"messages": self.messages})

    def turn(self, n: int, *, stop_mid_tool: bool = False) -> None:
        """One turn: a question, a model call with two tools, results, an answer."""
        calls = [f"call_{n}_{i}" for i in range(2)]
        self.messages.append({"role": "user", "content": f"question {n}"})
        self.messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": c, "type": "function", "function": {"name": "search", "arguments": "{}"}}
                    for c in calls
                ],
            }
        )
        if stop_mid_tool:  # the first tool is running, the second has not started
            self.messages.append(
                {"role": "tool", "tool_call_id": calls[0], "content": "", "status": "running"}
            )
            return
        for c in calls:
            self.messages.append({"role": "tool", "tool_call_id": c, "content": f"found {c}"})
        self.messages.append({"role": "assistant", "content": f"answer {n}"})


def summarize(messages: list[dict[str, Any]]) -> str:
    """The caller's summarizer (a model call, in real life)."""
    questions = [m["content"] for m in messages if m["role"] == "user"]
    return "The user asked:\n" + "\n".join(f"- {q}" for q in questions)


async def main(root: str, key: str) -> int:
    store = FileStore(root)
    previous = load(store, key)
    if previous is None:
        print(f"new session {key!r}")
        session = Session(key, [])
        start, stop_mid_tool = 0, True
    else:
        messages = previous.state["messages"]
        meta = previous.meta
        print(
            f"resumed {key!r}: {len(messages)} messages, seq {meta.seq}, turns {meta.turns}, "
            f"created {meta.created_at.isoformat()}"
        )
        problems = validate_history(messages)
        if problems:
            print("not sendable:", "; ".join(p.describe("$.messages") for p in problems))
            return 1
        print("history is sendable")
        outcome = await collapse(summarize, store, key, messages, keep_last=6)
        if isinstance(outcome, SummaryFailed):
            print(f"could not collapse: {outcome.error}")
            return 1
        summary = outcome if outcome is not None else load_summary(store, key)
        context = resume_context(messages, summary)
        if summary is not None:
            print(f"collapsed messages before {summary.watermark} into a summary")
        print(f"context for the model: {len(context)} messages")
        session = Session(key, messages)
        start, stop_mid_tool = sum(m["role"] == "user" for m in messages), False

    async with CheckpointWriter(
        session.snapshot,
        store,
        transcript=Transcript(),  # repaired copies, validated histories, each message once
        resume_from=previous,  # what load() found (None: a new session)
        debounce=0.05,
        exit_hooks=True,
    ) as writer:
        for n in range(start, start + 3):
            session.turn(n, stop_mid_tool=stop_mid_tool and n == start + 2)
            writer.notify()
    stats = writer.statistics()  # after the final write on close
    print(
        f"{len(session.messages)} messages in memory; on disk, {stats.repaired} tool call(s) "
        f"closed and {stats.settled} running tool(s) settled"
    )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=".checkpoints", help="store directory (%(default)s)")
    parser.add_argument("--key", default="example-session", help="session key (%(default)s)")
    parser.add_argument(
        "--backend", choices=["asyncio", "trio"], default="asyncio", help="(%(default)s)"
    )
    args = parser.parse_args()
    sys.exit(anyio.run(main, args.root, args.key, backend=args.backend))
