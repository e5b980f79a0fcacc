"""The timing policy of a checkpoint writer, a pure state machine: every method takes
``now``; the writer carries out what it decides.

``first`` is the time of the first change not covered by a started write, ``last``
of the latest, ``prev`` the start of the previous write that reached the store::

    due = max(min(last + debounce, first + max_wait), prev + min_interval)

* A write that starts covers every pending change; events during it wait for the next.
* ``prev`` moves only for writes that reached the store (written, or failed in it).
* A failed write puts its changes back (the earliest ``first`` wins) and the next
  waits ``min(backoff_max, backoff_initial * 2 ** (failures - 1))`` more; a
  cancelled one puts them back without backoff; a refused one drops them.
* During a backoff after a store failure the driver probes the store every
  ``probe_interval``; a yes ends the backoff and forgets ``prev``.
* One write at a time; forced writes are not held back by ``min_interval``.

``event`` may run on another thread during ``begin_write``: it stores ``last``
before it tests ``first``, and ``begin_write`` clears ``first`` before the
snapshot, so an event is covered by the write that starts or left for the next.
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
_FLOAT_MAX: Final = 2.0**1023 * (2 - 2.0**-52)  # sys.float_info.max, without sys


class _Act(enum.Enum):
    IDLE = "idle"  # nothing is pending, or a write is running: wait to be woken
    WRITE = "write"  # a write is due now

    def __repr__(self) -> str:
        return self.name


IDLE: Final = _Act.IDLE
WRITE: Final = _Act.WRITE


class Wait(NamedTuple):
    """Something is pending; the next write is due at ``until``."""

    until: float


Decision = _Act | Wait


class Outcome(enum.Enum):
    """How a write ended, as far as timing is concerned."""

    WRITTEN = "written"  # the store took the bytes
    SKIPPED = "skipped"  # nothing to write (unchanged, no identity): the changes are settled
    STORE_FAILED = "store-failed"  # the store was reached and failed: a write start, retried
    FAILED = "failed"  # refused before the store (snapshot, encode, key): retried
    CANCELLED = "cancelled"  # the driver stopped waiting: the changes stay pending
    REFUSED = "refused"  # refused until the session changes: dropped, not retried


@final
class Scheduler:
    """Decides when the next checkpoint write is due.

    ``debounce`` and ``min_interval`` default to ``DEBOUNCE`` and
    ``MIN_INTERVAL``, or ``max_wait`` if that is less.  The backoff and
    probe durations are trusted (``Limits`` checked them).

    Raises:
        ValueError: the durations break ``0 <= debounce <= max_wait`` or
            ``0 <= min_interval <= max_wait``, or one is not finite.
        TypeError: a duration is not a number (a bool is not one).
    """

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
        debounce = min(DEBOUNCE, cap) if debounce is None else debounce
        min_interval = min(MIN_INTERVAL, cap) if min_interval is None else min_interval
        for name, value in (
            ("max_wait", max_wait),
            ("debounce", debounce),
            ("min_interval", min_interval),
        ):
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise TypeError(f"{name} must be a number of seconds, got {value!r}")
            if not 0 <= value < _FLOAT_MAX:  # an int past float's range would overflow below
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
            if value > max_wait:
                raise ValueError(
                    f"{name} ({value}) must not exceed max_wait ({max_wait}): "
                    f"raise max_wait or lower {name}"
                )
        self.debounce = float(debounce)
        self.min_interval = float(min_interval)
        self.max_wait = float(max_wait)
        self.backoff_initial = float(backoff_initial)
        self.backoff_max = float(backoff_max)
        self.probe_interval = float(probe_interval)
        self.first: float | None = None
        self.last = -math.inf
        self.prev: float | None = None
        self.writing = False
        self.write_started = -math.inf
        self._covered: tuple[float, float] | None = None
        self.failures = 0
        self.retry_at: float | None = None
        self.probe_at: float | None = None

    # -- inputs -------------------------------------------------------------

    def event(self, now: float) -> bool:
        """Record a change at ``now``; True when it is the first pending one (wake the driver)."""
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
            self.first = c_first if self.first is None else min(self.first, c_first)
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
            self.retry_at = self.probe_at = self.prev = None
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
        return WRITE if now >= due else Wait(due)
