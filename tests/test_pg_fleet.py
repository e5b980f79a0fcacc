"""What a fleet meets on PostgreSQL: lost commit answers, signals inside store calls,
forks, shared stores, rolling upgrades, grants, odd keys, server restarts.

On a real throwaway cluster (``tests/pg.py``), each test in its own schema, as in
``test_postgres.py``; process tests run real children and look at the rows.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from checkpointer import (
    CheckpointWriter,
    Failed,
    KeyLockedError,
    PostgresJournalStore,
    PostgresStore,
    PostgresStoreError,
    Snapshot,
    Written,
    load,
)

from . import test_postgres as _pg
from .pg import Cluster

pytestmark = _pg.pytestmark
cluster = _pg.cluster
pg = _pg.pg
schema = _pg.schema

STORES = [PostgresStore, PostgresJournalStore]
_COMMIT = b"Q\x00\x00\x00\x0bCOMMIT\x00"  # the simple-query COMMIT psycopg sends


class CommitEater:
    """A TCP proxy to the server that, once armed, lets the next COMMIT through and eats
    its answer: the server commits, the client sees its connection drop."""

    def __init__(self, port: int) -> None:
        self._port = port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._armed = threading.Event()
        self.eaten = threading.Event()  # an answer to a COMMIT was dropped
        self._cut = b""
        self._refuse = 0
        self.was_cut = threading.Event()  # a connection was dropped by cut()
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self) -> None:
        self._armed.set()

    def cut(self, marker: bytes, *, then_refuse: int = 0) -> None:
        """Drop the connection, both ways, when the client next sends ``marker`` (unsent),
        then close the next ``then_refuse`` connections at once (a server restarting)."""
        self._refuse = then_refuse
        self._cut = marker

    def close(self) -> None:
        for sock in [self._listener, *self._socks]:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self._listener.accept()
                if self.was_cut.is_set() and self._refuse > 0:
                    self._refuse -= 1
                    client.close()
                    continue
                server = socket.create_connection(("127.0.0.1", self._port))
                self._socks += [client, server]
                eating = threading.Event()
                for pump, args in ((self._up, (client, server)), (self._down, (server, client))):
                    threading.Thread(target=pump, args=(*args, eating), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, eating: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                if self._cut and self._cut in data:  # a server restart, as the client sees it
                    self._cut = b""
                    for sock in (client, server):
                        with contextlib.suppress(OSError):
                            sock.shutdown(socket.SHUT_RDWR)
                    self.was_cut.set()
                    return
                if self._armed.is_set() and _COMMIT in data:
                    self._armed.clear()
                    eating.set()  # psycopg waits for each answer: the next one is COMMIT's
                server.sendall(data)

    def _down(self, server: socket.socket, client: socket.socket, eating: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                if eating.is_set():  # the server committed; its answer never arrives
                    for sock in (client, server):
                        with contextlib.suppress(OSError):
                            sock.shutdown(socket.SHUT_RDWR)
                    self.eaten.set()
                    return
                client.sendall(data)


@pytest.fixture
def eater(pg: Cluster) -> Iterator[CommitEater]:
    proxy = CommitEater(pg.port)
    yield proxy
    proxy.close()


def _through(pg: Cluster, port: int) -> str:
    return pg.dsn().replace(f"port={pg.port}", f"port={port}")


# -- 1. a lost COMMIT answer --------------------------------------------------------


@pytest.mark.parametrize("store_type", STORES, ids=lambda t: t.__name__)
@pytest.mark.parametrize("resumed", [False, True], ids=["fresh", "resumed"])
def test_a_commit_whose_answer_was_lost_is_the_writers_own(
    pg: Cluster, schema: str, eater: CommitEater, store_type: type[PostgresStore], resumed: bool
) -> None:
    """A write the server committed but whose answer was lost does not fence its writer:
    later writes and the close land (fresh key and resumed key, both stores)."""
    direct = store_type(pg.dsn(), schema=schema)
    loaded = None
    if resumed:  # another process wrote the key before; this writer resumes it
        other = {"messages": ["other"]}
        CheckpointWriter(lambda: Snapshot("k", other), direct, exit_hooks=False).open().close()
        loaded = load(direct, "k")
    store = store_type(_through(pg, eater.port), schema=schema, statement_timeout=3)
    state = {"messages": [*(loaded.state["messages"] if loaded else []), "mine-1"]}
    writer = CheckpointWriter(
        lambda: Snapshot("k", state),
        store,
        exit_hooks=False,
        write_on_start=False,
        resume_from=None if loaded is None else loaded.meta,
    )
    writer.open()
    try:
        eater.arm()
        writer.flush_sync()  # Written (the plain store retries at once) or Failed
        assert eater.eaten.wait(10)
        landed = load(direct, "k")
        assert landed is not None and landed.state == state  # the server committed it
        results = []
        for n in (2, 3):
            state["messages"].append(f"mine-{n}")
            results.append(writer.flush_sync())
        results.append(writer.close())
        assert all(isinstance(r, Written) for r in results), results
    finally:
        writer.close()
        store.close()
    final = load(direct, "k")
    assert final is not None and final.state == state and final.meta.live is False
    direct.close()


# -- 2. a signal while the main thread holds a lock of the store ---------------------

SIGNAL_IN_LOCK = r"""
import os, signal, sys, threading
from checkpointer import CheckpointWriter, PostgresJournalStore, PostgresStore, Snapshot

