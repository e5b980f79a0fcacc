"""The commit core of a writer: one write, synchronously, from snapshot to store.

``prepare`` runs on the caller's thread (msgspec holds the GIL while it
encodes, so a worker thread would not spare the event loop): ``source()``,
the fingerprint, the transcript's repair step (``run_prepare``), the store
stages the state.  ``execute`` runs in a worker thread (or the caller's, for
``flush_sync``) under the I/O lock, a function per step: check, build (the
meta), commit (conditional on the base's revision), record.  Every job
carries a generation taken before ``source()`` runs, so an older snapshot
never replaces a newer one, whichever thread writes it; a job is in flight
until its thread has ended it, and only then may a later write be skipped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from typing import Any, final

from .. import _exit
from .._stores.base import KeyLocked, Staged, StaleWrite, Store, commit_deadline, new_revision
from .._stores.encoding import Transcript
from .._stores.envelopes import state_store
from .._text import describe_error
from .._transcript.fingerprint import transcript_fingerprint
from .._transcript.prepare import transcript_prepare
from .._values import (
    CheckpointError,
    Failed,
    Limits,
    Meta,
    NewerVersionError,
    Prepared,
    Result,
    Skipped,
    Snapshot,
    WriterInfo,
    Written,
)
from .._version import VERSION
from .keystate import KeyLocks, Keys, KeyState, Unknown, utcnow
from .record import Record

__all__ = ["Committer", "Job", "Phase", "run_prepare"]

logger = logging.getLogger("checkpointer")

_NO_FINGERPRINT: Any = object()
_HOST = socket.gethostname()


class Phase(enum.IntEnum):
    """A writer's lifecycle, in order (``lifecycle.py``): from ``CLOSING`` on, a close is
    claimed and live writes are ``Skipped("closed")``; ``CLOSED``: its final write ended."""

    NEW = 0
    OPEN = 1
    CLOSING = 2
    CLOSED = 3


@final
@dataclasses.dataclass(slots=True, eq=False)
class Job:
    """One write, prepared on the caller's thread, to be executed by the writing thread."""

    gen: int
    key: str
    staged: Staged
    content: object  # what "unchanged" compares: a fingerprint, or _NO_FINGERPRINT
    live: bool
    force: bool
    started: float
    prepared: Prepared
    # Taken by the thread that runs the job, or by a cancelled waiter before
    # any thread began it: whoever takes it first decides.
    claim: threading.Lock = dataclasses.field(default_factory=threading.Lock)


