"""The README's example, the demo command and the "When a write fails" check work as written.

That check says saved exactly when the final write was (it once read
``statistics().last_failure``, which stays after later writes succeed); its block
runs as written, its ``pass  # your work`` replaced.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from checkpointer import FileStore, load
from tests._support import child_env
from tests.docblocks import ROOT, python_blocks, run_twice

_WORK = "    pass  # your work\n"


def test_readme_python_blocks_run(tmp_path: Path) -> None:
    """Every python code block in the README runs, twice in a row, in one directory."""
    blocks = [b for b in python_blocks(ROOT / "README.md") if b.mode == "run"]
    assert blocks, "the README has no python example"
    for block in blocks:
        run_twice(block, tmp_path)


def test_demo_command(tmp_path: Path) -> None:
    """`python -m checkpointer demo` coalesces events, verifies the file, and resumes."""
    env = child_env()
    cmd = [sys.executable, "-m", "checkpointer", "demo", "--root", str(tmp_path), "--turns", "5"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False, env=env)
    assert first.returncode == 0, first.stderr
    assert "checkpoint matches the session in memory" in first.stdout
    m = re.search(r"(\d+) run-ended events", first.stdout)
    w = re.search(r"writer: (\d+) writes", first.stdout)
    assert m is not None and w is not None
    assert int(w.group(1)) < int(m.group(1))  # coalesced
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False, env=env)
    assert second.returncode == 0, second.stderr
    assert "resumed 'demo-session'" in second.stdout
    for backend in ("trio",):
        proc = subprocess.run(
            [*cmd, "--backend", backend], capture_output=True, text=True, timeout=120, env=env
        )
        assert proc.returncode == 0, proc.stderr


def _block() -> str:
    (block,) = [b.code for b in python_blocks(ROOT / "README.md") if "was not saved" in b.code]
    assert _WORK in block
    return block


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_readme_check_says_saved_after_a_failure_then_success(tmp_path: Path) -> None:
    """A write that failed, then the final write succeeding: the README's check passes."""
    (tmp_path / ".checkpoints").write_text("a file where the store's directory goes")
    work = (
        "    import os\n"
        "    assert type(writer.flush_sync()).__name__ == 'Failed'\n"
        "    os.remove('.checkpoints')\n"
    )
    proc = _run(_block().replace(_WORK, work), tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "not saved" not in proc.stderr
    found = load(FileStore(tmp_path / ".checkpoints"), "s")
    assert found is not None and found.state == {"n": 1}


def test_readme_check_says_not_saved_when_the_final_write_fails(tmp_path: Path) -> None:
    """The final write failing: the README's check exits with "the session was not saved"."""
    work = (
        "    import os, shutil\n"
        "    assert type(writer.flush_sync()).__name__ == 'Written'\n"
        "    shutil.rmtree('.checkpoints')\n"
        "    open('.checkpoints', 'w').close()\n"
        "    writer.notify()\n"
    )
    code = _block().replace(_WORK, work).replace('{"n": 1}', "{'n': next(counter)}")
    code = "import itertools\ncounter = itertools.count()\n" + code
    proc = _run(code, tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "the session was not saved: cannot write" in proc.stderr
