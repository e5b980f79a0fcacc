"""``SessionRegistry`` under cancels and concurrent closes: an evicting request cancelled, aclose()
while a block runs, openings racing for room, a native cancel while ``resume`` runs.

Checked on the bytes stored; a store's writes are held on an event where a close must be in
flight.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from checkpointer import Checkpoint, FileStore, Written, _registry
from tests.writer.test_registry import Sessions, stored, until_open

pytestmark = pytest.mark.anyio


class GatedStore(FileStore):
    """Holds each write of a key in ``gated`` until ``gate`` is set."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.gate = threading.Event()
        self.gated: set[str] = set()

    def write(self, key: str, chunks: Any, **kw: Any) -> Any:
        if key in self.gated:
            assert self.gate.wait(5)
        return super().write(key, chunks, **kw)


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[Sessions]:
    store = GatedStore(tmp_path)
    yield Sessions(store)
    store.gate.set()


async def test_an_eviction_whose_request_is_cancelled_still_stores_the_victim(
    sessions: Sessions, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request that evicts "v" is cancelled while v's close waits for a slot: v's last
    change is stored all the same, and on_close gets its final write."""
    monkeypatch.setattr(_registry, "_CLOSING_AT_ONCE", 1)  # one close at a time: "slow"'s
    store = sessions.store
    assert isinstance(store, GatedStore)
    async with sessions.registry(max_open=2) as registry:
        for key in ("slow", "v"):
            await _use(registry, key)
        sessions.n["slow"], sessions.n["v"] = 1, 42  # written only by their final writes
        store.gated.add("slow")
        async with anyio.create_task_group() as tg:
            tg.start_soon(_use, registry, "w")  # evicts "slow", whose close holds the slot
            await anyio.wait_all_tasks_blocked()
            with anyio.CancelScope() as request:
                request.cancel()  # lands as the opening of "x" waits for v's close
                async with registry.session("x"):
                    raise AssertionError("opened through a cancel")
            store.gate.set()
        await until_open(registry, 1)  # "w"
        assert stored(store, "v") == (42, False)
        assert [isinstance(result, Written) for key, result in sessions.closed if key == "v"] == [
            True
        ]


async def test_aclose_waits_for_a_block_and_closes_the_key_as_it_ends(sessions: Sessions) -> None:
    """aclose() from another task while a request is inside session(): the block's writes still
    land, on_close runs after the block, and the key is closed once it ends."""
    events: list[str] = []
    entered, go_on = anyio.Event(), anyio.Event()
    registry = sessions.registry()

    async def request() -> None:
        async with registry.session("u") as writer:
            sessions.n["u"] = 1
            entered.set()
            await go_on.wait()
            sessions.n["u"] = 2
            assert isinstance(await writer.write_now(), Written)
            events.append("block ends")

    async def close() -> None:
        await registry.aclose()
        events.append("aclose returns")

    async with registry, anyio.create_task_group() as tg:
        tg.start_soon(request)
        await entered.wait()
        tg.start_soon(close)
        await anyio.wait_all_tasks_blocked()
        assert events == [] and sessions.closed == []
        go_on.set()
    assert events == ["block ends", "aclose returns"]
    assert [key for key, _ in sessions.closed] == ["u"]
    assert stored(sessions.store, "u") == (2, False)


async def test_a_cancelled_aclose_leaves_a_block_to_close_its_key(sessions: Sessions) -> None:
    """aclose() cancelled while it waits for a block: the key closes as the block ends."""
    go_on = anyio.Event()
    registry = sessions.registry()
    async with anyio.create_task_group() as tg:

        async def request() -> None:
            async with registry.session("u"):
                await go_on.wait()
                sessions.n["u"] = 5

        tg.start_soon(request)
        await anyio.wait_all_tasks_blocked()
        with anyio.CancelScope() as scope:
            scope.cancel()
            await registry.aclose()
        assert registry.statistics().open == 1
        go_on.set()
    await registry.aclose()
    assert stored(sessions.store, "u") == (5, False)
    assert registry.statistics().open == 0


async def test_openings_at_once_evict_only_the_keys_they_need(sessions: Sessions) -> None:
    """max_open=3 held, 2 new keys asked for at once while the closes are slow: 2 evicted."""
    store = sessions.store
    assert isinstance(store, GatedStore)
    async with sessions.registry(max_open=3) as registry:
        for key in ("a", "b", "c"):
            async with registry.session(key):
                sessions.n[key] = 1  # written by its final write
            store.gated.add(key)
        async with anyio.create_task_group() as tg:
            for key in ("x", "y"):
                tg.start_soon(_use, registry, key)
            await anyio.wait_all_tasks_blocked()
            store.gate.set()
        assert registry.statistics().evicted == 2


async def _use(registry: Any, key: str) -> None:
    async with registry.session(key):
        pass


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_native_cancel_during_resume_calls_on_close_after_resume_returns(
    sessions: Sessions,
) -> None:
    """asyncio: Ctrl-C cancels the main task natively while resume runs in its thread; on_close
    must come after resume returned (it drops what resume made)."""
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    assert task is not None
    order: list[str] = []

    def resume(key: str) -> Checkpoint[Any] | None:
        loop.call_soon_threadsafe(task.cancel)
        time.sleep(0.2)  # the cancel lands now, resume still running
        sessions.n[key] = 0
        order.append("resume returned")
        return None

    registry = _registry.SessionRegistry(
        sessions.source,
        sessions.store,
        resume=resume,
        on_close=lambda key, result: order.append(f"on_close {key in sessions.n}"),
    )
    with pytest.raises(asyncio.CancelledError):
        async with registry.session("u"):
            raise AssertionError("opened through a cancel")
    task.uncancel()
    await registry.aclose()
    assert order == ["resume returned", "on_close True"]
