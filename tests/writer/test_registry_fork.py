"""``SessionRegistry`` and ``os.fork()`` inside the running loop, with keys kept open.

A real program: its store fails every write, so each key's idle close keeps it open (its
writer detached, retrying in worker threads); it forks in the middle of that, and the child
ends as a child forked inside a running loop must, ``os._exit()`` after the exit functions
(unwinding the copied loop breaks the parent's: ``docs/reliability.md``, Forks).  Then the
store works again and ``aclose()`` writes every key.  Several rounds per program, so the
fork lands at different moments of the retries.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from checkpointer import FileStore, load
from tests._support import HANG_GUARD, child_env

ROUNDS = 20
KEYS = 4

PROGRAM = textwrap.dedent(
    """
    import atexit, errno, logging, os, sys
    import anyio
    from checkpointer import FileStore, Limits, SessionRegistry, Snapshot, load

    root, backend, rounds, keys = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])

    class Full(FileStore):
        failing = True

        def write(self, key, chunks, **kw):
            if self.failing:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.location(key))
            return super().write(key, chunks, **kw)

    class Kept(logging.Handler):
        def __init__(self):
            super().__init__()
            self.keys = set()

        def emit(self, record):
            if "kept open" in record.getMessage():
                self.keys.add(record.args[0])

    async def one_round(r):
        store, n, closed, kept = Full(root), {}, {}, Kept()
        logging.getLogger("checkpointer").addHandler(kept)

        def resume(key):
            checkpoint = load(store, key)
            n[key] = 0 if checkpoint is None else checkpoint.state["n"]
            return checkpoint

        registry = SessionRegistry(
            lambda key: Snapshot(key, {"n": n[key]}) if key in n else None,
            store,
            resume=resume,
            on_close=lambda key, result: closed.__setitem__(key, result),
            idle_timeout=0.01,
            limits=Limits(retry_initial=0.001, retry_max=0.005),
        )
        async with registry:
            for i in range(keys):
                async with registry.session(f"k{i}"):
                    n[f"k{i}"] += 1
            with anyio.fail_after(60):
                while len(kept.keys) < keys:
                    await anyio.sleep(0.001)
            await anyio.sleep(0.001 * r)  # the fork at another moment of the retries
            pid = os.fork()
            if pid == 0:
                atexit._run_exitfuncs()  # the parent's keys are not this child's to write
                os._exit(0)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0, status
            store.failing = False
            with anyio.fail_after(60):
                await registry.aclose()
        logging.getLogger("checkpointer").removeHandler(kept)
        assert sorted(closed) == [f"k{i}" for i in range(keys)], closed
        assert all(type(result).__name__ == "Written" for result in closed.values()), closed
        print("ROUND", r, flush=True)

    async def main():
        for r in range(rounds):
            await one_round(r)

    anyio.run(main, backend=backend)
    """
)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_fork_while_keys_are_kept_open_leaves_them_to_the_parent(
    tmp_path: Path, backend: str
) -> None:
    """Keys kept open through a store's outage, a fork inside the loop whose child exits at
    once: each round the parent's aclose() writes every key (n rounds on from the first),
    not live, and lets its lock go."""
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(tmp_path), backend, str(ROUNDS), str(KEYS)],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD * 2,
        env=child_env(),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [w for r in range(ROUNDS) for w in ("ROUND", str(r))]
    store = FileStore(tmp_path)
    for i in range(KEYS):
        checkpoint = load(store, f"k{i}")
        assert checkpoint is not None
        assert (checkpoint.state["n"], checkpoint.meta.live) == (ROUNDS, False)
        store.lock(f"k{i}").release()  # free: no writer of the parent's nor the child's holds it
