"""What a writer knows and holds of each key: the checkpoint it expects stored, its lock.

``KeyState.base`` is its ``Meta``: the one resumed from, else the one found at
the first write, then each own write.  Every write hands the store
``base.revision`` as expected; the store refuses it if it holds another.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import logging
from datetime import UTC, datetime

import msgspec

from .._format.versions import newer_state
from .._stores.base import (
    KeyLock,
    KeyLocked,
    LockingStore,
    Staged,
    StaleWrite,
    StateStore,
    Store,
    new_revision,
    time_left,
)
from .._stores.sealing import DecryptionError
from .._text import describe_error
from .._values import CheckpointError, Failed, Meta, NewerVersionError

__all__ = ["UNKNOWN", "KeyLocks", "KeyState", "Keys", "Unknown", "utcnow"]

logger = logging.getLogger("checkpointer")


class Unknown(enum.Enum):
    """``resume_from`` not given: the base is what the store holds at the first write."""

    UNKNOWN = "unknown"


UNKNOWN = Unknown.UNKNOWN


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclasses.dataclass(slots=True, eq=False)
class KeyState:
    """What this writer knows about one key: the checkpoint it expects stored."""

    base: Meta | None = None  # the checkpoint expected stored (None: none)
    known: bool = False  # base was given (resume_from) or read from the store
    own: bool = False  # base is this writer's own write
    content: object = None  # fingerprint or bytes of base's state, when own
    pin: bool | None = None  # requested by write_now(pin=...)
    newest_gen: int = -1  # generation of the snapshot the store holds
    # Writes sent whose answer never came: the store may hold one of them.
    sent: dict[str, Meta] = dataclasses.field(default_factory=dict)
    # (generation, meta, staged) of an exit flush writing past a write stuck
    # in a worker thread (see Committer._commit).
    overtaking: tuple[int, Meta, Staged] | None = None

    def holds(self, content: object, live: bool, parent: str | None, turns: int | None) -> bool:
        """Whether the store holds this state with the meta the caller controls."""
        base = self.base
        if base is None or self.content is None:
            return False
        pinned = self.pin if self.pin is not None else base.pinned
        return (
            base.live == live
            and base.pinned == pinned
            and base.parent == parent
            and base.turns == turns
            and _equal(self.content, content)
        )

    def wrote(self, meta: Meta, content: object, gen: int) -> None:
        """This writer's write of ``meta`` landed: it is the base now."""
        self.base, self.own, self.known = meta, True, True
        self.content = content
        self.newest_gen = gen
        self.sent.clear()


def _equal(held: object, content: object) -> bool:
    """``held == content``; for large encoded states the last 4 KiB first (a session
    changes at its end: a microsecond to say "changed", not a 10 MiB memcmp's millisecond).
    """
    if type(held) is bytes and type(content) is bytes and len(held) == len(content) > 16384:
        return held[-4096:] == content[-4096:] and held == content
    return held == content


class KeyLocks:
    """The writer locks one ``CheckpointWriter`` holds, one per key.

    Over the ``LockingStore`` capability: a store without it is not locked,
    and every ``acquire`` succeeds.
    """

    def __init__(self, store: object, timeout: float) -> None:
        self._store = store if isinstance(store, LockingStore) else None
        self._timeout = timeout
        self._held: dict[str, KeyLock] = {}

    def acquire(self, key: str, location: str, *, wait: bool = True) -> Failed | bool:
        """Take ``key``'s lock unless held, waiting up to ``lock_timeout`` if ``wait``, never
        past the caller's ``commit_deadline`` (an exit flush's ``exit_timeout``).

        True when taken now, False when held already or the store does not
        lock, ``Failed`` (naming ``location``) when refused.
        """
        if self._store is None or key in self._held:
            return False
        timeout = self._timeout if wait else 0.0
        if (left := time_left()) >= 0:
            timeout = min(timeout, left)
        try:
            self._held[key] = self._store.lock(key, timeout=timeout)
        except KeyLocked as exc:
            return Failed("locked", str(exc))
        except Exception as exc:
            return Failed("write-failed", f"cannot lock {location}: {type(exc).__name__}: {exc}")
        return True

    def release(self, key: str) -> None:
        lock = self._held.pop(key, None)
        if lock is not None:
            try:
                lock.release()
            except Exception as exc:  # closing must go on; the kernel frees it at exit
                logger.warning("checkpointer: could not release the lock of %r: %s", key, exc)

    def release_all(self) -> None:
        for key in list(self._held):
            self.release(key)


