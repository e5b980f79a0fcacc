"""Closing the writer: from any task and scope, in any order, racing flushes, past close_timeout.

Also a write_now() cancelled while its thread writes.  Every async test runs
on asyncio and trio; time is virtual (``FakeClock``, trio's ``MockClock``, an
asyncio loop whose clock moves only when told) and threads meet on events,
whose timeouts are hang guards only.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from checkpointer import (
    CheckpointWriter,
    Failed,
    FileStore,
    JournalStore,
    Limits,
    Meta,
    Skipped,
    Snapshot,
    Written,
    load,
)
from tests._support import HANG_GUARD, child_env
from tests.conftest import FakeClock, RecordingStore

KEY = "s1"


class State:
    """A session whose state is ``{"n": n}``; ``source`` may run a hook first."""

    def __init__(self, n: int = 0, *, fingerprinted: bool = False) -> None:
        self.n = n
        self.hook: Callable[[], None] | None = None
        self.fingerprinted = fingerprinted  # each snapshot says n as its fingerprint

    def source(self) -> Snapshot:
        if self.hook is not None:
            self.hook()
        return Snapshot(KEY, {"n": self.n}, fingerprint=self.n if self.fingerprinted else None)


def writer_of(state: State, store: Any, clock: FakeClock, **kw: Any) -> CheckpointWriter[Any]:
    kw.setdefault("exit_hooks", False)
    return CheckpointWriter(state.source, store, clock=clock, **kw)


def on_disk(store: Any) -> tuple[int, bool]:
    cp = load(store, KEY)
    assert cp is not None, "no checkpoint"
    return cp.state["n"], cp.meta.live


def key_is_free(store_type: type[FileStore], root: Path) -> None:
    """A new writer of the key in this process writes it (no Failed('locked'))."""
    other = CheckpointWriter(
        lambda: Snapshot(KEY, {"n": -1}),
        store_type(root),
        write_on_start=False,
        exit_hooks=False,
    ).open()
    try:
        assert isinstance(other.flush_sync(), Written)
    finally:
        other.close()


# -- aclose from any task, under any scope, in any order -------------------------------


@pytest.mark.anyio
async def test_aclose_inside_fail_after(tmp_path: Path, clock: FakeClock) -> None:
    """aclose() under `with fail_after(5):` writes the final state, live=False."""
    state = State(1)
    store = FileStore(tmp_path)
    async with writer_of(state, store, clock) as writer:
        state.n = 2
        with anyio.fail_after(5):
            assert isinstance(await writer.aclose(), Written)
    assert on_disk(store) == (2, False)


@pytest.mark.anyio
async def test_aclose_in_a_cancelled_scope_is_shielded(tmp_path: Path, clock: FakeClock) -> None:
    """aclose() in a scope cancelled already still writes the final state."""
    state = State(1)
    store = FileStore(tmp_path)
    writer = await writer_of(state, store, clock).__aenter__()
    state.n = 2
    with anyio.CancelScope() as scope:
        scope.cancel()
        assert isinstance(await writer.aclose(), Written)
    assert on_disk(store) == (2, False)


@pytest.mark.anyio
@pytest.mark.parametrize("order", [(0, 1, 2), (2, 0, 1)], ids=["as-opened", "mixed"])
async def test_writers_close_in_any_order(
    tmp_path: Path, clock: FakeClock, order: tuple[int, ...]
) -> None:
    """Three writers opened one after another close in the order opened, or mixed."""
    states = [State(i) for i in range(3)]
    stores = [FileStore(tmp_path / str(i)) for i in range(3)]
    writers = [await writer_of(states[i], stores[i], clock).__aenter__() for i in range(3)]
    for i in order:
        states[i].n += 10
        assert isinstance(await writers[i].aclose(), Written)
    assert [on_disk(st) for st in stores] == [(10, False), (11, False), (12, False)]


@pytest.mark.anyio
async def test_aclose_from_another_task_after_the_opener_ended(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A writer opened in a task that has ended closes from another task: written, key free."""
    state = State(1)
    store = FileStore(tmp_path)
    opened: list[CheckpointWriter[Any]] = []

    async def opener() -> None:
        opened.append(await writer_of(state, store, clock).__aenter__())

    async with anyio.create_task_group() as tg:
        tg.start_soon(opener)
    writer = opened[0]
    state.n = 2
    writer.notify()
    results: list[Any] = []

    async def closer() -> None:
        with anyio.move_on_after(5):
            results.append(await writer.aclose())

    async with anyio.create_task_group() as tg:
        tg.start_soon(closer)
    assert isinstance(results[0], Written)
    assert on_disk(store) == (2, False)
    key_is_free(FileStore, tmp_path)


