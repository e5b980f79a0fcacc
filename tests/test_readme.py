"""The README's example and the demo command work as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from .docblocks import ROOT, python_blocks, run_twice


def test_readme_python_blocks_run(tmp_path: Path) -> None:
    """Every python code block in the README runs, twice in a row, in one directory."""
    blocks = [b for b in python_blocks(ROOT / "README.md") if b.mode == "run"]
    assert blocks, "the README has no python example"
    for block in blocks:
        run_twice(block, tmp_path)


def test_demo_command(tmp_path: Path) -> None:
    """`python -m checkpointer demo` coalesces events, verifies the file, and resumes."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "checkpointer", "demo", "--root", str(tmp_path), "--turns", "5"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False, env=env)
    assert first.returncode == 0, first.stderr
    assert "checkpoint matches the session in memory" in first.stdout
    m = re.search(r"(\d+) run-ended events", first.stdout)
    w = re.search(r"writer: (\d+) writes", first.stdout)
    assert m is not None and w is not None
    assert int(w.group(1)) < int(m.group(1))  # coalesced
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False, env=env)
    assert second.returncode == 0, second.stderr
    assert "resumed 'demo-session'" in second.stdout
    for backend in ("trio",):
        proc = subprocess.run(
            [*cmd, "--backend", backend], capture_output=True, text=True, timeout=120, env=env
        )
        assert proc.returncode == 0, proc.stderr
