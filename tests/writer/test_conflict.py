"""Two writers of one key: a writer never replaces another writer's newer checkpoint.

The story of issue 11: process A checkpoints a session; process B starts on
the same key, loads it (stale soon after), appends its own messages.  B's
writes are ``Failed("locked")`` while A runs, and once A has exited they are
``Failed("conflict")`` naming A, never a replacement of A's work.  A writer
started after A ended resumes and writes as usual.  Real processes
(``tests/children/conflict_child.py``) on ``FileStore``, ``JournalStore``,
``PostgresStore`` and ``PostgresJournalStore`` (a private cluster from
``tests/pg.py``; those cases skip only without PostgreSQL server binaries).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from checkpointer import (
    CheckpointError,
    CheckpointWriter,
    Failed,
    FileStore,
    JournalStore,
    Limits,
    PostgresJournalStore,
    PostgresStore,
    Snapshot,
    Written,
    load,
)
from checkpointer.stores import KeyLocked, KeyLockedError, Store, unfenced
from tests._support import child_env
from tests._support.two_writers import Terminal, count_refused, start_at_once
from tests.conftest import FakeClock
from tests.pg import Cluster, find_binaries
from tests.stores.test_lock import PlainStore

KEY = "shared"
KINDS = ["file", "journal", "pg", "pgjournal"]


_CLUSTER: list[Cluster] = []


def _pg_cluster() -> Cluster:
    bindir = find_binaries()
    if bindir is None:
        pytest.skip(
            "no PostgreSQL server binaries (initdb, pg_ctl) on PATH or in "
            "/usr/lib/postgresql/*/bin; install Debian's postgresql package (.ci/run does)"
        )
    if not _CLUSTER:
        c = Cluster(bindir, fsync=False)
        c.start()
        _CLUSTER.append(c)
    elif not _CLUSTER[0].running:
        _CLUSTER[0].start()
    return _CLUSTER[0]


def teardown_module() -> None:
    for c in _CLUSTER:
        c.destroy()
    _CLUSTER.clear()


class Place:
    """Where the key lives: the child's store spec, the DSN, and a store for the test."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.kind = kind
        self.env = child_env()
        self.stores: list[Any] = []
        self.agents: list[Terminal] = []
        if kind in ("file", "journal"):
            self.spec = f"{kind}:{tmp_path}"
            self.root = tmp_path
        else:
            self.cluster = _pg_cluster()
            self.schema = "c_" + uuid.uuid4().hex[:12]
            self.spec = f"{kind}:{self.schema}"
            self.env["DSN"] = self.cluster.dsn()

    def store(self) -> Store:
        made: Store
        if self.kind == "file":
            made = FileStore(self.root)
        elif self.kind == "journal":
            made = JournalStore(self.root)
        else:
            cls = PostgresStore if self.kind == "pg" else PostgresJournalStore
            made = cls(self.cluster.dsn(), schema=self.schema)
        self.stores.append(made)
        return made

    def close(self) -> None:
        for agent in self.agents:  # a failed test leaves them running: end them
            if agent.proc.poll() is None:
                agent.proc.kill()
            agent.finish()
        for store in self.stores:
            close = getattr(store, "close", None)
            if callable(close):
                close()


@pytest.fixture(params=KINDS)
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    p = Place(str(request.param), tmp_path)
    yield p
    p.close()


@pytest.fixture(params=["pg", "pgjournal"])
def pg_place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    p = Place(str(request.param), tmp_path)
    yield p
    p.close()


def terminal(place: Place, name: str, *, resume: bool = False, wait: bool = False) -> Terminal:
    """A conflict_child.py terminal on ``KEY``, ended by ``place.close`` if the test fails."""
    made = Terminal(place.spec, KEY, name, place.env, resume=resume, wait=wait)
    place.agents.append(made)
    return made


def contents(store: Store) -> list[str]:
    cp = load(store, KEY)
    assert cp is not None
    return [m["content"] for m in cp.state["messages"]]


STARTS = 20  # keys, each opened by two terminals at one moment
TURNS = 3


CORRUPT = b'{"format": 1, "meta": {"key": "k", "se'  # a file torn by hand or by a disk


