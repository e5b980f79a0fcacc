"""Crashes: a real child process checkpointing a journal, killed with SIGKILL, then loaded.

Each kill is followed by three checks a user would care about: the journal
loads (no CheckpointError), it holds exactly the session as of some
checkpoint (replayed from the child's deterministic session), and nothing
the child saw written (fsynced) is lost.  Then a writer opens the journal
again, cuts any torn tail, and goes on.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpointer import (
    CheckpointError,
    CheckpointWriter,
    JournalStore,
    Skipped,
    Snapshot,
    Written,
    load,
)
from tests._support import child_env
from tests.children import journal_child

CHILD = Path(journal_child.__file__)


def run_child(root: Path, *args: str) -> subprocess.Popen[str]:
    env = child_env()
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(root), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def acknowledged(stdout: str) -> int:
    seqs = [int(line.split()[1]) for line in stdout.splitlines() if line.startswith("seq ")]
    return max(seqs, default=0)


def check_after_crash(root: Path, acked: int) -> None:
    """The journal loads to the session at some seq >= the last acknowledged one."""
    store = JournalStore(root)
    checkpoint = load(store, journal_child.KEY)
    assert checkpoint is not None, "the first checkpoint was acknowledged: it must be there"
    seq = checkpoint.meta.seq
    assert seq >= acked, f"lost acknowledged checkpoint {acked}: loaded {seq}"
    assert checkpoint.state == journal_child.session_at(seq - 1)
    # A writer opens it again (truncating a torn tail, sweeping temps) and carries on.
    session = journal_child.Session()
    for _ in range(seq - 1):
        session.advance()
    session.advance()
    with CheckpointWriter(session.snapshot, store, exit_hooks=False) as writer:
        # A temp killed before its lock (mode 000) is kept until old (atomic.STALE_AFTER).
        left = [p for p in os.listdir(root) if p.endswith(".tmp")]
        assert not [p for p in left if stat.S_IMODE(os.stat(root / p).st_mode)], left
        assert writer.statistics().writes == 1  # the write on open
    again = load(store, journal_child.KEY)
    assert again is not None
    assert again.torn is None
    assert again.state == journal_child.session_at(seq)


def kill_at_random(root: Path, delay: float) -> tuple[int, str]:
    child = run_child(root)
    assert child.stdout is not None
    first = child.stdout.readline()
    assert first.startswith("seq 1"), first + child.stderr.read() if child.stderr else first
    time.sleep(delay)  # a random point of the child's loop: the only wall-clock use here
    child.send_signal(signal.SIGKILL)
    rest, _ = child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL
    return acknowledged(first + rest), first + rest


@pytest.mark.parametrize("seed", range(8))
def test_sigkill_at_a_random_moment(tmp_path: Path, seed: int) -> None:
    """Killed anywhere (append, compaction, rewrite), the journal loads what was fsynced."""
    delay = random.Random(seed).uniform(0.0, 0.25)
    acked, _ = kill_at_random(tmp_path, delay)
    check_after_crash(tmp_path, acked)


@pytest.mark.parametrize("phase", journal_child.PHASES)
@pytest.mark.parametrize("at", [2, 3])
def test_sigkill_inside_a_write(tmp_path: Path, phase: str, at: int) -> None:
    """Killed halfway through an append or at each step of a rewrite, the journal loads."""
    child = run_child(tmp_path, "--die-in", phase, "--die-at", str(at))
    out, err = child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL, err
    temps = [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    if phase in ("write", "fsync", "replace"):
        assert temps, "the rewrite died before its rename: its temp file is left"
    if phase == "append":
        torn = load(JournalStore(tmp_path), journal_child.KEY)
        assert torn is not None
        assert torn.torn is not None, "half an append must load as a torn tail"
    check_after_crash(tmp_path, acknowledged(out))


def test_child_session_replays() -> None:
    """The parent's replay of the child's session is deterministic."""
    assert journal_child.session_at(8) == journal_child.session_at(8)
    assert journal_child.session_at(7)["messages"][0]["role"] == "system"
    assert len(Snapshot("s1", journal_child.session_at(1)).state["messages"]) == 412


# -- an append persisted out of order: a zero hole, then a page that reached the disk ------

PAGE = 4096


def session_of(n: int) -> dict[str, object]:
    """A state whose messages of ~2.5 KiB make one append of several pages."""
    return {"n": n, "messages": [f"m{i}:" + "x" * 2500 for i in range(n)]}


def journals_of(root: Path, ns: list[int]) -> list[bytes]:
    """Commit ``session_of(n)`` for each n with one writer; the journal's bytes after each."""
    current = {"state": session_of(ns[0])}
    out = []
    with CheckpointWriter(lambda: Snapshot("k", current["state"]), JournalStore(root)) as writer:
        for n in ns:
            current["state"] = session_of(n)
            writer.notify()
            writer.flush_sync()
            out.append((root / "k.jsonl").read_bytes())
    return out


