"""Staging by prefix, shared by the two journals: what is new since the last commit.

``JournalStore`` (``_journal.py``) and ``PostgresJournalStore``
(``_pgjournal.py``) stage a state the same way (``_Prefixes``) and differ
only in how they store rows.

The store remembers, per key, the messages it has written (``_Track`` and
its ``_Known``): their bytes, and the objects staged.  A new state whose
messages (a list or a tuple) start with that prefix gets only its new
messages appended; otherwise (the agent compacted, edited or truncated its
history) it gets a compaction row.  The rule is the bytes: a prefix is
unchanged only if it encodes as it was written, so ``2`` -> ``2.0`` or
``0`` -> ``False`` (equal in Python) is a change, and a message replaced by
another object that encodes the same is not.  Settled messages (deeply
immutable, see ``_encoding.py``) must be the very objects written, checked
in C with one list ``==`` while no settled witness is ``LOOSE`` (``==``
could hide a change), else with an identity scan; unsettled ones are
encoded again, as one array, and compared with what was written.  See ``_Prefixes``.

A staged ``_Delta`` stands for "the first n messages of this epoch", for the
writer's unchanged check (``content()``): exact, since the bytes of a
position never change once a commit has taken them, and a delta whose new
positions another commit took with other bytes (a ``flush_sync`` staged
while a write was in flight) stands for its compaction instead.
"""

from __future__ import annotations

import itertools
import operator
import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

from ._stores.encoding import Transcript, new_epoch, state_pieces
from ._values import Meta

__all__: list[str] = []  # private to the journals


class _Known:
    """What a store knows of one transcript layout (an *epoch*) it wrote.

    Shared by the tracks of one epoch and only ever extended, so the first
    ``n`` entries an older track saw never change (``dead`` aside).  Position
    ``i`` is the ``i``-th message stored:

    * ``chunks[i]``: its bytes, as written;
    * ``witnesses[i]``: the object that was staged there.  At a settled
      position the witness encodes to ``chunks[i]`` for as long as it lives
      (it is deeply immutable), so finding that very object (``is``) there
      again means the same bytes.  Only a settled object that encodes to
      ``chunks[i]`` ever becomes the witness of a settled position;
    * ``unsettled``: the positions whose witness proves nothing (a dict can
      be edited in place), checked by encoding them again: ``joined`` is
      their chunks joined with commas, one ``memcmp`` against a fresh
      encoding of them as one array.

    ``loose``: a settled witness is ``LOOSE`` (``_encoding.settledness``): an
    object equal to it (``==``) may encode differently, so the prefix check
    must be by identity, not ``==``.  ``dead``: an overtaking commit wrote the
    key behind this epoch's back; nothing is staged on it any more.
    """

    __slots__ = ("chunks", "dead", "epoch", "joined", "loose", "unsettled", "witnesses")

    def __init__(
        self,
        epoch: int,
        witnesses: list[Any],
        chunks: list[bytes],
        unsettled: list[int],
        *,
        loose: bool,
    ) -> None:
        self.epoch = epoch
        self.witnesses = witnesses
        self.chunks = chunks
        self.unsettled = unsettled
        self.joined = bytearray(b",".join([chunks[at] for at in unsettled]))
        self.loose = loose
        self.dead = False


class _Track(NamedTuple):
    """What the store knows about one key's journal.  Replaced on every commit."""

    meta: Meta | None  # of the last committed row; None: no file
    size: int
    ino: int
    live: int
    broken: bool  # an append failed: rewrite from memory, never fsync this file again
    known: _Known | None  # None: transcript unknown, the next stage is a compaction
    n: int  # messages in the transcript on disk: known's first n positions
    u: int  # ... of which unsettled: known.unsettled[:u]
    jlen: int  # ... whose joined chunks are known.joined[:jlen]
    head: bytes
    tail: bytes
    name: str | None


def _absent() -> _Track:
    return _Track(None, 0, 0, 0, False, None, 0, 0, 0, b"", b"", None)


