"""Disk faults: a full filesystem, failing write/fsync/rename, a root that changes underneath.

In every case the write is a ``Failed`` value, the old checkpoint stays
whole and loadable, no temp file is left, retries back off on virtual time
(counted, so a busy loop would show), writing recovers once the fault is
gone, and nothing is raised into the agent's code.

ENOSPC is real: a tmpfs of 2 MiB and a loop-mounted ext4 of 8 MiB, filled
with a ballast file.  Mounting needs root (``CAP_SYS_ADMIN``); where it is
not allowed those cases are skipped with the reason.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from checkpointer import (
    CheckpointError,
    CheckpointWriter,
    Failed,
    FileStore,
    JournalStore,
    Limits,
    Snapshot,
    Written,
    load,
)
from checkpointer._stores.atomic import write_atomic
from checkpointer._stores.base import landed
from tests.conftest import FakeClock, FaultyStore

KEY = "s1"
BIG = "x" * 300_000  # a message that does not fit in what a full filesystem has left


class Session:
    """An agent session: a list of messages under KEY."""

    def __init__(self) -> None:
        self.messages: list[dict[str, str]] = [{"role": "user", "content": "hello"}]

    def add(self, content: str = "more") -> None:
        self.messages.append({"role": "assistant", "content": content})

    def snapshot(self) -> Snapshot:
        return Snapshot(KEY, {"messages": list(self.messages)})


def entries(root: Path) -> list[str]:
    """The names in ``root``, but the key's lock file (held while a writer is open)."""
    return sorted(name for name in os.listdir(root) if not name.endswith(".lock"))


def loaded_state(store: FileStore) -> Any:
    cp = load(store, KEY)
    assert cp is not None
    return cp.state


# -- the faults ------------------------------------------------------------------------


@dataclass
class Fault:
    """A store, a way to break it, a way to mend it, and the error a failure names."""

    store: FaultyStore
    inject: Callable[[], None]
    clear: Callable[[], None]
    error: str


