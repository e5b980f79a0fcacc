"""What a writer reports about its writes: the counters of ``statistics()``, and the log.

A failure is logged at WARNING when a streak starts or its reason changes, a
recovery at INFO, every result at DEBUG; a failed final write
(close, exit, signal) at ERROR, as nothing retries it.
"""

from __future__ import annotations

import logging
from typing import final

from .._schedule import Outcome
from .._values import Failed, Result, Skipped, WriterStatistics, Written

__all__ = ["REFUSED", "Record", "outcome"]

logger = logging.getLogger("checkpointer")

REFUSED = frozenset({"conflict", "newer-version", "not-sendable"})
"""Failures no retry can fix until the session changes: not retried (``Outcome.REFUSED``)."""


def outcome(result: Result) -> Outcome:
    """What ``result`` means for the scheduler."""
    if isinstance(result, Written):
        return Outcome.WRITTEN
    if isinstance(result, Skipped):
        return Outcome.SKIPPED
    if result.reason in REFUSED:  # no retry can succeed: the next change tries again
        return Outcome.REFUSED
    return Outcome.STORE_FAILED if result.reason == "write-failed" else Outcome.FAILED


@final
class Record:
    """The counters of one writer."""

    def __init__(self, *, retried: bool = True) -> None:  # named as WriterStatistics names them
        self._retried = retried  # False for a KeyCommitter's: the caller's next commit retries
        self.writes = self.skipped = self.failures = self.failure_streak = 0
        self.bytes_written = self.repaired = self.settled = 0
        self.last_write_seconds: float | None = None
        self.last_result: Result | None = None
        self.last_failure: Failed | None = None

    def account(self, result: Result, *, quiet: bool) -> Result:
        """Count ``result``; a failure is logged if it starts a streak or changes its
        reason, unless ``quiet``."""
        logger.debug("checkpointer: %r", result)
        self.last_result = result
        if isinstance(result, Written):
            self.writes += 1
            self.bytes_written += result.nbytes
            self.repaired += result.repaired
            self.settled += result.settled
            self.last_write_seconds = result.seconds
            if self.failure_streak:
                logger.info(
                    "checkpointer: writing %s works again after %d failures",
                    result.location,
                    self.failure_streak,
                )
            self.failure_streak = 0
        elif isinstance(result, Skipped):
            self.skipped += 1
            if result.reason == "unchanged":
                self.failure_streak = 0
        else:
            last, self.last_failure = self.last_failure, result
            self.failures += 1
            self.failure_streak += 1
            new = self.failure_streak == 1 or last is None or last.reason != result.reason
            if new and not quiet:
                # A KeyCommitter's caller holds the Failed and decides: no schedule to name.
                then = "not retrying until the session changes"
                if result.reason not in REFUSED:
                    then = "retrying with backoff"
                logger.warning(
                    "checkpointer: checkpoint failed (%s): %s%s",
                    result.reason,
                    result.error,
                    f"; {then}" if self._retried else "",
                )
        return result

    def note_final(self, result: Result, when: str) -> Result:
        """The final write's result (``when``: "at close", "at exit", ...): a failure is an error.

        Nothing retries it: the changes since the last checkpoint written are
        not known to be on disk (a write that failed past its rename, in the
        directory's fsync, leaves its file in place, not known durable).
        Kept for ``statistics()`` like any result.
        """
        if isinstance(result, Skipped) and result.reason == "closed":
            return result  # no final write happened here
        self.last_result = result
        if isinstance(result, Failed):
            self.last_failure = result
            logger.error(
                "checkpointer: the final write %s failed (%s): %s; the changes since the "
                "checkpoint written before it are not known to be on disk (the store holds "
                "that one, or this one not made durable if it failed after its rename)",
                when,
                result.reason,
                result.error,
            )
        return result

    def statistics(self, *, events: int, pending: bool, key: str | None) -> WriterStatistics:
        counters = {k: v for k, v in vars(self).items() if not k.startswith("_")}
        return WriterStatistics(events=events, pending=pending, key=key, **counters)
