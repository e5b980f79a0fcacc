"""Power cuts under group commit: several writers in one directory, one shared fsync.

Six ``CheckpointWriter`` s, each on its own key in one ``FileStore`` root on
the power-cut filesystem (``tests._powerfs``), each flushing without pause
from a thread of its own, so their writes fall due together and share
directory fsyncs.  The power goes right after an aimed call (the k-th
rename of a temp file, or the k-th directory fsync); then every key must
load with a state at least as new as the last ``Written`` its writer
returned.  A mutant whose writers return with a directory fsync that was
already running when they renamed (so it may not cover their rename) is
shown to be caught.
"""

from __future__ import annotations

import logging
import os
import random
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from checkpointer import CheckpointWriter, FileStore, Snapshot, Written, load
from checkpointer._stores import atomic
from tests._powerfs import HANG_GUARD, PowerFS, unavailable

WRITERS = 6
CUTS = 10  # per model; each aims at a random step of a random write
MUTANT_CUTS = 40  # the most cuts the mutant may survive


@pytest.fixture(scope="module", autouse=True)
def fuse() -> None:
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"power-cut tests need FUSE: {reason}")


@pytest.fixture(autouse=True)
def quiet(caplog: pytest.LogCaptureFixture) -> None:
    """The writers log every failed write after the cut: expected, and many."""
    caplog.set_level(logging.CRITICAL, logger="checkpointer")


def flush_until_cut(root: str, key: str, fs: PowerFS, reported: dict[str, int]) -> None:
    """One writer: a new state ``n`` and ``flush_sync()`` in a loop; the last ``n`` Written."""
    n = 0
    writer = CheckpointWriter(lambda: Snapshot(key, {"n": n}), FileStore(root), exit_hooks=False)
    try:
        writer.open()
    except OSError:
        return  # the power went before this writer could start
    try:
        while not fs.frozen.is_set():
            n += 1
            if isinstance(writer.flush_sync(), Written):
                reported[key] = n
    finally:
        writer.close()


def one_cut(
    tmp_path: Path,
    model: str,
    rng: random.Random,
    cut: int,
    steps: tuple[str, ...] = ("rename temp.json", "rename temp.json", "fsyncdir"),
) -> list[str]:
    """Mount over what the last cut left, write from ``WRITERS`` threads, cut right after
    one of ``steps`` (a random one, its k-th call); the writes reported and lost."""
    fs = PowerFS(str(tmp_path / "disk"), str(tmp_path / "mnt"), model)
    fs.mount()
    reported: dict[str, int] = {}
    try:
        root = os.path.join(fs.mountpoint, "root")
        os.makedirs(root, exist_ok=True)
        step = rng.choice(steps)
        fs.arm(step, rng.randint(5, 60))
        threads = [
            threading.Thread(target=flush_until_cut, args=(root, f"k{i}", fs, reported))
            for i in range(WRITERS)
        ]
        for thread in threads:
            thread.start()
        if not fs.frozen.wait(HANG_GUARD):
            fs.freeze()
        for thread in threads:
            thread.join(HANG_GUARD)
        fs.cut()
    finally:
        fs.close()
    store = FileStore(tmp_path / "disk" / "root")
    losses = []
    for key, n in sorted(reported.items()):
        loaded = load(store, key)
        held = -1 if loaded is None else loaded.state["n"]
        if held < n:
            losses.append(f"cut {cut} ({step}): {key} holds n={held}; n={n} was reported written")
    return losses


@pytest.mark.parametrize("model", ["strict", "ext4"])
def test_nothing_reported_written_is_lost_by_writers_sharing_a_directory_fsync(
    tmp_path: Path, model: str
) -> None:
    """Six writers in one root, cut after an aimed rename or directory fsync: no loss."""
    rng = random.Random(f"group/{model}")
    for cut in range(CUTS):
        assert one_cut(tmp_path, model, rng, cut) == []


def _join_the_running_fsync() -> Callable[..., None]:
    """The mutant: a write that finds a directory fsync running returns when it ends,
    though that fsync may have begun before its rename."""
    lock = threading.Lock()
    running: list[threading.Event] = []

    def sync_dir(dir_fd: int, fsync: Callable[[int], None] = os.fsync) -> None:
        with lock:
            done = running[0] if running else None
            if done is None:
                running.append(done := threading.Event())
                lead = True
            else:
                lead = False
        if not lead:
            done.wait(HANG_GUARD)
            return
        try:
            fsync(dir_fd)
        finally:
            with lock:
                running.clear()
            done.set()

    return sync_dir


@pytest.fixture
def mutant(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(atomic, "sync_dir", _join_the_running_fsync())


@pytest.mark.usefixtures("mutant")
def test_a_writer_reported_before_its_own_directory_fsync_is_caught(tmp_path: Path) -> None:
    """The mutant loses a write it reported within ``MUTANT_CUTS`` cuts."""
    rng = random.Random("group/mutant")
    for cut in range(MUTANT_CUTS):
        # A rename just after a running fsync: what the mutant wrongly reports.
        losses = one_cut(tmp_path, "strict", rng, cut, ("rename temp.json",))
        if losses:
            assert "was reported written" in losses[0]
            return
    pytest.fail(f"the mutant lost nothing in {MUTANT_CUTS} cuts")
