"""The store protocols: what the writer and ``load()`` need of a store, in one file.

``Store`` (bytes, one key at a time; every write conditional on the revision
the writer expects), ``StateStore`` (a store that encodes states itself),
the optional ``LockingStore`` and ``ProbingStore``, and the key rule.
"""

from __future__ import annotations

import inspect
import re
import secrets
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

import msgspec

from .._format.envelope import decode_meta
from .._values import Checkpoint, Meta
from .encoding import Transcript

__all__ = [
    "KEY_PATTERN",
    "KeyLock",
    "KeyLocked",
    "LockHolder",
    "LockingStore",
    "ProbingStore",
    "Staged",
    "StaleWrite",
    "StateStore",
    "Store",
    "check_key",
    "commit_deadline",
    "fences",
    "landed",
    "new_revision",
    "time_left",
    "unfenced",
]

KEY_PATTERN = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,199}")
"""A key: 1-200 letters, digits, ``.``, ``_``, ``-``; not starting with ``.``."""

_RULE = "a key is 1-200 ASCII letters, digits, '.', '_' or '-', not starting with '.'"
_KEY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


def check_key(key: object) -> str:
    """Return ``key`` if it is a valid checkpoint key.

    Raises:
        ValueError: naming the key and the rule it breaks.
    """
    if not isinstance(key, str):
        # ValueError, not TypeError: every bad key is one kind of error for callers.
        why = f"it is of type {type(key).__name__}, not str"
        raise ValueError(f"invalid key {_shown(key)}: {why}; {_RULE}")  # noqa: TRY004
    if KEY_PATTERN.fullmatch(key) is None:
        if not key:
            why = "it is empty"
        elif len(key) > 200:
            why = f"it has {len(key)} characters"
        elif key.startswith("."):
            why = "it starts with '.'"
        else:
            bad = next(c for c in key if c not in _KEY_CHARS)
            why = f"it contains {bad!r}"
        raise ValueError(f"invalid key {_shown(key)}: {why}; {_RULE}")
    return key


def _shown(key: object) -> str:
    text = repr(key)
    return text if len(text) <= 80 else text[:77] + "..."


@runtime_checkable
class Store(Protocol):
    """What a checkpoint writer needs from storage.

    Every method is synchronous and may block; the writer calls them from a
    worker thread (async path) or directly (``flush_sync``).  ``write`` is
    atomic (after a crash a reader sees the old bytes or the new ones) and
    conditional (see there): the store, not the writer, decides whether a
    write may replace what it holds.  A store may also lock a key for one
    live writer (``LockingStore``, optional).
    """

    def validate_key(self, key: str) -> None:
        """Raise ValueError if ``key`` cannot name a checkpoint here."""

    def location(self, key: str) -> str:
        """Where ``key`` lives, for messages and ``Written.location``."""

    def open(self) -> None:
        """Prepare for writing (clean up debris of crashed writers)."""

    def write(
        self, key: str, chunks: Sequence[bytes], *, revision: str, expected: str | None
    ) -> int:
        """Durably replace ``key`` with the joined chunks, if it holds revision ``expected``.

        The check and the replacement are one atomic step (under the key's
        lock, in one SQL statement, by a conditional PUT): between them no
        other write or delete of the key can land.

        Args:
            key: the key.
            chunks: the checkpoint's bytes (a checkpoint envelope), to join.
            revision: the new checkpoint's revision (its ``Meta.revision``),
                to keep with it: the ``expected`` of the next write.
            expected: the revision the key must hold now; None: the key must
                hold no checkpoint.

        Returns:
            The number of bytes written.  If the key holds ``revision``
            already (this very write landed and its answer was lost), the
            write is done: return without writing again.

        Raises:
            StaleWrite: the key holds another revision, or none when one was
                expected (deleted), or one when none was.
            KeyLocked: another live writer holds the key's lock.
            OSError: the write failed; what was stored is intact.
        """

    def read(self, key: str) -> bytes | None:
        """The bytes of ``key``, or None if there is none."""

    def revision(self, key: str) -> str | None:
        """The revision ``key`` holds now (None: no checkpoint), without reading its state.

        Cheap: a reader that keeps a key's state in memory (an adapter's
        cache) compares it before answering from that copy.
        """

    def keys(self) -> list[str]:
        """The keys that have a checkpoint, sorted."""

    def delete(self, key: str) -> bool:
        """Remove ``key``; False if there was nothing to remove.

        A delete is a write: a store that locks keys refuses it while
        another live writer holds the key (``KeyLocked``), and a writer whose
        key was deleted finds it gone at its next write (``StaleWrite``).
        """

    def move_aside(self, key: str, suffix: str) -> str | None:
        """Rename ``key``'s checkpoint out of the way; return where it went."""


