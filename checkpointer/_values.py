"""The values that cross the layers: what a checkpoint is, and what a write returns.

Everything here is a frozen msgspec Struct or an exception, and imports
nothing of the library but msgspec: the formats, the stores, the writer
and the transcript helpers all speak in these values, so none of them has
to import another for them.

* What a checkpoint is: ``Snapshot`` (what the source hands the writer),
  ``Meta`` (what a file says about itself), ``Checkpoint`` (a loaded one),
  ``TornTail``, ``WriterInfo``; ``CheckpointError`` and
  ``NewerVersionError`` for one that cannot be trusted.
* What a prepare step makes of a snapshot: ``Prepared``.
* What a summary checkpoint is: ``SummaryCheckpoint``, and ``SummaryFailed``
  when ``collapse`` wrote none.
* What a write returns: an expected outcome is a value, never an
  exception: a write is ``Written``, ``Skipped`` or ``Failed``.  All are
  cheap to build, compare and log.  ``WriterStatistics`` is what a writer
  reports about itself.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Generic, Literal, TypeAlias, TypeVar

import msgspec

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "CheckpointFailed",
    "FailReason",
    "Failed",
    "Limits",
    "Meta",
    "NewerVersionError",
    "Prepared",
    "Result",
    "SkipReason",
    "Skipped",
    "Snapshot",
    "SummaryCheckpoint",
    "SummaryFailed",
    "TornTail",
    "WriterInfo",
    "WriterStatistics",
    "Written",
]

T = TypeVar("T")


# -- checkpoints -----------------------------------------------------------------


class CheckpointError(Exception):
    """A checkpoint exists but cannot be trusted.

    Attributes:
        path: where the bad checkpoint is (the store's location for the key).
        reason: what is wrong with it, in one line.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class NewerVersionError(CheckpointError):
    """A checkpoint written by a newer version: kept as it is, never replaced.

    Its format is newer than this library reads, or its state version newer
    than the program asked for (``load(state_version=)``, the writer's
    ``state_version``).  Not damage: the message says what to upgrade to.

    Attributes:
        path: where the checkpoint is.
        reason: which version wrote it and what to upgrade, in one line.
        library_version: the agent-checkpointer version that wrote it, when
            the file says.
    """

    def __init__(self, path: str, reason: str, library_version: str | None = None) -> None:
        super().__init__(path, reason)
        self.library_version = library_version


class Snapshot(msgspec.Struct, frozen=True):
    """What the source hands the writer: the session's key and its state.

    ``state`` is anything msgspec can encode (dicts, lists, Structs,
    dataclasses, ...).  The writer encodes it at write time and does not keep
    it.  ``parent`` is the key of the session this one branched from; the
    writer copies it into ``Meta.parent`` at every write.  ``fingerprint``,
    optional, is a cheap hashable value that changes whenever the state does
    (a revision counter, ``len(messages)`` for a list that only grows): a
    snapshot whose fingerprint equals the last one written, with the same
    meta, is ``Skipped("unchanged")`` before it is encoded.  With a
    transcript, it is compared together with the transcript's.  Without
    either, the encoded bytes are compared.
    """

    key: str
    state: Any
    parent: str | None = None
    fingerprint: Any = None


class WriterInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Which process wrote a checkpoint: ``pid`` on ``host``."""

    pid: int
    host: str


class Meta(msgspec.Struct, frozen=True, kw_only=True):
    """What a checkpoint file says about itself.

    Attributes:
        key: the session key.
        seq: 1 for the first write of the key, then one more on every write,
            across processes.
        created_at: UTC time of the key's first write; later writers keep it.
        updated_at: UTC time of this write.
        live: True while a writer has the key open; False after its final
            write (close, exit flush, signal).
        pinned: a sticky flag set with ``write_now(pin=...)``.
        turns: assistant messages in the file's transcript (set by the
            writer's ``prepare`` step, e.g. ``transcript_prepare``), or None.
        parent: the key of the session this one branched from
            (``Snapshot.parent`` at the time of the write), or None.
        writer: the process that wrote the file (pid, host).
        library_version: the agent-checkpointer version that wrote the file.
        state_version: the caller's own version of the state's schema
            (``CheckpointWriter(state_version=...)``); see ``load``.
        revision: this write's revision, unique to it (no other write, of
            any writer, repeats it): what a store compares before it
            replaces the checkpoint (``Store.write``'s ``expected``), and
            what ``resume_from`` carries to the next writer.

    Fields after ``pinned`` came later: files written before them load with
    the defaults (msgspec's schema-evolution rules).
    """

    key: str
    seq: int
    created_at: datetime
    updated_at: datetime
    live: bool
    pinned: bool = False
    turns: int | None = None
    parent: str | None = None
    writer: WriterInfo | None = None
    library_version: str | None = None
    state_version: int = 0
    revision: str = ""


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """How long a writer waits, and how it retries (``CheckpointWriter(limits=)``).

    Attributes:
        retry_initial: the wait before the first retry after a failed write.
        retry_max: the cap of the doubling retry wait.
        close_timeout: bound, in seconds from the ``aclose()`` call, on the
            waits of a close: for a write in flight, then for the store to
            take the final write (see ``CheckpointWriter.aclose``).
        exit_timeout: how long an exit or signal flush waits for a write in
            flight in a worker thread before it writes anyway.
        lock_timeout: how long a write waits for another live writer of the
            key to let go of its lock; 0 means ``Failed("locked")`` at once,
            retried with backoff.

    Raises:
        ValueError: a value out of range (the message names it).
    """

    retry_initial: float = 0.5
    retry_max: float = 30.0
    close_timeout: float = 10.0
    exit_timeout: float = 5.0
    lock_timeout: float = 0.0

    def __post_init__(self) -> None:
        for name in ("retry_initial", "retry_max", "close_timeout", "exit_timeout"):
            _seconds(name, getattr(self, name), above_zero=True)
        _seconds("lock_timeout", self.lock_timeout, above_zero=False)
        if self.retry_initial > self.retry_max:
            raise ValueError(
                f"retry_initial ({self.retry_initial}) must not exceed retry_max ({self.retry_max})"
            )


def _seconds(name: str, value: object, *, above_zero: bool) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (above_zero and value == 0):  # type: ignore[operator]
        bound = "> 0" if above_zero else ">= 0"
        raise ValueError(f"{name} must be a finite number of seconds {bound}, got {value!r}")


class TornTail(msgspec.Struct, frozen=True, kw_only=True):
    """The end of a journal that ``load()`` ignored: an append that never finished.

    Attributes:
        line: the 1-based line number where the ignored bytes start.
        offset: their byte offset in the file.
        nbytes: how many bytes were ignored.
        reason: what was wrong with them, in one line.
    """

    line: int
    offset: int
    nbytes: int
    reason: str


class Checkpoint(msgspec.Struct, Generic[T], frozen=True):
    """A loaded checkpoint: its ``meta`` and its decoded ``state``.

    ``torn`` is set when a journal ended in an append that never finished
    (a crash mid-write): those bytes were ignored, everything before them
    loaded.  A writer that opens the journal truncates them away.
    """

    meta: Meta
    state: T
    torn: TornTail | None = None


# -- a prepare step's answer -----------------------------------------------------


class Prepared(msgspec.Struct, frozen=True, kw_only=True):
    """What a ``prepare`` step made of a snapshot: the one to encode.

    Attributes:
        snapshot: the snapshot to write (a repaired copy, or the original).
        repaired: tool calls that had no result and were closed with one.
        settled: items that were still running and were settled as errors.
        turns: assistant messages in the state to write (``Meta.turns``),
            or None when the step does not count them.
    """

    snapshot: Snapshot
    repaired: int = 0
    settled: int = 0
    turns: int | None = None


# -- summary checkpoints ---------------------------------------------------------


class SummaryCheckpoint(msgspec.Struct, frozen=True):
    """A session collapsed up to ``watermark``.

    Attributes:
        watermark: the index of the first transcript message *not* covered:
            the resumed context is the summary, then ``messages[watermark:]``.
        summary: the distilled text, any length, any characters.
        created_at: when the summary was made, timezone-aware (stored as UTC).
        covered_messages: how many original messages the summary stands
            for (the watermark, unless summaries were chained).
    """

    watermark: int
    summary: str
    created_at: datetime
    covered_messages: int


class SummaryFailed(msgspec.Struct, frozen=True, kw_only=True):
    """``collapse`` wrote nothing.

    Attributes:
        reason: ``"summarize-failed"`` (the caller's function raised or
            returned something other than a str) or ``"write-failed"``.
        error: one line naming what failed.
        exception: the exception itself, to re-raise or inspect.
    """

    reason: Literal["summarize-failed", "write-failed"]
    error: str
    exception: BaseException


# -- what a write returns ----------------------------------------------------------


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
        revision: the checkpoint's revision (``Meta.revision``): what a reader
            that cached this state compares with ``store.revision(key)``.
    """

    key: str
    location: str
    nbytes: int
    seconds: float
    seq: int = 0
    repaired: int = 0
    settled: int = 0
    revision: str = ""


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
    * ``"conflict"``: the store holds another revision than the one this
      writer expects (the checkpoint it resumed from, found at its first
      write, or wrote last): another writer wrote or deleted the key since;
      replacing that would lose its work.  The error names the other
      writer (pid, host, seq) and the way out: load the key again and
      start a new writer.
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
        last_result: the result of the latest write (timer, ``write_now``,
            ``flush_sync``, the final write), or None before the first.
        last_failure: the latest ``Failed``, even after later successes, or None.
            A final write (close, exit, signal) that failed is here, and was
            logged at ERROR on the ``"checkpointer"`` logger.
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
    last_result: Result | None = None
    last_failure: Failed | None = None


class CheckpointFailed(RuntimeError):
    """A write a caller waits for was not written (raised by the framework adapters).

    Where the framework's interface has no place for a result value (a
    ``durability="sync"`` put, a session opened on a locked key, a final
    write at ``async with`` exit), the adapters raise this instead.

    Attributes:
        result: the writer's ``Failed`` value (its ``reason`` and ``error``).
    """

    def __init__(self, result: Failed) -> None:
        self.result = result
        super().__init__(f"checkpoint not written ({result.reason}): {result.error}")
