"""Forks, for real: nothing of a parent's writer runs in a forked child.

Each process test runs ``tests/children/fork_child.py`` in a session of its
own (``start_new_session``), so a process-group signal reaches the program
and its fork children only.  Its ``multiprocessing`` pool workers inherit
its stdout, so the end of that pipe means every one of them is gone.  The
checks read the checkpoint with ``load`` (the bytes on disk or in the
database) and look at the key's lock from this process; ``foreign.log``
would name any process other than the program that called the session's
``source()``.  The 30 s timeouts are hang guards, never timing assertions.

The in-process tests fork this test process and end the child with
``os._exit`` at once.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from checkpointer import (
    CheckpointWriter,
    FileStore,
    JournalStore,
    Limits,
    Skipped,
    Snapshot,
    Written,
    _exit,
    load,
)
from checkpointer._stores.flock import acquire_file_lock, probe_file_lock
from checkpointer.stores import KeyLocked, Store
from tests._support import CHILDREN, HANG_GUARD, Pumped
from tests.pg import Cluster, find_binaries

CHILD = CHILDREN / "fork_child.py"
KEY = "k"
BINDIR = find_binaries()


def messages(first: int, last: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"m{i}"} for i in range(first, last + 1)]


# -- where the program writes ---------------------------------------------------


class Target:
    """The store the program writes to, seen from this process."""

    def __init__(self, kind: str, tmp_path: Path, dsn: str = "") -> None:
        self.kind = kind
        self.root = tmp_path / "root"
        self.schema = "f_" + uuid.uuid4().hex[:12]
        self.dsn = dsn
        self.store: Store
        if kind == "file":
            self.store = FileStore(self.root)
        elif kind == "journal":
            self.store = JournalStore(self.root)
        else:
            from checkpointer import PostgresStore

            self.store = PostgresStore(dsn, schema=self.schema, connect_timeout=5)

    def args(self, work: Path) -> list[str]:
        """The program's arguments that name the store (and its work directory)."""
        if self.kind == "postgres":
            return ["postgres", self.dsn, str(work), "--schema", self.schema]
        return [self.kind, str(self.root), str(work)]

    def load(self, key: str = KEY) -> Any:
        cp = load(self.store, key)
        assert cp is not None, f"no checkpoint of {key!r}"
        return cp

    def assert_held_by(self, pid: int) -> None:
        """The key's lock is there, names ``pid``, and nobody else can take it."""
        if self.kind == "postgres":
            holder = self.store.locked_by(KEY)  # type: ignore[attr-defined]
            assert holder is not None and f"pid {pid} " in holder, holder
            assert self.store.acquire(KEY) is not None  # type: ignore[attr-defined]
            return
        path = str(self.root / "k.lock")
        probe = probe_file_lock(path)
        assert probe is not None, "the lock file is gone"
        assert probe.holder is not None and probe.holder.pid == pid, probe
        with pytest.raises(KeyLocked):
            acquire_file_lock(path).release()

    def assert_free(self) -> None:
        """Another process can take the key's lock now."""
        if self.kind == "postgres":
            self.store.lock(KEY, timeout=HANG_GUARD).release()  # type: ignore[attr-defined]
            return
        acquire_file_lock(str(self.root / "k.lock")).release()

    def close(self) -> None:
        close = getattr(self.store, "close", None)
        if close is not None:
            close()


@pytest.fixture(scope="module")
def cluster() -> Iterator[list[Cluster]]:
    """A private PostgreSQL cluster, started on first use by a PostgresStore case."""
    holder: list[Cluster] = []
    yield holder
    for c in holder:
        c.destroy()


def make_target(kind: str, tmp_path: Path, cluster: list[Cluster]) -> Target:
    if kind != "postgres":
        return Target(kind, tmp_path)
    if BINDIR is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl); install Debian's postgresql")
    if not cluster:
        c = Cluster(BINDIR, fsync=False)
        cluster.append(c)
        c.start()
    return Target(kind, tmp_path, cluster[0].dsn())


@pytest.fixture
def target(
    request: pytest.FixtureRequest, tmp_path: Path, cluster: list[Cluster]
) -> Iterator[Target]:
    t = make_target(request.param, tmp_path, cluster)
    yield t
    t.close()


# -- the program ----------------------------------------------------------------


