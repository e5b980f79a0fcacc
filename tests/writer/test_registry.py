"""``SessionRegistry`` in one process: opened on first use, closed when idle (exact virtual
times) or least recently used, cancelled while opening, refused, closed from another task.

Every test runs on asyncio and trio; idle time is a ``FakeClock``'s; checked on the bytes stored.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from checkpointer import (
    Checkpoint,
    CheckpointFailed,
    Failed,
    FileStore,
    JournalStore,
    Limits,
    Result,
    SessionRegistry,
    Snapshot,
    Written,
    _exit,
    load,
)
from checkpointer.stores import KeyLocked
from tests._support import HANG_GUARD
from tests.conftest import FakeClock
from tests.writer.test_close import final_threads_end

pytestmark = pytest.mark.anyio


class Sessions:
    """A server's state of its sessions: ``{"n": n}`` per key, made by ``resume``, dropped
    by ``on_close``."""

    def __init__(self, store: FileStore | JournalStore) -> None:
        self.store = store
        self.n: dict[str, int] = {}
        self.resumed: list[str] = []
        self.closed: list[tuple[str, Result]] = []
        self.gate: threading.Event | None = None  # resume waits on it when set

    def source(self, key: str) -> Snapshot | None:
        return Snapshot(key, {"n": self.n[key]}) if key in self.n else None

    def resume(self, key: str) -> Checkpoint[Any] | None:
        if self.gate is not None:
            assert self.gate.wait(60)
        checkpoint = load(self.store, key)
        self.n[key] = 0 if checkpoint is None else checkpoint.state["n"]
        self.resumed.append(key)
        return checkpoint

    def on_close(self, key: str, result: Result) -> None:
        self.closed.append((key, result))
        del self.n[key]

    def registry(self, **kw: Any) -> SessionRegistry:
        kw.setdefault("debounce", 0.0)
        return SessionRegistry(
            self.source, self.store, resume=self.resume, on_close=self.on_close, **kw
        )


async def until_open(registry: SessionRegistry, n: int) -> None:
    """Wait (real time, bounded) for the registry's closes in flight: their writes are threads."""
    with anyio.fail_after(60):
        while registry.statistics().open > n:  # noqa: ASYNC110 -- ends in a thread
            await anyio.sleep(0.001)


def stored(store: FileStore | JournalStore, key: str) -> tuple[int, bool] | None:
    checkpoint = load(store, key)
    return None if checkpoint is None else (checkpoint.state["n"], checkpoint.meta.live)


@pytest.fixture
def sessions(tmp_path: Path) -> Sessions:
    return Sessions(FileStore(tmp_path))


async def test_a_key_opens_once_and_its_last_state_is_stored_at_close(sessions: Sessions) -> None:
    """The first use resumes and opens the key; later uses get the same writer; aclose writes."""
    async with sessions.registry() as registry:
        async with registry.session("a") as first:
            sessions.n["a"] += 1
            first.notify()
        async with registry.session("a") as second:
            assert second is first
            sessions.n["a"] += 1
        assert registry.statistics().open == 1
    assert sessions.resumed == ["a"]
    assert stored(sessions.store, "a") == (2, False)
    assert [key for key, _ in sessions.closed] == ["a"]
    assert isinstance(sessions.closed[0][1], Written)
    assert sessions.n == {}  # on_close dropped the state


async def test_a_key_closes_idle_timeout_after_its_last_use(
    sessions: Sessions, clock: FakeClock
) -> None:
    """Closed at exactly last use + idle_timeout: final write, lock let go, on_close."""
    async with sessions.registry(idle_timeout=10.0, clock=clock) as registry:
        async with registry.session("a"):
            sessions.n["a"] = 5
        await clock.step(3.0, sleepers=2)  # the registry's task and the writer's timer
        async with registry.session("a"):  # used again at 3: idle from 3 on
            pass
        await clock.advance(12.999, sleepers=2)
        assert registry.statistics().open == 1
        await clock.advance(13.0, sleepers=1)
        await until_open(registry, 0)
        assert registry.statistics().closed_idle == 1
        assert registry.statistics().open == 0
        assert stored(sessions.store, "a") == (5, False)
        assert "a" not in sessions.n
        FileStore(sessions.store.root).lock("a", timeout=0).release()  # let go


