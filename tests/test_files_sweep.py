"""The temp sweep against live writes in other processes, whatever their pids say.

Two containers on one volume are both pid 1: each would take the other's
temp files for its own earlier run's debris.  A write holds an ``flock`` on
its temp until after the rename, and the sweep removes only a temp it can
lock and that is old (``atomic.STALE_AFTER``).  The processes here are real
and so are the files and locks; only the pid each one believes it has is
faked (the ``_me`` seam), as ``unshare --pid`` would make it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from checkpointer._stores import atomic

AS_PID_ONE = """
import json, os, sys
from checkpointer import FileStore
from checkpointer._stores import atomic as _atomic

real = _atomic._me()
_atomic._me = lambda: (1, real[1])  # pid 1 of a container of its own
root, role = sys.argv[1], sys.argv[2]
if role == "writer":  # stops after the temp's fsync until told to go on
    def pause(fd):
        if not getattr(pause, "done", False):
            pause.done = True
            print(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")), flush=True)
            sys.stdin.readline()
        os.fsync(fd)
    store = FileStore(root)
    _atomic.write_atomic(store.location("a"), [b'{"from": "A"}'], fsync=pause)
    print("written", flush=True)
else:  # a store opening: its sweep
    removed = _atomic.sweep_temps(root)
    FileStore(root).open()
    print(json.dumps(sorted(map(os.path.basename, removed))))
"""


def as_pid_one(root: Path, role: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", AS_PID_ONE, str(root), role],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def sweep_as_pid_one(root: Path) -> list[str]:
    opener = as_pid_one(root, "sweeper")
    out, err = opener.communicate(timeout=60)
    assert opener.returncode == 0, err
    removed: list[str] = json.loads(out)
    return removed


def test_a_pid_one_sweep_keeps_the_temp_of_another_pid_one_write_in_flight(tmp_path: Path) -> None:
    """Container B (pid 1) opening the store keeps the locked temp of A (pid 1), however old."""
    writer = as_pid_one(tmp_path, "writer")
    assert writer.stdin is not None and writer.stdout is not None
    try:
        temp = writer.stdout.readline().strip()
        assert temp.startswith(".a.json.1.s") and temp.endswith(".tmp"), temp
        os.utime(tmp_path / temp, (0, 0))  # old: only the lock can tell it is live
        assert sweep_as_pid_one(tmp_path) == []
        assert (tmp_path / temp).exists()
        writer.stdin.write("go\n")
        writer.stdin.flush()
        assert writer.stdout.readline() == "written\n"
    finally:
        _, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err
    assert (tmp_path / "a.json").read_bytes() == b'{"from": "A"}'
    assert os.listdir(tmp_path) == ["a.json"]


def test_a_pid_one_sweep_removes_unlocked_debris_and_a_new_temp_once_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unlocked debris of another pid-1 run goes; a temp of mode 000 (maybe unlocked yet) waits."""
    other = "s" + "0" * 15
    debris, new = (tmp_path / f".{key}.json.1.{other}q1w2e3r4.tmp" for key in "ab")
    debris.write_bytes(b"")  # killed after its lock, before a byte: mode 0600 all the same
    new.write_bytes(b"")
    new.chmod(0)  # as a writer creates it, until it holds its lock
    assert sweep_as_pid_one(tmp_path) == [debris.name]
    assert os.listdir(tmp_path) == [new.name]
    later = atomic.STALE_AFTER + new.stat().st_mtime
    real = atomic._me()
    monkeypatch.setattr(atomic, "_me", lambda: (1, real[1]))  # pid 1 here too
    assert atomic.sweep_temps(str(tmp_path), now=lambda: later - 1) == []
    assert atomic.sweep_temps(str(tmp_path), now=lambda: later) == [str(new)]
