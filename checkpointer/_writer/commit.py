"""The commit core of a writer: one write, synchronously, from snapshot to store.

How a write flows (one write at a time; the service, ``service.py``, says
when, and on which thread):

1. ``prepare``, on the caller's thread (the event loop for the async path):
   ``source()`` is called, the key is checked, the caller's fingerprint
   compared, the prepare step run (``session.py``), and the store stages the
   state (``_stores/envelopes.py``; a journal encodes only what is new).
   msgspec holds the GIL while it encodes, so doing this in a worker thread
   would not spare the loop.
2. ``execute``, in one worker-thread hop (the final write of ``aclose``: a
   thread of its own) or directly for ``flush_sync``: under the I/O lock the
   key's lock is taken and the checkpoint to expect learnt (``keylocks.py``,
   ``keystate.py``), the job skipped if the store holds it already
   (generation, content, live and pinned flags), the meta built, and the
   store commits the staged state durably if it holds the revision
   expected (``StaleWrite`` otherwise: a conflict).

Every job carries a generation number taken before ``source()`` runs; the
I/O lock and a per-key "newest generation on disk" make sure an older
snapshot never replaces a newer one, whichever thread writes it (a signal
handler's flush can overtake a write in a worker thread: ``_overtaking``).
A job counts as in flight (``inflight``) from its snapshot until its thread
has really ended it (``end``), even if the task that waited for it was
cancelled: only then may a later write be skipped as unchanged against what
the writer believes is on disk.

Forward only: the core never calls the service.  It returns results, and
keeps the counters the service reports (``account``).

(Past 500 lines on purpose: this is one concern, the life of one write from
snapshot to store, and its steps read best in the order they run.)
"""

from __future__ import annotations

import enum
import itertools
import logging
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any, final

from .. import _exit
from .._stores.base import KeyLocked, Staged, StaleWrite, Store, commit_deadline, new_revision
from .._stores.encoding import Transcript
from .._stores.envelopes import state_store
from .._text import describe_error
from .._transcript.fingerprint import transcript_fingerprint
from .._transcript.prepare import transcript_prepare
from .._values import Failed, Meta, NewerVersionError, Prepared, Result, Skipped, Snapshot, Written
from .._version import VERSION
from .keylocks import KeyLocks
from .keystate import Keys, KeyState, Unknown, utcnow
from .session import Prepare, run_prepare, writer_info

__all__ = ["REFUSED", "Committer", "Job", "Phase"]

logger = logging.getLogger("checkpointer")

_NO_FINGERPRINT: Any = object()

REFUSED = frozenset({"conflict", "newer-version", "not-sendable"})
"""Failures no retry can fix until the session changes: not retried (``Outcome.REFUSED``)."""


class Phase(enum.IntEnum):
    """A writer's lifecycle, in order: each phase is entered once, from the one before.

    ``NEW`` -> ``OPEN`` (``open``, ``async with``) -> ``CLOSING`` (a close
    claimed: live writes are ``Skipped("closed")`` from here) -> ``CLOSED``
    (the final write ended).  A writer whose open failed goes from ``OPEN``
    to ``CLOSED``.
    """

    NEW = 0
    OPEN = 1
    CLOSING = 2
    CLOSED = 3


@final
class Job:
    """One write, prepared on the caller's thread, to be executed by the writing thread."""

    __slots__ = (
        "claim",
        "content",
        "force",
        "gen",
        "key",
        "live",
        "prepared",
        "staged",
        "started",
    )

    def __init__(
        self,
        *,
        gen: int,
        key: str,
        staged: Staged,
        content: object,
        live: bool,
        force: bool,
        started: float,
        prepared: Prepared,
    ) -> None:
        self.prepared = prepared
        self.gen = gen
        self.key = key
        self.staged = staged
        self.content = content
        self.live = live
        self.force = force
        self.started = started
        # Taken by the thread that runs the job, or by a cancelled waiter
        # before any thread began it: whoever takes it first decides.
        self.claim = threading.Lock()


