"""Case 6, peers: the same agent saved by what users would pick instead.

Same runs as case 2 (``benchmarks._agent``), on asyncio, every approach
attached to the same event bus:

* ``naive``: on every event, ``json.dumps`` on the loop and the durable
  atomic replace step by step through aiofiles;
* ``debounce``: a trailing debounce with no maximum wait and no check for
  change (Home Assistant's delayed-save model);
* ``debounce-max-wait``: a good hand-written debounce: trailing, never past
  the same maximum wait checkpointer is given, skipping a save whose
  transcript has not grown (the same ``len`` check checkpointer is given);
* ``langgraph``: LangGraph's ``AsyncSqliteSaver`` storing the transcript
  as a checkpoint after each turn (benchmark-only dependency);
* ``none``: no persistence, the baseline the loop CPU is measured against.

checkpointer runs twice, as two rows: on a ``FileStore`` (``checkpointer``)
and on a ``JournalStore`` (``journal``), the store a long session should use.

Bytes written are what the process passed to write(2) (``/proc/self/io``),
so a database's journal counts.  Loop CPU is the event-loop thread's CPU
time beyond the baseline's.  Bars, per pattern and for each of the two rows
against every peer: it stalls the loop less (worst ticker lag); no peer is
better on both bytes written and the longest wait to disk (Pareto: the
smaller of the two ratios ours / peer is at most 1x; a debounce that starves
writes few bytes by letting changes wait, so bytes alone is no fair bar);
and the journal writes fewer bytes than LangGraph's saver.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import msgspec

from ._agent import APPROACHES, PATTERNS, Run, workload
from ._harness import Report, Stat, Table, ratio, stat


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


OURS = ("checkpointer", "journal")  # the two rows of checkpointer: FileStore, JournalStore
STALL_AND_PARETO: tuple[tuple[str, Literal["<", "<="], float], ...] = (
    ("worst stall", "<", 1.0),
    ("pareto min(bytes, longest wait)", "<=", 1.0),
)


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _over(a: Stat, b: Stat) -> float | None:
    if not b.median or math.isinf(a.median) or math.isinf(b.median):
        return None
    return a.median / b.median


def _wait(run: Run) -> float:
    return run.longest_wait if run.longest_wait is not None else math.inf


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
                "wait": stat([_wait(r) for r in runs]),
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
                    figures[name]["wait"] if name != "none" else "-",
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
        noise = figures["none"]["stall"].median if "none" in figures else math.nan
        for mine in OURS:
            ours = figures.get(mine)
            for approach in APPROACHES:
                if approach.name == "none" or approach.name in OURS:
                    continue
                peer = figures.get(approach.name)
                if ours is None or peer is None:
                    why = w.missing.get(approach.name) or w.missing.get(mine, "not run")
                    for what, op, bar in STALL_AND_PARETO:
                        report.ratios.append(
                            ratio(f"{pattern}: {what} {mine} / {approach.name}", None, op, bar, why)
                        )
                    continue
                report.ratios.append(
                    ratio(
                        f"{pattern}: worst stall {mine} / {approach.name}",
                        _over(ours["stall"], peer["stall"]),
                        "<",
                        1.0,
                        note=f"{_ms(ours['stall'].median)} vs {_ms(peer['stall'].median)}; "
                        f"no persistence: {_ms(noise)}",
                    )
                )
                on_bytes = _over(ours["bytes"], peer["bytes"])
                on_wait = _over(ours["wait"], peer["wait"])
                worse = None if on_bytes is None or on_wait is None else min(on_bytes, on_wait)
                report.ratios.append(
                    ratio(
                        f"{pattern}: pareto min(bytes, longest wait) {mine} / {approach.name}",
                        worse,
                        "<=",
                        1.0,
                        note=f"bytes {_x(on_bytes)}, longest wait {_x(on_wait)}; above 1x on "
                        "both: the peer is better on both",
                    )
                )
        journal, langgraph = figures.get("journal"), figures.get("langgraph")
        report.ratios.append(
            ratio(
                f"{pattern}: bytes written journal / langgraph",
                None
                if journal is None or langgraph is None
                else _over(journal["bytes"], langgraph["bytes"]),
                "<",
                1.0,
                note=w.missing.get("langgraph", ""),
            )
        )
    return msgspec.to_builtins(report)  # type: ignore[no-any-return]
