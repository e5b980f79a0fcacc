"""The places the commands look at, behind one seam: ``Root`` (a store directory is
``directory.py``).  These two modules are the CLI's only users of private modules.
"""

from __future__ import annotations

import contextlib
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple

from checkpointer import (
    Checkpoint,
    CheckpointError,
    JournalStore,
    Meta,
    PostgresJournalStore,
    S3JournalStore,
    S3Store,
    load,
)
from checkpointer._format.envelope import decode_raw as decode_raw
from checkpointer._format.envelope import decode_state as decode_state
from checkpointer._format.envelope import envelope_chunks as envelope_chunks
from checkpointer._format.journal import LINE_END as LINE_END
from checkpointer._format.journal import JournalScan
from checkpointer._format.journal import assemble as assemble
from checkpointer._format.journal import compaction_row as compaction_row
from checkpointer._format.journal import header_line as header_line
from checkpointer._format.journal import scan_journal as scan_journal
from checkpointer._stores.base import KEY_PATTERN, check_key
from checkpointer._stores.journal.staging import Full as Full
from checkpointer._stores.postgres.schema import schema_sql as schema_sql
from checkpointer._stores.s3.client import error_code
from checkpointer._stores.s3.store import Listed
from checkpointer._stores.sealing import DecryptionError as DecryptionError
from checkpointer._stores.sealing import Encryption
from checkpointer._transcript.dialects import CHAT as CHAT
from checkpointer._transcript.dialects import describe_shape as describe_shape
from checkpointer._transcript.dialects import detect as detect
from checkpointer._transcript.history import scan_history as scan_history
from checkpointer._transcript.messages import clipped as clipped
from checkpointer.stores import PostgresStoreError, S3StoreError

EPOCH = datetime.fromtimestamp(0, UTC)
ASIDE = re.compile(r"\.corrupt-(\d{8}T\d{6})(\.\d+)?Z$")  # a corrupt file a writer moved aside
S3_SCHEME, PG_SCHEMES = "s3://", ("postgresql://", "postgres://")
# Why ``load`` cannot read a checkpoint that is not damaged: no command calls it bad or ages it.
FOREIGN = (
    "written through a store of your own (a `checkpointer-revision` line, then that store's "
    "bytes), which the CLI cannot read: load() it through that store"
)

SEALED = "encrypted"  # how every reason of a record that does not open starts: kept, never pruned
ENCRYPTED = f"{SEALED}, and no key given (--key-file, or CHECKPOINTER_KEYS)"


def not_ours(error: str | None) -> bool:
    """Whether ``error`` says a record is only not ours to read (not damage)."""
    return error is not None and (error == FOREIGN or error.startswith(ENCRYPTED))


class RootError(Exception):
    """The root cannot be looked at (no such directory, a bad DSN): the message says why."""


class Entry(NamedTuple):
    """A checkpoint in a root (a file, a row, an object), or a summary or corrupt file."""

    key: str
    kind: str  # "snapshot", "journal", "row"; "summary", "corrupt"
    path: str  # the file, or the location (never with a password)


class LockView(NamedTuple):
    """What a look at a key's writer lock found (None from ``lock``: no lock)."""

    state: Literal["alive", "stale", "unknown"]
    holder: str  # who holds or held it ("" when unknown), or what is wrong with the file
    path: str | None  # the lock file; None for an advisory lock
    problem: str | None = None  # not a lock file this library made (a link, a FIFO, ...)


class Removal(NamedTuple):  # what ``delete`` did with one path
    path: str
    outcome: Literal["removed", "kept", "failed"]
    why: str  # removed and kept: the reason shown; failed: the error message
    lock: bool = False  # a stale lock file (counted apart)


class Extra(NamedTuple):
    """A summary checkpoint (kind "summary") or a corrupt file moved aside ("corrupt")."""

    entry: Entry  # a summary's path is its checkpoint.md
    size: int
    time: datetime  # a summary's created_at (its file's time if unreadable); when moved aside
    problem: str | None = None  # something planted in its place: left alone
    unreadable: str | None = None  # a summary that cannot be read


class Extras(NamedTuple):
    found: list[Extra]
    problems: list[str]  # ``sessions`` a link or a file, ...: its summaries are not looked at


# For ``delete``: why to keep an entry after all (written since it was listed), or None.
Recheck = Callable[[Entry], str | None]


