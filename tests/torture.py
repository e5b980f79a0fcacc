"""Crash torture: ``kill -9`` a checkpointing process at random moments, check the file each time.

Run it from the repository root::

    python -m tests.torture --kills 200

A child process runs a real ``CheckpointWriter`` on the chosen store with
small timers, on asyncio, trio or uvloop, and changes its session without
pause: the state for sequence number ``n`` is ``state_for(n)``, a transcript
of up to ``--max-mib`` MiB that grows by a message per number and is
replaced every ``EPOCH`` numbers, so the child is inside a durable write
most of the time (and a journal both appends and compacts).  Timer writes,
``write_now()`` and ``flush_sync()`` from a worker thread are mixed.  The
store is wrapped so that after each write that returned the child prints
``W <seq> <n>`` on its stdout pipe.  The parent kills the child with SIGKILL
at a random moment, either while the writer starts (open, the first write)
or while it runs, and then checks the file:

* it loads (no torn bytes; a journal may end in an unfinished append, which
  ``load`` ignores and reports, and which is counted);
* its state is exactly ``state_for(n)`` for the ``n`` it holds (no mixture
  of two writes);
* ``n`` and ``meta.seq`` are at least those of the last write the child
  reported (nothing that returned is lost) and never go back between kills;
* the leftovers of the interrupted write (temp files of a dead process) are
  gone once the next child has opened its store, and that child's first write
  succeeded (the key's lock went with the killed process).

It prints a summary per store; the exit status is 1 if anything was lost.
``--store`` picks the store (``file``, ``file-transcript``, ``journal``,
``s3``, ``s3journal``, ``all``); another store is one more entry in ``STORES``.  ``--store naive``
is a deliberately unsafe store (writes in place) that shows the torture
catching torn files.

The children are forked from a helper process (this file with ``--zygote``)
that has imported everything once, so a kill costs milliseconds, not an
interpreter start; each child still opens the store, resumes from the file
and runs its own event loop, as a fresh process would.

A SIGKILL leaves the kernel's page cache intact: this tests atomicity
against a crashing process, not durability against a power cut (which needs
a VM or a fault-injecting block device).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import math
import os
import queue
import random
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import anyio
import msgspec

from checkpointer import (
    Checkpoint,
    CheckpointError,
    CheckpointWriter,
    FileStore,
    JournalStore,
    Meta,
    Snapshot,
    Transcript,
    load,
)
from checkpointer._stores.atomic import _TEMP_RE
from checkpointer._stores.base import KeyLock, KeyLocked, LockingStore
from checkpointer._stores.envelopes import state_store
from checkpointer.stores import Staged, Store, TornTail

KEY = "torture"
HANG_GUARD = 30.0  # seconds; a hang guard, never a timing assertion
MIB = 1 << 20

__all__ = ["STORES", "StoreKind", "Summary", "check", "main", "run", "state_for"]


# -- the state for a sequence number ---------------------------------------------------


EPOCH = 40
"""Sequence numbers per history: within one, each state is the last plus a message."""

ROLES = ("user", "assistant", "tool")


def state_for(n: int, max_bytes: int) -> dict[str, Any]:
    """The session state for sequence number ``n``: deterministic, and different for every ``n``.

    Within an epoch of ``EPOCH`` numbers the history only grows (state
    ``n + 1`` is state ``n`` plus one message), as an agent's does; at each
    new epoch it is replaced, as when an agent compacts its history.  So an
    append-only store both appends and compacts.  Message sizes are
    log-uniform from 64 bytes to ``max_bytes / 8``, the whole state at most
    ``max_bytes``; a message's bytes depend on its epoch and index.
    """
    epoch, last = divmod(n, EPOCH)
    budget = max_bytes
    cap = max(65, max_bytes // 8)
    messages = []
    for i in range(last + 1):
        name = f"{epoch}/{i}"
        size = min(budget, int(math.exp(random.Random(name).uniform(math.log(64), math.log(cap)))))
        budget -= size
        tag = hashlib.blake2b(name.encode(), digest_size=16).hexdigest()
        messages.append({"role": ROLES[i % 3], "content": (tag * (size // len(tag) + 1))[:size]})
    return {"n": n, "messages": messages}


# -- stores under test -------------------------------------------------------------------


def file_leftovers(root: str) -> list[str]:
    """Temp files of ``FileStore`` writes that no process holds: what the next open sweeps.

    A temp of mode 000 is left out: its writer may be about to lock it, so
    the sweep keeps it until it is old (``atomic.STALE_AFTER``).
    """
    try:
        names = os.listdir(root)
    except (FileNotFoundError, NotADirectoryError):
        return []
    paths = (os.path.join(root, name) for name in names if _TEMP_RE.match(name))
    return sorted(path for path in paths if _free(path))


def _free(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # a link under a temp's name: swept too
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and not stat.S_IMODE(st.st_mode):
            return False
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


class NaiveStore(FileStore):
    """A deliberately unsafe store: rewrites the file in place, syncing each piece.

    What ``open(path, "wb").write(data)`` amounts to on a slow disk.  Only
    here to show that the torture notices torn files.
    """

    def write(self, key: str, chunks: Sequence[bytes], **kw: Any) -> int:
        os.makedirs(self.root, exist_ok=True)
        data = b"".join(chunks)
        with open(self.location(key), "wb") as f:
            for start in range(0, len(data), 256 * 1024):
                f.write(data[start : start + 256 * 1024])
                f.flush()
                os.fdatasync(f.fileno())
        return len(data)


@dataclass(frozen=True)
class StoreKind:
    """A store the torture can run: how to make one, and what a killed writer may leave.

    ``leftovers(root)`` lists what an interrupted write of a process that is
    gone left behind, which the next ``open()`` must clear away.
    """

    make: Callable[[str], Store]
    leftovers: Callable[[str], list[str]]
    unsafe: bool = False
    setup: Callable[[], object] | None = None  # before the children: a server to reach


def _file_transcript(root: str) -> Store:
    return FileStore(root)  # its writes encoded through a Transcript: ReportingStore.stage


def _s3(kind: str) -> Callable[[str], Store]:
    """An S3 store on the local server ``setup`` started, the root's name as its prefix."""

    def make(root: str) -> Store:
        top = str(Path(__file__).resolve().parent.parent)  # the zygote runs this file as a script
        if top not in sys.path:
            sys.path.insert(0, top)
        from tests.s3 import PLACE_ENV, make_s3_store

        store: Store = make_s3_store(f"{kind}:{os.environ[PLACE_ENV]}", os.path.basename(root))
        return store

    return make


