"""What a fleet meets on PostgreSQL: lost commit answers, signals inside store calls,
forks, shared stores, the schema as an administrator installs it, server restarts.

On a real throwaway cluster (``tests/pg.py``), each test in its own schema, as in
``tests/stores/postgres/test_store.py``; process tests run real children and look at the rows.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from checkpointer import (
    CheckpointWriter,
    Failed,
    PostgresJournalStore,
    PostgresStore,
    Snapshot,
    Written,
    load,
)
from checkpointer.stores import KeyLockedError, PostgresStoreError
from tests.pg import Cluster
from tests.stores.postgres import test_store as _pg

pytestmark = _pg.pytestmark
cluster = _pg.cluster
pg = _pg.pg
schema = _pg.schema

STORES = [PostgresStore, PostgresJournalStore]
_COMMIT = b"Q\x00\x00\x00\x0bCOMMIT\x00"  # the simple-query COMMIT psycopg sends
_TERMINATE = b"X\x00\x00\x00\x04"  # what psycopg sends as it closes a connection


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
        self._linger = False
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

    def linger(self) -> None:
        """Keep the server's side of a connection the client closes open until ``close()``:
        a server that ends a closed session late (loaded, or a network that lost the FIN)."""
        self._linger = True

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
                if self._linger and data.endswith(_TERMINATE):
                    server.sendall(data[: -len(_TERMINATE)])
                    return  # the server's side stays open: its session and locks with it
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
    """A write the server committed but whose answer was lost is tried again on a new
    connection, which finds its own revision there: Written, once, not a conflict; later
    writes and the close land (fresh key and resumed key, both stores)."""
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
        first = writer.flush_sync()
        assert eater.eaten.wait(10)
        assert isinstance(first, Written), first
        landed = load(direct, "k")
        assert landed is not None and landed.state == state  # the server committed it once
        assert landed.meta.seq == first.seq == (1 if loaded is None else loaded.meta.seq + 1)
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


def test_the_store_recognises_its_own_write_whose_answer_was_lost(
    pg: Cluster, schema: str, eater: CommitEater
) -> None:
    """write() and a journal commit whose COMMIT answer was lost: the store reconnects,
    finds its own revision stored, and returns as written (no StaleWriteError)."""
    plain = PostgresStore(_through(pg, eater.port), schema=schema, statement_timeout=3)
    journal = PostgresJournalStore(_through(pg, eater.port), schema=schema, statement_timeout=3)
    try:
        _pg.put(plain, "p", 1, b'"one"')
        eater.arm()
        assert _pg.put(plain, "p", 2, b'"two"') > 0
        assert eater.eaten.is_set()
        eater.eaten.clear()
        state: dict[str, list[str]] = {"messages": ["a"]}
        journal.commit("j", _pg.meta("j", 1), journal.stage("j", state), expected=None)
        state["messages"].append("b")
        eater.arm()
        journal.commit("j", _pg.meta("j", 2), journal.stage("j", state), expected="r1")
        assert eater.eaten.is_set()
    finally:
        plain.close()
        journal.close()
    direct = PostgresStore(pg.dsn(), schema=schema)
    assert _pg.state_of(direct, "p") == "two" and direct.revision("p") == "r2"
    assert _pg.state_of(direct, "j") == state and direct.revision("j") == "r2"
    with _pg.admin(pg) as conn:
        rows = conn.execute(f'SELECT kind FROM "{schema}".journal ORDER BY n').fetchall()
    assert rows == [("compaction",), ("message",)]  # the append's row, once
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


@pytest.mark.parametrize("store_type", STORES, ids=lambda t: t.__name__)
def test_store_close_frees_the_keys_before_it_returns(
    pg: Cluster, schema: str, eater: CommitEater, store_type: type[PostgresStore]
) -> None:
    """store.close() unlocks its keys on the server before it closes the connection: a
    session the server ends late (here: never, until the proxy closes) keeps no key from
    another store, nor from this one's next connection."""
    store = store_type(_through(pg, eater.port), schema=schema)
    writer = CheckpointWriter(lambda: Snapshot("k", {"n": 1}), store, exit_hooks=False)
    writer.open()
    assert store.held() == {"k"}
    eater.linger()
    store.close()
    other = store_type(pg.dsn(), schema=schema)
    assert other.locked_by("k") is None
    assert other.acquire("k") is None
    other.release("k")
    assert isinstance(writer.close(), Written)  # its store's next connection takes the key
    other.close()


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
    _pg.put(store, "k", 1, b'"one"')
    (backend,) = _pg.backends(pg, "orph")
    os.kill(backend, signal.SIGSTOP)  # a server process that stopped answering
    try:
        with pytest.raises(PostgresStoreError, match="no answer within"):
            _pg.put(store, "k", 2, b'"two"')  # the watchdog cuts it off
        for _ in range(2):
            with pytest.raises(PostgresStoreError) as refused:
                _pg.put(store, "k", 2, b'"two"')
            assert not isinstance(refused.value, KeyLockedError), refused.value
            assert f"own earlier connection (PostgreSQL backend {backend}" in str(refused.value)
    finally:
        os.kill(backend, signal.SIGCONT)  # it now ends (it was asked to)
    deadline = time.monotonic() + 20
    while backend in _pg.backends(pg, "orph"):  # the server reaps it a moment later
        assert time.monotonic() < deadline, f"backend {backend} never ended"
        time.sleep(0.02)
    _pg.put(store, "k", 2, b'"two"')
    assert _pg.state_of(store, "k") == "two"
    store.close()


# -- 11. the schema as an administrator sets it up ----------------------------------


def test_the_printed_schema_sql_runs_again_and_over_what_the_library_made(
    pg: Cluster, schema: str
) -> None:
    """`pg-schema --sql`'s SQL, run as one script, succeeds on an empty database, a second
    time, and over tables the library made on first use: the one version each time."""
    from checkpointer._stores.postgres.schema import SCHEMA_VERSION, schema_sql

    other = schema + "_lib"
    PostgresStore(pg.dsn(), schema=other).create_schema()  # made on first use
    for target in (schema, schema, other):
        with _pg.admin(pg) as conn, conn.transaction():
            conn.execute(schema_sql(target).encode())
        store = PostgresStore(pg.dsn(), schema=target, create_schema=False)
        assert store.schema_version() == SCHEMA_VERSION
        store.close()


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
    # The insert's text (the first write of a key sends it), then a server not up yet.
    eater.cut(b".checkpoints (key, revision", then_refuse=3)
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
