"""The places the commands look at: a store directory, or a PostgreSQL store.

``ls``, ``show``, ``verify`` and ``prune`` are written once, over a ``Root``:
what it holds (``scan``), what one checkpoint holds (``measure``, ``load``,
``raw``), who holds a key's writer lock (``lock``, which only looks), and
prune's deletion of a key's old checkpoints under that key's lock, each
checked again once the lock is held (``delete``).  Besides its checkpoints a
directory may hold summary checkpoints (``sessions/<key>/checkpoint.md``)
and corrupt files a writer moved aside (``<key>.corrupt-<UTC time>``):
``extras`` lists them for ``ls`` and for ``prune --summaries/--corrupt``,
whose ``delete`` removes them too (the files themselves: ``sidefiles.py``).

* ``DirectoryRoot``: a ``FileStore`` / ``JournalStore`` root.  The file kinds
  are listed once (``_KINDS``): snapshots ``<key>.json`` and journals
  ``<key>.jsonl``.  Locks are the library's lock files ``<key>.lock``:
  ``lock`` looks with ``probe_file_lock``, which never takes a lock a writer
  could be reaching for; ``delete`` takes the key's writer lock
  (``FileStore.lock``) and its release unlinks the lock file.
* ``PostgresRoot``: ROOT is a ``postgresql://`` URI (or ``--dsn`` a libpq
  connection string), and everything goes through the store API (``keys``,
  ``read``, ``load``, ``delete``), so snapshot rows and journal rows look
  alike.  A key is named ``store.location(key)``, never with the password.
  Locks are the advisory writer locks: ``lock`` asks ``locked_by``;
  ``delete`` holds the key's lock itself while it deletes.

This module and ``sidefiles.py`` are the ones of the command line that import
the library's private modules; psycopg is imported only by a ``PostgresStore`` that
connects, so the commands over a directory work without the ``[postgres]``
extra.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple, Protocol

from checkpointer import Checkpoint, CheckpointError, FileStore, JournalStore, PostgresStore, load
from checkpointer._stores.atomic import fsync_dir
from checkpointer._stores.base import KEY_PATTERN, check_key
from checkpointer._stores.flock import probe_file_lock
from checkpointer._stores.safefs import UnsafeFile, describe, read_checked

# What the commands read in a history, passed on to look, show and verify: the
# transcript helpers' dialects and their scan (this module is the one seam).
from checkpointer._transcript.dialects import CHAT as CHAT
from checkpointer._transcript.dialects import describe_shape as describe_shape
from checkpointer._transcript.dialects import detect as detect
from checkpointer._transcript.history import scan_history as scan_history
from checkpointer._transcript.messages import clipped as clipped
from checkpointer.stores import KeyLocked, PostgresStoreError, TornTail

from . import sidefiles

__all__ = [
    "EPOCH",
    "DirectoryRoot",
    "Entry",
    "Extra",
    "Extras",
    "Loaded",
    "LockView",
    "PostgresRoot",
    "Recheck",
    "Removal",
    "Root",
    "RootError",
    "Scan",
    "Words",
    "is_dsn",
    "open_root",
    "schema_sql",
    "why",
]

EPOCH = datetime.fromtimestamp(0, UTC)


class RootError(Exception):
    """The root cannot be looked at (no such directory, a bad DSN): the message says why."""


class Entry(NamedTuple):
    """A checkpoint in a root: a file, or a row."""

    key: str
    kind: str  # "snapshot" or "journal" (a file), "row"
    path: str  # the file, or the row's location (no password)


class Loaded(NamedTuple):
    """A decoded checkpoint of any kind: its meta, its state, a journal's torn tail it ignored."""

    meta: Any
    state: Any
    torn: TornTail | None = None


class Scan(NamedTuple):
    """What a root holds."""

    entries: list[Entry]  # in the root's order: file names, or keys
    lock_keys: frozenset[str]  # keys with a lock file of their own (a directory)


class LockView(NamedTuple):
    """What a look at a key's writer lock found (None from ``lock``: no lock)."""

    state: Literal["alive", "stale", "unknown"]
    holder: str  # who holds or held it ("" when unknown), or what is wrong with the file
    path: str | None  # the lock file; None for an advisory lock
    problem: str | None = None  # not a lock file this library made (a link, a FIFO, ...)