kind, schema, lock_name, where = sys.argv[1:5]
Store = PostgresJournalStore if kind == "journal" else PostgresStore
store = Store(os.environ["DSN"], schema=schema, connect_timeout=2, statement_timeout=3)


class SignalWhenTaken:
    # The store's own lock, which sends SIGTERM to this process once taken (armed):
    # the handler then runs on this thread while the lock is held.
    def __init__(self, lock):
        self._lock, self.armed = lock, False

    def acquire(self, blocking=True, timeout=-1):
        got = self._lock.acquire(blocking, timeout)
        if got and self.armed:
            self.armed = False
            os.kill(os.getpid(), signal.SIGTERM)
        return got

    def release(self):
        self._lock.release()

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


a_state, b_state = {"v": "a1"}, {"v": "b0"}
a = CheckpointWriter(lambda: Snapshot("a", a_state), store)
b = CheckpointWriter(lambda: Snapshot("b", b_state), store, write_on_start=False)
a.open()
b.open()
b_state["v"] = "b-at-signal"  # never written: B's flush must take B's lock
trap = SignalWhenTaken(getattr(store, lock_name))
setattr(store, lock_name, trap)
print("ready", flush=True)
trap.armed = True
if where == "release":
    a.close()  # A's close releases A's lock object
elif where == "take":
    store.lock("c")  # the application takes a third key's lock
elif where == "close":
    store.close()
elif where == "keys":
    store.keys()  # the application lists keys through the writers' store
