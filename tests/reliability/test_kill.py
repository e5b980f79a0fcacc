"""Crash torture, smoke size: ``kill -9`` a checkpointing process and check the file.

The full run is ``python -m tests.torture --kills 200`` (``tests/torture.py``);
here the same command runs 20 kills, the torture is shown to catch a store
that tears files, and its checker is shown to flag each kind of loss.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest

from checkpointer import FileStore
from checkpointer._format.envelope import envelope_chunks
from checkpointer._values import Meta
from tests import torture
from tests._support.harness import EPOCH, KEY, Reported, check, state_for

SMALL = 256 * 1024


def test_twenty_kills_lose_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    """The documented command, 20 SIGKILLs: every file loads, is whole, is not older; no loss."""
    code = torture.main(["--kills", "20", "--max-mib", "2", "-q"])
    out = capsys.readouterr().out
    figures = dict(re.findall(r"(\w+)=(\d+)", out.splitlines()[-1]))
    assert code == 0, out
    assert figures["losses"] == "0", out
    assert figures["kills"] == "20", out
    assert int(figures["writes"]) >= 20, out
    # Kills landed inside writes, and the next open swept what they left.
    assert int(figures["mid_write"]) >= 1, out
    assert int(figures["swept"]) >= int(figures["mid_write"]), out


def test_ten_kills_of_a_journal_lose_nothing() -> None:
    """The journal store under the same torture: appends, compactions and rewrites killed."""
    summary = torture.run(10, store="journal", max_bytes=2 << 20)
    assert summary.losses == 0, "\n".join(summary.lines())
    assert summary.kills == 10
    assert summary.writes >= 10
    assert summary.swept >= summary.temps


def test_the_torture_catches_a_store_that_tears_files() -> None:
    """With a store that rewrites in place, the torture reports a torn file (it can fail)."""
    summary = torture.run(20, store="naive", max_bytes=2 << 20, stop_on_loss=True)
    assert summary.losses >= 1, "\n".join(summary.lines())
    assert any("does not load" in p or "mixed/torn" in p for p in summary.problems)
    assert summary.kills <= 20


def test_the_torture_notices_a_lock_left_held(tmp_path: Path) -> None:
    """If the key's lock outlived its holder, a new child's first write fails: reported."""
    held = FileStore(tmp_path).lock(KEY)  # as if a killed child had kept it
    try:
        summary = torture.run(1, root=tmp_path, early=0.0)
    finally:
        held.release()
    assert summary.losses == 1, "\n".join(summary.lines())
    assert "the first write of a new child failed (n=0): 0 written, 1 failed" in summary.problems[0]


def write_state(root: Path, state: object, seq: int) -> FileStore:
    """Put a checkpoint with ``state`` and ``seq`` at root/KEY.json."""
    now = datetime(2024, 5, 1, tzinfo=UTC)
    meta = Meta(key=KEY, seq=seq, created_at=now, updated_at=now, live=True, revision=f"r{seq}")
    store = FileStore(root)
    chunks = envelope_chunks(meta, msgspec.json.encode(state))
    store.write(KEY, chunks, revision=meta.revision, expected=store.revision(KEY))
    return store


def big_n(max_bytes: int) -> int:
    """A sequence number whose state has several messages."""
    return next(n for n in range(10_000) if len(state_for(n, max_bytes)["messages"]) >= 3)


def test_state_for_is_deterministic_grows_then_compacts() -> None:
    """The state of n is the same every time; within an epoch n+1 adds a message, then it resets."""
    for n in range(2 * EPOCH):
        state = state_for(n, SMALL)
        assert state == state_for(n, SMALL)
        assert sum(len(m["content"]) for m in state["messages"]) <= SMALL
        following = state_for(n + 1, SMALL)["messages"]
        if (n + 1) % EPOCH:
            assert following[:-1] == state["messages"]  # an append
        else:
            assert len(following) == 1 and following[0] != state["messages"][0]  # compacted
    sizes = [sum(len(m["content"]) for m in state_for(n, 4 << 20)["messages"]) for n in range(200)]
    assert min(sizes) < 10_000 < 1_000_000 < max(sizes) <= 4 << 20


def test_check_accepts_a_whole_newer_file_and_raises_the_floor(tmp_path: Path) -> None:
    """The state of its own n, not older than reported: no problem; the floor moves up to it."""
    store = write_state(tmp_path, state_for(7, SMALL), seq=12)
    floor = Reported(seq=10, n=5)
    assert check(store, SMALL, floor) == []
    assert (floor.seq, floor.n) == (12, 7)


def test_check_flags_a_mixture_of_two_states(tmp_path: Path) -> None:
    """A file whose last message comes from another sequence number is mixed/torn."""
    n = big_n(SMALL)
    mixed = state_for(n, SMALL)
    other = state_for(n + EPOCH, SMALL)["messages"][0]["content"]
    last = mixed["messages"][-1]
    last["content"] = (other * 2)[: len(last["content"])]
    store = write_state(tmp_path, mixed, seq=3)
    assert check(store, SMALL, Reported()) == [
        f"the state is not the state of its sequence number n={n} (mixed/torn)"
    ]


def test_check_flags_a_torn_file(tmp_path: Path) -> None:
    """A file cut short does not load: flagged with the loader's reason."""
    store = write_state(tmp_path, state_for(3, SMALL), seq=3)
    path = Path(store.location(KEY))
    path.write_bytes(path.read_bytes()[:-10])
    problems = check(store, SMALL, Reported())
    assert len(problems) == 1
    assert problems[0].startswith("the checkpoint does not load:")
    assert "truncated" in problems[0]


@pytest.mark.parametrize(("seq", "n"), [(9, 7), (12, 6)], ids=["older-seq", "older-n"])
def test_check_flags_a_file_older_than_reported(tmp_path: Path, seq: int, n: int) -> None:
    """A whole file with a lower seq or n than the last reported write is a loss."""
    store = write_state(tmp_path, state_for(n, SMALL), seq=seq)
    problems = check(store, SMALL, Reported(seq=10, n=7))
    assert len(problems) == 1
    assert "older than seq 10 (n=7)" in problems[0]


def test_check_flags_a_missing_file_after_a_reported_write(tmp_path: Path) -> None:
    """No file at all, after a write was reported done: a loss; before any: fine."""
    store = FileStore(tmp_path)
    assert check(store, SMALL, Reported()) == []
    assert check(store, SMALL, Reported(seq=1, n=0)) == [
        "the checkpoint is gone; seq 1 (n=0) was reported"
    ]


def test_stores_are_a_parameter() -> None:
    """Every store in STORES makes a Store; only the naive one is marked unsafe."""
    safe = {name for name, kind in torture.STORES.items() if not kind.unsafe}
    assert safe == {
        "file",
        "file-transcript",
        "journal",
        "s3",
        "s3journal",
        "file-sealed",
        "journal-sealed",
    }
    for kind in torture.STORES.values():
        if kind.setup is None:  # the S3 ones need the server their setup starts
            assert kind.make("/nonexistent/root").location(KEY).startswith("/nonexistent/root/")
