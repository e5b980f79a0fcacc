"""A transcript writer given a state without messages takes it whole, in all three steps.

``transcript_messages`` is the one rule: a list or a tuple under the field of a
dict or a Struct.  Any other state (before the first message, None or a dict
under the field, a list as the state) is encoded whole, fingerprinted whole and
never repaired, on every store and with every ``Transcript`` setting.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from checkpointer import (
    CheckpointWriter,
    FileStore,
    JournalStore,
    Skipped,
    Snapshot,
    Transcript,
    Written,
    load,
)
from checkpointer._transcript.fingerprint import transcript_fingerprint
from checkpointer._transcript.prepare import transcript_prepare
from checkpointer._values import Prepared, transcript_messages
from checkpointer.stores import Store


@dataclass
class Session:
    messages: list[Any]


class Boxed(msgspec.Struct):
    messages: Any = None


UNCLOSED = [{"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f"}}]}]
WHOLE: dict[str, Any] = {
    "no field yet": {"title": "new session"},
    "field None": {"messages": None},
    "field a dict": {"messages": {"a": 1}},
    "field a str": {"messages": "s"},
    "a list state": [1, 2, 3],
    "a Struct, field None": Boxed(),
    "a dataclass": Session(UNCLOSED),  # dataclass states are not transcripts: never repaired
}
SETTINGS: list[dict[str, Any]] = [{}, {"repair": False}, {"fingerprint": False}]


@pytest.mark.parametrize("name", list(WHOLE))
def test_the_three_steps_agree(name: str) -> None:
    state = WHOLE[name]
    snapshot = Snapshot("k", state)
    assert transcript_messages(state, "messages") is None
    assert Transcript().split(state) is None
    prepared = transcript_prepare()(snapshot)
    assert isinstance(prepared, Prepared) and prepared.snapshot is snapshot
    assert prepared.turns is None and prepared.repaired == 0
    fingerprint = transcript_fingerprint()
    assert fingerprint(snapshot) == fingerprint(Snapshot("k", state))


@pytest.mark.parametrize("make", [FileStore, JournalStore], ids=["file", "journal"])
@pytest.mark.parametrize("settings", SETTINGS, ids=["default", "no-repair", "no-fingerprint"])
@pytest.mark.parametrize("name", list(WHOLE))
def test_a_state_without_messages_is_written_whole(
    tmp_path: Path, make: type[Store], settings: dict[str, Any], name: str
) -> None:
    state = WHOLE[name]
    store = make(tmp_path)  # type: ignore[call-arg]
    writer = CheckpointWriter(
        lambda: Snapshot("k", state), store, transcript=Transcript(**settings), exit_hooks=False
    )
    with writer:
        pass
    assert writer.statistics().last_failure is None
    checkpoint = load(store, "k")
    assert checkpoint is not None
    assert checkpoint.state == msgspec.to_builtins(state)


@pytest.mark.parametrize("make", [FileStore, JournalStore], ids=["file", "journal"])
def test_a_whole_state_is_fingerprinted_whole(tmp_path: Path, make: type[Store]) -> None:
    """Unchanged is skipped, any change is written, then the first message starts a transcript."""
    state: dict[str, Any] = {"title": "a"}
    store = make(tmp_path)  # type: ignore[call-arg]
    writer = CheckpointWriter(
        lambda: Snapshot("k", state), store, transcript=Transcript(), exit_hooks=False
    ).open()
    try:
        assert writer.flush_sync() == Skipped("unchanged")  # written on open
        state["title"] = "b"
        assert isinstance(writer.flush_sync(), Written)
        state["messages"] = UNCLOSED
        assert isinstance(writer.flush_sync(), Written)
    finally:
        writer.close()
    checkpoint = load(store, "k")
    assert checkpoint is not None
    assert checkpoint.meta.turns == 1 and len(checkpoint.state["messages"]) == 2  # closed
