"""What a writer knows of each key's checkpoint on disk, and how it learns it.

Per key (``KeyState``): the seq, creation time and flags of the checkpoint
on disk, the generation and content of this writer's last write there, and
the *window*: the checkpoint this writer may replace.  ``Keys`` holds them
and learns them from the store:

* ``resolve``: before the first write of a key (and after losing its lock
  or a failed write), read the stored meta: seq, created_at, pinned.  A
  checkpoint that cannot be trusted is moved aside; one of a newer state
  version is refused (``NewerVersionError``), never replaced.
* ``conflict``: the window is what was stored when this writer first
  looked at the key (or ``resume_from``), then each of its own writes; any
  other checkpoint is another writer's work since: ``Failed("conflict")``.
* ``look``: a reader's look, without the lock, when another writer holds
  it (before waiting for it with ``lock_timeout``), so the window starts at
  the first attempt all the same.
* ``finish``: the keys the source moved away from are marked not live.

Called by the commit core (``commit.py``) under the writer's I/O lock, and
by its prepare step under the snapshot lock (``select``).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import msgspec

from .._format.versions import newer_state
from .._stores.base import StateStore, Store
from .._text import describe_error
from .._values import CheckpointError, Failed, Meta, NewerVersionError
from .keylocks import KeyLocks

__all__ = ["KeyState", "Keys", "same", "utcnow"]

logger = logging.getLogger("checkpointer")


def utcnow() -> datetime:
    return datetime.now(UTC)


class KeyState:
    """What this writer knows about one key's checkpoint on disk."""

    __slots__ = (
        "conflicted",
        "content",
        "created_at",
        "live",
        "looked",
        "newest_gen",
        "parent",
        "pin",
        "pinned",
        "resolved",
        "seen",
        "seq",
        "tried",
        "turns",
    )

    def __init__(self) -> None:
        self.resolved = False  # seq/created_at/pinned read from the store
        self.seq = 0
        self.created_at: datetime | None = None
        self.content: object = None  # fingerprint or digest of the state on disk
        self.live: bool | None = None  # live flag on disk (None: unknown)
        self.pinned: bool | None = None  # pinned flag on disk (None: unknown)
        self.pin: bool | None = None  # requested by write_now(pin=...)
        self.newest_gen = -1  # generation of the snapshot on disk
        self.parent: str | None = None  # Meta.parent of our last write
        self.turns: int | None = None  # Meta.turns of our last write
        # The checkpoint this writer may replace: what was stored when it first
        # looked at the key (or resume_from), then each of its own writes.  Any
        # other is another writer's work since then (see _conflict).
        self.looked = False
        self.seen: Meta | None = None
        self.tried: Meta | None = None  # a commit that failed, whose bytes may have landed
        self.conflicted = False  # the conflict was logged

    def holds(self, content: object, live: bool, parent: str | None, turns: int | None) -> bool:
        """Whether the store holds this state with the meta the caller controls."""
        pinned = self.pin if self.pin is not None else self.pinned
        return (
            self.content is not None
            and _equal(self.content, content)
            and self.live == live
            and self.pinned == pinned
            and self.parent == parent
            and self.turns == turns
        )


_TAIL = 4096


def _equal(held: object, content: object) -> bool:
    """``held == content``, exactly; for large encoded states, the tails first.

    A session changes at its end (a new message, the last one edited), and
    a memcmp of two equal-length 10 MiB states takes about a millisecond:
    comparing the last 4 KiB first says "changed" in a microsecond.
    """
    if (
        type(held) is bytes
        and type(content) is bytes
        and len(held) == len(content) > 4 * _TAIL
        and held[-_TAIL:] != content[-_TAIL:]
    ):
        return False
    return held == content


