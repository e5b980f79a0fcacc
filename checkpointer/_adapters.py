"""What the framework adapters share: the key of a framework's id, option checks, lock refusals,
the registry of an adapter's sessions.

Over the public API only, as the adapters themselves; the core never imports it.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, Literal, Protocol

from checkpointer import (
    Checkpoint,
    CheckpointFailed,
    Failed,
    KeyCommitter,
    Limits,
    Meta,
    Result,
    SessionRegistry,
    Snapshot,
)
from checkpointer.stores import KEY_PATTERN, KeyLocked, LockingStore, Store

__all__ = [
    "HELD",
    "Held",
    "Keeper",
    "check_committer_options",
    "check_durability",
    "check_options",
    "committer_options",
    "framework_key",
    "holding",
    "lock_timeout",
    "locked",
    "probe_lock",
    "raise_failed",
    "session_registry",
]

Durability = Literal["async", "sync"]


def framework_key(ident: str, *, plain: str, hashed: str) -> str:
    """The key of a framework's id: ``plain + id`` if a key can spell it, else a digest key.

    The digest key is ``hashed + sha256(id)[:40]``.  With a ``plain`` prefix
    that ``hashed`` does not start with (``"lg-"``, ``"lg."``), no id's plain
    key is another id's digest key.
    """
    key = plain + ident
    if KEY_PATTERN.fullmatch(key) is not None:
        return key
    return hashed + hashlib.sha256(ident.encode()).hexdigest()[:40]


def check_options(owner: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` for ``owner``'s writers; TypeError if they set what ``owner`` sets itself."""
    for reserved in ("source", "store", "resume_from"):
        if reserved in options:
            raise TypeError(f"{owner} sets {reserved!r} itself")
    return options


_COMMITTER = ("transcript", "state_version", "limits")  # the options a KeyCommitter takes


def committer_options(options: dict[str, Any]) -> dict[str, Any]:
    """The writer options a ``KeyCommitter`` takes too (the timing ones are the writer's)."""
    return {k: v for k, v in options.items() if k in _COMMITTER}


def check_committer_options(owner: str, options: dict[str, Any], why: str) -> dict[str, Any]:
    """``check_options``, and TypeError (saying ``why``) for one a ``KeyCommitter`` lacks."""
    unknown = sorted(set(check_options(owner, options)) - set(_COMMITTER))
    if unknown:
        raise TypeError(f"{owner} takes {', '.join(_COMMITTER)}, not {', '.join(unknown)}: {why}")
    return options


class Keeper(Protocol):
    """An adapter that keeps its sessions' state for the writers of a ``SessionRegistry``."""

    def _snapshot(self, key: str) -> Snapshot | None:
        """The key's state now (the registry's ``source``)."""

    def _resume(self, key: str) -> Checkpoint[Any] | Meta | None:
        """Load the key as the registry opens it (blocking) and set up its state."""

    def _closed(self, key: str, result: Result) -> None:
        """Drop the key's state: its writer closed with ``result``."""


def session_registry(
    keeper: Keeper,
    store: Store,
    options: dict[str, Any],
    *,
    idle_timeout: float,
    max_open: int | None,
    first_write_takes_key: bool = False,
) -> SessionRegistry:
    """The ``SessionRegistry`` over ``store`` of ``keeper``'s sessions; ``options`` (checked
    by ``check_options``) for each writer.

    ``first_write_takes_key``: a key opened to be read is not written (nor
    locked) until its first change (``write_on_start=False``).
    """
    if first_write_takes_key:
        options = {**options, "write_on_start": False}
    return SessionRegistry(
        keeper._snapshot,
        store,
        resume=keeper._resume,
        on_close=keeper._closed,
        idle_timeout=idle_timeout,
        max_open=max_open,
        **options,
    )


def lock_timeout(options: dict[str, Any]) -> float:
    """The ``Limits.lock_timeout`` of the writer options."""
    limits: Limits = options.get("limits", Limits())
    return limits.lock_timeout


def check_durability(value: str) -> Durability:
    """``value``, or ValueError if it is neither ``"async"`` nor ``"sync"``."""
    if value not in ("async", "sync"):
        raise ValueError(f"durability must be 'async' or 'sync', got {value!r}")
    return value  # type: ignore[return-value]


def raise_failed(result: Result | None) -> None:
    """Raise ``CheckpointFailed`` for a ``Failed``: where the framework has no place for a value."""
    if isinstance(result, Failed):
        raise CheckpointFailed(result)


def locked(exc: KeyLocked, way_out: str) -> CheckpointFailed:
    """``CheckpointFailed("locked")`` naming the holder (``exc``) and ``way_out``."""
    return CheckpointFailed(Failed("locked", f"{exc}; {way_out}"))


def probe_lock(store: Store, key: str, options: dict[str, Any], way_out: str) -> None:
    """Raise ``CheckpointFailed("locked")`` now if another writer holds ``key`` (blocking).

    A probe (taken and let go): the writer takes the lock at its first
    write, and one that comes in between is found then.
    """
    if isinstance(store, LockingStore):
        try:
            store.lock(key, timeout=lock_timeout(options)).release()
        except KeyLocked as exc:
            raise locked(exc, way_out) from None


@contextlib.contextmanager
def holding(store: Store, *keys: str, timeout: float) -> Iterator[None]:
    """Hold these keys' locks for the block, each waited for up to ``timeout`` (``KeyLocked``).

    A store without locks has nothing to hold: a delete there races writers.
    """
    with contextlib.ExitStack() as held:
        if isinstance(store, LockingStore):
            for key in keys:
                held.callback(store.lock(key, timeout=timeout).release)
        yield


class Held:
    """The committers of this process holding their key's lock, at most ``limit``.

    A file store spends a descriptor per held lock: past ``limit`` the least
    recently used committer lets go (``KeyCommitter.release``), and its next
    commit takes the lock again, fenced on what it wrote.  So a server keeps
    any number of sessions under ``ulimit -n``; one recently used refuses a
    second process at once, one let go refuses it at its next commit.
    """

    def __init__(self, limit: int | None = None) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._order: OrderedDict[KeyCommitter, None] = OrderedDict()

    def limit(self) -> int:
        """``limit``; without one, ``SessionRegistry.default_max_open()`` (read at each use: a
        server may raise its ``ulimit -n`` after import)."""
        return SessionRegistry.default_max_open() if self._limit is None else self._limit

    def used(self, committer: KeyCommitter) -> None:
        """``committer`` has committed (it holds its lock): the most recently used now."""
        limit = self.limit()
        with self._lock:
            self._order[committer] = None
            self._order.move_to_end(committer)
            over = len(self._order) - limit
            oldest = [self._order.popitem(last=False)[0] for _ in range(max(over, 0))]
        for committer_ in oldest:  # outside the lock: a release waits for no commit
            committer_.release()

    def forget(self, committer: KeyCommitter) -> None:
        """``committer`` is closed: it holds nothing."""
        with self._lock:
            self._order.pop(committer, None)


HELD = Held()  # the process's: every adapter's committers share the descriptors
