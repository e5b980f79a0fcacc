"""An agent session kept in a journal: checkpoints cost what changed.

Run from the repository root: ``python examples/journal_session.py [--root DIR]``.

The messages are frozen msgspec Structs of strings, so each is encoded once;
each checkpoint appends the new messages to ``<root>/demo-journal.jsonl``.
When the agent compacts its history, the journal gets a compaction row.
"""

from __future__ import annotations

import argparse
import tempfile

import anyio
import msgspec

from checkpointer import CheckpointWriter, JournalStore, Snapshot, load


class Message(msgspec.Struct, frozen=True):
    role: str
    content: str


class Session(msgspec.Struct):
    title: str
    messages: list[Message]


async def run(root: str) -> None:
    session = Session(title="demo", messages=[])
    store = JournalStore(root)

    def source() -> Snapshot:
        return Snapshot("demo-journal", session)

    async with CheckpointWriter(source, store, exit_hooks=False) as writer:
        for turn in range(20):
            session.messages.append(Message("user", f"question {turn}"))
            session.messages.append(Message("assistant", f"answer {turn}"))
            writer.notify()
            if turn % 5 == 4:
                print(await writer.write_now())  # nbytes: only the new rows
            if turn == 14:  # the agent summarises its history: a compaction row
                session.messages[:-2] = [Message("system", "summary of turns 0-13")]
    checkpoint = load(store, "demo-journal", Session)
    assert checkpoint is not None
    assert checkpoint.state == session
    stats = store.statistics("demo-journal")
    print(f"loaded {len(checkpoint.state.messages)} messages, seq {checkpoint.meta.seq}")
    print(f"appends {stats.appends}, compactions {stats.compactions}, size {stats.size} bytes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", help="the journal directory (default: a new temp dir)")
    root = parser.parse_args().root or tempfile.mkdtemp(prefix="journal-")
    anyio.run(run, root)


if __name__ == "__main__":
    main()
