"""Case: many sessions in one process (an agent server): N writers, one loop, one store.

100, 1,000 and 10,000 writers (``--quick``: 30 and 300, one turn) are opened in
one event loop (asyncio, then trio) on one ``FileStore``, each with its own
key and a small transcript, exit hooks on, as a server keeps one writer per
live session.  Measured, per number of sessions:

* open: constructing and entering each writer (``async with``), per writer;
* memory: the RSS the open writers add, per writer (their states were built
  before the first RSS reading, so they are not counted);
* notify: ``notify()`` in a burst on one writer (timeit loops), and the first
  ``notify()`` of every session in a turn (it wakes that writer's timer);
* burst: every session changes once per turn; the time until every one of
  them is on disk gives checkpoints/s.  The floor is the same files (the
  bytes each writer wrote) written with the bare recipe by a pool of as many
  threads as anyio's default limiter lends the writers (40), right after.
  Each turn bursts twice: with group commit (how ``FileStore`` commits:
  writes falling due together share the directory's fsync), then with
  each write fsyncing its directory alone (the bare recipe's way); and at
  1,000 sessions (``--quick``: 300) a ``JournalStore`` bursts the same.  The
  bare recipe also runs without its directory fsync (not durable): the
  most any sharing of that fsync could gain, measured, since a filesystem
  may already merge concurrent fsyncs into one journal commit (ext4 does);
* close: every writer closed, 40 at a time (``aclose()`` in one task each:
  the final ``live=False`` write, the key's lock let go), per writer, as a
  server that bounds its shutdown's concurrency does.  (All 10,000 at once
  work too: every final write is written, each in a thread of its own;
  ``close_timeout`` bounds how long each ``aclose()`` waits for it.)

The bars: open and close at the most sessions at most 1.5x their cost at
100 (no work that grows with the number of writers); the burst at least
0.8x the bare recipe's checkpoints/s, and 1.5x at 1,000 sessions (group
commit: N file fsyncs and a few directory fsyncs, where the recipe pays N
of each); ``notify()`` at the most sessions
within 1.25x its cost at 100; the memory per open writer within
``MEMORY_BAR`` (see there).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import gc
import importlib.util
import json
import os
import resource
import subprocess
import sys
import threading
import time
import timeit
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import anyio
import msgspec

from checkpointer import (
    CheckpointWriter,
    FileStore,
    JournalStore,
    Meta,
    SessionRegistry,
    Snapshot,
    load,
)
from checkpointer._stores import atomic

from ._harness import Report, Table, ratio, scratch_dir, stat
from ._recipes import message, write_floor

COUNTS = (100, 1_000, 10_000)
QUICK_COUNTS = (30, 300)
BACKENDS = ("asyncio", "trio")
GOAL_SESSIONS = 1_000  # where group commit must beat the bare recipe by 1.5x
THREADS = 40  # anyio's default thread limiter: the worker threads the writers share
TURNS = 3
QUICK_TURNS = 1
DEBOUNCE = 0.005  # not counted in a burst's time: the writes may start only after it
POLL = 0.002  # how often the burst's end is looked for
MEMORY_BAR = 24 << 10
"""Bytes of RSS per open writer.

A writer is a handful of small objects (its scheduler, commit core, key
state, timer task with its coroutine frame, an encoder, the exit-hook
entry); 24 KiB each puts 10,000 sessions' writers at 240 MiB.  What a session
itself holds is larger: 100 messages of 1 KiB are 100 KiB, and the last
written bytes the writer keeps for its unchanged check are as large as the
file.  So the writers stay a fraction of what the sessions cost, and a
regression that doubles them (a buffer per writer, say) misses the bar.
"""


def _rss() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _cpu() -> tuple[float, float]:
    """The process's CPU seconds so far (every thread): (user, system)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime


def _per(end: tuple[float, float], start: tuple[float, float], n: int) -> tuple[float, float]:
    return (end[0] - start[0]) / n, (end[1] - start[1]) / n


