"""Case 2, coalescing: what checkpointer makes of a simulated agent's bursts.

The agent of ``benchmarks._agent`` (50 run-ended events per turn; steady,
bursty and stepwise patterns; timers at 1/100 of the defaults) runs with a
``CheckpointWriter`` attached to its event bus.  Reported: events per write,
bytes written, the longest time any change waited to reach disk, and the
bar: that wait never exceeds ``max_wait`` plus one write (the slowest write
of the run).  The runs are shared with the peer case (case 6).
"""

from __future__ import annotations

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
        worst = 0.0
        for run in runs:
            bound = MAX_WAIT + (run.longest_write or 0.0)
            worst = max(worst, (run.longest_wait or float("inf")) / bound)
        rows.append(
            [
                pattern,
                runs[0].events,
                stat([r.writes for r in runs], ""),
                stat([r.events / max(r.writes, 1) for r in runs], "x"),
                stat([r.payload_bytes for r in runs], "B"),
                stat([r.longest_wait or float("inf") for r in runs]),
                stat([r.longest_write or 0.0 for r in runs]),
                "yes" if all(r.durable_at_end for r in runs) else "NO",
            ]
        )
        report.ratios.append(
            ratio(
                f"{pattern}: longest wait to disk / (max_wait + slowest write)",
                worst,
                "<=",
                1.0,
                note="worst of the repeats",
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
