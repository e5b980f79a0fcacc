"""PostgresStore next to FileStore: checkpoint latency, loop stall, fleet throughput.

    python -m benchmarks.bench_postgres [--quick]

Three measurements, each on both stores in the same run, reported as ratios
PostgresStore / FileStore:

* **latency**: ``await writer.write_now(force=True)`` of a session of the
  given size, on asyncio: snapshot, encode, the store's durable write, back
  on the loop.  FileStore fsyncs a file and its directory; PostgresStore
  commits one upsert, which waits for the server's WAL fsync.
* **loop stall**: the worst lateness of a 1 ms ticker task during each write
  (what a heartbeat of the agent would feel).
* **sessions/s**: N worker processes, each with its own store, checkpoint
  their own sessions (4 KiB each) as fast as they can for a few seconds; the
  total of durable checkpoints per second.

The server is ``$CHECKPOINTER_BENCH_DSN`` when set (point it at the server
you deploy on), else a private throwaway cluster started here (``tests/pg.py``,
fsync on, on the same disk as the FileStore directory, over loopback TCP).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import multiprocessing.synchronize
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import anyio

from checkpointer import CheckpointWriter, FileStore, PostgresStore, Snapshot, Store
from checkpointer._format import Meta, envelope_chunks

__all__ = ["main"]

KiB = 1024
MiB = 1024 * KiB


def _quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _stat(samples: list[float], unit: str = "s") -> dict[str, Any]:
    return {
        "median": statistics.median(samples),
        "p10": _quantile(samples, 0.1),
        "p90": _quantile(samples, 0.9),
        "unit": unit,
        "samples": samples,
    }


def _ratio(name: str, value: float, note: str = "") -> dict[str, Any]:
    return {"name": name, "value": value, "op": "", "bar": None, "ok": None, "note": note}


def _session(nbytes: int) -> dict[str, Any]:
    """A transcript of about ``nbytes`` of JSON: ~1 KiB messages."""
    count = max(1, nbytes // KiB)
    body = "x" * (KiB - 60)
    return {"messages": [{"role": "tool", "content": body, "n": i} for i in range(count)]}


@contextlib.contextmanager
def _server() -> Iterator[tuple[str, str]]:
    """A DSN to measure against, and what it is."""
    dsn = os.environ.get("CHECKPOINTER_BENCH_DSN")
    if dsn is not None:
        yield dsn, "the server of $CHECKPOINTER_BENCH_DSN"
        return
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests.pg import Cluster, find_binaries

    bindir = find_binaries()
    if bindir is None:
        raise SystemExit(
            "no PostgreSQL server binaries found: install PostgreSQL or set CHECKPOINTER_BENCH_DSN"
        )
    cluster = Cluster(bindir, fsync=True)
    try:
        cluster.start()
        yield cluster.dsn(), "a private PostgreSQL cluster on loopback TCP, fsync on"
    finally:
        cluster.destroy()


# -- latency and loop stall ---------------------------------------------------


async def _measure_writes(
    store: Store, key: str, state: dict[str, Any], repeats: int
) -> tuple[list[float], list[float]]:
    latencies: list[float] = []
    stalls: list[float] = []
    lags: list[float] = []
    period = 0.001

    async def tick() -> None:
        while True:
            t0 = time.perf_counter()
            await anyio.sleep(period)
            lags.append(time.perf_counter() - t0 - period)

    writer = CheckpointWriter(lambda: Snapshot(key, state), store, exit_hooks=False)
    async with anyio.create_task_group() as tg, writer:
        tg.start_soon(tick)
        await anyio.sleep(0.01)
        for n in range(repeats + 3):  # three warm-up writes
            await anyio.sleep(0.003)  # the ticker settles between writes
            mark = len(lags)
            t0 = time.perf_counter()
            result = await writer.write_now(force=True)
            elapsed = time.perf_counter() - t0
            await anyio.sleep(0.002)  # the tick that was due during the write lands
            if type(result).__name__ != "Written":
                raise RuntimeError(f"write failed: {result}")
            if n >= 3:
                latencies.append(elapsed)
                stalls.append(max(lags[mark:], default=0.0))
        tg.cancel_scope.cancel()
    return latencies, stalls


def _latency(dsn: str, sizes: list[int], repeats: int) -> tuple[list[list[Any]], dict[int, Any]]:
    rows: list[list[Any]] = []
    ratios: dict[int, Any] = {}
    root = tempfile.mkdtemp(prefix="bench-pg-files-")
    schema = "bench_" + uuid.uuid4().hex[:8]
    pg = PostgresStore(dsn, schema=schema)
    try:
        for size in sizes:
            state = _session(size)
            figures = {}
            for name, store in (("FileStore", FileStore(root)), ("PostgresStore", pg)):
                lat, stall = anyio.run(_measure_writes, store, f"s{size}", state, repeats)
                figures[name] = (lat, stall)
                rows.append([name, _label(size), _stat(lat), _stat(stall)])
            (f_lat, f_stall), (p_lat, p_stall) = figures["FileStore"], figures["PostgresStore"]
            ratios[size] = (
                statistics.median(p_lat) / statistics.median(f_lat),
                _quantile(p_stall, 0.9) / max(_quantile(f_stall, 0.9), 1e-9),
            )
    finally:
        pg.close()
        _drop_schema(dsn, schema)
        shutil.rmtree(root, ignore_errors=True)
    return rows, ratios


def _drop_schema(dsn: str, schema: str) -> None:
    import psycopg

    with contextlib.suppress(psycopg.Error), psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'.encode())


def _label(size: int) -> str:
    return f"{size // MiB} MiB" if size >= MiB else f"{size // KiB} KiB"


# -- sessions per second, N processes -----------------------------------------


def _worker(
    kind: str,
    target: str,
    schema: str,
    wid: str,
    seconds: float,
    ready: multiprocessing.synchronize.Barrier,
    out: Any,
) -> None:
    store: Store = FileStore(target) if kind == "file" else PostgresStore(target, schema=schema)
    store.open()
    state = b'{"messages":[' + b",".join([b'"' + b"x" * 1000 + b'"'] * 4) + b"]}"
    now = datetime.now(UTC)
    seqs: dict[str, int] = {}
    keys = [f"w{wid}-s{i}" for i in range(8)]
    count = 0
    ready.wait()
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        key = keys[count % len(keys)]
        seq = seqs[key] = seqs.get(key, 0) + 1
        meta = Meta(key=key, seq=seq, created_at=now, updated_at=now, live=True)
        store.write(key, envelope_chunks(meta, state))
        count += 1
    out.put(count)
    if isinstance(store, PostgresStore):
        store.close()


def _throughput(kind: str, target: str, schema: str, workers: int, seconds: float) -> float:
    ctx = multiprocessing.get_context("fork")  # workers inherit the imports: quick to start
    ready = ctx.Barrier(workers + 1)
    out = ctx.Queue()
    run = uuid.uuid4().hex[:6]
    procs = [
        ctx.Process(target=_worker, args=(kind, target, schema, f"{run}-{w}", seconds, ready, out))
        for w in range(workers)
    ]
    with warnings.catch_warnings():
        # Python 3.12+ warns about fork in a process with threads (anyio's idle
        # workers here); the children only write with stores of their own.
        warnings.simplefilter("ignore", DeprecationWarning)
        for p in procs:
            p.start()
    ready.wait(timeout=60)
    t0 = time.perf_counter()
    total = sum(int(out.get(timeout=60 + seconds)) for _ in procs)
    elapsed = max(time.perf_counter() - t0, seconds)
    for p in procs:
        p.join(timeout=30)
    return total / elapsed


def _fleet(dsn: str, counts: list[int], seconds: float) -> tuple[list[list[Any]], dict[int, float]]:
    rows: list[list[Any]] = []
    ratios: dict[int, float] = {}
    schema = "bench_" + uuid.uuid4().hex[:8]
    with PostgresStore(dsn, schema=schema) as setup:
        setup.open()  # the schema, before the workers race for it
    root = tempfile.mkdtemp(prefix="bench-pg-fleet-")
    try:
        for n in counts:
            file_rate = _throughput("file", root, schema, n, seconds)
            pg_rate = _throughput("postgres", dsn, schema, n, seconds)
            rows.append([n, round(file_rate), round(pg_rate), pg_rate / file_rate])
            ratios[n] = pg_rate / file_rate
    finally:
        shutil.rmtree(root, ignore_errors=True)
        _drop_schema(dsn, schema)
    return rows, ratios


# -- the case ---------------------------------------------------------------------


def main(quick: bool = False) -> dict[str, Any]:
    """Measure both stores; return the report (tables, ratios, notes)."""
    sizes = [KiB, 256 * KiB] if quick else [KiB, 256 * KiB, 4 * MiB]
    repeats = 8 if quick else 40
    counts = [1, 2] if quick else [1, 2, 4, 8]
    seconds = 0.3 if quick else 3.0
    with _server() as (dsn, server):
        lat_rows, lat_ratios = _latency(dsn, sizes, repeats)
        fleet_rows, fleet_ratios = _fleet(dsn, counts, seconds)
    ratios = []
    for size, (lat, stall) in lat_ratios.items():
        ratios.append(_ratio(f"latency postgres/file ({_label(size)})", lat, "median"))
        ratios.append(_ratio(f"loop stall postgres/file ({_label(size)})", stall, "p90"))
    for n, value in fleet_ratios.items():
        ratios.append(_ratio(f"sessions/s postgres/file ({n} workers)", value))
    return {
        "title": "PostgresStore next to FileStore",
        "tables": [
            {
                "title": "checkpoint latency and loop stall (write_now, asyncio)",
                "columns": ["store", "session", "latency", "loop stall"],
                "rows": lat_rows,
            },
            {
                "title": f"sessions checkpointed per second, 4 KiB each, {seconds:g} s per run",
                "columns": ["worker processes", "FileStore", "PostgresStore", "ratio"],
                "rows": fleet_rows,
            },
        ],
        "ratios": ratios,
        "notes": [
            f"server: {server}; FileStore in {tempfile.gettempdir()}",
            f"{os.cpu_count()} CPUs; ratios are PostgresStore / FileStore in this run",
        ],
    }


def _cell(value: Any) -> str:
    if isinstance(value, dict) and "median" in value:
        scale, unit = (1e3, "ms") if value["unit"] == "s" else (1.0, value["unit"])
        return (
            f"{value['median'] * scale:.3f} {unit} "
            f"[{value['p10'] * scale:.3f}-{value['p90'] * scale:.3f}]"
        )
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def _print(report: dict[str, Any], write: Callable[[str], object] = print) -> None:
    write(f"== {report['title']}")
    for table in report["tables"]:
        write(f"\n{table['title']}")
        cells = [table["columns"], *[[_cell(c) for c in row] for row in table["rows"]]]
        widths = [max(len(str(row[i])) for row in cells) for i in range(len(cells[0]))]
        for row in cells:
            write("  " + "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
    write("")
    for r in report["ratios"]:
        write(f"ratio bench_postgres: {r['name']} = {r['value']:.2f}x ({r['note'] or 'rate'})")
    for note in report["notes"]:
        write(f"note: {note}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_postgres")
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repeats")
    _print(main(quick=parser.parse_args().quick))
