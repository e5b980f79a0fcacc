"""Case 6, peers: the same agent saved by what users would pick instead.

Same runs as case 2 (``benchmarks._agent``), on asyncio, every approach
attached to the same event bus:

* ``naive``: on every event, ``json.dumps`` on the loop and the durable
  atomic replace step by step through aiofiles;
* ``debounce``: a trailing debounce with no maximum wait and no check for
  change (Home Assistant's delayed-save model);
* ``langgraph``: LangGraph's ``AsyncSqliteSaver`` storing the transcript
  as a checkpoint after each turn (benchmark-only dependency);
* ``none``: no persistence, the baseline the loop CPU is measured against.

Bytes written are what the process passed to write(2) (``/proc/self/io``),
so a database's journal counts.  Loop CPU is the event-loop thread's CPU
time beyond the baseline's.  Bars: checkpointer writes fewer bytes and
stalls the loop less (worst ticker lag) than every peer, per pattern.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from ._agent import APPROACHES, PATTERNS, Run, workload
from ._harness import Report, Stat, Table, ratio, stat


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _bytes(run: Run) -> float:
    return float(run.bytes_written if run.bytes_written is not None else run.payload_bytes)


def main(quick: bool) -> dict[str, Any]:
    w = workload(quick)
    report = Report(title="Peers on the same agent workload")
    for pattern in PATTERNS:
        base = w.runs.get(f"none/{pattern}", [])
        base_cpu = stat([r.loop_cpu for r in base]).median if base else 0.0
        rows: list[list[Any]] = []
        figures: dict[str, dict[str, Stat]] = {}
        for approach in APPROACHES:
            name = approach.name
            runs = w.runs.get(f"{name}/{pattern}", [])
            if not runs:
                rows.append([approach.label, f"not run: {w.missing.get(name, '?')}"])
                continue
            figures[name] = {
                "bytes": stat([_bytes(r) for r in runs], "B"),
                "stall": stat([r.stall_worst for r in runs]),
            }
            durable = sum(r.durable_at_end for r in runs)
            rows.append(
                [
                    approach.label,
                    stat([r.writes for r in runs], ""),
                    figures[name]["bytes"],
                    stat([max(0.0, r.loop_cpu - base_cpu) for r in runs]),
                    stat([r.wall for r in runs]),
                    figures[name]["stall"],
                    stat([r.stall_p99 for r in runs]),
                    stat([r.longest_wait if r.longest_wait is not None else math.inf for r in runs])
                    if name != "none"
                    else "-",
                    "-"
                    if name == "none"
                    else "yes"
                    if durable == len(runs)
                    else f"{durable}/{len(runs)}",
                ]
            )
            report.series[f"stall/{pattern} workload/{name}"] = [(0.0, figures[name]["stall"])]
        report.tables.append(
            Table(
                title=(
                    f"{pattern}: {w.turns} turns after {w.history} messages, {w.repeats} repeat(s)"
                ),
                columns=[
                    "approach",
                    "writes",
                    "bytes written",
                    "loop CPU over baseline",
                    "agent wall time",
                    "worst stall",
                    "p99 stall",
                    "longest wait to disk",
                    "last state on disk",
                ],
                rows=rows,
            )
        )
        ours = figures.get("checkpointer")
        noise = figures["none"]["stall"].median if "none" in figures else math.nan
        for approach in APPROACHES:
            if approach.name in ("none", "checkpointer"):
                continue
            peer = figures.get(approach.name)
            for what, label in (("bytes", "bytes written"), ("stall", "worst stall")):
                if ours is None or peer is None:
                    report.ratios.append(
                        ratio(
                            f"{pattern}: {label} checkpointer / {approach.name}",
                            None,
                            "<",
                            1.0,
                            note=f"not run: {w.missing.get(approach.name, 'checkpointer missing')}",
                        )
                    )
                    continue
                note = ""
                if what == "stall":
                    note = (
                        f"{_ms(ours[what].median)} vs {_ms(peer[what].median)}; "
                        f"no persistence: {_ms(noise)}"
                    )
                report.ratios.append(
                    ratio(
                        f"{pattern}: {label} checkpointer / {approach.name}",
                        ours[what].median / peer[what].median if peer[what].median else None,
                        "<",
                        1.0,
                        note=note,
                    )
                )
    return msgspec.to_builtins(report)  # type: ignore[no-any-return]
