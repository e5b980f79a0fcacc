"""The benchmarks run, and what they promise holds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_fingerprint_cost_does_not_grow_with_the_history() -> None:
    """benchmarks/fingerprint.py: the fingerprint at 100,000 messages costs at most 1.2x
    that at 10 (best of three runs, for a noisy machine)."""
    outputs = []
    for _ in range(3):
        proc = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "fingerprint.py")],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        outputs.append(proc.stdout + proc.stderr)
        if proc.returncode == 0:
            assert "ratio 100,000 / 10" in proc.stdout
            return
    raise AssertionError("\n".join(outputs))
