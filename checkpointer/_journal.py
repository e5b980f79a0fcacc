"""The journal store: one append-only JSON Lines file per key.

Key ``k`` lives at ``<root>/k.jsonl``.  Every line is one JSON object whose
``kind`` comes first::

    {"kind":"header","format":1,"meta":{...}}
    {"kind":"compaction","meta":{...},"transcript":"messages","state":{...}}
    {"kind":"message","message":{...}}
    {"kind":"state","meta":{...},"state":{..."messages":null...}}
    {"kind":"meta","meta":{...}}

* ``header``: the first line, once: the format version and the meta of the
  checkpoint that created the file.
* ``compaction``: the whole state, its transcript included (``transcript``
  names its JSON key, null when the state has none).
* ``message``: one message appended to the transcript.
* ``state``: the rest of the state changed; its transcript key is null (the
  transcript is the rows).
* ``meta``: only the meta changed, or it closes an append of messages.

A checkpoint is one *batch*: zero or more ``message`` rows and exactly one
row that carries the meta (``meta``, ``state`` or ``compaction``), written
with one ``write`` and one ``fsync``.  A new file (a header and a
compaction) is made by temp file + fsync + rename + directory fsync.  So a
crash leaves at most one unfinished batch at the end of the file: ``load``
ignores it and reports it (``Checkpoint.torn``); a writer opening the
journal truncates it away.  A damaged line that is not the last one cannot
come from a crash: that is a ``CheckpointError`` naming the line.

Loading takes the last compaction row and applies the committed rows after
it.  Older rows stay in the file, for audit, until a rewrite.

Append or compaction
--------------------
The store remembers, per key, the messages it has written (``_Track``): the
message objects themselves when they are settled (deeply immutable, see
``_encoding.py``), private decoded copies otherwise.  A new state whose
messages start with that prefix (one ``==`` of two lists, in C; settled
messages compare by identity first, so the check costs a few nanoseconds a
message and encodes nothing) gets only its new messages appended.
Otherwise (the agent compacted, edited or truncated its history) it gets a
compaction row.  The rule is value equality: a message replaced by one equal
to it (``==``) is not written again, so what ``load`` returns always equals
the session.

Bounded growth (like Redis's AOF rewrite)
-----------------------------------------
``live`` is the size a fresh file would have at the last compaction (its
header and compaction rows).  A batch that would take the file past
``max(rewrite_min_bytes, rewrite_factor * live)`` is written as a rewrite
instead: a fresh file with a header and one compaction row, by
``write_atomic``.  So after every checkpoint the file is within that
threshold, and a crash at any moment of a rewrite leaves the old journal or
the new one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

import msgspec

from ._atomic import write_all, write_atomic
from ._encoding import Transcript, decoded_copy, new_epoch, state_pieces
from ._format import (
    FORMAT,
    Checkpoint,
    CheckpointError,
    Meta,
    TornTail,
    _newer,
    _oserror,
)
from ._format import _check_format as _check_head
from ._stores import FileStore, check_key

__all__ = ["JournalStatistics", "JournalStore"]

logger = logging.getLogger("checkpointer")


# -- rows -------------------------------------------------------------------


class _Header(msgspec.Struct, tag="header", tag_field="kind"):
    format: int
    meta: Meta


class _Message(msgspec.Struct, tag="message", tag_field="kind"):
    message: msgspec.Raw


class _MetaRow(msgspec.Struct, tag="meta", tag_field="kind"):
    meta: Meta


class _StateRow(msgspec.Struct, tag="state", tag_field="kind"):
    meta: Meta
    state: msgspec.Raw


class _Compaction(msgspec.Struct, tag="compaction", tag_field="kind"):
    meta: Meta
    state: msgspec.Raw
    transcript: str | None = None


_Row = _Header | _Message | _MetaRow | _StateRow | _Compaction
_ROWS = msgspec.json.Decoder(_Row)
_OBJECT = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ARRAY = msgspec.json.Decoder(list[msgspec.Raw])
_ENCODER = msgspec.json.Encoder()


_MESSAGE_HEAD = b'{"kind":"message","message":'
_META_HEAD = b'{"kind":"meta","meta":'
_STATE_HEAD = b'{"kind":"state","meta":'
_COMPACTION_HEAD = b'{"kind":"compaction","meta":'
_HEADER_HEAD = b'{"kind":"header","format":%d,"meta":' % FORMAT
_END = b"}\n"


def _kind(row: _Row) -> str:
    return type(row).__struct_config__.tag  # type: ignore[return-value]


# -- reading ----------------------------------------------------------------


class _Scan(NamedTuple):
    """A journal read and checked, up to its last complete checkpoint."""

    meta: Meta
    end: int  # byte offset just past the last committed row
    live: int  # bytes of the header line and the last compaction line
    compaction: _Compaction
    compaction_line: int
    after: list[_Row]  # committed rows after the last compaction
    torn: TornTail | None


def _scan(data: bytes, path: str) -> _Scan:
    """Parse a journal; ignore an unfinished last batch; reject any other damage."""
    if not data:
        raise CheckpointError(path, "the journal is empty (its creation never finished?)")
    lines = data.split(b"\n")
    partial = lines.pop()  # b"" when the file ends with a newline, as it should
    rows: list[_Row] = []
    ends: list[int] = []
    offset = 0
    unparsable = ""
    for number, line in enumerate(lines, 1):
        try:
            row = _ROWS.decode(line)
        except (msgspec.DecodeError, RecursionError) as exc:  # ValidationError included
            if number == 1:
                _check_format(line, path)
            if number == len(lines) and not partial:
                unparsable = f"line {number} is not a journal row ({exc})"
                break
            raise CheckpointError(
                path,
                f"line {number} is not a journal row ({exc}); a crash can only damage "
                "the last line, so this journal cannot be trusted",
            ) from None
        rows.append(row)
        offset += len(line) + 1
        ends.append(offset)
    if not rows or not isinstance(rows[0], _Header):
        raise CheckpointError(path, "line 1 is not a journal header: not a journal file")
    header = rows[0]
    if header.format > FORMAT:
        raise _newer(path, header.format, header.meta.library_version)
    if header.format < 1:
        raise CheckpointError(path, f"unknown journal format version {header.format}")
    last_commit = -1
    compaction = -1
    for index in range(1, len(rows)):
        row = rows[index]
        number = index + 1
        if isinstance(row, _Header):
            raise CheckpointError(path, f"line {number}: a second header row")
        if isinstance(row, _Compaction):
            compaction = index
        elif compaction < 0:
            raise CheckpointError(path, f"line {number}: a {_kind(row)} row before any compaction")
        elif (
            isinstance(row, _Message | _StateRow)
            and _compaction(rows, compaction).transcript is None
        ):
            raise CheckpointError(
                path,
                f"line {number}: a {_kind(row)} row, but the compaction at line "
                f"{compaction + 1} has no transcript",
            )
        if not isinstance(row, _Message):
            last_commit = index
    if last_commit < 0:
        raise CheckpointError(path, "no complete checkpoint after the header")
    end = ends[last_commit]
    torn = None
    if end < len(data):
        reasons = []
        pending = len(rows) - 1 - last_commit
        if pending:
            reasons.append(f"{pending} message row(s) without the row that closes their append")
        if unparsable:
            reasons.append(unparsable)
        if partial:
            reasons.append(f"a last line of {len(partial)} bytes with no newline")
        torn = TornTail(
            line=last_commit + 2,
            offset=end,
            nbytes=len(data) - end,
            reason="an append that never finished: " + "; ".join(reasons),
        )
    last = rows[last_commit]
    assert not isinstance(last, _Message)
    return _Scan(
        meta=last.meta,
        end=end,
        live=ends[0] + ends[compaction] - ends[compaction - 1],
        compaction=_compaction(rows, compaction),
        compaction_line=compaction + 1,
        after=rows[compaction + 1 : last_commit + 1],
        torn=torn,
    )


def _compaction(rows: list[_Row], index: int) -> _Compaction:
    row = rows[index]
    assert isinstance(row, _Compaction)
    return row


def _check_format(line: bytes, path: str) -> None:
    _check_head(line, path)  # the header's format and meta.library_version, as a snapshot's


def _assemble(scan: _Scan, path: str) -> bytes:
    """The state as of the last committed row, as JSON."""
    compaction = scan.compaction
    messages = [row.message for row in scan.after if isinstance(row, _Message)]
    states = [row.state for row in scan.after if isinstance(row, _StateRow)]
    if not messages and not states:
        return bytes(compaction.state)
    name = compaction.transcript
    assert name is not None  # _scan checked it
    try:
        base = _OBJECT.decode(compaction.state)
        existing = _ARRAY.decode(base[name])
        rest = _OBJECT.decode(states[-1]) if states else base
    except (msgspec.DecodeError, RecursionError, KeyError) as exc:
        raise CheckpointError(
            path,
            f"line {scan.compaction_line}: the compaction's state has no "
            f"{name!r} array to append to ({exc})",
        ) from None
    existing.extend(messages)
    rest[name] = msgspec.Raw(b"".join([b"[", b",".join(existing), b"]"]))
    return _ENCODER.encode(rest)


# -- writing ----------------------------------------------------------------


class _Track(NamedTuple):
    """What the store knows about one key's journal.  Replaced on every commit.

    ``witnesses`` and ``chunks`` are shared with older tracks and only ever
    extended, so the first ``n`` entries an older track saw never change.
    """

    meta: Meta | None  # of the last committed row; None: no file
    size: int
    ino: int
    live: int
    broken: bool  # an append failed: rewrite from memory, never fsync this file again
    epoch: int  # which witnesses; content tokens of stages of one epoch compare
    n: int  # messages in the transcript on disk
    witnesses: list[Any] | None  # None: transcript unknown, the next stage is a compaction
    chunks: list[bytes] | None
    head: bytes
    tail: bytes
    name: str | None


def _absent() -> _Track:
    return _Track(None, 0, 0, 0, False, new_epoch(), 0, None, None, b"", b"", None)


class _Full:
    """A whole state to commit as a compaction row (or a fresh file).

    ``witnesses`` holds ready witnesses for the first messages; ``messages``
    the rest, whose witnesses are built in the worker thread.
    """

    __slots__ = (
        "chunks",
        "epoch",
        "head",
        "messages",
        "name",
        "tail",
        "unsettled",
        "whole",
        "witnesses",
    )

    def __init__(
        self,
        *,
        whole: bytes | None = None,
        name: str | None = None,
        head: bytes = b"",
        tail: bytes = b"",
        chunks: list[bytes] | None = None,
        witnesses: list[Any] | None = None,
        messages: list[Any] | None = None,
        unsettled: list[int] | None = None,
    ) -> None:
        self.epoch = new_epoch()
        self.whole = whole
        self.name = name
        self.head = head
        self.tail = tail
        self.chunks = chunks if chunks is not None else []
        self.witnesses = witnesses if witnesses is not None else []
        self.messages = messages if messages is not None else []
        self.unsettled = unsettled if unsettled is not None else []

    def content(self) -> object:
        if self.whole is not None:
            return ("whole", self.whole)
        return (self.epoch, len(self.chunks), self.head, self.tail)

    def state_pieces(self) -> list[bytes]:
        if self.whole is not None:
            return [self.whole]
        return state_pieces(self.head, self.chunks, self.tail)

    def build_witnesses(self) -> list[Any]:
        return self.witnesses + _witnesses(self.messages, self.chunks, self.unsettled)


class _Delta:
    """New messages (and the rest of the state) on top of a track's prefix."""

    __slots__ = ("base", "chunks", "head", "messages", "tail", "unsettled")

    def __init__(
        self,
        base: _Track,
        messages: list[Any],
        chunks: list[bytes],
        unsettled: list[int],
        head: bytes,
        tail: bytes,
    ) -> None:
        self.base = base
        self.messages = messages
        self.chunks = chunks
        self.unsettled = unsettled
        self.head = head
        self.tail = tail

    def content(self) -> object:
        base = self.base
        return (base.epoch, base.n + len(self.chunks), self.head, self.tail)

    def full(self) -> _Full:
        """The same state as a compaction (the track moved on since staging)."""
        base = self.base
        assert base.witnesses is not None
        assert base.chunks is not None
        count = base.n
        prefix = base.chunks[:count]
        return _Full(
            name=base.name,
            head=self.head,
            tail=self.tail,
            chunks=prefix + self.chunks,
            witnesses=base.witnesses[:count],
            messages=self.messages,
            unsettled=[count + i for i in self.unsettled],
        )