print("the signal was lost", flush=True)
"""


@pytest.mark.parametrize(
    ("kind", "lock_name", "where"),
    [
        ("plain", "_handles_lock", "release"),
        ("journal", "_handles_lock", "release"),
        ("plain", "_handles_lock", "take"),
        ("plain", "_handles_lock", "close"),
        ("plain", "_mutex", "keys"),
        ("journal", "_mutex", "close"),
    ],
)
def test_sigterm_while_the_main_thread_holds_a_store_lock_flushes_and_dies(
    pg: Cluster, schema: str, kind: str, lock_name: str, where: str
) -> None:
    """SIGTERM landing while the main thread holds the store's handles lock or mutex
    (two writers share the store): the flush waits for the block, writes, the process dies."""
    PostgresStore(pg.dsn(), schema=schema).create_schema()
    child = _pg.spawn(SIGNAL_IN_LOCK, pg.dsn(), kind, schema, lock_name, where)
    try:
        out, err = child.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate()
        pytest.fail(f"hung with the lock held: {out!r} {err[-1500:]!r}")
    assert child.returncode == -signal.SIGTERM, (out, err[-1500:])
    assert out.split() == ["ready"], (out, err[-1500:])
    written = load(PostgresStore(pg.dsn(), schema=schema), "b")
    assert written is not None and written.state == {"v": "b-at-signal"}
    assert written.meta.live is False


# -- 7. store.close() with two writers of one key on the store ------------------------


@pytest.mark.parametrize("store_type", STORES, ids=lambda t: t.__name__)
def test_store_close_keeps_a_second_writer_of_the_key_out(
    pg: Cluster, schema: str, store_type: type[PostgresStore]
) -> None:
    """After store.close() (the store stays usable) the key is still the first writer's:
    the second writer of it through the same store is refused, the first one writes."""
    store = store_type(pg.dsn(), schema=schema)
    a_state, b_state = {"by": "a", "n": 1}, {"by": "b", "n": 1}
    a = CheckpointWriter(lambda: Snapshot("k", a_state), store, exit_hooks=False)
    b = CheckpointWriter(lambda: Snapshot("k", b_state), store, exit_hooks=False)
    a.open()
    b.open()  # refused: A holds the key
    store.close()
    b_state["n"] = 5
    refused = b.flush_sync()
    assert isinstance(refused, Failed) and refused.reason == "locked", refused
    a_state["n"] = 9
    assert isinstance(a.flush_sync(), Written)  # A takes the key again and writes
    assert isinstance(b.close(), Failed)
    assert isinstance(a.close(), Written)
    final = load(store, "k")
    assert final is not None and final.state == {"by": "a", "n": 9} and final.meta.seq == 3
    store.close()


# -- 3. a forked child on the inherited journal store ---------------------------------

FORK_RESUMES = r"""
import os, sys
from checkpointer import CheckpointWriter, PostgresJournalStore, Snapshot, load

store = PostgresJournalStore(os.environ["DSN"], schema=sys.argv[1])
messages = [{"role": "user", "content": f"m{i}"} for i in range(10)]
writer = CheckpointWriter(lambda: Snapshot("k", {"messages": messages}), store, exit_hooks=False)
writer.open()
go, wake = os.pipe()
pid = os.fork()
if pid == 0:  # a worker that takes the session over once the parent let it go
    os.close(wake)
    os.read(go, 1)
    previous = load(store, "k")
    mine = [*previous.state["messages"], {"role": "user", "content": "m15"}]
    child = CheckpointWriter(
        lambda: Snapshot("k", {"messages": mine}), store, exit_hooks=False, resume_from=previous
    )
    child.open()
    print("child", type(child.close()).__name__, flush=True)
    os._exit(0)
os.close(go)
for i in range(10, 15):
    messages.append({"role": "user", "content": f"m{i}"})
    writer.flush_sync()
