"""What the adapters' tests of a server's many sessions share: a root on tmpfs, the run."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpointer import JournalStore
from tests._support import MANY, ROOT, child_env


@pytest.fixture
def shm_root(tmp_path: Path) -> Iterator[Path]:
    """A root on tmpfs when there is one: descriptors are the subject here, not fsync."""
    if not Path("/dev/shm").is_dir():
        yield tmp_path / "store"
        return
    with tempfile.TemporaryDirectory(dir="/dev/shm") as where:
        yield Path(where) / "store"


def serve_many(child: str, root: Path) -> JournalStore:
    """``python -m tests.children.<child> many ROOT MANY`` (a server limited to
    ``DESCRIPTORS``) run to its ``done``; the store it served."""
    done = subprocess.run(
        [sys.executable, "-m", f"tests.children.{child}", "many", str(root), str(MANY)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=child_env(),
        timeout=1800,
        check=False,
    )
    assert done.returncode == 0 and done.stdout == "done\n", done.stderr[-3000:]
    return JournalStore(root)
