"""Exit hooks, for real: child processes, real signals, real files.

Each signal case runs ``tests/children/exit_child.py`` twice, side by side:
with the writer, and the same program with ``--no-writer`` (the control).
The writer must not change the exit status; the file must hold the last
state the child notified, ``live=False``, and no temp file may be left.
The children of all selected cases run a few at a time, at the first test
that needs one (they mostly wait).  The 30 s timeouts are hang guards only,
never timing assertions.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from checkpointer import (
    Checkpoint,
    CheckpointWriter,
    Failed,
    FileStore,
    Skipped,
    Snapshot,
    Written,
    load,
)
from tests._support import CHILDREN, HANG_GUARD, Pumped

CHILD = CHILDREN / "exit_child.py"
KEY = "s1"
SIGNALS = {"TERM": signal.SIGTERM, "HUP": signal.SIGHUP, "INT": signal.SIGINT}
# The last state the child notifies before READY, by the writer's state then.
LAST = {"idle": 42, "pending": 42, "inflight": 43}


class Child(Pumped):
    """One run of the child program; threads drain its pipes so they never fill."""

    def __init__(self, workdir: Path, *args: str) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.root = workdir / "root"
        self.go = workdir / "go"
        super().__init__([sys.executable, str(CHILD), str(self.root), str(self.go), *args])

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    @property
    def stderr(self) -> str:
        return "".join(self.err)

    def wait_for(self, marker: str) -> None:
        self.wait_line(lambda line: line == marker, marker)

    def finish(self) -> None:
        try:
            self.proc.wait(HANG_GUARD)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"hang guard: the child did not end\n{self.report()}")
        for pump in self.pumps:
            pump.join(HANG_GUARD)

    def said(self, word: str) -> list[str]:
        """The words after ``word`` on the first stdout line that starts with it."""
        for line in self.out:
            parts = line.split()
            if parts and parts[0] == word:
                return parts[1:]
        raise AssertionError(f"the child never said {word!r}\n{self.report()}")


@dataclass(frozen=True)
class Case:
    """One run: the child's options, the signal sent after READY, what follows.

    With ``survive`` the test waits (hang guard) for the signal flush to mark
    the file not live, notes it, then lets the child carry on (GO).
    ``control`` runs the program without the writer too: with ``control_args``
    if given (cases that differ only in what the writer does share one).
    """

    args: tuple[str, ...]
    sig: str | None = None
    survive: bool = False
    control: bool = True
    control_args: tuple[str, ...] | None = None

    def __str__(self) -> str:
        return "-".join(self.args[1::2])

    def opt(self, name: str) -> str:
        return self.args[self.args.index(name) + 1]

    @property
    def signum(self) -> int:
        assert self.sig is not None
        return SIGNALS[self.sig]

    @property
    def control_key(self) -> tuple[tuple[str, ...], str | None, bool]:
        return (self.control_args or self.args, self.sig, self.survive)


@dataclass
class Ran:
    """What a case left: the ended child, its control, the file at the signal flush."""

    child: Child
    control: Child | None
    at_signal: Checkpoint[Any] | None

    @property
    def ctrl(self) -> Child:
        assert self.control is not None, "this case ran no control"
        return self.control


Runs = Callable[[Case], Ran]


def drive(one: Child, case: Case, *, note: bool) -> Checkpoint[Any] | None:
    """READY, the signal, GO if it should survive; the file at the signal flush if ``note``."""
    at_signal = None
    if case.sig is not None:
        one.wait_for("READY")
        one.proc.send_signal(case.signum)
        if case.survive:
            if note:
                at_signal = wait_not_live(one)
            one.go.touch()
    one.finish()
    return at_signal


def wait_not_live(child: Child) -> Checkpoint[Any]:
    """Wait (hang guard only) for the signal flush; the file then, the child still alive."""
    deadline = time.monotonic() + HANG_GUARD
    while time.monotonic() < deadline:
        cp = load(FileStore(child.root), KEY)
        if cp is not None and cp.meta.live is False:
            assert child.proc.poll() is None, child.report()
            return cp
        time.sleep(0.01)
    child.kill()
    pytest.fail(f"hang guard: the signal was never flushed\n{child.report()}")


@pytest.fixture(scope="module")
def runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Runs]:
    """Every selected case of this module, run a few at a time; a test awaits its own."""
    cases: list[Case] = []
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        case = callspec.params.get("case") if callspec is not None else None
        if isinstance(case, Case) and case not in cases:
            cases.append(case)
    spawned: list[Child] = []
    mktemp_lock = threading.Lock()  # TempPathFactory is not thread-safe

    def start(
        case: Case, args: tuple[str, ...], note: bool
    ) -> tuple[Child, Checkpoint[Any] | None]:
        with mktemp_lock:
            root = tmp_path_factory.mktemp(str(case))
        one = Child(root, *args)
        spawned.append(one)
        return one, drive(one, case, note=note)

    with ThreadPoolExecutor(max_workers=4) as pool:
        children: dict[Case, Future[tuple[Child, Checkpoint[Any] | None]]] = {}
        controls: dict[object, Future[tuple[Child, Checkpoint[Any] | None]]] = {}
        for case in cases:  # each control right after its first child
            children[case] = pool.submit(start, case, case.args, True)
            if case.control and case.control_key not in controls:
                control_args = (*case.control_key[0], "--no-writer")
                controls[case.control_key] = pool.submit(start, case, control_args, False)

        def get(case: Case) -> Ran:
            child, at_signal = children[case].result(timeout=10 * HANG_GUARD)
            control = controls[case.control_key].result()[0] if case.control else None
            return Ran(child, control, at_signal)

        yield get
        for one in spawned:  # a hang guard fired: do not leave it running
            one.kill()


def final(root: Path) -> Checkpoint[Any]:
    """The checkpoint on disk; asserts no temp file is left beside it."""
    assert [p.name for p in root.iterdir() if p.name.startswith(".")] == []
    cp = load(FileStore(root), KEY)
    assert cp is not None, f"no checkpoint in {root}"
    return cp


def assert_flushed(child: Child, n: int) -> None:
    cp = final(child.root)
    assert cp.state == {"n": n}, child.report()
    assert cp.meta.live is False, child.report()


def cases(
    *args: tuple[str, ...], sig: str | None = None, survive: bool = False, control: bool = True
) -> list[Case]:
    """Cases of these options; the signal is the one ``--signal`` names, else ``sig``."""
    return [
        Case(a, a[a.index("--signal") + 1] if "--signal" in a else sig, survive, control)
        for a in args
    ]


# -- the default action: flush, then die of the signal ---------------------------


@pytest.mark.parametrize(
    "case",
    [
        Case(
            ("--signal", sig, "--backend", backend, "--state", state),
            sig,
            # One control per signal and backend: without the writer, the state is moot.
            control_args=("--signal", sig, "--backend", backend, "--state", "pending"),
        )
        for sig in ("TERM", "HUP")
        for backend in ("asyncio", "trio", "uvloop", "sync")
        for state in ("idle", "pending", "inflight")
    ],
    ids=str,
)
def test_signal_flushes_then_dies_of_it(runs: Runs, case: Case) -> None:
    """SIGTERM/SIGHUP, default action: the last state lands live=False, then death by the signal."""
    r = runs(case)
    assert r.ctrl.returncode == -case.signum, r.ctrl.report()
    assert r.child.returncode == -case.signum, r.child.report()
    assert_flushed(r.child, LAST[case.opt("--state")])
    if case.opt("--state") == "inflight":  # the flush began while the worker was writing
        assert "OVERLAP\n" in r.child.out, r.child.report()


@pytest.mark.parametrize(
    "case",
    [
        Case(("--signal", "INT", "--backend", b), "INT")
        for b in ("asyncio", "trio", "uvloop", "sync")
    ],
    ids=str,
)
def test_sigint_unwinds_through_the_writer(runs: Runs, case: Case) -> None:
    """Ctrl-C: the runner's own SIGINT handling is kept, the writer's exit writes, same status."""
    r = runs(case)
    assert r.child.returncode == r.ctrl.returncode, r.child.report()
    assert "KeyboardInterrupt" in r.child.stderr
    assert r.child.said("HANDLERS")[2] == r.ctrl.said("HANDLERS")[2]  # SIGINT left alone
    assert_flushed(r.child, 42)


# -- a handler found before the writer, or installed after it ---------------------


@pytest.mark.parametrize(
    "case",
    cases(
        ("--signal", "TERM", "--backend", "asyncio", "--before", "ignore"),
        ("--signal", "HUP", "--backend", "trio", "--before", "ignore"),
        ("--signal", "TERM", "--backend", "sync", "--before", "ignore"),
        survive=True,
    ),
    ids=str,
)
def test_ignored_signal_is_flushed_and_still_ignored(runs: Runs, case: Case) -> None:
    """SIG_IGN before (nohup): the signal flushes live=False; the process lives on and ends well."""
    r = runs(case)
    assert r.ctrl.returncode == 0, r.ctrl.report()
    assert r.child.returncode == 0, r.child.report()
    assert r.at_signal is not None and r.at_signal.state == {"n": 42}
    assert "SURVIVED\n" in r.child.out
    assert_flushed(r.child, 43)  # the change made after the signal, written at the end


@pytest.mark.parametrize(
    "case",
    cases(
        ("--signal", "TERM", "--backend", "asyncio", "--before", "exit7"),
        ("--signal", "HUP", "--backend", "uvloop", "--before", "exit7"),
        ("--signal", "HUP", "--backend", "sync", "--before", "exit7"),
    ),
    ids=str,
)
def test_previous_python_handler_runs_after_the_flush(runs: Runs, case: Case) -> None:
    """A Python handler found before the writer still runs (it exits 7) after the flush."""
    r = runs(case)
    assert r.ctrl.returncode == 7, r.ctrl.report()
    assert r.child.returncode == 7, r.child.report()
    assert r.child.said("PREV") == [f"SIG{case.sig}"]
    assert_flushed(r.child, 42)


@pytest.mark.parametrize(
    "case",
    cases(
        ("--signal", "TERM", "--backend", "asyncio", "--after", "chain"),
        ("--signal", "HUP", "--backend", "trio", "--after", "chain"),
        ("--signal", "TERM", "--backend", "sync", "--after", "chain"),
    ),
    ids=str,
)
def test_app_handler_installed_after_the_writer_chains_to_it(runs: Runs, case: Case) -> None:
    """An application handler set over ours and chaining down: it runs, we flush, default death."""
    r = runs(case)
    assert r.ctrl.returncode == -case.signum, r.ctrl.report()
    assert r.child.returncode == -case.signum, r.child.report()
    assert r.child.said("APP") == [f"SIG{case.sig}"]
    assert_flushed(r.child, 42)


@pytest.mark.parametrize(
    "case",
    cases(
        ("--scenario", "reopen", "--backend", "asyncio", "--after", "chain"),
        ("--scenario", "reopen", "--backend", "sync", "--after", "chain"),
        sig="TERM",
    ),
    ids=str,
)
def test_writer_reopened_under_a_chaining_app_handler(runs: Runs, case: Case) -> None:
    """Writer, app handler over it, close, new writer: one pass down the chain, no loop."""
    r = runs(case)
    assert r.ctrl.returncode == -signal.SIGTERM, r.ctrl.report()
    assert r.child.returncode == -signal.SIGTERM, r.child.report()
    assert r.child.out.count("APP SIGTERM\n") == 1, r.child.report()
    assert_flushed(r.child, 42)


@pytest.mark.parametrize(
    "case",
    cases(
        ("--scenario", "closed", "--backend", "asyncio", "--after", "none"),
        ("--scenario", "closed", "--backend", "trio", "--after", "chain"),
        ("--scenario", "closed", "--backend", "sync", "--after", "none"),
        ("--scenario", "closed", "--backend", "sync", "--after", "chain"),
        sig="TERM",
    ),
    ids=str,
)
def test_closed_writer_restores_handlers(runs: Runs, case: Case) -> None:
    """After close the handlers are what the program alone has; SIGTERM kills by default."""
    r = runs(case)
    assert r.ctrl.returncode == -signal.SIGTERM, r.ctrl.report()
    assert r.child.returncode == -signal.SIGTERM, r.child.report()
    assert r.child.said("HANDLERS") == r.ctrl.said("HANDLERS")
    assert_flushed(r.child, 42)  # from close; the change made after close is not written


# -- atexit, sync writer ----------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    cases(
        ("--scenario", "atexit", "--backend", "sync", "--exit-code", "0"),
        ("--scenario", "atexit", "--backend", "sync", "--exit-code", "3"),
        control=False,
    ),
    ids=str,
)
def test_atexit_flushes_an_unclosed_sync_writer(runs: Runs, case: Case) -> None:
    """A script that opens, notifies and returns (or sys.exit(3)) without close: atexit writes."""
    r = runs(case)
    assert r.child.returncode == int(case.opt("--exit-code")), r.child.report()
    assert_flushed(r.child, 42)


# -- a signal during a write -------------------------------------------------------

SELF_KILL = Case(("--scenario", "self-kill", "--backend", "sync"), control=False)


@pytest.mark.parametrize("case", [SELF_KILL], ids=str)
def test_signal_during_a_main_thread_write_is_handled_after_it(runs: Runs, case: Case) -> None:
    """SIGTERM inside the store's write on the main thread: no deadlock, newest state, -15."""
    r = runs(case)
    assert r.child.returncode == -signal.SIGTERM, r.child.report()
    assert "KILL\n" in r.child.out
    assert "ALIVE\n" not in r.child.out
    assert_flushed(r.child, 43)


