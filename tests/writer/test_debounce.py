"""The writer on asyncio and trio, on virtual time (no wall-clock sleeps)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from checkpointer import (
    CheckpointWriter,
    Failed,
    FileStore,
    Limits,
    Skipped,
    Snapshot,
    Written,
    load,
)
from tests.conftest import FakeClock, RecordingStore

pytestmark = pytest.mark.anyio


class Session:
    """A stand-in agent session: a key and a list of messages."""

    def __init__(self, key: str | None = "s1") -> None:
        self.key = key
        self.messages: list[dict[str, Any]] = []

    def add(self, n: int = 1) -> None:
        for _ in range(n):
            self.messages.append({"role": "user", "content": f"m{len(self.messages)}"})

    def snapshot(self) -> Snapshot | None:
        return None if self.key is None else Snapshot(self.key, {"messages": self.messages})


def writer_for(session: Session, store: Any, clock: FakeClock, **kw: Any) -> CheckpointWriter[Any]:
    kw.setdefault("debounce", 1.0)
    kw.setdefault("min_interval", 2.0)
    kw.setdefault("max_wait", 10.0)
    kw.setdefault("exit_hooks", False)
    return CheckpointWriter(session.snapshot, store, clock=clock, **kw)


async def test_burst_is_one_write(tmp_path: Path, clock: FakeClock) -> None:
    """A burst of 50 events inside the debounce window is one write, due at t_last + debounce."""
    session = Session()
    store = RecordingStore(tmp_path, clock)
    async with writer_for(session, store, clock) as writer:
        await clock.advance(5.0)
        assert store.write_times == [0.0]  # write_on_start
        for _ in range(50):
            session.add()
            writer.notify()
        await clock.advance(5.9)
        assert store.write_times == [0.0]
        await clock.advance(6.0)
        assert store.write_times == [0.0, 6.0]
        assert writer.statistics().events == 50
        await clock.advance(100.0)
        assert store.write_times == [0.0, 6.0]
    cp = load(store, "s1")
    assert cp is not None
    assert len(cp.state["messages"]) == 50
    assert cp.meta.live is False
    assert cp.meta.seq == 3


async def test_steady_stream_writes_by_max_wait(tmp_path: Path, clock: FakeClock) -> None:
    """Events every 0.5 s never let the debounce expire; max_wait still forces a write."""
    session = Session()
    store = RecordingStore(tmp_path, clock)
    async with writer_for(session, store, clock, write_on_start=False) as writer:
        t = 0.0
        while t < 25.0:
            await clock.advance(t)
            session.add()
            writer.notify()
            t += 0.5
        await clock.advance(40.0)
    # first event at 0: due at 10, then 20; the tail (t_last=24.5) at 25.5, then close.
    assert store.write_times == [10.0, 20.0, 25.5, 40.0]


async def test_min_interval_spaces_write_starts(tmp_path: Path, clock: FakeClock) -> None:
    """Two scheduled writes never start closer than min_interval."""
    session = Session()
    store = RecordingStore(tmp_path, clock)
    async with writer_for(session, store, clock, debounce=0.1, min_interval=3.0) as writer:
        session.add()
        writer.notify()  # t=0, just after the start write: due at 0 + min_interval
        await clock.advance(3.5)
        session.add()
        writer.notify()  # due at max(3.5 + 0.1, 3.0 + 3.0)
        await clock.advance(10.0)
        assert store.write_times == [0.0, 3.0, 6.0]


async def test_unchanged_state_touches_no_file(tmp_path: Path, clock: FakeClock) -> None:
    """Without a fingerprint, an identical encoded state is Skipped('unchanged'); the file stays."""
    session = Session()
    session.add()
    store = RecordingStore(tmp_path, clock)
    async with writer_for(session, store, clock) as writer:
        path = Path(store.location("s1"))
        before = path.stat()
        writer.notify()
        await clock.advance(50.0)
        assert len(store.write_times) == 1
        assert writer.statistics().skipped == 1
        after = path.stat()
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
        assert await writer.write_now() == Skipped("unchanged")
        forced = await writer.write_now(force=True)
        assert isinstance(forced, Written)
        assert forced.seq == 2


async def test_fingerprint_skips_before_encoding(tmp_path: Path, clock: FakeClock) -> None:
    """An equal fingerprint skips the write even if the state changed in ways it ignores."""
    session = Session()
    store = RecordingStore(tmp_path, clock)
    calls: list[int] = []
    snapshot = session.snapshot

    def source() -> Snapshot:
        calls.append(1)
        snap = snapshot()
        assert snap is not None
        return msgspec.structs.replace(snap, fingerprint=len(snap.state["messages"]))

    session.snapshot = source  # type: ignore[method-assign]
    async with writer_for(session, store, clock) as writer:
        session.messages.append({"role": "user", "content": "x"})
        assert isinstance(await writer.write_now(), Written)
        session.messages[0]["content"] = "changed but same length"
        assert await writer.write_now() == Skipped("unchanged")
        session.add()
        assert isinstance(await writer.write_now(), Written)
    assert calls


async def test_pin_is_sticky_and_counts_as_change(tmp_path: Path, clock: FakeClock) -> None:
    """write_now(pin=True) writes even when content is unchanged, and later writes keep the pin."""
    session = Session()
    store = FileStore(tmp_path)
    async with writer_for(session, store, clock) as writer:
        result = await writer.write_now(pin=True)
        assert isinstance(result, Written)
        session.add()
        assert isinstance(await writer.write_now(), Written)
        cp = load(store, "s1")
        assert cp is not None and cp.meta.pinned is True
        assert isinstance(await writer.write_now(pin=False), Written)
        assert await writer.write_now(pin=False) == Skipped("unchanged")
    cp = load(store, "s1")
    assert cp is not None and cp.meta.pinned is False


async def test_pin_survives_a_new_writer(tmp_path: Path, clock: FakeClock) -> None:
    """A later writer of the same key keeps the pinned flag and created_at, and seq goes on."""
    session = Session()
    store = FileStore(tmp_path)
    async with writer_for(session, store, clock) as writer:
        await writer.write_now(pin=True)
    first = load(store, "s1")
    assert first is not None
    session.add()
    async with writer_for(session, store, clock) as writer:
        pass
    second = load(store, "s1")
    assert second is not None
    assert second.meta.pinned is True
    assert second.meta.created_at == first.meta.created_at
    assert second.meta.updated_at >= first.meta.updated_at
    assert second.meta.seq == first.meta.seq + 2  # start write + final write


async def test_key_change_finishes_old_key(tmp_path: Path, clock: FakeClock) -> None:
    """When the source's key changes, the old key's file is marked live=False, state intact."""
    session = Session("a")
    session.add(3)
    store = FileStore(tmp_path)
    async with writer_for(session, store, clock) as writer:
        old = load(store, "a")
        assert old is not None and old.meta.live is True
        session.key = "b"
        session.messages = []
        session.add()
        writer.notify()
        await clock.advance(5.0)
        a = load(store, "a")
        b = load(store, "b")
        assert a is not None and b is not None
        assert a.meta.live is False
        assert a.state == old.state
        assert b.meta.live is True
    b = load(store, "b")
    assert b is not None and b.meta.live is False


async def test_failures_are_values_with_backoff_and_recovery(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A failing store gives Failed, keeps the old file, retries with doubling backoff, recovers."""
    from tests.conftest import FaultyStore

    session = Session()
    session.add()
    store = FaultyStore(tmp_path, fail_at="fsync", clock=clock)
    async with writer_for(
        session,
        store,
        clock,
        debounce=0.0,
        min_interval=0.0,
        max_wait=1.0,
        limits=Limits(retry_initial=1.0),
    ) as writer:
        good = Path(store.location("s1")).read_bytes()
        store.failing = True
        session.add()
        writer.notify()
        await clock.advance(20.0)
        # attempt at 0 (start write), then 0 (event), retries 1, 2, 4, 8 s after each failure
        assert store.attempt_times == [0.0, 0.0, 1.0, 3.0, 7.0, 15.0]
        stats = writer.statistics()
        assert stats.failure_streak == 5
        assert stats.pending
        assert Path(store.location("s1")).read_bytes() == good
        assert sorted(p.name for p in tmp_path.iterdir()) == ["s1.json", "s1.lock"]  # no temps
        store.failing = False
        await clock.advance(40.0)
        assert store.attempt_times[-1] == 31.0
        assert writer.statistics().failure_streak == 0
        cp = load(store, "s1")
        assert cp is not None and len(cp.state["messages"]) == 2
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1
    assert "EIO" in warnings[0].getMessage() or "Input/output" in warnings[0].getMessage()