def _no_leftovers(root: str) -> list[str]:
    return []  # unreferenced segments are swept after an hour, not at the next open


def _serve() -> object:
    from tests.s3 import serve_for_children

    return serve_for_children()


STORES: dict[str, StoreKind] = {
    "file": StoreKind(FileStore, file_leftovers),
    "file-transcript": StoreKind(_file_transcript, file_leftovers),
    "journal": StoreKind(JournalStore, file_leftovers),
    "s3": StoreKind(_s3("s3"), _no_leftovers, setup=_serve),
    "s3journal": StoreKind(_s3("s3journal"), _no_leftovers, setup=_serve),
    "naive": StoreKind(NaiveStore, file_leftovers, unsafe=True),
}
"""The stores to torture: a new store is one more entry.

``file-transcript`` is a ``FileStore`` that encodes messages one by one
(through a ``Transcript``) and joins them in the worker thread; ``journal``
appends batches to a JSON Lines file and rewrites it (temp file and rename)
when it outgrows its content, so kills land in appends and in rewrites;
``s3`` and ``s3journal`` write to moto's S3 server, started on 127.0.0.1
for the run (kills land between a segment and its head).
"""


# -- the child ---------------------------------------------------------------------------


def _say(line: str) -> None:
    # One write(2) of a short line to a pipe is atomic: whole or absent, even at a kill.
    os.write(1, f"{os.getpid()} {line}\n".encode())