class _Full:
    """A whole state to commit as a compaction row (or a fresh file).

    ``messages`` are the objects staged at each position (the witnesses to
    be), ``unsettled`` the positions among them that are not settled,
    ``loose`` whether a settled one is ``LOOSE``.  The first ``count`` chunks
    are the state's, whatever later happens to the list.
    """

    __slots__ = (
        "chunks",
        "count",
        "epoch",
        "head",
        "loose",
        "messages",
        "name",
        "tail",
        "unsettled",
        "whole",
    )

    def __init__(
        self,
        *,
        whole: bytes | None = None,
        name: str | None = None,
        head: bytes = b"",
        tail: bytes = b"",
        chunks: list[bytes] | None = None,
        messages: list[Any] | None = None,
        unsettled: list[int] | None = None,
        loose: bool = False,
    ) -> None:
        self.epoch = new_epoch()
        self.loose = loose
        self.whole = whole
        self.name = name
        self.head = head
        self.tail = tail
        self.chunks = chunks if chunks is not None else []
        self.count = len(self.chunks)
        self.messages = messages if messages is not None else []
        self.unsettled = unsettled if unsettled is not None else []

    def content(self) -> object:
        if self.whole is not None:
            return ("whole", self.whole)
        return (self.epoch, self.count, self.head, self.tail)

    def state_pieces(self) -> list[bytes]:
        if self.whole is not None:
            return [self.whole]
        return state_pieces(self.head, self.chunks[: self.count], self.tail)

    def track(self, meta: Meta, *, size: int, ino: int, live: int) -> _Track:
        """The track of a key once this state is committed (built in the worker)."""
        if self.whole is not None:
            return _absent()._replace(
                meta=meta, size=size, ino=ino, live=live, head=self.head, tail=self.tail
            )
        count = self.count
        known = _Known(  # copies: a Full committed twice must not share its lists
            self.epoch,
            self.messages[:count],
            self.chunks[:count],
            list(self.unsettled),
            loose=self.loose,
        )
        return _Track(
            meta=meta,
            size=size,
            ino=ino,
            live=live,
            broken=False,
            known=known,
            n=count,
            u=len(known.unsettled),
            jlen=len(known.joined),
            head=self.head,
            tail=self.tail,
            name=self.name,
        )


class _Delta:
    """New messages (and the rest of the state) on top of a track's prefix."""

    __slots__ = ("_full", "base", "chunks", "head", "loose", "messages", "tail", "unsettled")

    def __init__(
        self,
        base: _Track,
        messages: list[Any],
        chunks: list[bytes],
        unsettled: list[int],
        head: bytes,
        tail: bytes,
        *,
        loose: bool,
    ) -> None:
        assert base.known is not None
        self.base = base
        self.messages = messages
        self.chunks = chunks
        self.unsettled = unsettled
        self.head = head
        self.tail = tail
        self.loose = loose
        self._full: _Full | None = None

    def content(self) -> object:
        # (epoch, n) stands for the first n positions of the epoch, whose bytes
        # never change once a commit has taken them.  Ours, past the base, may
        # have been taken since we were staged (a commit in flight when a
        # flush_sync staged us): with other bytes, we are another state, to be
        # written as a compaction.
        base = self.base
        known = base.known
        assert known is not None
        count = len(self.chunks)
        taken = known.chunks[base.n : base.n + count]
        if known.dead or (taken and taken != self.chunks[: len(taken)]):
            return self.as_full().content()
        return (known.epoch, base.n + count, self.head, self.tail)

    def as_full(self) -> _Full:
        """The same state as a compaction (the track moved on since staging)."""
        if self._full is None:
            base = self.base
            known = base.known
            assert known is not None
            count = base.n
            self._full = _Full(
                name=base.name,
                head=self.head,
                tail=self.tail,
                chunks=known.chunks[:count] + self.chunks,
                messages=known.witnesses[:count] + self.messages,
                unsettled=known.unsettled[: base.u] + [count + at for at in self.unsettled],
                loose=known.loose or self.loose,
            )
        return self._full

    def rebased(self, track: _Track | None) -> _Delta | None:
        """This state on top of ``track``, if ``track`` is our base plus some of our messages.

        So a delta staged while another commit of its key was in flight is
        still an append (or a meta row) once that commit is on disk.
        """
        base = self.base
        known = base.known
        if (
            track is None
            or track.known is not known
            or known is None
            or known.dead
            or track.broken
            or not base.n <= track.n <= base.n + len(self.chunks)
            or len(known.chunks) != track.n  # not the newest track of the epoch
        ):
            return None
        skip = track.n - base.n
        if known.chunks[base.n : track.n] != self.chunks[:skip]:
            return None
        return _Delta(
            track,
            self.messages[skip:],
            self.chunks[skip:],
            [at - skip for at in self.unsettled if at >= skip],
            self.head,
            self.tail,
            loose=self.loose,
        )