@final
class Committer:
    """The synchronous core of a ``CheckpointWriter``: prepares and executes its writes.

    ``phase`` is the writer's (``lifecycle.py`` moves it on); ``pid`` the
    process that opened it.  Raises TypeError for a store that cannot refuse
    a stale write (``state_store``).
    """

    def __init__(
        self,
        source: Callable[[], Snapshot | None],
        store: Store,
        transcript: Transcript | None,
        state_version: int,
        limits: Limits,
        resume_from: Meta | Unknown | None,
        *,
        retried: bool = True,
    ) -> None:
        self._source = source
        self._store = store
        self._transcript = transcript
        self._states = state_store(store, transcript)
        self._fingerprint: Callable[[Snapshot], Hashable] | None = None
        self._prepare_step: Callable[[Snapshot], Prepared | Failed] | None = None
        if transcript is not None:
            if transcript.fingerprint:
                self._fingerprint = transcript_fingerprint(field=transcript.field)
            if transcript.repair:
                self._prepare_step = transcript_prepare(field=transcript.field)
        self._state_version = state_version
        self._locks = KeyLocks(store, float(limits.lock_timeout))
        self._exit_timeout = float(limits.exit_timeout)
        self.keys = Keys(store, self._states, state_version, resume_from)
        self._gen = itertools.count()
        self._io_lock = threading.Lock()
        self._snapshot_lock = threading.Lock()  # generation + source() + encode
        self.inflight: set[int] = set()  # generations prepared and not yet ended
        self.phase = Phase.NEW
        self.pid = os.getpid()
        self.record = Record(retried=retried)
        self.detached = False  # kept open by a registry while its store fails: see execute

    def forked(self) -> bool:
        """Whether this is a forked child's copy of a writer its parent opened: such a copy
        never writes (its state is stale) nor releases a lock (it would be the parent's)."""
        return self.pid != os.getpid()

    @contextlib.contextmanager
    def _holding(self, lock: threading.Lock, timeout: float = -1) -> Iterator[bool]:
        """Hold ``lock`` (up to ``timeout``; negative: no bound); yield whether it was taken.
        ``_exit.busy``: a signal landing meanwhile waits for the block's end, not deadlocks."""
        with _exit.busy(), commit_deadline(timeout):
            locked = lock.acquire(timeout=timeout)
            try:
                yield locked
            finally:
                if locked:
                    lock.release()

    def prepare(self, *, force: bool, pin: bool | None, live: bool) -> Job | Skipped | Failed:
        """Snapshot, check and encode, on the caller's thread.

        Under one lock, so generations order the states as they were encoded.
        In a forked child's copy of the writer: ``Skipped("closed")``.
        """
        if self.forked():
            return Skipped("closed")
        with self._holding(self._snapshot_lock):
            if live and self.phase >= Phase.CLOSING:
                # Under the snapshot lock: a write that began before the close has
                # an older generation than the final write, so it cannot follow it.
                return Skipped("closed")
            gen = next(self._gen)
            started = time.perf_counter()
            snapshot = self._snapshot(live)
            if not isinstance(snapshot, Snapshot):
                return snapshot
            state = self.keys.select(snapshot.key)
            if pin is not None:
                state.pin = pin
            content = self._content(snapshot)
            if isinstance(content, Failed):
                return content
            if (
                content is not _NO_FINGERPRINT
                and not force
                and not self.inflight
                and not self.keys.to_finish
                # turns come from prepare, not run yet: an equal state has equal turns
                and state.base is not None
                and state.holds(content, live, snapshot.parent, state.base.turns)
            ):
                return Skipped("unchanged")
            prepared = run_prepare(self._prepare_step, snapshot)
            if isinstance(prepared, Failed):
                return prepared
            try:
                staged = self._states.stage(snapshot.key, prepared.snapshot.state, self._transcript)
            except Exception as exc:
                why = f"key {snapshot.key!r} cannot be encoded: {describe_error(exc)}"
                return Failed("encode-failed", f"the state of {why}")
            self.inflight.add(gen)  # until it ends: no skip before encoding meanwhile
            return Job(gen, snapshot.key, staged, content, live, force, started, prepared)

    def _snapshot(self, live: bool) -> Snapshot | Skipped | Failed:
        """``source()``, checked: a snapshot with a valid key, or why there is none."""
        try:
            snapshot = self._source()
        except Exception as exc:
            return Failed("snapshot-failed", f"source() raised {describe_error(exc)}")
        if snapshot is None:
            if not live and self.keys.current is not None:
                # The session ended before the close (or the exit): its last
                # key is finished as a key the source moved away from is.
                self.keys.to_finish.add(self.keys.current)
            return Skipped("no-identity")
        if not isinstance(snapshot, Snapshot):
            return Failed(
                "snapshot-failed",
                f"source() returned {type(snapshot).__name__}, "
                "expected Snapshot(key, state) or None",
            )
        try:
            self._store.validate_key(snapshot.key)
        except (ValueError, TypeError) as exc:
            return Failed("invalid-key", describe_error(exc))
        return snapshot

    def _content(self, snapshot: Snapshot) -> object:
        """What "unchanged" compares before encoding: the fingerprints, or ``_NO_FINGERPRINT``.

        Both when both are there: a revision counter in the snapshot's makes
        an in-place edit, which the transcript's does not see, a write.
        """
        content = snapshot.fingerprint
        if self._fingerprint is not None:
            try:
                content = (self._fingerprint(snapshot), content)
            except Exception as exc:
                return Failed("snapshot-failed", f"the fingerprint raised {describe_error(exc)}")
        elif content is None:
            return _NO_FINGERPRINT
        try:
            hash(content)
        except Exception as exc:
            why = describe_error(exc)
            return Failed("snapshot-failed", f"the fingerprint is not hashable: {why}")
        return content

    def execute(self, job: Job, timeout: float = -1) -> Result:
        """Write a prepared job under the I/O lock, waited for up to ``timeout`` seconds; past
        it, writes anyway: an exit flush must not wait forever for a write stuck on the disk
        (``KeyState.overtaking``)."""
        with self._holding(self._io_lock, timeout) as locked:
            if not locked:
                logger.warning("checkpointer: a write outlasted %ss; writing anyway", timeout)
            result = self._execute_locked(job, locked)
            if self.detached:  # no lock held between its tries (nor a descriptor) till one lands
                self.detached = not isinstance(result, Written)
                if self.detached:
                    self._locks.release(job.key)
            # A live write that fails while closing is followed by the final write.
            return self.record.account(result, quiet=not job.live or self.phase >= Phase.CLOSING)

    def _execute_locked(self, job: Job, locked: bool) -> Result:
        """The steps of one write: check, build and commit, record."""
        self.keys.finish(self._locks)
        state = self.keys.by_key[job.key]
        if job.gen < state.newest_gen:
            return Skipped("unchanged")  # a newer snapshot is stored
        refused = self._check(job.key, state)
        if refused is not None:
            return refused
        content = job.staged.content() if job.content is _NO_FINGERPRINT else job.content
        if not job.force and state.holds(
            content, job.live, job.prepared.snapshot.parent, job.prepared.turns
        ):
            state.newest_gen = job.gen
            return Skipped("unchanged")
        written = self._commit(job, state, locked)
        if not isinstance(written, tuple):
            return written
        meta, nbytes = written
        state.wrote(meta, content, job.gen)
        return Written(
            key=job.key,
            location=self._store.location(job.key),
            nbytes=nbytes,
            seconds=time.perf_counter() - job.started,
            seq=meta.seq,
            repaired=job.prepared.repaired,
            settled=job.prepared.settled,
            revision=meta.revision,
        )

    def _check(self, key: str, state: KeyState) -> Failed | None:
        """Take the key's lock and learn the checkpoint to expect; ``Failed`` if refused."""
        location = self._store.location(key)
        taken = self._locks.acquire(key, location, wait=False)
        if isinstance(taken, Failed):
            if not state.known:  # expect what is stored now, before any wait for the lock
                self.keys.look(key, state)
            if taken.reason == "locked":
                taken = self._locks.acquire(key, location)  # up to lock_timeout
            if isinstance(taken, Failed):
                return taken
        try:
            self.keys.resolve(key, state)
        except NewerVersionError as exc:  # kept, and the key left to the newer version
            self._locks.release(key)
            state.base, state.known = None, False  # not this writer's base: it never wrote
            return Failed("newer-version", f"not writing {key!r}: {exc}")
        except Exception as exc:
            return Failed("write-failed", f"cannot read {location}: {describe_error(exc)}")
        return None

    def _meta(self, job: Job, state: KeyState, base: Meta | None) -> Meta:
        """The meta of the write of ``job`` over ``base``."""
        now = utcnow()
        return Meta(
            key=job.key,
            seq=(0 if base is None else base.seq) + 1,
            created_at=now if base is None else base.created_at,
            updated_at=now,
            live=job.live,
            pinned=state.pin if state.pin is not None else base is not None and base.pinned,
            turns=job.prepared.turns,
            parent=job.prepared.snapshot.parent,
            writer=WriterInfo(pid=os.getpid(), host=_HOST),
            library_version=VERSION,
            state_version=self._state_version,
            revision=new_revision(),
        )

    def _commit(self, job: Job, state: KeyState, locked: bool) -> tuple[Meta, int] | Result:
        """Commit ``job`` over ``state.base``: the meta and bytes written, or why not.

        A store holding a revision this writer sent without an answer (that
        write landed after all) takes it as the base, once.  An exit flush
        that could not take the I/O lock (``locked`` False) writes past a
        write stuck in a worker thread; the store refuses that write if it
        was still before its check, and if it was past it (in the disk
        write) it puts the flush's newer state back when it lands.
        """
        key = job.key

        def overtaken() -> bool:
            return locked and state.overtaking is not None and state.overtaking[0] > job.gen

        for adopted in (False, True):
            base = state.base
            meta = self._meta(job, state, base)
            if not locked:
                state.overtaking = (job.gen, meta, job.staged)
            if overtaken():
                return Skipped("unchanged")  # a newer flush is writing
            state.sent[meta.revision] = meta
            expected = None if base is None else base.revision
            try:
                nbytes = self._states.commit(key, meta, job.staged, expected=expected)
            except StaleWrite as exc:
                if overtaken():
                    return Skipped("unchanged")  # the newer flush landed first
                own = state.sent.get(exc.stored) if exc.stored is not None else None
                if own is None and base is None and not adopted and self._unreadable(key):
                    continue  # expecting none, it found one nobody can load: set aside
                if own is None or adopted:
                    return self.keys.conflict(key, state, exc)
                state.base, state.own, state.content = own, True, None
                continue
            except KeyLocked as exc:  # a networked store lost its lock and could not retake it
                return Failed("locked", str(exc))
            except Exception as exc:  # the bytes may have landed: meta stays in sent
                state.content = None
                location = self._store.location(key)
                if base is None and not adopted and isinstance(exc, CheckpointError):
                    # Expecting none, it found one nobody can read: as a first read does.
                    with contextlib.suppress(Exception):
                        self.keys.set_aside(key, exc)
                        continue
                return Failed("write-failed", f"cannot write {location}: {describe_error(exc)}")
            break
        if locked and state.overtaking is not None:
            flush, state.overtaking = state.overtaking, None
            if flush[0] > job.gen:  # the flush landed under this write: put it back on top
                self._rewrite(key, flush[1], flush[2], expected=meta.revision)
                return Skipped("unchanged")
        return meta, nbytes

    def _unreadable(self, key: str) -> bool:
        """Whether ``key`` holds a checkpoint no one can load (its meta may read well: a
        torn state); if so it is moved aside, kept, as a first read does."""
        try:
            self._states.read_checkpoint(key)
        except CheckpointError as exc:
            if isinstance(exc.__cause__, OSError):
                return False  # not read (an outage, a busy key): not known to be damaged
            with contextlib.suppress(Exception):
                self.keys.set_aside(key, exc)  # a newer version's is kept: raised, suppressed
                return True
        except Exception:
            pass  # the store did not answer: the conflict stands, the next write looks again
        return False

    def _rewrite(self, key: str, meta: Meta, staged: Staged, *, expected: str) -> None:
        try:
            self._states.commit(key, meta, staged, expected=expected)
        except StaleWrite as exc:
            if exc.stored != meta.revision:  # else the flush landed on top after all
                logger.warning("checkpointer: not putting the newer checkpoint back: %s", exc)
        except Exception as exc:
            logger.warning(
                "checkpointer: could not put the newer checkpoint back on %s: %s",
                self._store.location(key),
                describe_error(exc),
            )

    def finish(self, timeout: float = -1) -> None:
        """Mark the keys the source moved away from (or ended at) not live (not in a fork)."""
        if self.forked():
            return
        with self._holding(self._io_lock, timeout) as locked:
            if locked:
                self.keys.finish(self._locks)

    def flush(self, *, live: bool) -> Result:
        """One write on the caller's thread, start to end (``flush_sync``, ``close``, exit)."""
        if _exit.busy_here():
            # Re-entered from a signal handler on the thread that is writing:
            # the flush that follows that write (see _exit) covers this call.
            return Skipped("unchanged")
        job = self.prepare(force=False, pin=None, live=live)
        if isinstance(job, Job):
            try:
                return self.execute(job, self._exit_timeout)
            finally:
                self.end(job)
        if not live and self.keys.to_finish:
            self.finish(self._exit_timeout)  # source() had no session
        return self.record.account(job, quiet=not live)

    def run(self, job: Job) -> Result:
        """In the writing thread: execute ``job`` unless a cancelled waiter dropped it."""
        if not job.claim.acquire(blocking=False):
            return Skipped("unchanged")  # dropped before it began; nobody waits for it
        try:
            return self.execute(job)
        finally:
            self.end(job)

    def drop(self, job: Job) -> None:
        """A cancelled waiter's: ``job`` never runs if no thread has begun it."""
        if job.claim.acquire(blocking=False):
            self.end(job)

    def end(self, job: Job) -> None:
        """``job`` has ended (written, skipped, failed or dropped); after close, the key goes."""
        self.inflight.discard(job.gen)
        if self.phase is Phase.CLOSED:
            self.release_locks()  # the last write to end after close lets the key go

    def release_locks(self) -> bool:
        """Let go of every key's lock, unless a write holds the I/O lock (then False)."""
        if self.forked():
            return True  # the parent's locks: releasing one would release it for the parent
        if not self._io_lock.acquire(blocking=False):
            return False
        try:
            self._locks.release_all()
        finally:
            self._io_lock.release()
        return True


