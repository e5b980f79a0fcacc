"""Shared fixtures: both anyio backends, a fake clock, fault-injecting stores."""

from __future__ import annotations

import errno
import math
import os
import subprocess
import time
from collections.abc import Sequence
from typing import Any

import anyio
import pytest

from checkpointer import FileStore
from checkpointer._stores.atomic import write_atomic

# Tests start child processes from several threads at once; CPython's vfork
# path then failed here now and then with EFAULT ("Bad address") in Popen.
# Plain fork is slower by a little and has no such race.
subprocess._USE_VFORK = False  # type: ignore[misc]


# The longest modules go first (about 100-300 CPU-s each, a module on one worker: pyproject's
# --dist loadfile, --no-loadscope-reorder keeps this order): the last modules handed out are
# short ones, so neither worker runs a long one alone at the end.  The rest keep their order.
LONGEST = (
    "tests/docs/test_quality.py",
    "tests/docs/test_benchmarks.py",
    "tests/adapters/test_langgraph_owners.py",
    "tests/docs/test_site.py",
    "tests/reliability/test_powercut_command.py",
    "tests/adapters/test_google_adk.py",
    "tests/stores/s3/test_processes.py",
    "tests/adapters/test_claude_agent_sdk_cli.py",
    "tests/adapters/test_pydantic_ai_owner.py",
    "tests/adapters/test_openai_agents_server.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    first = {module: rank for rank, module in enumerate(LONGEST)}
    items.sort(key=lambda item: first.get(item.nodeid.partition("::")[0], len(first)))


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Every async test runs on asyncio and on trio."""
    return str(request.param)


class FakeClock:
    """Virtual time that moves only when the test says so and the writer is idle.

    The writer sleeps on this clock; ``advance(t)`` moves time forward to
    ``t`` one sleeper deadline at a time, and before each step waits until the
    writer is asleep again (not inside a write in a worker thread).  So a
    write never appears to take virtual time, and tests assert exact times.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, anyio.Event]] = []

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        entry = (self._now + seconds, anyio.Event())
        self._sleepers.append(entry)
        try:
            await entry[1].wait()
        finally:
            self._sleepers.remove(entry)

    def next_deadline(self) -> float:
        """The earliest deadline a task sleeps until (inf if none)."""
        return min((d for d, _ in self._sleepers), default=math.inf)

    async def wait_for_deadline(self) -> None:
        """Wait (real time, bounded) until a sleeper has a finite deadline.

        For wake-ups that cross threads: the callback lands on the loop a
        moment after the thread that scheduled it is done.
        """
        deadline = time.monotonic() + 10.0
        while math.isinf(self.next_deadline()):
            if time.monotonic() > deadline:
                raise AssertionError("no task ever slept until a finite deadline")
            await anyio.sleep(0.0005)

    async def settle(self, sleepers: int = 1) -> None:
        """Wait (in real time, bounded) until ``sleepers`` tasks sleep here."""
        deadline = time.monotonic() + 10.0
        while True:
            await anyio.wait_all_tasks_blocked()
            if len(self._sleepers) >= sleepers:
                return
            if time.monotonic() > deadline:
                raise AssertionError("the writer never went idle on the fake clock")
            await anyio.sleep(0.0005)

    async def advance(self, to: float, sleepers: int = 1) -> None:
        """Move virtual time to ``to``, waking sleepers in deadline order."""
        assert to >= self._now, f"time runs forward: {to} < {self._now}"
        while True:
            await self.settle(sleepers)
            due = [d for d, _ in self._sleepers if d <= to and not math.isinf(d)]
            if not due:
                self._now = to
                return
            self._now = max(self._now, min(due))
            for d, event in list(self._sleepers):
                if d <= self._now:
                    event.set()
            await anyio.wait_all_tasks_blocked()

    async def step(self, seconds: float, sleepers: int = 1) -> None:
        await self.advance(self._now + seconds, sleepers)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


class RecordingStore(FileStore):
    """A real FileStore that records when (on a clock) each write happened."""

    def __init__(self, root: Any, clock: FakeClock | None = None) -> None:
        super().__init__(root)
        self.clock = clock
        self.write_times: list[float] = []
        self.written: list[bytes] = []

    def write(self, key: str, chunks: Sequence[bytes], **kw: Any) -> int:
        n = super().write(key, chunks, **kw)
        self.write_times.append(self.clock.now() if self.clock else time.monotonic())
        self.written.append(b"".join(chunks))
        return n


class FaultyStore(FileStore):
    """A real FileStore whose writes fail while ``failing`` is set.

    ``fail_at`` chooses the step that fails: ``"write"`` (ENOSPC before the
    temp file is made), ``"fsync"`` (EIO after the bytes were written) or
    ``"replace"`` (EIO on the rename).  Failures go through the real atomic
    write path, so temp-file cleanup is exercised for real.
    """

    def __init__(
        self, root: Any, *, fail_at: str = "write", clock: FakeClock | None = None
    ) -> None:
        super().__init__(root)
        self.failing = False
        self.fail_at = fail_at
        self.attempts = 0
        self.clock = clock
        self.attempt_times: list[float] = []

    def write(self, key: str, chunks: Sequence[bytes], **kw: Any) -> int:
        self.attempts += 1
        self.attempt_times.append(self.clock.now() if self.clock else time.monotonic())
        if not self.failing:
            return super().write(key, chunks, **kw)
        if self.fail_at == "write":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.location(key))

        def eio(*args: object, **kwargs: object) -> None:
            raise OSError(errno.EIO, os.strerror(errno.EIO))

        if self.fail_at == "fsync":
            return write_atomic(self.location(key), chunks, fsync=eio)
        return write_atomic(self.location(key), chunks, replace=eio)