@pytest.mark.parametrize("start", ["new", "corrupt"])
def test_two_terminals_started_at_once_on_a_new_session_never_lose_a_written_state(
    place: Place, start: str
) -> None:
    """Two processes load a new key (None) and write it at once: what either saved stays.

    The resuming guide's pattern, ``resume_from=load(store, key)``, run by two
    processes at the same moment, each on ``STARTS`` keys at once (a loaded
    machine).  For every key, a terminal whose last result was ``Written``
    finds all its messages on disk (its state is a prefix of what is
    stored); the other is refused (``conflict`` or ``locked``), never told
    ``Written`` while its work is replaced.  A ``corrupt`` start finds a
    file nobody can read, where ``load`` raises and the terminals start
    afresh (``resume_from=None``): one of them moves the file aside, bytes
    kept, and writes.
    """
    # A loaded machine can start one terminal after the other has finished: then the
    # round did not exercise the case (nothing refused) and runs again on new keys.
    # A corrupt start may come to one writer after the other, resuming what it wrote.
    refused = 0
    for round_ in range(5):
        refused = _start_both(place, [f"{start}-{round_}-{i}" for i in range(STARTS)], start)
        if refused or start == "corrupt":
            break
    assert refused > 0 or start == "corrupt"  # the two did overlap: the case was exercised


def _start_both(place: Place, keys: list[str], start: str) -> int:
    """Two terminals on ``keys`` at once; checks every key; returns how many were refused."""
    if start == "corrupt":
        if place.kind not in ("file", "journal"):
            pytest.skip("a corrupt file is a file store's")
        for key in keys:
            Path(place.store().location(key)).write_bytes(CORRUPT)
    ran = start_at_once(place.spec, place.env, keys, TURNS)
    refusals = count_refused(place.store(), keys, ran, ("Failed:conflict", "Failed:locked"))
    for key in keys if start == "corrupt" else []:
        aside = list(place.root.glob(f"{key}.corrupt-*"))
        assert [p.read_bytes() for p in aside] == [CORRUPT], aside
    return refusals


def test_a_delete_from_another_process_is_refused_while_a_writer_holds_the_key(
    place: Place,
) -> None:
    """store.delete() while another process's writer holds the key: KeyLocked naming it."""
    a = terminal(place, "A").start()
    assert a.append("one")["result"] == "Written"
    store = place.store()
    with pytest.raises(KeyLocked, match=f"pid {a.proc.pid}"):
        store.delete(KEY)
    assert a.append("two")["result"] == "Written"
    assert a.close()["result"] == "Written"
    assert contents(place.store()) == ["A: one", "A: two"]
    assert place.store().delete(KEY) is True  # nobody holds it now
    assert load(place.store(), KEY) is None


def test_a_stale_second_process_never_replaces_the_first_ones_work(place: Place) -> None:
    """A runs, B loads and appends: 'locked' while A lives, then 'conflict' naming A (pid,
    host, seq) and the way out, logged once, not retried; A's checkpoint stays whole."""
    a, b = terminal(place, "A"), terminal(place, "B")
    assert a.start().opened["writes"] == 1
    assert a.append("one")["result"] == "Written"
    b.start()
    assert b.loaded["n"] == 1  # B resumes from A's first message ...
    assert (b.opened["writes"], b.opened["failures"]) == (0, 1)  # ... locked out of the key
    assert a.append("two")["result"] == "Written"  # ... and is stale from now on
    locked = b.append("mine")
    assert (locked["result"], locked["reason"]) == ("Failed", "locked"), locked
    a_closed = a.close()
    assert a_closed["result"] == "Written" and a_closed["failures"] == 0
    a_final = load(place.store(), KEY)
    assert a_final is not None and a_final.meta.live is False

    refused = b.append("more")
    assert (refused["result"], refused["reason"]) == ("Failed", "conflict"), refused
    assert refused["pending"] is False  # nothing left to retry in a loop
    error = refused["error"]
    assert f"pid {a.proc.pid} on " in error and f"seq {a_final.meta.seq}" in error
    assert "load the key again" in error and "new writer" in error
    b_closed = b.close()
    assert (b_closed["result"], b_closed["reason"]) == ("Failed", "conflict")
    assert b_closed["writes"] == 0
    assert load(place.store(), KEY) == a_final  # A's work, whole: B wrote nothing
    assert contents(place.store()) == ["A: one", "A: two"]
    logged = b.finish()
    # Warned once when it happened; the close's final write that could not land is an error.
    assert logged.count("not retrying until the session changes") == 1, logged
    assert logged.count("the final write at close failed (conflict)") == 1, logged