@pytest.mark.anyio
async def test_concurrent_aclose_is_one_close(tmp_path: Path, clock: FakeClock) -> None:
    """Two tasks closing at once: one final write, both get its result."""
    state = State(1)
    store = RecordingStore(tmp_path, clock)
    writer = await writer_of(state, store, clock).__aenter__()
    state.n = 2
    results: list[Any] = []

    async def close() -> None:
        results.append(await writer.aclose())

    async with anyio.create_task_group() as tg:
        tg.start_soon(close)
        tg.start_soon(close)
    assert len(store.written) == 2  # the start write and one final write
    assert isinstance(results[0], Written)
    assert results[0] == results[1]
    assert await writer.aclose() == Skipped("closed")


# -- a write_now() cancelled while its thread writes -----------------------------------


class GateStore(FileStore):
    """A FileStore whose write, while ``hold`` is set, waits for ``gate`` (once)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.hold = False
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.landed = threading.Event()

    def write(self, key: str, chunks: Sequence[bytes], **kw: Any) -> int:
        if not self.hold:
            return super().write(key, chunks, **kw)
        self.hold = False
        self.entered.set()
        assert self.gate.wait(HANG_GUARD), "hang guard: the gate never opened"
        try:
            return super().write(key, chunks, **kw)
        finally:
            self.landed.set()


@pytest.mark.anyio
async def test_cancelled_write_now_then_revert_is_not_skipped(
    tmp_path: Path, clock: FakeClock
) -> None:
    """write_now() cancelled mid-write, state reverted to the disk's: the revert is written."""
    state = State(1, fingerprinted=True)
    store = GateStore(tmp_path)
    async with writer_of(state, store, clock) as writer:
        state.n = 2
        store.hold = True
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(writer.write_now)
                await anyio.to_thread.run_sync(store.entered.wait, HANG_GUARD)
                scope.cancel()  # its thread goes on writing n=2
        assert writer.statistics().pending  # not written as far as anyone knows
        state.n = 1  # the agent goes back to the state on disk
        results: list[Any] = []

        async def again() -> None:
            results.append(await writer.write_now())

        async with anyio.create_task_group() as tg:
            tg.start_soon(again)
            await anyio.wait_all_tasks_blocked()
            store.gate.set()
        assert await anyio.to_thread.run_sync(store.landed.wait, HANG_GUARD)
        assert isinstance(results[0], Written), results
        assert on_disk(store) == (1, True)
        assert not writer.statistics().pending
    assert on_disk(store) == (1, False)