async def test_a_key_in_use_is_never_closed_for_idleness(
    sessions: Sessions, clock: FakeClock
) -> None:
    """Inside a session() block past idle_timeout the key stays open; idle from the block's end."""
    async with sessions.registry(idle_timeout=10.0, clock=clock) as registry:
        async with registry.session("a"):
            await clock.advance(50.0, sleepers=2)
            assert registry.statistics().open == 1
        await clock.advance(59.9, sleepers=2)
        assert registry.statistics().open == 1
        await clock.advance(60.0, sleepers=1)
        await until_open(registry, 0)
        assert registry.statistics().closed_idle == 1


async def test_an_idle_key_reopens_from_what_another_writer_stored_meanwhile(
    sessions: Sessions, clock: FakeClock
) -> None:
    """A key closed for idleness resumes afresh: another writer's checkpoint is built on."""
    async with sessions.registry(idle_timeout=1.0, clock=clock) as registry:
        async with registry.session("a"):
            sessions.n["a"] = 1
        await clock.advance(1.0, sleepers=1)
        await until_open(registry, 0)
        other = Sessions(FileStore(sessions.store.root))  # another store object: another writer
        async with other.registry() as elsewhere, elsewhere.session("a"):
            other.n["a"] = 100
        async with registry.session("a") as writer:
            assert sessions.n["a"] == 100
            sessions.n["a"] += 1
            assert isinstance(await writer.write_now(), Written)
    assert stored(sessions.store, "a") == (101, False)


async def test_the_least_recently_used_key_closes_first_past_max_open(sessions: Sessions) -> None:
    """Past max_open the least recently used key closes (its final write done) first."""
    async with sessions.registry(max_open=3) as registry:
        for key in ("a", "b", "c"):
            async with registry.session(key):
                sessions.n[key] = ord(key)
        async with registry.session("a"):  # a is used again: b is now the oldest
            pass
        async with registry.session("d"):
            assert [key for key, _ in sessions.closed] == ["b"]
            assert stored(sessions.store, "b") == (ord("b"), False)
        stats = registry.statistics()
        assert (stats.open, stats.evicted, stats.opened) == (3, 1, 4)


async def test_a_key_closed_idle_or_evicted_is_written_once(
    sessions: Sessions, clock: FakeClock
) -> None:
    """An idle or evicted key's close makes one write, its final one (``live=False``), after
    the opening's: a close costs one fsynced write, not two."""
    async with sessions.registry(max_open=1, idle_timeout=10.0, clock=clock) as registry:
        for key in ("a", "b"):  # b's opening evicts a
            async with registry.session(key):
                sessions.n[key] = 1
        await clock.advance(10.0, sleepers=1)  # b is idle
        await until_open(registry, 0)
    for key in ("a", "b"):
        checkpoint = load(sessions.store, key)
        assert checkpoint is not None
        assert (checkpoint.state["n"], checkpoint.meta.live, checkpoint.meta.seq) == (1, False, 2)
    assert [(key, type(result)) for key, result in sessions.closed] == [
        ("a", Written),
        ("b", Written),
    ]


@pytest.mark.parametrize(
    ("soft", "bound"), [(40, 10), (256, 64), (2048, 512), (1 << 20, 512), (3, 1), (-1, 512)]
)
def test_without_max_open_the_bound_follows_the_descriptor_limit(
    monkeypatch: pytest.MonkeyPatch, soft: int, bound: int
) -> None:
    """512, or a quarter of the process's soft ``ulimit -n`` if less (at least 1; unlimited:
    512)."""
    import resource

    soft = resource.RLIM_INFINITY if soft == -1 else soft
    monkeypatch.setattr(resource, "getrlimit", lambda _: (soft, resource.RLIM_INFINITY))
    assert SessionRegistry.default_max_open() == bound