class Removal(NamedTuple):
    """What ``delete`` did with one path: removed, kept (and why), or failed."""

    path: str
    outcome: Literal["removed", "kept", "failed"]
    why: str  # removed and kept: the reason shown; failed: the error message
    lock: bool = False  # a stale lock file (counted apart)


class Words(NamedTuple):
    """How a root names its things in output (each as the commands always printed it)."""

    entry: str  # show's first field: "file" or "row"
    unreadable: str  # ls after its table: "{n} ... cannot be read; ..." ({n}, {where})
    unreadable_on_stdout: bool  # where ls says so
    prune_noun: str  # prune's summary: "removed 3 file(s) older than 7d ..."
    count_hint: bool  # show of an unknown key says how many ``ls`` lists


class Extra(NamedTuple):
    """A summary checkpoint (kind "summary") or a corrupt file moved aside ("corrupt")."""

    entry: Entry  # a summary's path is its checkpoint.md
    size: int
    time: datetime  # a summary's created_at (its file's time if unreadable); when moved aside
    problem: str | None = None  # something planted in its place: left alone
    unreadable: str | None = None  # a summary that cannot be read (its time is its file's)


class Extras(NamedTuple):
    """The summaries and corrupt files of a root, and what is planted on the way to them."""

    found: list[Extra]
    problems: list[str]  # ``sessions`` a link or a file, ...: its summaries are not looked at


Recheck = Callable[[Entry], str | None]
"""For ``delete``: why to keep an entry after all (written since it was listed), or None."""


class Root(Protocol):
    """What the commands need of a place that holds checkpoints."""

    where: str  # the root, for messages
    words: Words
    kinds: tuple[str, ...]  # the entry kinds it can hold (more than one: shown)
    lock_files: bool  # its locks are files, left behind stale by a writer that died
    mtimes: bool  # an entry has a time of its own (a file's), used when its meta is unreadable
    has_extras: bool  # it may hold summaries and corrupt files (``extras``)
    failure: tuple[type[Exception], ...]  # raised by any call: ends the command (a server down)

    def close(self) -> None:
        """Give back what the root holds (a connection)."""

    def validate_key(self, key: str) -> None:
        """Raises ValueError for a key the root cannot hold (a usage error)."""

    def scan(self) -> Scan:
        """What the root holds.  Raises RootError: it cannot be listed."""

    def lock(self, key: str) -> LockView | None:
        """Who holds ``key``'s writer lock, only looking; None: no lock (file)."""

    def measure(self, entry: Entry) -> tuple[int, datetime | None]:
        """Size and time (None: its meta's); raises CheckpointError, OSError."""

    def load(self, entry: Entry) -> Loaded | None:
        """What it holds (None: gone); raises CheckpointError, OSError."""

    def raw(self, entry: Entry) -> bytes | None:
        """Its bytes as stored (None: gone); raises CheckpointError, OSError."""

    def asides(self) -> list[str]:
        """Damaged checkpoints a writer moved aside (for ``verify`` to mention)."""

    def planted(self, entry: Entry) -> str | None:
        """Why prune must leave ``entry`` alone (not a file this library made), or None."""

    def extras(self) -> Extras:
        """Its summary checkpoints and corrupt files moved aside (none: a PostgreSQL store)."""

    def extra(self, entry: Entry) -> Extra | None:
        """A summary or corrupt file looked at (again); None: it is gone."""

    def delete(
        self,
        key: str,
        old: Sequence[tuple[Entry, str]],
        *,
        recheck: Recheck,
        stale: str | None,
    ) -> list[Removal]:
        """Delete ``old`` entries of ``key`` (with why) holding the key's lock.

        Each is looked at again once the lock is held (``recheck``), since a
        writer may have resumed and written the key after it was listed.
        ``stale``: the key's stale lock file goes too, for this reason.
        A summary among ``old`` goes only while the key has no checkpoint.
        """


def _loaded(checkpoint: Checkpoint[Any]) -> Loaded:
    return Loaded(checkpoint.meta, checkpoint.state, checkpoint.torn)


def why(exc: OSError) -> str:
    """An ``OSError`` in words: its strerror, or its message (no errno)."""
    return os.strerror(exc.errno) if exc.errno else str(exc)