class Keys:
    """The ``KeyState`` of every key a writer has written or looked at, and the key now.

    Args:
        store: the writer's store (locations, ``move_aside``).
        states: its ``StateStore`` (``read_meta``, ``read_checkpoint``,
            ``update_meta``).
        state_version: the writer's state version: a newer one on disk is
            refused.
        resume_from: the meta the session was loaded from: the window of
            its key starts there.
    """

    def __init__(
        self, store: Store, states: StateStore, state_version: int, resume_from: Meta | None
    ) -> None:
        self._store = store
        self._states = states
        self._state_version = state_version
        self.by_key: dict[str, KeyState] = {}
        if resume_from is not None:
            resumed = self.by_key[resume_from.key] = KeyState()
            resumed.looked, resumed.seen = True, resume_from
        self.current: str | None = None  # the key of the last snapshot
        self.to_finish: set[str] = set()  # keys the source moved away from, still live

    def select(self, key: str) -> KeyState:
        """The state of ``key``, now the current key; the one before it is to be finished."""
        state = self.by_key.get(key)
        if state is None:
            state = self.by_key[key] = KeyState()
        if self.current is not None and self.current != key:
            self.to_finish.add(self.current)
        self.current = key
        self.to_finish.discard(key)
        return state

    def resolve(self, key: str, state: KeyState) -> Failed | None:
        """Learn seq, created_at and pinned from the checkpoint already stored.

        Returns:
            ``Failed("conflict")`` if another writer stored it after this
            writer first looked at the key (the key stays unresolved, so the
            next attempt looks again); None otherwise.
        """
        meta: Meta | None = None
        try:
            meta = self._states.read_meta(key)
        except NewerVersionError:
            raise  # not damage: never moved aside
        except CheckpointError as exc:
            aside = self._store.move_aside(key, "corrupt-" + utcnow().strftime("%Y%m%dT%H%M%S.%fZ"))
            logger.warning(
                "checkpointer: %s; moved it aside to %s and starting afresh",
                exc,
                aside,
            )
        else:
            if meta is not None:
                if meta.state_version > self._state_version:
                    raise newer_state(
                        self._store.location(key),
                        meta,
                        f"this writer's state version is {self._state_version}; not replacing "
                        "it (upgrade the program, or use another key)",
                    )
                conflict = self.conflict(key, state, meta)
                if conflict is not None:
                    return conflict
                state.seq = meta.seq
                state.created_at = meta.created_at
                state.pinned = meta.pinned
        if not state.looked:
            state.looked, state.seen = True, meta
        state.resolved = True
        return None

    def look(self, key: str, state: KeyState) -> None:
        """Note what is stored for ``key`` now, without its lock (a reader's read).

        ``read_checkpoint`` is the read ``load()`` does: a file replaced
        atomically, a journal's committed rows, a database row; it changes
        nothing.  If it fails, the next attempt looks, under the lock.
        """
        try:
            checkpoint = self._states.read_checkpoint(key)
        except Exception:
            return
        state.looked = True
        state.seen = None if checkpoint is None else checkpoint.meta

    def conflict(self, key: str, state: KeyState, meta: Meta) -> Failed | None:
        """``Failed("conflict")`` if ``meta`` is not a checkpoint this writer may replace."""
        if not state.looked or same(meta, state.seen):
            return None
        if same(meta, state.tried):  # our failed commit landed after all
            state.seen, state.tried = meta, None
            return None
        state.content = None  # whatever we wrote, it is not what the store holds
        who = (
            f"pid {meta.writer.pid} on {meta.writer.host}"
            if meta.writer is not None
            else "a writer that did not say who"
        )
        since = "when it had no checkpoint" if state.seen is None else f"at seq {state.seen.seq}"
        error = (
            f"key {key!r} was written by another writer ({who}, seq {meta.seq}, "
            f"{meta.updated_at:%Y-%m-%dT%H:%M:%SZ}) after this writer first saw it {since} "
            f"({self._store.location(key)}); not replacing it: load the key again and start "
            "a new writer from what it holds, or write to another key"
        )
        if not state.conflicted:
            state.conflicted = True
            logger.warning("checkpointer: %s; not retrying until the session changes", error)
        return Failed("conflict", error)

    def finish(self, locks: KeyLocks) -> None:
        """Mark the checkpoints of keys the source moved away from not live."""
        for key in list(self.to_finish):
            state = self.by_key.get(key)
            if state is None or state.live is not True:
                self.to_finish.discard(key)
                locks.release(key)
                continue
            try:
                meta = self._states.update_meta(key, finished)
                if meta is not None:
                    state.seq = meta.seq
                    state.seen = meta
                state.live = False
                self.to_finish.discard(key)
                locks.release(key)
            except Exception as exc:
                logger.warning(
                    "checkpointer: could not mark %s not live: %s (will retry)",
                    self._store.location(key),
                    describe_error(exc),
                )


def finished(old: Meta) -> Meta:
    """``old`` as the final checkpoint of its key: one seq more, now, not live."""
    return msgspec.structs.replace(old, seq=old.seq + 1, updated_at=utcnow(), live=False)


def same(meta: Meta, other: Meta | None) -> bool:
    """Whether two metas are of the same write (seq, time and writer: not merely equal seq)."""
    return (
        other is not None
        and meta.seq == other.seq
        and meta.updated_at == other.updated_at
        and meta.writer == other.writer
    )