@pytest.mark.anyio
async def test_write_cancelled_before_its_thread_began_never_runs(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A write_now() cancelled while it waits for a worker thread never writes; skips still work."""
    encodes: list[int] = []
    state = State(1, fingerprinted=True)
    store = RecordingStore(tmp_path, clock)
    writer = writer_of(state, store, clock)
    states = writer._core._states
    stage = states.stage

    def counted(key: str, staged: Any, transcript: Any = None) -> Any:
        encodes.append(staged["n"])
        return stage(key, staged, transcript)

    states.stage = counted  # type: ignore[method-assign,assignment]
    async with writer:
        limiter = anyio.to_thread.current_default_thread_limiter()
        tokens = limiter.total_tokens
        limiter.total_tokens = 1
        try:
            state.n = 2
            async with limiter:  # no worker thread to be had
                with anyio.CancelScope() as scope:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(writer.write_now)
                        await anyio.wait_all_tasks_blocked()
                        scope.cancel()
        finally:
            limiter.total_tokens = tokens
        state.n = 1
        assert await writer.write_now() == Skipped("unchanged")
        assert encodes == [1, 2]  # the revert was skipped before encoding
        assert len(store.written) == 1  # n=2 never reached the store
        assert on_disk(store) == (1, True)


# -- flushes from threads racing the close ---------------------------------------------


class Race:
    """Threads that change the state, notify() and flush_sync() in a loop.

    The store holds the final write until a flusher has tried once after
    the final snapshot was taken, so that every run has a flush racing the
    final write (the hang guard only bounds a bug).
    """

    def __init__(self) -> None:
        self.n = 0
        self.lock = threading.Lock()
        self.closing = False
        self.final_n: int | None = None
        self.tried = threading.Event()
        self.stop = threading.Event()
        self.flushers: list[threading.Thread] = []
        self.local = threading.local()
        self.writer: CheckpointWriter[Any] | None = None

    def source(self) -> Snapshot:
        me = threading.current_thread()
        if me in self.flushers:
            if getattr(self.local, "after", False):
                self.tried.set()  # this flush took a snapshot after the final one
        elif self.closing and self.final_n is None:
            self.final_n = self.n
        return Snapshot(KEY, {"n": self.n})

    def hold(self) -> None:
        """In the store: the final write waits for a flusher's try."""
        if self.final_n is not None and threading.current_thread() not in self.flushers:
            assert self.tried.wait(HANG_GUARD), "hang guard: no flush raced the close"

    def flush_loop(self) -> None:
        writer = self.writer
        assert writer is not None
        while not self.stop.is_set():
            self.local.after = self.final_n is not None
            with self.lock:
                self.n += 1
            writer.notify()
            writer.flush_sync()
            if self.local.after:
                self.tried.set()

    def start(self, writer: CheckpointWriter[Any]) -> None:
        self.writer = writer
        self.flushers = [threading.Thread(target=self.flush_loop) for _ in range(2)]
        for thread in self.flushers:
            thread.start()

    def join(self) -> None:
        self.stop.set()
        for thread in self.flushers:
            thread.join(HANG_GUARD)


class RaceFileStore(FileStore):
    def __init__(self, root: Path, race: Race | None = None) -> None:
        super().__init__(root)
        self.race = race

    def write(self, key: str, chunks: Sequence[bytes], **kw: Any) -> int:
        if self.race is not None:
            self.race.hold()
        return super().write(key, chunks, **kw)


class RaceJournalStore(JournalStore):
    def __init__(self, root: Path, race: Race | None = None) -> None:
        super().__init__(root)
        self.race = race

    def commit(self, key: str, meta: Meta, staged: object, **kw: Any) -> int:
        if self.race is not None:
            self.race.hold()
        return super().commit(key, meta, staged, **kw)


STORES = {"file": RaceFileStore, "journal": RaceJournalStore}


@pytest.fixture
def race() -> Iterator[Race]:
    one = Race()
    yield one
    one.join()


def assert_closed_cleanly(
    race: Race, writer: CheckpointWriter[Any], result: Any, kind: str, root: Path
) -> None:
    race.join()
    assert isinstance(result, Written), result
    assert race.final_n is not None
    assert on_disk(STORES[kind](root)) == (race.final_n, False)
    assert writer.flush_sync() == Skipped("closed")
    key_is_free(STORES[kind], root)


@pytest.mark.anyio
@pytest.mark.parametrize("kind", sorted(STORES))
async def test_flushes_racing_aclose(
    tmp_path: Path, clock: FakeClock, race: Race, kind: str
) -> None:
    """flush_sync() from threads during aclose(): live=False, the final state, the key free."""
    writer = CheckpointWriter(
        race.source, STORES[kind](tmp_path, race), clock=clock, exit_hooks=False
    )
    await writer.__aenter__()
    race.start(writer)
    race.closing = True
    result = await writer.aclose()
    assert_closed_cleanly(race, writer, result, kind, tmp_path)


@pytest.mark.parametrize("kind", sorted(STORES))
def test_flushes_racing_close(tmp_path: Path, race: Race, kind: str) -> None:
    """flush_sync() from threads during close(): live=False, the final state, the key free."""
    writer = CheckpointWriter(race.source, STORES[kind](tmp_path, race), exit_hooks=False)
    writer.open()
    race.start(writer)
    race.closing = True
    result = writer.close()
    assert_closed_cleanly(race, writer, result, kind, tmp_path)


# -- close_timeout ---------------------------------------------------------------------


class SteppedLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose clock stands still until ``jump`` moves it."""

    def __init__(self) -> None:
        super().__init__()
        self._now = 0.0

    def time(self) -> float:
        return self._now

    def jump(self, seconds: float) -> None:
        self._now += seconds


def virtual_backends() -> list[Any]:
    import trio.testing

    return [
        pytest.param(("asyncio", {"loop_factory": SteppedLoop}), id="asyncio"),
        pytest.param(("trio", {"clock": trio.testing.MockClock()}), id="trio"),
    ]


def jump(seconds: float) -> Callable[[], None]:
    """A function that moves the running loop's virtual clock on, from any thread."""
    token = anyio.lowlevel.current_token()
    loop_thread = threading.get_ident()
    if isinstance(token.native_token, asyncio.AbstractEventLoop):
        loop = token.native_token
        assert isinstance(loop, SteppedLoop)
        move = loop.jump
        soon: Callable[..., object] = loop.call_soon_threadsafe
    else:
        import trio
        import trio.testing

        clock = trio.lowlevel.current_clock()
        assert isinstance(clock, trio.testing.MockClock)
        move, soon = clock.jump, trio.lowlevel.current_trio_token().run_sync_soon

    def jump_now() -> None:
        if threading.get_ident() == loop_thread:
            move(seconds)
        else:
            soon(move, seconds)

    return jump_now


def final_threads_end() -> None:
    for thread in threading.enumerate():
        if thread.name == "checkpointer-final-write":
            thread.join(HANG_GUARD)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", virtual_backends())
async def test_final_snapshot_slower_than_close_timeout_is_written(
    tmp_path: Path, clock: FakeClock
) -> None:
    """source() takes 10 s of the loop's time at close, close_timeout=0.1: the state is written."""
    state = State(1)
    store = FileStore(tmp_path)
    writer = await writer_of(
        state,
        store,
        clock,
        limits=Limits(close_timeout=0.1),
    ).__aenter__()
    state.n = 2
    move_on = jump(10.0)
    state.hook = move_on  # the loop's clock moves on while source() runs on it
    result = await writer.aclose()
    assert isinstance(result, Written), result
    assert on_disk(store) == (2, False)
    key_is_free(FileStore, tmp_path)


class HungStore(GateStore):
    """A GateStore whose held write moves the loop's clock past the close's deadline."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.on_enter: Callable[[], None] | None = None

    def write(self, key: str, chunks: Sequence[bytes], **kw: Any) -> int:
        if self.hold and self.on_enter is not None:
            self.on_enter()
        return super().write(key, chunks, **kw)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", virtual_backends())
async def test_final_write_past_close_timeout_says_so_and_lands(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A final write stuck past close_timeout: a plain Failed, then it lands and frees the key."""
    state = State(1)
    store = HungStore(tmp_path)
    writer = await writer_of(
        state,
        store,
        clock,
        limits=Limits(close_timeout=1.0),
    ).__aenter__()
    state.n = 2
    store.on_enter = jump(10.0)
    store.hold = True
    with caplog.at_level(logging.WARNING, logger="checkpointer"):
        result = await writer.aclose()
    assert isinstance(result, Failed), result
    assert "did not finish within close_timeout=1.0s" in result.error
    assert "goes on in a thread of its own" in result.error
    assert store.location(KEY) in result.error
    assert result.error in caplog.text
    assert "may still complete" not in caplog.text
    assert on_disk(store) == (1, True)  # not yet
    store.gate.set()
    await anyio.to_thread.run_sync(final_threads_end)
    assert on_disk(store) == (2, False)
    key_is_free(FileStore, tmp_path)


# -- Ctrl-C while the timer task runs ---------------------------------------------------

CTRL_C_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import anyio
    from checkpointer import CheckpointWriter, FileStore, Snapshot

    root, backend = sys.argv[1], sys.argv[2]
    state = {"n": 0, "armed": False}

    def source():
        if state["armed"]:  # the timer's write: Ctrl-C lands while it runs
            state["armed"] = False
            os.kill(os.getpid(), signal.SIGINT)
        return Snapshot("s1", {"n": state["n"]})

    async def main():
        async with CheckpointWriter(
            source, FileStore(root), debounce=0.0, min_interval=0.0, max_wait=1.0
        ) as writer:
            state["n"], state["armed"] = 42, True
            writer.notify()
            await anyio.sleep(30)  # hang guard
        print("NOT INTERRUPTED")

    anyio.run(main, backend=backend)
    """
)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_ctrl_c_during_a_timer_write_is_a_bare_keyboard_interrupt(
    tmp_path: Path, backend: str
) -> None:
    """Ctrl-C while the timer task writes: a bare KeyboardInterrupt, the state on disk, not live."""
    env = child_env()
    done = subprocess.run(
        [sys.executable, "-c", CTRL_C_CHILD, str(tmp_path), backend],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        env=env,
        check=False,
    )
    assert done.returncode != 0, done
    assert "NOT INTERRUPTED" not in done.stdout
    last = done.stderr.strip().splitlines()[-1]
    assert last == "KeyboardInterrupt", done.stderr
    assert "TrioInternalError" not in done.stderr
    assert "ExceptionGroup" not in done.stderr
    assert on_disk(FileStore(tmp_path)) == (42, False)


# -- Ctrl-C while aclose() writes the final checkpoint ---------------------------------

CTRL_C_AT_CLOSE_CHILD = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    import anyio
    from checkpointer import CheckpointWriter, FileStore, Snapshot

    root, backend, where = sys.argv[1], sys.argv[2], sys.argv[3]
    presses, hooks = int(sys.argv[4]), sys.argv[5] == "1"
    closing = False
    pressed = [0]
    released = threading.Event()  # set once the runner's SIGINT handler ran `presses` times

    def hold(place):
        if closing and where == place:
            print("HELD", flush=True)
            released.wait(30)  # hang guard

    class HeldStore(FileStore):
        def write(self, key, chunks, **kw):
            hold("write")  # in the final write's thread
            if closing:
                time.sleep(0.2)  # a slow disk: the write outlasts the unwinding
            return super().write(key, chunks, **kw)

    state = {"n": 0}

    def source():
        hold("source")  # on the event loop's thread
        return Snapshot("s1", dict(state))

    def watch_sigint():
        runners = signal.getsignal(signal.SIGINT)  # asyncio's runner's, or trio's

        def handler(signum, frame):
            pressed[0] += 1
            try:
                runners(signum, frame)
            finally:
                if pressed[0] >= presses:
                    released.set()
                os.write(1, b"SIGINT\\n")  # not print(): this may run inside the last one

        signal.signal(signal.SIGINT, handler)

    async def main():
        global closing
        watch_sigint()
        async with CheckpointWriter(
            source,
            HeldStore(root),
            debounce=60,
            min_interval=60,
            max_wait=120,
            exit_hooks=hooks,
        ) as writer:
            state["n"] = 1
            writer.notify()
            closing = True
        print("CLOSED", flush=True)

    if backend == "uvloop":
        import uvloop

        uvloop.install()
        backend = "asyncio"
    anyio.run(main, backend=backend)
    """
)


