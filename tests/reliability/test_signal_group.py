"""SIGTERM while the main thread is in a store call that fsyncs the directory.

A sync program deletes keys on its main thread (``FileStore.delete``: unlink,
then the directory's fsync) while writers with changes pending are open on the
same root.  The exit hook's flush runs on that thread, maybe right after its
fsync returned, in the batch it leads: every final write must land, none wait
for the interrupted fsync.  Real processes, real signals, the bytes stored.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from checkpointer import FileStore, load
from tests._support import HANG_GUARD

TRIALS = 12
WRITERS = 4

CHILD = r"""
import sys
from checkpointer import CheckpointWriter, FileStore, Limits, Snapshot
root, n = sys.argv[1], int(sys.argv[2])
store = FileStore(root)
states = [{"n": 0} for _ in range(n)]
writers = []
for i in range(n):
    w = CheckpointWriter(lambda i=i: Snapshot(f"s{i}", dict(states[i])), FileStore(root),
                         debounce=3600, max_wait=3600, limits=Limits(exit_timeout=2.0))
    w.open().flush_sync()
    writers.append(w)
for s in states:
    s["n"] = 2  # changed, not written: only the SIGTERM flush writes it
i = 0
while True:
    key = f"t{i % 4}"
    with open(store.location(key), "wb") as f:
        f.write(b"x")
    store.delete(key)
    if i == 100:
        print("READY", flush=True)  # deleting, fsyncing the root, on the main thread
    i += 1
"""


def test_sigterm_during_a_main_thread_directory_fsync_flushes_every_writer(
    tmp_path: Path,
) -> None:
    rng = random.Random("sigterm/group")
    for trial in range(TRIALS):
        root = tmp_path / f"r{trial}"
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(root), str(WRITERS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "READY"
        time.sleep(rng.uniform(0.01, 0.2))  # not in step with the child's loop
        child.send_signal(signal.SIGTERM)
        try:
            _, err = child.communicate(timeout=HANG_GUARD)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            raise AssertionError(f"trial {trial}: the child hung after SIGTERM") from None
        assert child.returncode == -signal.SIGTERM, err
        assert "failed" not in err, f"trial {trial}: {err}"
        held = [getattr(load(FileStore(root), f"s{i}"), "state", None) for i in range(WRITERS)]
        assert held == [{"n": 2}] * WRITERS, f"trial {trial}: {held}"
