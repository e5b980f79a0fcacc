"""The scheduler against an independent model of the timing contract.

A hypothesis state machine plays the writer: it follows ``decide()`` exactly
(a due write starts at once; time never passes a ``Wait(until)`` or the end
of the write in flight), while changes arrive at random times, writes take
random durations and end written, skipped, failed (in or before the store),
cancelled or refused, and forced writes start whenever no write runs.

Two kinds of checks:

* ``Reference`` keeps the changes as a list of event ids (not a
  first/last pair) and recomputes the due time from the contract; the
  scheduler's decision must equal it at every step.
* Contract invariants on the history, which hold whatever the formula: one
  write at a time; a scheduled write starts with a change pending and at
  least ``min_interval`` after the previous write that reached the store
  and, while failing, no sooner than the backoff after the last failure;
  each change is covered by a write that starts by its deadline
  (``max_wait`` after it, pushed only by the end of a write in flight and,
  while failing, by the backoff and by ``min_interval`` after a failed store
  write that covered it); and, once changes stop and writes succeed, every
  change was covered by a written or skipped write that started after it (or
by a refused one, which drops its changes until the next one).

Times are multiples of 0.25, so every sum is exact.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from checkpointer._schedule import IDLE, WRITE, Decision, Outcome, Scheduler, Wait

WRITTEN = Outcome.WRITTEN
SKIPPED = Outcome.SKIPPED
STORE_FAILED = Outcome.STORE_FAILED
FAILED = Outcome.FAILED
CANCELLED = Outcome.CANCELLED
REFUSED = Outcome.REFUSED

SETTLED = (WRITTEN, SKIPPED)
"""Outcomes after which the covered changes are saved (or need no saving)."""
REACHED_STORE = (WRITTEN, STORE_FAILED)
"""Outcomes that count as a write start for ``min_interval``."""

quarters = st.integers(min_value=0, max_value=16).map(lambda n: n / 4)
"""0, 0.25, ... 4.0 seconds."""


@dataclass(frozen=True)
class Config:
    debounce: float
    min_interval: float
    max_wait: float
    backoff_initial: float
    backoff_max: float

    def backoff(self, failures: int) -> float:
        return min(self.backoff_max, self.backoff_initial * 2.0 ** (failures - 1))


@st.composite
def configs(draw: st.DrawFn) -> Config:
    debounce = draw(st.sampled_from([0.0, 0.5, 1.0, 2.0]))
    max_wait = debounce + draw(st.sampled_from([0.0, 0.5, 1.0, 2.0, 4.0]))
    min_interval = draw(st.integers(0, int(max_wait * 4))) / 4
    backoff_initial = draw(st.sampled_from([0.25, 0.5, 1.0, 2.0]))
    backoff_max = backoff_initial * 2 ** draw(st.integers(0, 3))
    return Config(debounce, min_interval, max_wait, backoff_initial, backoff_max)


@dataclass
class Change:
    time: float
    deadline: float
    """Latest start allowed for the next write covering this change."""
    saved_by: float | None = None
    """Start of the written or skipped write that covered it."""


@dataclass(frozen=True)
class Flight:
    start: float
    end: float
    outcome: Outcome
    forced: bool


class Reference:
    """The contract restated on a list of pending changes."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.pending: list[float] = []
        self.in_flight: list[float] = []
        self.writing = False
        self.prev: float | None = None
        self.failures = 0
        self.retry_at: float | None = None

    def begin(self, now: float) -> None:
        # A write with nothing pending still covers the state as of its start.
        self.in_flight, self.pending = self.pending or [now], []
        self.writing = True

    def end(self, now: float, start: float, outcome: Outcome) -> None:
        self.writing = False
        if outcome in REACHED_STORE:
            self.prev = start
        if outcome is REFUSED:  # dropped: nothing to retry until a new change
            pass
        elif outcome in SETTLED:
            self.failures, self.retry_at = 0, None
        else:
            if outcome is not CANCELLED:
                self.failures += 1
                self.retry_at = now + self.config.backoff(self.failures)
            self.pending += self.in_flight
        self.in_flight = []

    def decide(self, now: float) -> Decision:
        if self.writing or not self.pending:
            return IDLE
        c = self.config
        due = min(max(self.pending) + c.debounce, min(self.pending) + c.max_wait)
        if self.prev is not None:
            due = max(due, self.prev + c.min_interval)
        if self.retry_at is not None:
            due = max(due, self.retry_at)
        return WRITE if now >= due else Wait(due)


