"""PostgresStore next to FileStore: latency, loop stall, journal growth, fleet throughput.

    python -m benchmarks.bench_postgres [--quick]

Three measurements, each on both stores in the same run, reported as ratios
PostgresStore / FileStore:

* **latency**: ``await writer.write_now(force=True)`` of a session of the
  given size, on asyncio: snapshot, encode, the store's durable write, back
  on the loop.  FileStore fsyncs a file and its directory; PostgresStore
  commits one upsert, which waits for the server's WAL flush.
* **loop stall**: the worst lateness of a 1 ms ticker task during each write
  (what a heartbeat of the agent would feel).
* **journal growth**: one message added to a session of 100 vs 10,000
  (``--quick``) or 100,000 messages: ``PostgresJournalStore`` inserts one
  row, ``PostgresStore`` (with a ``Transcript`` cache) upserts the whole
  state.  Ratios: each store's latency at the long session over the short
  one, and journal / snapshot at the long one; rows inserted per checkpoint.
* **sessions/s**: N worker processes, each with its own store, checkpoint
  their own sessions (4 KiB each) as fast as they can; the total of durable
  checkpoints per second.  The same for LangGraph's ``AsyncPostgresSaver``
  (``langgraph-checkpoint-postgres``, extra ``bench``) on the same server:
  each worker ``aput``s the same 4 KiB session as a checkpoint, on asyncio.
  Bar: PostgresStore at least 1x LangGraph's saver.
* **against LangGraph at 1,000 messages**: one message added to a session
  of 1,000, checkpointed: ``PostgresJournalStore`` (``write_now``, asyncio)
  and ``AsyncPostgresSaver`` (``aput`` of the whole transcript as a new
  channel version, which is what a ``StateGraph`` with ``add_messages``
  stores), on one loop with a 1 ms ticker.  Bytes per checkpoint are the
  WAL the server wrote for it (``pg_current_wal_lsn()`` before and after:
  rows, indexes, TOAST, everything made durable); the stall is the worst
  ticker lag during a checkpoint.  Bar: the journal's bytes at most 1/10.

The server is ``$CHECKPOINTER_BENCH_DSN`` when set (point it at the server
you deploy on), else a private throwaway cluster started here (``tests/pg.py``,
fsync on) whose data directory sits next to the FileStore directory, on the
disk under test (``benchmarks._harness.scratch_dir``), reached over loopback
TCP.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import multiprocessing.synchronize
import os
import random
import statistics
import sys
import time
import uuid
import warnings
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import anyio
import msgspec

from checkpointer import (
    CheckpointWriter,
    FileStore,
    PostgresJournalStore,
    PostgresStore,
    Snapshot,
    Transcript,
    Written,
)
from checkpointer._format.envelope import envelope_chunks
from checkpointer._values import Meta
from checkpointer.stores import Store

from ._harness import Report, Table, ratio, scratch_dir, stat

__all__ = ["main"]

KiB = 1024
MiB = 1024 * KiB
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


_WORDS = ["the", "of", "and", "to", "is", "for", "search", "result", "tool", "file", "error"]


def _session(nbytes: int) -> dict[str, Any]:
    """A transcript of about ``nbytes`` of JSON: ~1 KiB messages of varied words.

    Text, not one repeated byte: the server compresses large states, and how
    well and how fast depends on the content (a file store does not care).
    """
    rng = random.Random(nbytes)
    messages = []
    for i in range(max(1, nbytes // KiB)):
        content = " ".join(rng.choice(_WORDS) for _ in range(170))
        messages.append({"role": "tool", "content": content[: KiB - 60], "n": i})
    return {"messages": messages}


def _label(size: int) -> str:
    return f"{size // MiB} MiB" if size >= MiB else f"{size // KiB} KiB"


@contextlib.contextmanager
def _server(scratch: str) -> Iterator[tuple[str, str]]:
    """A DSN to measure against, and what it is."""
    dsn = os.environ.get("CHECKPOINTER_BENCH_DSN")
    if dsn is not None:
        yield dsn, "the server of $CHECKPOINTER_BENCH_DSN"
        return
    sys.path.insert(0, ROOT)
    from tests.pg import Cluster, find_binaries

    bindir = find_binaries()
    if bindir is None:
        raise SystemExit(
            "no PostgreSQL server binaries found: install PostgreSQL or set CHECKPOINTER_BENCH_DSN"
        )
    os.chmod(scratch, 0o711)  # the server runs as another user; it must reach its directory
    cluster = Cluster(bindir, fsync=True, parent=scratch)
    try:
        cluster.start()
        yield cluster.dsn(), "a private PostgreSQL cluster, fsync on, loopback TCP, same disk"
    finally:
        cluster.destroy()


def _drop_schema(dsn: str, schema: str) -> None:
    import psycopg

    with contextlib.suppress(psycopg.Error), psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'.encode())


def _langgraph_missing() -> str | None:
    """Why LangGraph's PostgreSQL saver cannot be measured here, or None."""
    try:
        import langgraph.checkpoint.postgres.aio  # noqa: F401
    except ImportError:
        return "langgraph-checkpoint-postgres is not installed (pip install -e '.[bench]')"
    return None


