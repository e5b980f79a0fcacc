"""The README's example and the demo command work as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def python_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_python_blocks_run(tmp_path: Path) -> None:
    """Every python code block in the README runs in a fresh interpreter."""
    blocks = python_blocks()
    assert blocks, "the README has no python example"
    for block in blocks:
        proc = subprocess.run(
            [sys.executable, "-c", block],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, f"{block}\n--- stderr:\n{proc.stderr}"


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
