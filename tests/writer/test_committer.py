"""``KeyCommitter``: one key's state committed durably on demand, with no timer.

The writer's commit core without its schedule: each commit is durable when
it returns, fenced on the revision resumed from, and never raises for a
failed write.  Other processes are real ones, on real files.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from checkpointer import (
    CheckpointWriter,
    Failed,
    FileStore,
    JournalStore,
    KeyCommitter,
    Limits,
    Result,
    Skipped,
    Snapshot,
    Written,
    load,
)
from checkpointer.stores import KeyLocked, Store
from tests._support import HANG_GUARD, ROOT, child_env

STORES = {"file": FileStore, "journal": JournalStore}


@pytest.fixture(params=sorted(STORES))
def kind(request: pytest.FixtureRequest) -> str:
    """Each test runs on FileStore and JournalStore."""
    return str(request.param)


def _store(kind: str, root: Path) -> Store:
    store: Store = STORES[kind](root)
    return store


def test_a_commit_is_on_disk_when_it_returns(tmp_path: Path, kind: str) -> None:
    """Written means stored (live while held); the same state again is skipped; a change written."""
    store = _store(kind, tmp_path)
    with KeyCommitter(store, "k", resume_from=None) as committer:
        first = committer.commit({"messages": ["a"]})
        assert isinstance(first, Written) and first.seq == 1
        stored = load(_store(kind, tmp_path), "k")
        assert stored is not None and stored.state == {"messages": ["a"]} and stored.meta.live
        assert committer.commit({"messages": ["a"]}) == Skipped("unchanged")
        second = committer.commit({"messages": ["a", "b"]})
        assert isinstance(second, Written) and second.seq == 2
    closed = load(_store(kind, tmp_path), "k")
    assert closed is not None and closed.state == {"messages": ["a", "b"]}
    assert not closed.meta.live  # close marked it, the state untouched
    assert committer.commit({"messages": []}) == Skipped("closed")


@pytest.mark.anyio
async def test_acommit_in_one_hop(tmp_path: Path, anyio_backend: str) -> None:
    """acommit and aclose from async code, on asyncio and trio."""
    store = JournalStore(tmp_path)
    committer = KeyCommitter(store, "k", resume_from=load(store, "k"))
    assert isinstance(await committer.acommit({"messages": [1]}), Written)
    assert isinstance(await committer.acommit({"messages": [1, 2]}, live=False), Written)
    await committer.aclose()
    stored = load(store, "k")
    assert stored is not None and stored.state == {"messages": [1, 2]} and not stored.meta.live


def test_a_commit_over_another_writer_s_is_a_conflict(tmp_path: Path, kind: str) -> None:
    """Loaded absent, the key written meanwhile: Failed("conflict"), nothing replaced."""
    other = KeyCommitter(_store(kind, tmp_path), "k", resume_from=None)
    late = KeyCommitter(_store(kind, tmp_path), "k", resume_from=None)  # loaded "absent" too
    assert isinstance(other.commit({"by": "other"}), Written)
    other.close()
    result = late.commit({"by": "late"})
    assert isinstance(result, Failed) and result.reason == "conflict"
    assert "another writer" in result.error
    late.close()
    stored = load(_store(kind, tmp_path), "k")
    assert stored is not None and stored.state == {"by": "other"}


def test_a_key_another_writer_holds_is_locked_until_it_lets_go(tmp_path: Path, kind: str) -> None:
    """Another holder: Failed("locked") naming it, not raised; free again once it closes."""
    holder = KeyCommitter(_store(kind, tmp_path), "k", resume_from=None)
    assert isinstance(holder.commit({"by": "holder"}), Written)
    waiting = KeyCommitter(
        _store(kind, tmp_path), "k", resume_from=load(_store(kind, tmp_path), "k")
    )
    result = waiting.commit({"by": "waiting"})
    assert isinstance(result, Failed) and result.reason == "locked"
    assert f"pid {os.getpid()}" in result.error
    holder.close()  # marks it not live: another revision than the one loaded
    result = waiting.commit({"by": "waiting"})
    assert isinstance(result, Failed) and result.reason == "conflict"
    waiting.close()
    again = KeyCommitter(_store(kind, tmp_path), "k", resume_from=load(_store(kind, tmp_path), "k"))
    assert isinstance(again.commit({"by": "again"}), Written)
    again.close()


def test_committer_failure_logs_do_not_promise_a_schedule(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A committer has no schedule: its locked and conflict warnings name none (a writer's do)."""
    holder = KeyCommitter(FileStore(tmp_path), "k", resume_from=None)
    assert isinstance(holder.commit({"by": "holder"}), Written)
    late = KeyCommitter(FileStore(tmp_path), "k", resume_from=load(FileStore(tmp_path), "k"))
    with caplog.at_level(logging.WARNING, logger="checkpointer"):
        for _ in range(2):  # one streak: said once
            locked = late.commit({"by": "late"})
            assert isinstance(locked, Failed) and locked.reason == "locked"
        holder.close()
        conflict = late.commit({"by": "late"})
        assert isinstance(conflict, Failed) and conflict.reason == "conflict"
    late.close()
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(": ", 2)[1] for line in lines] == [
        "checkpoint failed (locked)",
        "checkpoint failed (conflict)",
    ], lines
    assert all(not line.endswith(("session changes", "backoff")) for line in lines), lines


