"""A failed final write at exit or on a signal is logged once, at ERROR, with no retry WARNING.

Real child processes; the store's directory is replaced by a file after the
first write, so the exit or signal flush fails.  Issue 16, item 6.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

_BODY = (
    "import shutil, sys, time\n"
    "from checkpointer import CheckpointWriter, FileStore, Snapshot\n"
    "m = [1]\n"
    "w = CheckpointWriter(lambda: Snapshot('k', {'m': m}), FileStore('r'))\n"
    "w.open()\n"
    "m.append(2)\n"
    "shutil.rmtree('r')\n"
    "open('r', 'w').close()\n"
)


@pytest.mark.parametrize("how", ["exit", "SIGTERM"])
def test_failed_final_write_logs_error_without_retry_warning(tmp_path: Path, how: str) -> None:
    """A failed exit/signal flush says "final write ... failed", never "retrying with backoff"."""
    body = _BODY
    if how == "SIGTERM":
        body += "print('ready', flush=True)\ntime.sleep(120)\n"
    child = subprocess.Popen(
        [sys.executable, "-c", body],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    if how == "SIGTERM":
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=120)
    when = "at exit" if how == "exit" else "on a signal"
    assert f"the final write {when} failed (write-failed)" in err, err
    assert "retrying with backoff" not in err, err
    assert "checkpoint failed" not in err, err
