"""Group commit: writes into one directory share its fsync (``atomic.sync_dir``).

Threads, real directories, an injected fsync that can be held: every test
waits for states (a thread blocked in the fsync, N callers waiting), never
for a duration.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from checkpointer import FileStore
from checkpointer._stores import atomic
from checkpointer._stores.atomic import sync_dir, write_atomic
from checkpointer._stores.base import commit_deadline
from tests._support import HANG_GUARD

REAL_FSYNC = os.fsync  # the tests below may replace os.fsync


def until(condition: Callable[[], bool]) -> None:
    """Wait for ``condition`` (a hang guard, not a timing check)."""
    deadline = time.monotonic() + HANG_GUARD
    while not condition():
        assert time.monotonic() < deadline, "the state never came"
        time.sleep(0.001)


def waiting(directory: Path) -> int:
    """How many callers wait for ``directory``'s running fsync (0 if none runs)."""
    st = os.stat(directory)
    group = atomic._groups.get((st.st_dev, st.st_ino))
    running = None if group is None else group.running
    return 0 if running is None else len(running.gates)


class HeldFsync:
    """An fsync of directories that records each call and blocks the first until ``go``."""

    def __init__(self, fail_after_first: bool = False) -> None:
        self.calls: list[str] = []  # "start" / "end" of each directory fsync
        self.entered = threading.Event()
        self.go = threading.Event()
        self.fail_after_first = fail_after_first

    def __call__(self, fd: int) -> None:
        if not os.path.isdir(f"/proc/self/fd/{fd}"):
            return REAL_FSYNC(fd)
        first = not self.calls
        self.calls.append("start")
        if first:
            self.entered.set()
            assert self.go.wait(HANG_GUARD)
        elif self.fail_after_first:
            self.calls.append("failed")
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        REAL_FSYNC(fd)
        self.calls.append("end")
        return None


@pytest.fixture
def dir_fd(tmp_path: Path) -> Iterator[int]:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    yield fd
    os.close(fd)


def run(target: Callable[[], object], out: list[object]) -> threading.Thread:
    """``target`` in a thread; its result (or exception) appended to ``out``."""

    def body() -> None:
        try:
            out.append(target())
        except BaseException as exc:
            out.append(exc)

    thread = threading.Thread(target=body, daemon=True)  # one left wedged fails its test only
    thread.start()
    return thread


def test_a_lone_caller_fsyncs_at_once_and_leaves_no_group(tmp_path: Path, dir_fd: int) -> None:
    """No fsync running: the caller fsyncs itself, once; nothing of the group is kept."""
    calls: list[int] = []
    sync_dir(dir_fd, calls.append)
    assert calls == [dir_fd]
    assert waiting(tmp_path) == 0
    st = os.stat(tmp_path)
    assert (st.st_dev, st.st_ino) not in atomic._groups


def test_callers_during_an_fsync_share_the_next_one(tmp_path: Path, dir_fd: int) -> None:
    """Five callers while one fsync runs: they wait for it, then one more fsync covers all."""
    fsync = HeldFsync()
    results: list[object] = []
    leader = run(lambda: sync_dir(dir_fd, fsync), results)
    assert fsync.entered.wait(HANG_GUARD)
    followers = [run(lambda: sync_dir(dir_fd, fsync), results) for _ in range(5)]
    until(lambda: waiting(tmp_path) == 5)
    assert results == []  # none returns before an fsync begun after it has ended
    fsync.go.set()
    for thread in (leader, *followers):
        thread.join(HANG_GUARD)
    assert results == [None] * 6
    assert fsync.calls == ["start", "end", "start", "end"]  # two fsyncs for six callers
    assert waiting(tmp_path) == 0


