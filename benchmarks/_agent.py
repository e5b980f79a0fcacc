"""The simulated agent of the coalescing and peer cases, and the approaches that save it.

One turn is 50 "run ended" events.  45 of them append a message to the
transcript; the others change nothing (a run that produced no message, and
the closing "turn ended"), which is what makes a writer without a
fingerprint write the same bytes twice.  Two patterns:

* ``steady``: an event every millisecond, turn after turn, never a quiet
  gap as long as the debounce: a trailing debounce without a maximum wait
  starves until the stream stops.
* ``bursty``: five bursts per turn; in each, nine message events back to
  back, 8 ms of quiet (a model call), one event that changes nothing, 8 ms
  of quiet.

Timers are the library's defaults divided by 100 (debounce 5 ms,
min_interval 10 ms, max_wait 50 ms) so a 200-turn session runs in seconds;
a real session's seconds-long model calls scale the same way.

Every approach reports each durable write as ``(snapshot time, done time,
messages covered)``; from those and the time of every event the run
computes how long any change waited to reach disk.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
import json
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Literal

import anyio
import anyio.lowlevel
import msgspec

from checkpointer import CheckpointWriter, FileStore, Snapshot

from ._harness import Ticker, bytes_written, percentile, scratch_dir
from ._recipes import dumps, message, write_aiofiles, write_floor

__all__ = [
    "APPROACHES",
    "DEBOUNCE",
    "MAX_WAIT",
    "MIN_INTERVAL",
    "Approach",
    "Run",
    "run_workload",
]

DEBOUNCE = 0.005
MIN_INTERVAL = 0.010
MAX_WAIT = 0.050
EVENTS_PER_TURN = 50
MESSAGE_SIZE = 150
HISTORY_SIZE = 1024

Pattern = Literal["steady", "bursty", "stepwise"]
PATTERNS: tuple[Pattern, ...] = ("steady", "bursty", "stepwise")


class Bus:
    """A "run ended" event source: ``subscribe(callback) -> unsubscribe``."""

    def __init__(self) -> None:
        self._subscribers: list[Callable[..., None]] = []

    def subscribe(self, callback: Callable[..., None]) -> Callable[[], None]:
        self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback)

    def emit(self, event: str) -> None:
        for callback in list(self._subscribers):
            callback(event)


class Agent:
    """The session: a transcript that grows by messages, and its event times."""

    key = "bench-session"

    def __init__(self, history: int = 0) -> None:
        # A resumed session: ``history`` earlier messages of about 1 KiB each.
        self.messages: list[dict[str, Any]] = [message(i, HISTORY_SIZE) for i in range(history)]
        self.history = history
        self.event_times: list[float] = []  # time of the event that added message history+i
        self.events = 0

    def snapshot(self) -> Snapshot:
        return Snapshot(self.key, {"messages": self.messages})

    def change(self, bus: Bus) -> None:
        self.messages.append(message(len(self.messages), MESSAGE_SIZE))
        self.event_times.append(time.perf_counter())
        self.events += 1
        bus.emit("run_ended")

    def no_change(self, bus: Bus, event: str = "run_ended") -> None:
        self.events += 1
        bus.emit(event)

    async def run(self, bus: Bus, turns: int, pattern: Pattern) -> None:
        for _ in range(turns):
            if pattern == "bursty":
                for k in range(EVENTS_PER_TURN - 1):
                    if k % 10 == 9:
                        self.no_change(bus)
                    else:
                        self.change(bus)
                    await anyio.lowlevel.checkpoint()
                await anyio.sleep(0.008)
                self.no_change(bus, "turn_ended")
                await anyio.sleep(0.020)
                continue
            for step in range(5):
                closing = "turn_ended" if step == 4 else "run_ended"
                for _ in range(9):
                    self.change(bus)
                    await anyio.sleep(0.001 if pattern == "steady" else 0)
                if pattern == "stepwise":
                    await anyio.sleep(0.008)
                self.no_change(bus, closing)
                await anyio.sleep(0.001 if pattern == "steady" else 0.008)


class Durable(msgspec.Struct, array_like=True):
    snapshot_at: float
    done_at: float
    messages: int


class Recorder:
    """What an approach did: its durable writes, in order of completion."""

    def __init__(self) -> None:
        self.durable: list[Durable] = []
        self.writes = 0
        self.payload = 0

    def wrote(self, snapshot_at: float, messages: int, nbytes: int) -> None:
        self.writes += 1
        self.payload += nbytes
        self.durable.append(Durable(snapshot_at, time.perf_counter(), messages))


class Approach:
    """A way to persist the agent's session; subclasses attach to the bus."""

    name = "none"
    label = "no persistence (baseline)"
    backends: tuple[str, ...] = ("asyncio", "trio")

    def missing(self) -> str | None:
        """Why this approach cannot run here, or None."""
        return None

    @contextlib.asynccontextmanager
    async def attached(
        self, agent: Agent, bus: Bus, root: str, rec: Recorder
    ) -> AsyncIterator[None]:
        yield

    async def on_disk(self, root: str) -> list[Any] | None:
        """The transcript the approach left on disk (None: nothing there)."""
        return None


