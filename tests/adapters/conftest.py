"""What the adapters' tests of a server's many sessions share: how many, and a root on tmpfs."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# More sessions than descriptors shows the bound; the 10,000 are the long run's.
MANY = 10_000 if os.environ.get("CHECKPOINTER_LONG_TESTS") == "1" else 1_500


@pytest.fixture
def shm_root(tmp_path: Path) -> Iterator[Path]:
    """A root on tmpfs when there is one: descriptors are the subject here, not fsync."""
    if not Path("/dev/shm").is_dir():
        yield tmp_path / "store"
        return
    with tempfile.TemporaryDirectory(dir="/dev/shm") as where:
        yield Path(where) / "store"