def test_a_process_started_after_the_other_ended_resumes_and_writes(place: Place) -> None:
    """B started after A exited loads A's last checkpoint and writes on top of it."""
    a, b = terminal(place, "A"), terminal(place, "B", resume=True)
    assert a.start().append("one")["result"] == "Written"
    assert a.close()["failures"] == 0
    a_final = load(place.store(), KEY)
    assert a_final is not None
    b.start()
    assert (b.loaded["seq"], b.opened["failures"]) == (a_final.meta.seq, 0)
    written = b.append("two")
    assert written["result"] == "Written" and written["seq"] == a_final.meta.seq + 2, written
    closed = b.close()
    assert (closed["result"], closed["failures"]) == ("Written", 0)
    assert contents(place.store()) == ["A: one", "B: two"]
    assert "another writer" not in b.finish()


def test_a_writer_locked_out_at_once_still_notes_what_it_saw(place: Place) -> None:
    """B's first attempt meets A's lock before B ever read the key under it; A writes
    again and is SIGKILLed (no final write): B's write is still a conflict, not a
    replacement of A's last write."""
    a, b = terminal(place, "A"), terminal(place, "B")
    assert a.start().append("one")["result"] == "Written"
    assert b.start().opened["failures"] == 1  # locked: B noted A's first checkpoint then
    assert a.append("two")["result"] == "Written"
    a.proc.send_signal(signal.SIGKILL)
    a.finish()
    a_last = load(place.store(), KEY)
    assert a_last is not None and a_last.meta.live is True  # no final write
    result = b.append("mine")
    for _ in range(200):  # a server may take a moment to see A's connection gone
        if result["reason"] != "locked":
            break
        result = b.append("again")
    assert (result["result"], result["reason"]) == ("Failed", "conflict"), result
    b.close()
    assert load(place.store(), KEY) == a_last


def test_a_second_process_waiting_for_the_lock_never_replaces_what_was_written_meanwhile(
    place: Place,
) -> None:
    """B (lock_timeout=, no resume_from) loads A's first message and waits for the lock
    while A writes twice more and closes; B then gets the lock and finds a conflict:
    its window opened at its first attempt, before the wait, and A's work stays whole."""
    a, b = terminal(place, "A"), terminal(place, "B", wait=True)
    assert a.start().append("one")["result"] == "Written"
    b.send("go")
    assert b.read("loaded")["n"] == 1
    b.read("waiting")  # B's first write attempt waits for A's lock
    assert a.append("two")["result"] == "Written"
    assert a.append("three")["result"] == "Written"
    assert a.close()["failures"] == 0
    a_final = load(place.store(), KEY)
    assert a_final is not None
    assert b.read("open")["writes"] == 0
    refused = b.append("mine")
    assert (refused["result"], refused["reason"]) == ("Failed", "conflict"), refused
    assert b.close()["writes"] == 0
    assert load(place.store(), KEY) == a_final
    assert contents(place.store()) == ["A: one", "A: two", "A: three"]


# -- PostgreSQL: simultaneous starts, deletes under a writer ---------------------------

STARTS = 20  # a race test: enough starts to catch a 1-in-20 loss


def stored_contents(place: Place, key: str) -> list[str] | None:
    """The key's messages as the database holds them, read with SQL (not the library)."""
    with psycopg.connect(place.cluster.dsn(), autocommit=True) as conn:
        head = conn.execute(
            f'SELECT journal, state FROM "{place.schema}".checkpoints WHERE key = %s', [key]
        ).fetchone()
        if head is None:
            return None
        if not head[0]:
            messages = json.loads(bytes(head[1]))["messages"]
        else:  # a journal: its last compaction row, then the message rows after it
            rows = conn.execute(
                f'SELECT kind, body FROM "{place.schema}".journal WHERE key = %s ORDER BY n', [key]
            ).fetchall()
            messages = []
            for kind, body in rows:
                row = json.loads(bytes(body))
                if kind == "compaction":
                    messages = list(row["state"]["messages"])
                elif kind == "message":
                    messages.append(row["message"])
    return [m["content"] for m in messages]