async def test_without_max_open_a_low_ulimit_closes_keys_past_half_of_it(
    sessions: Sessions, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under ``ulimit -n 40`` (read at each opening) the 11th key closes the least recent."""
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda _: (40, 40))
    async with sessions.registry() as registry:
        for i in range(15):
            async with registry.session(f"k{i}"):
                sessions.n[f"k{i}"] = i
        await until_open(registry, 10)
        assert registry.statistics().evicted == 5
    assert [key for key, _ in sessions.closed][:5] == [f"k{i}" for i in range(5)]


class _Gated(FileStore):
    """A store whose writes, while ``held``, wait for ``gate`` (a disk that does not answer),
    then fail if ``failing``."""

    held = failing = False

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.gate, self.entered = threading.Event(), threading.Event()

    def write(self, key: str, chunks: Any, **kw: Any) -> int:
        if self.held:
            self.entered.set()
            assert self.gate.wait(2 * HANG_GUARD)  # past the test's own guard
            if self.failing:
                raise OSError(28, "No space left on device")
        return super().write(key, chunks, **kw)


class _Failing(FileStore):
    """A store whose writes fail while ``failing`` (a full disk, no descriptor left)."""

    failing = False

    def write(self, key: str, chunks: Any, **kw: Any) -> int:
        if self.failing:
            raise OSError(24, "Too many open files")
        return super().write(key, chunks, **kw)


class _FailingJournal(JournalStore):
    """A journal whose commits fail while ``failing``."""

    failing = False

    def commit(self, *args: Any, **kw: Any) -> int:
        if self.failing:
            raise OSError(28, "No space left on device")
        return super().commit(*args, **kw)


@pytest.mark.parametrize("failing", [_Failing, _FailingJournal])
async def test_a_key_whose_state_cannot_be_written_is_kept_open_not_let_go(
    tmp_path: Path, failing: type[_Failing | _FailingJournal]
) -> None:
    """Evicted, a key whose last change the store fails to write stays open (its state is only
    in memory; on_close not called), past max_open, its lock let go (no descriptor held while
    the store fails); it closes, written, once the store works."""
    sessions = Sessions(store := failing(tmp_path))
    async with sessions.registry(max_open=1) as registry:
        async with registry.session("a"):  # its opening wrote {"n": 0}
            sessions.n["a"] = 7
        store.failing = True
        async with registry.session("b"):  # a is evicted: its write fails, so it stays
            sessions.n["b"] = 1
        stats = registry.statistics()
        assert (stats.open, stats.evicted) == (2, 0) and sessions.closed == []
        assert sessions.n["a"] == 7 and stored(sessions.store, "a") == (0, True)
        failing(tmp_path).lock("a").release()  # not held while kept
        store.failing = False
        await registry.release("a")  # or the eviction b's end began, retried, closes it
        assert [(key, type(result)) for key, result in sessions.closed] == [("a", Written)]
    assert stored(sessions.store, "a") == (7, False)
    assert stored(sessions.store, "b") == (1, False)


async def test_a_kept_key_holds_no_lock_between_its_retries(tmp_path: Path) -> None:
    """Kept open while its store fails, a key's writer retries; each failed retry lets go of
    the lock it took, so a long outage does not pile up descriptors again."""
    sessions = Sessions(store := _Failing(tmp_path))
    fast = Limits(retry_initial=0.001, retry_max=0.002)
    async with sessions.registry(max_open=1, limits=fast) as registry:
        async with registry.session("a"):
            sessions.n["a"] = 7
        store.failing = True
        async with registry.session("b"):
            sessions.n["b"] = 1
        kept = registry._entries["a"].writer
        assert kept is not None
        with anyio.fail_after(HANG_GUARD):
            while kept.statistics().failures < 5:  # noqa: ASYNC110 -- retries in threads
                await anyio.sleep(0.001)
        free = 0
        with anyio.fail_after(HANG_GUARD):
            while free < 3:  # a retry holds it only while it runs
                try:
                    FileStore(tmp_path).lock("a").release()
                    free += 1
                except KeyLocked:
                    pass
                await anyio.sleep(0.001)
        store.failing = False
    assert stored(sessions.store, "a") == (7, False)


async def test_a_kept_key_closes_idle_once_its_store_works(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Kept open by an idle close its store failed, a key closes idle_timeout after its
    retry lands, with no other session used meanwhile: its lock is not held till exit."""
    sessions = Sessions(store := _Failing(tmp_path))
    limits = Limits(retry_initial=1.0, retry_max=1.0)
    async with sessions.registry(idle_timeout=10.0, clock=clock, limits=limits) as registry:
        async with registry.session("a"):
            sessions.n["a"] = 7
        store.failing = True
        await clock.advance(10.0)  # idle: its close's write fails, so it is kept
        await clock.wait_for_deadline()  # the writer's retry, on the clock
        store.failing = False
        await clock.advance(11.0)  # the retry lands
        await clock.advance(21.0)  # idle again
        await until_open(registry, 0)
        assert [(key, type(result)) for key, result in sessions.closed] == [("a", Written)]
        FileStore(tmp_path).lock("a", timeout=0).release()  # let go
    assert stored(sessions.store, "a") == (7, False)


async def test_a_close_with_no_thread_to_be_had_keeps_the_key(
    sessions: Sessions, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No worker thread to be had for an evicted key's write (a pids limit): the key is kept
    open as for a store's failure, its lock let go, and closes written once threads return."""
    run_sync, starved = anyio.to_thread.run_sync, False

    async def starving(func: Any, *args: Any, **kw: Any) -> Any:
        if starved and args and getattr(args[0], "key", None) == "a":  # a's writes' hop
            raise RuntimeError("can't start new thread")
        return await run_sync(func, *args, **kw)

    monkeypatch.setattr(anyio.to_thread, "run_sync", starving)
    limits = Limits(retry_initial=3600.0, retry_max=3600.0)
    async with sessions.registry(max_open=1, limits=limits) as registry:
        async with registry.session("a"):  # its opening wrote {"n": 0}
            sessions.n["a"] = 7
        starved = True
        async with registry.session("b"):  # a is evicted: its write has no thread
            sessions.n["b"] = 1
        assert registry.statistics().open == 2 and sessions.closed == []
        FileStore(sessions.store.root).lock("a", timeout=0).release()  # not held while kept
        starved = False
        await registry.release("a")
        assert [(key, type(result)) for key, result in sessions.closed] == [("a", Written)]
    assert stored(sessions.store, "a") == (7, False)


@pytest.mark.parametrize("fault", ["source", "encode"])
async def test_a_key_whose_state_can_never_be_written_is_let_go(
    sessions: Sessions, fault: str
) -> None:
    """A failure no retry mends (source() raises, the state does not encode) lets an evicted
    key go, on_close told: kept, such keys would hold the registry past max_open for good."""
    broken = {"a"}
    source = sessions.source

    def faulty(key: str) -> Snapshot | None:
        if key in broken and fault == "source":
            raise RuntimeError("no state")
        snapshot = source(key)
        if key in broken and snapshot is not None:
            return Snapshot(key, {"n": object()})  # msgspec cannot encode it
        return snapshot

    sessions.source = faulty  # type: ignore[method-assign]
    async with sessions.registry(max_open=1) as registry:
        async with registry.session("a"):
            pass
        async with registry.session("b"):
            sessions.n["b"] = 1
        await until_open(registry, 1)
        assert registry.statistics().evicted == 1
        assert [key for key, _ in sessions.closed] == ["a"]
    assert stored(sessions.store, "b") == (1, False)


async def test_blocks_ending_past_max_open_evict(sessions: Sessions) -> None:
    """Opened past max_open while every key was in use, the registry shrinks back to it as
    the blocks end, not at the next opening (a burst's keys would hold their locks)."""
    async with sessions.registry(max_open=1) as registry:
        async with registry.session("a"), registry.session("b"), registry.session("c"):
            assert registry.statistics().open == 3
        await until_open(registry, 1)
        assert sorted(key for key, _ in sessions.closed) == ["b", "c"]  # least recently used


async def test_aclose_ends_when_a_close_in_flight_keeps_its_key(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Idle closes whose writes fail as aclose() begins: aclose() closes their keys (the final
    writes fail, on_close told) rather than wait for a key kept open."""
    sessions = Sessions(store := _Gated(tmp_path))
    registry = sessions.registry(idle_timeout=10.0, clock=clock)
    ended = anyio.Event()

    async def close() -> None:
        await registry.aclose()
        ended.set()

    async with anyio.create_task_group() as tg:
        for key in ("a", "b"):
            async with registry.session(key):
                sessions.n[key] = 1
        store.held = store.failing = True
        await clock.advance(10.0, sleepers=3)  # idle: their closes begin, held at the gate
        assert await anyio.to_thread.run_sync(store.entered.wait, HANG_GUARD)
        tg.start_soon(close)
        await anyio.wait_all_tasks_blocked()
        store.gate.set()
        with anyio.move_on_after(HANG_GUARD):
            await ended.wait()
        if not ended.is_set():  # free the stuck aclose() (a release sets what it waits on)
            for key in ("a", "b"):
                await registry.release(key)
            pytest.fail("aclose() waited forever for a key kept open")
    assert sorted(key for key, _ in sessions.closed) == ["a", "b"]


async def test_an_idle_close_whose_write_never_returns_ends_at_close_timeout(
    tmp_path: Path, clock: FakeClock
) -> None:
    """An idle key's write stuck in the store as aclose() begins: aclose() returns, bounded by
    close_timeout as a writer's close is, the key let go with a Failed saying its write goes
    on; the state lands once the store answers."""
    sessions = Sessions(store := _Gated(tmp_path))
    registry = sessions.registry(idle_timeout=10.0, clock=clock, limits=Limits(close_timeout=0.05))
    ended = anyio.Event()

    async def close() -> None:
        await registry.aclose()
        ended.set()

    async with anyio.create_task_group() as tg:
        async with registry.session("a") as writer:
            sessions.n["a"] = 1
            assert isinstance(await writer.write_now(), Written)
            sessions.n["a"] = 2  # not notified: the idle close writes it
        store.held = True
        await clock.advance(10.0, sleepers=1)  # idle: its close begins, its write held
        assert await anyio.to_thread.run_sync(store.entered.wait, HANG_GUARD)
        tg.start_soon(close)
        with anyio.move_on_after(HANG_GUARD):
            await ended.wait()
        hung = not ended.is_set()
        store.gate.set()
        await ended.wait()
        assert not hung, "aclose() waited for an idle close's write past close_timeout"
    [(key, result)] = sessions.closed
    assert key == "a" and isinstance(result, Failed), result
    assert "goes on in a thread of its own" in result.error
    await anyio.to_thread.run_sync(final_threads_end)
    assert stored(store, "a") == (2, False)


async def test_a_key_whose_idle_write_outlasts_close_timeout_stays_open(
    tmp_path: Path, clock: FakeClock
) -> None:
    """An idle key's write the store has not answered within close_timeout: the key stays open
    (its write goes on), so a use meanwhile gets the same writer, not a refusal by its own
    write's lock, and its change lands after that write."""
    sessions = Sessions(store := _Gated(tmp_path))
    limits = Limits(close_timeout=0.05)
    async with sessions.registry(idle_timeout=10.0, clock=clock, limits=limits) as registry:
        async with registry.session("a") as first:
            sessions.n["a"] = 1
        store.held = True
        await clock.advance(10.0, sleepers=1)  # idle: its close begins, its write held
        assert await anyio.to_thread.run_sync(store.entered.wait, HANG_GUARD)
        async with registry.session("a") as again:  # after close_timeout: kept open
            assert again is first
            sessions.n["a"] = 100
            store.held = False
            store.gate.set()
        await registry.release("a")
    assert sessions.resumed == ["a"]
    assert [(key, type(result)) for key, result in sessions.closed] == [("a", Written)]
    assert stored(store, "a") == (100, False)


async def test_keys_in_use_are_not_evicted(sessions: Sessions) -> None:
    """Every open key in use: a new one opens past max_open rather than close one in use."""
    async with sessions.registry(max_open=1) as registry:
        async with registry.session("a"), registry.session("b"):
            assert registry.statistics().open == 2
            assert sessions.closed == []
        async with registry.session("c"):
            pass
        await until_open(registry, 1)  # b's eviction, begun as its block ended, may be in flight
        assert sorted(key for key, _ in sessions.closed) == ["a", "b"]


async def test_concurrent_first_uses_resume_once(sessions: Sessions) -> None:
    """Tasks asking for one key at once share one opening and one writer."""
    sessions.gate = threading.Event()
    writers: list[Any] = []

    async def use() -> None:
        async with registry.session("a") as writer:
            writers.append(writer)

    async with sessions.registry() as registry, anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(use)
        await anyio.wait_all_tasks_blocked()
        sessions.gate.set()
    assert sessions.resumed == ["a"]
    assert len(writers) == 5 and len({id(w) for w in writers}) == 1


async def test_a_cancel_while_opening_leaves_the_key_as_it_found_it(sessions: Sessions) -> None:
    """Cancelled during resume: not open, on_close undoes resume, a later use opens it."""
    sessions.gate = threading.Event()
    async with sessions.registry() as registry:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:

                async def use() -> None:
                    async with registry.session("a"):
                        raise AssertionError("opened through a cancel")

                tg.start_soon(use)
                await anyio.wait_all_tasks_blocked()
                scope.cancel()
                sessions.gate.set()
        assert registry.statistics().open == 0
        assert [key for key, _ in sessions.closed] == ["a"]
        with anyio.fail_after(HANG_GUARD):  # a key left opening would be waited on forever
            async with registry.session("a"):
                sessions.n["a"] = 7
    assert stored(sessions.store, "a") == (7, False)


async def test_a_key_another_writer_holds_is_refused_at_once(sessions: Sessions) -> None:
    """Another live writer holds the key: session() raises CheckpointFailed("locked")."""
    holder = FileStore(sessions.store.root).lock("a", timeout=0)
    try:
        async with sessions.registry(limits=Limits(lock_timeout=0.0)) as registry:
            with pytest.raises(CheckpointFailed) as caught:
                async with registry.session("a"):
                    raise AssertionError("opened a key another writer holds")
            assert caught.value.result.reason == "locked"
            stats = registry.statistics()
            assert (stats.open, stats.failed) == (0, 1)
    finally:
        holder.release()
    assert stored(sessions.store, "a") is None  # nothing written over the holder's key


async def test_aclose_from_another_task_closes_every_key(sessions: Sessions) -> None:
    """aclose() from another task, twice at once: every key's final write lands; no use after."""
    registry = sessions.registry()
    async with registry:
        for i in range(20):
            async with registry.session(f"k{i}"):
                sessions.n[f"k{i}"] = i
        async with anyio.create_task_group() as tg:
            tg.start_soon(registry.aclose)
            tg.start_soon(registry.aclose)
        with pytest.raises(RuntimeError, match="closed"):
            async with registry.session("k0"):
                pass
    assert [stored(sessions.store, f"k{i}") for i in range(20)] == [(i, False) for i in range(20)]


async def test_one_exit_hook_for_every_open_key(sessions: Sessions) -> None:
    """The registry registers one exit hook however many keys it holds open, none after close."""
    before = len(_exit._writers)
    async with sessions.registry() as registry:
        for i in range(30):
            async with registry.session(f"k{i}"):
                pass
        assert len(_exit._writers) == before + 1
    assert len(_exit._writers) == before


@pytest.mark.parametrize("seed", range(10))  # a race: repeated, on a loaded machine
async def test_churn_past_max_open_loses_no_use(sessions: Sessions, seed: int) -> None:
    """Tasks using random keys, far more than max_open, closing and reopening them all the time:
    each key's stored count is every use of it (a reopen waits for the close it races)."""
    rng = random.Random(seed)
    expected: dict[str, int] = {}

    async def worker(registry: SessionRegistry, plan: list[str]) -> None:
        for key in plan:
            async with registry.session(key) as writer:
                sessions.n[key] += 1
                expected[key] = expected.get(key, 0) + 1
                writer.notify()
                await anyio.lowlevel.checkpoint()

    async with sessions.registry(max_open=4, idle_timeout=0.001) as registry:
        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(worker, registry, [f"k{rng.randrange(12)}" for _ in range(40)])
        assert registry.statistics().evicted > 0
    assert {key: stored(sessions.store, key) for key in expected} == {
        key: (n, False) for key, n in expected.items()
    }


async def test_release_closes_a_key_now_and_refuses_one_in_use(sessions: Sessions) -> None:
    """release(key): the final write lands, on_close runs, a later use resumes; not in a block."""
    async with sessions.registry() as registry:
        async with registry.session("a"):
            sessions.n["a"] = 3
            with pytest.raises(RuntimeError, match="in use"):
                await registry.release("a")
        assert isinstance(await registry.release("a"), Written)
        assert await registry.release("a") is None
        assert stored(sessions.store, "a") == (3, False)
        assert "a" not in sessions.n
        async with registry.session("a"):
            assert sessions.n["a"] == 3


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"debouce": 0.5}, TypeError),
        ({"debounce": -1}, ValueError),
        ({"debounce": 60.0}, ValueError),  # past max_wait
        ({"limits": "fast"}, TypeError),
        ({"exit_hooks": False}, TypeError),
    ],
)
def test_bad_writer_options_are_refused_at_construction(
    sessions: Sessions, options: dict[str, Any], error: type[Exception]
) -> None:
    """Refused by the constructor, before any request resumes a key."""
    with pytest.raises(error):
        sessions.registry(**options)
    assert sessions.resumed == []
