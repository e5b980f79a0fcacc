"""A writer used in odd places: after its event loop ended, closed while it opens.

Each test pins a break found by a breaker (its script named in the test).
Process tests run a real child and look at the real file.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

from checkpointer import (
    CheckpointWriter,
    Failed,
    FileStore,
    JournalStore,
    Snapshot,
    Written,
    load,
)
from tests._support import HANG_GUARD, child_env

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
    env = child_env()
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

    def write(self, key: str, chunks: Any, **kw: Any) -> Any:
        if not self.began.is_set():
            self.began.set()
            self.release.wait(HANG_GUARD)  # hang guard
        return super().write(key, chunks, **kw)


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


RESTORE_OFF_MAIN_CHILD = textwrap.dedent(
    """
    import signal, sys, threading
    import anyio
    from checkpointer import CheckpointWriter, FileStore, Snapshot

    root, mode = sys.argv[1], sys.argv[2]
    for s in (signal.SIGTERM, signal.SIGHUP):  # not what it inherited (nohup: SIGHUP ignored)
        signal.signal(s, signal.SIG_DFL)

    def ours():
        handlers = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)]
        return [getattr(h, "name", type(h).__name__) for h in handlers]

    def writer():
        return CheckpointWriter(lambda: Snapshot("s1", {"n": 1}), FileStore(root))

    if mode == "sync":
        w = writer().open()
        closer = threading.Thread(target=w.close)
        closer.start()
        closer.join()
        print(*ours(), flush=True)  # still ours: no main-thread chance yet
        other = CheckpointWriter(
            lambda: Snapshot("s2", {"n": 2}), FileStore(root), exit_hooks=False
        ).open()
        other.close()  # a write on the main thread
    else:
        async def main():
            w = writer()
            await w.__aenter__()
            await anyio.to_thread.run_sync(w.close)
            for _ in range(1000):  # the restoration is queued on this loop
                if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                    break
                await anyio.sleep(0)

        anyio.run(main, backend=mode)
    print(*ours(), flush=True)
    """
)


@pytest.mark.parametrize("mode", ["sync", "asyncio", "trio"])
def test_a_close_off_the_main_thread_restores_the_signal_handlers(
    tmp_path: Path, mode: str
) -> None:
    """The last writer closed in a worker thread: SIGTERM/SIGHUP get their old handlers back
    (through the writer's loop on the main thread, else at the main thread's next write).
    The child starts from the default handlers whatever it inherited (a suite run under
    nohup ignores SIGHUP)."""
    env = child_env()
    done = subprocess.run(
        [sys.executable, "-c", RESTORE_OFF_MAIN_CHILD, str(tmp_path), mode],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done
    lines = done.stdout.splitlines()
    assert lines[-1] == "SIG_DFL SIG_DFL", done
    if mode == "sync":
        assert lines[0] == "_Handler _Handler", done


def test_a_journal_key_locked_again_is_appended_to_not_compacted(tmp_path: Path) -> None:
    """Back on a key after another (its lock let go, then taken again): one new message
    is appended (a few hundred bytes), not the whole history compacted again."""
    store = JournalStore(tmp_path)
    key = {"now": "k1"}
    history: dict[str, list[dict[str, Any]]] = {
        "k1": [{"role": "user", "content": "x" * 1000, "i": i} for i in range(100)],
        "k2": [{"role": "user", "content": "hi"}],
    }
    writer = CheckpointWriter(
        lambda: Snapshot(key["now"], {"messages": list(history[key["now"]])}),
        store,
        exit_hooks=False,
    ).open()
    try:
        key["now"] = "k2"  # k1 is finished (live=False) and its lock let go
        assert isinstance(writer.flush_sync(), Written)
        key["now"] = "k1"  # its lock taken again, its meta read again
        history["k1"].append({"role": "user", "content": "one more"})
        before = store.statistics()
        result = writer.flush_sync()
        after = store.statistics()
    finally:
        writer.close()
    assert isinstance(result, Written), result
    assert result.nbytes < 1000, result  # the history is ~100 kB
    assert (after.compactions, after.rewrites) == (before.compactions, before.rewrites)
    assert after.bytes_written - before.bytes_written < 1000  # with k2's not-live row
    checkpoint = load(JournalStore(tmp_path), "k1")
    assert checkpoint is not None
    assert checkpoint.state["messages"] == history["k1"]


SIGTERM_AFTER_A_CUT_CLOSE_CHILD = textwrap.dedent(
    """
    import os, signal, sys, threading
    import anyio
    from checkpointer import CheckpointWriter, FileStore, JournalStore, Limits, Snapshot

    root, backend, kind = sys.argv[1:4]
    entered = threading.Event()
    release = threading.Event()
    Base = FileStore if kind == "file" else JournalStore

    class Slow(Base):
        slow = False

        def _wait(self):
            if Slow.slow:
                entered.set()
                release.wait(30)

        def write(self, key, chunks, **kw):
            self._wait()
            return super().write(key, chunks, **kw)

        def commit(self, key, meta, staged, **kw):
            self._wait()
            return super().commit(key, meta, staged, **kw)

    state = {"n": 0}

    async def main():
        writer = CheckpointWriter(
            lambda: Snapshot("k", dict(state)),
            Slow(root),
            limits=Limits(close_timeout=0.1, exit_timeout=30),
        )
        await writer.__aenter__()
        state["n"] = 1
        Slow.slow = True
        result = await writer.aclose()  # past close_timeout: its write goes on in a thread
        print(type(result).__name__, flush=True)

    anyio.run(main, backend=backend)
    assert entered.wait(30)
    threading.Timer(0.5, release.set).start()  # the disk answers after the signal landed
    os.kill(os.getpid(), signal.SIGTERM)
    """
)


@pytest.mark.parametrize("kind", ["file", "journal"])
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_sigterm_waits_for_a_final_write_past_close_timeout(
    tmp_path: Path, backend: str, kind: str
) -> None:
    """A close past close_timeout leaves its write in a thread: SIGTERM waits for it to land."""
    env = child_env()
    done = subprocess.run(
        [sys.executable, "-c", SIGTERM_AFTER_A_CUT_CLOSE_CHILD, str(tmp_path), backend, kind],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        env=env,
        check=False,
    )
    assert (done.returncode, done.stdout.split()) == (-15, ["Failed"]), done
    store = FileStore(tmp_path) if kind == "file" else JournalStore(tmp_path)
    checkpoint = load(store, "k")
    assert checkpoint is not None
    assert (checkpoint.state, checkpoint.meta.live) == ({"n": 1}, False)