class _Tagged:
    """A staged state, and the sequence number of the state it was staged from."""

    __slots__ = ("inner", "n")

    def __init__(self, inner: Staged, n: int) -> None:
        self.inner = inner
        self.n = n

    def content(self) -> object:
        return self.inner.content()


class ReportingStore:
    """The child's store: after each commit that returned, it says ``W <seq> <n>``.

    It is the ``StateStore`` the writer would use for ``inner`` (the store
    itself, or ``Envelopes`` over a bytes store), so the child's writes take
    the path a program's do; the bytes and lock calls go straight through.
    """

    def __init__(self, inner: Store, transcript: Transcript | None = None) -> None:
        self.inner = inner
        self.states = state_store(inner)
        self.transcript = transcript  # the message cache, without the writer's other steps

    # -- StateStore ----------------------------------------------------------------

    def stage(self, key: str, state: Any, transcript: Transcript | None = None) -> _Tagged:
        staged = self.states.stage(key, state, transcript or self.transcript)
        return _Tagged(staged, int(state["n"]))

    def commit(self, key: str, meta: Meta, staged: Staged, **kw: Any) -> int:
        assert isinstance(staged, _Tagged)
        nbytes = self.states.commit(key, meta, staged.inner, **kw)
        _say(f"W {meta.seq} {staged.n}")
        return nbytes

    def read_meta(self, key: str) -> Meta | None:
        return self.states.read_meta(key)

    def update_meta(self, key: str, meta: Meta, *, expected: str) -> None:
        self.states.update_meta(key, meta, expected=expected)

    def read_checkpoint(self, key: str) -> Checkpoint[msgspec.Raw] | None:
        return self.states.read_checkpoint(key)

    # -- Store and LockingStore ----------------------------------------------------

    def validate_key(self, key: str) -> None:
        self.inner.validate_key(key)

    def location(self, key: str) -> str:
        return self.inner.location(key)

    def open(self) -> None:
        self.inner.open()

    def write(self, key: str, chunks: Sequence[bytes], **kw: Any) -> int:
        return self.inner.write(key, chunks, **kw)

    def read(self, key: str) -> bytes | None:
        return self.inner.read(key)

    def revision(self, key: str) -> str | None:
        return self.inner.revision(key)

    def keys(self) -> list[str]:
        return self.inner.keys()

    def delete(self, key: str) -> bool:
        return self.inner.delete(key)

    def move_aside(self, key: str, suffix: str) -> str | None:
        return self.inner.move_aside(key, suffix)


class LockingReportingStore(ReportingStore):
    """A ``ReportingStore`` over a store that locks keys: it locks them too."""

    def lock(self, key: str, *, timeout: float = 0.0) -> KeyLock:
        assert isinstance(self.inner, LockingStore)
        return self.inner.lock(key, timeout=timeout)


async def _child(spec: dict[str, Any]) -> int:
    """Checkpoint a session that changes without pause, until killed."""
    parent = os.getppid()
    cache = Transcript() if spec["store"] == "file-transcript" else None
    inner = STORES[spec["store"]].make(spec["root"])
    reporting = LockingReportingStore if isinstance(inner, LockingStore) else ReportingStore
    store = reporting(inner, cache)
    try:
        previous = load(store, KEY)
    except CheckpointError as exc:
        _say(f"CORRUPT {exc}")
        return 3
    n = 0 if previous is None else int(previous.state["n"])
    max_bytes = int(spec["max_bytes"])
    rng = random.Random(spec["seed"])

    def source() -> Snapshot:
        return Snapshot(KEY, state_for(n, max_bytes))

    writer = CheckpointWriter(source, store, debounce=0.002, min_interval=0.0, max_wait=0.02)
    _say("START")
    async with writer:
        # The first write must not fail: the killed child's key lock is gone with it.
        stats = writer.statistics()
        _say(f"READY {n} {stats.writes} {stats.failures}")
        while os.getppid() == parent:  # until the SIGKILL (or the helper is gone)
            n += 1
            writer.notify()
            dice = rng.random()
            if dice < 0.08:
                await writer.write_now()
            elif dice < 0.12:
                await anyio.to_thread.run_sync(writer.flush_sync)
            else:
                await anyio.sleep(rng.uniform(0.0, 0.004))
    return 4


