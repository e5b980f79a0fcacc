"""Case 1, the hot path: ``notify()`` inside a burst against a no-op method call.

Both are called through a bound method of the same writer object, in
timeit-style loops of many calls, interleaved, repeated; the bar uses the
minimum of the repeats (timeit's advice: the least disturbed run), the table
also shows the median.  The writer holds a state of 10 and of 100,000
messages: ``notify`` must not look at the state, so its cost must not move.
"""

from __future__ import annotations

import contextlib
import math
import timeit
import types
from collections.abc import Callable
from typing import Any

import anyio
import msgspec

from checkpointer import CheckpointWriter, FileStore, Snapshot

from ._harness import Report, Table, ratio, scratch_dir, stat
from ._recipes import transcript

SIZES = (10, 100_000)


def _noop(self: object) -> None:
    return None


async def _measure(number: int, repeats: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {}
    with scratch_dir("hot-") as root:
        funcs: dict[str, Callable[[], object]] = {}
        stack = contextlib.AsyncExitStack()  # the writers' task groups nest: leave LIFO
        for size in SIZES:
            state = {"messages": transcript(size)}
            writer: CheckpointWriter[Snapshot] = CheckpointWriter(
                lambda state=state: Snapshot("hot", state),  # type: ignore[misc]
                FileStore(root),
                debounce=3600,
                min_interval=3600,
                max_wait=3600,  # no write while we measure
                write_on_start=False,
                exit_hooks=False,
            )
            await stack.enter_async_context(writer)
            writer.notify()  # the burst has begun: later calls are the common case
            funcs[f"notify @{size:,} msgs"] = writer.notify
            funcs[f"no-op @{size:,} msgs"] = types.MethodType(_noop, writer)
        async with stack:
            for name in funcs:
                samples[name] = []
            for f in funcs.values():  # warm-up
                timeit.Timer(f).timeit(number // 10 or 1)
            for _ in range(repeats):
                for name, f in funcs.items():
                    samples[name].append(timeit.Timer(f).timeit(number) / number)
    return samples


def main(quick: bool) -> dict[str, Any]:
    number = 20_000 if quick else 200_000
    repeats = 7 if quick else 31
    samples = anyio.run(_measure, number, repeats)
    stats = {name: stat(values) for name, values in samples.items()}
    table = Table(
        title=f"seconds per call, {repeats} repeats of {number:,} calls",
        columns=["call", "min", "median [p10-p90]"],
        rows=[[name, min(values), stats[name]] for name, values in samples.items()],
    )
    report = Report(title="Hot path: notify() in a burst vs a no-op method call", tables=[table])
    least = {name: min(values) for name, values in samples.items()}
    for size in SIZES:
        notify, noop = least[f"notify @{size:,} msgs"], least[f"no-op @{size:,} msgs"]
        median_ratio = (
            stats[f"notify @{size:,} msgs"].median / stats[f"no-op @{size:,} msgs"].median
        )
        report.ratios.append(
            ratio(
                f"notify / no-op @{size:,} msgs",
                notify / noop,
                "<=",
                10,
                note=f"median/median {median_ratio:.2f}x",
            )
        )
    small, large = least[f"notify @{SIZES[0]:,} msgs"], least[f"notify @{SIZES[1]:,} msgs"]
    report.ratios.append(
        ratio(
            f"notify @{SIZES[1]:,} vs @{SIZES[0]:,} msgs (slower / faster)",
            max(small, large) / min(small, large) if min(small, large) > 0 else math.nan,
            "<=",
            1.2,
        )
    )
    return msgspec.to_builtins(report)  # type: ignore[no-any-return]