class Checkpointer(Approach):
    """checkpointer's writer on a ``FileStore``: the whole transcript per write."""

    name = "checkpointer"
    label = "checkpointer (FileStore, fingerprint=len)"

    def store(self, root: str, written: Callable[[int], None]) -> Any:
        """The store, calling ``written(nbytes)`` after each durable write."""

        class Store(FileStore):
            def write(self, key: str, chunks: Sequence[bytes], **kw: Any) -> int:
                nbytes = super().write(key, chunks, **kw)
                written(nbytes)
                return nbytes

        return Store(root)

    def loader(self, root: str) -> Any:
        return FileStore(root)

    @contextlib.asynccontextmanager
    async def attached(
        self, agent: Agent, bus: Bus, root: str, rec: Recorder
    ) -> AsyncIterator[None]:
        taken: list[tuple[float, int]] = []

        def source() -> Snapshot:
            taken.append((time.perf_counter(), len(agent.messages)))
            snapshot = agent.snapshot()
            return msgspec.structs.replace(snapshot, fingerprint=len(agent.messages))

        def written(nbytes: int) -> None:
            snapshot_at, n = taken[-1]  # one write at a time: the latest snapshot
            rec.wrote(snapshot_at, n, nbytes)

        async with CheckpointWriter(
            source,
            self.store(root, written),
            debounce=DEBOUNCE,
            min_interval=MIN_INTERVAL,
            max_wait=MAX_WAIT,
            exit_hooks=False,
        ) as writer:
            writer.attach(bus.subscribe)
            yield

    async def on_disk(self, root: str) -> list[Any] | None:
        from checkpointer import load

        checkpoint = load(self.loader(root), Agent.key)
        return None if checkpoint is None else list(checkpoint.state["messages"])


class CheckpointerJournal(Checkpointer):
    """The same writer on a ``JournalStore``: the new messages appended per write."""

    name = "journal"
    label = "checkpointer (JournalStore, fingerprint=len)"

    def store(self, root: str, written: Callable[[int], None]) -> Any:
        from checkpointer import JournalStore

        class Store(JournalStore):
            def commit(self, key: str, meta: Any, staged: object, **kw: Any) -> int:
                nbytes = super().commit(key, meta, staged, **kw)
                written(nbytes)
                return nbytes

        return Store(root)

    def loader(self, root: str) -> Any:
        from checkpointer import JournalStore

        return JournalStore(root)


def _read_json(path: str) -> list[Any] | None:
    try:
        with open(path, "rb") as f:
            return list(json.loads(f.read())["messages"])
    except FileNotFoundError:
        return None


class Naive(Approach):
    """Save on every event: ``json.dumps`` on the loop, then aiofiles step by step.

    Each event starts its own save task, as ``asyncio.create_task(save())``
    in an event handler does; the saves overlap and finish in any order.
    """

    name = "naive"
    label = "naive: every event, json.dumps + aiofiles"
    backends = ("asyncio",)  # aiofiles fails under trio

    def missing(self) -> str | None:
        try:
            import aiofiles  # noqa: F401
        except ImportError:
            return "aiofiles is not installed (pip install -e '.[bench]')"
        return None

    @contextlib.asynccontextmanager
    async def attached(
        self, agent: Agent, bus: Bus, root: str, rec: Recorder
    ) -> AsyncIterator[None]:
        path = os.path.join(root, "session.json")

        async def save() -> None:
            snapshot_at = time.perf_counter()
            n = len(agent.messages)
            data = dumps({"messages": agent.messages})
            await write_aiofiles(path, data)
            rec.wrote(snapshot_at, n, len(data))

        async with anyio.create_task_group() as tg:

            def on_event(event: str) -> None:
                tg.start_soon(save)

            unsubscribe = bus.subscribe(on_event)
            try:
                yield
            finally:
                unsubscribe()  # the task group waits for the saves in flight

    async def on_disk(self, root: str) -> list[Any] | None:
        return _read_json(os.path.join(root, "session.json"))