class Program(Pumped):
    """One run of the child program, in a session (and process group) of its own."""

    def __init__(self, tmp_path: Path, target: Target, backend: str, scenario: str) -> None:
        self.work = tmp_path
        argv = [sys.executable, str(CHILD), *target.args(tmp_path)]
        argv += ["--backend", backend, "--scenario", scenario]
        super().__init__(argv, stdin=subprocess.PIPE, new_session=True)
        self.pid = int(self.expect("PID")[0])

    def expect(self, word: str) -> list[str]:
        """Wait for the line that starts with ``word``; return the rest of its words."""
        line = self.wait_line(lambda line: line.partition(" ")[0] == word, word)
        return line.partition(" ")[2].split(" ")

    def said(self, word: str) -> str:
        """The rest of the line the program said starting with ``word`` (already read)."""
        head = word + " "
        found = [line[len(head) :].rstrip("\n") for line in self.out if line.startswith(head)]
        assert len(found) == 1, f"{word!r} said {len(found)} times\n{self.report()}"
        return found[0]

    def carry_on(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def finish(self) -> int:
        """Wait until the program and every process that shares its stdout are gone."""
        self._close_stdin()
        try:
            self.proc.wait(HANG_GUARD)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"hang guard: the program did not end\n{self.report()}")
        for pump in self.pumps:
            pump.join(HANG_GUARD)
            if pump.is_alive():
                self.kill()
                pytest.fail(f"hang guard: a fork child outlived the program\n{self.report()}")
        return self.proc.returncode

    def _close_stdin(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()

    def kill(self) -> None:
        self._close_stdin()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for pump in self.pumps:
            pump.join(HANG_GUARD)

    def assert_nothing_foreign(self) -> None:
        log = self.work / "foreign.log"
        assert not log.exists(), (
            f"the parent's source() ran in pids {log.read_text().split()}\n{self.report()}"
        )


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Any]:
    started: list[Program] = []

    def start(target: Target, backend: str, scenario: str) -> Program:
        program = Program(tmp_path, target, backend, scenario)
        started.append(program)
        return program

    yield start
    for program in started:
        if program.proc.returncode is None:
            program.kill()


def check_then_finish(program: Program, target: Target) -> None:
    """The parent's state, seq, pid and lock at CHECK; its next writes go on from there."""
    program.expect("CHECK")
    seq = int(program.said("W2").split("seq=")[1].split(",")[0])
    assert program.said("AGAIN") == "Skipped(reason='unchanged')", program.report()
    cp = target.load()
    assert cp.state == {"messages": messages(1, 5)}, program.report()
    assert (cp.meta.seq, cp.meta.live, cp.meta.writer.pid) == (seq, True, program.pid)
    target.assert_held_by(program.pid)
    program.carry_on()
    assert program.finish() == 0, program.report()
    assert f"seq={seq + 1}," in program.said("W3"), program.report()
    cp = target.load()
    assert cp.state == {"messages": messages(1, 6)}
    assert (cp.meta.seq, cp.meta.live, cp.meta.writer.pid) == (seq + 2, False, program.pid)
    target.assert_free()
    program.assert_nothing_foreign()


def check_workers(program: Program, target: Target) -> None:
    """Each pool worker's own writer wrote its own key, and flushed it on SIGTERM."""
    pids = {int(p) for p in program.said("WORKERS").split()}
    written = {target.load(f"w{i}").meta.writer.pid for i in range(2)}
    assert written == pids
    for i in range(2):
        cp = target.load(f"w{i}")
        assert (cp.state, cp.meta.live) == ({"n": 2}, False)


# -- the tests ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backend", "target"),
    [("asyncio", "file"), ("trio", "journal"), ("sync", "postgres")],
    indirect=["target"],
)
def test_pool_terminate(run: Any, target: Target, backend: str) -> None:
    """pool.terminate() SIGTERMs fork workers: they flush nothing of the parent's; it goes on."""
    program = run(target, backend, "pool")
    check_then_finish(program, target)
    check_workers(program, target)


@pytest.mark.parametrize(
    ("backend", "target", "signame"),
    [
        ("asyncio", "journal", "SIGTERM"),
        ("trio", "file", "SIGHUP"),
        ("sync", "postgres", "SIGTERM"),
    ],
    indirect=["target"],
)
def test_process_group_signal(run: Any, target: Target, backend: str, signame: str) -> None:
    """SIGTERM/SIGHUP to the process group: the file holds the parent's newest state."""
    signum = signal.Signals[signame]
    program = run(target, backend, "group")
    program.expect("READY")
    os.killpg(program.pid, signum)
    assert program.finish() == -signum, program.report()
    cp = target.load()
    assert cp.state == {"messages": messages(1, 50)}, program.report()
    assert (cp.meta.live, cp.meta.writer.pid) == (False, program.pid)
    check_workers(program, target)
    program.assert_nothing_foreign()
    target.assert_free()  # the holder is dead: its lock went with it


@pytest.mark.parametrize(
    ("backend", "target"),
    [("sync", "file"), ("sync", "postgres"), ("asyncio", "journal"), ("trio", "file")],
    indirect=["target"],
)
def test_fork_and_exit(run: Any, target: Target, backend: str) -> None:
    """os.fork(), the child exits (sys.exit, atexit): the parent's file and lock stay its own."""
    program = run(target, backend, "fork")
    check_then_finish(program, target)
    child_pid, status = (int(w) for w in program.said("CHILD").split())
    assert status == 0, program.report()
    assert program.said("CHILD-FLUSH") == "Skipped(reason='closed')"
    cp = target.load("child")  # a writer the child made itself works as usual
    assert (cp.state, cp.meta.live, cp.meta.writer.pid) == ({"n": 2}, False, child_pid)


