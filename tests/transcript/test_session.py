"""The writer with a transcript prepare step, and the session meta it writes."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import msgspec
import pytest

import checkpointer
from checkpointer import (
    CheckpointWriter,
    Failed,
    FileStore,
    Limits,
    Skipped,
    Snapshot,
    Transcript,
    Written,
    load,
)
from checkpointer._values import Prepared
from checkpointer._writer import commit as _commit
from checkpointer._writer.commit import run_prepare
from checkpointer.messages import validate_history
from tests.conftest import FakeClock
from tests.transcripts import Chat, Messages

pytestmark = pytest.mark.anyio


class Agent:
    """A live session: a key, a parent, and a history that grows."""

    def __init__(self, style: Chat | Messages, key: str = "s1") -> None:
        self.style = style
        self.key = key
        self.parent: str | None = None
        self.messages: list[Any] = []

    def snapshot(self) -> Snapshot:
        return Snapshot(self.key, {"messages": self.messages}, parent=self.parent)


def writer_for(agent: Agent, store: Any, clock: FakeClock, **kw: Any) -> CheckpointWriter[Any]:
    kw.setdefault("exit_hooks", False)
    kw.setdefault("transcript", Transcript(fingerprint=False))
    return CheckpointWriter(agent.snapshot, store, clock=clock, **kw)


@pytest.mark.parametrize("style", [Chat(False), Messages(True)], ids=["chat-dict", "msg-struct"])
async def test_written_file_is_sendable_and_reports_repairs(
    tmp_path: Path, clock: FakeClock, style: Chat | Messages
) -> None:
    """A snapshot taken mid-tool-call is written repaired and settled; the live history
    is untouched; Written and statistics say how many were repaired and settled."""
    agent = Agent(style)
    store = FileStore(tmp_path)
    async with writer_for(agent, store, clock) as writer:
        agent.messages += [*style.user("hi"), *style.call("a", "b")]
        agent.messages += style.results("a", running=("a",))
        before = msgspec.json.encode(agent.messages)
        result = await writer.write_now()
        assert isinstance(result, Written)
        assert (result.repaired, result.settled) == (1, 1)
        assert msgspec.json.encode(agent.messages) == before
        stats = writer.statistics()
        assert (stats.repaired, stats.settled) == (1, 1)
        cp = load(store, "s1")
        assert cp is not None
        assert validate_history(cp.state["messages"]) == []
        added = 1 if isinstance(style, Chat) else 0  # a tool message, or a block merged in
        assert len(cp.state["messages"]) == len(agent.messages) + added
        del agent.messages[2:]  # the tools finish: their results replace the running one
        agent.messages += [*style.results("a", "b"), *style.answer("done")]
        result = await writer.write_now()
        assert isinstance(result, Written) and (result.repaired, result.settled) == (0, 0)
    cp = load(store, "s1")
    assert cp is not None and cp.meta.turns == 2


async def test_not_sendable_fails_and_keeps_the_previous_file(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A history repair cannot fix (an orphan result) is Failed('not-sendable'); the file
    on disk stays as it was and the writer goes on once the history is fixed."""
    style = Chat(False)
    agent = Agent(style)
    agent.messages += style.user("hi")
    store = FileStore(tmp_path)
    async with writer_for(agent, store, clock) as writer:
        good = Path(store.location("s1")).read_bytes()
        agent.messages += style.results("ghost")
        result = await writer.write_now()
        assert isinstance(result, Failed) and result.reason == "not-sendable"
        assert "$.state.messages[1]" in result.error
        assert Path(store.location("s1")).read_bytes() == good
        agent.messages.pop()
        agent.messages += style.answer("hello")
        assert isinstance(await writer.write_now(), Written)


async def test_session_meta(tmp_path: Path, clock: FakeClock) -> None:
    """Meta carries turns a reader can count, the parent read at every write, the writer
    (pid, host) and the library version; created_at survives a new writer."""
    style = Chat(False)
    agent = Agent(style)
    store = FileStore(tmp_path)
    async with writer_for(agent, store, clock) as writer:
        agent.messages += [*style.user("q"), *style.answer("a")]
        await writer.write_now()
        cp = load(store, "s1")
        assert cp is not None
        meta = cp.meta
        assert meta.turns == 1 == sum(m["role"] == "assistant" for m in cp.state["messages"])
        assert meta.parent is None
        assert meta.writer is not None
        assert (meta.writer.pid, meta.writer.host) == (os.getpid(), socket.gethostname())
        assert meta.library_version == checkpointer.__version__
        agent.parent = "root-session"
        agent.messages += style.answer("b")
        await writer.write_now()
        cp2 = load(store, "s1")
        assert cp2 is not None and cp2.meta.parent == "root-session" and cp2.meta.turns == 2
    async with writer_for(agent, store, clock) as writer:
        agent.messages += style.answer("c")
        await writer.write_now()
    cp3 = load(store, "s1")
    assert cp3 is not None
    assert cp3.meta.created_at == meta.created_at
    assert cp3.meta.turns == 3


async def test_prepare_runs_after_the_fingerprint(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unchanged fingerprint skips the write before prepare runs (no O(n) work)."""
    style = Chat(False)
    agent = Agent(style)
    agent.messages += style.user("hi")
    calls: list[int] = []
    real = _commit.transcript_prepare  # type: ignore[attr-defined]

    def counting(**kw: Any) -> Any:
        inner = real(**kw)

        def prepare(snapshot: Snapshot) -> Prepared | Failed:
            calls.append(1)
            return inner(snapshot)

        return prepare

    monkeypatch.setattr(_commit, "transcript_prepare", counting)
    store = FileStore(tmp_path)
    async with writer_for(agent, store, clock, transcript=Transcript()) as writer:
        assert len(calls) == 1
        assert await writer.write_now() == Skipped("unchanged")
        assert len(calls) == 1


def test_a_raising_prepare_is_a_failed_value() -> None:
    """A prepare step raising is Failed('snapshot-failed')."""

    def boom(snapshot: Snapshot) -> Prepared:
        raise RuntimeError("nope")

    snapshot = Agent(Chat(False)).snapshot()
    result = run_prepare(boom, snapshot)
    assert isinstance(result, Failed) and result.reason == "snapshot-failed"
    assert "prepare() raised RuntimeError: nope" in result.error


def test_old_meta_without_new_fields_loads(tmp_path: Path) -> None:
    """A file written before the session-meta fields loads, with their defaults."""
    (tmp_path / "old.json").write_bytes(
        b'{"format":1,"meta":{"key":"old","seq":3,"created_at":"2024-01-01T00:00:00Z",'
        b'"updated_at":"2024-01-02T00:00:00Z","live":false,"pinned":false},"state":{"x":1}}'
    )
    cp = load(FileStore(tmp_path), "old")
    assert cp is not None
    meta = cp.meta
    assert (meta.turns, meta.parent, meta.writer, meta.library_version) == (None,) * 4
    assert meta.state_version == 0


def test_version_is_the_package_version() -> None:
    """checkpointer.__version__ (stamped into Meta) matches the installed distribution."""
    from importlib.metadata import version

    assert checkpointer.__version__ == version("agent-checkpointer")


def test_bad_new_arguments() -> None:
    """transcript must be a Transcript; state_version and lock_timeout must be in range."""
    store = FileStore("unused")
    with pytest.raises(TypeError, match="transcript"):
        CheckpointWriter(lambda: None, store, transcript=42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="state_version"):
        CheckpointWriter(lambda: None, store, state_version=-1)
    with pytest.raises(ValueError, match="lock_timeout"):
        Limits(lock_timeout=float("inf"))