def _run_child(spec: dict[str, Any]) -> int:
    backend = "trio" if spec["backend"] == "trio" else "asyncio"
    options = {"use_uvloop": True} if spec["backend"] == "uvloop" else {}
    return anyio.run(_child, spec, backend=backend, backend_options=options)


def _zygote(run_child: Callable[[dict[str, Any]], int] | None = None) -> int:
    """Fork a child per ``SPAWN <json>`` line on stdin; reap it on ``REAP <pid>``.

    ``run_child(spec)`` runs in the child (default: this torture's child).
    """
    with contextlib.suppress(ImportError):
        import trio  # noqa: F401  # imported once here, not in every child
        import uvloop  # noqa: F401
    for raw in sys.stdin.buffer:
        command, _, rest = raw.decode().strip().partition(" ")
        if command == "SPAWN":
            spec = json.loads(rest)
            pid = os.fork()
            if pid == 0:
                code = 70
                try:
                    code = (run_child or _run_child)(spec)
                except BaseException:
                    traceback.print_exc()
                finally:
                    os._exit(code)
            os.write(1, f"PID {pid}\n".encode())
        elif command == "REAP":
            pid = int(rest)
            _, status = os.waitpid(pid, 0)
            os.write(1, f"REAPED {pid} {os.waitstatus_to_exitcode(status)}\n".encode())
    return 0


# -- the parent --------------------------------------------------------------------------


@dataclass
class Summary:
    """What a torture run did and found."""

    store: str
    seed: int
    max_bytes: int
    kills: int = 0
    early_kills: int = 0
    writes: int = 0
    max_seq: int = 0
    largest: int = 0
    temps: int = 0
    torn: int = 0
    swept: int = 0
    seconds: float = 0.0
    backends: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def losses(self) -> int:
        return len(self.problems)

    @property
    def mid_write(self) -> int:
        """Kills that provably landed inside a write: a temp file or a torn append left."""
        return self.temps + self.torn

    def lines(self) -> list[str]:
        return [
            f"torture: {self.kills} kills (SIGKILL) of a process checkpointing to the "
            f"{self.store!r} store, states up to {self.max_bytes / MIB:.1f} MiB, "
            f"seed {self.seed}, {self.seconds:.1f} s",
            "  backends: " + ", ".join(f"{k} {v}" for k, v in sorted(self.backends.items())),
            f"  killed while starting (open, first write): {self.early_kills}",
            f"  writes the child reported done: {self.writes}; seq reached {self.max_seq}; "
            f"largest file {self.largest / MIB:.2f} MiB",
            f"  kills that landed mid-write: {self.mid_write} (left a temp file: {self.temps}, "
            f"temp files swept by the next open: {self.swept}; left a torn append, "
            f"which load ignored: {self.torn})",
            f"  after every kill the file loaded, held exactly the state of its sequence "
            f"number, and was at least as new as the last reported write: "
            f"{'yes' if not self.problems else 'NO'}",
            *(f"  LOST: {p}" for p in self.problems),
            f"store={self.store} kills={self.kills} writes={self.writes} "
            f"max_seq={self.max_seq} mid_write={self.mid_write} temps={self.temps} "
            f"swept={self.swept} torn={self.torn} losses={self.losses}",
        ]


@dataclass
class Reported:
    """The newest write a child reported done, and the newest seen on disk before it."""

    seq: int = 0
    n: int = -1


