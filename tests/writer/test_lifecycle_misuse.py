"""The lifecycle used out of order: async and sync halves mixed, a close before
any open, an ``aopen()`` cancelled while its first write is in the store.

Each misuse is a clear error or does what the matching call would, with and
without ``python -O``: nothing rests on an ``assert``.
"""

from __future__ import annotations

import gc
import signal
import subprocess
import sys
import textwrap
import threading
import weakref
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from checkpointer import (
    CheckpointWriter,
    Failed,
    FileStore,
    KeyCommitter,
    Skipped,
    Snapshot,
    Written,
    load,
)


def _writer(root: Path, state: dict[str, Any]) -> CheckpointWriter[Snapshot]:
    return CheckpointWriter(lambda: Snapshot("k", dict(state)), FileStore(root), exit_hooks=False)


@pytest.mark.anyio
async def test_aclose_of_a_sync_opened_writer_is_its_close(tmp_path: Path) -> None:
    """open() then aclose(): the final write (live=False) with the changes since open()."""
    state = {"n": 0}
    writer = _writer(tmp_path, state).open()
    state["n"] = 42
    assert isinstance(await writer.aclose(), Written)
    assert writer.close() == Skipped("closed")
    stored = load(FileStore(tmp_path), "k")
    assert stored is not None and stored.state == {"n": 42} and not stored.meta.live


@pytest.mark.anyio
async def test_aclose_before_any_open_does_what_close_does(tmp_path: Path) -> None:
    """Never opened: aclose() writes the final checkpoint, as close() does."""
    closed = _writer(tmp_path / "sync", {"n": 1}).close()
    aclosed = await _writer(tmp_path / "async", {"n": 1}).aclose()
    assert isinstance(closed, Written) and isinstance(aclosed, Written)
    stored = load(FileStore(tmp_path / "async"), "k")
    assert stored is not None and stored.state == {"n": 1} and not stored.meta.live


@pytest.mark.anyio
async def test_write_now_on_a_sync_opened_writer_is_a_clear_error(tmp_path: Path) -> None:
    """write_now() needs the event loop's writer: RuntimeError; close() still works after."""
    state = {"n": 0}
    writer = _writer(tmp_path, state).open()
    state["n"] = 1
    with pytest.raises(RuntimeError, match=r"aopen\(\)"):
        await writer.write_now()
    assert isinstance(writer.close(), Written)
    stored = load(FileStore(tmp_path), "k")
    assert stored is not None and stored.state == {"n": 1} and not stored.meta.live