@pytest.mark.parametrize(
    "case",
    cases(
        ("--scenario", "overtake", "--backend", "asyncio", "--before", "ignore"),
        ("--scenario", "overtake", "--backend", "trio", "--before", "ignore"),
        control=False,
    ),
    ids=str,
)
def test_signal_flush_overtaking_a_prepared_write_is_not_undone(runs: Runs, case: Case) -> None:
    """A signal flush (SIG_IGN kept) overtaking a snapshotted write: the older one is dropped."""
    r = runs(case)
    assert r.child.returncode == 0, r.child.report()
    assert r.child.said("RESULT") == ["Skipped(reason='unchanged')"]
    assert r.child.said("ONDISK") == ["43", "False"]
    assert_flushed(r.child, 43)


@pytest.mark.parametrize(
    "case",
    cases(
        *[
            (
                "--scenario",
                "late-write",
                "--backend",
                b,
                "--before",
                "ignore",
                "--exit-timeout",
                "0.2",
            )
            for b in ("asyncio", "trio")
        ],
        sig="TERM",
        control=False,
    ),
    ids=str,
)
def test_late_worker_write_does_not_replace_the_signal_flush(runs: Runs, case: Case) -> None:
    """A worker write outlasting exit_timeout (SIG_IGN kept) must not land over the newer flush."""
    r = runs(case)
    assert r.child.returncode == 0, r.child.report()
    assert "LATE\n" in r.child.out
    assert r.child.said("ONDISK") == ["43", "False"]
    assert_flushed(r.child, 43)