def run_prepare(
    prepare: Callable[[Snapshot], Prepared | Failed] | None, snapshot: Snapshot
) -> Prepared | Failed:
    """Run ``prepare`` (the transcript's repair step) on ``snapshot``; raising is ``Failed``.

    Also refuses, before anything is encoded, a ``parent`` that not every
    store can keep, so a session written to one store can move to any other.
    """
    try:
        prepared = Prepared(snapshot=snapshot) if prepare is None else prepare(snapshot)
    except Exception as exc:
        return Failed("snapshot-failed", f"prepare() raised {describe_error(exc)}")
    if isinstance(prepared, Failed):
        return prepared
    parent = prepared.snapshot.parent
    if parent is None:
        return prepared
    if not isinstance(parent, str):
        why = f"is of type {type(parent).__name__}; give the parent session's key (a str) or None"
    elif "\x00" in parent:
        why = (
            f"contains a NUL character ('\\x00') at index {parent.index(chr(0))}, which "
            "PostgreSQL cannot store (so no store takes it); remove it"
        )
    else:
        try:
            parent.encode("utf-8")
            return prepared
        except UnicodeEncodeError as exc:
            why = (
                f"contains a lone surrogate ({parent[exc.start]!r}) at index {exc.start}, which "
                "is not valid Unicode and cannot be encoded as UTF-8 (so no store takes it); "
                "decode the name with errors='replace', or give another key"
            )
    return Failed("snapshot-failed", f"Snapshot.parent of key {snapshot.key!r} {why}")