def test_a_key_deleted_under_a_live_writer_is_never_recreated(pg_place: Place) -> None:
    """A delete from another process while A holds the key is KeyLockedError naming A's pid;
    once A's session (and lock) is gone, the delete goes through, and A's next write and its
    close are Failed("conflict", ... was deleted ...): the key stays deleted."""
    place = pg_place
    a = terminal(place, "A").start()
    assert a.append("one")["result"] == "Written"
    deleter = place.store()
    with pytest.raises(KeyLockedError) as info:
        deleter.delete(KEY)
    assert info.value.holder is not None and info.value.holder.pid == a.proc.pid
    assert stored_contents(place, KEY) == ["A: one"]
    with psycopg.connect(place.cluster.dsn(), autocommit=True) as conn:  # A's session ends
        conn.execute(
            f'SELECT pg_terminate_backend(backend_pid, 5000) FROM "{place.schema}".holders '
            "WHERE key = %s",
            [KEY],
        )
    for _ in range(200):  # the server frees the lock as the backend exits
        try:
            assert deleter.delete(KEY) is True
            break
        except KeyLockedError:
            time.sleep(0.02)
    assert stored_contents(place, KEY) is None
    refused = a.append("two")
    assert (refused["result"], refused["reason"]) == ("Failed", "conflict"), refused
    assert "was deleted" in refused["error"]
    closed = a.close()
    assert (closed["result"], closed["reason"]) == ("Failed", "conflict"), closed
    assert stored_contents(place, KEY) is None and load(place.store(), KEY) is None


# -- resume_from, in this process ----------------------------------------------------


def sync_writer(root: Path, state: dict[str, Any], **kw: Any) -> CheckpointWriter[Any]:
    return CheckpointWriter(lambda: Snapshot(KEY, state), FileStore(root), exit_hooks=False, **kw)


def test_resume_from_refuses_what_another_writer_stored_since_the_load(tmp_path: Path) -> None:
    """With resume_from, a write that landed between load() and the writer's first write
    is not replaced (Failed('conflict')); without it, the writer expects what it finds."""
    first = sync_writer(tmp_path, {"messages": ["a1"]}).open()
    loaded = load(FileStore(tmp_path), KEY)
    assert loaded is not None
    first.close()  # writes once more (live=False) after our load
    after = load(FileStore(tmp_path), KEY)

    mine = {"messages": [*loaded.state["messages"], "b1"]}
    resumed = sync_writer(tmp_path, mine, resume_from=loaded, write_on_start=False).open()
    refused = resumed.flush_sync()
    assert isinstance(refused, Failed) and refused.reason == "conflict"
    assert f"after this writer first saw it at seq {loaded.meta.seq}" in refused.error
    resumed.close()
    assert load(FileStore(tmp_path), KEY) == after

    plain = sync_writer(tmp_path, mine, write_on_start=False).open()
    assert isinstance(plain.flush_sync(), Written)  # it expects what it found: first's close
    plain.close()


def test_resume_from_none_is_absent_and_fenced(tmp_path: Path) -> None:
    """resume_from=None (load found nothing) refuses a checkpoint made since: a conflict."""
    assert load(FileStore(tmp_path), KEY) is None
    sync_writer(tmp_path, {"messages": ["other"]}).open().close()
    late = sync_writer(tmp_path, {"messages": ["mine"]}, resume_from=None).open()
    refused = late.statistics().last_result
    assert isinstance(refused, Failed) and refused.reason == "conflict", refused
    assert "when it had no checkpoint" in refused.error
    late.close()
    cp = load(FileStore(tmp_path), KEY)
    assert cp is not None and cp.state == {"messages": ["other"]}