def check(
    store: Store, max_bytes: int, floor: Reported, torn: list[TornTail] | None = None
) -> list[str]:
    """Check the file after a kill against ``floor`` (what must be on disk at least).

    Returns:
        One line per problem (empty when all is well).  ``floor`` moves up
        to what the file holds, so a later file may not go back.  A journal's
        unfinished last append, which ``load`` ignores, goes to ``torn``.
    """
    try:
        cp = load(store, KEY)
    except CheckpointError as exc:
        return [f"the checkpoint does not load: {exc}"]
    if cp is None:
        if floor.n >= 0:
            return [f"the checkpoint is gone; seq {floor.seq} (n={floor.n}) was reported"]
        return []
    n = cp.state.get("n") if isinstance(cp.state, dict) else None
    if not isinstance(n, int):
        return [f"the state has no sequence number: {str(cp.state)[:80]}"]
    if cp.torn is not None and torn is not None:
        torn.append(cp.torn)
    problems = []
    if cp.state != state_for(n, max_bytes):
        problems.append(f"the state is not the state of its sequence number n={n} (mixed/torn)")
    if n < floor.n or cp.meta.seq < floor.seq:
        problems.append(
            f"the file holds seq {cp.meta.seq} (n={n}), older than seq {floor.seq} "
            f"(n={floor.n}), reported done or seen before"
        )
    floor.seq = max(floor.seq, cp.meta.seq)
    floor.n = max(floor.n, n)
    return problems


