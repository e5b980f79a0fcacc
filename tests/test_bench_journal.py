"""The journal benchmark runs end to end in quick mode; no timing is asserted."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

RATIOS = [
    "JournalStore: cost @100,000 / @100 messages",
    "@100,000 messages: cost FileStore snapshot / JournalStore",
    "worst stall: cached snapshot / naive",
    "worst stall: journal / naive",
    "journal size / rewrite threshold, worst after any checkpoint",
]
LINE = re.compile(r"^  ratio journal: (?P<name>.+) = [\d.]+x \(bar [<>=]+ [\d.]+x: (met|MISSED)\)$")


def test_quick_mode_prints_every_figure(tmp_path: Path) -> None:
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
    names = [m["name"] for m in map(LINE.match, out.splitlines()) if m]
    assert names == RATIOS, out
    assert os.listdir(tmp_path) == []  # the scratch space is cleaned up
