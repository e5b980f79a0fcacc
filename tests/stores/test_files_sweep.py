"""The temp sweep against live writes in other processes, whatever their pids say.

Two containers on one volume may both be pid 1: a sweep must not take the
other's write in flight for debris.  A write holds an ``flock`` on its temp
until after the rename; the sweep removes only a temp it can lock.  The
processes, files and locks here are real.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

from checkpointer._stores import atomic

CHILD = """
import json, os, sys
from checkpointer import FileStore
from checkpointer._stores import atomic
root, role = sys.argv[1], sys.argv[2]
if role == "writer":  # stops after the temp's fsync until told to go on
    def pause(fd):
        if not getattr(pause, "done", False):
            pause.done = True
            print(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")), flush=True)
            sys.stdin.readline()
        os.fsync(fd)
    atomic.write_atomic(FileStore(root).location("a"), [b'{"from": "A"}'], fsync=pause)
    print("written", flush=True)
else:  # a store opening: its sweep
    removed = atomic.sweep_temps(root)
    FileStore(root).open()
    print(json.dumps(sorted(map(os.path.basename, removed))))
"""


def child(root: Path, role: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(root), role],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def sweep_in_another_process(root: Path) -> list[str]:
    opener = child(root, "sweeper")
    out, err = opener.communicate(timeout=60)
    assert opener.returncode == 0, err
    removed: list[str] = json.loads(out)
    return removed


def test_a_sweep_keeps_the_temp_of_another_process_write_in_flight(tmp_path: Path) -> None:
    """Another process opening the store keeps the locked temp of a write in flight, however old."""
    writer = child(tmp_path, "writer")
    assert writer.stdin is not None and writer.stdout is not None
    try:
        temp = writer.stdout.readline().strip()
        assert temp.startswith(".a.json.") and temp.endswith(".tmp"), temp
        os.utime(tmp_path / temp, (0, 0))  # old: only the lock can tell it is live
        assert sweep_in_another_process(tmp_path) == []
        assert (tmp_path / temp).exists()
        writer.stdin.write("go\n")
        writer.stdin.flush()
        assert writer.stdout.readline() == "written\n"
    finally:
        _, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err
    assert (tmp_path / "a.json").read_bytes() == b'{"from": "A"}'
    assert os.listdir(tmp_path) == ["a.json"]


def test_a_sweep_removes_free_debris_at_once_and_a_new_temp_once_old(tmp_path: Path) -> None:
    """A free temp of a killed write goes at once; one of mode 000 (maybe not locked yet) waits."""
    debris, new = (tmp_path / f".{key}.json.{secrets.token_hex(8)}.tmp" for key in "ab")
    debris.write_bytes(b"")  # killed after its lock, before a byte: its mode set all the same
    new.write_bytes(b"")
    new.chmod(0)  # as a writer creates it, until it holds its lock
    assert sweep_in_another_process(tmp_path) == [debris.name]
    assert os.listdir(tmp_path) == [new.name]
    later = atomic.STALE_AFTER + new.stat().st_mtime
    assert atomic.sweep_temps(str(tmp_path), now=lambda: later - 1) == []
    assert atomic.sweep_temps(str(tmp_path), now=lambda: later) == [str(new)]
