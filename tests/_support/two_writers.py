"""Two processes on one key, on any store a spec names: the children of the conflict tests.

``Terminal`` drives a ``tests/children/conflict_child.py`` (a writer that
appends and closes when told, one JSON line per step); ``start_at_once``
runs two ``tests/children/start_child.py`` told to go at one moment and
``count_refused`` checks what they left.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from checkpointer import load
from checkpointer.stores import Store
from tests._support import CHILDREN, ROOT

TIMEOUT = 60.0  # a hang guard for a child, never a timing assertion


class Terminal:
    """A conflict_child.py process on ``key`` of the store ``spec``: send it commands, read
    its JSON lines.  Its interpreter starts here; ``start`` has it load and open."""

    def __init__(
        self,
        spec: str,
        key: str,
        name: str,
        env: Mapping[str, str],
        *,
        resume: bool = False,
        wait: bool = False,
    ) -> None:
        args = [sys.executable, str(CHILDREN / "conflict_child.py"), spec, key, name]
        self.proc = subprocess.Popen(
            args + ["--resume"] * resume + ["--wait"] * wait,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(env),
        )
        self.err: str | None = None
        self.loaded: dict[str, Any] = {}
        self.opened: dict[str, Any] = {}

    def start(self) -> Terminal:
        self.send("go")
        self.loaded = self.read("loaded")
        self.opened = self.read("open")
        return self

    def read(self, step: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # the child prints a line per step, or dies
        if not line:
            raise AssertionError(f"the child ended before {step!r}: {self.finish()}")
        got: dict[str, Any] = json.loads(line)
        assert got["step"] == step, got
        return got

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def append(self, text: str) -> dict[str, Any]:
        self.send(f"append {text}")
        return self.read("append")

    def close(self) -> dict[str, Any]:
        self.send("close")
        closed = self.read("closed")
        self.finish()
        return closed

    def finish(self) -> str:
        """Wait for the child to end (its stdin closed); its stderr."""
        if self.err is None:
            try:
                _, self.err = self.proc.communicate(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                _, self.err = self.proc.communicate()
        return self.err


def start_at_once(
    spec: str, env: Mapping[str, str], keys: Sequence[str], turns: int
) -> dict[tuple[str, str], Any]:
    """Two start_child processes ("a", "b") on ``keys``, told to go at one moment (both
    interpreters up); what each ran, by (key, name)."""
    child = [sys.executable, "-m", "tests.children.start_child", spec]
    procs = {
        name: subprocess.Popen(
            [*child, name, str(turns), *keys],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(env),
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


def count_refused(
    store: Store, keys: Sequence[str], ran: Mapping[tuple[str, str], Any], refusals: Sequence[str]
) -> int:
    """How many runs were refused; for every key, a run whose last result was Written finds
    all its messages stored, and the other ended refused (its last result in ``refusals``),
    never told Written while its work was replaced."""
    count = 0
    for key in keys:
        checkpoint = load(store, key)
        assert checkpoint is not None
        stored = checkpoint.state["messages"]
        for name in ("a", "b"):
            run = ran[key, name]
            if run["results"][-1] == "Written:":
                assert stored[: len(run["messages"])] == run["messages"], (key, run, stored)
            else:
                count += 1
                assert run["results"][-1] in refusals, run
    return count
