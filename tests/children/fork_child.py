"""A child program for ``tests/reliability/test_fork.py``: a writer whose process forks.

Run as ``python fork_child.py KIND TARGET WORK --backend B --scenario S``.
``KIND`` is ``file``, ``journal`` or ``postgres``; ``TARGET`` the root
directory or the DSN (``--schema`` names the PostgreSQL schema); ``WORK`` a
directory for ``foreign.log``.  The session is ``{"messages": [...]}`` under
key ``k``.  The program writes ``m1``, forks, writes ``m2``..``m5`` and then:

* ``pool``: a ``multiprocessing`` pool (fork start method) whose two workers
  each open a writer of their own (key ``w<i>``, the store object they
  inherited) and block; ``pool.terminate()`` SIGTERMs them.
* ``group``: the same pool, then ``m6``..``m50`` notified but not written,
  ``READY``, and the program waits to be killed with its process group.
* ``fork``: ``os.fork()``; the child waits for ``m2``..``m5`` to be written,
  changes its copy of the session, says what ``flush_sync()`` of the
  inherited writer returns, opens a writer of its own (key ``child``, the
  inherited store object) and ends.  The sync program ends it with
  ``sys.exit(0)`` from inside the parent's ``with`` blocks, so the
  unwinding and atexit run.  An async program's child cannot unwind the
  parent's running event loop (asyncio refuses: "no running event loop",
  it checks the pid; a trio parent is then stuck in ``epoll_wait``), so it
  ends the only way it can: the exit functions (``atexit``), then
  ``os._exit(0)``.
* ``orphans``: the pool, then ``READY``; the test SIGKILLs this program
  while the workers live on.

Then (``pool``, ``fork``) a ``write_now`` with nothing new, ``CHECK``, a
line on stdin ("carry on"), ``m6`` written, the writer closed, ``DONE``.

Every call of the session's ``source()`` from a process other than this
program appends that pid to ``WORK/foreign.log``: nothing of the parent's
writer may run in a forked child, so the test expects no such file.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import multiprocessing
import multiprocessing.pool
import os
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any

import anyio

from checkpointer import CheckpointWriter, FileStore, JournalStore, Snapshot
from checkpointer._stores.postgres.store import PostgresStore
from checkpointer.stores import Store

KEY = "k"
HANG = 30.0  # hang guard of every wait; the test kills us before
WORKERS = 2
TIMERS: dict[str, Any] = {"debounce": 60.0, "min_interval": 60.0, "max_wait": 120.0}

STORE: Store | None = None  # the store, for the pool workers to inherit
STARTED: Any = None  # multiprocessing queue: a worker's pid once its writer is open


def say(*words: object) -> None:
    print(*words, flush=True)


class Session:
    """The agent's state; notes any ``source()`` call made from another process."""

    def __init__(self, work: str) -> None:
        self.messages: list[dict[str, str]] = []
        self.owner = os.getpid()
        self.log = os.path.join(work, "foreign.log")

    def add(self, first: int, last: int) -> None:
        self.messages += [{"role": "user", "content": f"m{i}"} for i in range(first, last + 1)]

    def snapshot(self) -> Snapshot:
        if os.getpid() != self.owner:
            fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.write(fd, b"%d\n" % os.getpid())
            os.close(fd)
        return Snapshot(KEY, {"messages": list(self.messages)})


def make_store(args: argparse.Namespace) -> Store:
    if args.kind == "file":
        return FileStore(args.target)
    if args.kind == "journal":
        return JournalStore(args.target)
    return PostgresStore(args.target, schema=args.schema, connect_timeout=5, statement_timeout=5)


@contextlib.contextmanager
def closing_store(store: Store) -> Iterator[None]:
    """``with store:`` for a PostgresStore (a forked child unwinds through it too)."""
    if isinstance(store, PostgresStore):
        with store:
            yield
    else:
        yield


# -- the forked processes ---------------------------------------------------------


def init_worker(started: Any) -> None:
    global STARTED
    STARTED = started


def worker_task(i: int) -> None:
    """In a pool worker: a writer of its own, a change pending, then block until killed."""
    assert STORE is not None
    state = {"n": 1}
    writer = CheckpointWriter(lambda: Snapshot(f"w{i}", dict(state)), STORE, **TIMERS)
    writer.open()  # writes n=1; the SIGTERM flush writes n=2, live=False
    state["n"] = 2
    writer.notify()
    STARTED.put(os.getpid())
    time.sleep(HANG)