def fences(store: object) -> bool:
    """Whether ``store``'s ``write`` (or ``commit``) takes ``expected`` (or ``**kwargs``)."""
    method = getattr(store, "commit" if isinstance(store, StateStore) else "write", None)
    if method is None:
        return False
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "expected" or p.kind is p.VAR_KEYWORD for p in parameters)


def landed(key: str, stored: str | None, revision: str, expected: str | None) -> bool:
    """The check a conditional write makes, given the revision ``stored`` now.

    False: the write may go ahead (``stored`` is ``expected``); True: this
    very write landed already (a retry whose first answer was lost).
    ``StaleWrite`` for any other revision, or none.
    """
    if stored == expected:
        return False
    if stored == revision:
        return True
    raise StaleWrite(key, expected=expected, stored=stored)


def unfenced(store: Any) -> Store:
    """``store``, whose ``write`` (or ``StateStore.commit``) cannot refuse a stale write, as it is.

    For a store that takes no ``expected`` revision: its writes go through
    unconditionally, so your program must make sure that one writer at a
    time writes each key (nothing else will).  Every other attribute is
    the store's own (``lock``, ``probe``, ...); a store without ``revision``
    (written before it) gets one that reads the stored checkpoint's meta.
    """
    return _Unfenced(store)


class _Unfenced:
    def __init__(self, store: Any) -> None:
        self._store = store
        # The store's methods on the instance: Python 3.12's isinstance() checks of the
        # protocols (LockingStore, ProbingStore, ...) look them up statically, not
        # through __getattr__.
        for name in dir(store):
            if not name.startswith("_") and not hasattr(_Unfenced, name):
                value = getattr(store, name, None)
                if callable(value):
                    setattr(self, name, value)

    def __repr__(self) -> str:
        return f"unfenced({self._store!r})"

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def write(
        self, key: str, chunks: Sequence[bytes], *, revision: str, expected: str | None
    ) -> int:
        return int(self._store.write(key, chunks))

    def commit(self, key: str, meta: Meta, staged: Staged, *, expected: str | None) -> int:
        return int(self._store.commit(key, meta, staged))

    def update_meta(self, key: str, meta: Meta, *, expected: str) -> None:
        self._store.update_meta(key, meta)

    def revision(self, key: str) -> str | None:
        own = getattr(self._store, "revision", None)
        if own is not None:
            return own(key)  # type: ignore[no-any-return]
        data = self._store.read(key)
        return None if data is None else decode_meta(data, self._store.location(key)).revision


def new_revision() -> str:
    """A revision no other write repeats: 64 random bits, in hex."""
    return secrets.token_hex(8)


@runtime_checkable
class ProbingStore(Protocol):
    """The optional capability of a store to say cheaply that it can be reached again.

    A writer waiting out a retry backoff after a failed write calls
    ``probe`` about once a second (in a worker thread); True ends the wait
    and the write is retried at once.  So after an outage the writer is
    back within a second of the store, not at the end of a long backoff.
    """

    def probe(self) -> bool:
        """True if a write that failed because the store was unreachable would now reach it.

        False when the store was not lost (the failure was of another kind,
        whose backoff stands) or still does not answer.  Cheap, bounded,
        never raises.
        """
        ...


_deadline = threading.local()


class commit_deadline:  # lower case: used as a function, `with commit_deadline(t):`
    """Bound, on this thread, the waits of the store calls made inside the block.

    ``timeout``: seconds from now; negative means no bound.  (A class, not a
    generator: it is entered on every write.)
    """

    __slots__ = ("_at", "_previous")

    def __init__(self, timeout: float) -> None:
        self._at = None if timeout < 0 else time.monotonic() + timeout
        self._previous: float | None = None

    def __enter__(self) -> None:
        self._previous = getattr(_deadline, "at", None)
        _deadline.at = self._at

    def __exit__(self, *exc_info: object) -> None:
        _deadline.at = self._previous


def time_left() -> float:
    """Seconds left before this thread's ``commit_deadline`` (-1: none), for ``Lock.acquire``."""
    at: float | None = getattr(_deadline, "at", None)
    if at is None:
        return -1
    return max(0.0, at - time.monotonic())


