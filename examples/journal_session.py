"""An agent session kept in a journal: checkpoints cost what changed.

Run from the repository root, twice: ``python examples/journal_session.py``.

The messages are frozen msgspec Structs of strings, so each is encoded once;
each checkpoint appends the new messages to ``<root>/<key>.jsonl``
(``.checkpoints/demo-journal.jsonl`` by default).  When the agent compacts
its history (every 15th turn), the journal gets a compaction row.  A rerun
resumes the session from the journal and goes on from its last turn;
``--fresh`` starts over.

Like the other examples it keeps the writer's exit hooks (the default): on
``kill`` (SIGTERM) or SIGHUP the hooks write the session a final time; on
Ctrl-C the ``async with`` unwinds, its final write runs, and the script says
so and exits with status 130.

    python examples/journal_session.py --turns 3000000   # press Ctrl-C, run it again
"""

from __future__ import annotations

import argparse
import os
import sys

import anyio
import msgspec

from checkpointer import CheckpointWriter, JournalStore, Snapshot, load


class Message(msgspec.Struct, frozen=True):
    role: str
    content: str


class Session(msgspec.Struct):
    title: str
    messages: list[Message]
    turns: int = 0  # turns done, across runs


async def run(root: str, key: str, turns: int) -> None:
    store = JournalStore(root)
    previous = load(store, key, Session)
    session = previous.state if previous else Session(title="demo", messages=[])
    if previous:
        print(f"resumed {key!r} at turn {session.turns} ({len(session.messages)} messages)")

    def source() -> Snapshot:
        return Snapshot(key, session)

    async with CheckpointWriter(source, store, resume_from=previous) as writer:
        for turn in range(session.turns, session.turns + turns):
            session.messages.append(Message("user", f"question {turn}"))
            session.messages.append(Message("assistant", f"answer {turn}"))
            session.turns = turn + 1
            writer.notify()
            if turn % 5 == 4:
                print(await writer.write_now())  # nbytes: only the new rows
            if turn % 15 == 14:  # the agent summarises its history: a compaction row
                summary = Message("system", f"summary of turns 0-{turn - 1}")
                session.messages[:-2] = [summary]
    checkpoint = load(store, key, Session)
    assert checkpoint is not None
    assert checkpoint.state == session
    stats = store.statistics(key)
    print(f"loaded {len(checkpoint.state.messages)} messages, seq {checkpoint.meta.seq}")
    print(f"appends {stats.appends}, compactions {stats.compactions}, size {stats.size} bytes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=".checkpoints", help="store directory (%(default)s)")
    parser.add_argument("--key", default="demo-journal", help="session key (%(default)s)")
    parser.add_argument("--turns", type=int, default=20, help="turns this run (%(default)s)")
    parser.add_argument("--fresh", action="store_true", help="delete the journal first")
    args = parser.parse_args()
    if args.fresh:
        path = os.path.join(args.root, args.key + JournalStore.suffix)
        if os.path.exists(path):
            os.remove(path)
    try:
        anyio.run(run, args.root, args.key, args.turns)
    except* KeyboardInterrupt:  # the writer's final write ran as `async with` unwound
        print("interrupted: the session is on disk; run again to resume", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
