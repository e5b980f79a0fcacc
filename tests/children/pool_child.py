"""A child program for ``tests/reliability/test_fork_pool.py``: fork pools ended by ``terminate()``.

Run as ``python pool_child.py ROOT --backend B --rounds N``.  A writer of key
``k`` on a ``FileStore`` at ``ROOT`` is open, so its SIGTERM and SIGHUP
handlers are installed, and has written ``{"rounds": 0}``.  Each round ends
two ``multiprocessing`` pools (fork start method) the way ``with Pool()``
does, by ``terminate()``: one after mapping a small task (its workers idle
on the task queue), one as soon as it is made (its workers just forked).
Then the program says ``ROUND i`` and notifies the writer of
``{"rounds": i}``.  On asyncio and trio every other round makes its pools
from a worker thread, as ``anyio.to_thread.run_sync`` would.  At the end the
writer is closed (its final write has the last round) and the program says
``DONE``.

The workers never use the writer: they only inherit it.

With ``--early-sigterm`` the sync writer is open and the program forks a
child and SIGTERMs it before the child has run at all: the program's thread
is pinned to one CPU under SCHED_FIFO, so the child (on that CPU, at the same
priority) waits behind it until it lets go.  A surviving child exits 0 after
a while.  The program says ``CHILD`` and the child's exit status (-15 when
the SIGTERM killed it), or ``SKIP`` where SCHED_FIFO is not allowed.

With ``--fork-in-flush`` a one-worker fork pool runs an hour-long task, the
writer (of ``--backend``) is open, and the program says ``READY`` and waits
for a SIGTERM; the final write it starts calls ``source()``, which has a
thread fork a ``multiprocessing`` process that sleeps for an hour (as a
pool's worker, forked to replace one the group's SIGTERM ended, waits on its
task queue for good) and says ``FORKED`` and its pid before it returns.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import sys
import threading
import time
from typing import Any

import anyio

from checkpointer import CheckpointWriter, FileStore, Snapshot

WORKERS = 8  # more idle workers, more chances for the race per round
STATE = {"rounds": 0}


def say(*words: object) -> None:
    print(*words, flush=True)


def square(x: int) -> int:
    return x * x


def pools() -> None:
    """Two pools, each ended by ``terminate()`` as ``with`` ends it."""
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(WORKERS) as pool:
        assert pool.map(square, range(4 * WORKERS), chunksize=1)[-1] == (4 * WORKERS - 1) ** 2
    with ctx.Pool(WORKERS):
        pass


def done(i: int, writer: CheckpointWriter[Any]) -> None:
    STATE["rounds"] = i
    writer.notify()
    say("ROUND", i)


def make_writer(root: str) -> CheckpointWriter[Any]:
    return CheckpointWriter(lambda: Snapshot("k", dict(STATE)), FileStore(root), debounce=0.01)


def run_sync(args: argparse.Namespace) -> None:
    with make_writer(args.root) as writer:
        writer.flush_sync()
        for i in range(1, args.rounds + 1):
            pools()
            done(i, writer)


async def run_async(args: argparse.Namespace) -> None:
    async with make_writer(args.root) as writer:
        await writer.write_now()
        for i in range(1, args.rounds + 1):
            if i % 2:
                pools()  # on the event loop's thread, blocking it
            else:
                await anyio.to_thread.run_sync(pools)
            done(i, writer)


def early_sigterm(root: str) -> None:
    with make_writer(root) as writer:
        writer.flush_sync()
        try:
            os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        except PermissionError as exc:
            say("SKIP no SCHED_FIFO here:", exc)
            return
        pid = os.fork()
        if pid == 0:
            time.sleep(5.0)  # alive after this: the SIGTERM was lost
            os._exit(0)
        os.kill(pid, signal.SIGTERM)
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))  # the child runs now
        _, status = os.waitpid(pid, 0)
        say("CHILD", os.waitstatus_to_exitcode(status))


def fork_in_flush() -> Snapshot:
    def start() -> None:
        worker = multiprocessing.get_context("fork").Process(target=time.sleep, args=(3600,))
        worker.start()
        say("FORKED", worker.pid)

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    return Snapshot("k", dict(STATE))


def wait_for_sigterm(args: argparse.Namespace) -> None:
    writer = CheckpointWriter(fork_in_flush, FileStore(args.root), write_on_start=False)
    pool = multiprocessing.get_context("fork").Pool(1)
    pool.apply_async(time.sleep, (3600,))
    if args.backend == "sync":
        with writer:
            say("READY")
            time.sleep(60)
    else:

        async def wait() -> None:
            async with writer:
                say("READY")
                await anyio.sleep(60)

        anyio.run(wait, backend=args.backend)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("--backend", choices=["asyncio", "trio", "sync"], default="sync")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--early-sigterm", action="store_true")
    p.add_argument("--fork-in-flush", action="store_true")
    args = p.parse_args()
    for signum in (signal.SIGTERM, signal.SIGHUP):  # the test runner may ignore SIGHUP
        signal.signal(signum, signal.SIG_DFL)
    say("PID", os.getpid())
    if args.early_sigterm:
        early_sigterm(args.root)
        return 0
    if args.fork_in_flush:
        wait_for_sigterm(args)
        return 0
    if args.backend == "sync":
        run_sync(args)
    else:
        anyio.run(run_async, args, backend=args.backend)
    say("DONE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