def _in_schema(dsn: str, schema: str) -> str:
    """``dsn`` with ``schema`` first on its search path (LangGraph's tables have no schema)."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'.encode())
    return make_conninfo(dsn, options=f"-csearch_path={schema}")


async def _langgraph_setup(dsn: str) -> None:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    async with AsyncPostgresSaver.from_conn_string(dsn) as saver:
        await saver.setup()


def _lg_config(thread: str, checkpoint_id: str | None = None) -> Any:
    configurable = {"thread_id": thread, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def _wal_lsn(dsn: str) -> int:
    """The server's current WAL position, in bytes."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(b"SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')").fetchone()
    assert row is not None
    return int(row[0])


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
            if not isinstance(result, Written):
                raise RuntimeError(f"write failed: {result}")
            if n >= 3:
                latencies.append(elapsed)
                stalls.append(max(lags[mark:], default=0.0))
        tg.cancel_scope.cancel()
    return latencies, stalls


def _latency(dsn: str, root: str, sizes: list[int], repeats: int, report: Report) -> None:
    table = Table(
        title="checkpoint latency and loop stall (write_now, asyncio)",
        columns=["store", "session", "latency", "loop stall (worst tick lag)"],
        rows=[],
    )
    schema = "bench_" + uuid.uuid4().hex[:8]
    pg = PostgresStore(dsn, schema=schema)
    try:
        for size in sizes:
            state = _session(size)
            figures: dict[str, tuple[list[float], list[float]]] = {}
            for name, store in (("FileStore", FileStore(root)), ("PostgresStore", pg)):
                figures[name] = anyio.run(_measure_writes, store, f"s{size}", state, repeats)
                lat, stall = figures[name]
                table.rows.append([name, _label(size), stat(lat), stat(stall)])
            (f_lat, f_stall), (p_lat, p_stall) = figures["FileStore"], figures["PostgresStore"]
            report.ratios.append(
                ratio(
                    f"{_label(size)}: latency PostgresStore / FileStore",
                    statistics.median(p_lat) / statistics.median(f_lat),
                    note="medians",
                )
            )
            report.ratios.append(
                ratio(
                    f"{_label(size)}: loop stall PostgresStore / FileStore",
                    stat(p_stall).p90 / max(stat(f_stall).p90, 1e-6),
                    note="p90 of the worst tick lag per write",
                )
            )
    finally:
        pg.close()
        _drop_schema(dsn, schema)
    report.tables.append(table)


# -- journal growth: one message added at 100 vs N messages --------------------


class Message(msgspec.Struct, frozen=True):
    """A settled chat message (frozen, strings only): its bytes are cached."""

    role: str
    content: str


def _journal_rows(dsn: str, schema: str) -> int:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(f'SELECT count(*) FROM "{schema}".journal'.encode()).fetchone()
    return 0 if row is None else int(row[0])


async def _add_one(store: Store, key: str, length: int, repeats: int) -> list[float]:
    """Latency of ``write_now`` after adding one message to ``length`` messages."""
    rng = random.Random(length)
    messages = [
        Message("user", " ".join(rng.choice(_WORDS) for _ in range(30))) for _ in range(length)
    ]
    state = {"title": "growth", "messages": messages}
    latencies: list[float] = []
    async with CheckpointWriter(
        lambda: Snapshot(key, state),
        store,
        transcript=Transcript(repair=False, fingerprint=False),  # the message cache
        exit_hooks=False,
    ) as w:
        for n in range(repeats + 2):  # two warm-up writes
            messages.append(Message("assistant", f"reply {n}"))
            t0 = time.perf_counter()
            result = await w.write_now()
            elapsed = time.perf_counter() - t0
            if not isinstance(result, Written):
                raise RuntimeError(f"write failed: {result}")
            if n >= 2:
                latencies.append(elapsed)
    return latencies


