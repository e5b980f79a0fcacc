"""Case 2, coalescing: what checkpointer makes of a simulated agent's bursts.

The agent of ``benchmarks._agent`` (50 run-ended events per turn; steady,
bursty and stepwise patterns; timers at 1/100 of the defaults) runs with a
``CheckpointWriter`` attached to its event bus.  Reported: events per write,
bytes written, the longest time any change waited to reach disk, and the
bar: that wait never exceeds ``max_wait`` plus one write (the slowest write
of the run) plus the loop's own timer lateness (p99 lag of a 1 ms ticker in
the same run: no timer wakes more punctually than its event loop lets it).
The runs are shared with the peer case (case 6).
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from ._agent import DEBOUNCE, MAX_WAIT, MIN_INTERVAL, PATTERNS, workload
from ._harness import Report, Table, ratio, stat


def main(quick: bool) -> dict[str, Any]:
    w = workload(quick)
    report = Report(title="Coalescing: a simulated agent's run-ended events into writes")
    rows: list[list[Any]] = []
    for pattern in PATTERNS:
        runs = w.runs.get(f"checkpointer/{pattern}", [])
        if not runs:
            continue
        worst = raw = contract = 0.0
        for run in runs:
            contract = max(
                contract, run.wait_contract if run.wait_contract is not None else math.inf
            )
            wait = run.longest_wait if run.longest_wait is not None else math.inf
            bound = MAX_WAIT + (run.longest_write or 0.0)
            raw = max(raw, wait / bound)
            # The writer's timer wakes no more punctually than the loop lets
            # any task wake: allow the ticker's p99 lateness of the same run.
            worst = max(worst, wait / (bound + run.stall_p99))
        rows.append(
            [
                pattern,
                runs[0].events,
                stat([r.writes for r in runs], ""),
                stat([r.events / max(r.writes, 1) for r in runs], "x"),
                stat([r.payload_bytes for r in runs], "B"),
                stat([r.longest_wait if r.longest_wait is not None else math.inf for r in runs]),
                stat([r.longest_write or 0.0 for r in runs]),
                stat([r.stall_p99 for r in runs]),
                "yes" if all(r.durable_at_end for r in runs) else "NO",
            ]
        )
        report.ratios.append(
            ratio(
                f"{pattern}: longest wait to disk / (max_wait + slowest write + loop lag p99)",
                worst,
                "<=",
                1.0,
                note=f"worst of the repeats; without the loop's lag {raw:.2f}x",
            )
        )
        report.ratios.append(
            ratio(
                f"{pattern}: each wait / (max(max_wait, write in flight) + its write + loop lag)",
                contract,
                "<=",
                1.0,
                note="the contract's bound when a write outlasts max_wait; worst of the repeats",
            )
        )
    report.tables.append(
        Table(
            title=(
                f"{w.turns} turns after {w.history} messages of history, {w.repeats} repeat(s); "
                f"debounce {DEBOUNCE * 1e3:g} ms, min_interval {MIN_INTERVAL * 1e3:g} ms, "
                f"max_wait {MAX_WAIT * 1e3:g} ms"
            ),
            columns=[
                "pattern",
                "events",
                "writes",
                "events/write",
                "bytes written",
                "longest wait",
                "slowest write",
                "loop lag p99",
                "last state on disk",
            ],
            rows=rows,
        )
    )
    report.notes.append(
        "one event in ten changes nothing; the fingerprint (message count) skips those "
        "writes before encoding"
    )
    return msgspec.to_builtins(report)  # type: ignore[no-any-return]