print("parent", type(writer.close()).__name__, flush=True)
os.write(wake, b"x")
_, status = os.waitpid(pid, 0)
print("status", status, flush=True)
"""


def test_a_forked_child_resuming_through_the_inherited_journal_store_stores_each_message_once(
    pg: Cluster, schema: str
) -> None:
    """A forked child resumes the key through its copy of the parent's PostgresJournalStore,
    after the parent wrote on: the stored session is m0..m15, each message once."""
    child = _pg.spawn(FORK_RESUMES, pg.dsn(), schema)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err[-1500:]
    assert out.split() == ["parent", "Written", "child", "Written", "status", "0"], (out, err)
    stored = load(PostgresStore(pg.dsn(), schema=schema), "k")
    assert stored is not None
    assert [m["content"] for m in stored.state["messages"]] == [f"m{i}" for i in range(16)]


# -- 10. the store's own cut-off backend --------------------------------------------


def test_the_stores_own_cut_off_backend_is_never_another_writer(pg: Cluster, schema: str) -> None:
    """A backend of the store's own, cut off by the watchdog and not yet gone (stopped),
    is named as the store's own on every retry, never "locked by another writer"; once
    it is gone the key is taken."""
    store = PostgresStore(
        pg.dsn(), schema=schema, statement_timeout=1, lock_timeout=0.3, application_name="orph"
    )
    store.write("k", _pg.chunks("k", 1, b'"one"'))
    (backend,) = _pg.backends(pg, "orph")
    os.kill(backend, signal.SIGSTOP)  # a server process that stopped answering
    try:
        with pytest.raises(PostgresStoreError, match="no answer within"):
            store.write("k", _pg.chunks("k", 2, b'"two"'))  # the watchdog cuts it off
        for _ in range(2):
            with pytest.raises(PostgresStoreError) as refused:
                store.write("k", _pg.chunks("k", 2, b'"two"'))
            assert not isinstance(refused.value, KeyLockedError), refused.value
            assert f"own earlier connection (PostgreSQL backend {backend}" in str(refused.value)
    finally:
        os.kill(backend, signal.SIGCONT)  # it now ends (it was asked to)
    deadline = time.monotonic() + 20
    while backend in _pg.backends(pg, "orph"):  # the server reaps it a moment later
        assert time.monotonic() < deadline, f"backend {backend} never ended"
        time.sleep(0.02)
    store.write("k", _pg.chunks("k", 2, b'"two"'))
    assert _pg.state_of(store, "k") == "two"
    store.close()


# -- 11. the schema as an administrator sets it up ----------------------------------


def test_the_printed_schema_sql_runs_again_and_over_what_the_library_made(
    pg: Cluster, schema: str
) -> None:
    """`pg-schema --sql`'s SQL, run as one script, succeeds on an empty database, a second
    time, and over tables the library made on first use: version 3 each time."""
    from checkpointer._stores.postgres.schema import schema_sql

    other = schema + "_lib"
    PostgresStore(pg.dsn(), schema=other).create_schema()  # made on first use
    for target in (schema, schema, other):
        with _pg.admin(pg) as conn, conn.transaction():
            conn.execute(schema_sql(target).encode())
        assert PostgresStore(pg.dsn(), schema=target, create_schema=False).schema_version() == 3


def test_a_fleet_granted_at_schema_1_keeps_working_after_the_upgrade(
    pg: Cluster, schema: str
) -> None:
    """A role given grants_sql()'s grants on schema 1, upgraded by `pg-schema` (the
    admin's create_schema), writes and reads journal keys without a second round of
    grants; a create_schema by that role (not the owner) changes nothing and succeeds."""
    from checkpointer._stores.postgres.schema import _SCHEMA_SQL, grants_sql

    role = "app_" + schema[-8:]
    with _pg.admin(pg) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw'")
        conn.execute(_SCHEMA_SQL.format(s=f'"{schema}"').encode())  # a fleet of version 1
        conn.execute(grants_sql(schema, role))
    assert PostgresStore(pg.dsn(), schema=schema).create_schema() == 3  # `pg-schema`
    dsn = pg.dsn(user=role, password="pw")
    with PostgresJournalStore(dsn, schema=schema, create_schema=False) as journal:
        messages: list[dict[str, int]] = []
        with CheckpointWriter(
            lambda: Snapshot("j", {"messages": messages}), journal, exit_hooks=False
        ) as writer:
            for n in range(3):
                messages.append({"n": n})
                assert isinstance(writer.flush_sync(), Written)  # a compaction, then appends
        assert _pg.state_of(journal, "j") == {"messages": messages}
        assert journal.create_schema() == 3
        assert journal.move_aside("j", "old") is not None


# -- 12. the server restarted during the final write ---------------------------------


@pytest.mark.parametrize("store_type", STORES, ids=lambda t: t.__name__)
def test_a_write_whose_connection_was_lost_midway_is_made_again(
    pg: Cluster, schema: str, eater: CommitEater, store_type: type[PostgresStore]
) -> None:
    """A connection lost in the middle of the final write (a server restart during the
    INSERT, the statement never arrived) is replaced and the write made again in the same
    flush, once the server answers again: it lands (both stores)."""
    store = store_type(_through(pg, eater.port), schema=schema, statement_timeout=3)
    state = {"messages": ["first"]}
    writer = CheckpointWriter(
        lambda: Snapshot("k", state), store, exit_hooks=False, write_on_start=False
    )
    writer.open()
    # The fenced upsert's text (the first write sends it), then a server not up yet.
    eater.cut(b".checkpoints AS c", then_refuse=3)
    assert isinstance(writer.flush_sync(), Written)
    assert eater.was_cut.is_set()
    state["messages"].append("final")
    assert isinstance(writer.close(), Written)
    store.close()
    stored = load(PostgresStore(pg.dsn(), schema=schema), "k")
    assert stored is not None and stored.state == state


def test_a_restarting_server_is_named_as_such() -> None:
    """A connection refused as the server shuts down or starts up says so, not "check the
    DSN"."""
    store = PostgresStore("host=127.0.0.1 port=1", schema="s")
    for answer in ("the database system is shutting down", "the database system is starting up"):
        why = store._connect_failure(Exception(f"FATAL:  {answer}"))
        assert why.endswith("the server is restarting (or failing over); the next try reconnects")


