"""The S3 stores with real processes: two starting at once, two live writers, resuming.

The children are the ones of ``tests/writer/test_conflict.py``
(``tests/children/start_child.py``, ``conflict_child.py``) on an
``s3:BUCKET@URL`` store of moto's local server.  S3 has no lock: a second
live writer is not refused at open but at its first write after the
other's (``Failed("conflict")``), and a write told ``Written`` is never
replaced by one that expected an older revision.  Run with
``CHECKPOINTER_S3_MUTANT=unconditional`` (PUTs without conditions) the
tests of two writers fail.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from checkpointer import load
from tests import stress, torture
from tests._support import ROOT
from tests.s3 import Place

KINDS = ["s3", "s3journal"]
TIMEOUT = 60.0  # a hang guard for a child, never a timing assertion
STARTS = 20
TURNS = 3


@pytest.fixture
def place() -> Iterator[Place]:
    p = Place()
    p.env["PYTHONPATH"] = str(ROOT)
    yield p
    p.close()


class Agent:
    """A conflict_child.py process on one key: send commands, read its JSON lines."""

    def __init__(self, place: Place, kind: str, name: str, *, resume: bool = False) -> None:
        child = ROOT / "tests" / "children" / "conflict_child.py"
        args = [sys.executable, str(child), place.spec(kind), "shared", name]
        self.proc = subprocess.Popen(
            args + ["--resume"] * resume,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=place.env,
        )
        self.send("go")
        self.loaded = self.read("loaded")
        self.opened = self.read("open")

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def read(self, step: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"the child ended before {step!r}: {self.finish()}")
        got: dict[str, Any] = json.loads(line)
        assert got["step"] == step, got
        return got

    def append(self, text: str) -> dict[str, Any]:
        self.send(f"append {text}")
        return self.read("append")

    def close(self) -> dict[str, Any]:
        self.send("close")
        closed = self.read("closed")
        self.finish()
        return closed

    def finish(self) -> str:
        try:
            _, err = self.proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return err


def contents(place: Place, kind: str) -> list[str]:
    checkpoint = load(place.store(kind), "shared")
    assert checkpoint is not None
    return [m["content"] for m in checkpoint.state["messages"]]


def start_at_once(place: Place, kind: str, keys: list[str]) -> dict[tuple[str, str], Any]:
    """Two start_child processes on ``keys``, told to go at one moment; what each ran."""
    child = [sys.executable, "-m", "tests.children.start_child", place.spec(kind)]
    procs = {
        name: subprocess.Popen(
            [*child, name, str(TURNS), *keys],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=place.env,
            cwd=ROOT,
        )
        for name in ("a", "b")
    }
    for proc in procs.values():
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    ran: dict[tuple[str, str], Any] = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=TIMEOUT * 2)
        assert proc.returncode == 0, err
        for key, run in json.loads(out).items():
            ran[key, name] = run
    return ran


@pytest.mark.parametrize("kind", KINDS)
def test_two_processes_started_at_once_on_new_keys_never_lose_a_written_state(
    place: Place, kind: str
) -> None:
    """Two processes load 20 new keys (None) and write each at once (resume_from=None):
    for every key, a process whose last result was Written finds all its messages stored;
    the other is refused with a conflict, never told Written while its work is replaced.
    Again on new keys (three rounds at most) until the two overlapped on some key."""
    store = place.store(kind)
    refused = 0
    for round_ in range(3):
        keys = [f"new-{round_}-{i}" for i in range(STARTS)]
        ran = start_at_once(place, kind, keys)
        for key in keys:
            checkpoint = load(store, key)
            assert checkpoint is not None
            stored = checkpoint.state["messages"]
            for name in ("a", "b"):
                run = ran[key, name]
                if run["results"][-1] == "Written:":
                    assert stored[: len(run["messages"])] == run["messages"], (key, run, stored)
                else:
                    refused += 1
                    assert run["results"][-1] == "Failed:conflict", run
        if refused:
            break
    assert refused > 0  # the two did overlap: the case was exercised


@pytest.mark.parametrize("kind", KINDS)
def test_two_live_processes_cannot_both_make_progress(place: Place, kind: str) -> None:
    """A writes; B loads it and opens (no lock refuses B: its open write lands on A's
    checkpoint); A's next write is Failed('conflict') naming B, never a replacement of
    B's; B goes on; what is stored is A's first message and B's."""
    a = Agent(place, kind, "A")
    assert a.append("one")["result"] == "Written"
    b = Agent(place, kind, "B", resume=True)
    assert (b.loaded["n"], b.opened["writes"], b.opened["failures"]) == (1, 1, 0)
    refused = a.append("two")
    assert (refused["result"], refused["reason"]) == ("Failed", "conflict"), refused
    assert f"pid {b.proc.pid} on " in refused["error"]
    assert b.append("mine")["result"] == "Written"
    a_closed = a.close()
    assert (a_closed["result"], a_closed["reason"]) == ("Failed", "conflict")
    assert b.close()["result"] == "Written"
    assert contents(place, kind) == ["A: one", "B: mine"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_process_started_after_the_other_ended_resumes_and_writes(
    place: Place, kind: str
) -> None:
    """B started after A exited loads A's last checkpoint and writes on top of it."""
    a = Agent(place, kind, "A")
    assert a.append("one")["result"] == "Written"
    assert a.close()["failures"] == 0
    b = Agent(place, kind, "B", resume=True)
    assert b.opened["failures"] == 0
    assert b.append("two")["result"] == "Written"
    assert b.close()["failures"] == 0
    assert contents(place, kind) == ["A: one", "B: two"]


def test_kills_at_random_moments_lose_nothing() -> None:
    """The torture command on S3JournalStore (a commit is two objects), smoke size: after
    each SIGKILL the key loads, holds exactly one state the child produced, at least as
    new as its last Written (the full run: python -m tests.torture --store s3 ...)."""
    summary = torture.run(5, store="s3journal", max_bytes=512 << 10)
    assert summary.losses == 0, "\n".join(summary.lines())
    assert summary.kills == 5 and summary.writes >= 5


@pytest.mark.parametrize(("kind", "backend"), [("s3", "asyncio"), ("s3journal", "trio")])
def test_the_stress_model_holds_on_s3(kind: str, backend: str) -> None:
    """The stress suite's model, smoke size: appends, edits, reverts, writes at random;
    at every quiet point the stored checkpoint is the session; nothing older replaces newer."""
    summary = stress.run_one(stress.Spec(kind, backend, 11, ops=60, group="base"))
    assert summary.problems == [] and summary.quiet_checks >= 1