class _Prefixes:
    """Staging by prefix: only the messages after what a key's track holds are new.

    Shared by ``JournalStore`` and the PostgreSQL journal.  The class using it
    keeps ``_transcript``, ``_tracks`` (key -> ``_Track``) and
    ``_witness_lock``; its commit asks ``_settle`` what to write for a staged
    state on top of the key's current track.

    A prefix is unchanged when it *encodes* the same: ``2`` and ``2.0``,
    ``0`` and ``False`` are equal in Python but not on disk, so ``==`` alone
    is never the test.  Settled messages must be the very objects that were
    written: one list ``==`` in C finds them (identity first) while every
    settled witness is ``EXACT``, since then ``==`` cannot hide a change;
    else an identity scan.  Unsettled ones (dicts, plain Structs,
    dataclasses) are encoded again, as one array, and compared with what was
    written.  Anything else (a settled message replaced by another object)
    takes the slow path: every message of the prefix is encoded (through the
    cache) and compared.
    """

    _transcript: Transcript
    _tracks: dict[str, _Track]
    _witness_lock: threading.Lock

    def _settle(self, track: _Track | None, staged: object) -> _Full | _Delta:
        """What to commit for ``staged`` on top of ``track``, the key's current track."""
        if isinstance(staged, _Delta):
            known = staged.base.known
            if staged.base is track and known is not None and not known.dead:
                return staged
            return staged.rebased(track) or staged.as_full()
        if not isinstance(staged, _Full):
            raise TypeError(f"{type(self).__name__} cannot commit {type(staged).__name__}")
        return staged

    def _appended(self, key: str, track: _Track, meta: Meta, delta: _Delta, nbytes: int) -> None:
        """Extend ``key``'s track by an append of ``delta`` (``nbytes`` stored)."""
        known = track.known
        assert known is not None
        n = track.n
        with self._witness_lock:
            known.witnesses.extend(delta.messages)
            known.loose = known.loose or delta.loose
        known.chunks.extend(delta.chunks)
        if delta.unsettled:
            known.unsettled.extend([n + at for at in delta.unsettled])
            if known.joined:
                known.joined += b","
            known.joined += b",".join([delta.chunks[at] for at in delta.unsettled])
        self._tracks[key] = track._replace(
            meta=meta,
            size=track.size + nbytes,
            n=n + len(delta.chunks),
            u=track.u + len(delta.unsettled),
            jlen=len(known.joined),
            head=delta.head,
            tail=delta.tail,
        )

    def stage(self, key: str, state: Any) -> _Full | _Delta:
        transcript = self._transcript
        split = transcript.split(state)
        if split is None:
            return _Full(whole=transcript.encoder.encode(state))
        track = self._tracks.get(key)
        if (
            track is not None
            and track.known is not None
            and not track.known.dead
            and not track.broken
            and track.name == split.name
        ):
            new = self._new_messages(track, split.messages)
            if new is not None:
                chunks, unsettled = transcript.encode_messages(new)
                loose = transcript.any_loose(new)
                transcript.prune(split.messages)
                return _Delta(track, new, chunks, unsettled, split.head, split.tail, loose=loose)
        messages = list(split.messages)  # private: the witnesses to be
        chunks, unsettled = transcript.encode_messages(messages)
        loose = transcript.any_loose(messages)
        transcript.prune(messages)
        return _Full(
            name=split.name,
            head=split.head,
            tail=split.tail,
            chunks=chunks,
            messages=messages,
            unsettled=unsettled,
            loose=loose,
        )

    def _new_messages(
        self, track: _Track, messages: list[Any] | tuple[Any, ...]
    ) -> list[Any] | None:
        """The messages after the track's prefix, or None if the prefix changed.

        Fast path: the messages against the witnesses in C, then one encode of
        the unsettled messages of the prefix, compared with what was written.
        With only ``EXACT`` settled witnesses the first step is one list
        ``==``, identity first (a nanosecond a message, nothing dereferenced
        while the objects are the same; no copy of the prefix: at 100,000
        messages copying the list costs more than the compare, so the
        witnesses are extended with the new messages and trimmed back);
        otherwise an identity scan (``is``, about 20 ns a message).  The
        witnesses are used under a lock that a commit takes to extend them
        (not blocking: a signal handler may re-enter here).
        """
        known = track.known
        assert known is not None
        n = track.n
        if len(messages) < n:
            return None
        if not self._witness_lock.acquire(blocking=False):
            return None  # a commit is extending them, or a signal handler re-entered
        try:
            witnesses = known.witnesses
            if len(witnesses) != n:
                return None  # a newer commit extended them: this track is stale
            if known.loose:
                same = all(map(operator.is_, messages, witnesses))
            else:
                live = messages if isinstance(messages, list) else list(messages)
                witnesses.extend(live[n:])
                try:
                    same = live == witnesses
                except Exception:  # a message's own __eq__ failed: compare the bytes
                    same = False
                finally:
                    del witnesses[n:]
        finally:
            self._witness_lock.release()
        if same:
            if track.u and not self._unsettled_unchanged(track, messages):
                return None
        elif not self._prefix_unchanged(track, messages):
            return None
        return list(messages[n:])

    def _unsettled_unchanged(self, track: _Track, messages: Sequence[Any]) -> bool:
        """Whether the unsettled messages of the prefix encode as they were written."""
        known = track.known
        assert known is not None
        if track.u == track.n:
            live: Sequence[Any] = messages[: track.n]
        else:
            live = list(map(messages.__getitem__, itertools.islice(known.unsettled, track.u)))
        data = self._transcript.encoder.encode(live)  # b"[" + the joined chunks + b"]"
        return len(data) == track.jlen + 2 and known.joined.startswith(memoryview(data)[1:-1])

    def _prefix_unchanged(self, track: _Track, messages: Sequence[Any]) -> bool:
        """The slow path: encode the whole prefix (through the cache) and compare.

        When it encodes the same, the new objects become the witnesses of
        their positions where that keeps ``_Known``'s rule, so the next
        stage takes the fast path again.
        """
        known = track.known
        assert known is not None
        n = track.n
        transcript = self._transcript
        prefix = list(messages[:n])
        chunks, unsettled = transcript.encode_messages(prefix)
        if chunks != known.chunks[:n]:
            return False
        if self._witness_lock.acquire(blocking=False):
            try:
                checked = set(itertools.islice(known.unsettled, track.u))
                fresh = set(unsettled)
                witnesses = known.witnesses
                adopted = []
                for at, message in enumerate(prefix):
                    if message is not witnesses[at] and (at in checked or at not in fresh):
                        witnesses[at] = message
                        adopted.append(message)
                known.loose = known.loose or transcript.any_loose(adopted)
            finally:
                self._witness_lock.release()
        return True
