"""``notify()`` from a signal handler ("save now" on SIGUSR1) while the event loop is idle.

The handler runs on the loop's thread outside any task, while the loop waits in
its selector: the wake must reach that wait (asyncio's thread-safe call, trio's
token), else the change waits for the next thing that wakes the loop.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import anyio
import anyio.from_thread
import pytest

from checkpointer import CheckpointWriter, FileStore, Snapshot, load
from tests._support import HANG_GUARD

pytestmark = pytest.mark.anyio

# x86-64 epoll_wait, epoll_pwait; and futex: anyio's test runner hosts trio as a guest,
# its thread waiting on a queue while trio's selector waits in another thread.
_WAITS = {"asyncio": {"232", "281"}, "trio": {"232", "281", "202"}}


def _in_a_wait(tid: int, backend: str) -> bool:
    """Whether thread ``tid`` sits in the loop's wait system call (Linux's /proc)."""
    with open(f"/proc/self/task/{tid}/syscall") as f:
        return f.read().split()[0] in _WAITS[backend]


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs Linux's /proc")
async def test_notify_from_a_signal_handler_wakes_an_idle_loop(
    tmp_path: Path, anyio_backend: str
) -> None:
    state = {"n": 0}
    store = FileStore(tmp_path)
    seen = anyio.Event()
    token = anyio.lowlevel.current_token()
    loop_tid = threading.get_native_id()
    async with CheckpointWriter(
        lambda: Snapshot("k", dict(state)),
        store,
        debounce=0.01,
        min_interval=0.01,
        exit_hooks=False,
    ) as writer:
        await writer.write_now()

        def handler(signum: int, frame: object) -> None:
            state["n"] = 1
            writer.notify()

        def watch() -> None:
            deadline = time.monotonic() + HANG_GUARD
            while not _in_a_wait(loop_tid, anyio_backend):  # the loop idle, waiting on its selector
                time.sleep(0.001)
            os.kill(os.getpid(), signal.SIGUSR1)
            while time.monotonic() < deadline:  # a hang guard: the loop itself stays asleep
                cp = load(store, "k")
                if cp is not None and cp.state["n"] == 1:
                    anyio.from_thread.run_sync(seen.set, token=token)
                    return
                time.sleep(0.005)

        previous = signal.signal(signal.SIGUSR1, handler)
        try:
            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            with anyio.move_on_after(HANG_GUARD):
                await seen.wait()
        finally:
            signal.signal(signal.SIGUSR1, previous)
        assert seen.is_set(), "the change was not written while the loop slept"
        state["n"] = 2
        writer.notify()  # and a task's notify after it still wakes the timer
        with anyio.fail_after(HANG_GUARD):
            while getattr(load(store, "k"), "state", None) != {"n": 2}:  # noqa: ASYNC110
                await anyio.sleep(0.005)
