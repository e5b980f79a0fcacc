"""Lint and types are part of the suite, so CI enforces them: the code's, and the docs' blocks.

The blocks' mypy run comes after the project's in this module (one worker runs a module):
a new cache of its own starts as a copy of the project's, so a cold run (a fresh clone)
checks the frameworks once, not twice.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docblocks import ROOT, Block, pages, python_blocks


@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", "."],
        ["ruff", "format", "--check", "."],
        ["mypy"],
    ],
    ids=["ruff-check", "ruff-format", "mypy-strict"],
)
def test_tool_is_clean(command: list[str]) -> None:
    """ruff (lint and format) and mypy --strict report nothing."""
    proc = subprocess.run(
        [sys.executable, "-m", *command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _module_name(block: Block) -> str:
    """A file name for the block: its page and line, as an importable module name."""
    page = str(block.page.relative_to(ROOT).with_suffix(""))
    return re.sub(r"\W", "_", page) + f"_{block.line}"


def _blocks_cache() -> Path:
    """The blocks' mypy cache; a new one starts as a copy of the project's (the mypy run
    above), so a cold run checks the frameworks once, not twice.  Its own, not the project's
    itself: each run's options would undo the other's entries."""
    cache = ROOT / ".mypy_cache" / "docs-blocks"
    project = ROOT / ".mypy_cache" / "3.11"
    if not cache.exists() and project.is_dir():
        seed = cache.with_name(f"docs-blocks.{os.getpid()}")
        shutil.copytree(project, seed / project.name)
        try:
            seed.rename(cache)
        except OSError:  # made meanwhile by another run
            shutil.rmtree(seed, ignore_errors=True)
    return cache


def test_python_blocks_pass_mypy_strict(tmp_path: Path) -> None:
    """Every Python block of the README and the docs, pasted alone, passes ``mypy --strict``.

    One mypy run over all blocks, each its own file (issue 16: 13 of 17 blocks
    failed: ``list[dict]``, ``load(...)`` being ``Checkpoint | None``, ...).  A
    fragment not meant to be typed alone says so with ``docs-test: skip: REASON``.
    """
    blocks = [b for p in pages() for b in python_blocks(p) if b.mode != "skip"]
    assert len(blocks) >= 15
    files: dict[str, Block] = {}
    for block in blocks:
        path = tmp_path / f"{_module_name(block)}.py"
        path.write_text(block.code, encoding="utf-8")
        files[path.name] = block
    mypy = shutil.which("mypy", path=str(Path(sys.executable).parent)) or "mypy"
    proc = subprocess.run(
        [
            mypy,
            "--strict",
            "--python-version",
            "3.11",
            "--no-error-summary",
            "--cache-dir",  # kept between runs: a cold run checks the frameworks too
            str(_blocks_cache()),
            *sorted(files),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )

    def where(m: re.Match[str]) -> str:  # "README_41.py:4:" -> "README.md:45:"
        block = files[m[1]]
        return f"{block.page.relative_to(ROOT)}:{block.line + int(m[2])}:"

    report = re.sub(r"^(\w+\.py):(\d+):", where, proc.stdout, flags=re.M)
    assert proc.returncode == 0, report + proc.stderr
