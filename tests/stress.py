"""Stress: the writer against a model of the session, under random operations.

Run it from the repository root::

    python -m tests.stress --runs 40

Each run opens a real ``CheckpointWriter`` (timers of a few milliseconds, on
asyncio or trio, exit hooks on) over a real store in a fresh directory
(``FileStore``, ``FileStore`` written through a ``Transcript``, or ``JournalStore``,
wrapped so that some commits are slow), and plays a seeded random sequence
of what an agent does: appends (dicts and frozen ``ChatMessage`` Structs),
in-place edits of the last and of an earlier message, type-only changes
(``0 -> False``, ``2 -> 2.0`` and back), reverts (the history truncated in
place, or an earlier history restored), a new title or ``Snapshot.parent``,
``notify()``, ``write_now()`` (some cancelled at a random moment, mid-write
or before), ``flush_sync()`` from threads while other writes are in flight,
short sleeps, and at the end ``aclose()`` with ``flush_sync()`` threads
racing it.  The model is the session itself: every change makes a new
version, and its exact JSON encoding is kept.

Checks (each failure is a loss, printed):

* **quiet points** (every few dozen operations, and after close): once the
  writer has nothing pending and no write in flight (the scheduler says
  so, and every job it prepared has finished), the checkpoint on disk is
  exactly the session in memory: the same JSON bytes (so ``0`` and
  ``False`` differ), the same ``parent``, ``pinned`` as last asked, and
  ``live`` true while open, false after close;
* **nothing older replaces something newer**: the versions the store
  commits never go back;
* **"unchanged" is true**: a ``write_now()`` or ``flush_sync()`` that
  returned ``Skipped("unchanged")`` left the disk holding the state it was
  given (or a newer one).

Real processes: in some runs (``--fork-every``) a child is forked at a quiet
point and ends as a child does (SIGTERM, as a pool's ``terminate()`` or a
process group's stop sends it, or its interpreter's exit, atexit): the file
must be exactly as before (nothing of the parent's writer runs there).  In
others (``--second-every``) a second process starts on the same key while
the writer runs, loads it, appends its own message: its writes fail
(``locked``), and after our close they must be ``Failed("conflict")`` and
our file intact.  In others (``--delete-every``) the key is deleted at a
quiet point: first through another store object (as another process would:
refused, ``KeyLocked``, the file intact), then through the writer's own
store: from then on nothing may bring it back (every quiet point finds no
file, the final write is ``Failed("conflict")``).  And every
``--start-every``-th run, two processes open ``STARTS`` new keys at one
moment the way the resuming guide says (``resume_from=load(...)``, None),
three turns each (``tests/children/start_child.py``): for every key, a
process told ``Written`` last finds all its messages stored.

It prints a table per store and backend; the exit status is 1 if anything
was lost.  The suite runs a small seeded version (``tests/reliability/test_stress.py``).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import contextvars
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import msgspec

from checkpointer import (
    CheckpointWriter,
    Failed,
    FileStore,
    JournalStore,
    Limits,
    Meta,
    Result,
    Skipped,
    Snapshot,
    Transcript,
    Written,
    load,
)
from checkpointer._stores.base import KeyLock, LockingStore
from checkpointer.messages import ChatMessage
from checkpointer.stores import KeyLocked, Staged, Store
from tests._support import CHILDREN, HANG_GUARD, ROOT, child_env
from tests._support.harness import TappedStore, file_transcript, s3_store

__all__ = ["GROUPS", "STORES", "Summary", "main", "run", "run_one"]

KEY = "stress"
CHILD = CHILDREN / "conflict_child.py"


class Unlocked:
    """A store of a user's own: a ``FileStore`` without the ``lock()`` capability.

    Nothing keeps a second writer or a delete off a key while a writer is
    live: the conditional write alone keeps what was written.
    """

    def __init__(self, root: str) -> None:
        self._inner = inner = FileStore(root)
        self.validate_key, self.location, self.open = inner.validate_key, inner.location, inner.open
        self.read, self.revision, self.keys = inner.read, inner.revision, inner.keys
        self.delete, self.move_aside = inner.delete, inner.move_aside

    def write(
        self, key: str, chunks: Sequence[bytes], *, revision: str, expected: str | None
    ) -> int:
        return self._inner.write(key, chunks, revision=revision, expected=expected)


class LossyStore(FileStore):
    """A deliberately broken store: every third write reports success and writes nothing.

    Only here to show that the stress notices lost writes (``--store lossy``).
    """

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.calls = 0

    def write(self, key: str, chunks: Sequence[bytes], **kw: Any) -> int:
        self.calls += 1
        if self.calls % 3 == 0 and self.calls > 1:
            return sum(map(len, chunks))
        return super().write(key, chunks, **kw)


STORES: dict[str, Callable[[str], Store]] = {
    "file": FileStore,
    "file-transcript": file_transcript,
    "journal": JournalStore,
    "unlocked": Unlocked,
    "s3": s3_store("s3"),
    "s3journal": s3_store("s3journal"),
}
"""The stores to stress: a new store is one more entry (``s3``, ``s3journal``: moto's
S3 server on 127.0.0.1, started for the run)."""


class BlindStore(Unlocked):
    """A deliberately broken store: its write never refuses (it expects whatever is there).

    Only here to show that the stress notices a deleted key brought back
    (``--store blind``).
    """

    def write(
        self, key: str, chunks: Sequence[bytes], *, revision: str, expected: str | None
    ) -> int:
        return super().write(key, chunks, revision=revision, expected=self.revision(key))


UNSAFE: dict[str, Callable[[str], Store]] = {"lossy": LossyStore, "blind": BlindStore}
"""Stores that lose writes on purpose, to show the checks can fail."""

BASE: tuple[str, ...] = ("append", "append-struct", "edit-last", "edit-earlier", "replace")
BASE += ("revert", "parent", "title", "notify", "write-now", "sleep")
GROUPS: dict[str, tuple[str, ...]] = {
    "base": BASE,
    "types": (*BASE, "type-change"),
    "cancel": (*BASE, "write-now-cancelled", "cancel-undo"),
    "threads": (*BASE, "flush-thread", "edit-flush-in-flight"),
    "close-race": BASE,
    "all": (
        *BASE,
        "type-change",
        "write-now-cancelled",
        "cancel-undo",
        "flush-thread",
        "edit-flush-in-flight",
    ),
}
"""Operation mixes.  ``all`` is everything; the others isolate one kind of
operation each, so a loss points at it (``close-race`` adds threads
flushing while the writer closes)."""

WEIGHTS = {
    "append": 14,
    "append-struct": 4,
    "edit-last": 12,
    "edit-earlier": 6,
    "replace": 3,
    "revert": 3,
    "parent": 3,
    "title": 2,
    "type-change": 10,
    "notify": 14,
    "write-now": 6,
    "write-now-cancelled": 10,
    "flush-thread": 12,
    "edit-flush-in-flight": 8,
    "cancel-undo": 3,
    "sleep": 14,
}

SOURCED: contextvars.ContextVar[int | None] = contextvars.ContextVar("SOURCED", default=None)
"""The version the last ``source()`` call of this task (or thread) returned."""


# -- the model: the session, with its versions --------------------------------------


class Session:
    """The agent's session, mutated in place as an agent does, with every version kept.

    Mutations run on the event loop's thread under ``lock``; ``source()``
    from another thread takes ``lock`` and the store releases it once the
    state is staged (encoded), so a thread's snapshot is never torn.
    """

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.lock = threading.Lock()
        self.state: dict[str, Any] = {"title": "t0", "messages": []}
        self.parent: str | None = None
        self.version = 0
        self.exact = False  # an exact fingerprint in each snapshot
        self.encoded: dict[int, bytes] = {}
        self.newest: dict[bytes, int] = {}  # content -> newest version with it
        self.counter = 0
        self.loop_thread = threading.get_ident()
        self.local = threading.local()
        self._record()

    def _record(self) -> None:
        data = self.content()
        self.encoded[self.version] = data
        self.newest[data] = self.version

    def content(self) -> bytes:
        """What the disk must hold for this version: its state and parent, exactly."""
        return msgspec.json.encode([self.state, self.parent])

    def source(self) -> Snapshot:
        if threading.get_ident() != self.loop_thread:
            self.lock.acquire()
            self.local.held = True
        SOURCED.set(self.version)
        self.local.version = self.version
        exact = msgspec.json.encode([self.state, self.parent]) if self.exact else None
        return Snapshot(KEY, self.state, parent=self.parent, fingerprint=exact)

    def staged(self) -> int:
        """Called by the store once the snapshot is encoded: its version; lets go of the lock."""
        version: int = self.local.version
        self.release()
        return version

    def release(self) -> None:
        if getattr(self.local, "held", False):
            self.local.held = False
            self.lock.release()

    # -- what an agent does -----------------------------------------------------------

    def _message(self) -> dict[str, Any]:
        self.counter += 1
        role = self.rng.choice(["user", "assistant", "tool"])
        return {"role": role, "content": f"m{self.counter}", "n": self.rng.choice([0, 1, 2])}

    def undo_to(self, version: int) -> None:
        """Restore exactly the state and parent of ``version`` (as a new version)."""
        with self.lock:
            self.state, self.parent = msgspec.json.decode(self.encoded[version])
            self.version += 1
            self._record()

    def mutate(self, op: str) -> bool:
        """Apply ``op``; False if it changed nothing (no message to edit, say)."""
        with self.lock:
            changed = self._mutate(op)
            if changed:
                self.version += 1
                self._record()
            return changed

    def _mutate(self, op: str) -> bool:
        rng = self.rng
        messages: list[Any] = self.state["messages"]
        dicts = [i for i, m in enumerate(messages) if isinstance(m, dict)]
        if op == "append":
            messages.append(self._message())
        elif op == "append-struct":
            self.counter += 1
            messages.append(ChatMessage(role="assistant", content=f"s{self.counter}"))
        elif op in ("edit-last", "edit-earlier"):
            if not dicts:
                return False
            at = dicts[-1] if op == "edit-last" else rng.choice(dicts)
            message = messages[at]
            self.counter += 1
            # In place, as streaming does: "draft" grows, then a final answer.
            message["content"] = rng.choice(
                [message["content"] + ".", "draft", f"FINAL ANSWER {self.counter}"]
            )
        elif op == "type-change":
            numbered = [i for i in dicts if "n" in messages[i]]
            if not numbered:
                return False
            message = messages[rng.choice(numbered[-3:] if rng.random() < 0.5 else numbered)]
            n = message["n"]
            # Equal under ==, different in JSON: 0 <-> False, 1 <-> True, 2 <-> 2.0.
            if isinstance(n, bool | float):
                message["n"] = int(n)
            elif n == 2:
                message["n"] = 2.0
            else:
                message["n"] = bool(n)
        elif op == "replace":
            if not messages:
                return False
            messages[rng.randrange(len(messages))] = self._message()
        elif op == "revert":
            dice = rng.random()
            if dice < 0.4 and messages:
                del messages[rng.randrange(len(messages)) :]  # truncated in place
            elif dice < 0.7:  # undo: exactly an earlier version (state and parent)
                old = self.encoded[max(0, self.version - rng.randint(1, 3))]
                self.state, self.parent = msgspec.json.decode(old)
            else:
                old = self.encoded[rng.randrange(self.version + 1)]
                state = msgspec.json.decode(old)[0]
                self.state["messages"] = state["messages"]  # an earlier history restored
        elif op == "parent":
            self.parent = rng.choice([None, "p1", "p2"])
        elif op == "title":
            self.state["title"] = f"t{rng.randrange(4)}"
        else:
            raise ValueError(op)
        return True


# -- the store: slow now and then, and saying what it committed ----------------------


class SlowStore(TappedStore):
    """The ``StateStore`` the writer would use for ``inner``, slow now and then.

    Records the version of each commit that returned, in order; a commit
    sleeps a random moment first (in the worker thread), so writes are in
    flight while the agent goes on.
    """

    def __init__(
        self, inner: Store, session: Session, seed: int, transcript: Transcript | None = None
    ) -> None:
        super().__init__(inner, transcript)
        self.session = session
        self.rng = random.Random(seed)
        self.committed: list[int] = []
        self.mutex = threading.Lock()
        self.slow_next = False  # the next commit takes a while (a disk that stalls)

    def tag(self, state: Any) -> int:
        return self.session.staged()

    def after_commit(self, meta: Meta, tag: int) -> None:
        with self.mutex:
            self.committed.append(tag)

    def commit(self, key: str, meta: Meta, staged: Staged, **kw: Any) -> int:
        with self.mutex:
            dice = self.rng.random()
            stall, self.slow_next = self.slow_next, False
        if stall:
            time.sleep(0.03)
        elif dice < 0.05:
            time.sleep(0.01)
        elif dice < 0.4:
            time.sleep(dice / 100)
        return super().commit(key, meta, staged, **kw)

    def lock(self, key: str, *, timeout: float = 0.0) -> KeyLock:
        if isinstance(self.inner, LockingStore):
            return self.inner.lock(key, timeout=timeout)
        return _NoLock()  # the inner store has no lock: nothing is held


class _NoLock:
    def release(self) -> None:
        pass


class Probe:
    """Follows the writer's jobs: ``running`` counts those executing in a thread.

    ``busy`` is the writer's own count of the jobs prepared and not ended
    (``Committer.inflight``): one abandoned by a cancelled ``write_now`` ends
    in its thread, or when the writer drops it (anyio's asyncio pool skips a
    job whose caller was cancelled before a worker took it).  Never a time:
    on a loaded machine a worker thread may start a second late.
    """

    def __init__(self, writer: CheckpointWriter[Any]) -> None:
        self.lock = threading.Lock()
        self.running = 0
        core = writer._core
        self.inflight = core.inflight
        execute = core.execute

        def counted_execute(job: Any, *args: Any, **kwargs: Any) -> Result:
            with self.lock:
                self.running += 1
            try:
                return execute(job, *args, **kwargs)
            finally:
                with self.lock:
                    self.running -= 1

        core.execute = counted_execute  # type: ignore[method-assign]

    async def wait_running(self, timeout: float) -> None:
        """Wait (at most ``timeout`` seconds) until a job runs in a thread."""
        with anyio.move_on_after(timeout):
            while not self.running:  # noqa: ASYNC110 - set from a worker thread
                await anyio.sleep(0.0002)

    def busy(self) -> bool:
        """Whether a job the writer prepared has not ended (run, skipped or dropped)."""
        return bool(self.inflight)


# -- one run -------------------------------------------------------------------------


@dataclass
class Summary:
    """What runs did and found, per (store, backend)."""

    store: str
    backend: str
    group: str = "all"
    runs: int = 0
    operations: int = 0
    quiet_checks: int = 0
    unchanged_checks: int = 0
    commits: int = 0
    cancelled: int = 0
    forks: int = 0
    seconds_processes: int = 0
    deletes: int = 0
    starts: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    lost_runs: int = 0

    @property
    def losses(self) -> int:
        return len(self.problems)

    def kinds(self) -> dict[str, int]:
        """How many runs lost something of each kind."""
        counts: dict[str, int] = {}
        seen: set[tuple[str, str]] = set()
        for p in self.problems:
            run = p.partition(": ")[0]
            kind = kind_of(p)
            if (run, kind) not in seen:
                seen.add((run, kind))
                counts[kind] = counts.get(kind, 0) + 1
        return counts

    def add(self, other: Summary) -> None:
        for name in ("runs", "operations", "quiet_checks", "unchanged_checks", "commits"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.cancelled += other.cancelled
        self.forks += other.forks
        self.seconds_processes += other.seconds_processes
        self.deletes += other.deletes
        self.starts += other.starts
        self.seconds += other.seconds
        self.problems += other.problems
        self.lost_runs += other.lost_runs


@dataclass(frozen=True)
class Spec:
    """One run: which store, backend, operations, how many, and the seed."""

    store: str
    backend: str
    seed: int
    ops: int = 200
    group: str = "all"
    quiet_every: int = 25
    fork: bool = False
    second: bool = False
    delete: bool = False
    fingerprint: bool | None = None  # an exact fingerprint; None: in half the runs


class _Run:
    def __init__(self, spec: Spec, root: str) -> None:
        self.spec = spec
        self.rng = random.Random(spec.seed)
        self.session = Session(random.Random(self.rng.random()))
        self.inner = {**STORES, **UNSAFE}[spec.store](root)
        cache = Transcript() if spec.store == "file-transcript" else None
        self.store = SlowStore(self.inner, self.session, self.rng.randrange(2**32), cache)
        self.summary = Summary(spec.store, spec.backend, spec.group, runs=1)
        self.problems = self.summary.problems
        self.lock = threading.Lock()
        self.notified = 0  # the newest version covered by a notify, write_now or flush
        self.pinned = False
        self.second: subprocess.Popen[str] | None = None
        self.root = root
        self.deleted_at: int | None = None  # commits when the key was deleted

    def problem(self, text: str) -> None:
        with self.lock:
            self.problems.append(
                f"{self.spec.store}/{self.spec.backend} seed {self.spec.seed}: {text}"
            )

    def covered(self, version: int | None) -> None:
        if version is not None:
            with self.lock:
                self.notified = max(self.notified, version)

    # -- reading the disk ---------------------------------------------------------------

    def disk(self) -> tuple[bytes, Meta] | None:
        cp = load(self.inner, KEY)
        if cp is None:
            return None
        return msgspec.json.encode([cp.state, cp.meta.parent]), cp.meta

    def check_unchanged(self, result: Result, version: int | None, what: str) -> None:
        """A Skipped('unchanged') must leave the disk holding the state it was given, or newer."""
        if not (isinstance(result, Skipped) and result.reason == "unchanged"):
            return
        if self.deleted_at is not None:
            # Without a lock the writer learns of a delete at its next write, which is
            # then a conflict: until then it may skip as unchanged (nothing is written).
            return
        with self.lock:
            self.summary.unchanged_checks += 1
        if version is None:
            self.problem(f"{what} returned Skipped('unchanged') without taking a snapshot")
            return
        disk = self.disk()
        if disk is None:
            self.problem(f"{what} returned Skipped('unchanged') with nothing on disk")
            return
        want = self.session.encoded[version]
        if disk[0] != want and self.session.newest.get(disk[0], -1) <= version:
            self.problem(
                f"{what} returned Skipped('unchanged') for version {version} while the disk "
                f"holds {_short(disk[0])}, not {_short(want)}"
            )

    async def quiet_point(self, writer: CheckpointWriter[Any], probe: Probe, *, live: bool) -> None:
        """Wait until the writer is idle; then the disk must be exactly the session."""
        if self.session.version > self.notified and live:
            writer.notify()  # an agent notifies its changes sooner or later
            self.notified = self.session.version
        deadline = time.monotonic() + HANG_GUARD
        while probe.busy() or (live and writer.statistics().pending):
            if time.monotonic() > deadline:
                self.problem(f"the writer never went idle ({writer.statistics()})")
                return
            await anyio.sleep(0.001)
        self.summary.quiet_checks += 1
        disk = self.disk()
        if self.deleted_at is not None:
            if disk is not None or len(self.store.committed) > self.deleted_at:
                self.problem(f"quiet point: a deleted key came back: {disk}")
            return
        want = self.session.content()
        if disk is None:
            self.problem("quiet point: nothing on disk")
            return
        data, meta = disk
        if data != want:
            stats = writer.statistics()
            self.problem(
                f"quiet point (live={live}): disk {_short(data)} != memory {_short(want)}; "
                f"the disk holds version {self.session.newest.get(data)} of "
                f"{self.session.version}; pending={stats.pending}"
            )
        if meta.live is not live:
            self.problem(f"quiet point: the file says live={meta.live}, expected {live}")
        if meta.pinned is not self.pinned:
            self.problem(f"quiet point: the file says pinned={meta.pinned}, asked {self.pinned}")

    def check_order(self) -> None:
        committed = self.store.committed
        self.summary.commits = len(committed)
        for before, after in itertools.pairwise(committed):
            if after < before:
                self.problem(
                    f"an older snapshot replaced a newer one: version {after} committed "
                    f"after version {before}"
                )
                return

    # -- operations -----------------------------------------------------------------------

    async def write_now(
        self, writer: CheckpointWriter[Any], cancel_after: float | None, probe: Probe
    ) -> None:
        """``write_now()``; cancelled after ``cancel_after`` s, or mid-write if negative."""
        SOURCED.set(None)
        if cancel_after is None:
            result = await writer.write_now()
            self.covered(SOURCED.get())
            self.check_unchanged(result, SOURCED.get(), "write_now()")
            return
        got: list[tuple[Result | None, int | None]] = []
        done = anyio.Event()

        async def write() -> None:
            result: Result | None = None
            try:
                result = await writer.write_now()
            finally:
                got.append((result, SOURCED.get()))
                done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(write)
            if cancel_after < 0:  # mid-write: once a job runs in a thread
                with anyio.move_on_after(HANG_GUARD):
                    while not (probe.running or done.is_set()):  # noqa: ASYNC110
                        await anyio.sleep(0.0002)
            else:
                await anyio.sleep(cancel_after)
            tg.cancel_scope.cancel()
        outcome, version = got[0]
        self.covered(version)  # cancelled or not, the writer owes that state a write
        if outcome is None:
            self.summary.cancelled += 1
        else:
            self.check_unchanged(outcome, version, "write_now()")

    def flush_in_thread(self, writer: CheckpointWriter[Any]) -> None:
        SOURCED.set(None)
        try:
            result = writer.flush_sync()
        finally:
            self.session.release()
        if not (isinstance(result, Skipped) and result.reason == "closed"):
            self.covered(SOURCED.get())
            self.check_unchanged(result, SOURCED.get(), "flush_sync() from a thread")

    async def segment(self, writer: CheckpointWriter[Any], probe: Probe, count: int) -> None:
        names = GROUPS[self.spec.group]
        weights = [WEIGHTS[n] for n in names]
        async with anyio.create_task_group() as tg:
            for _ in range(count):
                op = self.rng.choices(names, weights)[0]
                self.summary.operations += 1
                if op == "notify":
                    self.notified = self.session.version
                    writer.notify()
                elif op == "write-now":
                    tg.start_soon(self.write_now, writer, None, probe)
                elif op == "write-now-cancelled":
                    when = self.rng.choice([-1.0, -1.0, 0.0, 0.001, 0.003])
                    tg.start_soon(self.write_now, writer, when, probe)
                elif op == "cancel-undo":
                    # Saved; one more step, whose write_now is cancelled mid-write; the
                    # agent rolls that step back (to what is on disk) and notifies.
                    await self.write_now(writer, None, probe)
                    before = self.session.version
                    self.session.mutate("append")
                    self.store.slow_next = True
                    await self.write_now(writer, -1.0, probe)
                    self.session.undo_to(before)
                    self.notified = self.session.version
                    writer.notify()
                    await self.quiet_point(writer, probe, live=True)  # before anything hides it
                elif op == "type-change":
                    # Equal under ==, not in JSON: checked at once, before a later
                    # rewrite of the history could hide a change that was never written.
                    if self.session.mutate(op):
                        self.notified = self.session.version
                        writer.notify()
                        await self.quiet_point(writer, probe, live=True)
                elif op == "edit-flush-in-flight":
                    # A new message, a write of it in flight, the message edited in place
                    # (not notified) and a thread's flush_sync meanwhile.
                    await self.write_now(writer, None, probe)  # saved: the next is an append
                    self.session.mutate("append")
                    self.store.slow_next = True
                    writer.notify()
                    self.notified = self.session.version
                    await probe.wait_running(0.05)
                    self.session.mutate("edit-last")
                    tg.start_soon(anyio.to_thread.run_sync, self.flush_in_thread, writer)
                elif op == "flush-thread":
                    tg.start_soon(anyio.to_thread.run_sync, self.flush_in_thread, writer)
                elif op == "sleep":
                    await anyio.sleep(self.rng.choice([0.0, 0.0, 0.0005, 0.002, 0.005]))
                elif self.session.mutate(op) and self.rng.random() < 0.6:
                    self.notified = self.session.version
                    writer.notify()
                if self.rng.random() < 0.3:
                    await anyio.lowlevel.checkpoint()

    # -- real processes -------------------------------------------------------------------

    def fork_child(self) -> None:
        """Fork; the child ends as a pool worker or a program does; the file must not change."""
        before = self.inner.read(KEY)
        how = self.rng.choice(["sigterm", "atexit"])
        pid = os.fork()
        if pid == 0:  # the child: end at once, as it would
            try:
                if how == "sigterm":
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(1.0)  # the handler runs here (if any), then the default kills
                else:
                    atexit._run_exitfuncs()
            finally:
                os._exit(0)
        self.summary.forks += 1
        deadline = time.monotonic() + HANG_GUARD
        while True:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                self.problem(f"a forked child ({how}) hung in the parent's writer")
                break
            time.sleep(0.002)
        after = self.inner.read(KEY)
        if after != before:
            meta = self.disk()
            who = meta[1].writer if meta is not None else None
            self.problem(f"a forked child ({how}) wrote the parent's checkpoint (writer {who})")

    def delete(self) -> None:
        """Delete the key as another process would: refused while our writer holds it.

        A store without a lock lets it: from then on nothing may bring the key back.
        """
        before = self.inner.read(KEY)
        other = {**STORES, **UNSAFE}[self.spec.store](self.root)
        self.summary.deletes += 1
        if not isinstance(self.inner, LockingStore):
            other.delete(KEY)
            self.deleted_at = len(self.store.committed)
            return
        try:
            other.delete(KEY)
        except KeyLocked:
            pass
        else:
            self.problem("a delete went through while our writer held the key")
        if self.inner.read(KEY) != before:
            self.problem("a refused delete changed the file")

    def start_second(self) -> None:
        spec = "journal" if self.spec.store == "journal" else "file"
        env = child_env()
        self.second = subprocess.Popen(
            [sys.executable, str(CHILD), f"{spec}:{self.root}", KEY, "second"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.summary.seconds_processes += 1
        self._tell("go")
        self._hear("loaded")
        opened = self._hear("open")
        if opened is not None and opened["writes"] != 0:
            self.problem(f"a second process wrote the key while we held it: {opened}")

    def _tell(self, line: str) -> None:
        assert self.second is not None and self.second.stdin is not None
        self.second.stdin.write(line + "\n")
        self.second.stdin.flush()

    def _hear(self, step: str) -> dict[str, Any] | None:
        assert self.second is not None and self.second.stdout is not None
        line = self.second.stdout.readline()
        if not line:
            self.problem(f"the second process ended before {step!r}")
            return None
        got: dict[str, Any] = json.loads(line)
        if got.get("step") != step:
            self.problem(f"the second process said {got}, not {step!r}")
            return None
        return got

    def second_tries(self, *, after_close: bool) -> None:
        if self.second is None:
            return
        self._tell(f"append {'late' if after_close else 'early'}")
        got = self.hear_append()
        # After our close, "locked" too is no loss: a close keeps the key locked while
        # a write is still in flight (until the process exits).
        want = ("conflict", "locked") if after_close else ("locked",)
        if got is not None and not (got["result"] == "Failed" and got["reason"] in want):
            self.problem(f"the second process's write was {got}, expected Failed({want[0]!r})")

    def hear_append(self) -> dict[str, Any] | None:
        return self._hear("append")

    def end_second(self) -> None:
        if self.second is None:
            return
        with contextlib.suppress(OSError):
            self._tell("close")
        try:
            self.second.communicate(timeout=HANG_GUARD)
        except subprocess.TimeoutExpired:
            self.second.kill()
            self.second.communicate()

    # -- the run --------------------------------------------------------------------------

    async def main(self) -> None:
        rng = self.rng
        exact = rng.random() < 0.5  # an exact fingerprint: equal means the same state
        if self.spec.fingerprint is not None:
            exact = self.spec.fingerprint
        self.session.exact = exact
        writer = CheckpointWriter(
            self.session.source,
            self.store,
            debounce=rng.choice([0.0, 0.001, 0.003]),
            min_interval=rng.choice([0.0, 0.002]),
            max_wait=rng.choice([0.01, 0.02]),
            limits=Limits(
                retry_initial=0.01,
                retry_max=0.05,
                exit_timeout=HANG_GUARD,
                close_timeout=HANG_GUARD,
            ),
        )
        probe = Probe(writer)
        self.session.loop_thread = threading.get_ident()
        spec = self.spec
        async with writer:
            done = 0
            fork_at = rng.randrange(max(1, spec.ops // spec.quiet_every)) if spec.fork else -1
            points = max(1, spec.ops // spec.quiet_every)
            second_at = rng.randrange(points) if spec.second else -1
            delete_at = rng.randrange(points) if spec.delete else -1
            point = 0
            while done < spec.ops:
                count = min(spec.quiet_every, spec.ops - done)
                await self.segment(writer, probe, count)
                done += count
                await self.quiet_point(writer, probe, live=True)
                if point == fork_at:
                    self.fork_child()
                if point == second_at and isinstance(self.inner, LockingStore):
                    self.start_second()
                    self.second_tries(after_close=False)
                if point == delete_at and self.second is None and self.deleted_at is None:
                    self.delete()
                    await self.quiet_point(writer, probe, live=True)
                if rng.random() < 0.2:  # the pin, asked while nothing else is in flight
                    self.pinned = rng.random() < 0.5
                    await writer.write_now(pin=self.pinned)
                point += 1
            # Close, with threads flushing at the same moment.
            racers = [
                threading.Thread(target=self._race_close, args=(writer, rng.random()))
                for _ in range(rng.randint(1, 3) if spec.group in ("close-race", "all") else 0)
            ]
            for racer in racers:
                racer.start()
            if self.session.mutate("append"):
                self.notified = self.session.version
            final = await writer.aclose()
            for racer in racers:
                racer.join(HANG_GUARD)
            if self.deleted_at is not None:
                if not (isinstance(final, Failed) and final.reason == "conflict"):
                    self.problem(f"the final write of a deleted key was {final}")
            elif not isinstance(final, Written) and final != Skipped("unchanged"):
                self.problem(f"the final write was {final}")
        await self.quiet_point(writer, probe, live=False)
        self.second_tries(after_close=True)
        self.end_second()
        await self.quiet_point(writer, probe, live=False)  # the second process changed nothing
        self.check_order()

    def _race_close(self, writer: CheckpointWriter[Any], delay: float) -> None:
        time.sleep(delay / 500)
        for _ in range(3):
            self.flush_in_thread(writer)


KINDS = {
    "quiet point (": "disk != memory at a quiet point",
    "returned Skipped('unchanged')": "'unchanged' while the disk held another state",
    "an older snapshot replaced": "an older snapshot replaced a newer one",
    "quiet point: the file says live": "wrong live flag",
    "quiet point: the file says pinned": "wrong pinned flag",
    "a forked child": "a forked child ran the parent's writer",
    "a second process": "a second process wrote, or was not refused",
    "the second process": "a second process wrote, or was not refused",
    "deleted": "a deleted key came back, or a delete was not refused",
    "delete": "a deleted key came back, or a delete was not refused",
    "simultaneous start": "two processes started at once, one told Written lost its work",
}


def kind_of(problem: str) -> str:
    """The kind of a problem line, for the summary."""
    text = problem.partition(": ")[2]
    for start, kind in KINDS.items():
        if start in text:
            return kind
    return "other (crash, hang, final write)"


def _short(data: bytes) -> str:
    text = data.decode(errors="replace")
    return text if len(text) <= 160 else text[:70] + " ... " + text[-80:]


def _crash(exc: BaseException) -> str:
    """The innermost exceptions of a crash, with where they were raised."""
    leaves: list[BaseException] = []
    stack = [exc]
    while stack:
        e = stack.pop()
        if isinstance(e, BaseExceptionGroup):
            stack.extend(e.exceptions)
        else:
            leaves.append(e)
    parts = []
    for leaf in leaves[:3]:
        tb = traceback.extract_tb(leaf.__traceback__)
        where = f" at {Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
        parts.append(f"{type(leaf).__name__}: {leaf}{where}")
    return "; ".join(parts)


def run_one(spec: Spec) -> Summary:
    """Run one seeded run in a fresh directory; its summary (with any problems)."""
    root = tempfile.mkdtemp(prefix="checkpointer-stress-")
    started = time.monotonic()
    run = _Run(spec, root)
    try:
        anyio.run(run.main, backend=spec.backend)
    except BaseException as exc:  # a crash of the writer or the run is a finding too
        if isinstance(exc, KeyboardInterrupt):
            raise
        run.problem(f"the run crashed: {_crash(exc)}")
        with contextlib.suppress(Exception):
            run.end_second()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    run.summary.seconds = time.monotonic() - started
    run.summary.lost_runs = int(bool(run.summary.problems))
    return run.summary


def run(
    runs: int,
    *,
    stores: Sequence[str] = tuple(STORES),
    backends: Sequence[str] = ("asyncio", "trio"),
    group: str = "all",
    ops: int = 200,
    seed: int | None = None,
    fork_every: int = 4,
    second_every: int = 4,
    delete_every: int = 4,
    start_every: int = 4,
    progress: Callable[[str], object] | None = None,
) -> list[Summary]:
    """``runs`` runs per store and backend; one summary per (store, backend).

    Args:
        runs: runs per store and backend.
        stores: names in ``STORES``.
        backends: ``asyncio`` and/or ``trio``.
        group: the operation mix, a name in ``GROUPS``.
        ops: operations per run.
        seed: the first run's seed (the others follow it); random if None.
        fork_every: every n-th run forks a child (0: never).
        second_every: every n-th run starts a second process on the key (0: never).
        delete_every: every n-th run deletes the key at a quiet point (0: never).
        start_every: every n-th run also starts two processes on new keys at once.
        progress: called with a line after each run.
    """
    base = random.randrange(2**32) if seed is None else seed
    summaries = []
    for store in stores:
        for backend in backends:
            total = Summary(store, backend, group)
            for i in range(runs):
                spec = Spec(
                    store,
                    backend,
                    base + i,
                    ops=ops,
                    group=group,
                    fork=bool(fork_every) and i % fork_every == fork_every - 1,
                    second=bool(second_every) and i % second_every == 0,
                    delete=bool(delete_every) and i % delete_every == delete_every // 2,
                )
                one = run_one(spec)
                if start_every and i % start_every == start_every - 1:
                    one.problems += run_starts(store, backend)
                    one.starts += STARTS
                    one.lost_runs = int(bool(one.problems))
                total.add(one)
                if progress is not None:
                    progress(
                        f"{store:15} {backend:7} seed {spec.seed}: {one.operations} ops, "
                        f"{one.commits} commits, losses {one.losses}"
                    )
                    for p in one.problems:
                        progress("  LOST: " + p)
            summaries.append(total)
    return summaries


STARTS = 10  # keys per simultaneous start
START_CHILD = [sys.executable, "-m", "tests.children.start_child"]


def run_starts(store: str, backend: str, turns: int = 3) -> list[str]:
    """Two processes open ``STARTS`` new keys at one moment; the problems found.

    Each process loads every key (None), opens a writer with
    ``resume_from=`` that, and writes ``turns`` messages.  A process whose
    last result is ``Written`` must find all its messages stored.
    """
    if store not in ("file", "journal", "s3", "s3journal"):
        store = "file"  # the child knows the stores by their kind
    root = tempfile.mkdtemp(prefix="checkpointer-starts-")
    where = root
    if store.startswith("s3"):  # the run's own prefix in the bucket STORES uses
        from .s3 import serve_for_children

        bucket, _, url = serve_for_children().partition("@")
        where = f"{bucket}/{os.path.basename(root)}@{url}"
    keys = [f"start-{i}" for i in range(STARTS)]
    env = child_env()
    problems: list[str] = []
    try:
        procs = {
            name: subprocess.Popen(
                [*START_CHILD, f"{store}:{where}", name, str(turns), *keys],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=ROOT,
            )
            for name in ("a", "b")
        }
        for proc in procs.values():
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        ran: dict[str, dict[str, Any]] = {}
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=HANG_GUARD * 2)
            if proc.returncode != 0:
                return [f"{store}/{backend}: simultaneous start: a process failed: {err[-400:]}"]
            ran[name] = json.loads(out)
        reader = STORES[store](root)
        for key in keys:
            cp = load(reader, key)
            stored = [] if cp is None else cp.state["messages"]
            for name, runs in ran.items():
                run = runs[key]
                if (
                    run["results"][-1] == "Written:"
                    and stored[: len(run["messages"])] != run["messages"]
                ):
                    problems.append(
                        f"{store}/{backend}: simultaneous start: {name} was told Written for "
                        f"{run['messages']} but {key} holds {stored}"
                    )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return problems


def table(summaries: Sequence[Summary]) -> list[str]:
    lines = [
        "| store | backend | runs | operations | quiet-point checks | 'unchanged' checks "
        "| commits | write_now cancelled | forked children | second processes "
        "| deletes | simultaneous starts | runs that lost something |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        lines.append(
            f"| {s.store} | {s.backend} | {s.runs} | {s.operations:,} | {s.quiet_checks:,} "
            f"| {s.unchanged_checks:,} | {s.commits:,} | {s.cancelled:,} | {s.forks} "
            f"| {s.seconds_processes} | {s.deletes} | {s.starts} | {s.lost_runs} |"
        )
    return lines


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m tests.stress",
        description="Random operations on a real writer, checked against the session.",
    )
    p.add_argument("--runs", type=int, default=20, help="runs per store and backend (default 20)")
    p.add_argument("--ops", type=int, default=200, help="operations per run (default 200)")
    p.add_argument(
        "--store",
        action="append",
        choices=[*STORES, *UNSAFE, "all"],
        help="repeatable (default all; 'lossy' drops writes on purpose)",
    )
    p.add_argument("--backend", action="append", choices=["asyncio", "trio"], help="repeatable")
    p.add_argument("--group", default="all", choices=sorted(GROUPS), help="operation mix")
    p.add_argument("--seed", type=int, default=None, help="first seed (default: random)")
    p.add_argument("--fork-every", type=int, default=4, help="fork a child every n-th run")
    p.add_argument("--second-every", type=int, default=4, help="a second process every n-th run")
    p.add_argument("--delete-every", type=int, default=4, help="delete the key every n-th run")
    p.add_argument(
        "--start-every", type=int, default=4, help="two processes on new keys every n-th run"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="print the table only")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """The command: ``python -m tests.stress [--runs N] ...``; exit status 1 on a loss."""
    args = _parse(argv)
    if args.runs < 1 or args.ops < 1:
        print("stress: --runs and --ops must be >= 1", file=sys.stderr)
        return 2
    chosen = args.store or ["all"]
    stores = list(STORES) if "all" in chosen else list(dict.fromkeys(chosen))
    started = time.monotonic()
    summaries = run(
        args.runs,
        stores=stores,
        backends=args.backend or ["asyncio", "trio"],
        group=args.group,
        ops=args.ops,
        seed=args.seed,
        fork_every=args.fork_every,
        second_every=args.second_every,
        delete_every=args.delete_every,
        start_every=args.start_every,
        progress=None if args.quiet else lambda line: print(line, flush=True),
    )
    print("\n".join(table(summaries)))
    total = Summary("all", "all", args.group)
    for s in summaries:
        total.add(s)
    for kind, runs in sorted(total.kinds().items()):
        print(f"lost, in {runs} runs: {kind}")
    firsts: dict[str, str] = {}
    for p in total.problems:
        firsts.setdefault(kind_of(p), p)
    for p in firsts.values():
        print("LOST (first of its kind):", p[:400])
    print(
        f"stress: runs={total.runs} operations={total.operations} "
        f"quiet_checks={total.quiet_checks} unchanged_checks={total.unchanged_checks} "
        f"commits={total.commits} cancelled={total.cancelled} forks={total.forks} "
        f"second={total.seconds_processes} deletes={total.deletes} starts={total.starts} "
        f"lost_runs={total.lost_runs} losses={total.losses} "
        f"seconds={time.monotonic() - started:.0f}",
        flush=True,
    )
    return 1 if total.lost_runs else 0


if __name__ == "__main__":
    sys.exit(main())
