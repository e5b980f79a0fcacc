"""The README's "When a write fails" check says saved exactly when the final write was.

Issue 16: it checked ``statistics().last_failure``, which stays after later
writes succeed, so a session saved after one transient failure was reported
as not saved.  The block runs as written, its ``pass  # your work`` replaced.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from checkpointer import FileStore, load

from .docblocks import ROOT, python_blocks

_WORK = "    pass  # your work\n"


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
