"""Case 1, the hot path: ``notify()`` inside a burst against a no-op method call.

Both are called through a bound method of the same writer object, in
timeit-style loops of many calls, interleaved, repeated; each ratio is the
median of the per-repeat ratios (the calls of one repeat run back to back,
so the machine's drift cancels), with the ratio of the minimums (timeit's
advice: the least disturbed run) beside it.  The writer holds a state of 10 and of 100,000
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

from ._harness import Report, Table, paired, ratio, scratch_dir, stat
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
    # Short repeats, many of them: the machine's disturbances come in bursts
    # longer than one repeat, so the pairs within a repeat see the same one.
    number = 20_000
    repeats = 9 if quick else 101
    samples = anyio.run(_measure, number, repeats)
    stats = {name: stat(values) for name, values in samples.items()}
    table = Table(
        title=f"seconds per call, {repeats} repeats of {number:,} calls",
        columns=["call", "min", "median [p10-p90]"],
        rows=[[name, min(values), stats[name]] for name, values in samples.items()],
    )
    report = Report(title="Hot path: notify() in a burst vs a no-op method call", tables=[table])
    for size in SIZES:
        notify, noop = samples[f"notify @{size:,} msgs"], samples[f"no-op @{size:,} msgs"]
        least_ratio = min(notify) / min(noop)
        report.ratios.append(
            ratio(
                f"notify / no-op @{size:,} msgs",
                paired(notify, noop),
                "<=",
                10,
                note=(f"median of {repeats} interleaved repeats; min/min {least_ratio:.2f}x"),
            )
        )
    small, large = samples[f"notify @{SIZES[0]:,} msgs"], samples[f"notify @{SIZES[1]:,} msgs"]
    between = paired(large, small)
    report.ratios.append(
        ratio(
            f"notify @{SIZES[1]:,} vs @{SIZES[0]:,} msgs (slower / faster)",
            max(between, 1 / between) if between > 0 else math.nan,
            "<=",
            1.2,
            note=f"median of {repeats} interleaved repeats; min/min "
            f"{max(min(large), min(small)) / min(min(large), min(small)):.2f}x",
        )
    )
    return msgspec.to_builtins(report)  # type: ignore[no-any-return]