def _witnesses(messages: list[Any], chunks: Sequence[bytes], unsettled: list[int]) -> list[Any]:
    """Settled messages stand for themselves; the others get private decoded copies.

    ``chunks`` may be longer than ``messages``: its last ``len(messages)``
    entries are theirs; ``unsettled`` indexes ``chunks``.
    """
    out = list(messages)
    offset = len(chunks) - len(messages)
    for at in unsettled:
        out[at - offset] = decoded_copy(out[at - offset], chunks[at])
    return out


class _Prefixes:
    """Staging by prefix: only the messages after what a key's track holds are new.

    Shared by ``JournalStore`` and the PostgreSQL journal.  The class using it
    keeps ``_transcript``, ``_tracks`` (key -> ``_Track``) and
    ``_witness_lock``; its commit turns a ``_Delta`` whose base is no longer
    the key's track into a compaction (``_Delta.full()``).
    """

    _transcript: Transcript
    _tracks: dict[str, _Track]
    _witness_lock: threading.Lock

    def _appended(self, key: str, track: _Track, meta: Meta, delta: _Delta, nbytes: int) -> None:
        """Extend ``key``'s track by an append of ``delta`` (``nbytes`` stored)."""
        assert track.witnesses is not None
        assert track.chunks is not None
        witnesses = _witnesses(delta.messages, delta.chunks, delta.unsettled)
        with self._witness_lock:
            track.witnesses.extend(witnesses)
        track.chunks.extend(delta.chunks)
        self._tracks[key] = track._replace(
            meta=meta,
            size=track.size + nbytes,
            n=track.n + len(delta.chunks),
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
            and track.witnesses is not None
            and not track.broken
            and track.name == split.name
            and isinstance(split.messages, list)
        ):
            new = self._new_messages(track, split.messages)
            if new is not None:
                chunks, unsettled = transcript.encode_messages(new)
                transcript.prune(split.messages)
                return _Delta(track, new, chunks, unsettled, split.head, split.tail)
        messages = list(split.messages)  # private: witnesses are built in the worker
        chunks, unsettled = transcript.encode_messages(messages)
        transcript.prune(messages)
        return _Full(
            name=split.name,
            head=split.head,
            tail=split.tail,
            chunks=chunks,
            messages=messages,
            unsettled=unsettled,
        )

    def _new_messages(self, track: _Track, messages: list[Any]) -> list[Any] | None:
        """The messages after the track's prefix, or None if the prefix changed.

        One list ``==`` in C against the witnesses, which stand for settled
        messages themselves, so an unchanged prefix compares by identity and
        its messages are not even dereferenced.  No copy of the prefix is made
        (at 100,000 messages, copying the list costs more than the compare):
        the witness list is extended with the new messages for the compare
        and trimmed back, under a lock that a commit takes to extend it.
        """
        n = track.n
        witnesses = track.witnesses
        if witnesses is None or len(messages) < n:
            return None
        if not self._witness_lock.acquire(blocking=False):
            return None  # a commit is extending it, or a signal handler re-entered
        try:
            if len(witnesses) != n:
                return None  # a newer commit extended it: this track is stale
            new = messages[n:]
            witnesses.extend(new)
            try:
                same = messages == witnesses
            finally:
                del witnesses[n:]
        finally:
            self._witness_lock.release()
        return new if same else None


class JournalStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """What a ``JournalStore`` did, and the size of one key's journal.

    Attributes:
        appends: checkpoints appended as message, state or meta rows.
        compactions: compaction rows appended to an existing journal.
        rewrites: journals written fresh: created, rewritten past the
            threshold, or rewritten from memory after a failed append.
        bytes_written: bytes appended or written fresh, in all.
        size: the key's journal size as this store last wrote or read it
            (None without a key, or for a key this store has not opened).
        live: what a rewrite would have written at the last compaction.
        threshold: the size past which the next checkpoint rewrites it.
    """

    appends: int
    compactions: int
    rewrites: int
    bytes_written: int
    size: int | None = None
    live: int | None = None
    threshold: int | None = None


class JournalStore(_Prefixes, FileStore):
    """Checkpoints as append-only journals: key ``k`` lives at ``root/k.jsonl``.

    A checkpoint costs what changed: new messages are appended (one write,
    one fsync); a changed history is written as a compaction row; the file
    is rewritten fresh when it outgrows its content.  See the README for the
    format, the guarantees and when to pick it over ``FileStore``.

    Args:
        root: the directory that holds the journals.
        transcript: where states keep their messages; the default,
            ``Transcript()``, is a list under ``"messages"``.
        rewrite_factor: rewrite the journal into a fresh file when it would
            grow past this many times its size at the last compaction (> 1).
        rewrite_min_bytes: ... but never below this size.

    Raises:
        ValueError: a bad root, factor or size.
    """

    suffix = ".jsonl"

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        transcript: Transcript | None = None,
        rewrite_factor: float = 2.0,
        rewrite_min_bytes: int = 1 << 20,
    ) -> None:
        if transcript is None:
            transcript = Transcript()
        super().__init__(root, transcript=transcript)
        if not (isinstance(rewrite_factor, (int, float)) and 1 < rewrite_factor < float("inf")):
            raise ValueError(f"rewrite_factor must be a finite number > 1, got {rewrite_factor!r}")
        if not (isinstance(rewrite_min_bytes, int) and rewrite_min_bytes >= 0):
            raise ValueError(f"rewrite_min_bytes must be an int >= 0, got {rewrite_min_bytes!r}")
        self._transcript = transcript
        self.rewrite_factor = float(rewrite_factor)
        self.rewrite_min_bytes = rewrite_min_bytes
        self._tracks: dict[str, _Track] = {}
        self._lock = threading.Lock()
        self._witness_lock = threading.Lock()  # see _new_messages
        self._appends = 0
        self._compactions = 0
        self._rewrites = 0
        self._bytes = 0

    def __repr__(self) -> str:
        return f"JournalStore({self.root!r})"

    def threshold(self, live: int) -> int:
        """The size past which a journal whose live content is ``live`` bytes is rewritten."""
        return max(self.rewrite_min_bytes, int(self.rewrite_factor * live))

    def statistics(self, key: str | None = None) -> JournalStatistics:
        """The store's counters, and the sizes of ``key``'s journal if given."""
        track = None if key is None else self._tracks.get(key)
        sizes: dict[str, int] = {}
        if track is not None and track.meta is not None:
            sizes = {
                "size": track.size,
                "live": track.live,
                "threshold": self.threshold(track.live),
            }
        return JournalStatistics(
            appends=self._appends,
            compactions=self._compactions,
            rewrites=self._rewrites,
            bytes_written=self._bytes,
            **sizes,
        )

    # -- the Store protocol, with the track kept in step ---------------------

    def write(self, key: str, chunks: Sequence[bytes]) -> int:
        """Replace the journal of ``key`` with raw journal bytes, atomically."""
        with self._lock:
            self._tracks.pop(key, None)
            return super().write(key, chunks)

    def delete(self, key: str) -> bool:
        with self._lock:
            self._tracks.pop(key, None)
            return super().delete(key)

    def move_aside(self, key: str, suffix: str) -> str | None:
        with self._lock:
            self._tracks.pop(key, None)
            return super().move_aside(key, suffix)

    # -- the StateStore protocol ---------------------------------------------

    def read_checkpoint(self, key: str) -> Checkpoint[msgspec.Raw] | None:
        check_key(key)
        path = self.location(key)
        try:
            data = self.read(key)
        except OSError as exc:
            raise CheckpointError(path, f"cannot be read: {_oserror(exc)}") from None
        if data is None:
            return None
        scan = _scan(data, path)
        state = msgspec.Raw(_assemble(scan, path))
        return Checkpoint(meta=scan.meta, state=state, torn=scan.torn)

    def commit(self, key: str, meta: Meta, staged: object) -> int:
        check_key(key)
        with self._lock:
            track = self._current(key)
            if isinstance(staged, _Delta):
                if staged.base is track:
                    return self._append_delta(key, track, meta, staged)
                staged = staged.full()
            if not isinstance(staged, _Full):
                raise TypeError(f"JournalStore cannot commit {type(staged).__name__}")
            return self._commit_full(key, track, meta, staged)

    def read_meta(self, key: str) -> Meta | None:
        check_key(key)
        with self._lock:
            return self._open(key).meta

    def update_meta(self, key: str, update: Callable[[Meta], Meta]) -> Meta | None:
        check_key(key)
        with self._lock:
            track = self._current(key)
            if track.meta is None:
                return None
            meta = update(track.meta)
            if track.broken:  # rewrite from memory, or from what the file says
                self._commit_full(key, track, meta, self._remembered(key, track), rewrite=True)
                return meta
            row = b"".join([_META_HEAD, _ENCODER.encode(meta), _END])
            self._append(key, track, [row])
            self._appends += 1
            self._bytes += len(row)
            self._tracks[key] = track._replace(meta=meta, size=track.size + len(row))
            return meta

    # -- internals (under self._lock) ----------------------------------------

    def _open(self, key: str) -> _Track:
        """Read the journal for writing: check it, truncate an unfinished append."""
        path = self.location(key)
        try:
            f = open(path, "r+b")  # noqa: SIM115 - closed below, after the truncate
        except FileNotFoundError:
            track = self._tracks[key] = _absent()
            return track
        with f:
            data = f.read()
            scan = _scan(data, path)
            if scan.torn is not None:
                f.truncate(scan.end)
                os.fsync(f.fileno())
                logger.info(
                    "checkpointer: %s: removed an unfinished append (%d bytes from line %d)",
                    path,
                    scan.torn.nbytes,
                    scan.torn.line,
                )
            ino = os.fstat(f.fileno()).st_ino
        track = _absent()._replace(meta=scan.meta, size=scan.end, ino=ino, live=scan.live)
        self._tracks[key] = track
        return track

    def _remembered(self, key: str, track: _Track) -> _Full:
        """The state on disk as a compaction, from memory when the track has it."""
        if track.witnesses is not None and track.chunks is not None:
            count = track.n
            return _Full(
                name=track.name,
                head=track.head,
                tail=track.tail,
                chunks=track.chunks[:count],
                witnesses=track.witnesses[:count],
            )
        path = self.location(key)
        with open(path, "rb") as f:
            return _Full(whole=_assemble(_scan(f.read(), path), path))

    def _current(self, key: str) -> _Track:
        """The track of ``key``, re-read if the file changed behind our back."""
        track = self._tracks.get(key)
        if track is None:
            return self._open(key)
        if track.broken:
            return track  # rewrite from memory: the file is not to be trusted
        try:
            st = os.stat(self.location(key))
        except FileNotFoundError:
            if track.meta is None:
                return track
        else:
            if track.meta is not None and (st.st_ino, st.st_size) == (track.ino, track.size):
                return track
        logger.warning(
            "checkpointer: %s changed behind this store (another writer?); re-reading it",
            self.location(key),
        )
        try:
            return self._open(key)
        except CheckpointError as exc:  # as the writer does on its first read
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
            aside = FileStore.move_aside(self, key, "corrupt-" + stamp)
            logger.warning("checkpointer: %s; moved it aside to %s", exc, aside)
            track = self._tracks[key] = _absent()
            return track

    def _append_delta(self, key: str, track: _Track, meta: Meta, delta: _Delta) -> int:
        meta_json = _ENCODER.encode(meta)
        rows = [b"".join([_MESSAGE_HEAD, chunk, _END]) for chunk in delta.chunks]
        if (delta.head, delta.tail) != (track.head, track.tail):
            closing = [_STATE_HEAD, meta_json, b',"state":', delta.head, b"null", delta.tail, _END]
        else:
            closing = [_META_HEAD, meta_json, _END]
        rows.append(b"".join(closing))
        data = b"".join(rows)
        if track.broken or track.size + len(data) > self.threshold(track.live):
            return self._commit_full(key, track, meta, delta.full(), rewrite=True)
        self._append(key, track, [data])
        self._appends += 1
        self._bytes += len(data)
        self._appended(key, track, meta, delta, len(data))
        return len(data)

    def _commit_full(
        self, key: str, track: _Track, meta: Meta, full: _Full, *, rewrite: bool = False
    ) -> int:
        meta_json = _ENCODER.encode(meta)
        name = b"null" if full.name is None else _ENCODER.encode(full.name)
        row = [
            _COMPACTION_HEAD,
            meta_json,
            b',"transcript":',
            name,
            b',"state":',
            *full.state_pieces(),
            _END,
        ]
        row_size = sum(map(len, row))
        header = b"".join([_HEADER_HEAD, meta_json, _END])
        live = len(header) + row_size
        path = self.location(key)
        if (
            rewrite
            or track.meta is None
            or track.broken
            or track.size + row_size > self.threshold(live)
        ):
            nbytes = write_atomic(path, [header, *row])
            size, ino = nbytes, os.stat(path).st_ino
            self._rewrites += 1
        else:
            self._append(key, track, row)
            nbytes, size, ino = row_size, track.size + row_size, track.ino
            self._compactions += 1
        self._bytes += nbytes
        transcript = full.whole is None
        self._tracks[key] = _Track(
            meta=meta,
            size=size,
            ino=ino,
            live=live,
            broken=False,
            epoch=full.epoch,
            n=len(full.chunks),
            witnesses=full.build_witnesses() if transcript else None,
            chunks=full.chunks if transcript else None,
            head=full.head,
            tail=full.tail,
            name=full.name,
        )
        return nbytes

    def _append(self, key: str, track: _Track, pieces: Sequence[bytes]) -> None:
        """Append ``pieces`` with one writev and one fsync, or mark the track broken.

        (More than one ``writev`` only past 1024 pieces: a compaction row.)
        """
        fd = os.open(self.location(key), os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if (st.st_ino, st.st_size) != (track.ino, track.size):
                raise OSError(f"{self.location(key)} changed while appending; will rewrite it")
            try:
                write_all(fd, pieces)
                os.fsync(fd)
            except BaseException:
                # Never fsync this file again (FACTS.md): the next commit rewrites it.
                self._tracks[key] = track._replace(broken=True)
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, track.size)
                raise
        finally:
            os.close(fd)
