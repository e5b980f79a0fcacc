"""checkpointer.pydantic_ai over its SessionRegistry: conversations saved alongside each other
(one held in its store write never stalls another's save), and memory that follows the
conversations held, not every one ever saved."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

pytest.importorskip("pydantic_ai")

from checkpointer import FileStore
from checkpointer.pydantic_ai import CheckpointConversationStore
from tests._support import HANG_GUARD
from tests.adapters.test_pydantic_ai import _saved

pytestmark = pytest.mark.anyio


class HeldStore(FileStore):
    """Holds each write of ``pa-slow`` until ``gate`` is set; ``entered`` once one waits."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.gate, self.entered = threading.Event(), threading.Event()

    def write(self, key: str, chunks: Any, **kw: Any) -> Any:
        if key == "pa-slow":
            self.entered.set()
            assert self.gate.wait(HANG_GUARD)
        return super().write(key, chunks, **kw)


async def test_a_save_held_in_its_store_write_never_stalls_another_conversation(
    tmp_path: Path,
) -> None:
    """While "slow"'s save waits in its store write, "fast" is saved twice; then "slow" lands."""
    store = HeldStore(tmp_path)
    try:
        async with CheckpointConversationStore(store) as conversations:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_saved, conversations, "slow", "a")
                await anyio.to_thread.run_sync(store.entered.wait, HANG_GUARD)
                with anyio.fail_after(HANG_GUARD):  # a stall waits for the gate: forever
                    await _saved(conversations, "fast", "b")
                    await _saved(conversations, "fast", "c")
                assert not store.gate.is_set()
                store.gate.set()
            slow, fast = await conversations.load("slow"), await conversations.load("fast")
            assert slow is not None and fast is not None
            assert (len(slow.messages), len(fast.messages)) == (4, 8)
    finally:
        store.gate.set()


async def test_memory_follows_the_conversations_held(tmp_path: Path) -> None:
    """60 conversations saved through max_open=4: what the adapter and the store keep is the
    held ones' (their entries' index, their locks), none of the others'."""
    store = FileStore(tmp_path)
    async with CheckpointConversationStore(store, max_open=4) as conversations:
        for i in range(60):
            await _saved(conversations, f"c{i}", "a")
        held = conversations._registry.statistics().open
        assert held <= 4
        assert len(conversations._where) == 4 * held  # four messages a conversation
        assert len(conversations._writing) == 0
        assert len(store._locks) == held
        assert len(store._mutexes.by_key) == 0
    assert (len(conversations._where), len(store._locks)) == (0, 0)


@pytest.mark.parametrize("option", ["write_on_start", "exit_hooks"])
def test_options_the_store_sets_itself_are_refused_in_its_name(tmp_path: Path, option: str) -> None:
    """Not silently overridden, and the error names the class the user called."""
    with pytest.raises(TypeError, match=f"CheckpointConversationStore sets '{option}'"):
        CheckpointConversationStore(FileStore(tmp_path), **{option: False})