async def test_bad_sources_fail_and_writer_goes_on(tmp_path: Path, clock: FakeClock) -> None:
    """A raising source, a wrong return type and an unencodable state are Failed values."""
    store = FileStore(tmp_path)
    mode = {"v": "raise"}

    def source() -> Any:
        if mode["v"] == "raise":
            raise RuntimeError("boom")
        if mode["v"] == "wrong":
            return {"key": "s1"}
        if mode["v"] == "unencodable":
            return Snapshot("s1", {"x": object()})
        if mode["v"] == "badkey":
            return Snapshot("../evil", {})
        return Snapshot("s1", {"ok": True})

    async with CheckpointWriter(source, store, clock=clock, exit_hooks=False) as writer:
        assert writer.statistics().failures == 1
        r = await writer.write_now()
        assert isinstance(r, Failed) and r.reason == "snapshot-failed" and "boom" in r.error
        mode["v"] = "wrong"
        r = await writer.write_now()
        assert isinstance(r, Failed) and r.reason == "snapshot-failed" and "dict" in r.error
        mode["v"] = "unencodable"
        r = await writer.write_now()
        assert isinstance(r, Failed) and r.reason == "encode-failed" and "'s1'" in r.error
        mode["v"] = "badkey"
        r = await writer.write_now()
        assert isinstance(r, Failed) and r.reason == "invalid-key" and "../evil" in r.error
        mode["v"] = "ok"
        assert isinstance(await writer.write_now(), Written)
    assert sorted(p.name for p in tmp_path.parent.iterdir() if p.name.startswith("evil")) == []
    assert [p.name for p in tmp_path.iterdir()] == ["s1.json"]


