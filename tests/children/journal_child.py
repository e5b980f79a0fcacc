"""A child for ``tests/reliability/test_journal_kill.py``: checkpoints a journal until killed.

Run as ``python journal_child.py ROOT [--die-in PHASE --die-at N]``.  The
session (``Session`` below, deterministic: the parent replays it) gets a
batch of messages per step, an agent compaction every 7 steps and a new
title every 5; each step is one ``flush_sync`` into
``JournalStore(ROOT)``, with a rewrite threshold low enough that rewrites
are frequent.  After each checkpoint that returned ``Written`` (so it was
fsynced) the program prints ``seq N`` (flushed).

``--die-in PHASE --die-at N`` kills the process with SIGKILL: ``append``
halfway through the bytes of the N-th append (a torn tail); or in the N-th
rewrite at ``write`` (half the pieces written), ``fsync`` (all written, not
fsynced), ``replace`` (fsynced, not renamed) or ``dirsync`` (renamed,
directory not fsynced).
"""

from __future__ import annotations

import argparse
import os
import signal
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

import checkpointer._stores.atomic as atomic_module
import checkpointer._stores.journal.file as journal_module
from checkpointer import CheckpointWriter, JournalStore, Snapshot, Written

KEY = "s1"
BASE = 400
PER_STEP = 12
SIZE = 400
PHASES = ("append", "write", "fsync", "replace", "dirsync")


class Msg(msgspec.Struct, frozen=True):
    role: str
    content: str


class Session:
    """The session at step 0, advanced one step at a time."""

    def __init__(self) -> None:
        self.step = 0
        self.next_id = BASE
        self.messages = [self._message(i) for i in range(BASE)]
        self.state: dict[str, Any] = {"title": "t0", "messages": self.messages}

    @staticmethod
    def _message(i: int) -> Msg:
        return Msg("user" if i % 2 else "assistant", f"{i}:" + "x" * SIZE)

    def advance(self) -> None:
        self.step += 1
        for _ in range(PER_STEP):
            self.messages.append(self._message(self.next_id))
            self.next_id += 1
        if self.step % 7 == 0:
            self.messages[:10] = [Msg("system", f"summary at step {self.step}")]
        if self.step % 5 == 0:
            self.state["title"] = f"t{self.step}"

    def snapshot(self) -> Snapshot:
        return Snapshot(KEY, self.state)


def session_at(step: int) -> dict[str, Any]:
    """The state after ``step`` steps, as JSON values (what ``load`` returns)."""
    session = Session()
    for _ in range(step):
        session.advance()
    return msgspec.json.decode(msgspec.json.encode(session.state))  # type: ignore[no-any-return]


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _arm(phase: str, at: int) -> None:
    """Make the ``at``-th rewrite (or append) die at ``phase``."""
    names = vars(journal_module)  # the names the journal store imported, to wrap
    real_write_atomic: Callable[..., int] = names["write_atomic"]
    real_write_all = atomic_module.write_all
    count = 0

    def torn_append(fd: int, chunks: Sequence[bytes]) -> int:
        nonlocal count
        count += 1
        if count != at:
            return real_write_all(fd, chunks)
        data = b"".join(chunks)
        os.write(fd, data[: len(data) // 2])
        _die()
        return 0  # pragma: no cover - dead

    if phase == "append":
        names["write_all"] = torn_append
        return

    def dying_write_all(fd: int, chunks: Sequence[bytes]) -> int:
        half = len(chunks) // 2
        real_write_all(fd, chunks[:half])
        _die()
        return 0  # pragma: no cover - dead

    def die_on_call(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            _die()
            return real(*args, **kwargs)  # pragma: no cover - dead

        return call

    def write_atomic(path: str, chunks: Sequence[bytes], **kw: Any) -> int:
        nonlocal count
        count += 1
        if count != at:
            return real_write_atomic(path, chunks, **kw)
        if phase == "write":
            atomic_module.write_all = dying_write_all
            return real_write_atomic(path, chunks, **kw)
        if phase == "fsync":
            return real_write_atomic(path, chunks, fsync=die_on_call(os.fsync), **kw)
        if phase == "replace":
            return real_write_atomic(path, chunks, replace=die_on_call(os.replace), **kw)
        fsyncs = 0

        def fsync_file_then_die(fd: int) -> None:  # the second fsync is the directory's
            nonlocal fsyncs
            fsyncs += 1
            if fsyncs == 2:
                _die()
            os.fsync(fd)

        return real_write_atomic(path, chunks, fsync=fsync_file_then_die, **kw)

    names["write_atomic"] = write_atomic


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--die-in", choices=PHASES)
    parser.add_argument("--die-at", type=int, default=2)
    args = parser.parse_args(argv)
    if args.die_in:
        _arm(args.die_in, args.die_at)
    session = Session()
    store = JournalStore(args.root, rewrite_factor=1.3, rewrite_min_bytes=0)
    writer = CheckpointWriter(session.snapshot, store, exit_hooks=False)
    writer.open()  # the first checkpoint: seq 1, step 0
    print("seq 1", flush=True)
    while True:
        session.advance()
        result = writer.flush_sync()
        assert isinstance(result, Written), result
        print(f"seq {result.seq}", flush=True)


if __name__ == "__main__":
    main()
