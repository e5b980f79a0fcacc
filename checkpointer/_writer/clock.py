"""The writer's notion of time, injectable for deterministic tests."""

from __future__ import annotations

import math
import time
from typing import Protocol

import anyio

__all__ = ["Clock", "MonotonicClock"]


class Clock(Protocol):
    """A monotonic clock the writer reads and sleeps on.

    ``now`` must be cheap and callable from any thread: ``notify()`` reads
    it on every event.  ``sleep`` is awaited by the writer's timer task and
    is cancelled when an event wakes the writer early; ``math.inf`` means
    "until woken".
    """

    def now(self) -> float:
        """Seconds on a monotonic scale."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Sleep for ``seconds`` (possibly ``math.inf``); cancellable."""
        ...


class MonotonicClock:
    """The default clock: ``time.monotonic`` (20 times cheaper than ``anyio.current_time``)."""

    now = staticmethod(time.monotonic)

    async def sleep(self, seconds: float) -> None:
        if math.isinf(seconds):
            await anyio.sleep_forever()
        else:
            await anyio.sleep(max(0.0, seconds))
