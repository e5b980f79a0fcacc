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
A new state whose transcript starts with the messages the store wrote gets
only its new messages appended; otherwise (the agent compacted, edited or
truncated its history) it gets a compaction row.  Which it is, and what
"unchanged" means (the same bytes, never only ``==``), is decided by the
staging both journals share: ``_staging.py``.

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
import errno
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import NamedTuple

import msgspec

from ._format.envelope import FORMAT, check_format, newer_format
from ._staging import _absent, _Delta, _Full, _Prefixes, _Track
from ._stores.atomic import fsync_fd, write_all, write_atomic
from ._stores.base import check_key, time_left
from ._stores.encoding import Transcript
from ._stores.files import FileStore
from ._stores.safefs import open_checked, read_checked, read_fd
from ._text import oserror
from ._values import Checkpoint, CheckpointError, Meta, TornTail

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
        raise newer_format(path, header.format, header.meta.library_version)
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
    check_format(line, path)  # the header's format and meta.library_version, as a snapshot's


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


def _warn_linked(path: str, links: int) -> None:
    logger.warning(
        "checkpointer: %s has %d hard links (a backup, or a name outside the root?): "
        "rewriting it fresh instead of appending through them; the other names keep "
        "their bytes",
        path,
        links,
    )


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
    _grows = True  # a read without the lock may see an append: it keeps what fstat saw

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
        with self._locked(key):
            self._tracks.pop(key, None)
            return super().write(key, chunks)

    def delete(self, key: str) -> bool:
        with self._locked(key):
            self._tracks.pop(key, None)
            return super().delete(key)

    def move_aside(self, key: str, suffix: str) -> str | None:
        with self._locked(key):
            self._tracks.pop(key, None)
            return super().move_aside(key, suffix)

    # -- the StateStore protocol ---------------------------------------------

    def read_checkpoint(self, key: str) -> Checkpoint[msgspec.Raw] | None:
        check_key(key)
        path = self.location(key)
        try:
            data = self.read(key)
        except OSError as exc:
            raise CheckpointError(path, f"cannot be read: {oserror(exc)}") from None
        if data is None:
            return None
        scan = _scan(data, path)
        state = msgspec.Raw(_assemble(scan, path))
        return Checkpoint(meta=scan.meta, state=state, torn=scan.torn)

    def commit(self, key: str, meta: Meta, staged: object) -> int:
        check_key(key)
        if not isinstance(staged, _Full | _Delta):
            raise TypeError(f"JournalStore cannot commit {type(staged).__name__}")
        if not self._lock.acquire(timeout=time_left()):
            return self._overtake(key, meta, staged)
        try:
            track = self._current(key)
            staged = self._settle(track, staged)
            if isinstance(staged, _Delta):
                return self._append_delta(key, track, meta, staged)
            return self._commit_full(key, track, meta, staged)
        finally:
            self._lock.release()

    def read_meta(self, key: str) -> Meta | None:
        check_key(key)
        with self._locked(key):
            return self._open(key).meta

    def update_meta(self, key: str, update: Callable[[Meta], Meta]) -> Meta | None:
        check_key(key)
        with self._locked(key):
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

    # -- the lock, bounded by a flush's deadline ---------------------------------

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        """The store's lock, waited for no longer than the caller's deadline.

        A flush with a timeout (``flush_sync``, the exit and signal hooks) runs
        under ``_codec.commit_deadline``; without one the wait is unbounded.

        Raises:
            TimeoutError: another commit of this store held it past the deadline.
        """
        if not self._lock.acquire(timeout=time_left()):
            raise TimeoutError(
                f"cannot use {self.location(key)}: another commit of this store did not "
                "finish within the flush's timeout (exit_timeout); is the disk stuck?"
            )
        try:
            yield
        finally:
            self._lock.release()

    def _overtake(self, key: str, meta: Meta, staged: object) -> int:
        """Commit without the lock, which a commit stuck past the flush's deadline holds.

        The state is written as a fresh file (temp, fsync, rename), as
        ``FileStore`` does.  A stuck append goes on into the file it opened,
        which this rename replaced; a stuck rewrite may rename its older file
        over this one, and the writer then commits the newer state again once
        it returns.  Either way the key's tracks are dead: nothing is staged
        on them again, and the next commit re-reads the file.
        """
        full = self._settle(None, staged)
        assert isinstance(full, _Full)
        path = self.location(key)
        logger.warning(
            "checkpointer: %s: a commit of this store did not finish within the flush's "
            "timeout; writing the journal fresh beside it",
            path,
        )
        self._forget(key)
        header, row, _ = self._fresh_rows(meta, full)
        nbytes = write_atomic(path, [header, *row])
        self._forget(key)  # whatever the stuck commit left meanwhile
        self._rewrites += 1
        self._bytes += nbytes
        return nbytes

    def _forget(self, key: str) -> None:
        track = self._tracks.pop(key, None)
        if track is not None and track.known is not None:
            track.known.dead = True

    # -- internals (under self._lock) ----------------------------------------

    def _open(self, key: str) -> _Track:
        """Read the journal for writing: check it, truncate an unfinished append."""
        path = self.location(key)
        try:
            # A regular file of ours, never through a link or a FIFO (_safefs).
            fd, st = open_checked(path, os.O_RDWR, links=True)
        except FileNotFoundError:
            track = self._tracks[key] = _absent()
            return track
        try:
            scan = _scan(read_fd(fd, st.st_size, path), path)
            linked = st.st_nlink > 1
            if scan.torn is not None and not linked:
                os.ftruncate(fd, scan.end)
                fsync_fd(fd)
                logger.info(
                    "checkpointer: %s: removed an unfinished append (%d bytes from line %d)",
                    path,
                    scan.torn.nbytes,
                    scan.torn.line,
                )
        finally:
            os.close(fd)
        track = _absent()._replace(
            meta=scan.meta, size=scan.end, ino=st.st_ino, live=scan.live, broken=linked
        )
        if linked:
            _warn_linked(path, st.st_nlink)
        self._tracks[key] = track
        return track

    def _remembered(self, key: str, track: _Track) -> _Full:
        """The state on disk as a compaction, from memory when the track has it."""
        known = track.known
        if known is not None:
            count = track.n
            return _Full(
                name=track.name,
                head=track.head,
                tail=track.tail,
                chunks=known.chunks[:count],
                messages=known.witnesses[:count],
                unsettled=known.unsettled[: track.u],
                loose=known.loose,
            )
        path = self.location(key)
        data = read_checked(path)
        if data is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        return _Full(whole=_assemble(_scan(data, path), path))

    def _current(self, key: str) -> _Track:
        """The track of ``key``, re-read if the file changed behind our back."""
        track = self._tracks.get(key)
        if track is None:
            return self._open(key)
        if track.broken:
            return track  # rewrite from memory: the file is not to be trusted
        try:
            st = os.lstat(self.location(key))  # a link planted in its place is a change
        except FileNotFoundError:
            if track.meta is None:
                return track
        else:
            if track.meta is not None and (st.st_ino, st.st_size) == (track.ino, track.size):
                if st.st_nlink > 1:  # linked since: rewrite it by rename, never append
                    _warn_linked(self.location(key), st.st_nlink)
                    track = self._tracks[key] = track._replace(broken=True)
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
            return self._commit_full(key, track, meta, delta.as_full(), rewrite=True)
        self._append(key, track, [data])
        self._appends += 1
        self._bytes += len(data)
        self._appended(key, track, meta, delta, len(data))
        return len(data)

    @staticmethod
    def _fresh_rows(meta: Meta, full: _Full) -> tuple[bytes, list[bytes], int]:
        """The header line of a fresh file, the compaction row's pieces, and its size."""
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
        header = b"".join([_HEADER_HEAD, meta_json, _END])
        return header, row, sum(map(len, row))

    def _commit_full(
        self, key: str, track: _Track, meta: Meta, full: _Full, *, rewrite: bool = False
    ) -> int:
        header, row, row_size = self._fresh_rows(meta, full)
        live = len(header) + row_size
        path = self.location(key)
        if (
            rewrite
            or track.meta is None
            or track.broken
            or track.size + row_size > self.threshold(live)
        ):
            nbytes = write_atomic(path, [header, *row])
            size, ino = nbytes, os.lstat(path).st_ino
            self._rewrites += 1
        else:
            self._append(key, track, row)
            nbytes, size, ino = row_size, track.size + row_size, track.ino
            self._compactions += 1
        self._bytes += nbytes
        self._tracks[key] = full.track(meta, size=size, ino=ino, live=live)
        return nbytes

    def _append(self, key: str, track: _Track, pieces: Sequence[bytes]) -> None:
        """Append ``pieces`` with one writev and one fsync, or mark the track broken.

        (More than one ``writev`` only past 1024 pieces: a compaction row.)
        """
        # Never through a link, a FIFO or a second hard link (_safefs).
        fd, st = open_checked(self.location(key), os.O_WRONLY | os.O_APPEND)
        try:
            if (st.st_ino, st.st_size) != (track.ino, track.size):
                raise OSError(f"{self.location(key)} changed while appending; will rewrite it")
            try:
                write_all(fd, pieces)
                fsync_fd(fd)
            except BaseException:
                # Never fsync this file again (FACTS.md): the next commit rewrites it.
                self._tracks[key] = track._replace(broken=True)
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, track.size)
                raise
        finally:
            os.close(fd)