def test_a_writer_whose_key_was_deleted_never_brings_it_back(tmp_path: Path) -> None:
    """A delete under a live writer (a store without a lock lets it) makes its next write a
    conflict, and nothing is recreated, by it or by its close."""
    state = {"messages": ["a"]}
    writer = CheckpointWriter(
        lambda: Snapshot(KEY, state), PlainStore(tmp_path), exit_hooks=False
    ).open()
    assert FileStore(tmp_path).delete(KEY) is True
    state["messages"].append("b")
    refused = writer.flush_sync()
    assert isinstance(refused, Failed) and refused.reason == "conflict", refused
    assert f"key {KEY!r} was deleted after this writer first saw it" in refused.error
    assert isinstance(writer.close(), Failed)
    assert load(FileStore(tmp_path), KEY) is None


@pytest.mark.parametrize("kind", [FileStore, JournalStore])
def test_a_delete_through_another_store_object_is_refused_while_held(
    tmp_path: Path, kind: type[FileStore]
) -> None:
    """Another store object, even of this process, cannot delete a key a live writer holds."""
    writer = CheckpointWriter(lambda: Snapshot(KEY, {"n": 1}), kind(tmp_path), exit_hooks=False)
    with writer, pytest.raises(KeyLocked, match=f"pid {os.getpid()}"):
        kind(tmp_path).delete(KEY)
    assert kind(tmp_path).delete(KEY) is True


def test_a_store_without_a_lock_still_refuses_the_stale_writer(tmp_path: Path) -> None:
    """Two live writers of one key over a lock-less store: the one left behind is refused."""
    states = {"one": {"n": 1}, "two": {"n": 10}}
    one, two = (
        CheckpointWriter(
            functools.partial(Snapshot, KEY, s), PlainStore(tmp_path), exit_hooks=False
        )
        for s in states.values()
    )
    assert isinstance(one.open().statistics().last_result, Written)
    assert isinstance(two.open().statistics().last_result, Written)  # it expected one's
    states["one"]["n"] = 2
    refused = one.flush_sync()
    assert isinstance(refused, Failed) and refused.reason == "conflict", refused
    states["two"]["n"] = 11
    assert isinstance(two.flush_sync(), Written)
    assert isinstance(one.close(), Failed)
    assert isinstance(two.close(), Written)
    cp = load(FileStore(tmp_path), KEY)
    assert cp is not None and cp.state == {"n": 11} and cp.meta.seq == 4


class NoFence(PlainStore):
    """A store whose write takes no ``expected``: it cannot refuse a stale write."""

    def write(self, key: str, chunks: Sequence[bytes]) -> int:  # type: ignore[override]
        return self._inner.write(key, chunks, revision="", expected=self._inner.revision(key))


def test_a_store_that_cannot_fence_is_refused_unless_the_caller_owns_concurrency(
    tmp_path: Path,
) -> None:
    """A store whose write() takes no expected revision: TypeError, or stores.unfenced()."""
    with pytest.raises(TypeError, match=r"cannot refuse a stale write.*stores\.unfenced\(\)"):
        CheckpointWriter(lambda: Snapshot(KEY, {}), NoFence(tmp_path))  # type: ignore[arg-type]
    writer = CheckpointWriter(
        lambda: Snapshot(KEY, {"n": 1}), unfenced(NoFence(tmp_path)), exit_hooks=False
    )
    with writer:
        pass
    assert isinstance(writer.statistics().last_result, Written)


def test_resume_from_the_current_checkpoint_writes(tmp_path: Path) -> None:
    """resume_from= the checkpoint still on disk (a Checkpoint or its Meta): writes go on."""
    sync_writer(tmp_path, {"n": 1}).open().close()
    for given in ("checkpoint", "meta"):
        cp = load(FileStore(tmp_path), KEY)
        assert cp is not None
        state = {"n": cp.state["n"] + 1}
        resume_from = cp if given == "checkpoint" else cp.meta
        writer = sync_writer(tmp_path, state, resume_from=resume_from).open()
        assert writer.statistics().writes == 1, given
        writer.close()
    cp = load(FileStore(tmp_path), KEY)
    assert cp is not None and cp.state == {"n": 3}