CTRL_C_AT_CLOSE_CASES = [
    pytest.param(backend, where, presses, hooks, id=f"{backend}-{name}")
    for backend in ("asyncio", "uvloop", "trio")
    for name, where, presses, hooks in (
        ("in-the-store", "write", 1, True),
        ("in-source", "source", 1, True),
        ("twice", "write", 2, True),  # the second one ends the loop under the close
        ("twice-no-exit-hooks", "write", 2, False),
    )
    if backend == "asyncio" or hooks
]


@pytest.mark.parametrize(("backend", "where", "presses", "hooks"), CTRL_C_AT_CLOSE_CASES)
def test_ctrl_c_during_the_final_write_saves_the_newest_state(
    tmp_path: Path, backend: str, where: str, presses: int, hooks: bool
) -> None:
    """Ctrl-C (once or twice) while aclose() writes, in the store or in source() on the
    loop: the newest state is on disk, not live, and the program ends on a bare
    KeyboardInterrupt."""
    env = child_env()
    args = [str(tmp_path), backend, where, str(presses), str(int(hooks))]
    child = subprocess.Popen(
        [sys.executable, "-c", CTRL_C_AT_CLOSE_CHILD, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdout is not None

    def said(line: str) -> None:
        got = child.stdout.readline().strip() if child.stdout is not None else ""
        if got != line:
            child.kill()
            raise AssertionError(f"expected {line!r}, got {got!r}: {child.communicate()}")

    said("HELD")
    for _ in range(presses):
        child.send_signal(signal.SIGINT)
        said("SIGINT")
    out, err = child.communicate(timeout=HANG_GUARD)
    assert child.returncode == -signal.SIGINT, err
    assert "CLOSED" not in out  # Ctrl-C still ends the program ...
    assert err.strip().splitlines()[-1] == "KeyboardInterrupt", err
    assert on_disk(FileStore(tmp_path)) == (1, False)  # ... after the final write


HUNG_AT_CLOSE_CHILD = textwrap.dedent(
    """
    import sys, threading
    import anyio
    from checkpointer import CheckpointWriter, FileStore, Limits, Snapshot

    root, backend = sys.argv[1], sys.argv[2]
    closing = False

    class HungStore(FileStore):
        def write(self, key, chunks, **kw):
            if closing:
                print("HUNG", flush=True)
                threading.Event().wait(120)  # a disk that never answers
            return super().write(key, chunks, **kw)

    state = {"n": 0}

    async def main():
        global closing
        async with CheckpointWriter(
            lambda: Snapshot("s1", dict(state)),
            HungStore(root),
            limits=Limits(close_timeout=0.2, exit_timeout=0.2),
        ):
            state["n"], closing = 1, True
        print("CLOSED", flush=True)

    anyio.run(main, backend=backend)
    """
)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_final_write_that_never_ends_does_not_hang_the_exit(tmp_path: Path, backend: str) -> None:
    """A final write hung for good: aclose() returns at close_timeout and the process
    exits after waiting exit_timeout for it (no thread of ours keeps it alive)."""
    env = child_env()
    done = subprocess.run(
        [sys.executable, "-c", HUNG_AT_CLOSE_CHILD, str(tmp_path), backend],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,  # the write hangs for 120 s: waiting for it would end here
        env=env,
        check=False,
    )
    assert (done.returncode, done.stdout.split()) == (0, ["HUNG", "CLOSED"]), done
    assert "did not finish within close_timeout=0.2s" in done.stderr
    assert on_disk(FileStore(tmp_path)) == (0, True)  # the hung write never landed


# -- source() returns None at close ------------------------------------------------------


class Ending:
    """A session that ends (``source()`` returns None from then on) before the close."""

    def __init__(self) -> None:
        self.ended = False

    def source(self) -> Snapshot | None:
        return None if self.ended else Snapshot(KEY, {"n": 1})


@pytest.mark.parametrize("store_type", [FileStore, JournalStore])
def test_close_after_the_session_ended_leaves_the_file_not_live(
    tmp_path: Path, store_type: type[FileStore]
) -> None:
    """close() whose source() returns None: the last key's checkpoint says live=False."""
    session = Ending()
    writer = CheckpointWriter(session.source, store_type(tmp_path), exit_hooks=False).open()
    assert on_disk(store_type(tmp_path)) == (1, True)
    session.ended = True
    assert writer.close() == Skipped("no-identity")
    assert on_disk(store_type(tmp_path)) == (1, False)
    key_is_free(store_type, tmp_path)


@pytest.mark.anyio
@pytest.mark.parametrize("store_type", [FileStore, JournalStore])
async def test_aclose_after_the_session_ended_leaves_the_file_not_live(
    tmp_path: Path, store_type: type[FileStore]
) -> None:
    """aclose() whose source() returns None: the last key's checkpoint says live=False."""
    session = Ending()
    async with CheckpointWriter(session.source, store_type(tmp_path), exit_hooks=False):
        assert on_disk(store_type(tmp_path)) == (1, True)
        session.ended = True
    assert on_disk(store_type(tmp_path)) == (1, False)
    key_is_free(store_type, tmp_path)