# -- flush_sync, in this process (no signal is sent) -------------------------------


class Counter:
    """The session: ``{"n": n}`` under KEY."""

    def __init__(self) -> None:
        self.n = 0

    def snapshot(self) -> Snapshot:
        return Snapshot(KEY, {"n": self.n})


def test_flush_sync_is_idempotent_across_exit_signal_close(tmp_path: Path) -> None:
    """flush_sync("exit"), flush_sync("signal"), close(): one write, then Skipped; hooks undone."""
    before = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)]
    session = Counter()
    writer = CheckpointWriter(session.snapshot, FileStore(tmp_path), write_on_start=False)
    writer.open()
    try:
        assert [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)] != before
        session.n = 42
        writer.notify()
        assert isinstance(writer.flush_sync("exit"), Written)
        assert writer.flush_sync("signal") == Skipped("unchanged")
    finally:
        assert writer.close() == Skipped("unchanged")
    assert writer.flush_sync("exit") == Skipped("closed")
    assert writer.flush_sync("manual") == Skipped("closed")
    assert [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)] == before
    cp = final(tmp_path)
    assert (cp.state, cp.meta.live, cp.meta.seq) == ({"n": 42}, False, 1)


def test_flush_sync_manual_keeps_the_checkpoint_live(tmp_path: Path) -> None:
    """flush_sync("manual") writes live=True; a later "exit" flush of the same state: live=False."""
    session = Counter()
    with CheckpointWriter(session.snapshot, FileStore(tmp_path), exit_hooks=False) as writer:
        session.n = 42
        writer.notify()
        assert isinstance(writer.flush_sync("manual"), Written)
        cp = final(tmp_path)
        assert (cp.state, cp.meta.live) == ({"n": 42}, True)
        assert isinstance(writer.flush_sync("exit"), Written)
        cp = final(tmp_path)
        assert (cp.state, cp.meta.live) == ({"n": 42}, False)