class _Run:
    """What one child said on its stdout, as the helper's reader thread sorts it out."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.started = threading.Event()
        self.ready = threading.Event()
        self.status: int | None = None

    def reported(self) -> tuple[int, Reported]:
        """How many writes the child reported done, and the newest of them."""
        count, newest = 0, Reported()
        for line in self.lines:
            parts = line.split()
            if len(parts) == 3 and parts[0] == "W":
                count += 1
                newest.seq = max(newest.seq, int(parts[1]))
                newest.n = max(newest.n, int(parts[2]))
        return count, newest


class _Zygote:
    """The helper process that forks the children (``--zygote``), and its pipes.

    ``argv`` is the command whose ``--zygote`` runs it, run from the
    repository root (default: this file).
    """

    def __init__(self, argv: Sequence[str] | None = None) -> None:
        here = Path(__file__).resolve()
        self.proc = subprocess.Popen(
            [sys.executable, *(argv or [str(here)]), "--zygote"],
            cwd=here.parent.parent,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.runs: dict[int, _Run] = {}
        self.replies: queue.Queue[tuple[str, int]] = queue.Queue()
        self.err: list[bytes] = []
        self.lock = threading.Lock()
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.pumps = [
            threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True),
            threading.Thread(target=self._read_err, args=(self.proc.stderr,), daemon=True),
        ]
        for pump in self.pumps:
            pump.start()

    def run_of(self, pid: int) -> _Run:
        with self.lock:
            return self.runs.setdefault(pid, _Run())

    def _read(self, stream: IO[bytes]) -> None:
        for raw in stream:
            first, _, rest = raw.decode(errors="replace").rstrip("\n").partition(" ")
            if first == "PID":
                self.replies.put(("PID", int(rest)))
            elif first == "REAPED":
                pid, code = rest.split()
                self.run_of(int(pid)).status = int(code)
                self.replies.put(("REAPED", int(pid)))
            elif first.isdigit():
                run = self.run_of(int(first))
                run.lines.append(rest)
                if rest == "START":
                    run.started.set()
                elif rest.startswith("READY "):
                    run.ready.set()
        self.replies.put(("EOF", 0))

    def _read_err(self, stream: IO[bytes]) -> None:
        for raw in stream:
            self.err.append(raw)
            del self.err[:-40]

    def _ask(self, line: str, reply: str) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()
        kind, value = self.replies.get(timeout=HANG_GUARD)
        if kind != reply:
            raise RuntimeError(f"the torture helper died: {self.stderr()}")
        return value

    def spawn(self, spec: dict[str, Any]) -> tuple[int, _Run]:
        pid = self._ask("SPAWN " + json.dumps(spec), "PID")
        return pid, self.run_of(pid)

    def kill(self, pid: int) -> None:
        """SIGKILL the child (if still there) and wait until the helper has reaped it."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self._ask(f"REAP {pid}", "REAPED")

    def wait(self, run: _Run, event: threading.Event) -> bool:
        """Wait for ``event`` (hang guard); False if the child ended first."""
        deadline = time.monotonic() + HANG_GUARD
        while not event.wait(0.002):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                return event.is_set()
            if any(line.startswith("CORRUPT") for line in run.lines):
                return False
        return True

    def stderr(self) -> str:
        return b"".join(self.err).decode(errors="replace")

    def close(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(HANG_GUARD)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for pump in self.pumps:
            pump.join(HANG_GUARD)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def _backends() -> list[str]:
    names = ["asyncio", "trio"]
    with contextlib.suppress(ImportError):
        import uvloop  # noqa: F401

        names.append("uvloop")
    return names


def run(
    kills: int = 200,
    *,
    store: str = "file",
    max_bytes: int = 4 * MIB,
    max_delay: float = 0.25,
    early: float = 0.15,
    seed: int | None = None,
    root: str | os.PathLike[str] | None = None,
    stop_on_loss: bool = False,
    progress: Callable[[str], object] | None = None,
) -> Summary:
    """Kill a checkpointing child ``kills`` times and check the file after each kill.

    Args:
        kills: how many children to start and SIGKILL.
        store: a name in ``STORES``.
        max_bytes: the largest state (see ``state_for``).
        max_delay: a running child is killed uniformly within this many
            seconds after it is ready.
        early: the share of kills aimed at a child still starting (within
            30 ms of entering the writer: the open and the first write).
        seed: chooses backends, moments and the children's behaviour;
            random if None (printed in the summary).
        root: the store's directory (a fresh temp directory by default,
            removed afterwards).
        stop_on_loss: stop at the first problem.
        progress: called with a line after every kill.
    """
    kind = STORES[store]
    seed = random.randrange(2**32) if seed is None else seed
    rng = random.Random(seed)
    summary = Summary(store=store, seed=seed, max_bytes=max_bytes)
    backends = _backends()
    started = time.monotonic()
    if kind.setup is not None:
        kind.setup()  # before the helper process starts: the children inherit its address
    with _root(root) as where, contextlib.closing(_Zygote()) as zygote:
        floor = Reported()
        debris: set[str] = set()  # killed writers' leftovers, until an open is seen
        for i in range(kills):
            backend = rng.choice(backends)
            summary.backends[backend] = summary.backends.get(backend, 0) + 1
            aim_early = rng.random() < early
            spec: dict[str, Any] = {"root": where, "store": store, "backend": backend}
            spec.update(max_bytes=max_bytes, seed=rng.randrange(2**32))
            pid, child = zygote.spawn(spec)
            problems: list[str] = []
            try:
                if aim_early:  # while it opens the store and writes its first checkpoint
                    if zygote.wait(child, child.started):
                        time.sleep(rng.uniform(0.0, 0.03))
                    else:
                        problems.append("the child never started")
                elif zygote.wait(child, child.ready):
                    # The child's writer has opened the store: the debris must be gone.
                    problems += _swept(kind, where, debris, summary)
                    problems += _started_well(child)
                    time.sleep(rng.uniform(0.0, max_delay))
                else:
                    problems.append("the child never got ready")
            finally:
                zygote.kill(pid)
            if child.status != -signal.SIGKILL:
                tail = "\n".join(child.lines[-5:])
                problems.append(
                    f"the child ended with status {child.status} before the kill:\n{tail}\n"
                    f"{zygote.stderr()[-2000:]}"
                )
            summary.kills += 1
            summary.early_kills += aim_early
            fresh = set(kind.leftovers(where)) - debris  # what this kill left behind
            summary.temps += bool(fresh)
            debris |= fresh
            count, newest = child.reported()
            summary.writes += count
            floor.seq, floor.n = max(floor.seq, newest.seq), max(floor.n, newest.n)
            torn: list[TornTail] = []
            problems += check(kind.make(where), max_bytes, floor, torn)
            summary.torn += bool(torn)
            with contextlib.suppress(OSError):
                size = os.path.getsize(kind.make(where).location(KEY))
                summary.largest = max(summary.largest, size)
            summary.max_seq = max(summary.max_seq, floor.seq)
            summary.problems += [f"kill {i + 1} ({backend}): {p}" for p in problems]
            if progress is not None:
                moment = "starting" if aim_early else "running"
                progress(
                    f"kill {i + 1}/{kills} {backend:7} {moment}: {count:3} writes, "
                    f"seq {floor.seq}, losses {summary.losses}"
                )
            if problems:
                if stop_on_loss:
                    break
                # Start the next child afresh; the bad file stays, aside, for a look.
                with contextlib.suppress(OSError, KeyLocked):
                    kind.make(where).move_aside(KEY, f"lost-{i + 1}")
                floor = Reported()
        else:  # no child opens the store after the last kill: open it here
            with contextlib.suppress(OSError):
                kind.make(where).open()
            summary.problems += [
                f"after the last kill: {p}" for p in _swept(kind, where, debris, summary)
            ]
    summary.seconds = time.monotonic() - started
    return summary


def _started_well(child: _Run) -> list[str]:
    """A problem if the child's first write failed (say, a lock the killed child kept)."""
    ready = next(line for line in child.lines if line.startswith("READY "))
    _, n, writes, failures = ready.split()
    if failures != "0" or writes != "1":
        return [
            f"the first write of a new child failed (n={n}): {writes} written, {failures} failed"
        ]
    return []


def _swept(kind: StoreKind, root: str, debris: set[str], summary: Summary) -> list[str]:
    """After an open: count the debris that went; a problem for any that stayed."""
    unswept = sorted(p for p in debris if os.path.exists(p))
    unswept += [p for p in kind.leftovers(root) if p not in debris]
    summary.swept += len(debris) - len(unswept)
    debris.clear()
    return [f"an open left a dead writer's leftovers {unswept}"] if unswept else []


@contextlib.contextmanager
def _root(root: str | os.PathLike[str] | None) -> Iterator[str]:
    if root is not None:
        os.makedirs(root, exist_ok=True)
        yield os.fspath(root)
        return
    where = tempfile.mkdtemp(prefix="checkpointer-torture-")
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


# -- the command ---------------------------------------------------------------------------


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m tests.torture",
        description="SIGKILL a checkpointing process at random moments and check the file "
        "after every kill.",
    )
    p.add_argument("--kills", type=int, default=200, help="how many kills (default 200)")
    p.add_argument(
        "--store",
        action="append",
        choices=[*sorted(STORES), "all"],
        help="the store to torture, repeatable (default file); 'all' is every safe "
        "store; 'naive' is deliberately unsafe",
    )
    p.add_argument("--max-mib", type=float, default=4.0, help="largest state in MiB (default 4)")
    p.add_argument(
        "--max-delay",
        type=float,
        default=0.25,
        help="kill a running child within this many seconds (default 0.25)",
    )
    p.add_argument("--seed", type=int, default=None, help="seed (default: random, printed)")
    p.add_argument("--root", default=None, help="store directory (default: a fresh temp dir)")
    p.add_argument("-q", "--quiet", action="store_true", help="print the summary only")
    p.add_argument("--zygote", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """The command: ``python -m tests.torture [--kills N] ...``; exit status 1 on a loss."""
    args = _parse(argv)
    if args.zygote:
        return _zygote()
    if args.kills < 1 or args.max_mib <= 0 or args.max_delay < 0:
        print("torture: --kills must be >= 1, --max-mib > 0, --max-delay >= 0", file=sys.stderr)
        return 2
    stores: list[str] = []
    for name in args.store or ["file"]:
        for one in [n for n, k in STORES.items() if not k.unsafe] if name == "all" else [name]:
            if one not in stores:
                stores.append(one)
    losses = 0
    for store in stores:
        summary = run(
            args.kills,
            store=store,
            max_bytes=int(args.max_mib * MIB),
            max_delay=args.max_delay,
            seed=args.seed,
            root=None if args.root is None else os.path.join(args.root, store),
            progress=None if args.quiet else lambda line: print(line, flush=True),
        )
        print("\n".join(summary.lines()), flush=True)
        losses += summary.losses
    return 1 if losses else 0


if __name__ == "__main__":
    sys.exit(main())
