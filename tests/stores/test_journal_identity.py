"""A journal deleted and made again by another process, in the same inode, at the same size.

ext4 gives a file made just after a delete the freed inode; a session of the
same shape has the same size.  A ``JournalStore`` that knew the old file
must see the new one as another file: its revision, not the old one's.
Each test repeats until the inode was reused at the same size a few times.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from checkpointer import CheckpointWriter, JournalStore, Snapshot, Written, load

# Another process: for each line "<root> <text>", delete k there and write a new session.
_OTHER = """
import sys
from checkpointer import CheckpointWriter, JournalStore, Snapshot
for line in sys.stdin:
    root, text = line.split()
    store = JournalStore(root)
    store.delete("k")
    messages = [{"role": "user", "content": text}]
    source = lambda: Snapshot("k", {"messages": messages})
    with CheckpointWriter(source, store, resume_from=None, exit_hooks=False):
        pass
    print(flush=True)
"""

WANTED = 3  # rounds with the inode reused at the same size
MAX_ROUNDS = 300

Rewrite = Callable[[Path, str], bool]


@pytest.fixture
def rewrite() -> Iterator[Rewrite]:
    """``rewrite(root, text)``: the other process writes k afresh; True if in the same inode
    at the same size."""
    other = subprocess.Popen(
        [sys.executable, "-c", _OTHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert other.stdin is not None and other.stdout is not None
    stdin, stdout = other.stdin, other.stdout

    def run(root: Path, text: str) -> bool:
        before = os.stat(root / "k.jsonl") if (root / "k.jsonl").exists() else None
        stdin.write(f"{root} {text}\n")
        stdin.flush()
        assert stdout.readline() == "\n", "the other process failed"
        after = os.stat(root / "k.jsonl")
        return before is not None and (before.st_ino, before.st_size) == (
            after.st_ino,
            after.st_size,
        )

    yield run
    stdin.close()
    assert other.wait() == 0
    stdout.close()


def _rounds(body: Callable[[Path], tuple[bool, Any]], tmp_path: Path) -> list[Any]:
    """Run ``body`` in fresh roots until WANTED rounds reused the inode; their bad outcomes."""
    bad, reused = [], 0
    for i in range(MAX_ROUNDS):
        same, wrong = body(tmp_path / str(i))
        reused += same
        if wrong is not None:
            bad.append(wrong)
        if reused >= WANTED:
            return bad
    pytest.skip(f"this filesystem reused the inode at the same size in {reused} of {i + 1} rounds")


def _messages(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_a_writer_returning_to_a_key_made_afresh_meanwhile_gets_a_conflict(
    tmp_path: Path, rewrite: Rewrite
) -> None:
    """Never an append onto the other process's new session, reported as Written."""

    def body(root: Path) -> tuple[bool, Any]:
        state: dict[str, Any] = {"key": "k", "messages": _messages("A-one")}
        writer = CheckpointWriter(
            lambda: Snapshot(state["key"], {"messages": list(state["messages"])}),
            JournalStore(root),
            resume_from=None,
            exit_hooks=False,
            write_on_start=False,
        )
        with writer:
            assert isinstance(writer.flush_sync("manual"), Written)
            state["key"] = "other"  # lets k's lock go
            assert isinstance(writer.flush_sync("manual"), Written)
            same = rewrite(root, "B-one")
            state["key"] = "k"
            state["messages"] = [*_messages("A-one"), *_messages("A-two")]
            result = writer.flush_sync("manual")
        checkpoint = load(JournalStore(root), "k")
        assert checkpoint is not None
        wrong = (result, checkpoint.state) if isinstance(result, Written) else None
        return same, wrong

    assert _rounds(body, tmp_path) == []


def test_resuming_from_a_fresh_load_of_a_key_made_afresh_writes(
    tmp_path: Path, rewrite: Rewrite
) -> None:
    """resume_from=load(store, k) on the store that wrote the old file: not a conflict."""

    def body(root: Path) -> tuple[bool, Any]:
        store = JournalStore(root)
        first = _messages("A-one")
        with CheckpointWriter(
            lambda: Snapshot("k", {"messages": first}), store, resume_from=None, exit_hooks=False
        ):
            pass
        same = rewrite(root, "B-one")
        checkpoint = load(store, "k")
        assert checkpoint is not None
        messages = [*checkpoint.state["messages"], *_messages("A-resumes")]
        with CheckpointWriter(
            lambda: Snapshot("k", {"messages": messages}),
            store,
            resume_from=checkpoint,
            exit_hooks=False,
            write_on_start=False,
        ) as writer:
            result = writer.flush_sync("manual")
        return same, None if isinstance(result, Written) else result

    assert _rounds(body, tmp_path) == []


def test_a_long_lived_reader_answers_the_new_revision(tmp_path: Path, rewrite: Rewrite) -> None:
    """``revision()`` (what adapters compare before serving a cached state) is the new one."""

    def body(root: Path) -> tuple[bool, Any]:
        rewrite(root, "one-1")
        reader = JournalStore(root)
        seen = reader.revision("k")
        same = rewrite(root, "two-2")
        checkpoint = load(JournalStore(root), "k")
        assert checkpoint is not None and checkpoint.meta.revision != seen
        answer = reader.revision("k")
        return same, None if answer == checkpoint.meta.revision else (seen, answer)

    assert _rounds(body, tmp_path) == []
