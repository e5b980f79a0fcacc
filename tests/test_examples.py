"""The examples run as their docstrings say."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from checkpointer import FileStore, load, load_summary

ROOT = Path(__file__).resolve().parent.parent


def run_example(root: Path, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "resume_session.py"), "--root", str(root), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_resume_session_resumes_what_an_earlier_run_wrote(tmp_path: Path) -> None:
    """Run 1 stops mid-tool and its file is repaired; run 2 (on trio) resumes it: the
    history is sendable, the older part is collapsed, created_at is kept."""
    first = run_example(tmp_path)
    assert "new session 'example-session'" in first
    assert "1 tool call(s) closed and 1 running tool(s) settled" in first
    after_first = load(FileStore(tmp_path), "example-session")
    assert after_first is not None
    second = run_example(tmp_path, "--backend", "trio")
    assert "resumed 'example-session': 14 messages" in second
    assert after_first.meta.created_at.isoformat() in second
    assert "history is sendable" in second
    assert "collapsed messages before 6 into a summary" in second
    after_second = load(FileStore(tmp_path), "example-session")
    assert after_second is not None
    assert after_second.meta.created_at == after_first.meta.created_at
    assert after_second.meta.seq > after_first.meta.seq
    summary = load_summary(tmp_path, "example-session")
    assert summary is not None and "question 0" in summary.summary
