"""What the tests share: the repository's paths, the hang guard, child processes, stored bytes."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository: children run with it as cwd
CHILDREN = ROOT / "tests" / "children"
HANG_GUARD = 60.0  # seconds; a hang guard, never a timing assertion
