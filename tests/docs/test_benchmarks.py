"""The benchmarks run end to end, so they never rot; no timing is asserted."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import bench_fingerprint, bench_floor, bench_growth, bench_stall
from benchmarks._agent import Durable, _waits
from benchmarks._harness import ratio, stat
from tests._support import ROOT

# Every case and the ratio lines --quick must print (prefixes of the ratio names).
# Quick runs smaller sizes where a case is about size; one ratio per full-run ratio.
EXPECTED = {
    "hot-path": [
        "notify / no-op @10 msgs",
        "notify / no-op @100,000 msgs",
        "notify @100,000 vs @10 msgs",
    ],
    "coalescing": [
        f"{pattern}: {what}"
        for pattern in ("steady", "bursty", "stepwise")
        for what in ("longest wait to disk", "each wait / (max(max_wait, write in flight)")
    ],
    "floor": ["1 KiB:", "100 KiB:", "1 MiB:", "5 MiB:"],
    "exit-flush": ["1 KiB:", "100 KiB:", "1 MiB:", "5 MiB:"],
    "stall": [
        f"{size}: worst stall {ours} / {base}"
        for size in ("1 MiB", "5 MiB")
        for ours, base in [
            ("checkpointer", "msgspec on loop"),
            ("checkpointer", "json.dumps on loop"),
            ("checkpointer", "json.dumps in a thread"),
            ("checkpointer", "langgraph aput"),
            ("checkpointer + cache", "checkpointer"),
            ("checkpointer + cache", "msgspec on loop"),
        ]
    ],
    "peers": [
        f"{pattern}: {what} {ours} / {peer}"
        for pattern in ("steady", "bursty", "stepwise")
        for what in ("worst stall", "pareto min(bytes, longest wait)")
        for ours in ("checkpointer", "journal")
        for peer in ("naive", "debounce", "debounce-max-wait", "langgraph")
    ]
    + [
        f"{pattern}: bytes written journal / langgraph"
        for pattern in ("steady", "bursty", "stepwise")
    ],
    "growth": [
        f"{store}: cost @10,000 / @100 messages"
        for store in ("FileStore", "FileStore+Transcript", "JournalStore", "JournalStore, numbers")
    ],
    "fingerprint": ["fingerprint @100,000 vs @10 msgs"],
    "aiofiles": ["1 KiB on disk: aiofiles / one hop"],
    "journal": [
        "JournalStore: cost @100,000 / @100 messages",
        "@100,000 messages: cost FileStore snapshot / JournalStore",
        "worst stall: cached snapshot / naive",
        "worst stall: journal / naive",
        "journal size / rewrite threshold",
        "@100,000 dict messages: JournalStore checkpoint / one encode of the messages",
    ],
    "adapters": [
        f"{framework}: {what}"
        for framework in ("openai-agents", "langgraph", "pydantic-ai")
        for what in ("bytes checkpointer /", "worst stall checkpointer /", "longest wait to disk")
    ]
    + ["openai-agents: write @1,000 / @100 items"],
    "adk": ["bytes per turn checkpointer / adk-sqlite"],
    "sessions": [
        f"{backend}: {what}"
        for backend in ("asyncio", "trio")
        for what in (
            "open per writer @300 / @30 sessions",
            "close per writer @300 / @30 sessions",
            "notify() @300 / @30 sessions",
            "memory per open writer @300 sessions",
            "burst checkpoints/s @30 sessions / bare recipe",
            "burst checkpoints/s @300 sessions / bare recipe",
        )
    ],
    "strands": [
        "bytes/turn trimming / not full",
        "bytes/turn checkpointer / FileSessionManager",
        "messages restored after SIGKILL",
    ],
    "prepare": [
        "prepare after 1 append @100,000 vs @100 msgs",
        "prepare after 1 append @100,000 / one list == of 100,000 references",
        "full scan / prepare after 1 append @100,000 msgs",
        "journal checkpoint + prepare @100,000 vs @100 msgs",
    ],
}

RATIO_LINE = re.compile(
    r"^  ratio (?P<case>[\w-]+): (?P<name>.+) = (?:-?[\d.]+x|n/a) \((?:no bar|bar [<>=]+ [\d.]+x: "
    r"(?:met|MISSED|n/a))(?:; .*)?\)$"
)


def test_quick_run_prints_every_ratio(tmp_path: Path) -> None:
    """`python -m benchmarks --quick` completes, prints each case's ratios, writes JSON."""
    env = {**os.environ, "CHECKPOINTER_BENCH_DIR": str(tmp_path / "scratch")}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--no-charts", "--out", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        m = RATIO_LINE.match(line)
        if m:
            found.setdefault(m["case"], []).append(m["name"])
    for case, names in EXPECTED.items():
        assert f"== {case}:" in proc.stdout, f"case {case} did not run"
        for name in names:
            assert any(n.startswith(name) for n in found.get(case, [])), (
                f"no ratio line {case}: {name}...\n{proc.stdout[-2000:]}"
            )
    assert "== summary:" in proc.stdout
    document = json.loads((tmp_path / "quick.json").read_text())
    assert document["mode"] == "quick"
    assert set(EXPECTED) <= set(document["cases"])
    for case in EXPECTED:
        assert document["cases"][case]["ratios"], case
    growth = document["cases"]["growth"]["series"]
    assert sorted(growth) == [f"growth/{name}" for name, *_ in sorted(bench_growth.STORES)]
    assert all(len(points) == 3 for points in growth.values())  # 100, 1,000, 10,000
    stall = document["cases"]["stall"]["series"]
    assert "stall/one 5 MiB checkpoint/checkpointer + cache" in stall


