"""One writer per key: flock on <key>.lock, in this process and across real processes."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from checkpointer import (
    CheckpointWriter,
    Failed,
    FileStore,
    Limits,
    Result,
    Snapshot,
    Written,
    load,
)
from checkpointer._stores import flock as _lock
from checkpointer.stores import KeyLocked, LockingStore, Store
from tests._support import CHILDREN
from tests.conftest import FakeClock

CHILD = CHILDREN / "lock_child.py"


def sync_writer(root: Path, key: str = "k", **kw: Any) -> CheckpointWriter[Any]:
    state = {"pid": os.getpid(), "n": 0}
    kw.setdefault("exit_hooks", False)
    kw.setdefault("write_on_start", False)
    return CheckpointWriter(lambda: Snapshot(key, state), FileStore(root), **kw)


# -- in this process -------------------------------------------------------------


def test_second_writer_in_the_same_process_is_locked_out(tmp_path: Path) -> None:
    """flock belongs to the open file: a second writer of the key, even in this process,
    gets Failed('locked') naming the holder; after the first closes, the key is free but
    the second saw it before the first's last write (Failed('conflict')); a new one writes."""
    first = sync_writer(tmp_path).open()
    assert isinstance(first.flush_sync(), Written)
    second = sync_writer(tmp_path).open()
    refused = second.flush_sync()
    assert isinstance(refused, Failed) and refused.reason == "locked"
    assert f"pid {os.getpid()} on {socket.gethostname()}" in refused.error
    assert str(tmp_path / "k.lock") in refused.error
    assert "lock_timeout" in refused.error  # the way out
    first.close()
    conflict = second.flush_sync()
    assert isinstance(conflict, Failed) and conflict.reason == "conflict"
    second.close()
    third = sync_writer(tmp_path).open()
    assert isinstance(third.flush_sync(), Written)
    third.close()
    assert sorted(os.listdir(tmp_path)) == ["k.json"]


def test_lock_file_names_its_holder_and_goes_on_release(tmp_path: Path) -> None:
    """While held, <key>.lock says pid, host and start time; release removes it."""
    store = FileStore(tmp_path)
    lock = store.lock("k")
    holder = json.loads((tmp_path / "k.lock").read_bytes())
    assert holder["pid"] == os.getpid()
    assert holder["host"] == socket.gethostname()
    assert holder["started_at"].endswith("Z")
    with pytest.raises(KeyLocked) as info:
        store.lock("k")
    assert info.value.holder is not None and info.value.holder.pid == os.getpid()
    lock.release()
    lock.release()  # idempotent
    assert not (tmp_path / "k.lock").exists()
    store.lock("k").release()