# -- a store directory -----------------------------------------------------------


class _Kind(NamedTuple):
    name: str
    suffix: str
    store: Callable[[str], FileStore]


_KINDS: tuple[_Kind, ...] = (
    _Kind("snapshot", FileStore.suffix, FileStore),
    _Kind("journal", JournalStore.suffix, JournalStore),
)
_BY_NAME = {kind.name: kind for kind in _KINDS}
LOCK_SUFFIX = ".lock"


class DirectoryRoot:
    """A store directory: snapshot and journal files, and their lock files."""

    words = Words(
        entry="file",
        unreadable="{n} file(s) cannot be read; `checkpointer verify {where}` says why",
        unreadable_on_stdout=False,
        prune_noun="file(s)",
        count_hint=True,
    )
    kinds: tuple[str, ...] = tuple(kind.name for kind in _KINDS)
    lock_files = True
    mtimes = True
    has_extras = True
    failure: tuple[type[Exception], ...] = ()

    def __init__(self, root: str) -> None:
        self.where = root

    def close(self) -> None:
        pass

    def validate_key(self, key: str) -> None:
        check_key(key)

    def scan(self) -> Scan:
        root = self.where
        if not os.path.exists(root):
            raise RootError(f"no such directory: {root} (a writer creates it on its first write)")
        if not os.path.isdir(root):
            raise RootError(f"not a directory: {root}; give the directory a FileStore writes to")
        try:
            names = sorted(os.listdir(root))
        except OSError as exc:
            raise RootError(f"cannot list {root}: {why(exc)}") from None
        entries: list[Entry] = []
        locks: set[str] = set()
        for name in names:
            if name.endswith(LOCK_SUFFIX) and KEY_PATTERN.fullmatch(name[: -len(LOCK_SUFFIX)]):
                locks.add(name[: -len(LOCK_SUFFIX)])
                continue
            for kind in _KINDS:
                key = name[: -len(kind.suffix)]
                if name.endswith(kind.suffix) and KEY_PATTERN.fullmatch(key):
                    entries.append(Entry(key, kind.name, os.path.join(root, name)))
                    break
        return Scan(entries, frozenset(locks))

    def _lock_path(self, key: str) -> str:
        return os.path.join(self.where, key + LOCK_SUFFIX)

    def lock(self, key: str) -> LockView | None:
        probe = probe_file_lock(self._lock_path(key))
        if probe is None:
            return None
        state: Literal["alive", "stale", "unknown"] = (
            "unknown" if probe.alive is None else "alive" if probe.alive else "stale"
        )
        holder = probe.holder.describe() if probe.holder is not None else ""
        # A link, a FIFO, ... in place of the lock file: say so where the holder goes.
        return LockView(state, probe.problem or holder, probe.path, probe.problem)

    def measure(self, entry: Entry) -> tuple[int, datetime | None]:
        try:
            st = os.lstat(entry.path)  # a planted link's own size and time, never its target's
        except OSError:
            return 0, EPOCH
        return st.st_size, datetime.fromtimestamp(st.st_mtime, UTC)

    def load(self, entry: Entry) -> Loaded | None:
        store = _BY_NAME[entry.kind].store(os.path.dirname(entry.path) or ".")
        checkpoint = load(store, entry.key)
        return None if checkpoint is None else _loaded(checkpoint)

    def raw(self, entry: Entry) -> bytes | None:
        # No link followed, no FIFO waited on; a journal may grow by an append meanwhile.
        return read_checked(entry.path, growing=entry.kind == "journal")

    def asides(self) -> list[str]:
        try:
            names = sorted(os.listdir(self.where))
        except OSError:
            return []
        return [os.path.join(self.where, name) for name in names if sidefiles.ASIDE.search(name)]

    def planted(self, entry: Entry) -> str | None:
        if entry.kind == "summary":
            extra = self.extra(entry)
            return None if extra is None else extra.problem
        try:
            st = os.lstat(entry.path)
        except OSError:
            return None  # gone: nothing to remove
        if stat.S_ISREG(st.st_mode):
            return None
        return str(UnsafeFile(entry.path, describe(st, entry.path)))

    def extras(self) -> Extras:
        entries = [Entry(key, "corrupt", path) for key, path in self._asides()]
        problems: list[str] = []
        sessions = os.path.join(self.where, sidefiles.SESSIONS)
        try:
            keys = sidefiles.summary_keys(self.where)
        except FileNotFoundError:
            keys = []
        except UnsafeFile as exc:  # `sessions` planted: none of its summaries looked at
            keys, problems = [], [str(exc)]
        except OSError as exc:
            keys, problems = [], [f"cannot list {sessions}: {why(exc)}"]
        summary = sidefiles.SUMMARY
        entries += (Entry(key, "summary", os.path.join(sessions, key, summary)) for key in keys)
        return Extras([e for e in map(self.extra, entries) if e is not None], problems)

    def _asides(self) -> list[tuple[str, str]]:
        """The corrupt files moved aside of valid keys: (key, path)."""
        keys = ((sidefiles.ASIDE.sub("", os.path.basename(p)), p) for p in self.asides())
        return [(key, path) for key, path in keys if KEY_PATTERN.fullmatch(key)]

    def extra(self, entry: Entry) -> Extra | None:
        if entry.kind == "corrupt":
            look = sidefiles.look_corrupt(entry.path)
        else:
            look = sidefiles.look_summary(self.where, entry.key, entry.path)
        return None if look is None else Extra(entry, *look)

    def _remove_summary(self, entry: Entry, reason: str) -> Removal:
        """Remove a summary and its directory (the lock held), unless a checkpoint came back."""
        for kind in _KINDS:
            if os.path.lexists(os.path.join(self.where, entry.key + kind.suffix)):
                return Removal(entry.path, "kept", "its key has a checkpoint again")
        try:
            stays = sidefiles.remove_summary(self.where, entry.key, entry.path)
        except FileNotFoundError:
            return Removal(entry.path, "kept", "gone already")
        except OSError as exc:
            return Removal(entry.path, "failed", f"cannot remove {entry.path}: {why(exc)}")
        return Removal(entry.path, "removed", reason if stays is None else f"{reason}; {stays}")

    def delete(
        self,
        key: str,
        old: Sequence[tuple[Entry, str]],
        *,
        recheck: Recheck,
        stale: str | None,
    ) -> list[Removal]:
        # Holding the writer lock keeps a writer from starting on the key
        # midway; releasing it unlinks the lock file (the library's release,
        # which a writer waiting on the old file notices and starts over).
        lock_path = self._lock_path(key)
        try:
            held = FileStore(self.where).lock(key)
        except KeyLocked:  # a writer took the key since the probe
            return [Removal(e.path, "kept", "its lock holder is alive") for e, _ in old]
        except OSError as exc:
            return [Removal(lock_path, "failed", f"cannot lock {lock_path}: {why(exc)}")]
        done: list[Removal] = []
        try:
            for entry, reason in old:
                if not os.path.lexists(entry.path):
                    continue  # gone already: not ours to report
                kept = recheck(entry)
                if kept is not None:
                    done.append(Removal(entry.path, "kept", kept))
                    continue
                if entry.kind == "summary":
                    done.append(self._remove_summary(entry, reason))
                    continue
                try:
                    os.unlink(entry.path)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    done.append(
                        Removal(entry.path, "failed", f"cannot remove {entry.path}: {why(exc)}")
                    )
                    continue
                done.append(Removal(entry.path, "removed", reason))
            if any(r.outcome == "removed" for r in done):
                sidefiles.fsync_root(self.where)  # the unlinks survive a power cut only so
        finally:
            try:
                held.release()
            except OSError as exc:
                done.append(Removal(lock_path, "failed", f"cannot remove {lock_path}: {why(exc)}"))
            else:
                if stale is not None:
                    done.append(Removal(lock_path, "removed", stale, lock=True))
        return _durably(self.where, done)