class _LosesItsLock(FileStore):
    """A store that loses the key's lock after its first write (a networked store's lease)."""

    writes = 0

    def write(self, key: str, chunks: Any, *, revision: str, expected: str | None) -> int:
        self.writes += 1
        if self.writes > 1:
            raise KeyLocked(key, self.location(key), None)
        return super().write(key, chunks, revision=revision, expected=expected)


def test_a_lost_lock_is_a_failed_value(tmp_path: Path) -> None:
    """The store lost the key's lock: Failed("locked"), never raised; the stored state stays."""
    committer = KeyCommitter(_LosesItsLock(tmp_path), "k", resume_from=None)
    assert isinstance(committer.commit({"n": 1}), Written)
    result = committer.commit({"n": 2})
    assert isinstance(result, Failed) and result.reason == "locked"
    committer.close()
    stored = load(FileStore(tmp_path), "k")
    assert stored is not None and stored.state == {"n": 1}


def test_lock_timeout_waits_for_the_holder(tmp_path: Path) -> None:
    """With limits=Limits(lock_timeout=...) a commit waits for the holder to let go."""
    import threading

    holder = KeyCommitter(FileStore(tmp_path), "k")
    assert isinstance(holder.commit({"by": "holder"}), Written)
    waiting = KeyCommitter(FileStore(tmp_path), "k", limits=Limits(lock_timeout=60))
    releasing = threading.Timer(0.2, holder.close)
    releasing.start()
    try:
        result = waiting.commit({"by": "waiting"})
    finally:
        releasing.join()
    # It expected what was stored when it first tried; the holder's close changed that.
    assert isinstance(result, Failed) and result.reason == "conflict"
    waiting.close()


def test_a_flush_waits_for_a_held_lock_no_longer_than_exit_timeout(tmp_path: Path) -> None:
    """An exit flush (flush_sync) whose key another writer holds waits for its lock up to
    exit_timeout, not lock_timeout: an exit flushes every writer in turn."""
    import threading

    holder = KeyCommitter(FileStore(tmp_path), "k")
    assert isinstance(holder.commit({"by": "holder"}), Written)
    limits = Limits(lock_timeout=3600, exit_timeout=0.1)
    writer: CheckpointWriter[Snapshot] = CheckpointWriter(
        lambda: Snapshot("k", {"by": "writer"}),
        FileStore(tmp_path),
        limits=limits,
        write_on_start=False,
        exit_hooks=False,
    ).open()
    results: list[Result] = []
    flushing = threading.Thread(target=lambda: results.append(writer.flush_sync()), daemon=True)
    flushing.start()
    flushing.join(HANG_GUARD)
    holder.close()  # lets a flush still waiting (the bug) go on
    flushing.join()
    assert isinstance(results[0], Failed) and results[0].reason == "locked"
    writer.close()


_CHILD = """
import json, os, signal, sys
from checkpointer import FileStore, JournalStore, KeyCommitter, load
kind, root, step = sys.argv[1:4]
store = (JournalStore if kind == "journal" else FileStore)(root)
committer = KeyCommitter(store, "k", resume_from=load(store, "k"))
if step == "race":
    print(json.dumps({"step": "ready"}), flush=True)
    sys.stdin.readline()
result = committer.commit({"by": os.getpid()})
print(json.dumps({"step": type(result).__name__, "reason": getattr(result, "reason", None),
                  "revision": getattr(result, "revision", None)}), flush=True)
if step == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
sys.stdin.read()
committer.close()
"""


