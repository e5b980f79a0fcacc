"""The Python blocks of the README and of the pages under docs/, for the tests that run them.

Every ```` ```python ```` block runs as written, in a fresh interpreter, the
blocks of one page in order in one directory, each twice in a row (`run_twice`):
readers run an example again in the directory its first run left state in, and
what it asserts must hold when it resumes that state too.  A block that cannot
run on its own says so on the line just above its fence, with a reason the
reader sees in the page's source::

    <!-- docs-test: postgres -->          run by tests/stores/postgres/test_store.py, with
                                          CHECKPOINTER_DSN naming its server
    <!-- docs-test: s3 -->                run by tests/stores/s3/test_edges.py, with
                                          AWS_ENDPOINT_URL_S3 naming moto's server
    <!-- docs-test: skip: REASON -->      not run; REASON says why

A marker without a reason, or of another kind, fails the collection.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_FENCE = re.compile(r"^```(\w*)\s*$")
_MARK = re.compile(r"^<!--\s*docs-test:\s*(.*?)\s*-->$")


@dataclass(frozen=True)
class Block:
    """One Python block: where it is, its code, how it runs (run, postgres, s3, skip)."""

    page: Path
    line: int
    code: str
    mode: str
    reason: str = ""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    """The README and every Markdown page under docs/, in a stable order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def python_blocks(page: Path) -> list[Block]:
    """The page's ```python``` (and ```py```) blocks with their markers."""
    lines = page.read_text(encoding="utf-8").split("\n")
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        start, lang = i, m.group(1)
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            i += 1
        if lang in ("python", "py"):
            code = "\n".join(lines[start + 1 : i]) + "\n"
            mode, reason = _marker(page, lines, start)
            blocks.append(Block(page, start + 1, code, mode, reason))
        i += 1
    return blocks


def run_twice(block: Block, cwd: Path) -> None:
    """Run the block twice in ``cwd``, each time in a fresh interpreter; both must succeed."""
    for run in ("first", "second"):
        proc = subprocess.run(
            [sys.executable, "-c", block.code],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, (
            f"{block.where}, {run} run in one directory\n{block.code}\n--- stderr:\n{proc.stderr}"
        )


def _marker(page: Path, lines: list[str], fence: int) -> tuple[str, str]:
    above = lines[fence - 1].strip() if fence > 0 else ""
    m = _MARK.match(above)
    if m is None:
        return "run", ""
    kind, _, reason = m.group(1).partition(":")
    kind, reason = kind.strip(), reason.strip()
    where = f"{page.relative_to(ROOT)}:{fence + 1}"
    if kind == "postgres":
        return "postgres", "needs a PostgreSQL server (tests/stores/postgres/test_store.py runs it)"
    if kind == "s3":
        return "s3", "needs an S3 server (tests/stores/s3/test_edges.py runs it)"
    if kind == "skip" and reason:
        return "skip", reason
    raise ValueError(
        f"{where}: bad docs-test marker {above!r}; use 'postgres', 's3' or 'skip: REASON'"
    )