def mount(kind: str, where: Path, scratch: Path) -> None:
    """Mount a small filesystem at ``where``, or skip the test saying why not."""
    where.mkdir()
    if kind == "tmpfs":
        command = ["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(where)]
    else:
        if shutil.which("mkfs.ext4") is None:
            pytest.skip("no mkfs.ext4 on this machine: cannot make a loop-mounted ext4")
        image = scratch / "ext4.img"
        with open(image, "wb") as f:
            f.truncate(8 << 20)
        made = subprocess.run(
            ["mkfs.ext4", "-q", "-F", "-m", "0", str(image)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if made.returncode != 0:
            pytest.skip(f"mkfs.ext4 failed: {made.stderr.strip()}")
        command = ["mount", "-o", "loop", str(image), str(where)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        pytest.skip("no mount command: cannot mount a small filesystem for ENOSPC")
    if done.returncode != 0:
        pytest.skip(
            f"{kind} for a real ENOSPC: {' '.join(command)} is not permitted here "
            f"({done.stderr.strip() or done.returncode}); the FaultyStore cases still run"
        )


def fill(path: Path) -> None:
    """Write ``path`` until the filesystem is full, to the last byte it takes."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 20, 4096, 1):
            block = b"\0" * size
            try:
                while True:
                    os.write(fd, block)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
        os.fsync(fd)
    finally:
        os.close(fd)


def unfill(path: Path) -> None:
    """Remove the ballast and commit, so the space is free for the next write."""
    path.unlink()
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


FAULTS = ["enospc-tmpfs", "enospc-ext4", "write", "fsync", "replace"]


@pytest.fixture(params=FAULTS)
def fault(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> Iterator[Fault]:
    """Each way a write can fail: a really full filesystem, or FaultyStore's injected errors."""
    name = str(request.param)
    if name.startswith("enospc-"):
        mnt = tmp_path / "mnt"
        mount(name.removeprefix("enospc-"), mnt, tmp_path)
        try:
            store = FaultyStore(mnt / "root", clock=clock)
            ballast = mnt / "ballast"
            yield Fault(store, lambda: fill(ballast), lambda: unfill(ballast), "No space left")
        finally:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)
        return
    store = FaultyStore(tmp_path / "root", fail_at=name, clock=clock)

    def inject() -> None:
        store.failing = True

    def clear() -> None:
        store.failing = False

    text = "No space left" if name == "write" else "Input/output error"
    yield Fault(store, inject, clear, text)


# -- a failing store, async -----------------------------------------------------------------


@pytest.mark.anyio
async def test_fault_fails_backs_off_and_recovers(
    fault: Fault, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Failed values, old file intact, no temps, 7 attempts in 30 s (backoff), then recovery."""
    caplog.set_level(logging.INFO, logger="checkpointer")
    store = fault.store
    root = Path(store.root)
    session = Session()
    writer = CheckpointWriter(
        session.snapshot,
        store,
        clock=clock,
        debounce=0.0,
        min_interval=0.0,
        max_wait=1.0,
        limits=Limits(retry_initial=1.0, retry_max=8.0),
        exit_hooks=False,
    )
    async with writer:
        good = Path(store.location(KEY)).read_bytes()
        before = loaded_state(store)
        fault.inject()
        session.add(BIG)
        writer.notify()
        await clock.advance(30.0)
        # The start write at 0, the change at 0, then retries 1, 2, 4, 8, 8, ... s apart.
        assert store.attempt_times == [0.0, 0.0, 1.0, 3.0, 7.0, 15.0, 23.0]
        result = await writer.write_now()  # the agent asks: an answer, not an exception
        assert isinstance(result, Failed), result
        assert result.reason == "write-failed"
        assert store.location(KEY) in result.error
        assert fault.error in result.error
        stats = writer.statistics()
        assert (stats.writes, stats.failures, stats.failure_streak) == (1, 7, 7)
        assert stats.pending
        assert Path(store.location(KEY)).read_bytes() == good
        assert loaded_state(store) == before
        assert entries(root) == [f"{KEY}.json"]  # no temp file left by any attempt
        fault.clear()
        await clock.advance(60.0)
        assert store.attempt_times[7:] == [30.0, 38.0]  # write_now, then 8 s after it
        stats = writer.statistics()
        assert (stats.writes, stats.failure_streak, stats.pending) == (2, 0, False)
        assert loaded_state(store) == session.snapshot().state
    cp = load(store, KEY)
    assert cp is not None and cp.meta.live is False and cp.meta.seq == 3
    assert entries(root) == [f"{KEY}.json"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings  # once per streak, not once per attempt
    assert fault.error in warnings[0]
    assert any("works again after 7 failures" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_fault_on_the_sync_path_is_a_value(fault: Fault) -> None:
    """flush_sync and close under a fault return Failed, keep the old file, then recover."""
    store = fault.store
    session = Session()
    writer = CheckpointWriter(session.snapshot, store, exit_hooks=False).open()
    good = Path(store.location(KEY)).read_bytes()
    fault.inject()
    session.add(BIG)
    writer.notify()
    for reason in ("manual", "exit", "signal"):
        result = writer.flush_sync(reason)
        assert isinstance(result, Failed) and fault.error in result.error, result
    assert Path(store.location(KEY)).read_bytes() == good
    assert entries(Path(store.root)) == [f"{KEY}.json"]
    fault.clear()
    assert isinstance(writer.flush_sync(), Written)
    assert isinstance(writer.close(), Written)
    assert loaded_state(store) == session.snapshot().state


@pytest.mark.parametrize("fs", ["tmpfs", "ext4"])
def test_journal_on_a_full_filesystem(tmp_path: Path, fs: str) -> None:
    """The journal, disk full mid-append: Failed, the journal loads as before, then recovers."""
    mnt = tmp_path / "mnt"
    mount(fs, mnt, tmp_path)
    try:
        root = mnt / "root"
        store = JournalStore(root)
        session = Session()
        writer = CheckpointWriter(session.snapshot, store, exit_hooks=False).open()
        session.add("appended")
        assert isinstance(writer.flush_sync(), Written)
        before = loaded_state(store)
        fill(mnt / "ballast")
        session.add(BIG)
        for _ in range(2):  # the append, then the rewrite that follows a broken append
            result = writer.flush_sync()
            assert isinstance(result, Failed) and "No space left" in result.error, result
            cp = load(store, KEY)
            assert cp is not None and cp.state == before and cp.torn is None
            assert entries(root) == [f"{KEY}.jsonl"]  # no temp file, no partial append
        unfill(mnt / "ballast")
        assert isinstance(writer.flush_sync(), Written)
        assert isinstance(writer.close(), Written)
        cp = load(JournalStore(root), KEY)  # as the next process reads it
        assert cp is not None and cp.state == session.snapshot().state and cp.torn is None
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)


# -- the root and the file changing underneath ----------------------------------------------


@pytest.mark.anyio
async def test_root_that_is_a_regular_file_fails_until_it_is_a_directory(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A root path holding a regular file: Failed naming it, the file untouched; then recovery."""
    root = tmp_path / "root"
    root.write_bytes(b"not a directory")
    session = Session()
    store = FaultyStore(root, clock=clock)
    async with CheckpointWriter(
        session.snapshot, store, clock=clock, limits=Limits(retry_initial=1.0), exit_hooks=False
    ) as writer:
        session.add()
        result = await writer.write_now()
        assert isinstance(result, Failed) and result.reason == "write-failed"
        assert str(root) in result.error
        assert "File exists" in result.error or "Not a directory" in result.error
        writer.notify()  # the agent goes on changing the session
        await clock.advance(10.0)
        # The start write and write_now at 0, retries at 2 and 6 (backoff 2, 4 s), none since.
        assert writer.statistics().failures == 4
        assert root.read_bytes() == b"not a directory"
        assert entries(tmp_path) == ["root"]
        root.unlink()
        await clock.advance(13.9)
        assert writer.statistics().failures == 4
        assert not root.exists()
        await clock.advance(14.0)  # the next retry, 8 s after the one at 6
        assert writer.statistics().failure_streak == 0
        assert stat.S_IMODE(root.stat().st_mode) == 0o700
        assert loaded_state(store) == session.snapshot().state


@pytest.mark.anyio
async def test_root_removed_while_running_is_a_delete(tmp_path: Path, clock: FakeClock) -> None:
    """rmtree of the root between writes deleted the session: it is never brought back."""
    root = tmp_path / "a" / "root"
    session = Session()
    store = FileStore(root)
    async with CheckpointWriter(session.snapshot, store, clock=clock, exit_hooks=False) as writer:
        shutil.rmtree(tmp_path / "a")
        session.add()
        result = await writer.write_now()
        assert isinstance(result, Failed) and result.reason == "conflict", result
        assert "was deleted" in result.error
    assert isinstance(writer.statistics().last_result, Failed)
    assert load(store, KEY) is None  # nor by the final write


@pytest.mark.anyio
async def test_file_replaced_by_a_directory_fails_cleanly(tmp_path: Path, clock: FakeClock) -> None:
    """A directory at root/key.json: writes fail, it stays, load raises; removed, a delete."""
    session = Session()
    store = FaultyStore(tmp_path, clock=clock)
    path = Path(store.location(KEY))
    async with CheckpointWriter(
        session.snapshot, store, clock=clock, limits=Limits(retry_initial=1.0), exit_hooks=False
    ) as writer:
        path.unlink()
        path.mkdir()
        (path / "inside").write_bytes(b"keep me")
        session.add()
        result = await writer.write_now()
        assert isinstance(result, Failed) and result.reason == "write-failed", result
        assert "Is a directory" in result.error and str(path) in result.error
        writer.notify()  # the agent goes on changing the session
        assert entries(tmp_path) == [f"{KEY}.json"]  # no temp left
        assert entries(path) == ["inside"]
        with pytest.raises(CheckpointError, match="cannot be read"):
            load(store, KEY)
        shutil.rmtree(path)  # the checkpoint is gone now: deleted, never brought back
        await clock.advance(10.0)
        last = writer.statistics().last_result
        assert isinstance(last, Failed) and last.reason == "conflict", last
    assert load(store, KEY) is None


def test_new_writer_over_a_directory_in_place_of_the_file(tmp_path: Path) -> None:
    """A writer that finds a directory where its file should be: Failed('cannot read'), no raise."""
    (tmp_path / f"{KEY}.json").mkdir()
    session = Session()
    writer = CheckpointWriter(session.snapshot, FileStore(tmp_path), exit_hooks=False).open()
    result = writer.flush_sync()
    assert isinstance(result, Failed) and "cannot read" in result.error, result
    assert isinstance(writer.close(), Failed)
    assert entries(tmp_path) == [f"{KEY}.json"]


# -- a directory fsync that fails after the rename ------------------------------------------


class DirSyncFails(FileStore):
    """A store whose directory fsync (after the rename) fails with EIO while ``failing``."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.failing = False

    def write(self, key: str, chunks: Sequence[bytes], **kw: Any) -> int:
        if landed(key, self.revision(key), kw["revision"], kw["expected"]):
            return 0
        calls = []

        def fsync(fd: int) -> None:
            calls.append(fd)
            if self.failing and len(calls) == 2:  # the second fsync is the directory's
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            os.fsync(fd)

        return write_atomic(self.location(key), chunks, fsync=fsync)


def test_seq_never_repeats_after_a_failed_directory_fsync(tmp_path: Path) -> None:
    """Directory fsync EIO after the rename: Failed, and the next write still gets a new seq."""
    session = Session()
    store = DirSyncFails(tmp_path)
    writer = CheckpointWriter(session.snapshot, store, exit_hooks=False).open()
    session.add("a")
    store.failing = True
    failed = writer.flush_sync()
    assert isinstance(failed, Failed) and "Input/output error" in failed.error
    on_disk = load(store, KEY)
    assert on_disk is not None  # the rename happened: the new state is in place
    assert on_disk.state == session.snapshot().state
    store.failing = False
    session.add("b")
    written = writer.flush_sync()
    assert isinstance(written, Written)
    assert written.seq > on_disk.meta.seq, (written.seq, on_disk.meta.seq)
    writer.close()


# -- the timer after a write_now ------------------------------------------------------------


class HookStore(FileStore):
    """A FileStore that runs ``hook`` (once) in the writing thread before it writes."""

    def __init__(self, root: Path, clock: FakeClock) -> None:
        super().__init__(root)
        self.clock = clock
        self.hook: Callable[[], None] | None = None
        self.write_times: list[float] = []

    def write(self, key: str, chunks: Sequence[bytes], **kw: Any) -> int:
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()
        self.write_times.append(self.clock.now())
        return super().write(key, chunks, **kw)


def timer_slept_again(clock: FakeClock, before: list[Any]) -> None:
    """Wait (real time, bounded) until the writer's timer sleeps in a new sleep."""
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        now = list(clock._sleepers)
        if now and all(entry is not old for entry in now for old in before):
            return
        time.sleep(0.001)
    raise AssertionError("the timer never went back to sleep")


@pytest.mark.anyio
async def test_change_during_write_now_is_written(tmp_path: Path, clock: FakeClock) -> None:
    """A change notified while write_now() writes is written by the timer after debounce."""
    session = Session()
    store = HookStore(tmp_path, clock)
    async with CheckpointWriter(
        session.snapshot,
        store,
        clock=clock,
        debounce=1.0,
        min_interval=0.0,
        max_wait=5.0,
        write_on_start=False,
        exit_hooks=False,
    ) as writer:
        await clock.settle()  # the timer sleeps: nothing pending
        before = list(clock._sleepers)

        def change_during_the_write() -> None:  # in the worker thread
            session.add("during")
            writer.notify()
            timer_slept_again(clock, before)

        store.hook = change_during_the_write
        assert isinstance(await writer.write_now(), Written)
        assert writer.statistics().pending
        await clock.advance(10.0)
        assert store.write_times == [0.0, 1.0]
        assert loaded_state(store) == session.snapshot().state


@pytest.mark.anyio
async def test_failed_write_now_is_retried_without_notify(tmp_path: Path, clock: FakeClock) -> None:
    """write_now() fails (disk full) and the caller never notifies: the writer still retries."""
    session = Session()
    store = FaultyStore(tmp_path, clock=clock)
    async with CheckpointWriter(
        session.snapshot, store, clock=clock, limits=Limits(retry_initial=1.0), exit_hooks=False
    ) as writer:
        await clock.settle()
        store.failing = True
        session.add("a result that took minutes")
        assert isinstance(await writer.write_now(), Failed)
        store.failing = False
        await clock.advance(10.0)
        assert loaded_state(store) == session.snapshot().state
