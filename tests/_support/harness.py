"""What the kill (torture), power-cut and stress runs share.

The victim: a process that checkpoints a session changing without pause
(``state_for(n)``), says on stdout what its store committed, and runs until
killed.  The helper process (a *zygote*) that forks a victim per run, so a
kill costs milliseconds, not an interpreter start.  The check that reads the
stored bytes back after a kill or a cut.  The stores they run on, and the
store wrapper that taps the writer's stage and commit.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import queue
import random
import signal
import stat
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any

import anyio
import msgspec

from checkpointer import (
    Checkpoint,
    CheckpointError,
    CheckpointWriter,
    FileStore,
    Meta,
    Result,
    Snapshot,
    Transcript,
    Written,
    load,
)
from checkpointer._stores.atomic import _TEMP_RE
from checkpointer._stores.base import KeyLock, LockingStore
from checkpointer._stores.envelopes import state_store
from checkpointer.stores import Staged, Store, TornTail
from tests._support import HANG_GUARD, ROOT

KEY = "torture"
MIB = 1 << 20


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


def file_transcript(root: str) -> Store:
    """A ``FileStore`` whose writes the tapped store encodes through a ``Transcript``."""
    return FileStore(root)


def sealed(make: Callable[..., Store]) -> Callable[[str], Store]:
    """``make(root)`` with encryption on, under a fixed test key (every child opens it)."""

    def make_sealed(root: str) -> Store:
        from checkpointer.stores import Encryption

        return make(root, encryption=Encryption(b"\x07" * 32, key_id="torture"))

    return make_sealed


def s3_store(kind: str) -> Callable[[str], Store]:
    """An S3 store on the local server started for the run, the root's name as its prefix."""

    def make(root: str) -> Store:
        from tests.s3 import make_s3_store, serve_for_children

        store: Store = make_s3_store(f"{kind}:{serve_for_children()}", os.path.basename(root))
        return store

    return make


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


class Tagged:
    """A staged state, and the tag (a sequence number, a version) of the state it came from."""

    __slots__ = ("inner", "tag")

    def __init__(self, inner: Staged, tag: int) -> None:
        self.inner = inner
        self.tag = tag

    def content(self) -> object:
        return self.inner.content()


class TappedStore:
    """The ``StateStore`` the writer would use for ``inner``, tapped at stage and commit.

    ``tag(state)`` names each staged state (the victim's: its ``n``);
    ``after_commit(meta, tag)`` runs after each commit that returned (the
    victim's says ``W <seq> <n>``).  So the writes take the path a
    program's do; the bytes calls go straight through.
    """

    def __init__(self, inner: Store, transcript: Transcript | None = None) -> None:
        self.inner = inner
        self.states = state_store(inner)
        self.transcript = transcript  # the message cache, without the writer's other steps

    def tag(self, state: Any) -> int:
        return int(state["n"])

    def after_commit(self, meta: Meta, tag: int) -> None:
        say(f"W {meta.seq} {tag}")

    def stage(self, key: str, state: Any, transcript: Transcript | None = None) -> Tagged:
        try:
            staged = self.states.stage(key, state, transcript or self.transcript)
        finally:
            tag = self.tag(state)
        return Tagged(staged, tag)

    def commit(self, key: str, meta: Meta, staged: Staged, **kw: Any) -> int:
        assert isinstance(staged, Tagged)
        nbytes = self.states.commit(key, meta, staged.inner, **kw)
        self.after_commit(meta, staged.tag)
        return nbytes

    def read_meta(self, key: str) -> Meta | None:
        return self.states.read_meta(key)

    def update_meta(self, key: str, meta: Meta, *, expected: str) -> None:
        self.states.update_meta(key, meta, expected=expected)

    def read_checkpoint(self, key: str) -> Checkpoint[msgspec.Raw] | None:
        return self.states.read_checkpoint(key)

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


class LockingTappedStore(TappedStore):
    """A ``TappedStore`` over a store that locks keys: it locks them too."""

    def lock(self, key: str, *, timeout: float = 0.0) -> KeyLock:
        assert isinstance(self.inner, LockingStore)
        return self.inner.lock(key, timeout=timeout)


def tapped(inner: Store, transcript: Transcript | None = None) -> TappedStore:
    """The victim's store over ``inner``: it says ``W <seq> <n>`` after each commit."""
    kind = LockingTappedStore if isinstance(inner, LockingStore) else TappedStore
    return kind(inner, transcript)


