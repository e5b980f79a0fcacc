"""The values that cross the layers: checkpoints, write results, errors (no library imports)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final, Generic, Literal, TypeAlias, TypeVar

import msgspec

__all__ = [
    "MAX_SECONDS",
    "Checkpoint",
    "CheckpointError",
    "CheckpointFailed",
    "FailReason",
    "Failed",
    "Limits",
    "Meta",
    "NewerVersionError",
    "Prepared",
    "RegistryStatistics",
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
    "transcript_messages",
]

T = TypeVar("T")


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

    ``state`` is anything msgspec can encode; the writer encodes it at write
    time and does not keep it.  ``parent``: the key of the session this one
    branched from (``Meta.parent``).  ``fingerprint``, optional: a cheap
    hashable value that changes whenever the state does (a revision counter):
    one equal to the last written, with the same meta, is
    ``Skipped("unchanged")`` before encoding.  It is compared together with
    a transcript's; without either, the encoded bytes are compared.
    """

    key: str
    state: Any
    parent: str | None = None
    fingerprint: Any = None


def transcript_messages(state: Any, field: str) -> list[Any] | tuple[Any, ...] | None:
    """The messages of a transcript state, or None for a state treated whole.

    The one rule for the message cache, the fingerprint and the repair step:
    a dict's ``field`` key or a msgspec Struct's ``field`` attribute holding a
    list or a tuple.  Anything else under it (nothing yet, None, a dict, a
    str) and any other state (a list, a dataclass) is encoded whole,
    fingerprinted whole and never repaired.
    """
    if isinstance(state, dict):
        messages = state.get(field)
    elif isinstance(state, msgspec.Struct) and field in state.__struct_fields__:
        messages = getattr(state, field)
    else:
        return None
    return messages if isinstance(messages, (list, tuple)) else None


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
        turns: assistant messages in the file's transcript (counted with a
            ``transcript``), or None.
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

    New fields get defaults (msgspec's schema-evolution rules).
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
            retried with backoff.  An exit or signal flush (``flush_sync``)
            waits no longer than ``exit_timeout``.

    Each is a number of seconds up to 4,294,967 (about 49
    days, the longest wait Python's threading takes on every platform).

    Raises:
        TypeError: a value is not a number (a bool is not one).
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


MAX_SECONDS: Final = 4_294_967.0
"""The longest ``Limits`` wait: beyond Windows' 2**32 - 2 ms, threading raises OverflowError."""


def _seconds(name: str, value: object, *, above_zero: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}")
    if not ((value > 0) if above_zero else (value >= 0)) or not value <= MAX_SECONDS:  # NaN too
        bound = "> 0" if above_zero else ">= 0"
        raise ValueError(
            f"{name} must be a number of seconds {bound} and at most {MAX_SECONDS:.0f} "
            f"(about 49 days), got {value!r}"
        )


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

    ``torn`` is set when a journal ended in an append that never finished (a
    crash mid-write): those bytes were ignored; a writer truncates them away.
    """

    meta: Meta
    state: T
    torn: TornTail | None = None


class Prepared(msgspec.Struct, frozen=True, kw_only=True):
    """What the transcript's repair step made of a snapshot: the one to encode, the calls it
    closed, the running items it settled, and the turns (``Meta.turns``; None: not counted)."""

    snapshot: Snapshot
    repaired: int = 0
    settled: int = 0
    turns: int | None = None


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
        repaired: tool calls without a result closed with an error result
            in the file (not in memory) by the transcript's repair step.
        settled: items still running at snapshot time settled as errors in
            the file (not in memory).
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

    * ``"snapshot-failed"``: ``source()``, or the transcript's fingerprint or
      repair step, raised or returned something unusable.
    * ``"encode-failed"``: the state cannot be encoded (the key is named).
    * ``"invalid-key"``: the key breaks the store's rule (the rule is named).
    * ``"not-sendable"``: the transcript's repair step cannot make the history
      one a model API accepts (the JSON paths are named).
    * ``"locked"``: another live writer holds the key's lock (named).
    * ``"conflict"``: the store holds another revision than the one this
      writer expects (resumed from, found at its first write, or wrote
      last): another writer wrote or deleted the key since.  The error
      names that writer and the way out (load again, start a new writer).
    * ``"write-failed"``: the store failed (the path and the error).
    * ``"newer-version"``: the key holds a checkpoint of a newer library or
      state version; it is kept, and the error names what to upgrade.

    The changes stay pending and are retried with backoff, except after
    ``"conflict"``, ``"newer-version"`` and ``"not-sendable"``: no retry can
    succeed until the session changes (the next ``notify()``).
    """

    reason: FailReason
    error: str


Result: TypeAlias = Written | Skipped | Failed


class RegistryStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of a registry's counters (``SessionRegistry.statistics()``).

    Attributes:
        open: sessions whose writer is open (or opening, or closing) now.
        in_use: of those, sessions inside a ``session()`` block now.
        opened: writers opened, reopens included.
        closed_idle: writers closed after ``idle_timeout`` unused.
        evicted: writers closed to stay within ``max_open``.
        failed: opens that raised (``resume``, a refused first write, ...).
    """

    open: int
    in_use: int
    opened: int
    closed_idle: int
    evicted: int
    failed: int


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
        repaired: tool calls closed in written files, in all.
        settled: running items settled in written files, in all.
        last_result: the result of the latest write, or None before the first.
        last_failure: the latest ``Failed``, even after later successes (a
            failed final write too, logged at ERROR), or None.
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
    """A write a caller waits for was not written: the framework adapters raise it where
    the framework has no place for a result value (a ``durability="sync"`` put, say).

    Attributes:
        result: the writer's ``Failed`` value (its ``reason`` and ``error``).
    """

    def __init__(self, result: Failed) -> None:
        self.result = result
        super().__init__(f"checkpoint not written ({result.reason}): {result.error}")
