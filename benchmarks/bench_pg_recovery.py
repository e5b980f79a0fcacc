"""PostgreSQL recovery figures: what an outage costs, and a large journal compaction.

    python -m benchmarks.bench_pg_recovery outage [--outage 10] [--kill-after 0.5]
    python -m benchmarks.bench_pg_recovery compaction [--mib 200]

* **outage**: a writer with the default timings checkpoints a session that
  changes every 50 ms.  The server is stopped for ``--outage`` seconds and
  started again; ``--kill-after`` seconds after it accepts connections the
  writer's process is SIGKILLed.  Printed: the age of the newest change
  that was stored (what the kill lost).  Without probing the writer may
  still sit in its retry backoff (up to 30 s); with it, it retries within a
  second of the server's return, so the loss is about ``max_wait``.
* **compaction**: one ``PostgresJournalStore`` compaction of a session of
  ``--mib`` MiB (~1 KiB messages of varied words), the default timeouts,
  twice (the second over the first); and a ``PostgresStore`` write of the
  same state.

``--code DIR`` runs another copy of the library (e.g. an older commit from
``git archive``) for a before/after figure.  The server is a private
throwaway cluster (``tests/pg.py``), fsync off: these figures are about
timeouts and retries, not disks.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from typing import Any

import msgspec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CHILD = """
    import os, sys, time, anyio
    import checkpointer
    print(checkpointer.__file__, file=sys.stderr, flush=True)
    from checkpointer import CheckpointWriter, PostgresStore, Snapshot

    async def main():
        state = {"n": 0, "t": time.time()}
        store = PostgresStore(os.environ["DSN"], schema=sys.argv[1])
        async with CheckpointWriter(lambda: Snapshot("s", dict(state)), store) as writer:
            print("ready", flush=True)
            while True:
                await anyio.sleep(0.05)
                state["n"] += 1
                state["t"] = time.time()
                writer.notify()

    anyio.run(main)
"""

_COMPACTION = """
    import inspect, os, sys, time
    import checkpointer  # from --code: before this checkout's directory joins the path

    print(checkpointer.__file__, flush=True)

    sys.path.append(os.environ["BENCH_ROOT"])
    from datetime import UTC, datetime
    from benchmarks.bench_postgres import _session
    from checkpointer import Meta, PostgresJournalStore, PostgresStore, Transcript
    try:
        from checkpointer._stores.envelopes import state_store
    except ImportError:  # a copy from before the package layout (--code)
        from checkpointer._codec import state_store

    mib, schema = int(sys.argv[1]), sys.argv[2]
    state = _session(mib << 20)
    now = datetime.now(UTC)
    for name, store in (
        ("PostgresJournalStore compaction", PostgresJournalStore(os.environ["DSN"], schema=schema)),
        ("PostgresStore write", PostgresStore(os.environ["DSN"], schema=schema,
                                              transcript=Transcript())),
    ):
        states = state_store(store)
        # A copy from before revisions (--code) commits without one.
        fenced = "expected" in inspect.signature(states.commit).parameters
        for seq in (1, 2):
            key = name.split()[0]
            staged = states.stage(key, state)
            revision = {"revision": f"r{seq}"} if fenced else {}
            expected = {"expected": None if seq == 1 else "r1"} if fenced else {}
            meta = Meta(key=key, seq=seq, created_at=now, updated_at=now, live=True, **revision)
            t0 = time.perf_counter()
            try:
                n = states.commit(key, meta, staged, **expected)
                print(f"{mib} MiB {name} #{seq}: {time.perf_counter() - t0:.2f} s "
                      f"({n / 2**20:.0f} MiB sent)", flush=True)
            except Exception as exc:
                print(f"{mib} MiB {name} #{seq}: FAILED after {time.perf_counter() - t0:.2f} s: "
                      f"{exc}", flush=True)
            if hasattr(store, "_tracks"):
                store._tracks.clear()  # the next commit is a compaction again
        store.close()
"""


def _cluster() -> Any:
    sys.path.insert(0, ROOT)
    from tests.pg import Cluster, find_binaries

    bindir = find_binaries()
    if bindir is None:
        raise SystemExit("no PostgreSQL server binaries found")
    cluster = Cluster(bindir, fsync=False)
    cluster.start()
    return cluster


def _env(code: str, dsn: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": code, "DSN": dsn, "BENCH_ROOT": ROOT}


def outage(code: str, seconds: float, kill_after: float, runs: int) -> None:
    """Print what a kill shortly after an outage of ``seconds`` lost, ``runs`` times."""
    cluster = _cluster()
    try:
        for run in range(runs):
            schema = "o_" + uuid.uuid4().hex[:8]
            child = subprocess.Popen(
                [sys.executable, "-c", textwrap.dedent(_CHILD), schema],
                stdout=subprocess.PIPE,
                text=True,
                env=_env(code, cluster.dsn()),
                cwd=os.path.dirname(ROOT),  # not this checkout: --code decides what is imported
            )
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready"
            time.sleep(3.0)
            cluster.stop()
            time.sleep(seconds)
            cluster.start()  # returns once the server accepts connections
            time.sleep(kill_after)
            child.send_signal(signal.SIGKILL)
            killed = time.time()
            child.wait()
            import psycopg

            with psycopg.connect(cluster.dsn()) as conn:
                row = conn.execute(f'SELECT state FROM "{schema}".checkpoints').fetchone()
            assert row is not None
            saved = msgspec.json.decode(bytes(row[0]))
            print(
                f"run {run + 1}: outage {seconds:g} s, killed {kill_after:g} s after recovery: "
                f"lost {killed - saved['t']:.1f} s of changes",
                flush=True,
            )
    finally:
        cluster.destroy()


def compaction(code: str, mib: int) -> None:
    """Print the time of a ``mib`` MiB journal compaction and snapshot write."""
    cluster = _cluster()
    try:
        subprocess.run(
            [
                sys.executable,
                "-c",
                textwrap.dedent(_COMPACTION),
                str(mib),
                f"c_{uuid.uuid4().hex[:8]}",
            ],
            env=_env(code, cluster.dsn()),
            cwd=os.path.dirname(ROOT),
            check=False,
        )
    finally:
        cluster.destroy()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_pg_recovery")
    parser.add_argument("--code", default=ROOT, help="the library copy to run (%(default)s)")
    commands = parser.add_subparsers(dest="command", required=True)
    o = commands.add_parser("outage", help="changes lost by a kill shortly after an outage")
    o.add_argument("--outage", type=float, default=10.0, help="seconds the server is down")
    o.add_argument("--kill-after", type=float, default=0.5, help="seconds after it is back")
    o.add_argument("--runs", type=int, default=3)
    c = commands.add_parser("compaction", help="one large journal compaction")
    c.add_argument("--mib", type=int, default=200)
    args = parser.parse_args()
    if args.command == "outage":
        outage(args.code, args.outage, args.kill_after, args.runs)
    else:
        compaction(args.code, args.mib)