def _growth(dsn: str, lengths: list[int], repeats: int, report: Report) -> None:
    table = Table(
        title="one message added: PostgresJournalStore (rows) vs PostgresStore (snapshot row)",
        columns=["store", "messages", "latency", "journal rows inserted per checkpoint"],
        rows=[],
    )
    schema = "bench_" + uuid.uuid4().hex[:8]
    journal = PostgresJournalStore(dsn, schema=schema)
    snapshot = PostgresStore(dsn, schema=schema)
    medians: dict[tuple[str, int], float] = {}
    try:
        journal.open()  # the schema, before counting its rows
        for length in lengths:
            for name, store in (("journal", journal), ("snapshot", snapshot)):
                before = _journal_rows(dsn, schema) if name == "journal" else 0
                lat = anyio.run(_add_one, store, f"{name}{length}", length, repeats)
                added = _journal_rows(dsn, schema) - before if name == "journal" else 0
                per = (added - 1) / (repeats + 2) if name == "journal" else 0.0
                medians[name, length] = statistics.median(lat)
                rows = f"{per:.2f} (+1 compaction at open)" if name == "journal" else "0 (1 upsert)"
                table.rows.append([name, f"{length:,}", stat(lat), rows])
        short, long = lengths[0], lengths[-1]
        for name in ("journal", "snapshot"):
            report.ratios.append(
                ratio(
                    f"{name}: one-message checkpoint at {long:,} / at {short:,} messages",
                    medians[name, long] / medians[name, short],
                    note="medians",
                )
            )
        report.ratios.append(
            ratio(
                f"{long:,} messages: one-message checkpoint journal / snapshot",
                medians["journal", long] / medians["snapshot", long],
                note="medians",
            )
        )
    finally:
        journal.close()
        snapshot.close()
        _drop_schema(dsn, schema)
    report.tables.append(table)


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
    from checkpointer._stores.base import new_revision  # not at the top: bench_pg_recovery --code

    keys = [f"w{wid}-s{i}" for i in range(8)]
    if kind == "langgraph":
        out.put(anyio.run(_langgraph_worker, target, keys, seconds, ready))
        return
    store: Store = FileStore(target) if kind == "file" else PostgresStore(target, schema=schema)
    store.open()
    state = b'{"messages":[' + b",".join([b'"' + b"x" * 1000 + b'"'] * 4) + b"]}"
    now = datetime.now(UTC)
    count = 0
    stored: dict[str, str | None] = dict.fromkeys(keys)  # the revision each key holds
    ready.wait()
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        key = keys[count % len(keys)]
        revision = new_revision()
        meta = Meta(
            key=key, seq=count + 1, created_at=now, updated_at=now, live=True, revision=revision
        )
        store.write(key, envelope_chunks(meta, state), revision=revision, expected=stored[key])
        stored[key] = revision
        count += 1
    out.put(count)
    if isinstance(store, PostgresStore):
        store.close()


async def _langgraph_worker(
    dsn: str, keys: list[str], seconds: float, ready: multiprocessing.synchronize.Barrier
) -> int:
    """The fleet worker on LangGraph's saver: the same sessions, ``aput`` as fast as it can."""
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    messages = ["x" * 1000] * 4  # the 4 KiB session the other workers write
    configs = {key: _lg_config(key) for key in keys}
    count = 0
    async with AsyncPostgresSaver.from_conn_string(dsn) as saver:
        ready.wait()
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            key = keys[count % len(keys)]
            checkpoint = empty_checkpoint()
            checkpoint["channel_values"] = {"messages": messages}
            checkpoint["channel_versions"] = {"messages": count + 1}
            configs[key] = await saver.aput(
                configs[key], checkpoint, {"source": "loop", "step": count}, {"messages": count + 1}
            )
            count += 1
    return count


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
        # workers here); the children only write, with stores of their own.
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


