"""A writer used in odd places: after its event loop ended, closed while it opens.

Each test pins a break found by a breaker (its script named in the test).
Process tests run a real child and look at the real file.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest

from checkpointer import CheckpointWriter, FileStore, Snapshot, load

HANG_GUARD = 60.0
KEY = "s1"

NOTIFY_AFTER_THE_LOOP_CHILD = textwrap.dedent(
    """
    import sys
    import anyio
    from checkpointer import CheckpointWriter, FileStore, Snapshot

    root, backend = sys.argv[1], sys.argv[2]
    state = {"n": 0}
    box = {}

    async def main():
        writer = CheckpointWriter(lambda: Snapshot("s1", dict(state)), FileStore(root))
        await writer.__aenter__()  # never closed
        box["writer"] = writer

    anyio.run(main, backend=backend)
    state["n"] = 2
    box["writer"].notify()  # a thread-based SDK's hook, after the loop ended
    print("NOTIFIED", flush=True)
    """
)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_notify_after_the_event_loop_ended_is_flushed_at_exit(tmp_path: Path, backend: str) -> None:
    """notify() after the writer's loop ended does not raise; the exit hook writes it."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    done = subprocess.run(
        [sys.executable, "-c", NOTIFY_AFTER_THE_LOOP_CHILD, str(tmp_path), backend],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        env=env,
        check=False,
    )
    assert (done.returncode, done.stdout.split()) == (0, ["NOTIFIED"]), done
    checkpoint = load(FileStore(tmp_path), KEY)
    assert checkpoint is not None
    assert (checkpoint.state["n"], checkpoint.meta.live) == (2, False)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_notify_after_the_event_loop_ended_then_close_writes_it(
    tmp_path: Path, backend: str
) -> None:
    """notify() after the loop ended records the change; close() writes it, not live."""
    state = {"n": 0}
    box: dict[str, CheckpointWriter[Any]] = {}

    async def main() -> None:
        writer = CheckpointWriter(
            lambda: Snapshot(KEY, dict(state)), FileStore(tmp_path), exit_hooks=False
        )
        await writer.__aenter__()
        box["writer"] = writer

    anyio.run(main, backend=backend)
    state["n"] = 2
    writer = box["writer"]
    writer.notify()
    assert writer.statistics().pending
    writer.close()
    checkpoint = load(FileStore(tmp_path), KEY)
    assert checkpoint is not None
    assert (checkpoint.state["n"], checkpoint.meta.live) == (2, False)