def _durably(where: str, done: list[Removal]) -> list[Removal]:
    """``done``, once the removals in ``where`` are durable: one fsync of the directory.

    An unlink is undone by a power cut until its directory is fsynced: a
    pruned checkpoint would come back.  If that fsync fails, each removal
    says so instead of "removed".
    """
    if not any(removal.outcome == "removed" for removal in done):
        return done
    try:
        fsync_dir(where)
    except OSError as exc:
        problem = f"removed, but {where} could not be synced ({why(exc)}): it may come back"
        return [
            r._replace(outcome="failed", why=f"{r.path}: {problem}")
            if r.outcome == "removed"
            else r
            for r in done
        ]
    return done


# -- a PostgreSQL store ----------------------------------------------------------

_SCHEMES = ("postgresql://", "postgres://")


def is_dsn(root: str) -> bool:
    """Whether a ROOT argument names a PostgreSQL server rather than a directory."""
    return root.startswith(_SCHEMES)


class PostgresRoot:
    """The keys of a ``PostgresStore`` (snapshot and journal rows alike)."""

    words = Words(
        entry="row",
        unreadable="{n} key(s) cannot be read; `checkpointer verify` says why",
        unreadable_on_stdout=True,
        prune_noun="checkpoint(s)",
        count_hint=False,
    )
    kinds: tuple[str, ...] = ("row",)
    lock_files = False
    mtimes = False
    has_extras = False
    failure: tuple[type[Exception], ...] = (PostgresStoreError,)

    def __init__(self, dsn: str, schema: str) -> None:
        try:
            self.store = PostgresStore(dsn, schema=schema, create_schema=False)
        except (ImportError, ValueError) as exc:  # no psycopg, a bad DSN or schema name
            raise RootError(str(exc)) from None
        self.where = self.store.location("")[:-1]
        # Rows whose key breaks the key rule (put there by SQL, another tool or an
        # older release): listed under the key escaped, unreadable, never touched.
        self._invalid: dict[str, str] = {}

    def close(self) -> None:
        self.store.close()

    def validate_key(self, key: str) -> None:
        pass  # an invalid key is not in the store: show says so

    def scan(self) -> Scan:
        entries = []
        keys: list[str] = self.store.keys()
        for key in keys:
            try:
                check_key(key)
            except ValueError as exc:
                shown = _escaped(key)
                self._invalid[shown] = _escaped(str(exc))
                entries.append(Entry(shown, "row", f"{self.where}/{shown}"))
            else:
                entries.append(Entry(key, "row", self.store.location(key)))
        return Scan(entries, frozenset())

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
        self._check(entry)
        data = self.store.read(entry.key)  # a damaged journal row: CheckpointError
        return 0 if data is None else len(data), None

    def load(self, entry: Entry) -> Loaded | None:
        self._check(entry)
        checkpoint = load(self.store, entry.key)
        return None if checkpoint is None else _loaded(checkpoint)

    def raw(self, entry: Entry) -> bytes | None:
        self._check(entry)
        return self.store.read(entry.key) or b""

    def asides(self) -> list[str]:
        return []

    def planted(self, entry: Entry) -> str | None:
        return None

    def extras(self) -> Extras:
        return Extras([], [])

    def extra(self, entry: Entry) -> Extra | None:
        return None

    def delete(
        self,
        key: str,
        old: Sequence[tuple[Entry, str]],
        *,
        recheck: Recheck,
        stale: str | None,
    ) -> list[Removal]:
        if key in self._invalid:
            return [Removal(e.path, "kept", "a key no writer can use") for e, _ in old]
        # Held while deleting, so no writer starts on the key midway.
        holder = self.store.acquire(key)
        if holder is not None:
            return [Removal(e.path, "kept", f"its lock holder is alive ({holder})") for e, _ in old]
        done: list[Removal] = []
        try:
            for entry, reason in old:
                kept = recheck(entry)
                if kept is not None:
                    done.append(Removal(entry.path, "kept", kept))
                    continue
                self.store.delete(key)
                done.append(Removal(entry.path, "removed", reason))
        finally:
            self.store.release(key)
        return done


def _escaped(text: str) -> str:
    """``text`` with every character that is not printable escaped (as Python writes it)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def open_root(root: str, *, dsn: str | None, schema: str) -> Root:
    """The root ROOT (or ``--dsn``) names.  Raises RootError: it cannot be used."""
    if dsn is not None or is_dsn(root):
        return PostgresRoot(root, schema)
    return DirectoryRoot(root)


def schema_sql(schema: str) -> str:
    """The SQL ``pg-schema`` runs (``pg-schema --sql``)."""
    from checkpointer._stores.postgres.schema import schema_sql as sql

    return sql(schema)
