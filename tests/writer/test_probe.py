"""Probing a store during a retry backoff: back within a probe interval of an outage's end.

The rule is the scheduler's (``next_probe``, ``probed``), in tables of exact
times; the writer carries it out on a fake clock against a store that is
"down" until a given virtual time.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from checkpointer import CheckpointWriter, FileStore, Limits, Snapshot, load
from checkpointer._schedule import WRITE, Outcome, Scheduler, Wait
from checkpointer.stores import ProbingStore
from tests.conftest import FakeClock


def scheduler(**kw: Any) -> Scheduler:
    options: dict[str, Any] = {
        "debounce": 0.0,
        "min_interval": 0.0,
        "max_wait": 1.0,
        "backoff_initial": 1.0,
        "backoff_max": 32.0,
        "probe_interval": 1.0,
    }
    options.update(kw)
    return Scheduler(**options)


@pytest.mark.parametrize(
    ("outcome", "failures", "probe"),
    [
        (Outcome.STORE_FAILED, 1, None),  # backoff 1 s: no longer than the interval
        (Outcome.STORE_FAILED, 2, 11.0),  # backoff 2 s: a probe 1 s after the failure
        (Outcome.STORE_FAILED, 5, 11.0),  # backoff 16 s: likewise
        (Outcome.FAILED, 5, None),  # refused before the store: nothing to probe
        (Outcome.CANCELLED, 5, None),
    ],
)
def test_a_probe_is_due_an_interval_after_a_store_failure(
    outcome: Outcome, failures: int, probe: float | None
) -> None:
    """Only a failure inside the store, with a backoff past probe_interval, asks for a probe."""
    sched = scheduler()
    sched.failures = failures - 1
    sched.event(9.0)
    sched.begin_write(9.0)
    sched.end_write(10.0, outcome)
    assert sched.next_probe() == probe


def test_probes_repeat_until_ready_then_the_write_is_due() -> None:
    """No: the next probe one interval later (never past the backoff); yes: WRITE at once."""
    sched = scheduler(backoff_initial=4.0)
    sched.event(0.0)
    sched.begin_write(0.0)
    sched.end_write(0.0, Outcome.STORE_FAILED)  # retry at 4.0
    assert sched.decide(0.0) == Wait(4.0) and sched.next_probe() == 1.0
    sched.probed(1.0, ready=False)
    assert sched.next_probe() == 2.0
    sched.probed(2.0, ready=False)
    sched.probed(3.0, ready=False)
    assert sched.next_probe() is None  # 4.0 is the retry itself
    sched.event(3.5)  # more changes meanwhile do not move the probe or the retry
    assert sched.decide(3.5) == Wait(4.0)
    sched.begin_write(4.0)
    sched.end_write(4.0, Outcome.STORE_FAILED)  # second failure: retry at 12.0
    assert sched.decide(4.0) == Wait(12.0) and sched.next_probe() == 5.0
    sched.probed(5.0, ready=True)
    assert sched.next_probe() is None
    assert sched.decide(5.0) is WRITE  # the oldest change waited past max_wait
    assert sched.failures == 2  # a new failure goes on doubling the backoff


def test_a_ready_store_is_written_at_once_despite_min_interval() -> None:
    """After a yes, min_interval since the failed attempt does not hold the write back."""
    sched = scheduler(min_interval=2.0, max_wait=2.0, backoff_initial=4.0)
    sched.event(0.0)
    sched.begin_write(2.0)
    sched.end_write(2.0, Outcome.STORE_FAILED)
    sched.probed(2.5, ready=False)
    assert sched.decide(2.75) == Wait(6.0) and sched.next_probe() == 3.5
    sched.probed(3.5, ready=True)
    assert sched.decide(3.5) is WRITE  # not Wait(4.0): the failed attempt's spacing is gone
    sched.begin_write(3.5)
    sched.end_write(3.5, Outcome.WRITTEN)
    sched.event(3.5)
    assert sched.decide(3.5) == Wait(5.5)  # the next write keeps its spacing again


def test_nothing_pending_or_a_write_running_is_no_probe() -> None:
    """A probe is only for changes waiting out a backoff."""
    sched = scheduler(backoff_initial=4.0)
    sched.begin_write(0.0)  # a forced write with nothing pending
    sched.end_write(0.0, Outcome.STORE_FAILED)
    assert sched.next_probe() == 1.0  # its state is pending again
    sched.begin_write(0.5)
    assert sched.next_probe() is None
    sched.end_write(0.5, Outcome.WRITTEN)
    assert sched.next_probe() is None


class OutageStore(FileStore):
    """A real FileStore that is unreachable until ``back_at`` on the clock, and can say so."""

    def __init__(self, root: Path, clock: FakeClock, back_at: float) -> None:
        super().__init__(root)
        self.clock = clock
        self.back_at = back_at
        self.attempts: list[float] = []
        self.probes: list[float] = []

    def write(self, key: str, chunks: Sequence[bytes], **kw: Any) -> int:
        self.attempts.append(self.clock.now())
        if self.clock.now() < self.back_at:
            raise OSError(errno.ECONNREFUSED, os.strerror(errno.ECONNREFUSED))
        return super().write(key, chunks, **kw)

    def probe(self) -> bool:
        self.probes.append(self.clock.now())
        return self.clock.now() >= self.back_at


@pytest.mark.anyio
async def test_writer_retries_within_a_probe_interval_of_recovery(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Outage from 0 to 3.6: the write lands at 3.75 (the next probe), not at the 7.5 retry."""
    store = OutageStore(tmp_path, clock, back_at=3.6)
    assert isinstance(store, ProbingStore)
    state = {"n": 0}
    writer = CheckpointWriter(
        lambda: Snapshot("s1", state),
        store,
        exit_hooks=False,
        write_on_start=False,
        clock=clock,
        debounce=0.0,
        min_interval=0.0,
        max_wait=1.0,
        limits=Limits(retry_initial=0.5, retry_max=64.0),
    )
    async with writer:
        writer.notify()
        await clock.advance(10.0)
        # retries at 0, 0.5, 1.5, 3.5 (backoff 0.5, 1, 2), then 7.5 would be due;
        # a probe every 0.25 s of each backoff, until one says yes
        assert store.attempts == [0.0, 0.5, 1.5, 3.5, 3.75]
        failed_at = [0.0, 0.5, 1.5, 3.5]
        retry_at = [0.5, 1.5, 3.5, 7.5]
        expected = [
            f + 0.25 * i
            for f, r in zip(failed_at, retry_at, strict=True)
            for i in range(1, int((r - f) / 0.25))
        ]
        assert store.probes == [p for p in expected if p <= 3.75]
        assert writer.statistics().failure_streak == 0
    checkpoint = load(store, "s1")
    assert checkpoint is not None and checkpoint.state == {"n": 0}
