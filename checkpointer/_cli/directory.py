"""A store directory as a ``Root``: checkpoint files, lock files, summaries
(``sessions/<key>/checkpoint.md``) and corrupt files (``<key>.corrupt-<UTC time>``).  Below
the root nothing is reached through a link, so nothing planted leads outside it.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from checkpointer import Checkpoint, CheckpointError, FileStore, JournalStore
from checkpointer._stores.atomic import fsync_dir, fsync_fd
from checkpointer._stores.base import KEY_PATTERN
from checkpointer._stores.files import _MARK
from checkpointer._stores.flock import probe_file_lock
from checkpointer._stores.safefs import UnsafeFile, describe, open_dir, open_subdir, read_checked
from checkpointer._stores.sealing import DecryptionError, Encryption
from checkpointer.stores import KeyLocked
from checkpointer.summaries import load_summary

from .roots import (
    ASIDE,
    EPOCH,
    FOREIGN,
    Entry,
    Extra,
    Extras,
    LockView,
    Recheck,
    Removal,
    Root,
    RootError,
    each,
    why,
)

LOCK_SUFFIX, SESSIONS, SUMMARY = ".lock", "sessions", "checkpoint.md"
_SUMMARY_TEMP = re.compile(r"\.checkpoint\.md\..+\.tmp")  # a write_summary that died


class DirectoryRoot(Root):
    noun = "file"
    unreadable = "{n} file(s) cannot be read; `checkpointer verify {where}` says why"
    prune_noun = "file(s)"
    lock_files = has_extras = True

    def __init__(self, root: str, encryption: Encryption | None = None) -> None:
        self.where, self.encryption = root, encryption
        try:
            self.stores = {
                "snapshot": FileStore(root, encryption=encryption),
                "journal": JournalStore(root, encryption=encryption),
            }
        except ValueError as exc:  # an empty path
            raise RootError(str(exc)) from None

    def scan(self) -> list[Entry]:
        root = self.where
        if not os.path.exists(root):
            raise RootError(f"no such directory: {root} (a writer creates it on its first write)")
        if not os.path.isdir(root):
            raise RootError(f"not a directory: {root}; give the directory a FileStore writes to")
        try:
            names = sorted(os.listdir(root))
        except OSError as exc:
            raise RootError(f"cannot list {root}: {why(exc)}") from None
        kinds = {store.suffix: kind for kind, store in self.stores.items()}
        named = [(k, s) for k, s in map(os.path.splitext, names) if KEY_PATTERN.fullmatch(k)]
        self.lock_keys = frozenset(key for key, suffix in named if suffix == LOCK_SUFFIX)
        return [Entry(k, kinds[s], os.path.join(root, k + s)) for k, s in named if s in kinds]

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

    def load(self, entry: Entry) -> Checkpoint[Any] | None:
        try:
            return super().load(entry)
        except DecryptionError:
            raise  # its own line before a sealed record: said as such
        except CheckpointError:
            # FileStore's own first line before bytes a wrapper of the user's made (compressed,
            # encrypted): not damage; the CLI does not have the wrapper to read them with.
            if entry.kind == "snapshot" and _wrapped(entry.path):
                raise CheckpointError(entry.path, FOREIGN) from None
            raise

    def measure(self, entry: Entry) -> tuple[int, datetime | None]:
        try:
            st = os.lstat(entry.path)  # a planted link's own size and time, never its target's
        except OSError:
            return 0, EPOCH
        return st.st_size, datetime.fromtimestamp(st.st_mtime, UTC)

    def asides(self) -> list[str]:
        try:
            names = sorted(os.listdir(self.where))
        except OSError:
            return []
        return [os.path.join(self.where, name) for name in names if ASIDE.search(name)]

    def planted(self, entry: Entry) -> str | None:
        try:
            return _unsafe(entry.path, os.lstat(entry.path))
        except OSError:
            return None  # gone: nothing to remove

    def extras(self) -> Extras:
        asides = ((ASIDE.sub("", os.path.basename(p)), p) for p in self.asides())
        entries = [Entry(key, "corrupt", p) for key, p in asides if KEY_PATTERN.fullmatch(key)]
        problems: list[str] = []
        sessions = os.path.join(self.where, SESSIONS)
        keys: list[str] = []
        try:
            with self._summary_dir() as (fd, _):
                keys = [name for name in sorted(os.listdir(fd)) if KEY_PATTERN.fullmatch(name)]
        except FileNotFoundError:
            pass
        except UnsafeFile as exc:  # `sessions` planted: none of its summaries looked at
            problems = [str(exc)]
        except OSError as exc:
            problems = [f"cannot list {sessions}: {why(exc)}"]
        entries += (Entry(key, "summary", os.path.join(sessions, key, SUMMARY)) for key in keys)
        return Extras([e for e in map(self.extra, entries) if e is not None], problems)

    def extra(self, entry: Entry) -> Extra | None:
        if entry.kind == "corrupt":
            return _corrupt(entry)
        try:
            with self._summary_dir(entry.key) as (_, fd):
                st = _summary_stat(fd, entry.path)
        except FileNotFoundError:
            return None  # no summary (an empty directory): nothing to show or remove
        except UnsafeFile as exc:
            return Extra(entry, 0, EPOCH, str(exc))
        except OSError as exc:
            return Extra(entry, 0, EPOCH, unreadable=f"cannot be read: {why(exc)}")
        try:
            summary = load_summary(self.where, entry.key)
        except CheckpointError as exc:
            mtime = datetime.fromtimestamp(st.st_mtime, UTC)
            return Extra(entry, st.st_size, mtime, unreadable=exc.reason)
        if summary is None:
            return None
        created = summary.created_at
        return Extra(entry, st.st_size, created.replace(tzinfo=created.tzinfo or UTC))

    def delete(
        self, key: str, old: Sequence[tuple[Entry, str]], *, recheck: Recheck, stale: str | None
    ) -> list[Removal]:
        # The writer lock keeps a writer from starting on the key midway; its release
        # unlinks the lock file (a writer waiting on the old file notices, starts over).
        lock_path = self._lock_path(key)
        try:
            held = self.stores["snapshot"].lock(key)
        except KeyLocked:  # a writer took the key since the probe
            return [Removal(e.path, "kept", "its lock holder is alive") for e, _ in old]
        except OSError as exc:
            return [Removal(lock_path, "failed", f"cannot lock {lock_path}: {why(exc)}")]
        done: list[Removal] = []
        try:
            there = [(entry, reason) for entry, reason in old if os.path.lexists(entry.path)]
            done += each(there, recheck, self._remove)
        finally:
            try:
                held.release()
            except OSError as exc:
                done.append(Removal(lock_path, "failed", f"cannot remove {lock_path}: {why(exc)}"))
            else:
                if stale is not None:
                    done.append(Removal(lock_path, "removed", stale, lock=True))
        return self._durably(done)

    def _remove(self, entry: Entry, reason: str) -> Removal | None:
        try:
            if entry.kind == "summary":
                return self._remove_summary(entry, reason)
            os.unlink(entry.path)
        except FileNotFoundError:
            return Removal(entry.path, "kept", "gone already") if entry.kind == "summary" else None
        except OSError as exc:
            return Removal(entry.path, "failed", f"cannot remove {entry.path}: {why(exc)}")
        return Removal(entry.path, "removed", reason)

    def _durably(self, done: list[Removal]) -> list[Removal]:
        """``done``, its unlinks made durable (a power cut undoes them until then), or failed."""
        if not any(removal.outcome == "removed" for removal in done):
            return done
        try:
            fsync_dir(self.where, fsync_fd)
        except OSError as exc:
            problem = (
                f"removed, but {self.where} could not be synced ({why(exc)}): it may come back"
            )
            return [
                r._replace(outcome="failed", why=f"{r.path}: {problem}")
                if r.outcome == "removed"
                else r
                for r in done
            ]
        return done

    def _remove_summary(self, entry: Entry, reason: str) -> Removal:
        """Remove a summary (unless its key has a checkpoint again), a dead write's temp file,
        and its directory if that is empty; nothing planted is followed or removed."""
        if any(os.path.lexists(store.location(entry.key)) for store in self.stores.values()):
            return Removal(entry.path, "kept", "its key has a checkpoint again")
        with self._summary_dir(entry.key) as (sessions, fd):
            _summary_stat(fd, entry.path)
            os.unlink(SUMMARY, dir_fd=fd)
            for name in os.listdir(fd):
                if _SUMMARY_TEMP.fullmatch(name):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name, dir_fd=fd)
            fsync_fd(fd)
            try:
                os.rmdir(entry.key, dir_fd=sessions)  # a link swapped in: ENOTDIR, left
            except OSError:
                stays = f"{os.path.dirname(entry.path)} holds other files, so it stays"
                return Removal(entry.path, "removed", f"{reason}; {stays}")
            fsync_fd(sessions)
        return Removal(entry.path, "removed", reason)

    @contextlib.contextmanager
    def _summary_dir(self, key: str = "") -> Iterator[tuple[int, int]]:
        """Descriptors of ``sessions/`` and ``sessions/<key>/`` (-1 without ``key``)."""
        with contextlib.ExitStack() as stack:
            top = open_dir(self.where)
            try:
                sessions = open_subdir(top, SESSIONS, os.path.join(self.where, SESSIONS))
            finally:
                os.close(top)
            stack.callback(os.close, sessions)
            fd = open_subdir(sessions, key, os.path.join(self.where, SESSIONS, key)) if key else -1
            if key:
                stack.callback(os.close, fd)
            yield sessions, fd


def _summary_stat(fd: int, path: str) -> os.stat_result:
    """The ``checkpoint.md`` in the directory ``fd``, not followed; UnsafeFile: not a file."""
    st = os.stat(SUMMARY, dir_fd=fd, follow_symlinks=False)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFile(path, describe(st, path, fd))
    return st


def _corrupt(entry: Entry) -> Extra | None:
    """A corrupt file moved aside: its size, and when it was moved aside or touched since."""
    try:
        st = os.lstat(entry.path)
    except OSError:
        return None
    # The later of the two: a rename keeps the file's old mtime.
    time = max(_moved_aside(entry.path), datetime.fromtimestamp(st.st_mtime, UTC))
    problem = _unsafe(entry.path, st)
    return Extra(entry, 0 if problem else st.st_size, time, problem)


def _wrapped(path: str) -> bool:
    """Whether the file at ``path`` starts with ``FileStore``'s line before a wrapper's bytes."""
    try:
        return (read_checked(path, limit=len(_MARK)) or b"") == _MARK
    except OSError:  # UnsafeFile too: the error load() raised stands
        return False


def _unsafe(path: str, st: os.stat_result) -> str | None:
    """Why a file met (not followed) is not ours to touch: not a regular file; or None."""
    return None if stat.S_ISREG(st.st_mode) else str(UnsafeFile(path, describe(st, path)))


def _moved_aside(path: str) -> datetime:
    """When a writer moved ``path`` aside, from the UTC time in its name."""
    match = ASIDE.search(path)
    try:
        return datetime.strptime(match[1], "%Y%m%dT%H%M%S").replace(tzinfo=UTC) if match else EPOCH
    except ValueError:  # a stamp outside the calendar: a name the library never gives
        return EPOCH
