"""The timing policy of a checkpoint writer, as a pure state machine.

Nothing here reads a clock, sleeps, imports anyio or touches a file: every
method takes ``now`` (seconds on any monotonic clock) and the writer that
drives the scheduler carries out what it decides.  That keeps the contract
testable with exact times in tables.

Rules (the timing contract of the README)
-----------------------------------------
For the changes not yet covered by a write that has started, ``first`` is the
time of the first such event and ``last`` of the latest; ``prev`` is the start
of the previous write that reached the store.  The next write is due at::

    due = max(min(last + debounce, first + max_wait), prev + min_interval)

* A write that starts covers every pending change (``begin_write``); events
  during a write are pending for the next one.
* ``prev`` moves only for writes that reached the store (written, or failed
  inside the store); a write skipped as unchanged or refused before the store
  does not count.
* A failed write puts the changes it covered back (for a forced write with
  nothing pending, the state as of its start) (the earliest ``first``
  wins, so ``max_wait`` is measured from the oldest unsaved change) and the
  next attempt waits a capped exponential backoff:
  ``min(backoff_max, backoff_initial * 2 ** (failures - 1))`` after the
  failure, on top of the rule above.
* A cancelled write (the driver stopped waiting for it) puts its changes
  back without backoff.
* A refused write (one no retry can fix until the session changes: another
  writer's checkpoint in the way, a history that cannot be sent) drops the
  changes it covered, like a skipped one, and leaves ``prev`` and the
  backoff as they were: nothing is retried until the next event.
* Probing (for a store with the ``ProbingStore`` capability): after a write
  that failed inside the store, when the backoff is longer than
  ``probe_interval``, the driver asks the store every ``probe_interval``
  (``next_probe``) whether it can be reached again; a yes (``probed``) ends
  the backoff and forgets ``prev`` (the failed attempts reached nothing), so
  the write is due by the rule above: at once, after an outage longer than
  ``max_wait``.  A no waits one more interval.
* One write at a time: while a write runs, ``decide`` says ``IDLE`` and the
  driver asks again when the write ends.
* Forced writes (``write_now``, the final write) call ``begin_write`` and
  ``end_write`` like any other; the scheduler does not police ``min_interval``
  for them.

Thread-safety: ``event`` may run on any thread while the driver's thread is
inside ``begin_write``.  It stores ``last`` before it tests ``first``, and the
driver clears ``first`` before it takes its snapshot, so an event is either
covered by the write that starts or left pending for the next one, never lost
(at worst an extra write, which the fingerprint check turns into a skip).
"""

from __future__ import annotations

import enum
import math
from typing import Final, NamedTuple, final

__all__ = ["DEBOUNCE", "IDLE", "MIN_INTERVAL", "WRITE", "Decision", "Outcome", "Scheduler", "Wait"]

DEBOUNCE: Final = 0.5
"""The default debounce, in seconds: capped by ``max_wait``."""
MIN_INTERVAL: Final = 1.0
"""The default minimum interval, in seconds: capped by ``max_wait``."""


@final
class _Idle:
    __slots__ = ()

    def __repr__(self) -> str:
        return "IDLE"


@final
class _Write:
    __slots__ = ()

    def __repr__(self) -> str:
        return "WRITE"


IDLE: Final = _Idle()
"""Nothing is pending, or a write is running: wait to be woken."""

WRITE: Final = _Write()
"""A write is due now."""


class Wait(NamedTuple):
    """Something is pending; the next write is due at ``until``."""

    until: float


Decision = _Idle | _Write | Wait


class Outcome(enum.Enum):
    """How a write ended, as far as timing is concerned."""

    WRITTEN = "written"
    """The store took the bytes."""
    SKIPPED = "skipped"
    """Nothing to write (unchanged, no identity): the changes are settled."""
    STORE_FAILED = "store-failed"
    """The store was reached and failed: counts as a write start, retried."""
    FAILED = "failed"
    """Refused before the store (snapshot, encode, key): retried."""
    CANCELLED = "cancelled"
    """The driver stopped waiting (cancelled): the changes stay pending."""
    REFUSED = "refused"
    """Refused until the session changes (a conflict, a history that cannot be
    sent): the changes are dropped, not retried; the next event starts over."""