def _child(kind: str, root: Path, step: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, kind, str(root), step],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=child_env(),
    )


def _answer(child: subprocess.Popen[str]) -> dict[str, Any]:
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line, f"child {child.pid} ended (exit {child.wait(timeout=120)})"
    answer: dict[str, Any] = json.loads(line)
    return answer


def test_a_committer_killed_after_its_commit_lost_nothing(tmp_path: Path, kind: str) -> None:
    """SIGKILL right after commit returned: that state is stored, and the key is free again."""
    child = _child(kind, tmp_path, "kill")
    answer = _answer(child)
    assert answer["step"] == "Written"
    child.communicate(timeout=120)
    assert child.returncode == -signal.SIGKILL
    stored = load(_store(kind, tmp_path), "k")
    assert stored is not None and stored.state == {"by": child.pid}
    assert stored.meta.revision == answer["revision"] and stored.meta.live  # never closed
    with KeyCommitter(_store(kind, tmp_path), "k", resume_from=stored) as after:
        assert isinstance(after.commit({"by": "after"}), Written)  # the kernel let its lock go


@pytest.mark.parametrize("round_", range(5))
def test_two_processes_committing_a_new_key_at_once(tmp_path: Path, kind: str, round_: int) -> None:
    """Both loaded the key absent and commit at once: one is Written and stored, one refused."""
    children = [_child(kind, tmp_path, "race") for _ in range(2)]
    try:
        for child in children:
            assert _answer(child)["step"] == "ready"
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        answers = [_answer(child) for child in children]
    finally:
        for child in children:
            child.communicate("", timeout=120)
    assert all(child.returncode == 0 for child in children)
    won = [c.pid for c, a in zip(children, answers, strict=True) if a["step"] == "Written"]
    lost = [a["reason"] for a in answers if a["step"] == "Failed"]
    assert len(won) == 1 and len(lost) == 1 and lost[0] in ("locked", "conflict"), answers
    stored = load(_store(kind, tmp_path), "k")
    assert stored is not None and stored.state == {"by": won[0]}


def test_a_forked_child_never_commits_nor_lets_the_key_go(tmp_path: Path) -> None:
    """In a forked child the parent's committer is closed: no write, its lock stays the parent's."""
    committer = KeyCommitter(FileStore(tmp_path), "k", resume_from=None)
    assert isinstance(committer.commit({"by": "parent"}), Written)
    pid = os.fork()
    if pid == 0:  # the child: report through the exit status only
        code = 0
        try:
            if committer.commit({"by": "child"}) != Skipped("closed"):
                code = 1
            committer.close()
        except BaseException:
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    stored = load(FileStore(tmp_path), "k")
    assert stored is not None and stored.state == {"by": "parent"}
    other = KeyCommitter(FileStore(tmp_path), "k", resume_from=stored)
    result = other.commit({"by": "other"})
    assert isinstance(result, Failed) and result.reason == "locked"  # still the parent's
    other.close()
    assert isinstance(committer.commit({"by": "parent again"}), Written)
    committer.close()


_POOLED: KeyCommitter | None = None  # made before the pool forks, as a module-level one is


def _pooled(n: int) -> str:
    assert _POOLED is not None
    return type(_POOLED.commit({"n": n})).__name__


def test_a_committer_its_parent_never_used_commits_in_the_child(tmp_path: Path) -> None:
    """Made in the parent, first used in forked children (a fork pool): each child writes."""
    global _POOLED
    _POOLED = KeyCommitter(FileStore(tmp_path), "k")
    try:
        with multiprocessing.get_context("fork").Pool(2) as pool:
            results = pool.map(_pooled, range(4))
    finally:
        _POOLED = None
    assert "Written" in results and set(results) <= {"Written", "Failed"}, results
    assert load(FileStore(tmp_path), "k") is not None


@pytest.mark.anyio
async def test_async_with(tmp_path: Path, anyio_backend: str) -> None:
    """``async with`` closes the committer, as ``with`` does."""
    async with KeyCommitter(FileStore(tmp_path), "k") as committer:
        assert isinstance(await committer.acommit({"a": 1}), Written)
    stored = load(FileStore(tmp_path), "k")
    assert stored is not None and not stored.meta.live
