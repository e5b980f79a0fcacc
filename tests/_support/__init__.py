"""What the tests share: the repository's paths, the hang guard, child processes, stored bytes."""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[2]  # the repository: children run with it as cwd
CHILDREN = ROOT / "tests" / "children"
HANG_GUARD = 60.0  # seconds; a hang guard, never a timing assertion

# A server holding more sessions than it has descriptors: a child limited to DESCRIPTORS
# serves MANY sessions, at most MAX_OPEN held at once (a lock descriptor each: the
# library's default, ``SessionRegistry.default_max_open()``, a quarter of the limit),
# which proves at a fraction of the cost what the long run (CHECKPOINTER_LONG_TESTS=1)
# does at the size: 10,000 sessions under 1,024 descriptors.
LONG = os.environ.get("CHECKPOINTER_LONG_TESTS") == "1"
DESCRIPTORS = 1024 if LONG else 256
MANY = 10_000 if LONG else 400
MAX_OPEN = DESCRIPTORS // 4


class Pumped:
    """A child process whose stdout and stderr threads drain, so its pipes never fill.

    Its stdout lines also go to a queue (None at the end), for ``wait_line``.
    """

    def __init__(
        self, argv: Sequence[str], *, stdin: int = subprocess.DEVNULL, new_session: bool = False
    ) -> None:
        self.proc = subprocess.Popen(
            list(argv),
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=new_session,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.out: list[str] = []
        self.err: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.pumps = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self.out, True)),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self.err, False)),
        ]
        for pump in self.pumps:
            pump.start()

    def _pump(self, stream: IO[str], into: list[str], lines: bool) -> None:
        for line in stream:
            into.append(line)
            if lines:
                self.lines.put(line.rstrip("\n"))
        stream.close()
        if lines:
            self.lines.put(None)

    def report(self) -> str:
        return (
            f"status {self.proc.returncode}\n--- stdout\n{''.join(self.out)}"
            f"--- stderr\n{''.join(self.err)}"
        )

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pump in self.pumps:
            pump.join(HANG_GUARD)

    def wait_line(self, wanted: Callable[[str], bool], what: str) -> str:
        """The next stdout line ``wanted`` accepts; a test failure on a hang or an early end."""
        import pytest  # here: the processes that import this module without it start faster

        deadline = time.monotonic() + HANG_GUARD
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                pytest.fail(f"hang guard: no {what!r} from the child\n{self.report()}")
            if line is None:
                self.kill()
                pytest.fail(f"the child ended before {what!r}\n{self.report()}")
            if wanted(line):
                return line


def tree(root: Path, *, locks: bool = True) -> dict[str, bytes | None]:
    """Every entry under ``root``, recursively: a file's bytes, None for a directory.

    What a store left on disk, read back byte for byte; ``locks=False``
    leaves out the ``.lock`` files.
    """
    found: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            found[os.path.relpath(os.path.join(dirpath, name), root)] = None
        for name in filenames:
            if locks or not name.endswith(".lock"):
                path = os.path.join(dirpath, name)
                found[os.path.relpath(path, root)] = Path(path).read_bytes()
    return found


def child_env(base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """The environment of a Python child of the tests: ``base`` (this one's), this checkout first.

    So a child imports the ``checkpointer`` and ``tests`` of the checkout
    under test, whatever is installed.
    """
    return {**(os.environ if base is None else base), "PYTHONPATH": str(ROOT), **extra}


def cli(*args: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
    """``python -m checkpointer ARGS`` of this checkout, to its end: its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "checkpointer", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=child_env(),
        cwd=ROOT,
    )


@contextlib.contextmanager
def scratch(root: str | os.PathLike[str] | None, name: str) -> Iterator[str]:
    """``root`` (made if missing), or a fresh temp directory removed afterwards."""
    if root is not None:
        os.makedirs(root, exist_ok=True)
        yield os.fspath(root)
        return
    where = tempfile.mkdtemp(prefix=f"checkpointer-{name}-")
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


def limit_descriptors() -> None:
    """In a child serving ``MANY`` sessions: ``ulimit -n DESCRIPTORS`` (the locks the
    adapters' committers hold follow it: at most half, and 512)."""
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (DESCRIPTORS, DESCRIPTORS))