class Root(ABC):
    """What the commands need of a place that holds checkpoints (the defaults: no locks to
    look at, no side files).  A call raises CheckpointError or OSError for an entry that
    cannot be read; one of ``failure`` for the root itself, which ends the command."""

    where: str  # the root, for messages
    stores: dict[str, Any]  # entry kind -> the store that reads it
    # How output names things: show's first field; ls's line after its table, and where;
    # prune's count; whether show of an unknown key says how many keys ls lists.
    noun = "object"
    unreadable = "{n} key(s) cannot be read; `checkpointer verify {where}` says why"
    unreadable_on_stdout = False
    prune_noun = "checkpoint(s)"
    count_hint = True
    lock_files = False  # its locks are files, left behind stale by a writer that died
    mtimes = True  # an entry has a time of its own, used when its meta is unreadable
    has_extras = False  # it may hold summaries and corrupt files (``extras``)
    failure: tuple[type[Exception], ...] = ()
    lock_keys: frozenset[str] = frozenset()  # keys with a lock file, as of the last scan

    def close(self) -> None:
        return None

    def validate_key(self, key: str) -> None:
        """ValueError: a key the root cannot hold (a usage error)."""
        check_key(key)

    @abstractmethod
    def scan(self) -> list[Entry]:
        """What the root holds, in its order (RootError: it cannot be listed)."""

    @abstractmethod
    def measure(self, entry: Entry) -> tuple[int, datetime | None]:
        """Size and time (None: its meta's)."""

    encryption: Encryption | None = None  # the keys given (--key-file, CHECKPOINTER_KEYS)

    @property
    def sealed_metas(self) -> dict[str, Meta]:
        """path -> the readable meta of a checkpoint that did not open (``load`` fills it)."""
        return self.__dict__.setdefault("_sealed_metas", {})  # type: ignore[no-any-return]

    def load(self, entry: Entry) -> Checkpoint[Any] | None:
        with sealed(self.encryption, self.sealed_metas):
            return load(self.stores[entry.kind], entry.key)

    def raw(self, entry: Entry) -> bytes | None:
        with sealed(self.encryption, self.sealed_metas):
            data: bytes | None = self.stores[entry.kind].read(entry.key)
        return data

    def journal(self, entry: Entry) -> JournalScan | None:
        """A journal entry scanned, its sealed rows opened with the keys given (one read)."""
        store = self.stores[entry.kind]
        with sealed(self.encryption, self.sealed_metas):
            data: bytes | None = store.read(entry.key)
            if data is None:
                return None
            opener = store._opener(entry.key, data) if isinstance(store, JournalStore) else None
            return scan_journal(data, entry.path, opener)

    def lock(self, key: str) -> LockView | None:
        """Who holds ``key``'s writer lock, only looking; None: no lock."""
        return None

    def asides(self) -> list[str]:
        """Damaged checkpoints a writer moved aside (for ``verify`` to mention)."""
        return []

    def planted(self, entry: Entry) -> str | None:
        """Why prune must leave ``entry`` alone (not a file this library made), or None."""
        return None

    def extras(self) -> Extras:
        return Extras([], [])

    def extra(self, entry: Entry) -> Extra | None:
        """A summary or corrupt file looked at (again); None: it is gone."""
        return None

    def delete(
        self, key: str, old: Sequence[tuple[Entry, str]], *, recheck: Recheck, stale: str | None
    ) -> list[Removal]:
        """Delete ``old`` entries of ``key`` (each with why), under the key's lock if it has one,
        each looked at again first (``recheck``); ``stale``: why its stale lock file goes too."""
        return each(old, recheck, self._remove)

    def _remove(self, entry: Entry, why: str) -> Removal | None:  # None: gone already
        gone = self.stores[entry.kind].delete(entry.key)
        return Removal(entry.path, "removed", why) if gone else None


@contextlib.contextmanager
def sealed(encryption: Encryption | None, metas: dict[str, Meta]) -> Iterator[None]:
    """A record that does not open, said as ``SEALED`` (``ENCRYPTED`` without keys); its
    readable meta kept in ``metas``."""
    try:
        yield
    except DecryptionError as exc:
        if exc.meta is not None:
            metas[exc.path] = exc.meta
        reason = exc.reason
        if encryption is None and exc.why == "no-key":
            readable = "; its meta is readable" if exc.meta is not None else ""
            reason = f"{ENCRYPTED}: sealed with key id {exc.key_id!r}{readable}"
        if not reason.startswith(SEALED):
            reason = f"{SEALED}: {reason}"
        raise DecryptionError(
            exc.path, reason, key=exc.key, position=exc.position, key_id=exc.key_id, why=exc.why
        ) from None


def each(
    old: Sequence[tuple[Entry, str]],
    recheck: Recheck,
    remove: Callable[[Entry, str], Removal | None],
) -> list[Removal]:
    done: list[Removal] = []
    for entry, why in old:
        kept = recheck(entry)
        removal = remove(entry, why) if kept is None else Removal(entry.path, "kept", kept)
        if removal is not None:
            done.append(removal)
    return done


def why(exc: OSError) -> str:
    return os.strerror(exc.errno) if exc.errno else str(exc)