class SchedulerMachine(RuleBasedStateMachine):
    """Drives a Scheduler as the writer does and checks it against the contract."""

    config: Config
    sched: Scheduler
    ref: Reference

    @initialize(config=configs())
    def start(self, config: Config) -> None:
        self.config = config
        self.sched = Scheduler(
            debounce=config.debounce,
            min_interval=config.min_interval,
            max_wait=config.max_wait,
            backoff_initial=config.backoff_initial,
            backoff_max=config.backoff_max,
        )
        self.ref = Reference(config)
        self.now = 0.0
        self.flight: Flight | None = None
        self.changes: list[Change] = []
        self.pending: list[Change] = []
        self.covered: list[Change] = []
        self.last_store_start: float | None = None
        self.failures = 0
        self.retry_at: float | None = None

    # -- what the driver does ---------------------------------------------------

    @rule(repeat=st.integers(1, 3))
    def change(self, repeat: int) -> None:
        """Changes at ``now``, while idle, waiting, or during a write."""
        for _ in range(repeat):
            self.sched.event(self.now)
            self.ref.pending.append(self.now)
            deadline = self.now + self.config.max_wait
            if self.retry_at is not None:  # failing: the backoff may hold it
                deadline = max(deadline, self.retry_at)
            change = Change(self.now, deadline)
            self.changes.append(change)
            self.pending.append(change)

    @rule(dt=st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0, 5.0, 100.0]))
    def advance(self, dt: float) -> None:
        """Time passes, never beyond the end of the write in flight or a due time."""
        target = self.now + dt
        if self.flight is not None:
            target = min(target, self.flight.end)
        else:
            decision = self.sched.decide(self.now)
            if decision is WRITE:
                target = self.now  # the writer starts a due write at once
            elif isinstance(decision, Wait):
                target = min(target, decision.until)
        self.now = target
        if self.flight is not None and self.now == self.flight.end:
            self.end_write()

    @precondition(lambda self: self.flight is None and self.sched.decide(self.now) is WRITE)
    @rule(duration=quarters, outcome=st.sampled_from(Outcome))
    def scheduled_write(self, duration: float, outcome: Outcome) -> None:
        """The write decide() asked for."""
        self.begin_write(duration, outcome, forced=False)

    @precondition(lambda self: self.flight is None)
    @rule(duration=quarters, outcome=st.sampled_from(Outcome))
    def forced_write(self, duration: float, outcome: Outcome) -> None:
        """write_now() or the final write: starts whatever decide() says."""
        self.begin_write(duration, outcome, forced=True)

    def begin_write(self, duration: float, outcome: Outcome, *, forced: bool) -> None:
        assert self.flight is None, "two writes at once"
        if not forced:
            assert self.pending, f"scheduled write at {self.now} with nothing pending"
            if self.last_store_start is not None:
                gap = self.now - self.last_store_start
                assert gap >= self.config.min_interval, (
                    f"write at {self.now} only {gap}s after the one at {self.last_store_start}"
                )
            if self.retry_at is not None:
                assert self.now >= self.retry_at, (
                    f"retry at {self.now} before the backoff ends at {self.retry_at}"
                )
        for change in self.pending:
            assert self.now <= change.deadline, (
                f"change at {change.time} first covered at {self.now}, "
                f"after its deadline {change.deadline}"
            )
        self.sched.begin_write(self.now)
        self.ref.begin(self.now)
        # A forced write with nothing pending covers the state as of now:
        # if it fails, that state must still reach the disk.
        now_change = Change(self.now, self.now + self.config.max_wait)
        self.covered, self.pending = self.pending or [now_change], []
        self.flight = Flight(self.now, self.now + duration, outcome, forced)

    def end_write(self) -> None:
        flight = self.flight
        assert flight is not None
        self.flight = None
        self.sched.end_write(self.now, flight.outcome)
        self.ref.end(self.now, flight.start, flight.outcome)
        if flight.outcome in REACHED_STORE:
            self.last_store_start = flight.start
        if flight.outcome is REFUSED:
            for change in self.covered:  # given up: a retry cannot succeed
                change.saved_by = flight.start
        elif flight.outcome in SETTLED:
            self.failures, self.retry_at = 0, None
            for change in self.covered:
                change.saved_by = flight.start
        else:
            if flight.outcome is not CANCELLED:
                self.failures += 1
                self.retry_at = self.now + self.config.backoff(self.failures)
            for change in self.covered:
                if flight.outcome is STORE_FAILED:
                    change.deadline = max(change.deadline, flight.start + self.config.min_interval)
            self.pending += self.covered
        self.covered = []
        for change in self.pending:
            # Nothing starts while a write runs: its end pushes every deadline.
            change.deadline = max(change.deadline, self.now)
            if self.retry_at is not None and flight.outcome is not CANCELLED:
                change.deadline = max(change.deadline, self.retry_at)

    # -- what must hold -----------------------------------------------------------

    @invariant()
    def matches_the_reference(self) -> None:
        """decide() is exactly what the contract's formula says."""
        decision = self.sched.decide(self.now)
        assert decision == self.ref.decide(self.now), (
            f"at {self.now}: scheduler {decision!r}, contract {self.ref.decide(self.now)!r}"
        )

    @invariant()
    def decisions_keep_the_contract(self) -> None:
        """IDLE iff nothing is pending or a write runs; a Wait never outlasts a deadline."""
        decision = self.sched.decide(self.now)
        assert self.sched.pending == bool(self.pending), "pending changes lost or invented"
        if self.flight is not None:
            assert decision is IDLE, f"{decision!r} while a write runs"
        elif self.pending:
            assert decision is not IDLE, "IDLE with changes pending"
            if isinstance(decision, Wait):
                assert decision.until > self.now
                deadline = min(change.deadline for change in self.pending)
                assert decision.until <= deadline, (
                    f"waits until {decision.until}, a change is due by {deadline}"
                )
        else:
            assert decision is IDLE, f"{decision!r} with nothing pending"

    def teardown(self) -> None:
        """Changes stop and writes succeed: every change gets saved."""
        if not hasattr(self, "sched"):
            return
        for _ in range(10):
            self.matches_the_reference()
            self.decisions_keep_the_contract()
            if self.flight is not None:
                self.now = self.flight.end
                self.end_write()
                continue
            decision = self.sched.decide(self.now)
            if decision is IDLE:
                break
            if isinstance(decision, Wait):
                self.now = decision.until
            else:
                self.begin_write(0.5, WRITTEN, forced=False)
        assert self.sched.decide(self.now) is IDLE
        assert not self.sched.pending
        for change in self.changes:
            assert change.saved_by is not None, f"change at {change.time} never saved"
            assert change.saved_by >= change.time


SchedulerMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestScheduler = SchedulerMachine.TestCase
