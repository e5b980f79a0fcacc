"""The timing contract of the pure scheduler, in tables of exact times.

Most tables read "change events at these times -> writes start at these
times": ``replay`` drives a ``Scheduler`` the way the writer does (wake at
each event, at each ``Wait(until)``, at the end of each write; start a write
as soon as ``decide`` says ``WRITE``) on virtual time, with no sleeping.
Times are multiples of 0.25 so every sum is exact in binary floating point.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from checkpointer._schedule import IDLE, WRITE, Decision, Outcome, Scheduler, Wait

WRITTEN = Outcome.WRITTEN
SKIPPED = Outcome.SKIPPED
STORE_FAILED = Outcome.STORE_FAILED
FAILED = Outcome.FAILED
CANCELLED = Outcome.CANCELLED
REFUSED = Outcome.REFUSED


def replay(
    events: Sequence[float],
    *,
    debounce: float = 1.0,
    min_interval: float = 0.0,
    max_wait: float = 10.0,
    duration: float = 0.0,
    outcomes: Sequence[Outcome] = (),
    forced: Sequence[float] = (),
    backoff_initial: float = 1.0,
    backoff_max: float = 60.0,
) -> list[float]:
    """Replay change events (and forced writes) and return the write start times.

    Every write takes ``duration`` seconds and ends with the next of
    ``outcomes`` (``WRITTEN`` once they run out).  At one instant a write
    ends first, then events land, then forced writes start, then the
    scheduler is asked.  Forced writes start whatever ``decide`` says, as
    ``write_now`` does.
    """
    sched = Scheduler(
        debounce=debounce,
        min_interval=min_interval,
        max_wait=max_wait,
        backoff_initial=backoff_initial,
        backoff_max=backoff_max,
    )
    todo_events = sorted(events)
    todo_forced = sorted(forced)
    results = iter(outcomes)
    starts: list[float] = []
    now = 0.0
    write_end: float | None = None

    def begin() -> None:
        nonlocal write_end
        assert write_end is None, "the table asks for two writes at once"
        sched.begin_write(now)
        starts.append(now)
        write_end = now + duration

    for _ in range(1000):
        if write_end is not None and now == write_end:
            sched.end_write(now, next(results, WRITTEN))
            write_end = None
        while todo_events and todo_events[0] == now:
            sched.event(todo_events.pop(0))
        while todo_forced and todo_forced[0] == now:
            todo_forced.pop(0)
            begin()
        decision = sched.decide(now)
        if decision is WRITE:
            assert write_end is None, "decide() said WRITE while a write was running"
            begin()
            continue
        wake_ups = [t for t in (todo_events[:1] + todo_forced[:1]) if t > now]
        if write_end is not None:
            wake_ups.append(write_end)
        if isinstance(decision, Wait):
            assert decision.until > now
            wake_ups.append(decision.until)
        if not wake_ups:
            return starts
        now = min(wake_ups)
    raise AssertionError(f"no quiescence after 1000 steps: {starts}")


def every(step: float, start: float, stop: float) -> list[float]:
    """Event times ``start, start + step, ...`` strictly before ``stop``."""
    return [start + i * step for i in range(math.ceil((stop - start) / step))]


# -- debounce and max_wait ------------------------------------------------------


@pytest.mark.parametrize(
    ("events", "writes"),
    [
        pytest.param([3.0], [4.0], id="one event"),
        pytest.param([0.0, 0.25, 0.5, 0.75], [1.75], id="burst"),
        pytest.param(every(0.25, 0.0, 5.0), [5.75], id="burst of 20, gaps under debounce"),
        pytest.param([0.0, 0.5, 5.0, 5.5], [1.5, 6.5], id="two bursts"),
        pytest.param([0.0, 1.25, 2.5], [1.0, 2.25, 3.5], id="gaps over debounce"),
        pytest.param([0.0, 0.0, 0.0], [1.0], id="same instant"),
    ],
)
def test_burst_is_one_write_after_the_last_event(events: list[float], writes: list[float]) -> None:
    """A burst inside the debounce window is one write at t_last + debounce."""
    assert replay(events, debounce=1.0, max_wait=10.0) == writes


@pytest.mark.parametrize(
    ("events", "max_wait", "writes"),
    [
        pytest.param(every(0.5, 0.0, 10.0), 3.0, [3.0, 6.5, 10.0], id="stream, max_wait 3"),
        pytest.param(every(0.5, 0.0, 10.0), 10.0, [10.0], id="stream, max_wait 10"),
        pytest.param(every(0.5, 0.0, 10.0), 1.0, every(1.5, 1.0, 11.0), id="max_wait=debounce"),
        pytest.param(every(0.5, 2.0, 4.0), 3.0, [4.5], id="stream ends before max_wait"),
    ],
)
def test_steady_stream_writes_by_max_wait(
    events: list[float], max_wait: float, writes: list[float]
) -> None:
    """An event every 0.5 s with debounce 1 is written by t_first + max_wait."""
    assert replay(events, debounce=1.0, max_wait=max_wait) == writes


@pytest.mark.parametrize(
    ("events", "min_interval", "writes"),
    [
        pytest.param([0.0, 1.0, 2.0], 0.0, [0.0, 1.0, 2.0], id="each event at once"),
        pytest.param([0.0, 1.0, 2.0], 1.5, [0.0, 1.5, 3.0], id="spaced by min_interval"),
        pytest.param([0.0, 0.25, 0.5, 5.0], 1.0, [0.0, 1.0, 5.0], id="rest batched"),
    ],
)
def test_zero_debounce(events: list[float], min_interval: float, writes: list[float]) -> None:
    """With debounce 0 a change is written at once unless min_interval holds it back."""
    assert replay(events, debounce=0.0, min_interval=min_interval, max_wait=5.0) == writes


# -- min_interval ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("events", "min_interval", "writes"),
    [
        pytest.param([0.0, 1.5], 0.0, [1.0, 2.5], id="no min_interval"),
        pytest.param([0.0, 1.5], 4.0, [1.0, 5.0], id="pushed to t_prev + 4"),
        pytest.param([0.0, 1.5, 2.0, 2.5], 4.0, [1.0, 5.0], id="pushed, batched"),
        pytest.param([0.0, 4.5], 4.0, [1.0, 5.5], id="debounce later than t_prev + 4"),
        pytest.param([0.0, 10.0], 5.0, [1.0, 11.0], id="far apart: no effect"),
        pytest.param(every(0.5, 0.0, 8.0), 5.0, [5.0, 10.0], id="stream, min_interval=max_wait"),
    ],
)
def test_min_interval_pushes_the_next_write(
    events: list[float], min_interval: float, writes: list[float]
) -> None:
    """The next write starts no earlier than t_prev + min_interval."""
    assert replay(events, debounce=1.0, min_interval=min_interval, max_wait=5.0) == writes


@pytest.mark.parametrize(
    ("events", "forced", "writes"),
    [
        pytest.param([0.0, 1.0], [0.5], [0.5, 2.5], id="forced write sets t_prev"),
        pytest.param([0.0, 1.5, 2.5], [2.0], [1.0, 2.0, 4.0], id="forced write is not held back"),
        pytest.param([], [1.0], [1.0], id="forced write with nothing pending"),
    ],
)
def test_forced_writes(events: list[float], forced: list[float], writes: list[float]) -> None:
    """Forced writes start when asked, cover pending changes and count as t_prev."""
    assert replay(events, forced=forced, debounce=1.0, min_interval=2.0, max_wait=5.0) == writes


# -- events during a write --------------------------------------------------------


@pytest.mark.parametrize(
    ("events", "duration", "min_interval", "writes"),
    [
        pytest.param([0.0, 1.5, 2.5], 2.0, 0.0, [1.0, 3.5], id="next write after the end"),
        pytest.param([0.0, 1.5], 10.0, 0.0, [1.0, 11.0], id="overdue: at the end"),
        pytest.param([0.0, 2.0], 2.0, 3.0, [1.0, 4.0], id="pushed by min_interval"),
    ],
)
def test_events_during_a_write_are_written_next(
    events: list[float], duration: float, min_interval: float, writes: list[float]
) -> None:
    """Events during a write are kept for the next write, due after the write ends."""
    got = replay(events, duration=duration, debounce=1.0, min_interval=min_interval, max_wait=10.0)
    assert got == writes


# -- outcomes -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first_outcome", "writes"),
    [
        pytest.param(WRITTEN, [1.0, 6.0], id="written: t_prev=1"),
        pytest.param(SKIPPED, [1.0, 3.0], id="skipped: t_prev unset"),
        pytest.param(STORE_FAILED, [1.0, 6.0], id="store failed: t_prev=1, retried"),
        pytest.param(FAILED, [1.0, 1.5, 6.5], id="failed: t_prev unset, retried at 1.5"),
        pytest.param(CANCELLED, [1.0, 1.0, 6.0], id="cancelled: t_prev unset, retried at once"),
        pytest.param(REFUSED, [1.0, 3.0], id="refused: t_prev unset, not retried"),
    ],
)
def test_which_outcomes_count_as_previous_write(
    first_outcome: Outcome, writes: list[float]
) -> None:
    """Only writes that reached the store (written, store failed) hold the next one back."""
    got = replay(
        [0.0, 2.0],
        outcomes=[first_outcome],
        debounce=1.0,
        min_interval=5.0,
        max_wait=10.0,
        backoff_initial=0.5,
    )
    assert got == writes


@pytest.mark.parametrize(
    ("outcomes", "duration", "writes"),
    [
        pytest.param([FAILED], 0.0, [0.0, 1.0], id="first retry after backoff_initial"),
        pytest.param([FAILED] * 5, 0.0, [0.0, 1.0, 3.0, 7.0, 12.0, 17.0], id="doubling, capped"),
        pytest.param([STORE_FAILED] * 5, 0.0, [0.0, 1.0, 3.0, 7.0, 12.0, 17.0], id="store"),
        pytest.param([FAILED] * 4, 1.0, [0.0, 2.0, 5.0, 10.0, 16.0], id="after the failure"),
        pytest.param([CANCELLED] * 3, 1.0, [0.0, 1.0, 2.0, 3.0], id="cancel: no backoff"),
        pytest.param(
            [FAILED, CANCELLED, FAILED], 0.0, [0.0, 1.0, 1.0, 3.0], id="cancel keeps streak"
        ),
        pytest.param([REFUSED], 0.0, [0.0], id="refused: no retry"),
        pytest.param([FAILED, REFUSED], 0.0, [0.0, 1.0], id="refused after a failure: no retry"),
    ],
)
def test_backoff_doubles_up_to_the_cap(
    outcomes: list[Outcome], duration: float, writes: list[float]
) -> None:
    """Failed writes retry after min(backoff_max, backoff_initial * 2**(failures-1))."""
    got = replay(
        [0.0],
        outcomes=outcomes,
        duration=duration,
        debounce=0.0,
        max_wait=10.0,
        backoff_initial=1.0,
        backoff_max=5.0,
    )
    assert got == writes


@pytest.mark.parametrize(
    ("outcomes", "writes"),
    [
        pytest.param([FAILED, FAILED, WRITTEN, FAILED], [0.0, 1.0, 3.0, 20.0, 21.0], id="written"),
        pytest.param([FAILED, FAILED, SKIPPED, FAILED], [0.0, 1.0, 3.0, 20.0, 21.0], id="skipped"),
        pytest.param(
            [FAILED, FAILED, REFUSED, FAILED, FAILED],
            [0.0, 1.0, 3.0, 20.0, 24.0, 32.0],
            id="refused keeps the streak",
        ),
    ],
)
def test_failures_reset_after_success(outcomes: list[Outcome], writes: list[float]) -> None:
    """A written or skipped write ends a failure streak (the next failure waits
    backoff_initial); a refused one does not."""
    got = replay([0.0, 20.0], outcomes=outcomes, debounce=0.0, max_wait=30.0)
    assert got == writes


@pytest.mark.parametrize(
    ("outcome", "writes"),
    [
        pytest.param(FAILED, [1.0, 4.0, 7.0], id="failed: max_wait from t=0"),
        pytest.param(STORE_FAILED, [1.0, 4.0, 7.0], id="store failed: max_wait from t=0"),
        pytest.param(CANCELLED, [1.0, 4.0, 7.0], id="cancelled: max_wait from t=0"),
        pytest.param(WRITTEN, [1.0, 5.5, 7.0], id="written: max_wait from t=1.5"),
        pytest.param(REFUSED, [1.0, 5.5, 7.0], id="refused: dropped, max_wait from t=1.5"),
    ],
)
def test_repended_changes_keep_the_oldest_first(outcome: Outcome, writes: list[float]) -> None:
    """Changes put back by a failed write keep their t_first: max_wait counts from the oldest."""
    # Event at 0 -> write at 1, running until 2; a stream from 1.5 to 6 meanwhile.
    got = replay(
        [0.0, *every(0.5, 1.5, 6.5)],
        outcomes=[outcome],
        duration=1.0,
        debounce=1.0,
        max_wait=4.0,
        backoff_initial=0.5,
    )
    assert got == writes


# -- decide() -------------------------------------------------------------------

Step = tuple[str, float] | tuple[str, float, Outcome]


@pytest.mark.parametrize(
    ("steps", "now", "decision"),
    [
        pytest.param([], 0.0, IDLE, id="fresh: idle"),
        pytest.param([("event", 0.0)], 0.0, Wait(1.0), id="pending: wait"),
        pytest.param([("event", 0.0)], 0.75, Wait(1.0), id="pending: wait, same until"),
        pytest.param([("event", 0.0)], 1.0, WRITE, id="due: write"),
        pytest.param([("event", 0.0)], 9.0, WRITE, id="overdue: write"),
        pytest.param([("event", 0.0), ("begin", 1.0)], 1.0, IDLE, id="writing: idle"),
        pytest.param(
            [("event", 0.0), ("begin", 1.0), ("event", 1.25)], 7.0, IDLE, id="writing, pending"
        ),
        pytest.param(
            [("event", 0.0), ("begin", 1.0), ("end", 1.5, WRITTEN)], 1.5, IDLE, id="all written"
        ),
        pytest.param(
            [("event", 0.0), ("begin", 1.0), ("end", 1.5, SKIPPED)], 1.5, IDLE, id="all skipped"
        ),
        pytest.param(
            [("event", 0.0), ("begin", 1.0), ("event", 1.25), ("end", 1.5, WRITTEN)],
            1.5,
            Wait(3.0),
            id="event during write: due by min_interval",
        ),
        pytest.param(
            [("event", 0.0), ("begin", 1.0), ("event", 1.25), ("end", 1.5, SKIPPED)],
            1.5,
            Wait(2.25),
            id="event during skipped write: due by debounce",
        ),
        pytest.param(
            [("event", 0.0), ("begin", 1.0), ("end", 1.5, FAILED)],
            1.5,
            Wait(2.5),
            id="failed: wait backoff",
        ),
        pytest.param(
            [("event", 0.0), ("begin", 1.0), ("end", 1.5, CANCELLED)], 1.5, WRITE, id="cancelled"
        ),
        pytest.param([("begin", 1.0), ("end", 1.5, WRITTEN)], 1.5, IDLE, id="forced, empty"),
        # A failed write with nothing pending still owes the state as of its
        # start: it is retried after the backoff (1 s).
        pytest.param(
            [("begin", 1.0), ("end", 1.5, FAILED)], 1.5, Wait(2.5), id="forced, empty, failed"
        ),
        pytest.param(
            [("begin", 1.0), ("end", 1.5, FAILED), ("event", 1.75)],
            1.75,
            Wait(2.75),
            id="forced, empty, failed, then event",
        ),
    ],
)
def test_decide(steps: list[Step], now: float, decision: Decision) -> None:
    """decide() is IDLE with nothing pending or a write running, Wait(due) before, WRITE at due."""
    sched = Scheduler(debounce=1.0, min_interval=2.0, max_wait=5.0, backoff_initial=1.0)
    for step in steps:
        if step[0] == "event":
            sched.event(step[1])
        elif step[0] == "begin":
            sched.begin_write(step[1])
        else:
            assert len(step) == 3
            sched.end_write(step[1], step[2])
    assert sched.decide(now) == decision
    assert sched.pending == (sched.due() is not None)


def test_event_reports_the_first_pending_change() -> None:
    """event() is True only for the change that makes something pending."""
    sched = Scheduler(debounce=1.0, min_interval=0.0, max_wait=5.0)
    assert sched.event(0.0) is True
    assert sched.event(0.5) is False
    sched.begin_write(1.5)
    assert sched.event(2.0) is True
    assert sched.event(2.5) is False


# -- configuration ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"debounce": 6.0}, ValueError, r"debounce \(6\.0\) must not exceed max_wait \(5\.0\)"),
        ({"min_interval": 6}, ValueError, r"min_interval \(6\) must not exceed max_wait \(5\.0\)"),
        ({"debounce": -1.0}, ValueError, r"^debounce must be a finite number >= 0, got -1\.0"),
        ({"min_interval": -0.5}, ValueError, r"^min_interval must be a finite number >= 0"),
        ({"max_wait": -1.0, "debounce": 0.0}, ValueError, r"^max_wait must be a finite"),
        ({"debounce": math.nan}, ValueError, r"^debounce must be a finite number >= 0, got nan"),
        ({"min_interval": math.nan}, ValueError, r"^min_interval must be a finite"),
        ({"max_wait": math.nan}, ValueError, r"^max_wait must be a finite"),
        ({"debounce": math.inf}, ValueError, r"^debounce must be a finite number >= 0, got inf"),
        ({"max_wait": math.inf}, ValueError, r"^max_wait must be a finite"),
        ({"max_wait": 2**1100}, ValueError, r"^max_wait must be a finite"),  # past float's range
        ({"min_interval": 2**1100}, ValueError, r"^min_interval must be a finite"),
        ({"min_interval": -math.inf}, ValueError, r"^min_interval must be a finite"),
        ({"debounce": True}, TypeError, r"^debounce must be a number of seconds, got True"),
        ({"min_interval": False}, TypeError, r"^min_interval must be a number of seconds"),
        ({"max_wait": "5"}, TypeError, r"^max_wait must be a number of seconds, got '5'"),
        ({"max_wait": None}, TypeError, r"^max_wait must be a number of seconds, got None"),
    ],
)
def test_bad_configuration_names_the_parameter(
    kwargs: dict[str, object], error: type[Exception], match: str
) -> None:
    """A bad duration raises ValueError (TypeError for a non-number) naming the parameter."""
    config: dict[str, object] = {"debounce": 1.0, "min_interval": 0.0, "max_wait": 5.0}
    config.update(kwargs)
    with pytest.raises(error, match=match):
        Scheduler(**config)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("debounce", "min_interval", "max_wait"),
    [(0, 0, 0), (5.0, 5.0, 5.0), (0.0, 5.0, 5.0), (5, 0, 5)],
)
def test_boundary_configurations_are_accepted(
    debounce: float, min_interval: float, max_wait: float
) -> None:
    """debounce and min_interval may equal max_wait, and all may be zero."""
    sched = Scheduler(debounce=debounce, min_interval=min_interval, max_wait=max_wait)
    sched.event(0.0)
    assert sched.due() == min(debounce, max_wait)