class Keys:
    """The ``KeyState`` of every key a writer has written or looked at, and the key now.

    ``resume_from``: the meta loaded, None (the first key was absent), or ``UNKNOWN``.
    """

    def __init__(
        self,
        store: Store,
        states: StateStore,
        state_version: int,
        resume_from: Meta | Unknown | None,
    ) -> None:
        self._store = store
        self._states = states
        self._state_version = state_version
        self._resume = resume_from
        self.by_key: dict[str, KeyState] = {}
        self.current: str | None = None  # the key of the last snapshot
        self.to_finish: set[str] = set()  # keys the source moved away from, still live

    def select(self, key: str) -> KeyState:
        """The state of ``key``, now the current key; the one before it is to be finished."""
        state = self.by_key.get(key)
        if state is None:
            resume = self._resume
            if isinstance(resume, Meta) and resume.key == key:
                state = KeyState(resume, known=True)
            else:  # resume_from=None: the session's first key is known to be absent
                state = KeyState(None, known=resume is None and not self.by_key)
            self.by_key[key] = state
        if self.current is not None and self.current != key:
            self.to_finish.add(self.current)
        self.current = key
        self.to_finish.discard(key)
        return state

    def resolve(self, key: str, state: KeyState) -> None:
        """Learn the base from the store if unknown (damage moved aside); refuse a newer one.

        Raises NewerVersionError for a newer state version (kept), OSError if unreadable.
        """
        if not state.known:
            try:
                state.base = self._states.read_meta(key)
            except CheckpointError as exc:
                self.set_aside(key, exc)
                state.base = None
            state.known = True
        base = state.base
        if base is not None and base.state_version > self._state_version:
            raise newer_state(
                self._store.location(key),
                base,
                f"this writer's state version is {self._state_version}; not replacing "
                "it (upgrade the program, or use another key)",
            )

    def set_aside(self, key: str, exc: CheckpointError) -> None:
        """Move ``key``'s damaged checkpoint aside (kept) to start afresh; raise a newer one's."""
        if isinstance(exc, NewerVersionError | DecryptionError):
            raise exc  # not damage: kept for the newer version, or for the key that opens it
        aside = self._store.move_aside(key, utcnow().strftime("corrupt-%Y%m%dT%H%M%S.%fZ"))
        if aside is None:  # gone or rewritten meanwhile: nothing of it to keep aside
            logger.warning("checkpointer: %s; it changed before it could be moved aside", exc)
        else:
            logger.warning("checkpointer: %s; moved it aside to %s and starting afresh", exc, aside)

    def look(self, key: str, state: KeyState) -> None:
        """Learn the base before waiting for the key's lock: a writer that waits for another
        expects what was stored when it first tried, not what that one stores meanwhile."""
        with contextlib.suppress(Exception):
            state.base, state.known = self._states.read_meta(key), True

    def conflict(self, key: str, state: KeyState, exc: StaleWrite) -> Failed:
        """``Failed("conflict")`` for a write the store refused, naming the other writer."""
        state.content = None
        state.sent.clear()
        what = "was deleted"
        if exc.stored is not None:
            what = f"was written by another writer (revision {exc.stored})"
            with contextlib.suppress(Exception):
                meta = self._states.read_meta(key)
                if meta is not None and meta.revision == exc.stored:
                    who = "a writer that did not say who"
                    if meta.writer is not None:
                        who = f"pid {meta.writer.pid} on {meta.writer.host}"
                    when = f"{meta.updated_at:%Y-%m-%dT%H:%M:%SZ}"
                    what = f"was written by another writer ({who}, seq {meta.seq}, {when})"
        since = "when it had no checkpoint" if state.base is None else f"at seq {state.base.seq}"
        error = (
            f"key {key!r} {what} after this writer first saw it {since} "
            f"({self._store.location(key)}); not replacing it: load the key again and start "
            "a new writer from what it holds, or write to another key"
        )
        return Failed("conflict", error)

    def finish(self, locks: KeyLocks) -> None:
        """Mark this writer's live checkpoints of keys the source moved away from not live."""
        for key in list(self.to_finish):
            state = self.by_key[key]
            base = state.base
            if base is not None and state.own and base.live:
                meta = msgspec.structs.replace(
                    base, seq=base.seq + 1, updated_at=utcnow(), live=False, revision=new_revision()
                )
                try:
                    self._states.update_meta(key, meta, expected=base.revision)
                except StaleWrite:
                    state.own, state.content = False, None  # another writer's now
                except Exception as exc:
                    logger.warning(
                        "checkpointer: could not mark %s not live: %s (will retry)",
                        self._store.location(key),
                        describe_error(exc),
                    )
                    continue
                else:
                    state.base = meta
            self.to_finish.discard(key)
            locks.release(key)