def _fleet(dsn: str, root: str, counts: list[int], seconds: float, report: Report) -> None:
    missing = _langgraph_missing()
    table = Table(
        title=f"sessions checkpointed per second: N processes, 4 KiB each, {seconds:g} s a run",
        columns=[
            "worker processes",
            "FileStore",
            "PostgresStore",
            "LangGraph AsyncPostgresSaver",
            "PostgresStore / FileStore",
            "PostgresStore / LangGraph",
        ],
        rows=[],
    )
    schema = "bench_" + uuid.uuid4().hex[:8]
    with PostgresStore(dsn, schema=schema) as setup:
        setup.open()  # the schema, before the workers race for it
    lg_dsn = ""
    if missing is None:
        lg_dsn = _in_schema(dsn, schema + "_lg")
        anyio.run(_langgraph_setup, lg_dsn)
    try:
        for n in counts:
            file_rate = _throughput("file", root, schema, n, seconds)
            pg_rate = _throughput("postgres", dsn, schema, n, seconds)
            lg_rate = _throughput("langgraph", lg_dsn, schema, n, seconds) if lg_dsn else None
            table.rows.append(
                [
                    n,
                    f"{file_rate:.0f}/s",
                    f"{pg_rate:.0f}/s",
                    "-" if lg_rate is None else f"{lg_rate:.0f}/s",
                    f"{pg_rate / file_rate:.2f}x",
                    "-" if lg_rate is None else f"{pg_rate / lg_rate:.2f}x",
                ]
            )
            report.ratios.append(
                ratio(f"{n} workers: sessions/s PostgresStore / FileStore", pg_rate / file_rate)
            )
            if lg_rate is not None:
                report.ratios.append(
                    ratio(
                        f"{n} workers: sessions/s PostgresStore / AsyncPostgresSaver",
                        pg_rate / lg_rate,
                        ">=",
                        1.0,
                        note=f"{pg_rate:.0f}/s vs {lg_rate:.0f}/s durable checkpoints",
                    )
                )
    finally:
        _drop_schema(dsn, schema)
        if lg_dsn:
            _drop_schema(dsn, schema + "_lg")
    if missing is not None:
        report.notes.append(f"LangGraph AsyncPostgresSaver not measured: {missing}")
    report.tables.append(table)


# -- against LangGraph's saver at 1,000 messages ----------------------------------


async def _ticked(
    checkpoint: Callable[[int], Awaitable[object]], repeats: int
) -> tuple[list[float], list[float]]:
    """Latency and worst ticker lag of ``checkpoint(n)`` for n in range(repeats), on one loop."""
    latencies: list[float] = []
    stalls: list[float] = []
    lags: list[float] = []
    period = 0.001

    async def tick() -> None:
        while True:
            t0 = time.perf_counter()
            await anyio.sleep(period)
            lags.append(time.perf_counter() - t0 - period)

    async with anyio.create_task_group() as tg:
        tg.start_soon(tick)
        await anyio.sleep(0.01)
        for n in range(repeats):
            await anyio.sleep(0.003)  # the ticker settles between checkpoints
            mark = len(lags)
            t0 = time.perf_counter()
            await checkpoint(n)
            latencies.append(time.perf_counter() - t0)
            await anyio.sleep(0.002)  # the tick that was due during it lands
            stalls.append(max(lags[mark:], default=0.0))
        tg.cancel_scope.cancel()
    return latencies, stalls


def _chat(length: int) -> list[Message]:
    rng = random.Random(length)
    return [Message("user", " ".join(rng.choice(_WORDS) for _ in range(30))) for _ in range(length)]


async def _ours_at(dsn: str, schema: str, length: int, repeats: int) -> tuple[Any, int]:
    key = f"chat{length}"
    state = {"messages": _chat(length)}
    store = PostgresJournalStore(dsn, schema=schema)
    try:
        async with CheckpointWriter(lambda: Snapshot(key, state), store, exit_hooks=False) as w:
            await w.write_now()  # the history, before the measured checkpoints

            async def one(n: int) -> None:
                state["messages"].append(Message("assistant", f"reply {n}"))
                result = await w.write_now()
                if not isinstance(result, Written):
                    raise RuntimeError(f"write failed: {result}")

            wal0 = _wal_lsn(dsn)
            figures = await _ticked(one, repeats)
            return figures, _wal_lsn(dsn) - wal0
    finally:
        store.close()


async def _langgraph_at(dsn: str, length: int, repeats: int) -> tuple[Any, int]:
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    messages = [{"role": m.role, "content": m.content} for m in _chat(length)]
    config = _lg_config(f"chat{length}")
    async with AsyncPostgresSaver.from_conn_string(dsn) as saver:
        step = 0

        async def put() -> None:
            nonlocal config, step
            step += 1
            checkpoint = empty_checkpoint()
            checkpoint["channel_values"] = {"messages": list(messages)}
            checkpoint["channel_versions"] = {"messages": step}
            config = await saver.aput(
                config, checkpoint, {"source": "loop", "step": step}, {"messages": step}
            )

        await put()  # the history

        async def one(n: int) -> None:
            messages.append({"role": "assistant", "content": f"reply {n}"})
            await put()

        wal0 = _wal_lsn(dsn)
        figures = await _ticked(one, repeats)
        return figures, _wal_lsn(dsn) - wal0