@final
class Scheduler:
    """Decides when the next checkpoint write is due.

    Args:
        debounce: quiet time after the latest event before a write; None:
            ``DEBOUNCE``, or ``max_wait`` if that is less.
        min_interval: least time between the starts of two scheduled writes;
            None: ``MIN_INTERVAL``, or ``max_wait`` if that is less.
        max_wait: most time the oldest unsaved change waits for a write.
        backoff_initial: wait before the first retry after a failure.
        backoff_max: cap of the doubling retry wait.
        probe_interval: time between two probes of a store during a backoff.

    Raises:
        ValueError: if the durations break
            ``0 <= debounce <= max_wait`` or ``0 <= min_interval <= max_wait``,
            or a backoff is not positive and finite.
        TypeError: if a duration is not a number (a bool is not one).
    """

    __slots__ = (
        "_covered",
        "backoff_initial",
        "backoff_max",
        "debounce",
        "failures",
        "first",
        "last",
        "max_wait",
        "min_interval",
        "prev",
        "probe_at",
        "probe_interval",
        "retry_at",
        "write_started",
        "writing",
    )

    def __init__(
        self,
        *,
        debounce: float | None,
        min_interval: float | None,
        max_wait: float,
        backoff_initial: float = 1.0,
        backoff_max: float = 60.0,
        probe_interval: float = 0.25,
    ) -> None:
        # Defaults never contradict the max_wait given: they give way to it.
        cap = max_wait if isinstance(max_wait, (int, float)) and max_wait >= 0 else math.inf
        if debounce is None:
            debounce = min(DEBOUNCE, cap)
        if min_interval is None:
            min_interval = min(MIN_INTERVAL, cap)
        for name, value in (
            ("debounce", debounce),
            ("min_interval", min_interval),
            ("max_wait", max_wait),
        ):
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise TypeError(f"{name} must be a number of seconds, got {value!r}")
            if math.isnan(value) or value < 0 or math.isinf(value):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if debounce > max_wait:
            raise ValueError(
                f"debounce ({debounce}) must not exceed max_wait ({max_wait}): "
                "raise max_wait or lower debounce"
            )
        if min_interval > max_wait:
            raise ValueError(
                f"min_interval ({min_interval}) must not exceed max_wait ({max_wait}): "
                "raise max_wait or lower min_interval"
            )
        for name, value in (
            ("backoff_initial", backoff_initial),
            ("backoff_max", backoff_max),
            ("probe_interval", probe_interval),
        ):
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise TypeError(f"{name} must be a number of seconds, got {value!r}")
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if backoff_initial > backoff_max:
            raise ValueError(
                f"backoff_initial ({backoff_initial}) must not exceed backoff_max ({backoff_max})"
            )
        self.debounce = float(debounce)
        self.min_interval = float(min_interval)
        self.max_wait = float(max_wait)
        self.backoff_initial = float(backoff_initial)
        self.backoff_max = float(backoff_max)
        self.first: float | None = None
        self.last = -math.inf
        self.prev: float | None = None
        self.writing = False
        self.write_started = -math.inf
        self._covered: tuple[float, float] | None = None
        self.failures = 0
        self.retry_at: float | None = None
        self.probe_interval = float(probe_interval)
        self.probe_at: float | None = None

    # -- inputs -------------------------------------------------------------

    def event(self, now: float) -> bool:
        """Record a change at ``now``.

        Returns:
            True when this event is the first pending change (the driver
            should wake up and plan a write), False otherwise.
        """
        self.last = now
        if self.first is None:
            self.first = now
            return True
        return False

    def begin_write(self, now: float) -> None:
        """A write starts at ``now`` and covers every pending change."""
        first = self.first
        self.first = None  # before the snapshot: see the module docstring
        # A write with nothing pending (write_now, a final write) still covers
        # the state as of now: if it fails, that state is retried.
        self._covered = (now, now) if first is None else (first, self.last)
        self.writing = True
        self.write_started = now

    def end_write(self, now: float, outcome: Outcome) -> None:
        """The write begun last ended at ``now`` with ``outcome``."""
        covered, self._covered = self._covered, None
        self.writing = False
        if outcome is Outcome.WRITTEN or outcome is Outcome.STORE_FAILED:
            self.prev = self.write_started
        self.probe_at = None
        if outcome is Outcome.WRITTEN or outcome is Outcome.SKIPPED:
            self.failures = 0
            self.retry_at = None
            return
        if outcome is Outcome.REFUSED:
            return  # no retry can succeed: wait for the next event
        if outcome is not Outcome.CANCELLED:
            self.failures += 1
            delay = self.backoff_initial * 2.0 ** min(self.failures - 1, 64)
            self.retry_at = now + min(self.backoff_max, delay)
            if outcome is Outcome.STORE_FAILED:
                self.probed(now, ready=False)
        if covered is not None:
            c_first, c_last = covered
            if self.first is None:
                self.last = max(self.last, c_last)
                self.first = c_first
            else:
                self.first = min(self.first, c_first)
                self.last = max(self.last, c_last)

    # -- outputs ------------------------------------------------------------

    @property
    def pending(self) -> bool:
        """Whether changes are waiting for a write that has not started."""
        return self.first is not None

    def due(self) -> float | None:
        """When the next write is due, or None if nothing is pending."""
        first = self.first
        if first is None:
            return None
        due = min(self.last + self.debounce, first + self.max_wait)
        if self.prev is not None:
            due = max(due, self.prev + self.min_interval)
        if self.retry_at is not None:
            due = max(due, self.retry_at)
        return due

    def next_probe(self) -> float | None:
        """When to ask the store whether it answers again (see the rules), or None."""
        if self.writing or self.first is None or self.retry_at is None:
            return None
        return self.probe_at

    def probed(self, now: float, *, ready: bool) -> None:
        """The store answered a probe at ``now``: ``ready`` ends the backoff."""
        if ready:
            # The failed attempts reached nothing: neither their backoff nor
            # min_interval after them holds the write back.
            self.retry_at = None
            self.probe_at = None
            self.prev = None
            return
        at = now + self.probe_interval
        self.probe_at = at if self.retry_at is not None and at < self.retry_at else None

    def decide(self, now: float) -> Decision:
        """What the driver should do at ``now``."""
        if self.writing:
            return IDLE
        due = self.due()
        if due is None:
            return IDLE
        if now >= due:
            return WRITE
        return Wait(due)