def test_resume_from_must_be_a_checkpoint_or_meta(tmp_path: Path) -> None:
    """resume_from= anything else is a TypeError naming what it takes."""
    with pytest.raises(TypeError, match="resume_from must be the Checkpoint load"):
        sync_writer(tmp_path, {}, resume_from={"seq": 1})


@pytest.mark.anyio
async def test_a_conflict_waits_for_a_change_and_is_logged_once(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """After Failed('conflict') the timer does not retry; a new change tries once more
    (still a conflict, not logged again)."""
    other = sync_writer(tmp_path, {"by": "other"}).open()
    state = {"by": "me"}
    async with CheckpointWriter(
        lambda: Snapshot(KEY, state),
        FileStore(tmp_path),
        clock=clock,
        exit_hooks=False,
        debounce=0.0,
        min_interval=0.0,
        limits=Limits(retry_initial=1.0),
    ) as writer:
        assert writer.statistics().failures == 1  # locked
        other.close()
        with caplog.at_level(logging.WARNING, logger="checkpointer"):
            await clock.advance(1.0)  # the retry after the backoff: a conflict
            assert writer.statistics().failures == 2
            await clock.advance(1000.0)
            assert writer.statistics().failures == 2  # no retry loop
            writer.notify()
            await clock.step(0.1)
            stats = writer.statistics()
            assert (stats.failures, stats.pending) == (3, False)
    records = [r for r in caplog.records if "written by another writer" in r.getMessage()]
    conflicts = [r for r in records if r.levelno == logging.WARNING]
    assert len(conflicts) == 1
    assert "not retrying until the session changes" in conflicts[0].getMessage()
    # The final write at close could not land either: said once, at ERROR.
    finals = [r for r in records if r.levelno == logging.ERROR]
    assert len(finals) == 1
    assert "the final write at close failed (conflict)" in finals[0].getMessage()
    assert load(FileStore(tmp_path), KEY) is not None
    cp = load(FileStore(tmp_path), KEY)
    assert cp is not None and cp.state == {"by": "other"}


def test_a_fresh_start_over_a_torn_state_with_a_whole_meta_moves_it_aside(tmp_path: Path) -> None:
    """``load`` raised (the state's tail is lost, its meta reads well), the program starts
    afresh with ``resume_from=None``: the torn file is moved aside, bytes kept, and the new
    session is written (not a conflict with a writer that never was)."""
    store = FileStore(tmp_path)
    with CheckpointWriter(lambda: Snapshot(KEY, {"messages": ["old"] * 5}), store) as writer:
        writer.flush_sync()
    path = Path(store.location(KEY))
    torn = path.read_bytes()[:-15]
    path.write_bytes(torn)
    with pytest.raises(CheckpointError):
        load(store, KEY)
    new = {"messages": ["new"]}
    with CheckpointWriter(lambda: Snapshot(KEY, new), store, resume_from=None):
        pass  # its first write, on open
    stored = load(store, KEY)
    assert stored is not None and stored.state == new
    assert [p.read_bytes() for p in tmp_path.glob(f"{KEY}.corrupt-*")] == [torn]


class _ReadsFail(FileStore):
    """A store whose full reads fail as a dropped network does (the meta still reads)."""

    def read(self, key: str) -> bytes | None:
        raise ConnectionResetError("connection reset by peer")


def test_a_fresh_start_that_cannot_read_the_stored_checkpoint_leaves_it(tmp_path: Path) -> None:
    """Refused on a key that holds a checkpoint, a writer expecting none that cannot read it
    (an outage, not damage) reports the conflict and moves nothing aside."""
    with CheckpointWriter(lambda: Snapshot(KEY, {"messages": ["theirs"]}), FileStore(tmp_path)):
        pass
    store = _ReadsFail(tmp_path)
    with CheckpointWriter(
        lambda: Snapshot(KEY, {"messages": ["mine"]}), store, resume_from=None
    ) as writer:
        result = writer.statistics().last_result
    assert isinstance(result, Failed) and result.reason == "conflict", result
    assert list(tmp_path.glob(f"{KEY}.corrupt-*")) == []
    stored = load(FileStore(tmp_path), KEY)
    assert stored is not None and stored.state == {"messages": ["theirs"]}
