"""The examples run, survive a real kill, and resume from the bytes on disk."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from checkpointer import Checkpoint, FileStore, JournalStore, load
from checkpointer.messages import validate_history
from checkpointer.summaries import load_summary
from tests._support import ROOT

EXAMPLES = ROOT / "examples"
TIMEOUT = 30.0


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Child:
    """An example running in a subprocess, its output read as it comes."""

    def __init__(self, script: str, *args: str | Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-u", str(EXAMPLES / script), *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # Ctrl-C as a terminal sends it, even when the suite runs as a background job
            # (whose children start with SIGINT ignored).
            preexec_fn=_sigint_default,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: str) -> re.Match[str]:
        """Wait until a line of output matches ``pattern``."""
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if match := re.search(pattern, line):
                    return match
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.005)
        _, out, err = self.finish(signal.SIGKILL)
        raise AssertionError(f"no line matched {pattern!r}:\n{out}\n{err}")

    def finish(self, signum: int | None = None) -> tuple[int, str, str]:
        """Send ``signum`` (if any), wait; return (status, stdout, stderr)."""
        if signum is not None and self.proc.poll() is None:
            self.proc.send_signal(signum)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        with self.proc.stdout, self.proc.stderr:
            try:
                status = self.proc.wait(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                raise AssertionError(f"still running {TIMEOUT} s after signal {signum}") from None
            err = self.proc.stderr.read()
            self._reader.join(timeout=TIMEOUT)
        return status, "\n".join(self.lines), err


def run(script: str, *args: str | Path) -> str:
    """Run an example to the end; return its output."""
    status, out, err = Child(script, *args).finish()
    assert status == 0, f"{out}\n{err}"
    return out


def checkpoint(root: Path, key: str) -> Checkpoint[Any]:
    found = load(FileStore(root), key)
    assert found is not None, f"no checkpoint {key!r} in {root}"
    return found


# -- the agent, on asyncio and on trio -------------------------------------------

AGENTS = {"asyncio": ("agent_asyncio.py", "agent-asyncio"), "trio": ("agent_trio.py", "agent-trio")}
TURNS = 6
FAST = ["--pause", "0.02", "--max-tools", "3"]
TIMERS = ["--debounce", "0.02", "--min-interval", "0.05", "--max-wait", "0.2"]


def user_tasks(messages: list[dict[str, Any]]) -> list[int]:
    return [int(m["content"].split()[1].rstrip(":")) for m in messages if m["role"] == "user"]


def assert_complete(messages: list[dict[str, Any]], turns: int) -> None:
    """Every turn once, in order, each tool call answered once, ending with an answer."""
    assert user_tasks(messages) == list(range(turns))
    assert validate_history(messages) == []
    calls = [c["id"] for m in messages for c in m.get("tool_calls", [])]
    answers = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
    assert sorted(calls) == sorted(answers)
    assert messages[-1]["role"] == "assistant" and "tool_calls" not in messages[-1]


def resume_turn(messages: list[dict[str, Any]]) -> int:
    """The turn the file says comes next (what the example must resume at)."""
    users = len(user_tasks(messages))
    last = messages[-1] if messages else None
    finished = last is None or (last["role"] == "assistant" and "tool_calls" not in last)
    return users if finished else users - 1


@pytest.mark.parametrize(
    ("backend", "signum", "status"),
    [
        ("asyncio", signal.SIGTERM, -signal.SIGTERM),
        ("asyncio", signal.SIGINT, 130),
        ("asyncio", signal.SIGKILL, -signal.SIGKILL),
        ("trio", signal.SIGINT, 130),
    ],
    ids=["asyncio-TERM", "asyncio-INT", "asyncio-KILL", "trio-INT"],
)
def test_agent_resumes_after_a_kill(
    tmp_path: Path, backend: str, signum: signal.Signals, status: int
) -> None:
    """Killed mid-run, the agent's file is whole; a rerun resumes where it says and finishes.

    The rerun also reports fewer writes than run-ended events: it coalesced.
    """
    script, key = AGENTS[backend]
    args = ["--root", str(tmp_path), "--turns", str(TURNS), *FAST, *TIMERS]
    child = Child(script, *args)
    child.wait_for(r"^turn 2 done")
    code, out, err = child.finish(signum)
    assert code == status, f"{out}\n{err}"

    on_disk = checkpoint(tmp_path, key)
    messages = on_disk.state["messages"]
    if signum == signal.SIGKILL:  # no final write: the file is what the timer wrote
        assert on_disk.meta.live is True
        assert on_disk.meta.seq >= 2
    else:  # the exit flush wrote the last state, every finished turn in it
        assert on_disk.meta.live is False
        assert len(user_tasks(messages)) >= 3
    if signum == signal.SIGINT:
        assert "run again to resume" in err

    again = run(script, *args)
    start = resume_turn(messages)
    assert f"resumed {key!r} at turn {start} " in again
    assert f"turn {start} done" in again and f"turn {start - 1} done" not in again
    assert f"turn {TURNS - 1} done" in again
    coalesced = re.search(r"coalesced (\d+) run-ended events into (\d+) writes", again)
    assert coalesced is not None, again
    assert 0 < int(coalesced[2]) < int(coalesced[1])
    final = checkpoint(tmp_path, key)
    assert final.meta.live is False
    assert final.meta.seq > on_disk.meta.seq
    assert final.state["messages"][: len(messages)] == messages  # the past is kept
    assert_complete(final.state["messages"], TURNS)


def _open_calls_on_disk(root: Path, key: str) -> bool:
    """Whether the checkpoint on disk ends with tool calls not all answered yet."""
    found = load(FileStore(root), key)
    if found is None:
        return False
    messages = found.state["messages"]
    for message in reversed(messages):
        if message["role"] == "assistant":
            return bool(message.get("tool_calls"))
    return False


def test_trio_agent_ctrl_c_during_tools_exits_130(tmp_path: Path) -> None:
    """Ctrl-C while trio's tool nursery runs: the message, status 130, no exception-group traceback.

    Issue 16: the KeyboardInterrupt came out of the nursery in a
    BaseExceptionGroup, past ``except KeyboardInterrupt``.  Turn 0 plans four
    tools that each sleep 0.2-0.47 x pause: the checkpoint shows them open
    for about a second with ``--pause 2``.
    """
    args = ["--root", str(tmp_path), "--turns", "3", "--pause", "2", "--max-tools", "4", *TIMERS]
    child = Child("agent_trio.py", *args)
    deadline = time.monotonic() + TIMEOUT
    while not _open_calls_on_disk(tmp_path, "agent-trio"):
        alive = child.proc.poll() is None
        assert time.monotonic() < deadline and alive, child.finish(signal.SIGKILL)
        time.sleep(0.005)
    code, out, err = child.finish(signal.SIGINT)
    assert code == 130, f"{out}\n{err}"
    assert "interrupted: the session is on disk; run again to resume" in err
    assert "Traceback" not in err, err
    assert checkpoint(tmp_path, "agent-trio").meta.live is False


def test_journal_session_ctrl_c_exits_130_and_keeps_the_session(tmp_path: Path) -> None:
    """Ctrl-C in the journal example: status 130, the message, no traceback, the journal final."""
    child = Child("journal_session.py", "--root", tmp_path, "--turns", "100000000")
    child.wait_for(r"^Written\(")
    code, out, err = child.finish(signal.SIGINT)
    assert code == 130, f"{out}\n{err}"
    assert "interrupted: the session is on disk; run again to resume" in err
    assert "Traceback" not in err, err
    found = load(JournalStore(tmp_path), "demo-journal")
    assert found is not None and found.meta.live is False


def test_journal_session_sigterm_writes_the_last_state(tmp_path: Path) -> None:
    """SIGTERM in the journal example: its exit hooks write the session a final time."""
    child = Child("journal_session.py", "--root", tmp_path, "--turns", "100000000")
    child.wait_for(r"^Written\(")
    code, out, err = child.finish(signal.SIGTERM)
    assert code == -signal.SIGTERM, f"{out}\n{err}"
    found = load(JournalStore(tmp_path), "demo-journal")
    assert found is not None and found.meta.live is False


# -- the benchmark harness ---------------------------------------------------------

CASES = "sum-range,sort-floats,json-roundtrip,sha256"


def test_benchmark_resumes_at_first_case_not_done(tmp_path: Path) -> None:
    """After kill -9 the harness reruns no finished case and starts at the first not done."""
    args = ["--root", str(tmp_path), "--cases", CASES, "--size", "300", "--repeat", "2"]
    args += [
        "--delay",
        "0.05",
        "--debounce",
        "0.01",
        "--min-interval",
        "0.02",
        "--max-wait",
        "0.05",
    ]
    child = Child("benchmark_harness.py", *args)
    child.wait_for(r"^case 2/4 sort-floats: .*\[saved: Written\]")
    code, out, err = child.finish(signal.SIGKILL)
    assert code == -signal.SIGKILL, f"{out}\n{err}"

    killed = checkpoint(tmp_path, "bench")
    done = killed.state["results"]
    assert killed.meta.live is True
    assert list(done)[:2] == ["sum-range", "sort-floats"]  # saved before it said so
    first = next(c for c in CASES.split(",") if c not in done)

    again = run("benchmark_harness.py", *args)
    assert f"{len(done)} of 4 cases done; starting at {first!r}" in again
    for name in done:
        assert f" {name}: median" not in again  # not run a second time
    final = checkpoint(tmp_path, "bench")
    assert list(final.state["results"]) == CASES.split(",")
    for name, result in done.items():
        assert final.state["results"][name] == result
    assert final.state["current"] is None and final.meta.live is False


# -- the synchronous script with only the exit flush -----------------------------


def squares(n: int) -> list[dict[str, int]]:
    return [{"item": i, "square": i * i} for i in range(n)]


def test_atexit_script_sigterm_then_resume(tmp_path: Path) -> None:
    """SIGTERM: the exit flush writes every finished item; a rerun goes on from there."""
    args = ["--root", str(tmp_path), "--items", "8", "--delay", "0.03"]
    child = Child("atexit_script.py", *args)
    child.wait_for(r"^item 3 done")
    code, out, err = child.finish(signal.SIGTERM)
    assert code == -signal.SIGTERM, f"{out}\n{err}"
    on_disk = checkpoint(tmp_path, "atexit-script")
    done = on_disk.state["done"]
    assert 4 <= len(done) < 8 and done == squares(len(done))
    assert on_disk.meta.live is False

    again = run("atexit_script.py", *args)
    assert f"resumed 'atexit-script' at item {len(done)} " in again
    assert f"item {len(done) - 1} done" not in again
    final = checkpoint(tmp_path, "atexit-script")
    assert final.state["done"] == squares(8) and final.meta.live is False


def test_atexit_script_sigkill_keeps_the_start(tmp_path: Path) -> None:
    """kill -9 skips the exit flush: the file holds the state the run started from."""
    args = ["--root", str(tmp_path), "--items", "30", "--delay", "0.03"]
    child = Child("atexit_script.py", *args)
    child.wait_for(r"^item 2 done")
    code, _, _ = child.finish(signal.SIGKILL)
    assert code == -signal.SIGKILL
    on_disk = checkpoint(tmp_path, "atexit-script")
    assert on_disk.state["done"] == [] and on_disk.meta.live is True  # what open() wrote


# -- resuming a session an earlier run wrote --------------------------------------


def test_resume_session_resumes_what_an_earlier_run_wrote(tmp_path: Path) -> None:
    """Run 1 stops mid-tool and its file is repaired; run 2 (on trio) resumes it: the
    history is sendable, the older part is collapsed, created_at is kept."""
    first = run("resume_session.py", "--root", tmp_path)
    assert "new session 'example-session'" in first
    assert "1 tool call(s) closed and 1 running tool(s) settled" in first
    after_first = checkpoint(tmp_path, "example-session")
    assert validate_history(after_first.state["messages"]) == []
    second = run("resume_session.py", "--root", tmp_path, "--backend", "trio")
    assert "resumed 'example-session': 14 messages" in second
    assert after_first.meta.created_at.isoformat() in second
    assert "history is sendable" in second
    assert "collapsed messages before 6 into a summary" in second
    after_second = checkpoint(tmp_path, "example-session")
    assert after_second.meta.created_at == after_first.meta.created_at
    assert after_second.meta.seq > after_first.meta.seq
    summary = load_summary(tmp_path, "example-session")
    assert summary is not None and "question 0" in summary.summary


# -- every example: its flags documented, its session resumed by default --------------


def _undocumented(help_text: str) -> list[str]:
    """The options of an argparse --help text that have no help of their own."""
    lines = help_text.split("options:", 1)[1].splitlines()
    missing = []
    for i, line in enumerate(lines):
        if not line.startswith("  -"):
            continue
        follows = lines[i + 1] if i + 1 < len(lines) else ""
        continued = follows.startswith(" " * 8) and not follows.lstrip().startswith("-")
        if not re.search(r"\S {2,}\S", line.strip()) and not continued:
            missing.append(line.strip())
    return missing


def test_every_example_documents_its_flags_and_keeps_its_session_in_checkpoints() -> None:
    """Each example's --help gives every flag a help text, and --root defaults to .checkpoints."""
    scripts = sorted(p.name for p in EXAMPLES.glob("*.py"))
    assert len(scripts) >= 6
    children = [Child(script, "--help") for script in scripts]
    for script, child in zip(scripts, children, strict=True):
        status, out, err = child.finish()
        assert status == 0, f"{script}: {err}"
        assert not _undocumented(out), f"{script}: {_undocumented(out)}"
        assert re.search(r"--root ROOT +store directory \(\.checkpoints\)", out), f"{script}\n{out}"


def test_journal_session_resumes_on_a_rerun(tmp_path: Path) -> None:
    """Run twice with no flags, the journal example goes on from the turn the journal holds."""
    runs = []
    for _ in range(2):
        proc = subprocess.run(
            [sys.executable, str(EXAMPLES / "journal_session.py"), "--turns", "8"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        runs.append(proc.stdout)
    assert "resumed" not in runs[0]
    assert "resumed 'demo-journal' at turn 8 (16 messages)" in runs[1]
    journal = tmp_path / ".checkpoints" / "demo-journal.jsonl"
    assert journal.is_file()