class TrailingDebounce(Approach):
    """Home Assistant's delayed-save model: each event pushes the save back.

    Written from its documented behaviour (``Store.async_delay_save(data_func,
    delay)``: every call restarts the delay; the data function runs when the
    delay ends; the file is serialised and written in the executor; a
    pending save is written at shutdown).  No maximum wait, no check whether
    the data changed.
    """

    name = "debounce"
    label = "trailing debounce, no max wait (Home Assistant model)"
    backends = ("asyncio",)

    @contextlib.asynccontextmanager
    async def attached(
        self, agent: Agent, bus: Bus, root: str, rec: Recorder
    ) -> AsyncIterator[None]:
        path = os.path.join(root, "session.json")
        loop = asyncio.get_running_loop()
        lock = asyncio.Lock()
        handle: asyncio.TimerHandle | None = None
        tasks: set[asyncio.Task[None]] = set()

        def serialize_and_write(data: dict[str, Any]) -> int:
            encoded = dumps(data)
            write_floor(path, encoded)
            return len(encoded)

        async def save() -> None:
            async with lock:
                snapshot_at = time.perf_counter()
                data = {"messages": list(agent.messages)}  # the data function
                nbytes = await loop.run_in_executor(None, serialize_and_write, data)
                rec.wrote(snapshot_at, len(data["messages"]), nbytes)

        def fire() -> None:
            nonlocal handle
            handle = None
            task = loop.create_task(save())
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        def on_event(event: str) -> None:
            nonlocal handle
            if handle is not None:
                handle.cancel()
            handle = loop.call_later(DEBOUNCE, fire)

        unsubscribe = bus.subscribe(on_event)
        try:
            yield
        finally:
            unsubscribe()
            if handle is not None:  # the final write at shutdown
                handle.cancel()
                fire()
            await asyncio.gather(*tasks)

    async def on_disk(self, root: str) -> list[Any] | None:
        return _read_json(os.path.join(root, "session.json"))


class DebounceMaxWait(Approach):
    """A good hand-written debounce: trailing, with a maximum wait, skipping no-ops.

    Each event pushes the save back by ``DEBOUNCE``, but never past
    ``MAX_WAIT`` after the first unsaved event (lodash's ``debounce(wait,
    {maxWait})``); one save at a time, serialised and written in the
    executor; a save whose transcript has the length of the last one saved is
    skipped (the same cheap change check checkpointer is given here).  A
    pending save is written at shutdown.
    """

    name = "debounce-max-wait"
    label = "debounce with max wait, skips unchanged (hand-written)"
    backends = ("asyncio",)

    @contextlib.asynccontextmanager
    async def attached(
        self, agent: Agent, bus: Bus, root: str, rec: Recorder
    ) -> AsyncIterator[None]:
        path = os.path.join(root, "session.json")
        loop = asyncio.get_running_loop()
        lock = asyncio.Lock()
        handle: asyncio.TimerHandle | None = None
        first: float | None = None  # the first event not yet covered by a save
        saved = [-1]  # the length of the transcript last saved
        tasks: set[asyncio.Task[None]] = set()

        def serialize_and_write(data: dict[str, Any]) -> int:
            encoded = dumps(data)
            write_floor(path, encoded)
            return len(encoded)

        async def save() -> None:
            async with lock:
                snapshot_at = time.perf_counter()
                data = {"messages": list(agent.messages)}
                if len(data["messages"]) == saved[0]:
                    return
                nbytes = await loop.run_in_executor(None, serialize_and_write, data)
                saved[0] = len(data["messages"])
                rec.wrote(snapshot_at, len(data["messages"]), nbytes)

        def fire() -> None:
            nonlocal handle, first
            handle = None
            first = None
            task = loop.create_task(save())
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        def on_event(event: str) -> None:
            nonlocal handle, first
            now = loop.time()
            if first is None:
                first = now
            if handle is not None:
                handle.cancel()
            handle = loop.call_later(max(0.0, min(DEBOUNCE, first + MAX_WAIT - now)), fire)

        unsubscribe = bus.subscribe(on_event)
        try:
            yield
        finally:
            unsubscribe()
            if handle is not None:  # the final write at shutdown
                handle.cancel()
                fire()
            await asyncio.gather(*tasks)

    async def on_disk(self, root: str) -> list[Any] | None:
        return _read_json(os.path.join(root, "session.json"))


