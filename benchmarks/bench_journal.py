"""Journal vs snapshot: what one checkpoint costs, and how long it stalls the loop.

Run from the repository root::

    python -m benchmarks.bench_journal            # about a minute
    python -m benchmarks.bench_journal --quick    # a few seconds: fewer repeats, 10 MB

Three figures, each against a baseline measured in the same run (shared
machines are noisy: trust the ratios, not the absolutes):

1. **Cost of one checkpoint that adds one message**, at 100 and at 100,000
   messages of history: ``JournalStore`` against itself (the growth ratio
   should stay within 2x) and against a full snapshot (``FileStore``, the
   state encoded whole on the loop).  The messages and the step are the
   growth case's (``bench_growth.text``: ~200 B frozen Structs of strings);
   this case adds the snapshot and dict rows beside them.  Wall time of
   ``await writer.write_now()``, fsync included; medians after a warm-up,
   the sessions interleaved so disk noise hits them alike.
2. **Worst event-loop stall** (the lateness of a 1 ms ticker task) while
   checkpointing a ~50 MB transcript (10 MB with ``--quick``), one message
   added each time: the naive snapshot (encode on the loop) against the
   snapshot with the message cache (``FileStore(root,
   transcript=Transcript())``) and the journal.  Median
   over checkpoints of each checkpoint's worst lateness, after a warm-up.
3. **Journal size after N checkpoints** (one message each, the agent
   compacting its history now and then): the largest ``size / threshold``
   seen after any checkpoint must stay <= 1.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import anyio
import msgspec

from checkpointer import CheckpointWriter, FileStore, JournalStore, Snapshot, Transcript, Written
from checkpointer.stores import Store

from ._harness import Report, Table, ratio, scratch_dir, stat
from .bench_growth import SIZE, Text, text

Message = Text  # the growth case's: one step, measured alike in both cases


def _message(i: int, size: int) -> Message:
    return text(i, size)


class _Session:
    def __init__(self, key: str, n: int, size: int, history: list[Message] | None = None) -> None:
        self.key = key
        self.size = size
        # Sessions may share their first n messages (frozen: nobody can change them).
        self.messages = history[:n] if history else [_message(i, size) for i in range(n)]
        self.state = {"title": key, "messages": self.messages}

    def snapshot(self) -> Snapshot:
        return Snapshot(self.key, self.state)

    def add(self) -> None:
        self.messages.append(_message(len(self.messages), self.size))


class _DictSession(_Session):
    """The same session, its messages plain dicts (as most agents keep them)."""

    def __init__(self, key: str, n: int, size: int, history: list[Message]) -> None:
        super().__init__(key, n, size, history)
        self.messages[:] = [{"role": m.role, "content": m.content} for m in self.messages]  # type: ignore[misc]

    def add(self) -> None:
        m = _message(len(self.messages), self.size)
        self.messages.append({"role": m.role, "content": m.content})  # type: ignore[arg-type]


def _writer(session: _Session, store: Store, *, cached: bool = False) -> CheckpointWriter[Snapshot]:
    """The writer of a case; ``cached``: messages encoded once each (a transcript, nothing else)."""
    transcript = Transcript(repair=False, fingerprint=False) if cached else None
    return CheckpointWriter(session.snapshot, store, transcript=transcript, exit_hooks=False)


async def _timed_write(writer: CheckpointWriter[Snapshot]) -> float:
    started = time.perf_counter()
    result = await writer.write_now()
    elapsed = time.perf_counter() - started
    if not isinstance(result, Written):
        raise RuntimeError(f"checkpoint did not write: {result!r}")
    return elapsed


# -- 1. cost of one checkpoint ------------------------------------------------


def append_cost(root: str, *, quick: bool) -> dict[str, Any]:
    """Median seconds of one checkpoint adding one message, per store and size."""
    journal_repeats = 11 if quick else 61
    snapshot_repeats = 2 if quick else 7
    plan: list[tuple[str, Callable[[str], Store], int, int]] = [
        ("journal", JournalStore, 100, journal_repeats),
        ("journal", JournalStore, 100_000, journal_repeats),
        ("snapshot", FileStore, 100, snapshot_repeats),
        ("snapshot", FileStore, 100_000, snapshot_repeats),
        ("cached", FileStore, 100_000, snapshot_repeats),
        ("dicts", JournalStore, 100_000, 3 if quick else 21),
    ]
    times: dict[str, list[float]] = {}
    history = [_message(i, SIZE) for i in range(max(n for _, _, n, _ in plan))]

    async def run() -> None:
        async with contextlib.AsyncExitStack() as stack:
            entries = []
            for kind, make, n, repeats in plan:
                name = f"{kind}_{n}"
                kind_of = _DictSession if kind == "dicts" else _Session
                session = kind_of(name, n, SIZE, history)
                store = make(os.path.join(root, kind))
                writer = await stack.enter_async_context(
                    _writer(session, store, cached=kind == "cached")
                )
                session.add()
                await _timed_write(writer)  # warm-up (the entry wrote the whole session)
                entries.append((name, session, writer, repeats))
                times[name] = []
            times["encode"] = []
            encoder = msgspec.json.Encoder()
            for round_ in range(max(r for *_, r in entries)):
                for name, session, writer, repeats in entries:
                    if round_ < repeats:
                        session.add()
                        times[name].append(await _timed_write(writer))
                        if name == "dicts_100000":  # the floor of its check: one encode
                            started = time.perf_counter()
                            encoder.encode(session.messages)
                            times["encode"].append(time.perf_counter() - started)

    anyio.run(run)
    med = {name: statistics.median(values) for name, values in times.items()}
    return {
        "samples": times,
        "journal_100_ms": med["journal_100"] * 1e3,
        "journal_100k_ms": med["journal_100000"] * 1e3,
        "journal_growth_x": med["journal_100000"] / med["journal_100"],
        "snapshot_100_ms": med["snapshot_100"] * 1e3,
        "snapshot_100k_ms": med["snapshot_100000"] * 1e3,
        "cached_snapshot_100k_ms": med["cached_100000"] * 1e3,
        "snapshot_over_journal_100k_x": med["snapshot_100000"] / med["journal_100000"],
        "dicts_100k_ms": med["dicts_100000"] * 1e3,
        "encode_dicts_100k_ms": med["encode"] * 1e3,
        "dicts_over_encode_100k_x": med["dicts_100000"] / med["encode"],
    }


# -- 2. worst loop stall -------------------------------------------------------


async def _worst_lateness(action: Callable[[], Awaitable[Any]]) -> float:
    """Run ``action`` (awaited) beside a 1 ms ticker; its worst lateness, seconds."""
    lateness: list[float] = []
    done = False

    async def ticker() -> None:
        while not done:
            started = time.perf_counter()
            await anyio.sleep(0.001)
            lateness.append(time.perf_counter() - started - 0.001)

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await anyio.sleep(0.005)
        await action()
        await anyio.sleep(0.002)
        done = True
    return max(lateness)


def loop_stall(root: str, *, quick: bool, megabytes: int | None = None) -> dict[str, Any]:
    """Median worst ticker lateness (seconds) per checkpoint of a large transcript.

    ``megabytes``: the transcript's size; 50, or 10 with ``quick``.
    """
    repeats = 3 if quick else 9
    megabytes = megabytes or (10 if quick else 50)
    size = 1024
    n = megabytes * 1_000_000 // (size + 40)
    modes: list[tuple[str, Callable[[str], Store]]] = [
        ("naive", FileStore),
        ("cached", FileStore),
        ("journal", JournalStore),
    ]
    session = _Session("big", n, size)
    worst: dict[str, list[float]] = {}

    async def run() -> None:
        worst["idle"] = [await _worst_lateness(lambda: anyio.sleep(0.05)) for _ in range(3)]
        for mode, make in modes:
            store = make(os.path.join(root, mode))
            async with _writer(session, store, cached=mode == "cached") as writer:
                session.add()
                await writer.write_now()  # warm-up: caches filled, journal compacted
                worst[mode] = []
                for _ in range(repeats):
                    session.add()
                    worst[mode].append(await _worst_lateness(partial(_timed_write, writer)))

    anyio.run(run)
    med = {mode: statistics.median(values) for mode, values in worst.items()}
    return {
        "samples": worst,
        "stall_transcript_mb": len(msgspec.json.encode(session.state)) / 1e6,
        "stall_idle_ms": med["idle"] * 1e3,
        "stall_naive_ms": med["naive"] * 1e3,
        "stall_cached_ms": med["cached"] * 1e3,
        "stall_journal_ms": med["journal"] * 1e3,
        "stall_cached_over_naive": med["cached"] / med["naive"],
        "stall_journal_over_naive": med["journal"] / med["naive"],
    }


# -- 3. journal growth ---------------------------------------------------------


def journal_growth(root: str, *, quick: bool) -> dict[str, float]:
    """Checkpoint N times; the journal must stay within its rewrite threshold."""
    # Quick: fewer checkpoints, and a lower floor so that they still rewrite.
    checkpoints, floor = (150, 48 * 1024) if quick else (2000, 64 * 1024)
    store = JournalStore(os.path.join(root, "growth"), rewrite_min_bytes=floor)
    session = _Session("growth", 50, 200)
    worst = 0.0
    written = 0

    async def run() -> None:
        nonlocal worst, written
        async with _writer(session, store) as writer:
            for i in range(checkpoints):
                session.add()
                if i % 100 == 99:  # the agent compacts: a summary and the last 20
                    session.messages[:-20] = [Message("system", f"summary up to {i}")]
                result = await writer.write_now()
                assert isinstance(result, Written), result
                written += result.nbytes
                stats = store.statistics(session.key)
                assert stats.size is not None
                assert stats.threshold is not None
                assert stats.size == os.stat(store.location(session.key)).st_size
                worst = max(worst, stats.size / stats.threshold)

    anyio.run(run)
    stats = store.statistics(session.key)
    assert stats.size is not None
    assert stats.threshold is not None
    return {
        "growth_checkpoints": checkpoints,
        "growth_final_kib": stats.size / 1024,
        "growth_threshold_kib": stats.threshold / 1024,
        "growth_worst_size_over_threshold": worst,
        "growth_appends": stats.appends,
        "growth_compactions": stats.compactions,
        "growth_rewrites": stats.rewrites,
        "growth_written_kib": written / 1024,
    }


# -- report --------------------------------------------------------------------


def main(quick: bool) -> dict[str, Any]:
    """Measure the three figures; a ``Report`` (see ``benchmarks/__init__.py``) as a dict.

    ``report["figures"]`` holds every figure flat (milliseconds, ratios).
    """
    report = Report(title="Journal vs snapshot: checkpoint cost, loop stall, journal size")
    figures: dict[str, float] = {}
    with scratch_dir("journal-") as root:
        cost = append_cost(root, quick=quick)
        stall = loop_stall(root, quick=quick)
        growth = journal_growth(root, quick=quick)
    for part in (cost, stall, growth):
        figures.update({k: v for k, v in part.items() if isinstance(v, float | int)})
    samples = cost["samples"]
    assert isinstance(samples, dict)
    report.tables.append(
        Table(
            title=f"write_now() after appending one message of ~{SIZE} B (fsync included; "
            "the growth case's step)",
            columns=["store", "messages", "checkpoint cost", "repeats"],
            rows=[
                [label, n, stat(samples[key]), len(samples[key])] for key, label, n in _COST_ROWS
            ],
        )
    )
    report.ratios += [
        ratio("JournalStore: cost @100,000 / @100 messages", figures["journal_growth_x"], "<=", 2),
        ratio(
            "@100,000 messages: cost FileStore snapshot / JournalStore",
            figures["snapshot_over_journal_100k_x"],
            ">=",
            50,
        ),
        ratio(
            "@100,000 dict messages: JournalStore checkpoint / one encode of the messages",
            figures["dicts_over_encode_100k_x"],
            note=f"{figures['dicts_100k_ms']:.1f} ms vs {figures['encode_dicts_100k_ms']:.1f} ms: "
            "a dict can be edited in place, so the journal encodes the history again to "
            "compare it with what it wrote; frozen Structs skip that",
        ),
    ]
    lateness = stall["samples"]
    assert isinstance(lateness, dict)
    mb = figures["stall_transcript_mb"]
    report.tables.append(
        Table(
            title=f"worst 1 ms ticker lag per checkpoint adding one message to {mb:.0f} MB",
            columns=["approach", "worst lag", "repeats"],
            rows=[[label, stat(lateness[key]), len(lateness[key])] for key, label in _STALL_ROWS],
        )
    )
    for key, label in _STALL_ROWS:
        if key != "idle":
            report.series[f"stall/+1 message to {mb:.0f} MB/{label}"] = [(mb, stat(lateness[key]))]
    report.ratios += [
        ratio(
            "worst stall: cached snapshot / naive", figures["stall_cached_over_naive"], "<=", 0.2
        ),
        ratio("worst stall: journal / naive", figures["stall_journal_over_naive"], "<=", 0.2),
        ratio(
            "journal size / rewrite threshold, worst after any checkpoint",
            figures["growth_worst_size_over_threshold"],
            "<=",
            1,
        ),
    ]
    report.tables.append(
        Table(
            title=f"a journal after {growth['growth_checkpoints']:.0f} checkpoints "
            "(+1 message each; the agent compacts every 100)",
            columns=["figure", "value"],
            rows=[
                [label, stat([growth[key] * 1024], "B", keep=False) if kib else int(growth[key])]
                for key, label, kib in _GROWTH_ROWS
            ],
        )
    )
    report.notes.append(
        "naive: FileStore(root), the state encoded whole on the loop; cached: "
        "FileStore(root), the writer given Transcript(repair=False, fingerprint=False) (the "
        "message cache alone); messages are frozen msgspec Structs"
    )
    result: dict[str, Any] = msgspec.to_builtins(report)
    result["figures"] = figures
    return result


_COST_ROWS = [
    ("journal_100", "JournalStore", 100),
    ("journal_100000", "JournalStore", 100_000),
    ("snapshot_100", "FileStore", 100),
    ("snapshot_100000", "FileStore", 100_000),
    ("cached_100000", "FileStore+Transcript", 100_000),
    ("dicts_100000", "JournalStore, dict messages", 100_000),
    ("encode", "(one msgspec encode of those 100,000 dicts)", 100_000),
]
_STALL_ROWS = [
    ("idle", "idle (no checkpoint)"),
    ("naive", "naive snapshot"),
    ("cached", "snapshot with cache"),
    ("journal", "journal"),
]
_GROWTH_ROWS = [
    ("growth_appends", "appends", False),
    ("growth_compactions", "compaction rows appended", False),
    ("growth_rewrites", "rewrites (creation included)", False),
    ("growth_final_kib", "final size", True),
    ("growth_threshold_kib", "its rewrite threshold", True),
    ("growth_written_kib", "bytes written in all", True),
]


if __name__ == "__main__":
    from .__main__ import render

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_journal", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="fewer repeats: well under a minute")
    quick = parser.parse_args().quick
    out = main(quick)
    print(f"== journal ({'quick' if quick else 'full'}): {out['title']}")
    print("\n".join(render("journal", out)))
