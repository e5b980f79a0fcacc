"""The parent's side: mount a ``PowerDisk``, cut its power, get the durable state back.

One ``PowerFS`` is one mount: ``mount()`` starts the FUSE process (see
``fuse.py``), ``arm``/``freeze`` choose when the power goes, ``cut()``
freezes (if the power is still on), unmounts and waits until the FUSE
process has rewritten the backing directory to what was durable.  The
next mount of the same backing directory starts from exactly that state.
Kill every process that uses the mount before ``cut()``: a frozen disk
refuses their calls, but it cannot be unmounted under their open files.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, Any

from tests._support import HANG_GUARD, ROOT

__all__ = ["HANG_GUARD", "PowerFS", "PowerFSError", "unavailable"]


class PowerFSError(RuntimeError):
    """The FUSE process failed (a bug of the test filesystem, not of the code under test)."""


class PowerFS:
    """A power-cuttable mount of ``backing`` at ``mountpoint``.

    Args:
        backing: the directory that holds the files (created if missing).
        mountpoint: an empty directory to mount on (created if missing).
        model: ``"strict"`` or ``"ext4"`` (see ``disk.py``).
    """

    def __init__(self, backing: str, mountpoint: str, model: str = "strict") -> None:
        self.backing = os.path.abspath(backing)
        self.mountpoint = os.path.abspath(mountpoint)
        self.model = model
        self.frozen = threading.Event()
        self.freeze_info: dict[str, Any] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._mounted = threading.Event()
        self._told_to_mount = False
        self._ended: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._errors: list[str] = []
        self._stderr: list[bytes] = []
        self._pumps: list[threading.Thread] = []

    def __repr__(self) -> str:
        return f"<PowerFS {self.mountpoint} over {self.backing} ({self.model})>"

    def start(self) -> None:
        """Start the FUSE process, to mount later: its interpreter and imports, ahead of time
        (a run of cuts starts the next cut's while the current one serves)."""
        if self._proc is not None:
            return
        model = ["--model", self.model]
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests._powerfs", self.backing, self.mountpoint, *model],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert self._proc.stdout is not None and self._proc.stderr is not None
        self._pumps = [
            threading.Thread(target=self._read, args=(self._proc.stdout,), daemon=True),
            threading.Thread(target=self._read_err, args=(self._proc.stderr,), daemon=True),
        ]
        for pump in self._pumps:
            pump.start()

    def mount(self) -> None:
        """Mount (the FUSE process started if need be); wait until the kernel has reached it."""
        os.makedirs(self.backing, exist_ok=True)
        os.makedirs(self.mountpoint, exist_ok=True)
        self.start()
        assert self._proc is not None
        self._send("GO")  # it reads the backing directory now, not when it started
        self._told_to_mount = True
        deadline = time.monotonic() + HANG_GUARD
        while not self._mounted.wait(0.01):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise PowerFSError(f"{self!r} did not mount: {self.stderr()}")

    def _read(self, stream: IO[bytes]) -> None:
        for raw in stream:
            word, _, rest = raw.decode(errors="replace").rstrip("\n").partition(" ")
            if word == "MOUNTED":
                self._mounted.set()
            elif word == "FROZEN":
                self.freeze_info = json.loads(rest)
                self.frozen.set()
            elif word == "ERROR":
                self._errors.append(json.loads(rest))
            elif word in ("CUT", "CLEAN"):
                self._ended.put((word, json.loads(rest) if rest else None))
        self._ended.put(("EOF", None))

    def _read_err(self, stream: IO[bytes]) -> None:
        for raw in stream:
            self._stderr.append(raw)
            del self._stderr[:-40]

    def stderr(self) -> str:
        return b"".join(self._stderr).decode(errors="replace")[-4000:]

    def _send(self, line: str) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None:
            raise PowerFSError(f"{self!r} is not mounted")
        proc.stdin.write(line.encode() + b"\n")
        proc.stdin.flush()

    def arm(self, label: str, count: int) -> None:
        """Cut the power right after the ``count``-th call labelled ``label`` since the mount."""
        self._send("ARM " + json.dumps([label, count]))

    def freeze(self) -> dict[str, Any]:
        """Cut the power now, if it is still on; return how it went."""
        if not self.frozen.is_set():
            self._send("FREEZE")
        if not self.frozen.wait(HANG_GUARD):
            raise PowerFSError(f"{self!r} did not freeze: {self.stderr()}")
        assert self.freeze_info is not None
        return self.freeze_info

    def errors(self) -> list[str]:
        """Tracebacks of calls that failed inside the disk (should be none)."""
        return list(self._errors)

    def cut(self) -> dict[str, Any]:
        """Power off (if on), unmount, and wait for the durable state in ``backing``.

        Returns:
            ``PowerDisk.cut``'s report.

        Raises:
            PowerFSError: the FUSE process failed or a call inside it raised.
        """
        self.freeze()
        return self._end("CUT")

    def unmount(self) -> None:
        """A clean unmount, power on: ``backing`` keeps everything."""
        self._end("CLEAN")

    def _end(self, expected: str) -> dict[str, Any]:
        self._unmount()
        try:
            word, report = self._ended.get(timeout=HANG_GUARD)
        except queue.Empty:
            word, report = "EOF", None
        proc = self._proc
        self._proc = None
        if proc is not None:
            _reap(proc)
        for pump in self._pumps:
            pump.join(HANG_GUARD)
        if self._errors:
            raise PowerFSError(f"{self!r}: a call failed inside the disk:\n{self._errors[0]}")
        if word != expected:
            raise PowerFSError(f"{self!r} ended with {word}, not {expected}: {self.stderr()}")
        return report if isinstance(report, dict) else {}

    def _unmount(self) -> None:
        deadline = time.monotonic() + HANG_GUARD
        while True:
            done = subprocess.run(
                ["fusermount3", "-u", self.mountpoint], capture_output=True, check=False
            )
            if done.returncode == 0 or not _mounted(self.mountpoint):
                return
            if time.monotonic() > deadline:  # busy for good: detach it
                subprocess.run(["fusermount3", "-uz", self.mountpoint], check=False)
                return
            time.sleep(0.02)

    def close(self) -> None:
        """Best effort, for cleanup: unmount (lazily) and stop the FUSE process."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        # Not os.path.ismount(): it stats the mount's root, which a frozen
        # disk answers with EIO, and would say "not mounted".
        if self._told_to_mount:  # else the mount point may be another PowerFS's: leave it
            detach = ["fusermount3", "-uz", self.mountpoint]
            subprocess.run(detach, capture_output=True, check=False)
        _reap(proc)

    def __enter__(self) -> PowerFS:
        self.mount()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _mounted(mountpoint: str) -> bool:
    """Whether ``mountpoint`` is in the mount table (without touching the mount)."""
    with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
        return any(line.split()[1:2] == [mountpoint] for line in f)


def _reap(proc: subprocess.Popen[bytes]) -> None:
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    try:
        proc.wait(HANG_GUARD)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


_unavailable: list[str | None] = []


def unavailable() -> str | None:
    """Why a power-cuttable mount cannot be made here, or None if it can (tried once, cached).

    Checks ``/dev/fuse``, ``fusermount3`` and ``mfusepy``, then mounts a
    scratch directory, writes and fsyncs a file through it, cuts the power
    and looks at what came back.
    """
    if not _unavailable:
        _unavailable.append(_probe())
    return _unavailable[0]


def _probe() -> str | None:
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse: the fuse kernel module is not loaded or not passed to this container"
    if shutil.which("fusermount3") is None:
        return "no fusermount3 on PATH (Debian: apt-get install fuse3)"
    try:
        import mfusepy  # noqa: F401
    except ImportError as exc:
        return f"mfusepy cannot be imported ({exc}): pip install -e '.[test]'"
    except OSError as exc:
        return f"mfusepy cannot load libfuse 3 ({exc}): apt-get install fuse3"
    scratch = tempfile.mkdtemp(prefix="powerfs-probe-")
    fs = PowerFS(os.path.join(scratch, "disk"), os.path.join(scratch, "mnt"))
    try:
        try:
            fs.mount()
        except PowerFSError as exc:
            return f"cannot mount a FUSE filesystem here (no privilege?): {exc}"
        path = os.path.join(fs.mountpoint, "probe")
        with open(path, "wb") as f:
            f.write(b"synced")
            f.flush()
            os.fsync(f.fileno())
        fd = os.open(fs.mountpoint, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        with open(path, "ab") as f:
            f.write(b" and not")
        fs.cut()
        with open(os.path.join(fs.backing, "probe"), "rb") as f:
            data = f.read()
        if data != b"synced":
            return f"the FUSE filesystem did not forget what was not synced (got {data!r})"
        return None
    except (OSError, PowerFSError) as exc:
        return f"the FUSE filesystem does not work here: {exc}"
    finally:
        fs.close()
        shutil.rmtree(scratch, ignore_errors=True)