def test_an_fsync_error_fails_every_caller_of_its_batch_once(tmp_path: Path, dir_fd: int) -> None:
    """The shared fsync fails: each of its callers gets an EIO of its own; none is retried."""
    fsync = HeldFsync(fail_after_first=True)
    results: list[object] = []
    leader = run(lambda: sync_dir(dir_fd, fsync), results)
    assert fsync.entered.wait(HANG_GUARD)
    followers = [run(lambda: sync_dir(dir_fd, fsync), results) for _ in range(4)]
    until(lambda: waiting(tmp_path) == 4)
    fsync.go.set()
    for thread in (leader, *followers):
        thread.join(HANG_GUARD)
    errors = [r for r in results if isinstance(r, OSError)]
    assert results.count(None) == 1  # the first batch's own caller
    assert len(errors) == 4 and all(e.errno == errno.EIO for e in errors)
    assert len({id(e) for e in errors}) == 4  # raised in four threads: four objects
    assert fsync.calls == ["start", "end", "start", "failed"]


def test_a_caller_past_its_deadline_stops_waiting(tmp_path: Path, dir_fd: int) -> None:
    """An exit flush's deadline bounds the wait for another thread's fsync: TimeoutError."""
    fsync = HeldFsync()
    results: list[object] = []
    leader = run(lambda: sync_dir(dir_fd, fsync), results)
    assert fsync.entered.wait(HANG_GUARD)
    try:
        with commit_deadline(0.0), pytest.raises(TimeoutError):
            sync_dir(dir_fd, fsync)
    finally:
        fsync.go.set()
        leader.join(HANG_GUARD)
    assert results == [None]


def test_concurrent_filestore_writes_share_one_directory_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight keys written while a write's directory fsync runs: eight file fsyncs, one more
    of the directory, and every file on disk with its bytes."""
    store = FileStore(tmp_path / "root")
    store.write("warm", [b"{}"], revision="r0", expected=None)  # the root and its parents
    root_ino = os.stat(store.root).st_ino
    fsync = HeldFsync()
    files: list[str] = []

    def counting(fd: int) -> None:
        st = os.fstat(fd)
        if st.st_ino == root_ino:
            fsync(fd)
        else:
            files.append(os.readlink(f"/proc/self/fd/{fd}"))
            REAL_FSYNC(fd)

    monkeypatch.setattr(os, "fsync", counting)
    results: list[object] = []

    def write(key: str) -> Callable[[], int]:
        return lambda: store.write(key, [key.encode()], revision="r1", expected=None)

    first = run(write("k0"), results)
    assert fsync.entered.wait(HANG_GUARD)
    others = [run(write(f"k{i}"), results) for i in range(1, 9)]
    until(lambda: waiting(tmp_path / "root") == 8)
    fsync.go.set()
    for thread in (first, *others):
        thread.join(HANG_GUARD)
    assert len(results) == 9 and all(isinstance(r, int) for r in results), results
    assert fsync.calls == ["start", "end", "start", "end"]
    assert len(files) == 9
    for i in range(9):
        assert store.read(f"k{i}") == f"k{i}".encode()


def test_a_forked_child_writes_while_its_parent_is_in_a_batch(tmp_path: Path, dir_fd: int) -> None:
    """fork while a thread leads a batch and another holds the group's lock: the child's
    own write into that directory completes (it does not wait for threads it lacks)."""
    fsync = HeldFsync()
    results: list[object] = []
    leader = run(lambda: sync_dir(dir_fd, fsync), results)
    assert fsync.entered.wait(HANG_GUARD)
    st = os.stat(tmp_path)
    group = atomic._groups[st.st_dev, st.st_ino]
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with group.lock:
            held.set()
            release.wait(HANG_GUARD)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(HANG_GUARD)
    try:
        pid = os.fork()
        if pid == 0:  # the child: one write into the same directory, then out
            code = 1
            try:
                write_atomic(str(tmp_path / "child.json"), [b"child"])
                code = 0
            finally:
                os._exit(code)
        status = wait_child(pid)
    finally:
        release.set()
        fsync.go.set()
        holder.join(HANG_GUARD)
        leader.join(HANG_GUARD)
    assert status == 0
    assert (tmp_path / "child.json").read_bytes() == b"child"


def wait_child(pid: int) -> int | None:
    """The child's exit code, or None if it is still running after the hang guard (killed)."""
    deadline = time.monotonic() + min(HANG_GUARD, 20.0)
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return None


