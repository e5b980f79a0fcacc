"""Many writers in one process: closed at once, cancelled at shutdown, a write in flight at close.

Virtual time (an asyncio loop whose clock moves only when told, trio's
``MockClock``): a ``source()`` that moves the loop's clock on stands for a
loop busy with thousands of other closes.  Checked on the bytes on disk.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from checkpointer import CheckpointWriter, Failed, FileStore, Limits, Snapshot, Written, load
from tests.conftest import FakeClock
from tests.writer.test_close import GateStore, final_threads_end, jump, virtual_backends

N = 50


def sessions(n: int) -> list[dict[str, Any]]:
    return [{"key": f"s{i}", "n": 0} for i in range(n)]


def writer_for(
    st: dict[str, Any], store: Any, clock: FakeClock, **kw: Any
) -> CheckpointWriter[Any]:
    return CheckpointWriter(
        lambda: Snapshot(st["key"], {"n": st["n"]}),
        store,
        clock=clock,
        exit_hooks=False,
        **kw,
    )


def assert_all_landed(store: FileStore, states: list[dict[str, Any]]) -> None:
    for st in states:
        cp = load(store, st["key"])
        assert cp is not None, f"{st['key']}: no checkpoint (its last state is lost)"
        assert (cp.state["n"], cp.meta.live) == (st["n"], False), st["key"]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", virtual_backends())
async def test_writers_closed_at_once_on_a_busy_loop_all_land(
    tmp_path: Path, clock: FakeClock
) -> None:
    """50 aclose() at once while the loop is busy past close_timeout: every last state lands."""
    store = FileStore(tmp_path)
    states = sessions(N)
    writers = [
        await writer_for(
            st,
            store,
            clock,
            write_on_start=False,
            limits=Limits(close_timeout=1.0),
        ).__aenter__()
        for st in states
    ]
    busy = jump(10.0)
    first = states[0]

    def slow_source() -> Snapshot:  # the first final write: the loop is busy for 10 s
        busy()
        return Snapshot(first["key"], {"n": first["n"]})

    writers[0]._core._source = slow_source
    for st in states:
        st["n"] = 1
    results: list[Any] = []

    async def close(w: CheckpointWriter[Any]) -> None:
        results.append(await w.aclose())

    async with anyio.create_task_group() as tg:
        for w in writers:
            tg.start_soon(close, w)
    await anyio.to_thread.run_sync(final_threads_end)
    for r in results:
        if isinstance(r, Failed):  # late, never lost: the message says it goes on
            assert "goes on in a thread of its own" in r.error, r
            assert "nothing was written" not in r.error, r
        else:
            assert isinstance(r, Written), r
    assert_all_landed(store, states)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", virtual_backends())
async def test_final_write_behind_a_write_now_past_close_timeout_lands(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A write_now() stuck past close_timeout: aclose() says so, and its final state lands after."""
    store = GateStore(tmp_path)
    st = {"key": "s0", "n": 1}
    writer = await writer_for(
        st,
        store,
        clock,
        limits=Limits(close_timeout=1.0),
    ).__aenter__()
    st["n"] = 2
    store.hold = True
    move_on = jump(10.0)
    result: list[Any] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(writer.write_now)
        await anyio.to_thread.run_sync(store.entered.wait)
        st["n"] = 3

        async def close() -> None:
            result.append(await writer.aclose())

        tg.start_soon(close)
        for _ in range(20):  # the close gets to wait for the write lock
            await anyio.lowlevel.checkpoint()
        assert not result
        move_on()  # past close_timeout, the write_now still held
        for _ in range(100_000):  # hang guard (the virtual clocks never sleep idle)
            if result:
                break
            await anyio.lowlevel.checkpoint()
        assert isinstance(result[0], Failed), result[0]
        assert "a write in flight held the writer until then" in result[0].error
        assert "goes on in a thread of its own" in result[0].error
        store.gate.set()
    await anyio.to_thread.run_sync(final_threads_end)
    assert_all_landed(store, [st])


@pytest.mark.anyio
async def test_task_group_cancelled_at_shutdown_keeps_every_last_state(
    tmp_path: Path, clock: FakeClock
) -> None:
    """One task per session, the task group cancelled: every last state on disk, live=False."""
    store = FileStore(tmp_path)
    states = sessions(N)
    opened = anyio.Event()
    count = [0]

    async def session(st: dict[str, Any]) -> None:
        async with writer_for(st, store, clock):
            count[0] += 1
            if count[0] == N:
                opened.set()
            await anyio.sleep_forever()

    async with anyio.create_task_group() as tg:
        for st in states:
            tg.start_soon(session, st)
        await opened.wait()
        for st in states:
            st["n"] = 1
        tg.cancel_scope.cancel()
    assert_all_landed(store, states)


# -- the once-per-root temp sweep -------------------------------------------------------


@pytest.fixture
def sweeps(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The real paths FileStore.open swept, in order."""
    from checkpointer._stores import atomic, files

    done: list[str] = []
    real = atomic.sweep_temps

    def sweep(root: str) -> list[str]:
        done.append(os.path.realpath(root))
        return real(root)

    monkeypatch.setattr(files, "sweep_temps", sweep)
    monkeypatch.setattr(files, "_swept", {})
    return done


def test_sweep_runs_once_per_directory(tmp_path: Path, sweeps: list[str]) -> None:
    """Many opens of one root sweep it once; a relative root after chdir is another directory."""
    (tmp_path / "a" / "r").mkdir(parents=True)
    (tmp_path / "b" / "r").mkdir(parents=True)
    here = os.getcwd()
    try:
        os.chdir(tmp_path / "a")
        for _ in range(3):
            FileStore("r").open()
        os.chdir(tmp_path / "b")
        FileStore("r").open()
    finally:
        os.chdir(here)
    assert sweeps == [str((tmp_path / "a" / "r").resolve()), str((tmp_path / "b" / "r").resolve())]


def test_sweep_again_for_a_recreated_root_and_after_sweep_every(
    tmp_path: Path, sweeps: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A root deleted and made again is swept again; so is any root after SWEEP_EVERY."""
    from checkpointer._stores import files

    root = tmp_path / "r"
    root.mkdir()
    FileStore(root).open()
    old = root.rename(tmp_path / "old")  # kept: the new root cannot reuse its inode
    root.mkdir()
    FileStore(root).open()
    assert len(sweeps) == 2
    FileStore(root).open()
    assert len(sweeps) == 2
    monkeypatch.setattr(files, "SWEEP_EVERY", 0.0)  # a sibling may have died since
    FileStore(root).open()
    assert len(sweeps) == 3
    assert old.exists()