def test_a_waiter_on_an_unlinked_lock_file_starts_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The unlink race: a writer that opened the lock file just before the holder
    unlinked it must not believe it holds the key (it checks the inode and retries)."""
    store = FileStore(tmp_path)
    path = tmp_path / "k.lock"
    store.lock("k").release()
    path.write_bytes(b"")  # the file as a holder left it, about to unlink it
    real_flock = fcntl.flock
    calls = 0

    def flock(fd: int, operation: int) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            os.unlink(path)  # the holder lets go between our open() and our flock()
        real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock)
    mine = store.lock("k")
    monkeypatch.setattr(fcntl, "flock", real_flock)
    assert calls == 2
    assert isinstance(mine, _lock.FileKeyLock)
    assert os.stat(path).st_ino == os.fstat(mine.fileno()).st_ino
    with pytest.raises(KeyLocked):
        store.lock("k")  # a newcomer sees the lock that the path names
    mine.release()


def test_moving_to_another_key_releases_the_old_one(tmp_path: Path) -> None:
    """When the source's key changes, the writer lets go of the old key's lock."""
    key = ["a"]
    writer = CheckpointWriter(
        lambda: Snapshot(key[0], {"k": key[0]}),
        FileStore(tmp_path),
        exit_hooks=False,
        write_on_start=False,
    ).open()
    assert isinstance(writer.flush_sync(), Written)
    key[0] = "b"
    assert isinstance(writer.flush_sync(), Written)
    assert sorted(os.listdir(tmp_path)) == ["a.json", "b.json", "b.lock"]
    other = sync_writer(tmp_path, "a").open()
    assert isinstance(other.flush_sync(), Written)
    other.close()
    writer.close()


def test_coming_back_to_a_key_rereads_what_others_wrote(tmp_path: Path) -> None:
    """A writer that let go of a key and takes it again re-reads the file: another
    writer's checkpoint written meanwhile is not replaced (Failed('conflict')), while
    a key nobody touched meanwhile is written again, its seq going on."""
    key = ["a"]
    state = {"by": "first"}
    writer = CheckpointWriter(
        lambda: Snapshot(key[0], state), FileStore(tmp_path), exit_hooks=False
    ).open()
    key[0] = "b"
    writer.flush_sync()  # lets go of "a"
    other = sync_writer(tmp_path, "a").open()
    other.flush_sync()
    other.close()
    after_other = load(FileStore(tmp_path), "a")
    assert after_other is not None
    key[0] = "a"
    result = writer.flush_sync()
    assert isinstance(result, Failed) and result.reason == "conflict"
    assert load(FileStore(tmp_path), "a") == after_other
    key[0] = "b"
    state["by"] = "first, again"
    again = writer.flush_sync()
    b = load(FileStore(tmp_path), "b")
    assert isinstance(again, Written) and b is not None and b.state == state
    assert b.meta.seq == 3  # written, marked not live when we left, written again
    writer.close()


def test_readers_never_lock(tmp_path: Path) -> None:
    """load() reads a key another writer holds, and creates no lock file of its own."""
    writer = sync_writer(tmp_path).open()
    writer.flush_sync()
    cp = load(FileStore(tmp_path), "k")
    assert cp is not None and cp.meta.live is True
    writer.close()
    assert load(FileStore(tmp_path), "k") is not None
    assert sorted(os.listdir(tmp_path)) == ["k.json"]


class PlainStore:
    """A store without the optional lock capability (delegates to a FileStore)."""

    def __init__(self, root: Path) -> None:
        self._inner = FileStore(root)

    def validate_key(self, key: str) -> None:
        self._inner.validate_key(key)

    def location(self, key: str) -> str:
        return self._inner.location(key)

    def open(self) -> None:
        self._inner.open()

    def write(self, key: str, chunks: Sequence[bytes], **kw: Any) -> int:
        return self._inner.write(key, chunks, **kw)

    def read(self, key: str) -> bytes | None:
        return self._inner.read(key)

    def revision(self, key: str) -> str | None:
        return self._inner.revision(key)

    def keys(self) -> list[str]:
        return self._inner.keys()

    def delete(self, key: str) -> bool:
        return self._inner.delete(key)

    def move_aside(self, key: str, suffix: str) -> str | None:
        return self._inner.move_aside(key, suffix)


def test_a_store_without_the_lock_capability_still_works(tmp_path: Path) -> None:
    """Locking is optional: a Store without lock() is written unlocked."""
    store = PlainStore(tmp_path)
    assert isinstance(store, Store) and not isinstance(store, LockingStore)
    assert isinstance(FileStore(tmp_path), LockingStore)
    writer = CheckpointWriter(lambda: Snapshot("k", {}), store, exit_hooks=False).open()
    while_open = sorted(os.listdir(tmp_path))
    writer.close()
    assert while_open == ["k.json"]


@pytest.mark.anyio
async def test_a_locked_out_async_writer_retries_and_takes_over(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Failed('locked') is a value retried with backoff; once the holder closes (its final
    write lands after the waiting writer first looked), the retry is Failed('conflict')
    and is not retried; the holder's checkpoint stays."""
    holder = sync_writer(tmp_path).open()
    holder.flush_sync()
    state = {"mine": True}
    store = FileStore(tmp_path)
    async with CheckpointWriter(
        lambda: Snapshot("k", state),
        store,
        clock=clock,
        exit_hooks=False,
        write_on_start=False,
        debounce=0.0,
        min_interval=0.0,
        limits=Limits(retry_initial=1.0),
    ) as writer:
        writer.notify()
        await clock.advance(0.5)
        assert writer.statistics().failures == 1
        holder.close()
        held = load(store, "k")
        await clock.advance(1.0)  # the retry, one backoff after the failure
        stats = writer.statistics()
        assert (stats.writes, stats.failures, stats.pending) == (0, 2, False)
        await clock.advance(100.0)  # refused: no retry loop
        assert writer.statistics().failures == 2
        assert load(store, "k") == held


# -- real processes --------------------------------------------------------------


class Child:
    """A lock_child.py process and the JSON lines it prints."""

    def __init__(self, root: Path, key: str, mode: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), str(root), key, mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.pid = self.proc.pid

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"child {self.pid} exited with {self.proc.wait(10)}"
        data: dict[str, Any] = json.loads(line)
        return data

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def finish(self) -> int:
        """Close stdin (a holder then closes its writer) and wait for the exit status."""
        assert self.proc.stdin is not None
        if not self.proc.stdin.closed:
            self.proc.stdin.close()
        return self.proc.wait(20)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(20)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture
def children() -> Iterator[list[Child]]:
    started: list[Child] = []
    yield started
    for child in started:
        child.kill()


def hold(root: Path, children: list[Child], key: str = "k") -> Child:
    child = Child(root, key, "hold")
    children.append(child)
    assert child.read()["result"] == "Written"
    return child


def test_a_live_holder_refuses_a_second_writer(tmp_path: Path, children: list[Child]) -> None:
    """Another process holding the key: Failed('locked') naming its pid and host; the
    holder's checkpoint stays readable."""
    child = hold(tmp_path, children)
    writer = sync_writer(tmp_path).open()
    refused = writer.flush_sync()
    assert isinstance(refused, Failed) and refused.reason == "locked"
    assert f"pid {child.pid} on {socket.gethostname()}" in refused.error
    cp = load(FileStore(tmp_path), "k")
    assert cp is not None and cp.state == {"writer": child.pid}
    writer.close()
    assert child.finish() == 0


def test_a_holder_killed_by_sigkill_frees_the_key_at_once(
    tmp_path: Path, children: list[Child]
) -> None:
    """The kernel drops the lock of a SIGKILLed holder: the next writer gets the key at
    once, with no timeout and no stale-lock guessing."""
    child = hold(tmp_path, children)
    os.kill(child.pid, signal.SIGKILL)
    assert child.proc.wait(20) == -signal.SIGKILL
    assert (tmp_path / "k.lock").exists()  # debris of a crash, but no longer a lock
    writer = sync_writer(tmp_path).open()
    assert isinstance(writer.flush_sync(), Written)
    assert json.loads((tmp_path / "k.lock").read_bytes())["pid"] == os.getpid()
    writer.close()


def test_processes_racing_for_a_free_key_exactly_one_wins(
    tmp_path: Path, children: list[Child]
) -> None:
    """Four processes try to write the same free key at once: one writes, three are locked."""
    racers = [Child(tmp_path, "k", "race") for _ in range(4)]
    children.extend(racers)
    for racer in racers:
        assert racer.read()["step"] == "ready"
    for racer in racers:
        racer.send("go\n")
    results = {racer.pid: racer.read() for racer in racers}
    winners = [pid for pid, r in results.items() if r["result"] == "Written"]
    losers = [r["reason"] for r in results.values() if r["result"] != "Written"]
    assert len(winners) == 1, results
    assert losers == ["locked"] * 3
    cp = load(FileStore(tmp_path), "k")
    assert cp is not None and cp.state == {"writer": winners[0]}
    assert all(racer.finish() == 0 for racer in racers)


def test_after_a_clean_close_the_key_is_free_and_no_debris_is_left(
    tmp_path: Path, children: list[Child]
) -> None:
    """A holder that closes cleanly leaves only the checkpoint (live=False), no lock file."""
    child = hold(tmp_path, children)
    assert (tmp_path / "k.lock").exists()
    assert child.finish() == 0
    assert sorted(os.listdir(tmp_path)) == ["k.json"]
    cp = load(FileStore(tmp_path), "k")
    assert cp is not None and cp.meta.live is False
    writer = sync_writer(tmp_path).open()
    assert isinstance(writer.flush_sync(), Written)
    writer.close()


def test_a_writer_that_asked_to_wait_gets_the_key(tmp_path: Path, children: list[Child]) -> None:
    """With lock_timeout, a second writer waits for the holder instead of failing; the
    holder's final write during the wait is not replaced (conflict), and a writer
    resumed from it gets the key."""
    child = hold(tmp_path, children)
    writer = sync_writer(
        tmp_path,
        limits=Limits(lock_timeout=20.0),
    ).open()
    results: list[Result] = []
    waiter = threading.Thread(target=lambda: results.append(writer.flush_sync()))
    waiter.start()
    time.sleep(0.3)  # not timing: long enough that a writer not waiting would be done
    assert waiter.is_alive() and results == []
    assert child.finish() == 0  # its close writes the final checkpoint meanwhile
    waiter.join(20)
    assert len(results) == 1 and isinstance(results[0], Failed), results
    assert results[0].reason == "conflict" and f"pid {child.pid}" in results[0].error
    writer.close()
    final = load(FileStore(tmp_path), "k")
    assert final is not None and final.state == {"writer": child.pid} and not final.meta.live
    resumed = sync_writer(tmp_path, limits=Limits(lock_timeout=20.0), resume_from=final).open()
    assert isinstance(resumed.flush_sync(), Written)
    resumed.close()