@final
class Committer:
    """The synchronous core of a ``CheckpointWriter``: prepares and executes its writes.

    Owned by the writer service, which decides when a write runs and on
    which thread; everything here is thread-safe as the module docstring
    says.  ``phase`` is the writer's lifecycle (``Phase``), moved on by the
    service and read here under the snapshot lock; ``busy`` holds the
    threads inside ``prepare`` or the I/O lock, for the exit hooks.

    Args:
        source: the writer's ``source``.
        store: its store.
        transcript: its ``transcript``: where the messages are, and from
            that the fingerprint, the prepare step and the message cache.
        state_version: its ``state_version``.
        lock_timeout: its ``Limits.lock_timeout``, in seconds.
        resume_from: the meta its session was loaded from, None (its key
            was absent), or ``UNKNOWN``.

    Raises:
        TypeError: the store cannot refuse a stale write (``state_store``).
    """

    def __init__(
        self,
        source: Callable[[], Snapshot | None],
        store: Store,
        *,
        transcript: Transcript | None,
        state_version: int,
        lock_timeout: float,
        resume_from: Meta | Unknown | None,
    ) -> None:
        self._source = source
        self._store = store
        self._transcript = transcript
        self._states = state_store(store, transcript)
        self._fingerprint: Callable[[Snapshot], Hashable] | None = None
        self._prepare_step: Prepare | None = None
        if transcript is not None:
            field = transcript.field
            if transcript.fingerprint:
                self._fingerprint = transcript_fingerprint(field=field)
            if transcript.repair:
                self._prepare_step = transcript_prepare(field=field)
        self._state_version = state_version
        self._locks = KeyLocks(store, lock_timeout)
        self.keys = Keys(store, self._states, state_version, resume_from)
        self._gen = itertools.count()
        self._valid_key: object = None  # the last key validate_key() accepted
        self._io_lock = threading.Lock()
        self._snapshot_lock = threading.Lock()  # generation + source() + encode
        self.busy: set[int] = set()  # threads inside prepare() or _io(), see _exit
        # Threads executing a final write (live=False: close, exit, signal),
        # whose failure note_final logs at ERROR: account() does not warn too.
        self._final: set[int] = set()
        # Generations of jobs prepared and not yet ended, on any thread; an
        # abandoned worker write stays here until it has really ended.
        self.inflight: set[int] = set()
        # key -> (generation, meta, staged state) of an exit flush that wrote
        # without the I/O lock because a worker's write hung past exit_timeout
        # (see execute).
        self._overtaking: dict[str, tuple[int, Meta, Staged]] = {}
        self.phase = Phase.NEW
        # The counters of statistics().
        self.writes = 0
        self.skipped = 0
        self.failures = 0
        self.streak = 0
        self.bytes_written = 0
        self.last_seconds: float | None = None
        self.repaired = 0
        self.settled = 0
        self.last_result: Result | None = None
        self.last_failure: Failed | None = None

    # -- on the caller's thread -------------------------------------------------

    def prepare(self, *, force: bool, pin: bool | None, live: bool) -> Job | Skipped | Failed:
        """Snapshot, check and encode, on the caller's thread.

        The generation, ``source()`` and the encoding happen under one lock,
        so generations order the states as they were encoded: two threads
        flushing at once cannot give the older state the newer generation.
        A signal landing while this thread holds the lock is deferred (see
        ``_exit``) rather than deadlock on it.  (A forked child's copy of a
        writer never gets here: the service checks first.)
        """
        me = threading.get_ident()
        self.busy.add(me)
        try:
            with self._snapshot_lock:
                return self._prepare_locked(force=force, pin=pin, live=live)
        finally:
            self.busy.discard(me)
            _exit.run_deferred()

    def _prepare_locked(
        self, *, force: bool, pin: bool | None, live: bool
    ) -> Job | Skipped | Failed:
        if live and self.phase >= Phase.CLOSING:
            # Under the snapshot lock: a write that began before the close has
            # an older generation than the final write, so it cannot follow it.
            return Skipped("closed")
        gen = next(self._gen)
        started = time.perf_counter()
        snapshot = self._snapshot(live)
        if not isinstance(snapshot, Snapshot):
            return snapshot
        key = snapshot.key
        state = self.keys.select(key)
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
            staged = self._states.stage(key, prepared.snapshot.state, self._transcript)
        except Exception as exc:
            return Failed(
                "encode-failed",
                f"the state of key {key!r} cannot be encoded: {describe_error(exc)}",
            )
        job = Job(
            gen=gen,
            key=key,
            staged=staged,
            content=content,
            live=live,
            force=force,
            started=started,
            prepared=prepared,
        )
        self.inflight.add(gen)  # until it ends: no skip before encoding meanwhile
        return job

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
        key = snapshot.key
        if key != self._valid_key:  # a session keeps its key: checked once, not per write
            try:
                self._store.validate_key(key)
            except (ValueError, TypeError) as exc:
                return Failed("invalid-key", describe_error(exc))
            self._valid_key = key
        return snapshot

    def _content(self, snapshot: Snapshot) -> object:
        """What "unchanged" compares before encoding: the fingerprints, or ``_NO_FINGERPRINT``.

        The snapshot's own and the transcript's, both when both are there
        (a revision counter in the snapshot's makes an in-place edit of an
        earlier message, which the transcript's does not see, a write).
        ``Failed`` if one raises or cannot be hashed.
        """
        own = snapshot.fingerprint
        if self._fingerprint is None:
            if own is None:
                return _NO_FINGERPRINT
            content = own
        else:
            try:
                content = self._fingerprint(snapshot)
            except Exception as exc:
                return Failed("snapshot-failed", f"the fingerprint raised {describe_error(exc)}")
            if own is not None:
                content = (content, own)
        try:
            hash(content)
        except Exception as exc:
            why = describe_error(exc)
            return Failed("snapshot-failed", f"the fingerprint is not hashable: {why}")
        return content

    # -- in the writing thread -----------------------------------------------------

    def execute(self, job: Job, timeout: float = -1) -> Result:
        """Write a prepared job; blocking, under the I/O lock.

        Waits up to ``timeout`` seconds (negative: no bound) for a write in
        flight; past it, writes anyway (an exit flush overtaking a worker's
        write stuck on the disk: see ``_overtaking``).  The lock handling is
        written out rather than in context managers: this runs once per
        write, and each layer costs microseconds next to a 1 KiB fsync.
        """
        me = threading.get_ident()
        busy = self.busy
        busy.add(me)
        if not job.live:
            self._final.add(me)
        try:
            with commit_deadline(timeout):
                locked = self._io_lock.acquire(timeout=timeout)
                if not locked:
                    logger.warning(
                        "checkpointer: a write in flight did not finish within %ss; writing anyway",
                        timeout,
                    )
                try:
                    return self._execute_locked(job, locked)
                finally:
                    if locked:
                        self._io_lock.release()
        finally:
            busy.discard(me)
            self._final.discard(me)
            _exit.run_deferred()

    def _execute_locked(self, job: Job, locked: bool) -> Result:
        """The steps of one write: check, build, commit, record."""
        if self.keys.to_finish:
            self.keys.finish(self._locks)
        state = self.keys.by_key[job.key]
        if job.gen < state.newest_gen:
            return self.account(Skipped("unchanged"))  # a newer snapshot is stored
        refused = self._check(job.key, state)
        if refused is not None:
            return self.account(refused)
        content = job.content
        if content is _NO_FINGERPRINT:
            content = job.staged.content()
        parent, turns = job.prepared.snapshot.parent, job.prepared.turns
        if not job.force and state.holds(content, job.live, parent, turns):
            state.newest_gen = job.gen
            return self.account(Skipped("unchanged"))
        result = self._commit(job, state, locked)
        if isinstance(result, tuple):
            meta, nbytes = result
            state.wrote(meta, content, job.gen)
            return self.account(self._written(job, meta, nbytes))
        return self.account(result)

    def _check(self, key: str, state: KeyState) -> Failed | None:
        """Take the key's lock and learn the checkpoint to expect; ``Failed`` if refused."""
        location = self._store.location(key)
        taken = self._locks.acquire(key, location, wait=False)
        if isinstance(taken, Failed):
            if not state.known:  # expect what is stored now, before any wait for the lock
                self.keys.look(key, state)
            if taken.reason == "locked" and self._locks.waits:
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

    def _meta(self, job: Job, state: KeyState) -> Meta:
        """The meta of the write of ``job`` over ``state.base``."""
        base = state.base
        now = utcnow()
        prepared = job.prepared
        return Meta(  # the fields of session_meta(), spelled out: no dict per write
            key=job.key,
            seq=(0 if base is None else base.seq) + 1,
            created_at=now if base is None else base.created_at,
            updated_at=now,
            live=job.live,
            pinned=state.pin if state.pin is not None else base is not None and base.pinned,
            turns=prepared.turns,
            parent=prepared.snapshot.parent,
            writer=writer_info(),
            library_version=VERSION,
            state_version=self._state_version,
            revision=new_revision(),
        )

    def _commit(self, job: Job, state: KeyState, locked: bool) -> tuple[Meta, int] | Result:
        """Commit ``job`` over ``state.base``: the meta and bytes written, or why not.

        A store holding a revision this writer sent without an answer (its
        write landed after all) takes that write as the base, once.  An
        exit flush that overtook a stuck write (``locked`` False) leaves its
        state where that write finds it when it ends.
        """
        key = job.key
        for adopted in (False, True):
            meta = self._meta(job, state)
            overtaken = self._overtaking.get(key)
            if not locked:
                self._overtaking[key] = (job.gen, meta, job.staged)
            elif overtaken is not None and overtaken[0] > job.gen:
                return Skipped("unchanged")  # a newer flush is writing
            state.sent[meta.revision] = meta
            try:
                nbytes = self._states.commit(key, meta, job.staged, expected=state.expected)
            except StaleWrite as exc:
                own = state.sent.get(exc.stored) if exc.stored is not None else None
                if own is None or adopted:
                    return self.keys.conflict(key, state, exc)
                state.base, state.own, state.content = own, True, None
                continue
            except KeyLocked as exc:  # a networked store lost its lock and could not retake it
                return Failed("locked", str(exc))
            except Exception as exc:  # the bytes may have landed: meta stays in sent
                state.content = None
                location = self._store.location(key)
                return Failed("write-failed", f"cannot write {location}: {describe_error(exc)}")
            break
        if locked:
            overtaken = self._overtaking.pop(key, None)
            if overtaken is not None and overtaken[0] > job.gen:
                # The flush overtook us while we wrote: newer bytes go back on top.
                self._rewrite(key, overtaken[1], overtaken[2], expected=meta.revision)
                return Skipped("unchanged")
        return meta, nbytes

    def _written(self, job: Job, meta: Meta, nbytes: int) -> Written:
        self.repaired += job.prepared.repaired
        self.settled += job.prepared.settled
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

    def finish(self, timeout: float = -1) -> None:
        """Mark the keys the source moved away from not live; blocking, under the I/O lock.

        For a final write whose ``source()`` returned None: there is no
        state to write, but the last key's checkpoint must not stay live.
        """
        me = threading.get_ident()
        self.busy.add(me)
        try:
            with commit_deadline(timeout):
                if self._io_lock.acquire(timeout=timeout):
                    try:
                        self.keys.finish(self._locks)
                    finally:
                        self._io_lock.release()
        finally:
            self.busy.discard(me)
            _exit.run_deferred()

    def _rewrite(self, key: str, meta: Meta, staged: Staged, *, expected: str) -> None:
        try:
            self._states.commit(key, meta, staged, expected=expected)
        except StaleWrite as exc:
            if exc.stored == meta.revision:
                return  # the flush landed on top of us after all
            logger.warning("checkpointer: not putting the newer checkpoint back: %s", exc)
        except Exception as exc:
            logger.warning(
                "checkpointer: could not put the newer checkpoint back on %s: %s",
                self._store.location(key),
                describe_error(exc),
            )

    def end(self, job: Job) -> None:
        """``job`` has ended (written, skipped, failed or dropped): it is no longer in flight."""
        self.inflight.discard(job.gen)

    def release_locks(self) -> bool:
        """Let go of every key's lock, unless a write holds the I/O lock (then False)."""
        if self._io_lock.acquire(blocking=False):
            try:
                self._locks.release_all()
            finally:
                self._io_lock.release()
            return True
        return False

    def account(self, result: Result) -> Result:
        """Update the counters and log once per failure streak (every result at DEBUG)."""
        logger.debug("checkpointer: %r", result)
        self.last_result = result
        if isinstance(result, Failed):
            self.last_failure = result
        if isinstance(result, Written):
            self.writes += 1
            self.bytes_written += result.nbytes
            self.last_seconds = result.seconds
            if self.streak:
                logger.info(
                    "checkpointer: writing %s works again after %d failures",
                    result.location,
                    self.streak,
                )
            self.streak = 0
        elif isinstance(result, Skipped):
            self.skipped += 1
            if result.reason == "unchanged":
                self.streak = 0
        else:
            self.failures += 1
            self.streak += 1
            # A conflict is logged by _conflict; a final write (close, exit,
            # signal) by note_final.
            final = self.phase >= Phase.CLOSING or threading.get_ident() in self._final
            if self.streak == 1 and result.reason != "conflict" and not final:
                logger.warning(
                    "checkpointer: checkpoint failed (%s): %s; %s",
                    result.reason,
                    result.error,
                    "waiting for the session to change"
                    if result.reason in REFUSED
                    else "retrying with backoff",
                )
        return result

    def note_final(self, result: Result, when: str) -> Result:
        """The final write's result (``when``: "at close", "at exit", ...): a failure is an error.

        Nothing retries it: the changes since the last checkpoint written are
        not on disk.  Kept for ``statistics()`` like any result.
        """
        if isinstance(result, Skipped) and result.reason == "closed":
            return result  # no final write happened here
        self.last_result = result
        if isinstance(result, Failed):
            self.last_failure = result
            logger.error(
                "checkpointer: the final write %s failed (%s): %s; the store keeps the "
                "checkpoint written before it, without the changes since",
                when,
                result.reason,
                result.error,
            )
        return result