def _cpu_cell(samples: list[list[float]]) -> str:
    """CPU per checkpoint, its user part (the part that holds the GIL, mostly) beside it."""
    user = sorted(u for u, _ in samples)[len(samples) // 2]
    total = sorted(u + s for u, s in samples)[len(samples) // 2]
    return f"{total * 1e6:.0f} µs (user {user * 1e6:.0f})"


def _source(state: dict[str, Any]) -> Snapshot:
    return Snapshot(state["key"], state)


def _states(n: int) -> list[dict[str, Any]]:
    return [{"key": f"s{i}", "messages": [message(i), message(i + 1)]} for i in range(n)]


class _Counter:
    """Counts a store's durable writes: the burst's end, in O(1) a poll."""

    def __init__(self, root: str) -> None:
        super().__init__(root)  # type: ignore[call-arg]  # the store's, next in the MRO
        self.writes = 0
        self._lock = threading.Lock()

    def _count(self) -> None:
        with self._lock:
            self.writes += 1


class _Counted(_Counter, FileStore):
    def write(self, key: str, chunks: Sequence[bytes], **kw: Any) -> int:
        n = super().write(key, chunks, **kw)
        self._count()
        return n


class _CountedJournal(_Counter, JournalStore):
    """A ``JournalStore``'s writer commits (appends) rather than writes."""

    def commit(self, key: str, meta: Meta, staged: object, *, expected: str | None) -> int:
        n = super().commit(key, meta, staged, expected=expected)
        self._count()
        return n


STORES: dict[str, type[_Counted | _CountedJournal]] = {"file": _Counted, "journal": _CountedJournal}


async def _wait_written(store: _Counter, target: int) -> None:
    while store.writes < target:  # noqa: ASYNC110 -- a counter bumped by worker threads
        await anyio.sleep(POLL)


def _read_files(store: FileStore, states: list[dict[str, Any]]) -> dict[str, bytes]:
    """Each session's file as the store holds it, for the bare recipe to write again."""
    files = {}
    for state in states:
        with open(store.location(state["key"]), "rb") as f:
            files[state["key"] + ".json"] = f.read()
    return files


def _bare(root: str, files: dict[str, bytes], dir_fsync: bool = True) -> float:
    """Seconds to write ``files`` into ``root`` with the bare recipe on ``THREADS`` threads
    (``dir_fsync=False``: without the directory's fsync, the ceiling of sharing it)."""

    def write(item: tuple[str, bytes]) -> None:
        write_floor(os.path.join(root, item[0]), item[1], dir_fsync=dir_fsync)

    with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
        t0 = time.perf_counter()
        list(pool.map(write, files.items()))
        return time.perf_counter() - t0


@contextlib.contextmanager
def _group_commit(on: bool) -> Iterator[None]:
    """Writes share their directory's fsync (``on``: how ``FileStore`` commits), or each
    fsyncs it alone, as the bare recipe does (the module's function replaced: a seam)."""
    if on:
        yield
        return
    grouped = atomic.sync_dir
    atomic.sync_dir = _fsync_alone
    try:
        yield
    finally:
        atomic.sync_dir = grouped


def _fsync_alone(dir_fd: int, fsync: Callable[[int], None] | None = None) -> None:
    (fsync or atomic.fsync_fd)(dir_fd)


async def _burst(
    store: _Counter, states: list[dict[str, Any]], writers: list[Any], turn: int
) -> tuple[float, float]:
    """Every session changes once; seconds until all are on disk, and the first notify's."""
    for state in states:
        state["messages"].append(message(turn + 2))
    written = store.writes + len(writers)  # every session changed: each writes once
    t0 = time.perf_counter()
    for w in writers:
        w.notify()
    first = (time.perf_counter() - t0) / len(writers)
    await _wait_written(store, written)
    return time.perf_counter() - t0 - DEBOUNCE, first


async def _run(n: int, turns: int, kind: str = "file") -> dict[str, Any]:
    """One number of sessions on the running backend and store; figures as plain numbers."""
    with scratch_dir("sessions-") as scratch:
        root = os.path.join(scratch, "store")
        bare_root = os.path.join(scratch, "bare")
        os.mkdir(root)
        os.mkdir(bare_root)
        store = STORES[kind](root)
        states = _states(n)
        gc.collect()
        rss0 = _rss()
        writers: list[CheckpointWriter[Snapshot]] = []
        t0 = time.perf_counter()
        for state in states:
            writer: CheckpointWriter[Snapshot] = CheckpointWriter(
                functools.partial(_source, state),
                store,
                debounce=DEBOUNCE,
                min_interval=0.0,
                max_wait=0.05,
                write_on_start=False,
            )
            await writer.__aenter__()
            writers.append(writer)
        opened = (time.perf_counter() - t0) / n
        gc.collect()
        memory = (_rss() - rss0) / n
        # notify() in a burst, on a writer whose burst has begun
        one = writers[n // 2]
        one.notify()
        loops = [timeit.Timer(one.notify).timeit(20_000) / 20_000 for _ in range(15)]
        await _wait_written(store, 1)
        await _burst(store, states, writers, -1)  # unmeasured: each key's first write made
        bursts: dict[bool, list[float]] = {True: [], False: []}  # by group commit
        bares: list[float] = []
        ceilings: list[float] = []  # the bare recipe without its directory fsync
        firsts: list[float] = []
        cpu: dict[str, list[tuple[float, float]]] = {"burst": [], "bare": []}
        for turn in range(turns):
            for grouped in (True, False) if turn % 2 else (False, True):
                with _group_commit(grouped):
                    c0 = _cpu()
                    seconds, first = await _burst(store, states, writers, turn)
                    if grouped:
                        cpu["burst"].append(_per(_cpu(), c0, n))
                bursts[grouped].append(seconds)
                firsts.append(first)
            files = await anyio.to_thread.run_sync(_read_files, store, states)
            c0 = _cpu()
            bares.append(await anyio.to_thread.run_sync(_bare, bare_root, files))
            cpu["bare"].append(_per(_cpu(), c0, n))
            ceilings.append(await anyio.to_thread.run_sync(_bare, bare_root, files, False))
        closing = anyio.Semaphore(THREADS)

        async def close(writer: CheckpointWriter[Snapshot]) -> None:
            async with closing:
                await writer.aclose()

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for w in writers:
                tg.start_soon(close, w)
        closed = (time.perf_counter() - t0) / n
        failures = sum(w.statistics().failures for w in writers)
    return {
        "open": opened,
        "close": closed,
        "memory": memory,
        "notify": min(loops),
        "notify_loops": loops,
        "first_notify": firsts,
        "sessions": n,
        "burst": [n / b for b in bursts[True]],
        "burst_solo": [n / b for b in bursts[False]],
        "bare": [n / b for b in bares],
        "ceiling": [n / b for b in ceilings],
        "cpu_burst": cpu["burst"],
        "cpu_bare": cpu["bare"],
        "failures": failures,
    }


def _in_child(backend: str, n: int, turns: int, kind: str = "file") -> dict[str, Any]:
    """``_run`` in a fresh interpreter: its RSS and its heap are the writers' alone."""
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_sessions", backend, str(n), str(turns), kind],
        capture_output=True,
        check=True,
        timeout=1200,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    figures: dict[str, Any] = json.loads(out.stdout)
    return figures


def _raise_fd_limit(n: int) -> None:
    """Each open writer of a ``FileStore`` holds its key's lock file open."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n + 256
    if soft < want and (hard == resource.RLIM_INFINITY or hard >= want):
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def main(quick: bool) -> dict[str, Any]:
    counts = QUICK_COUNTS if quick else COUNTS
    turns = QUICK_TURNS if quick else TURNS
    report = Report(title="Many sessions in one process: N writers, one event loop, one store")
    rows: list[list[Any]] = []
    figures: dict[tuple[str, int], dict[str, Any]] = {}
    journals: dict[str, dict[str, Any]] = {}  # the JournalStore's, at the middle count
    for backend in BACKENDS:
        if importlib.util.find_spec(backend) is None:
            report.notes.append(f"{backend}: not installed, skipped")
            continue
        for n in counts:
            figures[backend, n] = _in_child(backend, n, turns)
        journals[backend] = _in_child(backend, counts[1], turns, "journal")
    for (backend, n), f in figures.items():
        burst, bare = stat(f["burst"], ""), stat(f["bare"], "")
        rows.append(
            [
                backend,
                f"{n:,}",
                f["open"],
                f["close"],
                stat([f["memory"]], "B"),
                f["notify"],
                stat(f["first_notify"]),
                f["failures"],
            ]
        )
        for metric, value in (
            ("open", stat([f["open"]])),
            ("close", stat([f["close"]])),
            ("memory", stat([f["memory"]], "B")),
            ("notify", stat([f["notify"]])),
            ("burst", burst),
            ("burst-alone", stat(f["burst_solo"], "")),
            ("bare", bare),
            ("ceiling", stat(f["ceiling"], "")),
        ):
            report.series.setdefault(f"sessions/{metric}/{backend}", []).append((float(n), value))
    report.tables.append(
        Table(
            title="per number of sessions: costs per writer",
            columns=[
                "backend",
                "sessions",
                "open",
                "close",
                "memory",
                "notify (burst)",
                "first notify of a turn",
                "failures",
            ],
            rows=rows,
        )
    )
    low, high = counts[0], counts[-1]
    for backend in BACKENDS:
        if (backend, low) not in figures or (backend, high) not in figures:
            continue
        a, b = figures[backend, low], figures[backend, high]
        for what in ("open", "close"):
            report.ratios.append(
                ratio(
                    f"{backend}: {what} per writer @{high:,} / @{low:,} sessions",
                    b[what] / a[what],
                    "<=",
                    1.5,
                    note=f"{b[what] * 1e6:.0f} µs vs {a[what] * 1e6:.0f} µs",
                )
            )
        report.ratios.append(
            ratio(
                f"{backend}: notify() @{high:,} / @{low:,} sessions",
                b["notify"] / a["notify"],
                "<=",
                1.25,
                note=f"min of 15 loops of 20,000 calls: {b['notify'] * 1e9:.0f} ns vs "
                f"{a['notify'] * 1e9:.0f} ns",
            )
        )
        report.ratios.append(
            ratio(
                f"{backend}: memory per open writer @{high:,} sessions / {MEMORY_BAR >> 10} KiB",
                b["memory"] / MEMORY_BAR,
                "<=",
                1.0,
                note=f"{b['memory'] / 1024:.1f} KiB per writer (RSS over the writers)",
            )
        )
    _bursts(report, figures, journals, turns)
    report.notes.append(
        "open: construct + async with (store.open in a worker thread, exit hooks, timer); "
        "close: every writer closed, 40 aclose() at a time, each a final live=False write "
        "and the key's lock let go; memory: RSS growth over the open writers / their number, "
        "before any write"
    )
    _registry(report, counts)
    return msgspec.to_builtins(report)  # type: ignore[no-any-return]


def _median_ratio(xs: list[float], ys: list[float]) -> float:
    pairs = sorted(x / y for x, y in zip(xs, ys, strict=True))
    return pairs[len(pairs) // 2]


def _bursts(
    report: Report,
    figures: dict[tuple[str, int], dict[str, Any]],
    journals: dict[str, dict[str, Any]],
    turns: int,
) -> None:
    """The burst table and its bars: group commit, each write alone, the journal, the floor."""
    rows: list[list[Any]] = []
    for (backend, n), f in figures.items():
        grouped = _median_ratio(f["burst"], f["bare"])
        alone = _median_ratio(f["burst_solo"], f["bare"])
        ceiling = _median_ratio(f["ceiling"], f["bare"])
        cpu, cpu_bare = _cpu_cell(f["cpu_burst"]), _cpu_cell(f["cpu_bare"])
        rows.append(
            [
                backend,
                "FileStore",
                f"{n:,}",
                stat(f["burst"], ""),
                stat(f["burst_solo"], ""),
                stat(f["bare"], ""),
                stat(f["ceiling"], ""),
                f"{grouped:.2f}x",
                f"{alone:.2f}x",
                f"{ceiling:.2f}x",
                cpu,
                cpu_bare,
            ]
        )
        report.ratios.append(
            ratio(
                f"{backend}: burst checkpoints/s @{n:,} sessions / bare recipe",
                grouped,
                ">=",
                1.5 if n == GOAL_SESSIONS else 0.8,
                note=f"median of {turns} turns, each followed by the bare recipe; "
                f"each write fsyncing its directory alone: {alone:.2f}x; the bare recipe "
                f"with no directory fsync at all (not durable: the most sharing it can give): "
                f"{ceiling:.2f}x; CPU per checkpoint {cpu}, the bare recipe's {cpu_bare}",
            )
        )
    for backend, f in journals.items():
        n = f["sessions"]
        rows.append(
            [
                backend,
                "JournalStore",
                f"{n:,}",
                stat(f["burst"], ""),
                stat(f["burst_solo"], ""),
                stat(f["bare"], ""),
                stat(f["ceiling"], ""),
                f"{_median_ratio(f['burst'], f['bare']):.2f}x",
                f"{_median_ratio(f['burst_solo'], f['bare']):.2f}x",
                f"{_median_ratio(f['ceiling'], f['bare']):.2f}x",
                _cpu_cell(f["cpu_burst"]),
                _cpu_cell(f["cpu_bare"]),
            ]
        )
    report.notes.append(
        "CPU/checkpoint: the process's CPU time (every thread, user + system; the kernel's "
        "part of an fsync is CPU time too) over a burst or the bare recipe's run, per "
        "checkpoint, median of the turns; user: the part in user space, which holds the "
        "GIL (Python code and C extensions): one thread at a time runs it, so a burst's "
        "checkpoints/s is at most 1 / user, and at most cores / total"
    )
    report.tables.append(
        Table(
            title="bursts: every session changes once; checkpoints/s until all are on disk",
            columns=[
                "backend",
                "store",
                "sessions",
                "group commit",
                "each dir fsync alone",
                f"bare recipe, {THREADS} threads",
                "bare, no dir fsync",
                "group / bare",
                "alone / bare",
                "no dir fsync / bare",
                "CPU/checkpoint (group)",
                "CPU/checkpoint (bare)",
            ],
            rows=rows,
        )
    )


# -- the registry: a writer per session through SessionRegistry --------------------
#
# Open: ``registry.session(key)`` of a key not open (``resume`` in a worker
# thread, the writer made and entered), per session; close: ``aclose()`` of the
# registry holding them all (each writer's final write, 64 at a time, its lock
# let go), per session; memory: the RSS the open sessions add.  Bars: open and
# close at the most sessions within 1.5x of their cost at 100.


async def _registry_run(n: int) -> dict[str, Any]:
    """``n`` sessions opened through one registry on the running backend, then closed."""
    with scratch_dir("registry-") as scratch:
        store = FileStore(scratch)
        states = {state["key"]: state for state in _states(n)}

        def source(key: str) -> Snapshot:
            return Snapshot(key, states[key])

        registry = SessionRegistry(
            source, store, resume=functools.partial(load, store), max_open=n, write_on_start=False
        )
        gc.collect()
        rss0 = _rss()
        async with registry:
            t0 = time.perf_counter()
            for key in states:
                async with registry.session(key):
                    pass
            opened = (time.perf_counter() - t0) / n
            gc.collect()
            memory = (_rss() - rss0) / n
            t0 = time.perf_counter()
            await registry.aclose()
            closed = (time.perf_counter() - t0) / n
    return {"open": opened, "close": closed, "memory": memory}


def _registry(report: Report, counts: tuple[int, ...]) -> None:
    """The registry's section: open and close per session at each number of sessions."""
    figures: dict[tuple[str, int], dict[str, Any]] = {}
    for backend in BACKENDS:
        for n in counts:
            out = subprocess.run(
                [sys.executable, "-m", "benchmarks.bench_sessions", "registry", backend, str(n)],
                capture_output=True,
                check=True,
                timeout=1200,
                cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
            )
            figures[backend, n] = json.loads(out.stdout)
    rows: list[list[Any]] = [
        [backend, f"{n:,}", f["open"], f["close"], stat([f["memory"]], "B")]
        for (backend, n), f in figures.items()
    ]
    columns = ["backend", "sessions", "open", "close", "memory"]
    report.tables.append(
        Table(title="per session, through the registry", columns=columns, rows=rows)
    )
    low, high = counts[0], counts[-1]
    for backend in BACKENDS:
        a, b = figures[backend, low], figures[backend, high]
        for what in ("open", "close"):
            report.ratios.append(
                ratio(
                    f"{backend}: registry {what} per session @{high:,} / @{low:,} sessions",
                    b[what] / a[what],
                    "<=",
                    1.5,
                    note=f"{b[what] * 1e6:.0f} µs vs {a[what] * 1e6:.0f} µs",
                )
            )


if __name__ == "__main__" and sys.argv[1] == "registry":  # registry_main's child
    _raise_fd_limit(int(sys.argv[3]))
    print(json.dumps(anyio.run(_registry_run, int(sys.argv[3]), backend=sys.argv[2])))
elif __name__ == "__main__":  # one (backend, sessions, turns) for main(): JSON on stdout
    backend, n, turns = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    _raise_fd_limit(n)
    kind = sys.argv[4] if len(sys.argv) > 4 else "file"
    print(json.dumps(anyio.run(_run, n, turns, kind, backend=backend)))
