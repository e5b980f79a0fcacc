"""The object-storage journal: a checkpoint uploads only what changed (``S3JournalStore``).

Past 500 lines on purpose: the head, its segments and their sealing are one
conditional-write protocol; the S3 client's own concerns live in ``client.py``.

Key ``k`` is a small *head* object, ``k.journal``, naming the immutable
*segments* ``k.segments/<seq>-<revision>.jsonl`` that hold its journal
rows (the rows of ``_format/journal.py``, as a ``JournalStore`` file holds
them)::

    {"format":1,"meta":{...},"segments":[["000000000007-9f...jsonl",48213],...]}

With ``encryption``, each row is sealed at its offset in the segments' rows
(after their first, the compaction row), as ``JournalStore`` seals a file's
rows, and the head keeps where they end, sealed (``"end"``): a row moved,
swapped, dropped or planted is refused.  The head's meta and segment names
stay readable.

* **A checkpoint** uploads one new segment (an append: the new messages'
  rows; a compaction: the whole state as one row), then PUTs the head that
  names it, conditionally (``If-Match`` on the head this store expects,
  ``If-None-Match: *`` for a new key): the head's PUT is the commit point,
  fenced as ``S3Store`` fences its one object.  A meta-only change PUTs
  the head alone.  Append or compaction is decided by the journal core
  both other journals share (``_stores/journal/core.py``); a key is also
  compacted once its head names ``max_segments`` segments, so a load is a
  bounded number of GETs.
* **Reading** a key is the head, then its segments in order: the journal
  file ``JournalStore`` would hold (a header, the rows, the head's meta
  closing them), read by the same reader.  A reader never sees a mix of
  two checkpoints: the head names only segments that were complete before
  it was written.  A segment it finds gone while the head has moved on (a
  compaction removed it) is no damage: it reads the new head.
* **Unreferenced segments** are removed, never one a head or a commit in
  flight could name: the segments a compaction's head replaced, right after
  that head landed; the segment of a commit the head refused, right after
  the refusal; the segments of a deleted head (deleted only if it is the
  head read, ``If-Match``), right after; and, when a writer first opens or
  deletes a key, any segment no head names whose upload is older than
  ``GRACE`` (a crash between a segment and its head, an answer lost).  A
  commit whose upload took longer than half of ``GRACE`` is not committed
  (its segment may be gone): the next one uploads again.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

import msgspec

from ... import _exit
from ..._format.envelope import FORMAT, newer_format
from ..._format.journal import LINE_END, assemble, header_line, meta_row, scan_journal
from ..._values import Checkpoint, CheckpointError, Meta
from ..base import StaleWrite, check_key, landed
from ..journal.core import JournalCore
from ..journal.staging import Delta, Full, Track, absent
from ..sealing import DecryptionError, Encryption, open_end, open_rows, seal_end, seal_epoch
from .client import condition_failed
from .store import S3Store

__all__ = ["GRACE", "S3JournalStore"]

logger = logging.getLogger("checkpointer")

GRACE = 3600.0
"""Seconds an unreferenced segment is kept before a sweep may remove it."""

_ENCODER = msgspec.json.Encoder()
_PATIENCE = 60.0  # seconds a read goes on while compactions move the head under it
_FETCHES = 8  # segments fetched at once by a read


class _Head(msgspec.Struct, frozen=True, omit_defaults=True):
    format: int
    meta: Meta
    segments: list[tuple[str, int]]  # (name under k.segments/, bytes), oldest first
    end: bytes = b""  # encrypted: where the rows end, sealed (``sealing.seal_end``)


class _Format(msgspec.Struct):
    format: int


_HEAD = msgspec.json.Decoder(_Head)
_FORMAT = msgspec.json.Decoder(_Format)


class _Known(NamedTuple):
    """The head this store last wrote or read for a key."""

    revision: str
    segments: tuple[tuple[str, int], ...]
    end: bytes


class S3JournalStore(JournalCore, S3Store):
    """An ``S3Store`` whose checkpoints upload what changed: segments named by a head object.

    Takes the arguments of ``S3Store``, plus:

    Args:
        rewrite_factor: compact a key when its segments would grow past
            this many times the size of its last compaction (> 1).
        rewrite_min_bytes: ... but never below this size.
        max_segments: compact a key whose head names this many segments.
        encryption: seal every row (``Encryption``), bound to the key and its
            offset (see the docs page "Encryption at rest").
    """

    suffix = ".journal"
    _row_end = LINE_END
    _closing_meta = False  # the head carries the meta

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 10.0,
        rewrite_factor: float = 2.0,
        rewrite_min_bytes: int = 1 << 20,
        max_segments: int = 32,
        encryption: Encryption | None = None,
    ) -> None:
        if not (isinstance(max_segments, int) and max_segments >= 1):
            raise ValueError(f"max_segments must be an int >= 1, got {max_segments!r}")
        super().__init__(
            bucket,
            prefix,
            endpoint_url=endpoint_url,
            region=region,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            encryption=encryption,
        )
        self._init_journal(rewrite_factor, rewrite_min_bytes)
        self.max_segments = max_segments
        self._known: dict[str, _Known] = {}
        self.appends = 0
        self.compactions = 0

    def _journal_after_fork(self) -> None:
        super()._journal_after_fork()
        self._known = {}
        self._etags = {}

    def _outgrown(self, key: str, track: Track, nbytes: int) -> bool:
        known = self._known.get(key)
        full = known is None or len(known.segments) >= self.max_segments
        return full or super()._outgrown(key, track, nbytes)

    # -- the Store protocol ------------------------------------------------------

    def revision_in(self, key: str, data: bytes) -> str | None:
        return self._decode_head(key, data).meta.revision

    def read(self, key: str) -> bytes | None:
        """The journal ``key``'s head names, as ``JournalStore``'s file would hold it (opened).

        Raises:
            CheckpointError: a segment the head names is missing or the head is damaged.
            S3StoreError: the endpoint, bucket or credentials failed.
            TimeoutError: compactions moved the head on each time it was read (a busy key).
        """
        check_key(key)
        head = self._get_head(key)
        deadline = time.monotonic() + _PATIENCE
        while head is not None:
            segments = self._segments(key, [name for name, _ in head.segments])
            missing = next((name for name, data in segments if data is None), None)
            if missing is None:
                rows = [data or b"" for _, data in segments]
                if self.encryption is not None or head.end:
                    rows = b"".join(rows).splitlines(keepends=True)
                    where, meta = self.location(key), head.meta
                    rows = open_rows(
                        self.encryption, rows, head.end, key=key, where=where, meta=meta
                    )
                meta_json = _ENCODER.encode(head.meta)
                return b"".join([header_line(meta_json), *rows, meta_row(meta_json, LINE_END)])
            # Gone: a writer removes a segment only once a head naming it no longer
            # does, so the head moved on meanwhile (read it again) or the key is damaged.
            moved, head = head, self._get_head(key)
            if head == moved:
                raise CheckpointError(
                    self.location(key),
                    f"segment {self._segment(key, missing)} that the head names is missing",
                )
            if time.monotonic() > deadline:
                raise TimeoutError(  # no damage: the CLI shows it, a writer does not move it aside
                    f"{self.location(key)}: compacted again each time it was read for "
                    f"{_PATIENCE:.0f} s (a writer is busy on it); read it again"
                )
        return None

    def _segments(self, key: str, names: list[str]) -> list[tuple[str, bytes | None]]:
        """The bytes of ``key``'s segments ``names`` (None: gone), fetched a few at a time.

        In parallel: a load of a long session on a real endpoint is then a
        few round trips, not one per segment (the client is thread-safe).
        """
        if len(names) <= 1:
            return [(name, self.get(self._segment(key, name))) for name in names]
        with ThreadPoolExecutor(min(_FETCHES, len(names))) as pool:
            fetched = pool.map(lambda name: self.get(self._segment(key, name)), names)
            return list(zip(names, fetched, strict=True))

    def write(
        self, key: str, chunks: Sequence[bytes], *, revision: str, expected: str | None
    ) -> int:
        """Replace ``key`` with a journal file's bytes (a header, then rows) as one segment."""
        check_key(key)
        data = b"".join(chunks)
        scan = scan_journal(data, self.location(key))
        rows = data[data.index(b"\n") + 1 : scan.end].splitlines(keepends=True)
        meta = msgspec.structs.replace(scan.meta, revision=revision)  # the head's meta closes them
        rows, _, end = seal_epoch(self.encryption, rows, key=key)
        size = sum(map(len, rows))
        with _exit.busy():
            self._drop_track(key)
            replaced = self._replaced(key, expected)
            started = time.time()
            name = self._put_segment(key, meta, rows)
            self._put_head(key, meta, ((name, size),), expected, [name], started, end=end)
            self._drop_track(key)  # the rows are not staged: the next commit compacts
            self._remove(key, replaced)  # as a compaction does (a re-encrypt: the old key's)
        return len(data)

    def _replaced(self, key: str, expected: str | None) -> list[str]:
        """The segments of the head that a write expecting ``expected`` replaces (its ETag
        kept: the PUT replaces that very head, or none)."""
        found = None if expected is None else self.fetch(key + self.suffix)
        if found is None:
            return []
        with contextlib.suppress(CheckpointError):
            head = self._decode_head(key, found[0])
            if head.meta.revision == expected:
                return [name for name, _ in head.segments]
        return []

    def delete(self, key: str, *, etag: str | None = None) -> bool:
        """Remove ``key``'s head, then the segments it named; False if there was no head.

        The head goes only if it is the one read (or has the ``etag`` given,
        as ``S3Store.delete``): a writer that wrote, or created the key
        again, meanwhile keeps its segments.  Segments no head names go as
        a writer's first open sweeps them, once older than ``GRACE``.
        """
        check_key(key)
        self._drop_track(key)
        while (found := self.fetch(key + self.suffix)) is not None:
            data, read = found
            try:
                if not self.remove(key + self.suffix, etag or read):
                    return False
            except Exception as exc:
                if etag is not None or not condition_failed(exc):
                    raise
                continue  # written since it was read: delete what it holds now
            try:
                named = [name for name, _ in self._decode_head(key, data).segments]
            except CheckpointError:
                named = []  # not a head this library reads: the sweep takes its segments
            self._remove(key, named)
            self._sweep(key, set())
            return True
        return False

    def move_aside(self, key: str, suffix: str) -> str | None:
        """Put the journal, as one file, at ``k.<suffix>`` (the head alone if it is damaged),
        then delete the head if it is still the one read (see ``S3Store.move_aside``)."""
        check_key(key)
        self._drop_track(key)
        found = self.fetch(key + self.suffix)
        if found is None:
            return None
        data, etag = found
        with contextlib.suppress(CheckpointError):  # damaged: the head alone
            data = self.read(key) or data  # a newer head meanwhile: not deleted below
        return self.put_aside(key, suffix, data, etag)

    # -- the StateStore protocol ---------------------------------------------------

    def read_checkpoint(self, key: str) -> Checkpoint[msgspec.Raw] | None:
        check_key(key)
        location = self.location(key)
        data = self.read(key)  # an unreachable service or a busy key is no damage: raised
        if data is None:
            return None
        scan = scan_journal(data, location)
        return Checkpoint(meta=scan.meta, state=msgspec.Raw(assemble(scan, location)))

    def read_meta(self, key: str) -> Meta | None:
        """The meta of ``key``'s head (one GET); what this store knows of the key is kept
        while the head is the one it knows, so the next commit appends."""
        check_key(key)
        return self._open(key).meta

    def commit(self, key: str, meta: Meta, staged: object, *, expected: str | None) -> int:
        """Upload ``staged`` as a segment and move the head to it, if it holds ``expected``."""
        check_key(key)
        if not isinstance(staged, Full | Delta):
            raise TypeError(f"S3JournalStore cannot commit {type(staged).__name__}")
        with _exit.busy():  # a signal landing meanwhile waits (its flush may stage here)
            track = self._current(key, expected)
            if landed(key, _revision(track), meta.revision, expected):
                return 0
            return self._commit_on(key, track, meta, staged, expected)

    def update_meta(self, key: str, meta: Meta, *, expected: str) -> None:
        """PUT the head with ``meta`` and the same segments, if it holds ``expected``."""
        check_key(key)
        with _exit.busy():
            track = self._current(key, expected)
            if landed(key, _revision(track), meta.revision, expected):
                return
            known = self._known[key]
            self._put_head(key, meta, known.segments, expected, [], end=known.end)
            self._tracks[key] = track._replace(meta=meta)

    # -- what the core stores ------------------------------------------------------

    def _append_rows(
        self,
        key: str,
        track: Track,
        meta: Meta,
        kinds: list[str],
        rows: list[bytes],
        nbytes: int,
        expected: str | None,
    ) -> None:
        known = self._known[key]
        if not rows:  # only the meta changed: the head alone
            self._put_head(key, meta, known.segments, expected, [], end=known.end)
            return
        started = time.time()
        name = self._put_segment(key, meta, rows)
        segments = (*known.segments, (name, nbytes))
        end = seal_end(self.encryption, key=key, first=track.first, size=track.size + nbytes)
        self._put_head(key, meta, segments, expected, [name], started, end=end)
        self.appends += 1

    def _compact(
        self,
        key: str,
        track: Track | None,
        meta: Meta,
        full: Full,
        expected: str | None,
        *,
        rewrite: bool = False,
    ) -> int:
        known = self._known.get(key)
        pieces = self._compaction_row(_ENCODER.encode(meta), full)
        first = end = b""
        if self.encryption is not None:  # else as they are: not joined
            pieces, first, end = seal_epoch(self.encryption, [b"".join(pieces)], key=key)
        nbytes = sum(map(len, pieces))
        started = time.time()
        name = self._put_segment(key, meta, pieces)
        self._put_head(key, meta, ((name, nbytes),), expected, [name], started, end=end)
        self.compactions += 1
        track = full.track(meta, size=nbytes, ino=0, live=nbytes)
        self._tracks[key] = track._replace(first=first)
        if known is not None:  # the replaced segments: a reader finds one gone and reads again
            self._remove(key, [n for n, _ in known.segments])
        return nbytes

    # -- internals -------------------------------------------------------------------

    def _current(self, key: str, expected: str | None) -> Track:
        """The track of ``key`` if it is the one ``expected`` names, else the head's (a GET).

        Without one and with nothing expected, no request: the head's PUT
        (``If-None-Match``) finds out.
        """
        track = self._tracks.get(key)
        known = self._known.get(key)
        if track is not None and track.meta is not None and known is not None:
            if known.revision == track.meta.revision == expected:
                return track
        elif expected is None and track is None:
            track = self._tracks[key] = absent()
            return track
        return self._open(key)

    def _open(self, key: str) -> Track:
        """Read ``key``'s head: the track it gives (kept if it is the one this store knows)."""
        head = self._get_head(key)
        if head is None:
            self._drop_track(key)
            track = self._tracks[key] = absent()
            return track
        # Its rows are not read: that this store's keys open its end is checked instead,
        # or a writer with another key would compact over them.
        open_end(self.encryption, head.end, key=key, where=self.location(key))
        known = _Known(head.meta.revision, tuple(head.segments), head.end)
        kept = self._tracks.get(key)
        if kept is not None and self._known.get(key) == known:
            return kept  # what this store wrote last: append on
        self._drop_track(key)
        self._known[key] = known
        size = sum(n for _, n in head.segments)
        live = head.segments[0][1] if head.segments else 0
        track = self._tracks[key] = absent()._replace(meta=head.meta, size=size, live=live)
        self._sweep(key, {name for name, _ in known.segments})
        return track

    def _get_head(self, key: str) -> _Head | None:
        data = self.get(key + self.suffix)
        return None if data is None else self._decode_head(key, data)

    def _decode_head(self, key: str, data: bytes) -> _Head:
        location = self.location(key)
        try:
            found = _FORMAT.decode(data).format
        except msgspec.DecodeError as exc:
            raise CheckpointError(location, f"not a journal head ({exc})") from None
        if found > FORMAT:
            raise newer_format(location, found, None)
        try:
            return _HEAD.decode(data)
        except msgspec.DecodeError as exc:
            raise CheckpointError(location, f"not a journal head ({exc})") from None

    def _segment(self, key: str, name: str) -> str:
        return f"{key}.segments/{name}"

    def _put_segment(self, key: str, meta: Meta, pieces: Sequence[bytes]) -> str:
        """Upload a new segment of ``key`` (a name no other write uses); its name."""
        name = f"{meta.seq:012d}-{meta.revision}.jsonl"
        body = b"".join(pieces)
        self.s3.call("put_object", Key=self.s3.prefix + self._segment(key, name), Body=body)
        return name

    def _put_head(
        self,
        key: str,
        meta: Meta,
        segments: Sequence[tuple[str, int]],
        expected: str | None,
        uploaded: list[str],
        started: float = 0.0,
        *,
        end: bytes = b"",
    ) -> None:
        """PUT the head naming ``segments``, if it holds ``expected``: the commit point.

        ``uploaded``: the segments this commit uploaded, from ``started``
        (``time.time()``) on; ``end``: where the rows end, sealed.
        """
        if uploaded and time.time() - started > GRACE / 2:
            self._drop_track(key)
            raise OSError(f"{self.location(key)}: the upload took too long; will upload again")
        body = _ENCODER.encode(_Head(FORMAT, meta, list(segments), end))
        try:
            self.put(key + self.suffix, key, body, revision=meta.revision, expected=expected)
        except (StaleWrite, DecryptionError):  # refused: another's head, or one sealed with
            self._drop_track(key)  # a key this store lacks
            self._remove(key, uploaded)  # no head names them, nor ever will
            raise
        except BaseException:
            self._drop_track(key)  # it may have landed: read the head again next time
            raise
        self._known[key] = _Known(meta.revision, tuple(segments), end)

    def _drop_track(self, key: str) -> None:
        track = self._tracks.pop(key, None)
        if track is not None and track.known is not None:
            track.known.dead = True
        self._known.pop(key, None)

    def _sweep(self, key: str, named: set[str]) -> None:
        """Remove ``key``'s segments that its head does not name, uploaded before ``GRACE``."""
        folder = self._segment(key, "")
        cutoff = datetime.now(UTC) - timedelta(seconds=GRACE)
        try:
            listed = self.listing(folder)
        except OSError:
            return  # swept at another open
        old = [
            item.name[len(folder) :]
            for item in listed
            if item.name[len(folder) :] not in named and item.modified < cutoff
        ]
        self._remove(key, old)

    def _remove(self, key: str, names: list[str]) -> None:
        """Delete segments of ``key``, best effort."""
        prefix = self.s3.prefix
        keys = [prefix + self._segment(key, n) for n in names]
        for start in range(0, len(keys), 1000):  # DeleteObjects takes 1,000 at a time
            batch = [{"Key": k} for k in keys[start : start + 1000]]
            try:
                self.s3.call("delete_objects", Delete={"Objects": batch, "Quiet": True})
            except OSError as exc:
                logger.info(
                    "checkpointer: could not remove %d old segment(s) of %s (%s); "
                    "a later writer removes them",
                    len(batch),
                    self.location(key),
                    exc,
                )


def _revision(track: Track) -> str | None:
    return None if track.meta is None else track.meta.revision