async def test_no_identity_retries_once_through_the_timer(tmp_path: Path, clock: FakeClock) -> None:
    """A source with no identity at start is retried once after the debounce."""
    session = Session(None)
    store = RecordingStore(tmp_path, clock)
    async with writer_for(session, store, clock) as writer:
        assert writer.statistics().skipped == 1
        session.key = "late"
        await clock.advance(0.99)
        assert store.write_times == []
        await clock.advance(1.0)
        assert store.write_times == [1.0]
        assert await writer.write_now() == Skipped("unchanged")


async def test_after_close_everything_is_a_noop(tmp_path: Path, clock: FakeClock) -> None:
    """After close: notify is a no-op, write_now and flush_sync return Skipped('closed')."""
    session = Session()
    writer = writer_for(session, FileStore(tmp_path), clock)
    async with writer:
        pass
    writer.notify()
    assert writer.statistics().events == 0
    assert await writer.write_now() == Skipped("closed")
    assert writer.flush_sync("exit") == Skipped("closed")
    assert await writer.aclose() == Skipped("closed")


async def test_exception_in_body_still_writes_final(tmp_path: Path, clock: FakeClock) -> None:
    """Leaving by exception writes the last state with live=False and re-raises."""
    session = Session()
    store = FileStore(tmp_path)
    with pytest.raises(ZeroDivisionError):
        async with writer_for(session, store, clock) as writer:
            session.add(2)
            writer.notify()
            1 / 0  # noqa: B018
    cp = load(store, "s1")
    assert cp is not None and len(cp.state["messages"]) == 2 and cp.meta.live is False


async def test_cancellation_still_writes_final(tmp_path: Path, clock: FakeClock) -> None:
    """Leaving by cancellation writes the last state with live=False."""
    import anyio

    session = Session()
    store = FileStore(tmp_path)
    with anyio.CancelScope() as scope:
        async with writer_for(session, store, clock) as writer:
            session.add(3)
            writer.notify()
            scope.cancel()
            await anyio.sleep_forever()
    cp = load(store, "s1")
    assert cp is not None and len(cp.state["messages"]) == 3 and cp.meta.live is False


async def test_attach_subscribes_and_close_unsubscribes(tmp_path: Path, clock: FakeClock) -> None:
    """attach() wires notify to an event source; close unsubscribes."""
    callbacks: list[Any] = []

    def subscribe(cb: Any) -> Any:
        callbacks.append(cb)
        return lambda: callbacks.remove(cb)

    session = Session()
    async with writer_for(session, FileStore(tmp_path), clock) as writer:
        writer.attach(subscribe)
        assert len(callbacks) == 1
        callbacks[0]("run-ended", agent="x")
        assert writer.statistics().events == 1
    assert callbacks == []


