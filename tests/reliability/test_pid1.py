"""A program that survives its SIGTERM (a container's PID 1) goes on as it did before it.

The init of a PID namespace is not ended by a signal's default action: our
handler writes the final checkpoint, and the program keeps its pool workers
and can fork again.  Run in a real PID namespace (``unshare``), where the
machine allows one.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = Path(__file__).parent.parent / "children" / "pid1_child.py"
UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
GUARD = 60.0


def can_unshare() -> str | None:
    """Why no PID namespace can be made here, or None."""
    if shutil.which("unshare") is None:
        return "no unshare(1) here"
    done = subprocess.run([*UNSHARE, "true"], capture_output=True, text=True, check=False)
    return None if done.returncode == 0 else f"unshare --pid fails here: {done.stderr.strip()}"


def test_pid1_survives_sigterm_with_its_pool_and_forks(tmp_path: Path) -> None:
    """No pool worker ended, the pool works, forks live, and the final write was made."""
    if (why := can_unshare()) is not None:
        pytest.skip(why)
    proc = subprocess.Popen(
        [*UNSHARE, sys.executable, str(CHILD), str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "READY"
        init = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0]
        os.kill(int(init), signal.SIGTERM)  # docker stop: SIGTERM to the container's PID 1
        out, _ = proc.communicate("go\n", timeout=GUARD)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert out.splitlines() == [
        "CHILDREN same",
        "POOL [0, 1, 4, 9]",
        "FORK 0",
        "POPEN 0",
        "LIVE False",
    ]
