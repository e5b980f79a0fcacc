"""A writer used in odd places: after its event loop ended, closed while it opens.

Each test pins a break found by a breaker (its script named in the test).
Process tests run a real child and look at the real file.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

from checkpointer import CheckpointWriter, Failed, FileStore, JournalStore, Snapshot, load

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


class HeldFirstWrite(FileStore):
    """A FileStore whose first write waits until ``release`` is set."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.began = threading.Event()
        self.release = threading.Event()

    def write(self, key: str, chunks: Any) -> Any:
        if not self.began.is_set():
            self.began.set()
            self.release.wait(HANG_GUARD)  # hang guard
        return super().write(key, chunks)


@pytest.mark.anyio
async def test_aclose_during_the_first_write_starts_no_timer(tmp_path: Path) -> None:
    """aclose() while __aenter__ writes: no timer task is left, the newest state is final."""
    state = {"n": 0}
    store = HeldFirstWrite(tmp_path)
    writer = CheckpointWriter(lambda: Snapshot(KEY, dict(state)), store, exit_hooks=False)
    closing = anyio.Event()

    async def close() -> None:
        closing.set()  # aclose() claims the close before its first await
        await writer.aclose()

    async with anyio.create_task_group() as tg:
        tg.start_soon(writer.__aenter__)
        await anyio.to_thread.run_sync(store.began.wait, HANG_GUARD)
        state["n"] = 1
        tg.start_soon(close)
        await closing.wait()
        store.release.set()
    timer_done = writer._timer._done  # private: no public view of the timer task
    assert timer_done is None or timer_done.is_set()
    checkpoint = load(FileStore(tmp_path), KEY)
    assert checkpoint is not None
    assert (checkpoint.state["n"], checkpoint.meta.live) == (1, False)


@pytest.mark.parametrize("store_type", [FileStore, JournalStore])
def test_a_lone_surrogate_in_the_parent_is_refused_up_front(
    tmp_path: Path, store_type: type[FileStore]
) -> None:
    """A lone surrogate in Snapshot.parent is Failed naming the field; nothing is written."""
    snapshot = Snapshot(KEY, {"n": 1}, parent="branch-\udcff")
    writer = CheckpointWriter(
        lambda: snapshot, store_type(tmp_path), write_on_start=False, exit_hooks=False
    ).open()
    try:
        result = writer.flush_sync()
    finally:
        writer.close()
    assert isinstance(result, Failed), result
    assert result.reason == "snapshot-failed"
    assert "Snapshot.parent" in result.error and "lone surrogate" in result.error
    assert "index 7" in result.error
    assert load(store_type(tmp_path), KEY) is None
