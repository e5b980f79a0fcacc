"""The file journal: one append-only JSON Lines file per key (``JournalStore``).

Key ``k`` lives at ``<root>/k.jsonl`` (the rows: ``_format/journal.py``).  A
checkpoint is one batch of rows, one ``write`` and one ``fsync``; a fresh
file (a header and a compaction, when the file outgrows its content) is
written by ``write_atomic``, so a crash leaves the old journal or the new.
Append or compaction is decided by the core both journals share
(``core.py``).  A writer opening the journal truncates an unfinished batch.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import threading
from collections.abc import Callable, Sequence

import msgspec

from ..._format.journal import LINE_END, JournalScan, assemble, header_line, meta_row, scan_journal
from ..._values import Checkpoint, Meta
from ..atomic import fsync_fd, write_all, write_atomic
from ..base import check_key, landed, time_left
from ..envelopes import read_for_load
from ..files import FileStore
from ..safefs import open_checked, read_checked, read_fd
from ..sealing import Encryption, open_row, seal_rows
from .core import JournalCore
from .staging import Delta, Full, Track, absent

__all__ = ["JournalStatistics", "JournalStore"]

logger = logging.getLogger("checkpointer")

_ENCODER = msgspec.json.Encoder()


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


class JournalStore(JournalCore, FileStore):
    """Checkpoints as append-only journals: key ``k`` lives at ``root/k.jsonl``.

    A checkpoint costs what changed: new messages are appended (one write,
    one fsync); a changed history is written as a compaction row; the file
    is rewritten fresh when it outgrows its content.  See the README for the
    format, the guarantees and when to pick it over ``FileStore``.

    Args:
        root: the directory that holds the journals.
        rewrite_factor: rewrite the journal into a fresh file when it would
            grow past this many times its size at the last compaction (> 1).
        rewrite_min_bytes: ... but never below this size.
        encryption: seal every row (``Encryption``), bound to the key and to
            its offset in this journal (see the docs page "Encryption at rest").

    Raises:
        ValueError: a bad root, factor or size.
    """

    suffix = ".jsonl"
    _grows = True  # a read without the lock may see an append: it keeps what fstat saw
    _row_end = LINE_END
    _closing_meta = True

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        rewrite_factor: float = 2.0,
        rewrite_min_bytes: int = 1 << 20,
        encryption: Encryption | None = None,
    ) -> None:
        super().__init__(root, encryption=encryption)
        self._init_journal(rewrite_factor, rewrite_min_bytes)
        self._lock = threading.Lock()
        self._appends = 0
        self._compactions = 0
        self._rewrites = 0
        self._bytes = 0

    def _journal_after_fork(self) -> None:
        super()._journal_after_fork()
        self._lock = threading.Lock()  # a commit of the parent's may have held it at the fork

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

    def write(
        self, key: str, chunks: Sequence[bytes], *, revision: str, expected: str | None
    ) -> int:
        """Replace the journal of ``key`` with raw journal bytes, if it holds ``expected``."""
        check_key(key)
        with self._owned(key), self._locked(key):
            if landed(key, self._revision(self._current(key)), revision, expected):
                return sum(map(len, chunks))
            self._forget(key)
            if self.encryption is not None:
                lines = b"".join(chunks).splitlines(keepends=True)
                chunks = seal_rows(self.encryption, lines, key=key, first=None, offset=0)
            nbytes = write_atomic(self.location(key), chunks)
        self._sync_root()
        return nbytes

    def read(self, key: str) -> bytes | None:
        """The journal's bytes as stored (sealed rows stay sealed: a scan opens them)."""
        check_key(key)
        return read_checked(self.location(key), growing=True)

    def _opener(self, key: str, data: bytes) -> Callable[[bytes, int], bytes] | None:
        """How a scan of ``data`` (the journal of ``key``) opens its rows; None: plaintext."""
        if self.encryption is None and not data.startswith(b'{"sealed":'):
            return None
        first, where = data[: data.find(b"\n") + 1], self.location(key)
        return functools.partial(open_row, self.encryption, key=key, first=first, where=where)

    def revision(self, key: str) -> str | None:
        check_key(key)
        with self._locked(key):
            return self._revision(self._current(key))

    def read_checkpoint(self, key: str) -> Checkpoint[msgspec.Raw] | None:
        check_key(key)
        data = read_for_load(self, key)
        if data is None:
            return None
        path = self.location(key)
        scan = scan_journal(data, path, self._opener(key, data))
        state = msgspec.Raw(assemble(scan, path))
        return Checkpoint(meta=scan.meta, state=state, torn=scan.torn)

    def commit(self, key: str, meta: Meta, staged: object, *, expected: str | None) -> int:
        """Append or compact ``staged`` if the journal holds ``expected`` (see ``StateStore``)."""
        check_key(key)
        if not isinstance(staged, Full | Delta):
            raise TypeError(f"JournalStore cannot commit {type(staged).__name__}")
        with self._owned(key):
            if not self._lock.acquire(timeout=time_left()):
                nbytes = self._overtake(key, meta, staged, expected)
            else:
                try:
                    track = self._current(key)
                    if landed(key, self._revision(track), meta.revision, expected):
                        return 0
                    nbytes = self._commit_on(key, track, meta, staged, expected)
                finally:
                    self._lock.release()
        self._sync_root()
        return nbytes

    def read_meta(self, key: str) -> Meta | None:
        """The meta stored for ``key``; from the track while the file is as this store left it.

        (Re-reading would drop what the track remembers: the next commit
        would compact instead of appending.)
        """
        check_key(key)
        with self._locked(key):
            track = self._tracks.get(key)
            if track is not None and track.meta is not None and not track.broken:
                with contextlib.suppress(FileNotFoundError):
                    st = self._unchanged(key, track)
                    if st is not None and st.st_nlink == 1:
                        return track.meta
            return self._open(key).meta

    def update_meta(self, key: str, meta: Meta, *, expected: str) -> None:
        check_key(key)
        with self._owned(key), self._locked(key):
            track = self._current(key)
            if landed(key, self._revision(track), meta.revision, expected):
                return
            assert track.meta is not None  # it holds the revision expected
            if track.broken:  # rewrite from memory, or from what the file says
                remembered = self._remembered(key, track)
                self._compact(key, track, meta, remembered, expected, rewrite=True)
            else:
                row = meta_row(_ENCODER.encode(meta), LINE_END)
                [row] = self._sealed(key, track, [row])
                self._append_rows(key, track, meta, ["meta"], [row], len(row), expected)
                self._tracks[key] = track._replace(meta=meta, size=track.size + len(row))
        self._sync_root()

    def _mutex(self, key: str) -> threading.Lock:
        return self._lock  # one for all keys: it guards the tracks too

    def _overtake(self, key: str, meta: Meta, staged: object, expected: str | None) -> int:
        """Commit as a fresh file, without the lock a commit stuck past the flush's deadline holds.

        A rename never interleaves with the stuck commit's append (which goes
        on into the file it opened); a stuck rewrite may rename its older
        file over this one, and the writer commits again once it returns.
        The key's tracks are dead either way: the next commit re-reads the file.
        """
        full = self._settle(None, staged)
        assert isinstance(full, Full)
        path = self.location(key)
        logger.warning(
            "checkpointer: %s: a commit of this store did not finish within the flush's "
            "timeout; writing the journal fresh beside it",
            path,
        )
        self._forget(key)
        scan = self._scan(key)
        stored = None if scan is None else scan.meta.revision
        if landed(key, stored, meta.revision, expected):
            return 0
        meta_json = _ENCODER.encode(meta)
        rows = [header_line(meta_json), b"".join(self._compaction_row(meta_json, full))]
        nbytes = write_atomic(path, seal_rows(self.encryption, rows, key=key, first=None, offset=0))
        self._forget(key)  # whatever the stuck commit left meanwhile
        self._rewrites += 1
        self._bytes += nbytes
        return nbytes

    @staticmethod
    def _revision(track: Track) -> str | None:
        return None if track.meta is None else track.meta.revision

    def _forget(self, key: str) -> None:
        track = self._tracks.pop(key, None)
        if track is not None and track.known is not None:
            track.known.dead = True

    def _scan(self, key: str) -> JournalScan | None:
        """The journal of ``key`` read whole and scanned; None if there is none."""
        path = self.location(key)
        data = read_checked(path)
        return None if data is None else scan_journal(data, path, self._opener(key, data))

    def _open(self, key: str) -> Track:
        """Read the journal for writing: check it, truncate an unfinished append."""
        path = self.location(key)
        try:
            fd, st = open_checked(path, os.O_RDWR, links=True)
        except FileNotFoundError:
            track = self._tracks[key] = absent()
            return track
        try:
            # A reader (not the key's holder) may see another process append
            # meanwhile: it keeps what fstat saw, a batch or more behind.
            holder = self._holds(key)
            data = read_fd(fd, st.st_size, path, growing=not holder)
            scan = scan_journal(data, path, self._opener(key, data))
            linked = st.st_nlink > 1
            # Only the key's lock holder cuts an unfinished batch: to a reader it
            # may be another process's append in flight.
            if scan.torn is not None and not linked and holder:
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
        # A file whose append failed here stays untrusted: its pages may never reach the disk.
        was = self._tracks.get(key)
        track = absent()._replace(
            meta=scan.meta,
            size=scan.end,
            ino=st.st_ino,
            live=scan.live,
            broken=linked or (was is not None and was.broken and was.ino == st.st_ino),
            first=data[: data.find(b"\n") + 1],
        )
        if linked:
            _warn_linked(path, st.st_nlink)
        self._tracks[key] = track
        return track

    def _unchanged(self, key: str, track: Track) -> os.stat_result | None:
        """The journal's ``fstat`` if it is the file ``track`` says, else None (or
        ``FileNotFoundError``): the same inode, size and first line.  (A journal made
        afresh in a deleted one's inode has another first line: its meta's revision.)"""
        fd, st = open_checked(self.location(key), os.O_RDONLY, links=True)
        try:
            if (st.st_ino, st.st_size) != (track.ino, track.size):
                return None
            return st if os.pread(fd, len(track.first), 0) == track.first else None
        finally:
            os.close(fd)

    def _remembered(self, key: str, track: Track) -> Full:
        """The state on disk as a compaction, from memory when the track has it."""
        if track.known is not None:  # nothing new on top of what is on disk
            return Delta(track, [], [], [], track.head, track.tail, loose=False).as_full()
        scan = self._scan(key)
        if scan is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), self.location(key))
        return Full(whole=assemble(scan, self.location(key)))

    def _current(self, key: str) -> Track:
        """The track of ``key``, re-read if the file is not the one it says.

        A broken track stands for the file it was taken from, like any other:
        it only means that the next commit rewrites.  A reader never moves a
        file aside: a damaged or newer journal is raised.
        """
        track = self._tracks.get(key)
        if track is None:
            return self._open(key)
        try:
            st = self._unchanged(key, track)
        except FileNotFoundError:
            if track.meta is None:
                return track
        else:
            if st is not None:
                if st.st_nlink > 1 and not track.broken:  # linked since: rewrite, never append
                    _warn_linked(self.location(key), st.st_nlink)
                    track = self._tracks[key] = track._replace(broken=True)
                return track
        if self._holds(key):  # to a reader, other processes' appends are the news it reads
            logger.warning(
                "checkpointer: %s changed behind this store (another writer?); re-reading it",
                self.location(key),
            )
        return self._open(key)

    def _append_rows(
        self,
        key: str,
        track: Track,
        meta: Meta,
        kinds: list[str],
        rows: list[bytes],
        nbytes: int,
        expected: str | None,  # checked under the lock before the core was called
    ) -> None:
        data = b"".join(rows)  # one batch: one writev, one fsync
        self._append(key, track, [data])
        self._appends += 1
        self._bytes += nbytes

    def _compact(
        self,
        key: str,
        track: Track | None,
        meta: Meta,
        full: Full,
        expected: str | None,  # checked under the lock before the core was called
        *,
        rewrite: bool = False,
    ) -> int:
        assert track is not None  # _current always knows the file's track
        meta_json = _ENCODER.encode(meta)
        header = header_line(meta_json)
        row = self._compaction_row(meta_json, full)
        row_size = sum(map(len, row))
        live = len(header) + row_size
        path = self.location(key)
        fresh = (
            rewrite
            or track.meta is None
            or track.broken
            or track.size + row_size > self.threshold(live)
        )
        if self.encryption is not None:  # sealed: the sizes are the stored ones
            header, row = self._sealed_compaction(key, track, header, row, fresh=fresh)
            row_size = sum(map(len, row))
            live = len(header) + row_size
        if fresh:
            nbytes = write_atomic(path, [header, *row])
            size, ino, first = nbytes, os.lstat(path).st_ino, header
            self._rewrites += 1
        else:
            self._append(key, track, row)
            nbytes, size, ino, first = row_size, track.size + row_size, track.ino, track.first
            self._compactions += 1
        self._bytes += nbytes
        self._tracks[key] = full.track(meta, size=size, ino=ino, live=live)._replace(first=first)
        return nbytes

    def _sealed_compaction(
        self, key: str, track: Track, header: bytes, row: list[bytes], *, fresh: bool
    ) -> tuple[bytes, list[bytes]]:
        """A compaction's header and row sealed, for a fresh file or an append (its first line
        then the file's)."""
        first, offset = (None, 0) if fresh else (track.first, track.size)
        rows = [header, b"".join(row)] if fresh else [b"".join(row)]
        sealed = seal_rows(self.encryption, rows, key=key, first=first, offset=offset)
        return (sealed[0] if fresh else track.first), sealed[-1:]

    def _append(self, key: str, track: Track, pieces: Sequence[bytes]) -> None:
        """Append ``pieces`` with one writev and one fsync, or mark the track broken."""
        fd, st = open_checked(self.location(key), os.O_WRONLY | os.O_APPEND)
        try:
            if (st.st_ino, st.st_size) != (track.ino, track.size):
                raise OSError(f"{self.location(key)} changed while appending; will rewrite it")
            try:
                write_all(fd, pieces)
                fsync_fd(fd)
            except BaseException:
                # Never fsync this file again (its dirty pages may be gone): rewrite it next.
                self._tracks[key] = track._replace(broken=True)
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, track.size)
                raise
        finally:
            os.close(fd)