def test_a_signal_handler_on_the_leading_thread_fsyncs_by_itself(
    tmp_path: Path, dir_fd: int
) -> None:
    """A signal lands on the thread that leads the batch, in its fsync (an exit flush from
    SIGTERM): the handler's own ``sync_dir`` fsyncs by itself, never waiting on its thread."""
    calls: list[str] = []
    outcome: list[object] = []

    def handler(signum: int, frame: object) -> None:
        try:
            with commit_deadline(HANG_GUARD):  # bounds the old wait on its own batch
                sync_dir(dir_fd, lambda fd: calls.append("handler"))
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    def fsync(fd: int) -> None:
        calls.append("leader")
        os.kill(os.getpid(), signal.SIGUSR1)  # handled on this thread as the call returns

    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        sync_dir(dir_fd, fsync)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert outcome == [None]
    assert calls == ["leader", "handler"]
    assert waiting(tmp_path) == 0


def _interrupted_at(step: int) -> Callable[[Any, str, object], None]:
    """A profile function raising KeyboardInterrupt at the ``step``-th point of atomic.py
    where a signal handler can run: a function's entry, a C call's return."""
    seen = [0]

    def profile(frame: Any, event: str, arg: object) -> None:
        if event in ("call", "c_return") and frame.f_code.co_filename == atomic.__file__:
            seen[0] += 1
            if seen[0] == step:
                raise KeyboardInterrupt

    return profile


def _interrupt_once(directory: Path, role: str, step: int) -> bool:
    """``sync_dir`` on ``directory`` interrupted at ``step`` (if it gets that far), then
    another thread's write into it; whether the interrupt came."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    fsync, results, gone = HeldFsync(), list[object](), threading.Event()
    threads = []
    if role == "waiter":  # another thread leads; it ends once this one waits (or is gone)
        threads.append(run(lambda: sync_dir(fd, fsync), results))
        assert fsync.entered.wait(HANG_GUARD)

        def release() -> None:  # once this thread waits for it, or is gone
            until(lambda: waiting(directory) > 0 or gone.is_set())
            fsync.go.set()

        threads.append(run(release, results))
    else:
        fsync.go.set()
    sys.setprofile(_interrupted_at(step))
    try:
        sync_dir(fd)
        interrupted = False
    except KeyboardInterrupt:
        interrupted = True
    finally:
        sys.setprofile(None)
        gone.set()
    other = run(lambda: write_atomic(str(directory / "other.json"), [b"other"]), results)
    for thread in (other, *threads):
        thread.join(HANG_GUARD)
    os.close(fd)
    assert not other.is_alive(), f"interrupted at step {step}: the directory is wedged"
    assert (directory / "other.json").read_bytes() == b"other"
    assert atomic._inside == {}
    return interrupted


@pytest.mark.parametrize("role", ["leader", "waiter"])
def test_an_interrupt_anywhere_in_sync_dir_leaves_the_directory_usable(
    tmp_path: Path, role: str
) -> None:
    """Ctrl-C at each point of a ``sync_dir`` (leading its batch, or waiting for another
    thread's): once the call is gone, another thread's write into the directory completes."""
    step = 0
    while True:
        step += 1
        directory = tmp_path / str(step)
        directory.mkdir()
        if not _interrupt_once(directory, role, step):
            break
    assert step > 5  # the points were reached


def test_a_write_retried_after_its_directory_fsync_failed_is_written_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The directory's fsync fails after the rename; the caller retries the same revision:
    the store writes it again (a new file, fsynced, renamed, the directory fsynced), never
    calling it durable on a second fsync of the directory alone."""
    store = FileStore(tmp_path / "root")
    store.write("k", [b"seed"], revision="r0", expected=None)
    calls: list[str] = []

    def fsync(fd: int) -> None:
        kind = "dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "file"
        calls.append(kind)
        if calls == ["file", "dir"]:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        REAL_FSYNC(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError, match="Input/output"):
        store.write("k", [b"hello"], revision="r1", expected="r0")
    assert store.revision("k") == "r1"  # in place, not known durable
    store.write("k", [b"hello"], revision="r1", expected="r0")
    assert calls == ["file", "dir", "file", "dir"]
    assert store.read("k") == b"hello"