def crash_images(base: bytes, full: bytes) -> Iterator[tuple[str, bytes]]:
    """What a crash during the append ``full[len(base):]`` may leave, page by page.

    Any subset of the append's pages persisted and the rest zeros, at full
    size or cut after the last persisted page; and prefixes of the append.
    """
    first, last = len(base) // PAGE, (len(full) - 1) // PAGE
    pages = range(first, last + 1)
    for r in range(len(pages) + 1):
        for kept in itertools.combinations(pages, r):
            image = bytearray(full)
            for page in set(pages) - set(kept):
                lo, hi = max(page * PAGE, len(base)), min((page + 1) * PAGE, len(full))
                image[lo:hi] = bytes(hi - lo)
            yield f"pages {kept} kept", bytes(image)
            if kept:
                yield f"pages {kept} kept, cut after", bytes(image[: (max(kept) + 1) * PAGE])
    for cut in range(0, len(full) - len(base), 499):
        yield f"a prefix of {cut} bytes", full[: len(base) + cut]


def test_an_append_persisted_out_of_order_loads_the_old_or_the_new_state(
    tmp_path: Path,
) -> None:
    """A NUL hole before persisted pages is a torn tail: A or B loads, the next writer goes on."""
    base, full = journals_of(tmp_path / "src", [3, 7])
    assert full.startswith(base) and len(full) - len(base) > 2 * PAGE  # B: one append, pages
    a, b, c = session_of(3), session_of(7), session_of(8)
    work = tmp_path / "work"
    work.mkdir()
    path = work / "k.jsonl"
    seen = set()
    for label, image in crash_images(base, full):
        path.write_bytes(image)
        checkpoint = load(JournalStore(work), "k")
        assert checkpoint is not None, label
        assert checkpoint.state in (a, b), label
        seen.add("A" if checkpoint.state == a else "B")
        if checkpoint.state == a and b"\0" in image:
            assert checkpoint.torn is not None and "NUL" in checkpoint.torn.reason, label
            assert checkpoint.torn.offset == len(base), label
        if label.endswith("kept"):  # the next writer cuts the tail and commits over it
            with CheckpointWriter(lambda: Snapshot("k", c), JournalStore(work)) as writer:
                writer.notify()
                assert isinstance(writer.flush_sync(), Written | Skipped), label
            again = load(JournalStore(work), "k")
            assert again is not None and again.state == c and again.torn is None, label
            assert sorted(os.listdir(work)) == ["k.jsonl"], label  # nothing moved aside
    assert seen == {"A", "B"}


def test_nul_bytes_in_the_header_line_are_not_a_journal(tmp_path: Path) -> None:
    """Zeros in line 1 (never a crash of ours: it was fsynced before its rename) are an error."""
    (tmp_path / "k.jsonl").write_bytes(b"\0" * 100 + b"\n")
    with pytest.raises(CheckpointError, match="line 1 holds NUL bytes"):
        load(JournalStore(tmp_path), "k")


def test_nul_bytes_before_a_later_append_are_damage(tmp_path: Path) -> None:
    """A hole followed by a second complete append cannot be a crash's: an error naming it."""
    base, _full, more = journals_of(tmp_path / "src", [3, 4, 5])
    image = bytearray(more)
    image[len(base) : len(base) + 10] = bytes(10)  # a hole in the append of 4, then 5's append
    (tmp_path / "k.jsonl").write_bytes(bytes(image))
    with pytest.raises(CheckpointError, match="follows a complete append after the NUL bytes"):
        load(JournalStore(tmp_path), "k")