class LangGraphSqlite(Approach):
    """LangGraph's ``AsyncSqliteSaver``: the transcript saved as a checkpoint per turn.

    Used through its documented raw API: ``aput(config, checkpoint,
    metadata, new_versions)`` with the transcript in ``channel_values``.
    """

    name = "langgraph"
    label = "LangGraph AsyncSqliteSaver, every turn"
    backends = ("asyncio",)

    def missing(self) -> str | None:
        try:
            import langgraph.checkpoint.sqlite.aio  # noqa: F401
        except ImportError:
            return "langgraph-checkpoint-sqlite is not installed (pip install -e '.[bench]')"
        return None

    @staticmethod
    def _config(checkpoint_id: str | None = None) -> dict[str, Any]:
        configurable = {"thread_id": Agent.key, "checkpoint_ns": ""}
        if checkpoint_id is not None:
            configurable["checkpoint_id"] = checkpoint_id
        return {"configurable": configurable}

    @contextlib.asynccontextmanager
    async def attached(
        self, agent: Agent, bus: Bus, root: str, rec: Recorder
    ) -> AsyncIterator[None]:
        from langgraph.checkpoint.base import empty_checkpoint
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        config: Any = self._config()
        step = 0
        async with AsyncSqliteSaver.from_conn_string(os.path.join(root, "lg.sqlite")) as saver:
            await saver.setup()
            lock = anyio.Lock()

            async def save(messages: list[Any], snapshot_at: float) -> None:
                nonlocal config, step
                async with lock:
                    step += 1
                    checkpoint = empty_checkpoint()
                    checkpoint["channel_values"] = {"messages": messages}
                    checkpoint["channel_versions"] = {"messages": step}
                    config = await saver.aput(
                        config, checkpoint, {"source": "loop", "step": step}, {"messages": step}
                    )
                    rec.wrote(snapshot_at, len(messages), 0)

            async with anyio.create_task_group() as tg:

                def on_event(event: str) -> None:
                    if event == "turn_ended":
                        tg.start_soon(save, list(agent.messages), time.perf_counter())

                unsubscribe = bus.subscribe(on_event)
                try:
                    yield
                finally:
                    unsubscribe()

    async def on_disk(self, root: str) -> list[Any] | None:
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        async with AsyncSqliteSaver.from_conn_string(os.path.join(root, "lg.sqlite")) as saver:
            found = await saver.aget_tuple(self._config())
        if found is None:
            return None
        return list(found.checkpoint["channel_values"]["messages"])


APPROACHES: list[Approach] = [
    Approach(),
    Checkpointer(),
    CheckpointerJournal(),
    Naive(),
    TrailingDebounce(),
    DebounceMaxWait(),
    LangGraphSqlite(),
]
"""Every approach of the peer case; adding one is one entry here."""


class Run(msgspec.Struct, kw_only=True):
    """The figures of one approach on one workload run."""

    approach: str
    pattern: str
    events: int
    messages: int
    writes: int
    payload_bytes: int
    bytes_written: int | None
    wall: float
    loop_cpu: float
    stall_worst: float
    stall_p99: float
    longest_write: float | None  # snapshot to durable, the slowest write of the run
    longest_wait: float | None  # event to disk, None if some change never got there
    wait_over_write: float | None  # longest (wait - the covering write's own duration)
    wait_contract: float | None  # longest wait / its contract bound, see _waits
    durable_at_end: bool
    stored_bytes: int


class Waits(msgspec.Struct, frozen=True):
    """How long changes waited to reach disk (seconds), None if one never did."""

    longest: float | None
    over_write: float | None  # longest wait less the duration of its covering write
    contract: float | None  # longest wait / its bound (see ``_waits``)


