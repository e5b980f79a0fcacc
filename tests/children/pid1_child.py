"""A child program for ``tests/reliability/test_pid1.py``: a container's PID 1 survives SIGTERM.

Run as ``python pid1_child.py ROOT`` as the init of a new PID namespace
(``unshare -p --fork``), where a signal's default action does not end it.  A
sync writer of key ``k`` on a ``FileStore`` at ``ROOT`` is open and a fork
pool of two workers has run a map.  The program says ``READY`` and reads a
line of stdin; the test SIGTERMs it before it writes that line, so the
handler (the final write) has run when the line arrives.  Then it says, one
per line: ``CHILDREN same`` (or ``changed``: its pool workers were ended),
``POOL`` and a map's result (``HUNG`` after the guard), ``FORK`` and a fork
child's exit status, ``POPEN`` and the return code of a ``Popen`` with a
``preexec_fn``, and ``LIVE`` and the stored checkpoint's ``live`` flag; and ends (``os._exit``).
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys

from checkpointer import CheckpointWriter, FileStore, Snapshot, load

GUARD = 30.0  # a hang guard, never a timing assertion


def square(x: int) -> int:
    return x * x


def say(*words: object) -> None:
    print(*words, flush=True)


def main() -> None:
    assert os.getpid() == 1, f"not a PID namespace's init: pid {os.getpid()}"
    store = FileStore(sys.argv[1])
    ctx = multiprocessing.get_context("fork")
    with CheckpointWriter(lambda: Snapshot("k", {"n": 1}), store) as writer:
        writer.flush_sync()
        pool = ctx.Pool(2)  # left to os._exit: ending it hangs where its workers die as made
        pool.map(square, range(4))
        children = {child.pid for child in multiprocessing.active_children()}
        say("READY")
        sys.stdin.readline()  # the SIGTERM lands before this line does
        now = {child.pid for child in multiprocessing.active_children()}
        say("CHILDREN", "same" if now == children else "changed")
        try:
            say("POOL", pool.map_async(square, range(4)).get(timeout=GUARD))
        except multiprocessing.TimeoutError:
            say("POOL HUNG")
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        say("FORK", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        say("POPEN", subprocess.run(["true"], preexec_fn=lambda: None, check=False).returncode)
        checkpoint = load(store, "k")
        say("LIVE", checkpoint is not None and checkpoint.meta.live)
        os._exit(0)


if __name__ == "__main__":
    main()