class Staged(Protocol):
    """A state staged on the caller's thread, ready for ``StateStore.commit``."""

    def content(self) -> object:
        """What would be stored, for the writer's "unchanged" check.

        Two staged states of a key compare equal (``==``) only if committing
        either stores the same state.  Called in the worker thread.
        """
        ...


@runtime_checkable
class StateStore(Protocol):
    """A store that takes states, not bytes: it encodes and lays them out itself.

    The writer calls ``stage`` on the caller's thread and the other methods
    from a worker thread (or the thread of ``flush_sync``), one at a time
    per writer, under its I/O lock.
    """

    def stage(self, key: str, state: Any, transcript: Transcript | None) -> Staged:
        """Encode what must be read from ``state`` now (caller's thread).

        ``transcript``, the writer's, says where the state keeps its messages.
        """
        ...

    def commit(self, key: str, meta: Meta, staged: Staged, *, expected: str | None) -> int:
        """Store a staged state durably, if ``key`` holds revision ``expected``; return the bytes.

        Conditional and atomic as ``Store.write`` is (``meta.revision`` is
        the new revision).  Raises ``StaleWrite`` or ``KeyLocked`` as it
        does, OSError (or CheckpointError for a file it cannot trust) on
        failure; the previous checkpoint is then still loadable.
        """
        ...

    def read_meta(self, key: str) -> Meta | None:
        """The meta of ``key``'s checkpoint, or None; CheckpointError if untrusted."""
        ...

    def update_meta(self, key: str, meta: Meta, *, expected: str) -> None:
        """Store ``meta`` with the state unchanged, if ``key`` holds revision ``expected``.

        Conditional as ``commit`` is: ``StaleWrite`` when the key holds
        another revision or none.
        """
        ...

    def read_checkpoint(self, key: str) -> Checkpoint[msgspec.Raw] | None:
        """The checkpoint of ``key``, its state as raw JSON; None if none.

        ``load()`` decodes (and migrates) the state.  Raises CheckpointError
        for a checkpoint that cannot be trusted, or cannot be read.
        """
        ...


class LockHolder(msgspec.Struct, frozen=True, kw_only=True):
    """Who holds a key's writer lock: written into the lock file for display."""

    pid: int
    host: str
    started_at: datetime

    def describe(self) -> str:
        try:
            started = self.started_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        except (OverflowError, ValueError):  # a hand-edited time outside the calendar
            started = self.started_at.isoformat()
        return f"pid {self.pid} on {self.host} since {started}"


class StaleWrite(Exception):
    """A store refused a write: the key does not hold the revision the writer expected.

    Another writer wrote the key, or deleted it, after this writer looked;
    replacing that would lose its work.  The writer reports it as
    ``Failed("conflict")`` and does not retry until the session changes.

    Attributes:
        key: the key.
        expected: the revision the write expected (None: no checkpoint).
        stored: the revision the key holds (None: no checkpoint).
    """

    def __init__(self, key: str, *, expected: str | None, stored: str | None) -> None:
        held = "no checkpoint" if stored is None else f"revision {stored}"
        wanted = "none" if expected is None else f"revision {expected}"
        super().__init__(f"key {key!r} holds {held}, not the expected {wanted}")
        self.key = key
        self.expected = expected
        self.stored = stored


class KeyLocked(Exception):
    """Another live writer holds the key's lock.

    Attributes:
        key: the key.
        location: where the lock is (a path for ``FileStore``).
        holder: who holds it, if it said so, else None.
    """

    def __init__(self, key: str, location: str, holder: LockHolder | None) -> None:
        who = holder.describe() if holder is not None else "a writer that has not said who"
        super().__init__(
            f"key {key!r} is locked by another writer ({who}; {location}): close that "
            "writer, or give yours limits=Limits(lock_timeout=...) to wait for it"
        )
        self.key = key
        self.location = location
        self.holder = holder


class KeyLock(Protocol):
    """A held writer lock of one key."""

    def release(self) -> None:
        """Give the lock up; idempotent."""


@runtime_checkable
class LockingStore(Protocol):
    """The optional capability of a store to lock a key for one writer.

    A ``CheckpointWriter`` takes the lock of a key before its first write of
    that key and releases it when it closes or moves to another key.
    Readers (``load``) never lock.
    """

    def lock(self, key: str, *, timeout: float = 0.0) -> KeyLock:
        """Take the writer lock of ``key``, waiting at most ``timeout`` seconds.

        Raises:
            KeyLocked: another writer still holds it after ``timeout``.
            OSError: the lock could not be taken for another reason.
        """
        ...