def test_quick_sizes_shadow_the_full_ones() -> None:
    """--quick runs a smaller size for every size of the full run, so no ratio goes missing."""
    assert len(bench_floor.QUICK_SIZES) == len(bench_floor.SIZES)
    assert len(bench_stall.QUICK_SIZES) == len(bench_stall.SIZES)
    assert len(bench_growth.QUICK_LENGTHS) >= 2
    assert bench_growth.LENGTHS[-1] == 100_000  # the full run keeps its sizes
    assert [label for label, _ in bench_floor.SIZES][-1] == "50 MiB"


def test_wait_to_disk_is_event_to_covering_write() -> None:
    """The longest wait runs from a change to the end of the first write that covers it."""
    events = [0.0, 0.010, 0.020]  # messages 0, 1, 2 of a session without history
    durable = [Durable(0.015, 0.030, 2), Durable(0.040, 0.050, 3)]
    waits = _waits(events, durable, history=0, max_wait=0.050)
    assert waits.longest == pytest.approx(0.030)  # message 2: 0.020 -> 0.050
    assert waits.over_write == pytest.approx(0.020)  # message 2 less its 10 ms write
    # message 2 came while the first write (15 ms) was in flight: bound 50 + 10 ms
    assert waits.contract == pytest.approx(0.030 / 0.060)


def test_contract_bound_grows_with_a_slow_write_in_flight() -> None:
    """A change made during a write longer than max_wait may wait for it, then its own."""
    events = [0.001]
    durable = [Durable(0.0, 0.200, 0), Durable(0.200, 0.300, 1)]
    waits = _waits(events, durable, history=0, max_wait=0.050)
    assert waits.longest == pytest.approx(0.299)
    assert waits.contract == pytest.approx(0.299 / (0.200 + 0.100))


def test_change_never_on_disk_has_no_wait() -> None:
    """A change that no write covered is reported as lost (None), not as a short wait."""
    waits = _waits([0.0, 0.01], [Durable(0.001, 0.002, 11)], history=10)
    assert waits.longest is None and waits.contract is None


@pytest.mark.parametrize(
    ("value", "op", "bar", "ok"),
    [(0.5, "<", 1.0, True), (1.0, "<", 1.0, False), (1.2, "<=", 1.2, True), (None, "<=", 1, None)],
)
def test_ratio_verdict(value: float | None, op: str, bar: float, ok: bool | None) -> None:
    """A ratio is met, missed, or not measured, exactly as its bar says."""
    assert ratio("r", value, op, bar).ok is ok  # type: ignore[arg-type]


def test_stat_spread() -> None:
    """Median and p10-p90 come from the samples, in any order."""
    s = stat([5.0, 1.0, 3.0, 2.0, 4.0])
    assert s.median == 3.0
    assert s.p10 == pytest.approx(1.4)
    assert s.p90 == pytest.approx(4.6)


def test_fingerprint_cost_does_not_grow_with_the_history() -> None:
    """The transcript fingerprint of 100,000 messages costs at most 1.2x that of 10
    (the best of three tries, for a noisy machine)."""
    ratios = []
    for _ in range(3):
        ratios.append(bench_fingerprint.growth())
        if ratios[-1] <= bench_fingerprint.LIMIT:
            return
    raise AssertionError(f"ratios {ratios} exceed {bench_fingerprint.LIMIT}")


def test_charts_drawn_from_series(tmp_path: Path) -> None:
    """The growth, stall and sessions series become the four charts, as PNG files."""
    from benchmarks._charts import draw

    point = {"median": 0.01, "p10": 0.008, "p90": 0.012, "unit": "s", "samples": []}
    sessions = {
        f"sessions/{metric}/{backend}": [[100, point], [1000, point]]
        for metric in ("open", "close", "memory", "notify", "burst", "burst-alone", "bare")
        for backend in ("asyncio", "trio")
    }
    results = {
        "growth": {"series": {"growth/FileStore": [[100, point], [1000, point]]}},
        "stall": {"series": {"stall/one 10 MiB checkpoint/checkpointer": [[10, point]]}},
        "sessions": {"series": sessions},
    }
    lines = draw(results, str(tmp_path), "test")
    for chart in ("growth", "stall", "sessions", "groupcommit"):
        assert (tmp_path / f"test-{chart}.png").stat().st_size > 0, lines


