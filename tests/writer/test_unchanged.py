"""'Unchanged' means unchanged: the meta the caller controls, and refusals that wait.

A write is skipped as unchanged only when the store holds the same state
*and* the same caller-controlled meta (``Snapshot.parent``, the pin,
``Meta.turns`` from ``prepare``).  A history that ``transcript_prepare``
cannot make sendable is not retried with backoff: no retry can succeed
until the history changes, so the writer waits for the next change, and
its log line says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from checkpointer import (
    CheckpointWriter,
    Failed,
    FileStore,
    JournalStore,
    Limits,
    Skipped,
    Snapshot,
    Transcript,
    Written,
    load,
)
from checkpointer.stores import Store
from tests.conftest import FakeClock

STORES = [
    pytest.param(FileStore, id="file"),
    pytest.param(JournalStore, id="journal"),
]


@pytest.mark.parametrize("make", STORES)
@pytest.mark.parametrize("fingerprint", [False, True], ids=["no-fingerprint", "fingerprint"])
def test_a_new_parent_with_the_same_state_is_written(
    tmp_path: Path, make: type[Store], fingerprint: bool
) -> None:
    """Snapshot.parent changed, state equal: Written with the new Meta.parent, not skipped."""
    state = {"messages": [{"role": "user", "content": "hi"}]}
    parent: list[str | None] = [None]
    store = make(tmp_path)  # type: ignore[call-arg]
    writer = CheckpointWriter(
        lambda: Snapshot("s", state, parent=parent[0]),
        store,
        exit_hooks=False,
        transcript=Transcript(repair=False) if fingerprint else None,
    ).open()
    assert isinstance(writer.flush_sync(), Skipped)  # written on open
    parent[0] = "origin"
    assert isinstance(writer.flush_sync(), Written)
    cp = load(store, "s")
    assert cp is not None and cp.meta.parent == "origin"
    assert isinstance(writer.flush_sync(), Skipped)  # now it is unchanged
    parent[0] = None
    assert isinstance(writer.flush_sync(), Written)
    writer.close()
    cp = load(store, "s")
    assert cp is not None and cp.meta.parent is None and cp.meta.live is False


def orphan_history() -> dict[str, Any]:
    return {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "tool", "tool_call_id": "ghost", "content": "a result nobody asked for"},
        ]
    }


@pytest.mark.anyio
async def test_an_unsendable_history_waits_for_a_change(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Failed('not-sendable') is not retried with backoff: no attempt until the next
    change, one log line saying it waits; once the history is fixed, it is written."""
    state = orphan_history()
    store = FileStore(tmp_path)
    with caplog.at_level(logging.WARNING, logger="checkpointer"):
        async with CheckpointWriter(
            lambda: Snapshot("s", state),
            store,
            clock=clock,
            exit_hooks=False,
            transcript=Transcript(),
            debounce=0.0,
            min_interval=0.0,
            limits=Limits(retry_initial=1.0, retry_max=2.0),
        ) as writer:
            assert writer.statistics().failures == 1  # the write on start
            writer.notify()
            await clock.step(0.1)
            assert writer.statistics().failures == 2
            await clock.step(1000.0)
            stats = writer.statistics()
            assert (stats.failures, stats.pending) == (2, False)  # no retry loop
            state["messages"].pop()
            writer.notify()
            await clock.step(0.1)
            stats = writer.statistics()
            assert (stats.writes, stats.failures) == (1, 2)
    cp = load(store, "s")
    assert cp is not None and cp.state == {"messages": [{"role": "user", "content": "hi"}]}
    lines = [r.getMessage() for r in caplog.records if "not-sendable" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "not retrying until the session changes" in lines[0]
    assert "retrying with backoff" not in lines[0]


def test_an_unsendable_final_write_fails_and_keeps_the_file(tmp_path: Path) -> None:
    """Closing with an unsendable history: Failed('not-sendable'), the last good file stays."""
    state = {"messages": [{"role": "user", "content": "hi"}]}
    store = FileStore(tmp_path)
    writer = CheckpointWriter(
        lambda: Snapshot("s", state), store, exit_hooks=False, transcript=Transcript()
    ).open()
    good = load(store, "s")
    state.update(orphan_history())
    result = writer.close()
    assert isinstance(result, Failed) and result.reason == "not-sendable"
    assert load(store, "s") == good


@pytest.mark.parametrize("make", STORES)
@pytest.mark.parametrize(
    "change",
    [
        lambda state: state.update(title="renamed"),
        lambda state: state["tools"].update(cart=["apple"]),
        lambda state: state.update(step=1.0),  # a type-only change: 1 -> 1.0
    ],
    ids=["title", "tool-state", "type-only"],
)
def test_a_change_outside_the_messages_is_written(
    tmp_path: Path, make: type[Store], change: Callable[[dict[str, Any]], None]
) -> None:
    """With a transcript, a field beside the messages changing (the messages as they were)
    is written, not skipped: the fingerprint covers the whole state but earlier messages."""
    state: dict[str, Any] = {
        "messages": [{"role": "user", "content": "hi"}],
        "title": "t",
        "tools": {},
        "step": 1,
    }
    store = make(tmp_path)  # type: ignore[call-arg]
    with CheckpointWriter(
        lambda: Snapshot("s", state), store, transcript=Transcript(), exit_hooks=False
    ) as writer:
        change(state)
        assert isinstance(writer.flush_sync(), Written)
    cp = load(store, "s")
    assert cp is not None and msgspec.json.encode(cp.state) == msgspec.json.encode(state)


class _Running(msgspec.Struct, tag=True):
    messages: list[Any]
    step: int


class _Paused(msgspec.Struct, tag=True):
    messages: list[Any]
    step: int


class _Camel(msgspec.Struct, rename="camel"):
    messages: list[Any]
    user_name: str


@pytest.mark.parametrize("make", STORES)
def test_a_struct_state_s_type_change_beside_the_messages_is_written(
    tmp_path: Path, make: Callable[[Path], Store]
) -> None:
    """With a transcript, a Struct state that becomes another tagged Struct (a state
    machine's step), or a dict that becomes a renaming Struct, is written: the part of the
    state beside the messages is fingerprinted as the store encodes it."""
    store = make(tmp_path)
    message = {"role": "user", "content": "hi"}
    states: list[Any] = [
        _Running([message], 3),
        _Paused([message], 3),
        {"messages": [message], "user_name": "bob"},
        _Camel([message], "bob"),
    ]
    state: list[Any] = [states[0]]
    with CheckpointWriter(
        lambda: Snapshot("k", state[0]), store, transcript=Transcript("messages")
    ) as writer:
        for new in states[1:]:
            state[0] = new
            assert isinstance(writer.flush_sync(), Written), new
    stored = load(store, "k")
    assert stored is not None and "userName" in stored.state
