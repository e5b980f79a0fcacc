"""Crashes: a real child process checkpointing a journal, killed with SIGKILL, then loaded.

Each kill is followed by three checks a user would care about: the journal
loads (no CheckpointError), it holds exactly the session as of some
checkpoint (replayed from the child's deterministic session), and nothing
the child saw written (fsynced) is lost.  Then a writer opens the journal
again, cuts any torn tail, and goes on.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from checkpointer import CheckpointWriter, JournalStore, Snapshot, load

from .children import journal_child

CHILD = Path(journal_child.__file__)
ROOT = Path(__file__).resolve().parent.parent


def run_child(root: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
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
        assert not [p for p in os.listdir(root) if p.endswith(".tmp")]
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