SCRIPT = """
import sys, anyio
from checkpointer import CheckpointWriter, FileStore, Snapshot
state = {"n": 0}
def writer(root):
    return CheckpointWriter(lambda: Snapshot("k", dict(state)), FileStore(root), exit_hooks=False)
w = writer(sys.argv[1] + "/mixed").open()
state["n"] = 42
async def main():
    try:
        await w.write_now()
    except RuntimeError:
        print("write_now refused")
    new = writer(sys.argv[1] + "/new")
    print(type(await w.aclose()).__name__, type(await new.aclose()).__name__)
anyio.run(main, backend=sys.argv[2])
print(w.close())
"""


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_same_under_python_O(tmp_path: Path, backend: str) -> None:
    """Under -O (no asserts) too: refused before anything is claimed, then closed and written."""
    proc = subprocess.run(
        [sys.executable, "-O", "-c", textwrap.dedent(SCRIPT), str(tmp_path), backend],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[:3] == [
        "write_now refused",
        "Written Written",
        "Skipped(reason='closed')",
    ]
    for name in ("mixed", "new"):
        stored = load(FileStore(tmp_path / name), "k")
        assert stored is not None and not stored.meta.live
    assert stored is not None and stored.state == {"n": 42}


class _HeldStore(FileStore):
    """Its first write waits, in the store, until the test lets it go."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.started, self.release, self.ended = (
            threading.Event(),
            threading.Event(),
            threading.Event(),
        )

    def write(self, key: str, chunks: Any, *, revision: str, expected: str | None) -> int:
        if self.started.is_set():
            return super().write(key, chunks, revision=revision, expected=expected)
        self.started.set()
        self.release.wait(60)
        try:
            return super().write(key, chunks, revision=revision, expected=expected)
        finally:
            self.ended.set()


@pytest.mark.anyio
async def test_a_cancelled_aopen_leaves_the_key_as_a_close_would(tmp_path: Path) -> None:
    """aopen() cancelled while its first write is in the store: once that write ends, the
    final one (live=False) follows it and the key is let go; nothing is left live."""
    store = _HeldStore(tmp_path)
    writer = CheckpointWriter(lambda: Snapshot("k", {"n": 0}), store, exit_hooks=False)
    opened = anyio.Event()
    async with anyio.create_task_group() as tg:
        scope = anyio.CancelScope()

        async def open_it() -> None:
            with scope:
                await writer.aopen()
            opened.set()

        tg.start_soon(open_it)
        await anyio.to_thread.run_sync(store.started.wait, 60)
        scope.cancel()
        # No event says the cancel has come: the writer's phase, in its repr, does.
        while repr(writer).startswith("<CheckpointWriter open"):  # noqa: ASYNC110
            await anyio.sleep(0.001)
        store.release.set()
        await opened.wait()
    await anyio.to_thread.run_sync(store.ended.wait, 60)  # the first write has ended
    stored = load(FileStore(tmp_path), "k")
    assert stored is not None and not stored.meta.live, stored
    assert await writer.aclose() == Skipped("closed")
    other = KeyCommitter(FileStore(tmp_path), "k")  # the key's lock was let go
    assert isinstance(other.commit({"n": 1}), Written)
    other.close()


class _KeyServiceDown(FileStore):
    """Its ``validate_key`` raises (not a ValueError) for its first ``down`` calls."""

    def __init__(self, root: Path, down: int) -> None:
        super().__init__(root)
        self.down = down

    def validate_key(self, key: str) -> None:
        self.down -= 1
        if self.down >= 0:
            raise RuntimeError("key service unavailable")
        super().validate_key(key)


def _assert_closed_for_good(writer: CheckpointWriter[Snapshot], root: Path) -> None:
    """Closed with a failed final write: no more writes, even at exit; the key let go."""
    last = writer.statistics().last_result
    assert isinstance(last, Failed) and "key service unavailable" in last.error, last
    assert writer.close() == Skipped("closed")
    assert writer.flush_sync("exit") == Skipped("closed")  # the exit hook's write
    other = KeyCommitter(FileStore(root), "k")
    assert isinstance(other.commit({"n": 2}), Written)
    other.close()


@pytest.mark.anyio
async def test_a_close_whose_final_write_raises_on_the_loop_ends(tmp_path: Path) -> None:
    """aopen()'s first write raises, then the final write of the close it runs: the close
    still ends, its exit hooks gone (SIGTERM's handler back), its result a Failed."""
    before = signal.getsignal(signal.SIGTERM)
    store = _KeyServiceDown(tmp_path, down=2)
    writer = CheckpointWriter(lambda: Snapshot("k", {"n": 1}), store)
    with pytest.raises(RuntimeError, match="key service"):
        await writer.aopen()
    assert await writer.aclose() == Skipped("closed")
    assert signal.getsignal(signal.SIGTERM) is before
    _assert_closed_for_good(writer, tmp_path)


def test_a_close_whose_final_write_raises_ends(tmp_path: Path) -> None:
    """close() on its thread, the same: Failed, not raised; closed for good."""
    store = _KeyServiceDown(tmp_path, down=1)
    writer = CheckpointWriter(lambda: Snapshot("k", {"n": 1}), store, write_on_start=False)
    result = writer.open().close()
    assert isinstance(result, Failed) and result.reason == "write-failed", result
    _assert_closed_for_good(writer, tmp_path)


@pytest.mark.anyio
async def test_a_second_aclose_of_a_sync_opened_writer_waits_for_the_first(
    tmp_path: Path,
) -> None:
    """open(), then two aclose() at once: the second returns the first's result, once the
    final write is stored."""
    store = _HeldStore(tmp_path)
    writer = CheckpointWriter(lambda: Snapshot("k", {"n": 1}), store, write_on_start=False)
    writer.open()
    results: list[tuple[object, object]] = []

    async def close() -> None:
        results.append((await writer.aclose(), load(FileStore(tmp_path), "k")))

    async with anyio.create_task_group() as tg:
        tg.start_soon(close)
        await anyio.to_thread.run_sync(store.started.wait, 60)
        tg.start_soon(close)
        # The second close's thread is waiting on the first's result before the write ends.
        closing = writer._life._closing
        assert closing is not None
        with anyio.fail_after(60):
            while not closing._condition._waiters:  # type: ignore[attr-defined]  # noqa: ASYNC110
                await anyio.sleep(0.005)
        store.release.set()
    (first, stored), (second, stored_then) = results
    assert isinstance(first, Written) and second == first, results
    assert stored_then is not None and stored_then == stored


@pytest.mark.anyio
@pytest.mark.parametrize("in_thread", [False, True], ids=["on-the-loop", "in-a-thread"])
async def test_close_of_an_aopened_writer_stops_its_timer(tmp_path: Path, in_thread: bool) -> None:
    """close() (sync, on the loop's thread or another) on a writer opened with aopen(): its
    timer task ends, and with it the last reference to the source; a later aclose() is
    Skipped("closed")."""

    def source() -> Snapshot:
        return Snapshot("k", {"n": 1})

    held = weakref.ref(source)
    writer = CheckpointWriter(source, FileStore(tmp_path), exit_hooks=False)
    del source
    await writer.aopen()
    closed = await anyio.to_thread.run_sync(writer.close) if in_thread else writer.close()
    assert isinstance(closed, Written)
    assert await writer.aclose() == Skipped("closed")
    del writer
    for _ in range(10):  # the timer task ends the next time it runs
        await anyio.lowlevel.checkpoint()
    gc.collect()
    assert held() is None, "the timer task still holds the writer's source"