class PostgresRoot(Root):
    """The keys of a ``PostgresStore`` (snapshot and journal keys alike: read through a
    ``PostgresJournalStore``, which reads both and writes either kind); advisory locks."""

    noun = "row"
    unreadable = "{n} key(s) cannot be read; `checkpointer verify` says why"
    unreadable_on_stdout = True
    count_hint = False
    mtimes = False
    failure = (PostgresStoreError,)

    def __init__(self, dsn: str, schema: str, encryption: Encryption | None = None) -> None:
        self.encryption = encryption
        try:
            self.store = PostgresJournalStore(
                dsn, schema=schema, create_schema=False, encryption=encryption
            )
        except (ImportError, ValueError) as exc:  # no psycopg, a bad DSN or schema name
            raise RootError(str(exc)) from None
        self.stores = {"row": self.store}
        self.where = self.store.location("")[:-1]
        # Rows whose key breaks the key rule (SQL put them there): escaped, never touched.
        self._invalid: dict[str, str] = {}

    def close(self) -> None:
        self.store.close()

    def validate_key(self, key: str) -> None:
        pass  # an invalid key is not in the store: show says so

    def scan(self) -> list[Entry]:
        entries = []
        keys: list[str] = self.store.keys()  # a method, not a dict's
        for key in keys:
            try:
                check_key(key)
            except ValueError as exc:
                shown = _escaped(key)
                self._invalid[shown] = _escaped(str(exc))
                entries.append(Entry(shown, "row", f"{self.where}/{shown}"))
            else:
                entries.append(Entry(key, "row", self.store.location(key)))
        return entries

    def _check(self, entry: Entry) -> None:
        why = self._invalid.get(entry.key)
        if why is not None:
            raise CheckpointError(
                entry.path,
                f"a row no writer can use ({why}); written by SQL or another tool? "
                "rename or delete it with SQL",
            )

    def lock(self, key: str) -> LockView | None:
        if key in self._invalid:
            return None  # no writer can take it
        holder = self.store.locked_by(key)
        return None if holder is None else LockView("alive", holder, None)

    def measure(self, entry: Entry) -> tuple[int, datetime | None]:
        try:
            return len(self.raw(entry) or b""), None  # a damaged journal row: CheckpointError
        except DecryptionError:
            return 0, None  # its plaintext's size is sealed; ``load`` says why, with its meta

    def load(self, entry: Entry) -> Checkpoint[Any] | None:
        self._check(entry)
        return super().load(entry)

    def raw(self, entry: Entry) -> bytes | None:
        self._check(entry)
        with sealed(self.encryption, self.sealed_metas):
            return self.store.read(entry.key) or b""

    def delete(
        self, key: str, old: Sequence[tuple[Entry, str]], *, recheck: Recheck, stale: str | None
    ) -> list[Removal]:
        # Held while deleting: no writer starts on it midway (an invalid key is never old).
        holder = self.store.acquire(key)
        if holder is not None:
            return [Removal(e.path, "kept", f"its lock holder is alive ({holder})") for e, _ in old]
        try:
            return each(old, recheck, self._remove)
        finally:
            self.store.release(key)


def _escaped(text: str) -> str:
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class S3Root(Root):
    """The keys under ``s3://bucket/prefix``.  No locks: ``delete`` removes an object only
    if it is the one listed (``If-Match`` on its ETag), so a writer that wrote since keeps
    it; an object that is not a checkpoint has no age to trust: prune leaves it."""

    failure = (S3StoreError,)
    mtimes = False

    def __init__(
        self, url: str, endpoint_url: str | None, encryption: Encryption | None = None
    ) -> None:
        bucket, _, prefix = url[len(S3_SCHEME) :].partition("/")
        self.encryption = encryption
        try:
            self.stores = {
                "snapshot": S3Store(
                    bucket, prefix, endpoint_url=endpoint_url, encryption=encryption
                ),
                "journal": S3JournalStore(
                    bucket, prefix, endpoint_url=endpoint_url, encryption=encryption
                ),
            }
        except (ImportError, ValueError) as exc:  # no botocore, a bad bucket name
            raise RootError(str(exc)) from None
        self.s3 = self.stores["snapshot"].s3
        self.where = self.s3.url("").rstrip("/")
        self._listed: dict[str, Listed] = {}
        self._asides: list[str] = []

    def scan(self) -> list[Entry]:
        entries = []
        self._asides = []
        for listed in self.stores["snapshot"].listing():
            name = listed.name
            if ASIDE.search(name):
                self._asides.append(self.s3.url(name))
            for kind, store in self.stores.items():
                key = name[: -len(store.suffix)]
                if name.endswith(store.suffix) and KEY_PATTERN.fullmatch(key):
                    entries.append(Entry(key, kind, store.location(key)))
                    self._listed[entries[-1].path] = listed
        return entries

    def measure(self, entry: Entry) -> tuple[int, datetime | None]:
        listed = self._listed[entry.path]  # every entry is of the listing
        return listed.size, listed.modified

    def _remove(self, entry: Entry, why: str) -> Removal | None:
        try:
            gone = self.stores[entry.kind].delete(entry.key, etag=self._listed[entry.path].etag)
        except Exception as exc:
            if error_code(exc) != "PreconditionFailed":
                raise
            return Removal(entry.path, "kept", "written since it was listed")
        return Removal(entry.path, "removed", why) if gone else None

    def asides(self) -> list[str]:
        return list(self._asides)