# -- 13. a rolling upgrade from schema 2, with the released code still writing -------

RELEASE_2 = "b5182af^"  # the last commit of the release that installs schema 2

# A worker of that release: a journal store's writer that committed before the upgrade
# (a compaction, then an append) and is told what to do next, one line at a time.
_OLD_WORKER = r"""
import os, sys
import checkpointer
from checkpointer import CheckpointWriter, PostgresJournalStore, Snapshot
store = PostgresJournalStore(os.environ["DSN"], schema=sys.argv[1], statement_timeout=5)
sessions = {"old": [{"role": "user", "content": "m0"}], "new": []}
writers = {}
def writer(key):
    if key not in writers:
        writers[key] = CheckpointWriter(
            lambda: Snapshot(key, {"messages": list(sessions[key])}), store, exit_hooks=False)
        writers[key].open()
    return writers[key]
writer("old")  # its first checkpoint: a compaction
print("ready", checkpointer.__file__, flush=True)
for line in sys.stdin:
    what, key, content = line.split()
    if what == "load":  # a key this release wrote
        got = checkpointer.load(store, key)
        print([m["content"] for m in got.state["messages"]], flush=True)
        continue
    if what == "edit":  # an earlier message: the next commit is a compaction
        sessions[key][0] = {"role": "user", "content": content}
    else:
        sessions[key].append({"role": "user", "content": content})
    print(repr(writer(key).flush_sync()), flush=True)
for w in writers.values():
    print(repr(w.close()), flush=True)
"""


@pytest.fixture(scope="module")
def release_2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The code of the release of schema 2, unpacked from this repository's history."""
    root = Path(__file__).resolve().parent.parent
    found = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--verify", "--quiet", RELEASE_2 + "^{commit}"],
        capture_output=True,
    )
    if found.returncode != 0:
        pytest.skip(f"no git history with {RELEASE_2} (the schema-2 release) here")
    where = tmp_path_factory.mktemp("release_2")
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", RELEASE_2, "checkpointer"],
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive.stdout, check=True)
    return where


