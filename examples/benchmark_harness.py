"""A benchmark harness that survives being killed.

It runs a list of cases, keeps every result in a checkpoint as it goes, and
when run again after a crash, Ctrl-C or ``kill -9``, it starts at the first
case not done: finished cases are never run twice.

    python examples/benchmark_harness.py                  # into ./.checkpoints
    python examples/benchmark_harness.py --delay 1        # slow cases: kill it, rerun

Each repetition of a case runs in a worker thread, so the event loop (and
the writer's timer) stays free; progress inside a case is a ``notify()``,
coalesced like any other event; a finished case is a ``write_now()``: a
result that took minutes to compute is worth an fsync before the next case.
Written with anyio, so it runs on asyncio (default) or trio (``--backend``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import anyio
import anyio.to_thread

from checkpointer import CheckpointWriter, FileStore, Snapshot, load


def _sorted(n: int) -> object:
    return sorted(random.Random(n).random() for _ in range(n))


def _json(n: int) -> object:
    return json.loads(json.dumps([{"i": i, "s": str(i)} for i in range(n)]))


def _sha256(n: int) -> object:
    return hashlib.sha256(b"x" * (n * 100)).hexdigest()


def _join(n: int) -> object:
    return "".join(str(i) for i in range(n))


CASES: dict[str, Callable[[int], object]] = {
    "sum-range": lambda n: sum(range(n * 10)),
    "sort-floats": _sorted,
    "json-roundtrip": _json,
    "sha256": _sha256,
    "str-join": _join,
    "dict-build": lambda n: {i: i * i for i in range(n)},
}


class Run:
    """The state of one benchmark run: the plan, the results, the case in progress."""

    def __init__(self, key: str, settings: dict[str, Any]) -> None:
        self.key = key
        self.settings = settings
        self.results: dict[str, dict[str, Any]] = {}
        self.current: dict[str, Any] | None = None

    def snapshot(self) -> Snapshot:
        state = {"settings": self.settings, "results": self.results, "current": self.current}
        return Snapshot(self.key, state)

    def first_not_done(self) -> str | None:
        return next((c for c in self.settings["cases"] if c not in self.results), None)


def timed(case: Callable[[int], object], size: int, delay: float) -> float:
    """One repetition, in a worker thread; ``delay`` stands for a slower case."""
    start = time.perf_counter()
    case(size)
    elapsed = time.perf_counter() - start
    time.sleep(delay)
    return elapsed


async def main(args: argparse.Namespace) -> int:
    store = FileStore(args.root)
    settings = {"cases": args.cases, "size": args.size, "repeat": args.repeat}
    run = Run(args.key, settings)
    previous = load(store, args.key)
    if previous is not None and previous.state["settings"] != settings:
        print(
            f"{store.location(args.key)} holds a run with other settings "
            f"({previous.state['settings']}); starting afresh (--key keeps both)"
        )
    elif previous is not None:
        run.results = previous.state["results"]
        first = run.first_not_done()
        print(
            f"resumed {args.key!r} from {store.location(args.key)}: "
            f"{len(run.results)} of {len(args.cases)} cases done; "
            + (f"starting at {first!r}" if first else "nothing left to run"),
            flush=True,
        )
        partial = previous.state["current"]
        if partial:  # timings of a half-run case are not comparable: run it whole
            print(f"{partial['case']!r} stopped after {len(partial['samples'])} runs; rerunning it")
    async with CheckpointWriter(
        run.snapshot,
        store,
        debounce=args.debounce,
        min_interval=args.min_interval,
        max_wait=args.max_wait,
        resume_from=previous,  # what load() found (None: a new session): never replace a newer one
    ) as writer:
        for number, name in enumerate(args.cases, 1):
            if name in run.results:
                continue
            run.current = {"case": name, "samples": []}
            for _ in range(args.repeat):
                sample = await anyio.to_thread.run_sync(timed, CASES[name], args.size, args.delay)
                run.current["samples"].append(sample)
                writer.notify()  # progress: coalesced with the writer's timers
            samples = run.current["samples"]
            run.results[name] = {
                "median_s": statistics.median(samples),
                "min_s": min(samples),
                "samples": samples,
                "finished_at": datetime.now(UTC).isoformat(),
            }
            run.current = None
            result = await writer.write_now()  # a finished case is on disk before the next
            print(
                f"case {number}/{len(args.cases)} {name}: median "
                f"{statistics.median(samples) * 1e3:.3f} ms of {len(samples)} runs "
                f"[saved: {type(result).__name__}]",
                flush=True,
            )
    print(f"{'case':<16} {'median ms':>10} {'min ms':>10}")
    for name in args.cases:
        r = run.results[name]
        print(f"{name:<16} {r['median_s'] * 1e3:>10.3f} {r['min_s'] * 1e3:>10.3f}")
    print(f"all {len(args.cases)} cases done; results in {store.location(args.key)}")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="A benchmark harness that resumes after a kill.")
    parser.add_argument("--root", default=".checkpoints", help="store directory (%(default)s)")
    parser.add_argument("--key", default="bench", help="run key (%(default)s)")
    parser.add_argument(
        "--cases",
        type=lambda s: s.split(","),
        default=list(CASES),
        help=f"comma-separated, from: {','.join(CASES)}",
    )
    parser.add_argument("--size", type=int, default=20_000, help="problem size (%(default)s)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per case (%(default)s)")
    parser.add_argument("--delay", type=float, default=0.0, help="extra seconds per run")
    parser.add_argument("--debounce", type=float, default=0.5, help="(%(default)s s)")
    parser.add_argument("--min-interval", type=float, default=1.0, help="(%(default)s s)")
    parser.add_argument("--max-wait", type=float, default=5.0, help="(%(default)s s)")
    parser.add_argument(
        "--backend", choices=["asyncio", "trio"], default="asyncio", help="(%(default)s)"
    )
    args = parser.parse_args(argv)
    unknown = [c for c in args.cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    return args


if __name__ == "__main__":
    arguments = parse_args()
    try:
        sys.exit(anyio.run(main, arguments, backend=arguments.backend))
    except KeyboardInterrupt:
        print("interrupted: finished cases are on disk; run again to resume", file=sys.stderr)
        sys.exit(130)