@pytest.mark.parametrize("strict", [False, True])
def test_strict_exits_1_on_a_missed_bar(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, strict: bool
) -> None:
    """--strict turns a missed bar into exit status 1; without it the run exits 0."""
    import types

    import benchmarks.__main__ as cli

    fake = types.ModuleType("benchmarks._fake_case")
    fake.main = lambda quick: {  # type: ignore[attr-defined]
        "title": "fake",
        "ratios": [{"name": "r", "value": 2.0, "op": "<=", "bar": 1.0, "ok": False}],
    }
    monkeypatch.setitem(sys.modules, "benchmarks._fake_case", fake)
    monkeypatch.setattr(cli, "CASES", [("fake", "benchmarks._fake_case")])
    argv = ["--out", str(tmp_path), "--no-charts"] + (["--strict"] if strict else [])
    assert cli.main(argv) == (1 if strict else 0)


@pytest.mark.parametrize("only", [",", " , "])
def test_only_naming_no_case_is_a_usage_error(only: str) -> None:
    """--only that names no case exits 2 instead of running every case."""
    import benchmarks.__main__ as cli

    assert cli.main(["--only", only]) == 2


def test_the_s3_case_measures_every_layout_at_the_wire() -> None:
    """`python -m benchmarks.bench_s3 --quick`: the four layouts, requests and bytes counted
    at the proxy, and its ratios (moto's server, started for it; skipped only without it)."""
    from benchmarks import bench_s3
    from tests.s3 import start_error

    why = start_error()
    if why is not None:
        pytest.skip(why)
    report = bench_s3.main(quick=True)
    (table,) = report["tables"]
    layouts = {row[0]: row for row in table["rows"]}
    assert sorted(layouts) == sorted(bench_s3._LAYOUTS)
    assert layouts["S3JournalStore"][2]["median"] == 2  # a segment and the head
    assert layouts["S3Store"][2]["median"] == 1
    names = [r["name"] for r in report["ratios"]]
    assert names == [
        "@1,000 messages: mean bytes sent S3JournalStore / S3Store",
        "@1,000 messages: worst stall S3JournalStore / object per turn",
    ]


JOURNAL_RATIOS = [
    "JournalStore: cost @100,000 / @100 messages",
    "@100,000 messages: cost FileStore snapshot / JournalStore",
    "worst stall: cached snapshot / naive",
    "worst stall: journal / naive",
    "journal size / rewrite threshold, worst after any checkpoint",
]
JOURNAL_LINE = re.compile(
    r"^  ratio journal: (?P<name>.+) = [\d.]+x \(bar [<>=]+ [\d.]+x: (met|MISSED)\)$"
)


def test_journal_quick_mode_prints_every_figure(tmp_path: Path) -> None:
    """`python -m benchmarks.bench_journal --quick` completes and prints tables and ratios."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_journal", "--quick"],
        cwd=ROOT,
        env={**os.environ, "CHECKPOINTER_BENCH_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    for title in ("write_now() after appending", "worst 1 ms ticker lag", "a journal after"):
        assert title in out, out
    for store in ("JournalStore", "FileStore+Transcript", "naive snapshot", "journal"):
        assert store in out
    names = [m["name"] for m in map(JOURNAL_LINE.match, out.splitlines()) if m]
    assert names == JOURNAL_RATIOS, out
    assert os.listdir(tmp_path) == []  # the scratch space is cleaned up


def test_charts_print_the_medians_of_the_tables(tmp_path: Path) -> None:
    """Each point and bar of a chart carries its median as the tables print it."""
    from benchmarks.__main__ import fmt_cell
    from benchmarks._charts import draw

    def point(median: float) -> dict[str, Any]:
        return {"median": median, "p10": median, "p90": median, "unit": "s", "samples": []}

    results = {
        "growth": {
            "series": {"growth/JournalStore": [[100, point(545e-6)], [1e5, point(0.00269)]]}
        },
        "stall": {"series": {"stall/one 10 MiB checkpoint/journal": [[10, point(0.0194)]]}},
    }
    draw(results, str(tmp_path), "", fmt="svg")
    for chart, medians in (("growth", (545e-6, 2.69e-3)), ("stall", (0.0194,))):
        svg = (tmp_path / f"{chart}.svg").read_text("utf-8")
        for median in medians:
            printed = fmt_cell(point(median))  # "545.0 µs", "2.69 ms": the table's cell
            assert f"<!-- {printed} -->" in svg, (chart, printed)
