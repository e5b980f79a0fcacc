"""Fork pools ended by ``terminate()`` while a writer is open: every one ends.

A worker forked from a process whose writer installed our SIGTERM handler
must die of ``pool.terminate()``'s SIGTERM, or ``terminate()`` waits on it
forever.  The races behind that show only under load and only in some rounds,
so the pool test runs ``tests/children/pool_child.py`` (real processes, real
files) for a number of rounds on each backend with a CPU-burning process per
core beside it.  ``CHECKPOINTER_FORK_POOL_ROUNDS`` sets the rounds (default
8, two pools each; before the fix about one round in four hung).  A hang
fails the test after the hang guard, naming the round; the 30 s guard is
never a timing assertion.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpointer import FileStore, load
from tests._support import CHILDREN, HANG_GUARD

CHILD = CHILDREN / "pool_child.py"
ROUNDS = int(os.environ.get("CHECKPOINTER_FORK_POOL_ROUNDS", "8"))


@pytest.fixture(scope="module")
def cpu_load() -> Iterator[None]:
    """A CPU-burning process per core while the module's tests run."""
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 2)
    ]
    yield
    for burner in burners:
        burner.kill()
        burner.wait()


def run_child(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    """The program, its stderr in ``tmp_path/stderr``, its workers in its own process group."""
    with open(tmp_path / "stderr", "w") as err:
        return subprocess.Popen(
            [sys.executable, str(CHILD), str(tmp_path / "root"), *args],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
        )


def lines_of(proc: subprocess.Popen[str]) -> queue.Queue[str | None]:
    """The program's stdout, a line at a time (None at its end), read by a thread."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        with proc.stdout:
            for line in proc.stdout:
                lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def kill_group(proc: subprocess.Popen[str], tmp_path: Path) -> str:
    """Kill the program and its workers; its stderr, for the report."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return (tmp_path / "stderr").read_text()


@pytest.mark.parametrize("backend", ["asyncio", "trio", "sync"])
def test_pool_terminate_under_load(cpu_load: None, tmp_path: Path, backend: str) -> None:
    """Every fork pool's terminate() returns, under load; the parent's writer goes on."""
    proc = run_child(tmp_path, "--backend", backend, "--rounds", str(ROUNDS))
    lines = lines_of(proc)
    said: list[str] = []
    while not said or said[-1] != "DONE":
        try:
            line = lines.get(timeout=HANG_GUARD)
        except queue.Empty:
            err = kill_group(proc, tmp_path)
            pytest.fail(f"hang guard: pool.terminate() never returned after {said[-1:]}\n{err}")
        if line is None:
            pytest.fail(f"the program ended after {said[-1:]}\n{kill_group(proc, tmp_path)}")
        said.append(line)
    assert proc.wait(HANG_GUARD) == 0, kill_group(proc, tmp_path)
    assert said[1:] == [f"ROUND {i}" for i in range(1, ROUNDS + 1)] + ["DONE"]
    cp = load(FileStore(tmp_path / "root"), "k")
    assert cp is not None and cp.meta.writer is not None
    assert (cp.state, cp.meta.live, cp.meta.writer.pid) == ({"rounds": ROUNDS}, False, proc.pid)


def test_sigterm_before_the_child_first_runs(tmp_path: Path) -> None:
    """A SIGTERM sent to a fork child before it has run at all kills it.

    The program forks while a writer is open and SIGTERMs the child at once,
    both on one CPU under SCHED_FIFO, so the child has not run yet: what a
    pool ended as soon as it is made does to its newest workers on a loaded
    machine.
    """
    proc = run_child(tmp_path, "--early-sigterm")
    out, _ = proc.communicate(timeout=HANG_GUARD)
    if "SKIP" in out:
        pytest.skip(out.strip())
    err = (tmp_path / "stderr").read_text()
    assert proc.returncode == 0, err
    assert out.split() == ["PID", str(proc.pid), "CHILD", str(-signal.SIGTERM)], err


def alive_in_group(group: int) -> list[str]:
    """The pids of the group's processes that have not ended (zombies have)."""
    out = subprocess.run(
        ["ps", "-o", "pid=,stat=", "-g", str(group)], capture_output=True, text=True
    ).stdout
    return [pid for pid, stat in (line.split() for line in out.splitlines()) if stat[0] != "Z"]


@pytest.mark.parametrize("backend", ["asyncio", "trio", "sync"])
def test_the_children_a_sigterm_missed_end_with_the_program(tmp_path: Path, backend: str) -> None:
    """A SIGTERM the program dies of, after its final write, ends the children it missed.

    The process group's SIGTERM misses the workers a pool forks after it:
    those forked while the final write runs (the signal's own, here) end as
    they start; daemonic ones (a pool's, busy here) get SIGTERM as at any exit.
    Without that they outlive the program, waiting on their task queue for good.
    """
    proc = run_child(tmp_path, "--fork-in-flush", "--backend", backend)
    assert proc.stdout is not None
    with proc.stdout:  # the worker may hold it open: read the program's lines, not to EOF
        assert proc.stdout.readline().split()[0] == "PID"
        assert proc.stdout.readline().strip() == "READY"
        os.kill(proc.pid, signal.SIGTERM)  # the program only: its children are ours to see
        forked = proc.stdout.readline()
    assert proc.wait(HANG_GUARD) == -signal.SIGTERM, kill_group(proc, tmp_path)
    assert forked.startswith("FORKED")
    for _ in range(int(HANG_GUARD / 0.1)):  # reparented, they end as the signal lands
        if not alive_in_group(proc.pid):
            break
        time.sleep(0.1)
    left = alive_in_group(proc.pid)
    kill_group(proc, tmp_path)
    assert not left, f"{forked.strip()}; alive: {left}"
    cp = load(FileStore(tmp_path / "root"), "k")
    assert cp is not None and cp.meta.writer is not None and cp.meta.writer.pid == proc.pid