async def test_notify_from_threads(tmp_path: Path, clock: FakeClock) -> None:
    """notify() from 8 threads at once loses no event and wakes the writer."""
    import anyio

    session = Session()
    session.add()
    store = RecordingStore(tmp_path, clock)
    async with writer_for(session, store, clock) as writer:

        def hammer() -> None:
            for _ in range(1000):
                writer.notify()

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(anyio.to_thread.run_sync, hammer)
        assert writer.statistics().pending
        await clock.wait_for_deadline()  # the wake-up crossed threads
        assert clock.next_deadline() == 2.0
        await clock.advance(2.0)  # due at max(0 + debounce, 0 + min_interval)
        assert writer.statistics().events == 8000
        assert store.write_times == [0.0]  # the state did not change: skipped
        assert writer.statistics().skipped == 1
        assert not writer.statistics().pending


async def test_corrupt_file_is_moved_aside(tmp_path: Path, clock: FakeClock) -> None:
    """A writer never overwrites an unreadable checkpoint: it moves it aside and starts afresh."""
    (tmp_path / "s1.json").write_bytes(b'{"format":1,"meta":{"key":"s1"')
    session = Session()
    store = FileStore(tmp_path)
    async with writer_for(session, store, clock):
        pass
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("s1.corrupt-")]
    assert len(aside) == 1
    assert aside[0].read_bytes() == b'{"format":1,"meta":{"key":"s1"'
    cp = load(store, "s1")
    assert cp is not None and cp.meta.seq == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"debounce": 6.0, "max_wait": 5.0}, "debounce"),
        ({"min_interval": 6.0, "max_wait": 5.0}, "min_interval"),
        ({"debounce": -1.0}, "debounce"),
    ],
)
def test_bad_configuration_is_a_value_error(
    tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    """Durations out of range are a ValueError naming the parameter."""
    with pytest.raises(ValueError, match=message):
        CheckpointWriter(lambda: None, FileStore(tmp_path), **kwargs)


def test_bad_arguments_are_type_errors(tmp_path: Path) -> None:
    """A non-callable source or a non-store is a TypeError at construction."""
    with pytest.raises(TypeError, match="source"):
        CheckpointWriter(42, FileStore(tmp_path))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="store"):
        CheckpointWriter(lambda: None, str(tmp_path))  # type: ignore[arg-type]


def test_sync_writer_without_loop(tmp_path: Path) -> None:
    """The sync path needs no event loop: open writes, flush_sync writes, close marks not live."""
    session = Session()
    store = FileStore(tmp_path)
    with CheckpointWriter(session.snapshot, store, exit_hooks=False) as writer:
        cp = load(store, "s1")
        assert cp is not None and cp.meta.live is True
        session.add()
        writer.notify()
        r = writer.flush_sync()
        assert isinstance(r, Written)
        assert writer.flush_sync() == Skipped("unchanged")
        cp = load(store, "s1")
        assert cp is not None and cp.meta.live is True and len(cp.state["messages"]) == 1
    cp = load(store, "s1")
    assert cp is not None and cp.meta.live is False
    with pytest.raises(ValueError, match="reason"):
        writer.flush_sync("bogus")  # type: ignore[arg-type]


class InterruptingClock(FakeClock):
    """A clock whose next sleep raises KeyboardInterrupt inside the writer's timer task."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.interrupted: Any = None

    async def sleep(self, seconds: float) -> None:
        if self.armed:
            self.armed = False
            self.interrupted.set()
            raise KeyboardInterrupt
        await super().sleep(seconds)


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_keyboard_interrupt_in_the_timer_task_is_bare(tmp_path: Path) -> None:
    """A KeyboardInterrupt raised in the timer task (trio) leaves `async with` bare, written."""
    import anyio

    clock = InterruptingClock()
    clock.interrupted = anyio.Event()
    session = Session()
    store = FileStore(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        async with writer_for(session, store, clock) as writer:
            session.add(2)
            clock.armed = True
            writer.notify()  # wakes the timer task, whose next sleep is interrupted
            await clock.interrupted.wait()
    cp = load(store, "s1")
    assert cp is not None
    assert len(cp.state["messages"]) == 2
    assert cp.meta.live is False


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_timer_task_is_protected_from_ctrl_c(tmp_path: Path) -> None:
    """On trio the timer runs KeyboardInterrupt-protected: Ctrl-C goes to the program's code."""
    import trio

    seen: list[bool] = []

    def source() -> Snapshot:
        seen.append(trio.lowlevel.currently_ki_protected())
        return Snapshot("s1", {"n": len(seen)})

    clock = FakeClock()
    async with CheckpointWriter(
        source, FileStore(tmp_path), clock=clock, debounce=1.0, exit_hooks=False
    ) as writer:
        await clock.settle()
        writer.notify()
        await clock.advance(10.0)  # the timer's write calls source()
        assert len(seen) == 2
    assert seen[1] is True