def start_pool() -> tuple[multiprocessing.pool.Pool, list[int]]:
    ctx = multiprocessing.get_context("fork")
    started = ctx.SimpleQueue()
    pool = ctx.Pool(WORKERS, initializer=init_worker, initargs=(started,))
    pool.map_async(worker_task, range(WORKERS), chunksize=1)
    return pool, sorted(started.get() for _ in range(WORKERS))


def fork_child(
    session: Session, store: Store, writer: CheckpointWriter[Any], *, unwind: bool
) -> tuple[int, int]:
    """``os.fork()``; returns (child pid, the fd that tells the child to go on) in the parent."""
    r, w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(r)
        return pid, w
    os.close(w)
    os.read(r, 1)  # the parent has written m2..m5
    session.add(99, 99)  # the child's own value: it must never reach the parent's key
    writer.notify()
    say("CHILD-FLUSH", writer.flush_sync())
    state = {"n": 1}
    writer = CheckpointWriter(lambda: Snapshot("child", dict(state)), store, **TIMERS)
    writer.open()  # writes n=1; atexit writes n=2, live=False
    state["n"] = 2
    writer.notify()
    if unwind:
        sys.exit(0)  # unwinds the parent's with blocks, then atexit
    atexit._run_exitfuncs()
    os._exit(0)


def let_child_end(child: tuple[int, int]) -> None:
    pid, w = child
    os.write(w, b"x")
    os.close(w)
    _, status = os.waitpid(pid, 0)
    say("CHILD", pid, os.waitstatus_to_exitcode(status))


# -- the program ----------------------------------------------------------------


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("kind", choices=["file", "journal", "postgres"])
    p.add_argument("target")
    p.add_argument("work")
    p.add_argument("--schema", default="checkpointer")
    p.add_argument("--backend", choices=["asyncio", "trio", "sync"], default="sync")
    p.add_argument("--scenario", choices=["pool", "group", "fork", "orphans"], required=True)
    args = p.parse_args()
    for signum in (signal.SIGTERM, signal.SIGHUP):  # the test runner may ignore SIGHUP
        signal.signal(signum, signal.SIG_DFL)
    global STORE
    STORE = make_store(args)
    say("PID", os.getpid())
    if args.backend == "sync":
        return run_sync(args, STORE)
    return int(anyio.run(run_async, args, STORE, backend=args.backend))


def run_sync(args: argparse.Namespace, store: Store) -> int:
    session = Session(args.work)
    with closing_store(store), CheckpointWriter(session.snapshot, store, **TIMERS) as writer:
        session.add(1, 1)
        say("W1", writer.flush_sync())
        pool = child = None
        if args.scenario == "fork":
            child = fork_child(session, store, writer, unwind=True)
        else:
            pool, pids = start_pool()
            say("WORKERS", *pids)
        session.add(2, 5)
        say("W2", writer.flush_sync())
        if args.scenario in ("group", "orphans"):
            if args.scenario == "group":
                session.add(6, 50)
                writer.notify()
            say("READY")
            time.sleep(HANG)
            return 99
        if pool is not None:
            pool.terminate()
            pool.join()
        if child is not None:
            let_child_end(child)
        say("AGAIN", writer.flush_sync())
        say("CHECK")
        sys.stdin.readline()
        session.add(6, 6)
        writer.notify()
        say("W3", writer.flush_sync())
        say("CLOSE", writer.close())
    say("DONE")
    return 0


async def run_async(args: argparse.Namespace, store: Store) -> int:
    session = Session(args.work)
    with closing_store(store):
        async with CheckpointWriter(session.snapshot, store, **TIMERS) as writer:
            session.add(1, 1)
            say("W1", await writer.write_now())
            pool = child = None
            if args.scenario == "fork":
                child = fork_child(session, store, writer, unwind=False)
            else:
                pool, pids = start_pool()
                say("WORKERS", *pids)
            session.add(2, 5)
            say("W2", await writer.write_now())
            if args.scenario in ("group", "orphans"):
                if args.scenario == "group":
                    session.add(6, 50)
                    writer.notify()
                say("READY")
                await anyio.sleep(HANG)
                return 99
            if pool is not None:
                pool.terminate()
                pool.join()
            if child is not None:
                let_child_end(child)
            say("AGAIN", await writer.write_now())
            say("CHECK")
            await anyio.to_thread.run_sync(sys.stdin.readline)
            session.add(6, 6)
            writer.notify()
            say("W3", await writer.write_now())
            say("CLOSE", await writer.aclose())
    say("DONE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