def say(line: str) -> None:
    """``<pid> <line>`` on stdout in one write(2): whole or absent, even at a kill."""
    os.write(1, f"{os.getpid()} {line}\n".encode())


def returned(result: Result, n: int) -> None:
    """Say what the writer told the program: ``R <seq> <n>`` for a ``Written``."""
    if isinstance(result, Written):
        say(f"R {result.seq} {n}")


async def victim(
    store: Store,
    n: int,
    spec: dict[str, Any],
    summarize: Callable[[int], Awaitable[None]] | None = None,
) -> int:
    """Checkpoint a session that changes without pause from ``n`` on, until killed.

    Says ``START`` before the writer opens, ``READY <n> <writes> <failures>``
    once it has (its first write must not fail: a killed victim's key lock
    is gone with it).  Timer writes, ``write_now()`` and ``flush_sync()``
    from a worker thread are mixed, and ``summarize(n)`` if given.
    """
    parent = os.getppid()
    max_bytes = int(spec["max_bytes"])
    rng = random.Random(spec["seed"])

    def source() -> Snapshot:
        return Snapshot(KEY, state_for(n, max_bytes))

    writer = CheckpointWriter(source, store, debounce=0.002, min_interval=0.0, max_wait=0.02)
    say("START")
    async with writer:
        stats = writer.statistics()
        say(f"READY {n} {stats.writes} {stats.failures}")
        while os.getppid() == parent:  # until the SIGKILL (or the helper is gone)
            n += 1
            writer.notify()
            dice = rng.random()
            # n changes only here: the state a write below returns is state n.
            if dice < 0.08:
                returned(await writer.write_now(), n)
            elif dice < 0.12:
                returned(await anyio.to_thread.run_sync(writer.flush_sync), n)
            elif summarize is not None and dice < 0.16:
                await summarize(n)
            else:
                await anyio.sleep(rng.uniform(0.0, 0.004))
    return 4


def on_loop(child: Callable[[dict[str, Any]], Awaitable[int]], spec: dict[str, Any]) -> int:
    """Run ``child(spec)`` on the spec's event loop: asyncio, trio or uvloop."""
    backend = "trio" if spec["backend"] == "trio" else "asyncio"
    options = {"use_uvloop": True} if spec["backend"] == "uvloop" else {}
    return anyio.run(child, spec, backend=backend, backend_options=options)


def backends() -> list[str]:
    """The event loops a victim can run on here."""
    names = ["asyncio", "trio"]
    with contextlib.suppress(ImportError):
        import uvloop  # noqa: F401

        names.append("uvloop")
    return names


def zygote(run_child: Callable[[dict[str, Any]], int]) -> int:
    """Fork a child per ``SPAWN <json>`` line on stdin to run ``run_child(spec)``.

    Reaps it on ``REAP <pid>``.  Runs in the helper process (``--zygote``).
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
                    code = run_child(spec)
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


@dataclass
class Reported:
    """The newest write a child reported done, and the newest seen on disk before it."""

    seq: int = 0
    n: int = -1


class Run:
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


class Zygote:
    """The helper process that forks the children, and its pipes.

    ``python -m <module> --zygote`` runs it, from the repository root.
    """

    def __init__(self, module: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, "--zygote"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.runs: dict[int, Run] = {}
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

    def run_of(self, pid: int) -> Run:
        with self.lock:
            return self.runs.setdefault(pid, Run())

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

    def spawn(self, spec: dict[str, Any]) -> tuple[int, Run]:
        pid = self._ask("SPAWN " + json.dumps(spec), "PID")
        return pid, self.run_of(pid)

    def kill(self, pid: int) -> None:
        """SIGKILL the child (if still there) and wait until the helper has reaped it."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self._ask(f"REAP {pid}", "REAPED")

    def wait(self, run: Run, event: threading.Event) -> bool:
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


def check(
    store: Store, max_bytes: int, floor: Reported, torn: list[TornTail] | None = None
) -> list[str]:
    """Check the stored checkpoint after a kill against ``floor`` (what it must hold at least).

    Returns:
        One line per problem (empty when all is well).  ``floor`` moves up
        to what the store holds, so a later checkpoint may not go back.  A
        journal's unfinished last append, which ``load`` ignores, goes to
        ``torn``.
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
