"""The PostgreSQL journal: a checkpoint inserts only the rows of what changed.

A key's ``checkpoints`` row is its head (revision, meta, no state); ``<schema>.journal``
holds its rows, the file journal's lines.  An append or a compaction is one
transaction, the head's write conditional on the revision.

With ``encryption``, each row is sealed at its offset in the key's rows (after
their first, the compaction row: the server numbers the rows, the writer knows
their bytes), as ``JournalStore`` seals a file's rows; the head's state is where
they end, sealed: a row moved, swapped, dropped or planted is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from ... import _exit
from ..._format.envelope import decode_raw
from ..._format.journal import ROW_END
from ..._values import Checkpoint, Meta
from ..base import check_key
from ..envelopes import read_for_load
from ..journal.core import JournalCore
from ..journal.staging import Full, Track
from ..sealing import Encryption, seal_end, seal_epoch
from .store import PostgresStore, row_params

if TYPE_CHECKING:
    import psycopg

__all__ = ["PostgresJournalStore"]

_ENCODER = msgspec.json.Encoder()


class PostgresJournalStore(JournalCore, PostgresStore):
    """A ``PostgresStore`` whose checkpoints cost what changed: rows per message.

    Takes the arguments of ``PostgresStore``, plus:

    Args:
        rewrite_factor: compact a key when its rows would grow past this
            many times the size of its last compaction row (> 1).
        rewrite_min_bytes: ... but never below this size.
        encryption: seal every row (``Encryption``), bound to the key and its
            offset (see the docs page "Encryption at rest").

    Keys written by a plain ``PostgresStore`` load, and are compacted into a
    journal on this store's first commit; a plain store reads journal keys.
    """

    _row_end = ROW_END
    _closing_meta = False  # the head row carries the meta

    def __init__(
        self,
        dsn: str = "",
        *,
        rewrite_factor: float = 2.0,
        rewrite_min_bytes: int = 1 << 20,
        encryption: Encryption | None = None,
        **options: Any,
    ) -> None:
        super().__init__(dsn, encryption=encryption, **options)
        self._init_journal(rewrite_factor, rewrite_min_bytes)
        self.appends = 0
        self.compactions = 0

    def write(
        self, key: str, chunks: Sequence[bytes], *, revision: str, expected: str | None
    ) -> int:
        """Store an envelope as a plain (snapshot) row, as ``PostgresStore`` does."""
        self._tracks.pop(key, None)
        return super().write(key, chunks, revision=revision, expected=expected)

    def delete(self, key: str) -> bool:
        self._tracks.pop(key, None)
        return super().delete(key)

    def move_aside(self, key: str, suffix: str) -> str | None:
        self._tracks.pop(key, None)
        return super().move_aside(key, suffix)

    def release(self, key: str) -> None:
        self._tracks.pop(key, None)  # whoever takes the key next may change it
        super().release(key)

    def close(self) -> None:
        self._tracks.clear()
        super().close()

    def commit(self, key: str, meta: Meta, staged: object, *, expected: str | None) -> int:
        """Append or compact ``staged`` if the head holds ``expected``: one transaction."""
        check_key(key)
        track = self._tracks.get(key)
        if track is not None and (track.meta is None or track.meta.revision != expected):
            # The track is of the rows stored under its revision: under another
            # one they are not what it says (revisions are never repeated).
            track = None
        # The core takes the witness lock as it extends a track: a signal
        # landing then waits (its flush may stage on this store).
        with _exit.busy():
            return self._commit_on(key, track, meta, staged, expected)

    def is_journal(self, key: str) -> bool | None:
        """Whether ``key``'s row is a journal's head (False: a snapshot row; None: no row)."""
        check_key(key)
        row = self._run(lambda c: c.execute(self._sql["journal"], {"key": key}).fetchone())
        return None if row is None else bool(row[0])

    def read_meta(self, key: str) -> Meta | None:
        """The meta of ``key``, its rows checked: a damaged row is a ``CheckpointError`` here
        (the key is moved aside), not compacted away by the next commit."""
        check_key(key)
        data = self.read(key)  # an OSError stays one: the key is not damaged, the server is away
        if data is None:
            return None
        return decode_raw(data, self.location(key)).meta

    def update_meta(self, key: str, meta: Meta, *, expected: str) -> None:
        """Store ``meta`` if the row (a head or a snapshot) holds ``expected``: one update."""
        check_key(key)
        track = self._tracks.pop(key, None)
        self._conditional_write(key, self._params(key, meta, expected), statement="update_meta")
        if track is not None and track.meta is not None and track.meta.revision == expected:
            self._tracks[key] = track._replace(meta=meta)

    def read_checkpoint(self, key: str) -> Checkpoint[msgspec.Raw] | None:
        check_key(key)
        data = read_for_load(self, key)
        return None if data is None else decode_raw(data, self.location(key))

    def _params(
        self, key: str, meta: Meta, expected: str | None, end: bytes = b""
    ) -> dict[str, Any]:
        # A head: its state is in the rows; it keeps where they end (sealed) if encrypted.
        meta_json = _ENCODER.encode(meta).decode()
        return row_params(key, meta.revision, expected, meta_json, end, journal=True)

    def _insert(
        self,
        key: str,
        meta: Meta,
        kinds: list[str],
        bodies: list[bytes],
        expected: str | None,
        *,
        clear: bool,
        end: bytes,
    ) -> None:
        def rows(conn: psycopg.Connection[Any]) -> None:
            if clear:  # a compaction: one row
                conn.execute(self._sql["journal_clear"], {"key": key})
                conn.execute(self._sql["journal_compaction"], {"key": key, "body": bodies[0]})
            elif bodies:
                conn.execute(
                    self._sql["journal_append"], {"key": key, "kinds": kinds, "bodies": bodies}
                )

        params = self._params(key, meta, expected, end)
        try:
            self._conditional_write(key, params, rows, nbytes=sum(map(len, bodies)))
        except BaseException:
            self._tracks.pop(key, None)  # the server may have committed it: compact next
            raise

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
        end = seal_end(self.encryption, key=key, first=track.first, size=track.size + nbytes)
        self._insert(key, meta, kinds, rows, expected, clear=False, end=end)
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
        body = b"".join(self._compaction_row(_ENCODER.encode(meta), full))
        [body], first, end = seal_epoch(self.encryption, [body], key=key)
        self._insert(key, meta, ["compaction"], [body], expected, clear=True, end=end)
        self.compactions += 1
        track = full.track(meta, size=len(body), ino=0, live=len(body))
        self._tracks[key] = track._replace(first=first)
        return len(body)