def test_a_schema_2_worker_keeps_writing_through_the_upgrade_to_3(
    pg: Cluster, schema: str, release_2: Path
) -> None:
    """A running worker of the schema-2 release (its real code) appends, compacts and
    starts a key after `pg-schema` installed 3: every write lands, each row once,
    numbered in order; this release loads all of it and writes on from there, and
    the old worker loads a key this release wrote."""
    env = {**os.environ, "PYTHONPATH": str(release_2), "DSN": pg.dsn()}
    with subprocess.Popen(
        [sys.executable, "-c", _OLD_WORKER, schema],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=str(release_2),
    ) as old:
        stdin, stdout = old.stdin, old.stdout
        assert stdin is not None and stdout is not None

        def tell(*lines: str) -> list[str]:
            said = []
            for line in lines:
                stdin.write(line + "\n")
                stdin.flush()
                said.append(stdout.readline().strip())
            return said

        try:
            first = stdout.readline()  # it created schema 2 and wrote "old" there
            assert first.startswith("ready " + str(release_2)), first
            said = tell("add old m1")  # an append, at schema 2
            assert PostgresStore(pg.dsn(), schema=schema).schema_version() == 2
            assert PostgresStore(pg.dsn(), schema=schema).create_schema() == 3  # `pg-schema`
            said += tell("add old m2", "edit old m0-edited", "add old m3")  # schema 3 now
            said += tell("add new n0", "add new n1")  # a key it starts after the upgrade
            ours = ["t0", "t1"]
            with PostgresJournalStore(pg.dsn(), schema=schema) as journal, CheckpointWriter(
                lambda: Snapshot("ours", {"messages": [{"content": c} for c in ours]}),
                journal, exit_hooks=False,
            ) as writer:  # fmt: skip
                ours.append("t2")
                assert isinstance(writer.flush_sync(), Written)  # a compaction, an append
            assert tell("load ours -") == [str(ours)]  # the old worker reads what we wrote
            out, err = old.communicate(timeout=60)
        finally:
            if old.poll() is None:
                old.kill()
    said[4:5] = []  # n0: written by the writer's open, so this flush was "unchanged"
    assert all(s.startswith("Written(") for s in said + out.split("\n")[:-1]), (said, out, err)
    expect = {"old": ["m0-edited", "m1", "m2", "m3"], "new": ["n0", "n1"]}
    with _pg.admin(pg) as conn:
        rows = conn.execute(
            f'SELECT key, n, kind FROM "{schema}".journal ORDER BY key, n'
        ).fetchall()
        heads = conn.execute(f'SELECT key, format FROM "{schema}".checkpoints').fetchall()
    assert rows == [
        ("new", 1, "compaction"),
        ("new", 2, "message"),
        ("old", 1, "compaction"),  # the edit: m0-edited, m1, m2
        ("old", 2, "message"),
        ("ours", 1, "compaction"),
        ("ours", 2, "message"),
    ], rows
    assert sorted(heads) == [("new", 1), ("old", 1), ("ours", 1)]  # both releases' heads
    journal = PostgresJournalStore(pg.dsn(), schema=schema)
    for key, contents in expect.items():
        got = load(journal, key)
        assert got is not None and [m["content"] for m in got.state["messages"]] == contents
    prev = load(journal, "old")
    assert prev is not None
    messages = list(prev.state["messages"])
    with CheckpointWriter(
        lambda: Snapshot("old", {"messages": messages}), journal, exit_hooks=False,
        resume_from=prev,
    ) as writer:  # fmt: skip
        messages.append({"role": "user", "content": "m4"})
        assert isinstance(writer.flush_sync(), Written)
    journal.close()
    got = load(PostgresStore(pg.dsn(), schema=schema), "old")
    assert got is not None
    assert [m["content"] for m in got.state["messages"]] == [*expect["old"], "m4"]


def test_the_upgrade_waits_for_a_schema_2_writer_between_its_head_and_its_rows(
    pg: Cluster, schema: str
) -> None:
    """`pg-schema` run while a writer of the running release has written a head and not
    yet its rows waits for that writer, which commits: no deadlock, nothing refused."""
    from checkpointer._stores.postgres.schema import _MIGRATE_2_SQL, _SCHEMA_SQL

    q = f'"{schema}"'
    with _pg.admin(pg) as conn:
        conn.execute(_SCHEMA_SQL.format(s=q).encode())
        conn.execute(_MIGRATE_2_SQL.format(s=q).encode())
    outcome: list[object] = []

    def upgrade() -> None:
        try:
            outcome.append(PostgresStore(pg.dsn(), schema=schema).create_schema())
        except Exception as exc:  # reported below
            outcome.append(exc)

    with psycopg.connect(pg.dsn(), application_name="v2-writer") as writer:
        writer.execute(  # what a schema-2 journal commit does first: the head
            f"INSERT INTO {q}.checkpoints (key, seq, format, meta, state, writer, journal) "
            "VALUES ('k', 1, 1, '{}'::jsonb, '', 'v2', true)"
        )
        thread = threading.Thread(target=upgrade)
        thread.start()
        waiting: list[tuple[int]] = []
        deadline = time.monotonic() + 60
        while not waiting and time.monotonic() < deadline and thread.is_alive():
            with _pg.admin(pg) as conn:
                waiting = conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                ).fetchall()
            time.sleep(0.01)
        assert waiting, ("the upgrade never waited for the writer", outcome)
        writer.execute(  # ... then its rows, numbered by the sequence of schema 2
            f"INSERT INTO {q}.journal (key, kind, body) VALUES ('k', 'compaction', 'x')"
        )
        writer.commit()
    thread.join(60)
    assert outcome == [3]
    with _pg.admin(pg) as conn:
        assert conn.execute(f"SELECT key, kind FROM {q}.journal").fetchall() == [
            ("k", "compaction")
        ]