def _against_langgraph(dsn: str, length: int, repeats: int, report: Report) -> None:
    missing = _langgraph_missing()
    if missing is not None:
        report.notes.append(f"LangGraph AsyncPostgresSaver not measured: {missing}")
        return
    table = Table(
        title=f"one message added to {length:,} messages, checkpointed (asyncio, 1 ms ticker)",
        columns=["saver", "latency", "loop stall (worst tick lag)", "WAL bytes per checkpoint"],
        rows=[],
    )
    schema = "bench_" + uuid.uuid4().hex[:8]
    lg_dsn = _in_schema(dsn, schema + "_lg")
    try:
        anyio.run(_langgraph_setup, lg_dsn)
        (o_lat, o_stall), o_wal = anyio.run(_ours_at, dsn, schema, length, repeats)
        (l_lat, l_stall), l_wal = anyio.run(_langgraph_at, lg_dsn, length, repeats)
    finally:
        _drop_schema(dsn, schema)
        _drop_schema(dsn, schema + "_lg")
    ours, theirs = o_wal / repeats, l_wal / repeats
    table.rows.append(["PostgresJournalStore", stat(o_lat), stat(o_stall), stat([ours], "B")])
    table.rows.append(
        ["LangGraph AsyncPostgresSaver", stat(l_lat), stat(l_stall), stat([theirs], "B")]
    )
    report.tables.append(table)
    report.ratios.append(
        ratio(
            f"{length:,} messages: WAL bytes per checkpoint journal / AsyncPostgresSaver",
            ours / theirs,
            "<=",
            0.1,
            note=f"{ours / 1024:.1f} KiB vs {theirs / 1024:.1f} KiB",
        )
    )
    report.ratios.append(
        ratio(
            f"{length:,} messages: loop stall journal / AsyncPostgresSaver",
            stat(o_stall).p90 / max(stat(l_stall).p90, 1e-6),
            note=f"p90 of the worst tick lag per checkpoint: {stat(o_stall).p90 * 1e3:.2f} ms "
            f"vs {stat(l_stall).p90 * 1e3:.2f} ms",
        )
    )
    report.ratios.append(
        ratio(
            f"{length:,} messages: checkpoint latency journal / AsyncPostgresSaver",
            statistics.median(o_lat) / statistics.median(l_lat),
            note="medians",
        )
    )


# -- the case ---------------------------------------------------------------------


def main(quick: bool = False) -> dict[str, Any]:
    """Measure both stores on the same workloads; return the report."""
    sizes = [KiB, 256 * KiB] if quick else [KiB, 256 * KiB, 4 * MiB]
    repeats = 6 if quick else 40
    counts = [2] if quick else [1, 2, 4, 8]
    lengths = [100, 10_000] if quick else [100, 100_000]
    seconds = 0.3 if quick else 3.0
    report = Report(
        title="PostgresStore next to FileStore and LangGraph's AsyncPostgresSaver: latency, "
        "loop stall, journal growth, sessions/s"
    )
    if os.environ.get("CHECKPOINTER_BENCH_DSN") is None:
        sys.path.insert(0, ROOT)
        from tests.pg import find_binaries

        if find_binaries() is None:
            report.notes.append(
                "skipped: no PostgreSQL server binaries found (install PostgreSQL, or point "
                "$CHECKPOINTER_BENCH_DSN at a server)"
            )
            return msgspec.to_builtins(report)  # type: ignore[no-any-return]
    with scratch_dir("pg-") as scratch:
        root = os.path.join(scratch, "files")
        with _server(scratch) as (dsn, server):
            _latency(dsn, root, sizes, repeats, report)
            _growth(dsn, lengths, repeats, report)
            _fleet(dsn, os.path.join(root, "fleet"), counts, seconds, report)
            _against_langgraph(dsn, 1_000, repeats, report)
    report.notes.append(f"server: {server}")
    report.notes.append(f"{os.cpu_count()} CPUs; ratios are PostgresStore / FileStore in one run")
    return msgspec.to_builtins(report)  # type: ignore[no-any-return]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_postgres")
    parser.add_argument("--quick", action="store_true", help="fewer sizes, repeats and workers")
    quick = parser.parse_args().quick
    from .__main__ import render

    t0 = time.perf_counter()
    result = main(quick)
    print(f"== postgres: {result['title']} ({time.perf_counter() - t0:.1f} s)")
    for line in render("postgres", result):
        print(line)