def _waits(
    event_times: list[float],
    durable: list[Durable],
    history: int,
    *,
    max_wait: float = MAX_WAIT,
    slack: float = 0.0,
) -> Waits:
    """Each change's wait: from its event to the end of the first write covering it.

    ``contract`` compares every wait with the bound the timing contract
    gives when writes are one at a time: the covering write starts at most
    ``max_wait`` after the change, or when the write in flight at the change
    ends if that is later; then it takes its own time.  ``slack`` adds the
    loop's own timer lateness to that bound.
    """
    ordered = sorted(durable, key=lambda d: d.done_at)
    starts = sorted(durable, key=lambda d: d.snapshot_at)
    start_times = [d.snapshot_at for d in starts]
    longest = over = contract = 0.0
    i = 0
    covered = 0
    for d in ordered:
        own = d.done_at - d.snapshot_at
        while i < len(event_times) and i < d.messages - history:
            t = event_times[i]
            wait = d.done_at - t
            longest = max(longest, wait)
            over = max(over, wait - own)
            k = bisect.bisect_right(start_times, t) - 1
            inflight = 0.0
            if k >= 0 and starts[k].done_at > t:
                inflight = starts[k].done_at - starts[k].snapshot_at
            contract = max(contract, wait / (max(max_wait, inflight) + own + slack))
            i += 1
        covered = max(covered, d.messages - history)
    if covered < len(event_times):
        return Waits(None, None, None)
    return Waits(longest, over, contract)


def _dir_bytes(root: str) -> int:
    return sum(e.stat().st_size for e in os.scandir(root) if e.is_file())


async def run_workload(approach: Approach, turns: int, pattern: Pattern, history: int) -> Run:
    """Run the agent with ``approach`` attached; measure it.  On the current loop."""
    agent = Agent(history)
    bus = Bus()
    rec = Recorder()
    with scratch_dir(f"{approach.name}-") as root:
        ticker = Ticker()
        async with anyio.create_task_group() as tg:
            await tg.start(ticker.run)
            await anyio.sleep(0.005)
            written0 = bytes_written()
            mark = ticker.mark()
            cpu0 = time.thread_time()
            t0 = time.perf_counter()
            async with approach.attached(agent, bus, root, rec):
                await agent.run(bus, turns, pattern)
            wall = time.perf_counter() - t0
            cpu = time.thread_time() - cpu0
            written1 = bytes_written()
            lags = sorted(ticker.since(mark))
            ticker.stop()
        on_disk = await approach.on_disk(root)
        stored = _dir_bytes(root)
    waits = _waits(agent.event_times, rec.durable, history, slack=percentile(lags, 0.99))
    return Run(
        approach=approach.name,
        pattern=pattern,
        events=agent.events,
        messages=len(agent.messages),
        writes=rec.writes,
        payload_bytes=rec.payload,
        bytes_written=None if written0 is None or written1 is None else written1 - written0,
        wall=wall,
        loop_cpu=cpu,
        stall_worst=lags[-1] if lags else 0.0,
        stall_p99=percentile(lags, 0.99),
        longest_write=max((d.done_at - d.snapshot_at for d in rec.durable), default=None),
        longest_wait=waits.longest if approach.name != "none" else None,
        wait_over_write=waits.over_write if approach.name != "none" else None,
        wait_contract=waits.contract if approach.name != "none" else None,
        durable_at_end=on_disk == agent.messages if approach.name != "none" else False,
        stored_bytes=stored,
    )


class Workload(msgspec.Struct, kw_only=True):
    """Every run of the agent simulation, shared by the coalescing and peer cases."""

    turns: int
    history: int
    repeats: int
    runs: dict[str, list[Run]]  # "<approach>/<pattern>" -> one Run per repeat
    missing: dict[str, str]  # approach -> why it did not run


def workload_config(quick: bool) -> tuple[int, int, int]:
    """(turns, history messages, repeats) of the agent runs."""
    return (1, 20, 1) if quick else (30, 200, 3)


@functools.cache
def workload(quick: bool) -> Workload:
    """Run every approach on every pattern, repeatedly; once per process."""
    turns, history, repeats = workload_config(quick)
    runs: dict[str, list[Run]] = {}
    missing: dict[str, str] = {}
    available = []
    for approach in APPROACHES:
        why = approach.missing()
        if why is None:
            available.append(approach)
        else:
            missing[approach.name] = why

    async def go() -> None:
        for approach in available:  # warm-up: imports, first connections, caches
            await run_workload(approach, 1, "bursty", history)
        for rep in range(repeats):
            order = available[rep % len(available) :] + available[: rep % len(available)]
            for pattern in PATTERNS:
                for approach in order:
                    run = await run_workload(approach, turns, pattern, history)
                    runs.setdefault(f"{approach.name}/{pattern}", []).append(run)

    anyio.run(go, backend="asyncio")
    return Workload(turns=turns, history=history, repeats=repeats, runs=runs, missing=missing)