@pytest.mark.parametrize("target", ["file", "postgres"], indirect=True)
def test_workers_do_not_keep_a_dead_parents_lock(run: Any, target: Target) -> None:
    """A SIGKILLed parent's key is free although its fork workers live on."""
    program = run(target, "sync", "orphans")
    program.expect("READY")
    workers = [int(p) for p in program.said("WORKERS").split()]
    os.kill(program.pid, signal.SIGKILL)
    program.proc.wait(HANG_GUARD)
    for pid in workers:
        os.kill(pid, 0)  # still there
    target.assert_free()
    cp = target.load()
    assert (cp.state, cp.meta.writer.pid) == ({"messages": messages(1, 5)}, program.pid)
    program.kill()
    program.assert_nothing_foreign()


# -- in this process: the lock objects --------------------------------------------


def in_child(body: Any) -> int:
    """Run ``body()`` in a forked child of this process; its exit status (0: it returned)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            body()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_file_lock_release_in_child(tmp_path: Path) -> None:
    """A forked child's release() of an inherited FileKeyLock neither unlocks nor unlinks."""
    path = str(tmp_path / "k.lock")
    lock = acquire_file_lock(path)
    try:
        assert in_child(lock.release) == 0
        assert os.path.exists(path)
        with pytest.raises(KeyLocked):
            acquire_file_lock(path)
    finally:
        lock.release()
    assert not os.path.exists(path)


class RecordingStore(FileStore):
    """A FileStore whose key locks append to ``root/released`` (pid, key) when released."""

    def lock(self, key: str, *, timeout: float = 0.0) -> Any:
        held, released = super().lock(key, timeout=timeout), Path(self.root) / "released"

        class Recording:
            def release(self) -> None:
                with open(released, "a") as f:
                    f.write(f"{os.getpid()} {key}\n")
                held.release()

        return Recording()


def test_a_writer_in_a_forked_child_never_releases_the_parents_locks(tmp_path: Path) -> None:
    """The child's copy of a writer lets go of no lock, whatever the store, at close or exit."""
    state = {"n": 1}
    writer = CheckpointWriter(lambda: Snapshot("a", dict(state)), RecordingStore(tmp_path))
    writer.open()

    def child() -> None:
        state["n"] = 2
        assert writer.flush_sync("exit") == Skipped("closed")
        assert writer.close() == Skipped("closed")
        atexit._run_exitfuncs()

    assert in_child(child) == 0
    assert not (tmp_path / "released").exists()
    assert isinstance(writer.close(), Written)
    assert (tmp_path / "released").read_text() == f"{os.getpid()} a\n"


def test_writer_opens_in_child_while_parent_registry_was_busy(tmp_path: Path) -> None:
    """A writer the child opens works though another thread held the exit-hook registry at fork."""
    store = FileStore(tmp_path / "root")

    def child() -> None:
        signal.alarm(10)  # hang guard: a deadlock on the inherited lock dies of SIGALRM
        with CheckpointWriter(lambda: Snapshot("c", {"pid": os.getpid()}), store):
            pass
        signal.alarm(0)

    with _exit._registry_lock:  # as if another thread were inside register() at the fork
        assert in_child(child) == 0
    cp = load(store, "c")
    assert cp is not None and cp.meta.live is False and cp.state["pid"] != os.getpid()


@pytest.mark.parametrize("held", ["_lock", "_witness_lock"])
def test_journal_writer_opens_in_child_while_a_commit_was_in_flight(
    tmp_path: Path, held: str
) -> None:
    """A child writer on an inherited JournalStore appends, though a commit held its locks."""
    store = JournalStore(tmp_path / "root")
    with CheckpointWriter(lambda: Snapshot("k", {"messages": ["m1"]}), store):
        pass
    assert store.statistics("k").size is not None  # the parent knows k's journal

    def child() -> None:
        signal.alarm(10)  # hang guard: a deadlock on the inherited lock dies of SIGALRM
        assert store.statistics("k").size is None  # the parent's tracks are not trusted here
        state = {"messages": ["c1", os.getpid()]}
        with CheckpointWriter(
            lambda: Snapshot("c", state),
            store,
            limits=Limits(exit_timeout=1.0),
        ) as writer:
            appends = store.statistics().appends
            state["messages"].append("c2")
            writer.notify()
            assert type(writer.flush_sync()).__name__ == "Written"
            assert store.statistics().appends == appends + 1  # not a compaction for a held lock
        signal.alarm(0)

    with getattr(store, held):  # as if the parent's worker thread were inside commit()
        assert in_child(child) == 0
    cp = load(store, "c")
    assert cp is not None and cp.meta.live is False
    assert cp.state["messages"][0] == "c1" and cp.state["messages"][2] == "c2"