def test_flush_sync_never_raises_for_a_failed_write(tmp_path: Path) -> None:
    """A root under a regular file (ENOTDIR): flush_sync and close return Failed, never raise."""
    (tmp_path / "file").write_text("not a directory")
    session = Counter()
    store = FileStore(tmp_path / "file" / "root")
    writer = CheckpointWriter(session.snapshot, store, exit_hooks=False).open()
    session.n = 42
    writer.notify()
    result = writer.flush_sync("signal")
    assert isinstance(result, Failed), result
    assert result.reason == "write-failed"
    assert isinstance(writer.close(), Failed)


def test_ctrl_c_in_one_exit_flush_flushes_the_others_then_raises(tmp_path: Path) -> None:
    """A KeyboardInterrupt in one writer's exit flush: the others still flush, then it is raised."""
    from checkpointer import _exit

    store = FileStore(tmp_path)
    states = [{"n": 0, "final": False} for _ in range(5)]

    def source_of(i: int) -> Callable[[], Snapshot]:
        def source() -> Snapshot:
            if i == 2 and states[i]["final"]:
                raise KeyboardInterrupt  # Ctrl-C pressed again during the exit flush
            return Snapshot(f"s{i}", {"n": states[i]["n"]})

        return source

    writers = [CheckpointWriter(source_of(i), store).open() for i in range(5)]
    try:
        for st in states:
            st["n"], st["final"] = 1, True
        with pytest.raises(KeyboardInterrupt):
            _exit._flush_all_at_exit()
        for i in (0, 1, 3, 4):
            cp = load(store, f"s{i}")
            assert cp is not None
            assert (cp.state["n"], cp.meta.live) == (1, False), i
    finally:
        states[2]["final"] = False
        for w in writers:
            w.close()


@pytest.mark.anyio
async def test_aclose_does_not_scan_atexit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A close never calls atexit.register/unregister (it scans every callback: quadratic)."""
    import atexit

    calls: list[str] = []
    monkeypatch.setattr(atexit, "register", lambda fn, *a, **k: calls.append("register"))
    monkeypatch.setattr(atexit, "unregister", lambda fn: calls.append("unregister"))
    for i in range(3):
        state = {"n": i}
        key = f"s{i}"

        def source(key: str = key, state: dict[str, int] = state) -> Snapshot:
            return Snapshot(key, state)

        async with CheckpointWriter(source, FileStore(tmp_path), exit_hooks=False):
            pass
    assert calls == []
