"""What a write returns, and what a writer reports about itself.

An expected outcome is a value, never an exception: a write is ``Written``,
``Skipped`` or ``Failed``.  All are frozen msgspec Structs, cheap to build,
compare and log.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

import msgspec

__all__ = [
    "FailReason",
    "Failed",
    "Result",
    "SkipReason",
    "Skipped",
    "WriterStatistics",
    "Written",
]

SkipReason: TypeAlias = Literal["unchanged", "no-identity", "closed"]
FailReason: TypeAlias = Literal[
    "snapshot-failed",
    "encode-failed",
    "invalid-key",
    "not-sendable",
    "locked",
    "conflict",
    "write-failed",
    "newer-version",
]


class Written(msgspec.Struct, frozen=True, kw_only=True):
    """The checkpoint of ``key`` is on disk at ``location``.

    Attributes:
        key: the key written.
        location: where the store put it (a path for ``FileStore``).
        nbytes: bytes the store wrote: the whole file for a snapshot, the
            bytes appended for a journal (or the fresh file of a rewrite).
        seconds: time from the snapshot to the end of the durable write.
        seq: the sequence number now in the file's meta.
        repaired: tool calls without a result that the writer's ``prepare``
            step closed with an error result in the file (not in memory).
        settled: items still running at snapshot time that ``prepare``
            settled as errors in the file (not in memory).
    """

    key: str
    location: str
    nbytes: int
    seconds: float
    seq: int = 0
    repaired: int = 0
    settled: int = 0


class Skipped(msgspec.Struct, frozen=True):
    """Nothing was written, and nothing needed to be.

    ``reason`` is ``"unchanged"`` (the store already holds this state, or a
    newer one, with the same meta the caller controls: ``Snapshot.parent``,
    the pin, ``Meta.turns``), ``"no-identity"`` (the source returned None) or
    ``"closed"``.
    """

    reason: SkipReason


class Failed(msgspec.Struct, frozen=True):
    """The write did not happen; the previous checkpoint is intact.

    ``reason`` says which step failed; ``error`` is a one-line message naming
    the thing (path, key, field) and, where there is one, the way out:

    * ``"snapshot-failed"``: ``source()``, ``fingerprint()`` or ``prepare()``
      raised or returned something unusable.
    * ``"encode-failed"``: the state cannot be encoded (the key is named).
    * ``"invalid-key"``: the key breaks the store's rule (the rule is named).
    * ``"not-sendable"``: ``transcript_prepare`` cannot make the history one
      a model API accepts (the JSON paths are named).
    * ``"locked"``: another live writer holds the key's lock (named).
    * ``"conflict"``: another writer wrote the key after this writer first
      saw it (or after the checkpoint it resumed from); replacing that
      would lose its work.  The error names the other writer (pid, host,
      seq) and the way out: load the key again and start a new writer.
    * ``"write-failed"``: the store failed (the path and the error).
    * ``"newer-version"``: the key holds a checkpoint written by a newer
      version of this library or of the state's schema; it is kept as it
      is, and the error names the version to upgrade to.

    The changes stay pending and are retried with backoff, except after
    ``"conflict"``, ``"newer-version"`` and ``"not-sendable"``: no retry can succeed until the
    session changes, so the writer waits for the next ``notify()`` (or
    ``write_now()``, close, an exit flush) to try again.
    """

    reason: FailReason
    error: str


Result: TypeAlias = Written | Skipped | Failed


class WriterStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of a writer's counters (``CheckpointWriter.statistics()``).

    Attributes:
        events: ``notify()`` calls, including those made through ``attach``.
        writes: checkpoints the store took.
        skipped: writes skipped (unchanged, no identity).
        failures: failed writes, in all.
        failure_streak: failed writes since the last success.
        bytes_written: bytes the store took, in all.
        last_write_seconds: duration of the last successful write, or None.
        pending: whether changes wait for a write that has not started.
        key: the key of the last snapshot, or None before the first.
        repaired: tool calls closed by ``prepare`` in written files, in all.
        settled: running items settled by ``prepare`` in written files, in all.
    """

    events: int
    writes: int
    skipped: int
    failures: int
    failure_streak: int
    bytes_written: int
    last_write_seconds: float | None
    pending: bool
    key: str | None
    repaired: int = 0
    settled: int = 0
