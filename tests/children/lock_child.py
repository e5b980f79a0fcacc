"""A child program for ``tests/stores/test_lock.py``: a writer of one key.

    python tests/children/lock_child.py ROOT KEY MODE

Prints one JSON line per step on stdout, then, as long as it holds the key,
waits for its stdin to close before closing the writer cleanly.

* ``hold``: open a writer (its first write takes the lock), report, hold.
* ``race``: report ready, wait for a line on stdin, try one write, report
  the result; hold if it won, exit if not.
"""

from __future__ import annotations

import json
import os
import sys

from checkpointer import CheckpointWriter, FileStore, Snapshot, Written


def say(**fields: object) -> None:
    sys.stdout.write(json.dumps({"pid": os.getpid(), **fields}) + "\n")
    sys.stdout.flush()


def main(root: str, key: str, mode: str) -> int:
    state = {"writer": os.getpid()}
    writer = CheckpointWriter(
        lambda: Snapshot(key, state), FileStore(root), exit_hooks=False, write_on_start=False
    )
    writer.open()
    if mode == "race":
        say(step="ready")
        sys.stdin.readline()
    result = writer.flush_sync()
    say(step="result", result=type(result).__name__, reason=getattr(result, "reason", None))
    if isinstance(result, Written):
        sys.stdin.read()  # hold until the parent closes our stdin
    writer.close()
    say(step="closed")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
