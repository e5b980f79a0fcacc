"""``python -m benchmarks [--quick] [--strict] [--only CASE,...] [--out DIR]``: run every case.

Prints one table per case and every ratio with its bar, then a summary;
exits 1 with ``--strict`` when a bar is missed (2 on a usage error);
writes the raw figures to ``<out>/<mode>.json`` and, when matplotlib is
installed, the charts ``<out>/<mode>-growth.png``, ``<out>/<mode>-stall.png``
and ``<out>/<mode>-sessions.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec

from ._harness import Ratio, Report, Stat, Table, machine

CASES: list[tuple[str, str]] = [
    ("hot-path", "benchmarks.bench_hot_path"),
    ("coalescing", "benchmarks.bench_coalescing"),
    ("floor", "benchmarks.bench_floor"),
    ("exit-flush", "benchmarks.bench_exit_flush"),
    ("stall", "benchmarks.bench_stall"),
    ("peers", "benchmarks.bench_peers"),
    ("growth", "benchmarks.bench_growth"),
    ("fingerprint", "benchmarks.bench_fingerprint"),
    ("aiofiles", "benchmarks.bench_aiofiles"),
    ("journal", "benchmarks.bench_journal"),
    ("prepare", "benchmarks.bench_prepare"),
    ("adapters", "benchmarks.bench_adapters"),
    ("claude", "benchmarks.bench_claude"),
    ("adk", "benchmarks.bench_adk"),
    ("sessions", "benchmarks.bench_sessions"),
    ("strands", "benchmarks.bench_strands"),
    ("postgres", "benchmarks.bench_postgres"),
    ("s3", "benchmarks.bench_s3"),
    ("encryption", "benchmarks.bench_encryption"),
]
"""(case id, module with ``main(quick) -> dict``); adding a case is one entry."""

FULL_ONLY = {
    "postgres": (
        "it starts a PostgreSQL server (quick: python -m benchmarks.bench_postgres --quick)"
    ),
    "s3": "it starts moto's S3 server (quick: python -m benchmarks.bench_s3 --quick)",
    "claude": (
        "it drives the Claude Code CLI, ~1 min (quick: python -m benchmarks.bench_claude --quick)"
    ),
}
"""Cases ``--quick`` leaves out, and why: the quick run stays within 20 s."""

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def _time(seconds: float) -> str:
    if math.isnan(seconds) or math.isinf(seconds):
        return str(seconds)
    if seconds == 0:
        return "0"
    magnitude = abs(seconds)
    if magnitude >= 1:
        return f"{seconds:.2f} s"
    if magnitude >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    if magnitude >= 1e-6:
        return f"{seconds * 1e6:.1f} µs"
    return f"{seconds * 1e9:.1f} ns"


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def _number(value: float, unit: str) -> str:
    if unit == "s":
        return _time(value)
    if unit == "B":
        return _bytes(value)
    if unit == "x":
        return f"{value:.1f}"
    return f"{value:g}" if value == int(value) else f"{value:.1f}"


def fmt_cell(cell: Any) -> str:
    if isinstance(cell, dict) and "median" in cell:
        cell = msgspec.convert(cell, Stat)
    if isinstance(cell, Stat):
        s = cell
        median = _number(s.median, s.unit)
        if s.p10 == s.p90:
            return median
        return f"{median} [{_number(s.p10, s.unit)}-{_number(s.p90, s.unit)}]"
    if isinstance(cell, bool):
        return "yes" if cell else "no"
    if isinstance(cell, float):
        return _time(cell)
    if cell is None:
        return "-"
    return str(cell)


def render_table(table: Table | dict[str, Any]) -> list[str]:
    t = table if isinstance(table, Table) else msgspec.convert(table, Table)
    cells = [[fmt_cell(c) for c in row] for row in t.rows]
    widths = [len(c) for c in t.columns]
    for row in cells:
        for i, c in enumerate(row[: len(widths)]):
            widths[i] = max(widths[i], len(c))
    lines = [f"  {t.title}"]
    lines.append("  " + " | ".join(c.ljust(w) for c, w in zip(t.columns, widths, strict=True)))
    lines.append("  " + "-+-".join("-" * w for w in widths))
    for row in cells:
        if len(row) < len(widths):  # a short row: the rest of the line is a note
            head = " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=False))
            lines.append("  " + head)
            continue
        lines.append("  " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    return lines


def render_ratio(case: str, r: Ratio) -> str:
    value = "n/a" if r.value is None else f"{r.value:.2f}x"
    if r.bar is None:
        verdict = "no bar"
    else:
        state = "n/a" if r.ok is None else "met" if r.ok else "MISSED"
        verdict = f"bar {r.op} {r.bar:g}x: {state}"
    note = f"; {r.note}" if r.note else ""
    return f"  ratio {case}: {r.name} = {value} ({verdict}{note})"


def render(case: str, result: dict[str, Any]) -> list[str]:
    try:
        report = msgspec.convert(result, Report)
    except msgspec.ValidationError:  # a free-form dict: print it as it is
        return [f"  {k}: {json.dumps(v, default=str)[:200]}" for k, v in result.items()]
    lines: list[str] = []
    for table in report.tables:
        lines.extend(render_table(table))
        lines.append("")
    lines.extend(render_ratio(case, r) for r in report.ratios)
    lines.extend(f"  note: {n}" for n in report.notes)
    return lines


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description="Run the checkpointer benchmarks."
    )
    parser.add_argument(
        "--quick", action="store_true", help="smaller sizes, few repeats: every case in 10-20 s"
    )
    parser.add_argument(
        "--only", default="", help="comma-separated case ids: " + ",".join(c for c, _ in CASES)
    )
    parser.add_argument(
        "--strict", action="store_true", help="exit 1 when any bar is missed (for CI)"
    )
    parser.add_argument("--out", default=DEFAULT_OUT, help="where results go (%(default)s)")
    parser.add_argument("--no-charts", action="store_true", help="skip the PNG charts")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    wanted = {c.strip() for c in args.only.split(",") if c.strip()}
    if args.only and not wanted:
        print(
            f"--only {args.only!r} names no case; choose from: " + ",".join(c for c, _ in CASES),
            file=sys.stderr,
        )
        return 2
    unknown = wanted - {c for c, _ in CASES}
    if unknown:
        print(f"unknown case(s): {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    mode = "quick" if args.quick else "full"
    info = machine()
    print(
        f"checkpointer benchmarks ({mode}): python -m benchmarks{' --quick' if args.quick else ''}"
    )
    print("machine: " + ", ".join(f"{k} {v}" for k, v in info.items()))
    print("spread: median [p10-p90] over repeats; ratios against baselines of this run\n")
    started = time.perf_counter()
    results: dict[str, Any] = {}
    summary: list[tuple[str, Ratio]] = []
    for case, module_name in CASES:
        if wanted and case not in wanted:
            continue
        if args.quick and case in FULL_ONLY and case not in wanted:
            print(f"== {case}: skipped in --quick: {FULL_ONLY[case]}\n")
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            print(f"== {case}: skipped ({module_name} is not here yet)\n")
            continue
        t0 = time.perf_counter()
        result: dict[str, Any] = module.main(args.quick)
        took = time.perf_counter() - t0
        results[case] = {"seconds": took, **result}
        title = result.get("title", case) if isinstance(result, dict) else case
        print(f"== {case}: {title} ({took:.1f} s)")
        for line in render(case, result):
            print(line)
        print(flush=True)
        for r in result.get("ratios", []) if isinstance(result, dict) else []:
            with contextlib.suppress(msgspec.ValidationError):
                summary.append((case, msgspec.convert(r, Ratio)))
    total = time.perf_counter() - started
    barred = [(c, r) for c, r in summary if r.bar is not None]
    met = sum(1 for _, r in barred if r.ok)
    missed = [(c, r) for c, r in barred if r.ok is False]
    unmeasured = sum(1 for _, r in barred if r.ok is None)
    print(f"== summary: {met} bars met, {len(missed)} missed, {unmeasured} not measured")
    for case, r in missed:
        print("  missed:" + render_ratio(case, r)[len("  ratio") :])
    print(f"total {total:.0f} s")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{mode}.json")
    document = {
        "mode": mode,
        "command": "python -m benchmarks" + (" --quick" if args.quick else ""),
        "finished": datetime.now(UTC).isoformat(timespec="seconds"),
        "seconds": total,
        "machine": info,
        "cases": results,
    }
    with open(path, "wb") as f:
        f.write(msgspec.json.format(msgspec.json.encode(document)))
    print(f"raw figures: {path}")
    if not args.no_charts:
        from ._charts import draw

        for line in draw(results, args.out, mode):
            print(line)
    if args.strict and missed:
        print(f"--strict: {len(missed)} bar(s) missed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
