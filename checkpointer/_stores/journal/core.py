"""The journal core: staging by prefix and the commit bookkeeping every journal shares.

The store remembers per key the messages it wrote (``Track``, ``Known``).
A new state whose messages start with that prefix gets only its new ones
appended; otherwise a compaction row.  The rule is the bytes: ``2`` ->
``2.0`` is a change though equal in Python, and a message replaced by an
object that encodes the same is not.  A key whose journal would grow past
``threshold(live)`` (``live``: the size of its last compaction) is compacted
instead, as Redis rewrites its AOF (a sink may bound it further:
``_outgrown``).  A forked child forgets every track: what the parent knew
may be half updated, and the parent writes on.
"""

from __future__ import annotations

import itertools
import operator
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from ..._format.journal import compaction_row, message_rows, meta_row, state_row
from ..._values import Meta
from ..encoding import Transcript
from ..sealing import Encryption, seal_rows
from .staging import Delta, Full, Track

__all__ = ["JournalCore"]

_ENCODER = msgspec.json.Encoder()


class JournalCore:
    """Staging by prefix, and the bookkeeping of a commit: a mixin of every journal.

    The sink calls ``_init_journal`` in its constructor and, to commit,
    ``_commit_on`` with the key's current track (under its own lock); the
    core decides append or compaction, keeps the tracks, and calls back the
    sink's ``_append_rows`` and ``_compact``.  ``_row_end`` is how a row
    ends, ``_closing_meta`` whether an append that leaves the rest of the
    state as it was is closed by a ``meta`` row (a file; a PostgreSQL head
    row and an S3 head object carry the meta themselves).
    """

    _transcript: Transcript
    _tracks: dict[str, Track]
    _witness_lock: threading.Lock
    _scratch: bytearray
    _scratch_lock: threading.Lock
    _row_end: bytes
    _closing_meta: bool
    rewrite_factor: float
    rewrite_min_bytes: int
    encryption: Encryption | None  # the sink's: rows are sealed at their offset (``_sealed``)
    # What the sink stores: an append of ``rows`` (their ``kinds``, ``nbytes`` in all)
    # after ``track``; ``full`` as a compaction (``rewrite``: a fresh start), setting
    # the key's track.  Both get the ``expected`` revision for a write that checks it.
    _append_rows: Callable[[str, Track, Meta, list[str], list[bytes], int, str | None], None]
    _compact: Callable[..., int]

    def _init_journal(self, rewrite_factor: float, rewrite_min_bytes: int) -> None:
        """Check the growth bounds (``ValueError``) and start with no tracks."""
        if not (isinstance(rewrite_factor, (int, float)) and 1 < rewrite_factor < float("inf")):
            raise ValueError(f"rewrite_factor must be a finite number > 1, got {rewrite_factor!r}")
        if not (isinstance(rewrite_min_bytes, int) and rewrite_min_bytes >= 0):
            raise ValueError(f"rewrite_min_bytes must be an int >= 0, got {rewrite_min_bytes!r}")
        self._transcript = Transcript()  # for a writer that gives none; its encoder
        self.rewrite_factor = float(rewrite_factor)
        self.rewrite_min_bytes = rewrite_min_bytes
        self._tracks = {}
        self._witness_lock = threading.Lock()  # see _new_messages
        self._scratch = bytearray()  # see _unsettled_unchanged
        self._scratch_lock = threading.Lock()
        _journals.add(self)

    def _journal_after_fork(self) -> None:
        """In a forked child: fresh locks, and every track of the parent's dead."""
        for track in self._tracks.values():
            if track.known is not None:
                track.known.dead = True
        self._tracks = {}
        self._witness_lock = threading.Lock()

    def _outgrown(self, key: str, track: Track, nbytes: int) -> bool:
        """Whether appending ``nbytes`` to ``key`` would outgrow its bound: compact instead."""
        return track.size + nbytes > self.threshold(track.live)

    def threshold(self, live: int) -> int:
        """The size past which a journal whose live content is ``live`` bytes is rewritten."""
        return max(self.rewrite_min_bytes, int(self.rewrite_factor * live))

    def stage(self, key: str, state: Any, transcript: Transcript | None = None) -> Full | Delta:
        """Stage ``state`` for ``key``: only its new messages when the prefix is unchanged.

        ``transcript`` is the writer's (where the messages are); without one,
        the journal looks for them under ``"messages"``.
        """
        if transcript is None:
            transcript = self._transcript
        split = transcript.split(state)
        if split is None:
            return Full(whole=transcript.encoder.encode(state))
        track = self._tracks.get(key)
        if (
            track is not None
            and track.known is not None
            and not track.known.dead
            and not track.broken
            and track.name == split.name
        ):
            new = self._new_messages(track, split.messages, transcript)
            if new is not None:
                chunks, unsettled = transcript.encode_messages(new)
                loose = transcript.any_loose(new)
                transcript.prune(split.messages)
                return Delta(track, new, chunks, unsettled, split.head, split.tail, loose=loose)
        messages = list(split.messages)  # private: the witnesses to be
        chunks, unsettled = transcript.encode_messages(messages)
        loose = transcript.any_loose(messages)
        transcript.prune(messages)
        return Full(
            name=split.name,
            head=split.head,
            tail=split.tail,
            chunks=chunks,
            messages=messages,
            unsettled=unsettled,
            loose=loose,
        )

    def _new_messages(
        self, track: Track, messages: list[Any] | tuple[Any, ...], transcript: Transcript
    ) -> list[Any] | None:
        """The messages after the track's prefix, or None if the prefix changed.

        Fast path: the messages against the witnesses, then one encode of the
        prefix's unsettled messages compared with what was written.  With
        only ``EXACT`` witnesses the first step is one list ``==`` in C
        (identity first, so a pointer per message; the witnesses are
        extended and trimmed back rather than the prefix copied), else an
        identity scan.  The witness lock is not waited for: a signal handler
        may re-enter here.
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
            elif (
                track.u == 0
                and n
                and (messages[0] is not witnesses[0] or messages[n - 1] is not witnesses[n - 1])
            ):
                # Other objects than the witnesses (a session reopened on this store):
                # equal, they would pass ``==`` byte by byte at every stage.  Check
                # their bytes once instead; the slow path adopts them.
                same = False
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
        elif not self._prefix_unchanged(track, messages, transcript):
            return None
        return list(messages[n:])

    def _unsettled_unchanged(self, track: Track, messages: Sequence[Any]) -> bool:
        """Whether the unsettled messages of the prefix encode as they were written."""
        known = track.known
        assert known is not None
        if track.u == track.n:
            live: Sequence[Any] = messages[: track.n]
        else:
            live = list(map(messages.__getitem__, itertools.islice(known.unsettled, track.u)))
        # Into one reused buffer: a fresh bytes object of a long history costs
        # as much again as the encode (its pages are new to the process).
        encoder = self._transcript.encoder
        if not self._scratch_lock.acquire(blocking=False):  # another thread, a signal handler
            data = encoder.encode(live)  # b"[" + the joined chunks + b"]"
            return len(data) == track.jlen + 2 and known.joined.startswith(memoryview(data)[1:-1])
        try:
            scratch = self._scratch
            encoder.encode_into(live, scratch)
            if len(scratch) != track.jlen + 2:
                return False
            with memoryview(scratch) as whole, whole[1:-1] as inner:
                return known.joined.startswith(inner)
        finally:
            self._scratch_lock.release()

    def _prefix_unchanged(
        self, track: Track, messages: Sequence[Any], transcript: Transcript
    ) -> bool:
        """The slow path: encode the whole prefix (through the cache) and compare.

        When it is the same, the new objects become the witnesses where
        ``Known``'s rule allows, so the next stage takes the fast path.
        """
        known = track.known
        assert known is not None
        n = track.n
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

    def _commit_on(
        self, key: str, track: Track | None, meta: Meta, staged: object, expected: str | None
    ) -> int:
        """Commit ``staged`` over ``track``, the key's current one: an append or a compaction.

        ``expected`` is handed to the sink, for a write that checks it itself.
        """
        settled = self._settle(track, staged)
        if isinstance(settled, Delta):
            assert track is not None  # a delta settles on a track of the key only
            return self._append_delta(key, track, meta, settled, expected)
        nbytes = self._compact(key, track, meta, settled, expected)
        if isinstance(staged, Delta):
            _stored_whole(staged)
        return nbytes

    def _settle(self, track: Track | None, staged: object) -> Full | Delta:
        """What to commit for ``staged`` on top of ``track``, the key's current track."""
        if isinstance(staged, Delta):
            known = staged.base.known
            if staged.base is track and known is not None and not known.dead:
                return staged
            return staged.rebased(track) or staged.as_full()
        if not isinstance(staged, Full):
            raise TypeError(f"{type(self).__name__} cannot commit {type(staged).__name__}")
        return staged

    def _append_delta(
        self, key: str, track: Track, meta: Meta, delta: Delta, expected: str | None
    ) -> int:
        """Append ``delta``'s rows, or compact when the key would outgrow its threshold."""
        meta_json = _ENCODER.encode(meta)
        end = self._row_end
        rows = message_rows(delta.chunks, end)
        kinds = ["message"] * len(rows)
        if (delta.head, delta.tail) != (track.head, track.tail):
            rows.append(state_row(meta_json, delta.head, delta.tail, end))
            kinds.append("state")
        elif self._closing_meta:
            rows.append(meta_row(meta_json, end))
            kinds.append("meta")
        rows = self._sealed(key, track, rows)
        nbytes = sum(map(len, rows))
        if track.broken or self._outgrown(key, track, nbytes):
            nbytes = self._compact(key, track, meta, delta.as_full(), expected, rewrite=True)
            _stored_whole(delta)
            return nbytes
        self._append_rows(key, track, meta, kinds, rows, nbytes, expected)
        self._appended(key, track, meta, delta, nbytes)
        return nbytes

    def _appended(self, key: str, track: Track, meta: Meta, delta: Delta, nbytes: int) -> None:
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

    def _sealed(self, key: str, track: Track, rows: list[bytes]) -> list[bytes]:
        """``rows`` to append after ``track``, as stored: sealed at their offsets after the
        track's first row if the sink is encrypted (``sealing.seal_rows``)."""
        first, offset = track.first, track.size
        return seal_rows(self.encryption, rows, key=key, first=first, offset=offset)

    def _compaction_row(self, meta_json: bytes, full: Full) -> list[bytes]:
        """The pieces of the compaction row of ``full``, under the meta ``meta_json``."""
        return compaction_row(meta_json, full.name, full.state_pieces(), self._row_end)


def _stored_whole(delta: Delta) -> None:
    """``delta`` was stored as a compaction: nothing is staged on its base's epoch any more.

    (Its content, "the first n positions of the epoch", names its bytes only
    while appends take those positions: another delta on the same base with
    other bytes there would otherwise be skipped as unchanged.)
    """
    known = delta.base.known
    if known is not None:
        known.dead = True


_journals: weakref.WeakSet[JournalCore] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for journal in list(_journals):
        journal._journal_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
