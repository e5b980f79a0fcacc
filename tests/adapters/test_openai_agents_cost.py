"""checkpointer.openai_agents: a write costs the change, in CPU as in bytes.

The session keeps each item as its JSON bytes (``msgspec.Raw``): copies in,
copies out, so nothing the SDK or the user holds is the stored item, and the
journal's check that the stored prefix is unchanged compares pointers instead
of encoding the history again.  Work is counted (items encoded, the thread
that decodes), never timed.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest

pytest.importorskip("agents")
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

from checkpointer import JournalStore, Skipped, Written, load
from checkpointer import openai_agents as oa
from checkpointer.openai_agents import CheckpointSession, session_key

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    """The Agents SDK is asyncio-only."""
    return "asyncio"


class CountingEncoder:
    """A msgspec JSON encoder that counts the messages it encodes (a list: each item)."""

    def __init__(self) -> None:
        self.inner = msgspec.json.Encoder()
        self.count = 0

    def _counted(self, obj: Any) -> None:
        self.count += len(obj) if isinstance(obj, list | tuple) else 1

    def encode(self, obj: Any) -> bytes:
        self._counted(obj)
        return self.inner.encode(obj)

    def encode_into(self, obj: Any, buffer: bytearray, offset: int = 0) -> None:
        self._counted(obj)
        self.inner.encode_into(obj, buffer, offset)


def _item(i: int) -> dict[str, Any]:
    return {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"}


def _on_disk(root: Path) -> list[Any]:
    checkpoint = load(JournalStore(root), session_key("chat"))
    assert checkpoint is not None
    return list(checkpoint.state["messages"])


async def test_a_write_encodes_the_new_item_only(tmp_path: Path) -> None:
    """With 2,000 items stored, adding one encodes one item (and the state around the
    items), not the 2,000 again to check them: an append, whatever the history."""
    store = JournalStore(tmp_path)
    async with CheckpointSession("chat", store, durability="sync") as session:
        await session.add_items([_item(i) for i in range(2000)])  # type: ignore[misc]
        counting = store._transcript.encoder = CountingEncoder()  # type: ignore[assignment]
        before = store.statistics(session.key)
        for i in range(2000, 2003):
            counting.count = 0
            await session.add_items([_item(i)])  # type: ignore[list-item]
            assert counting.count <= 2, counting.count  # the new item, the session id around it
        after = store.statistics(session.key)
    assert (after.appends - before.appends, after.compactions, after.rewrites) == (
        3,
        before.compactions,
        before.rewrites,
    )
    assert _on_disk(tmp_path) == [_item(i) for i in range(2003)]


async def test_get_items_decodes_in_a_worker_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """get_items decodes the stored items off the event loop's thread (and pop_item its one)."""
    threads: list[int] = []
    decoded = oa._decoded

    def spy(stored: Any) -> list[Any]:
        threads.append(threading.get_ident())
        return decoded(stored)

    monkeypatch.setattr(oa, "_decoded", spy)
    async with CheckpointSession("chat", JournalStore(tmp_path)) as session:
        await session.add_items([_item(i) for i in range(3000)])  # type: ignore[misc]
        threads.clear()
        assert await session.get_items() == [_item(i) for i in range(3000)]
        assert await session.get_items(limit=2) == [_item(2998), _item(2999)]
    assert threads and threading.get_ident() not in threads


class _Watched(list[Any]):
    """A session's held items that note the thread of each slice taken of them."""

    threads: list[int]

    def __getitem__(self, at: Any) -> Any:
        if isinstance(at, slice):
            self.threads.append(threading.get_ident())
        return super().__getitem__(at)


async def test_get_items_copies_the_history_in_a_worker_thread(tmp_path: Path) -> None:
    """get_items takes its copy of the held items off the event loop's thread too (a
    100,000-item slice is no loop stall), and hands its caller the list's only reference:
    no worker thread frees it later, holding the GIL, in the middle of another call."""
    async with CheckpointSession("chat", JournalStore(tmp_path)) as session:
        await session.add_items([_item(i) for i in range(3000)])  # type: ignore[misc]
        held = session._sessions._held[session.key]  # type: ignore[union-attr]
        held.items = watched = _Watched(held.items)
        watched.threads = []
        items = await session.get_items()
        assert sys.getrefcount(items) == 2  # ``items`` and the argument
        assert items == [_item(i) for i in range(3000)]
        assert await session.get_items(limit=2) == [_item(2998), _item(2999)]
        sliced_in = list(watched.threads)  # not the final write's slice of the new items
    assert len(sliced_in) == 2 and threading.get_ident() not in sliced_in


async def test_items_held_outside_are_copies_and_a_replaced_item_is_written(
    tmp_path: Path,
) -> None:
    """Editing a dict given to add_items or returned by get_items changes nothing (Skipped,
    the disk as added); a popped item added back with a type-only change (2 -> 2.0) is
    written, and the disk has the float."""
    async with CheckpointSession("chat", JournalStore(tmp_path), durability="sync") as opened:
        session: Any = opened
        given = {"role": "tool", "n": 2}
        await session.add_items([_item(0), given])
        given["n"] = 3
        (shown := await session.get_items())[1]["n"] = 4
        assert shown[1] is not given
        assert await session.writer.write_now() == Skipped("unchanged")
        assert await session.get_items() == [_item(0), {"role": "tool", "n": 2}]
        assert await session.pop_item() == {"role": "tool", "n": 2}
        await session.add_items([{"role": "tool", "n": 2.0}])
        assert isinstance(session.writer.statistics().last_result, Written)
    stored = _on_disk(tmp_path)
    assert stored == [_item(0), {"role": "tool", "n": 2.0}]
    assert type(stored[1]["n"]) is float
