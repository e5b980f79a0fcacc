"""The FUSE process: ``PowerDisk`` mounted with mfusepy over libfuse 3.

Run as ``python -m tests._powerfs BACKING MOUNTPOINT --model strict``
(``PowerFS`` in ``client.py`` does).  It mounts in the foreground,
single-threaded, so calls reach the disk one at a time in the order the
kernel sends them, and talks on its standard streams:

* stdin, one command a line: ``ARM <json [label, count]>``, ``FREEZE``;
  its end while the mount is still up means the parent is gone (SIGKILLed,
  say): the power goes, the mount is unmounted (lazily if busy) and the
  process exits, so a killed test run leaves no mount and no server behind;
* stdout: ``MOUNTED`` once the kernel's INIT arrives, ``FROZEN <json>`` when
  the power goes (an armed call was reached, or ``FREEZE``), ``ERROR <text>``
  if a call raised something that is not an ``OSError`` (a bug here, not in
  the code under test), and after the unmount (``fusermount3 -u``) either
  ``CUT <json>`` (the backing directory now holds the durable state; the
  report of ``PowerDisk.cut``) or ``CLEAN`` (unmounted with the power on).

Mount options: ``use_ino`` (inode numbers are the backing files', stable
across lookups, as the lock and journal code compare them), ``hard_remove``
(an unlinked open file is really unlinked, not renamed to ``.fuse_hidden``),
no writeback cache (libfuse's default), so every ``write(2)`` and every
``fsync(2)`` reaches the disk as it happens.  ``flock`` is left to the
kernel (local to this mount, which is all the lock code needs).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import json
import os
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import mfusepy

from .disk import MODELS, PowerDisk

__all__ = ["main"]

F = TypeVar("F", bound=Callable[..., Any])

_out_lock = threading.Lock()


def _say(line: str) -> None:
    with _out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def _guarded(method: F) -> F:
    """OSErrors go to the caller as errno; anything else is a bug of the disk: say so."""

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except OSError:
            raise
        except Exception:
            _say("ERROR " + json.dumps(traceback.format_exc()))
            raise mfusepy.FuseOSError(errno.EIO) from None

    return call  # type: ignore[return-value]


_STAT_FIELDS = ("st_mode", "st_ino", "st_nlink", "st_uid", "st_gid", "st_size", "st_blocks")


class Operations(mfusepy.Operations):  # type: ignore[misc]
    """The FUSE calls, each handed to the disk."""

    use_ns = True

    def __init__(self, disk: PowerDisk) -> None:
        self.disk = disk

    def init(self, path: str) -> None:
        _say("MOUNTED")

    @_guarded
    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, Any]:
        st = self.disk.getattr(path, fh)
        attrs: dict[str, Any] = {name: getattr(st, name) for name in _STAT_FIELDS}
        attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
        return attrs

    @_guarded
    def readdir(self, path: str, fh: int) -> list[tuple[str, dict[str, int], int]]:
        # Each entry with its inode number (mfusepy passes only st_ino and
        # st_mode on): a bare name would get a zeroed stat, so d_ino 0 under
        # use_ino, and glibc would drop every entry of every listing.
        return [
            (name, {"st_ino": ino, "st_mode": mode}, 0)
            for name, ino, mode in self.disk.readdir(path)
        ]

    @_guarded
    def opendir(self, path: str) -> int:
        return self.disk.opendir(path)

    @_guarded
    def releasedir(self, path: str | None, fh: int) -> int:
        self.disk.releasedir(fh)
        return 0

    @_guarded
    def fsyncdir(self, path: str | None, datasync: int, fh: int) -> int:
        self.disk.fsyncdir(path, fh)
        return 0

    @_guarded
    def mkdir(self, path: str, mode: int) -> int:
        self.disk.mkdir(path, mode)
        return 0

    @_guarded
    def rmdir(self, path: str) -> int:
        self.disk.rmdir(path)
        return 0

    @_guarded
    def create(self, path: str, mode: int, flags: int) -> int:
        return self.disk.create(path, flags, mode)

    @_guarded
    def open(self, path: str, flags: int) -> int:
        return self.disk.open(path, flags)

    @_guarded
    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        return self.disk.read(fh, size, offset)

    @_guarded
    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        return self.disk.write(path, fh, data, offset)

    @_guarded
    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        self.disk.truncate(path, length, fh)
        return 0

    @_guarded
    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        self.disk.fsync(path, fh)
        return 0

    def flush(self, path: str | None, fh: int) -> int:
        return 0  # close(2) is not a sync

    @_guarded
    def release(self, path: str | None, fh: int) -> int:
        self.disk.release(fh)
        return 0

    @_guarded
    def unlink(self, path: str) -> int:
        self.disk.unlink(path)
        return 0

    @_guarded
    def rename(self, old: str, new: str) -> int:
        self.disk.rename(old, new)
        return 0

    @_guarded
    def link(self, target: str, source: str) -> int:
        self.disk.link(source, target)
        return 0

    @_guarded
    def chmod(self, path: str | None, mode: int, fh: int | None = None) -> int:
        self.disk.chmod(path, mode, fh)
        return 0

    @_guarded
    def chown(self, path: str | None, uid: int, gid: int) -> int:
        return 0  # everyone is root here

    @_guarded
    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        self.disk.utimens(path, times)
        return 0

    @_guarded
    def statfs(self, path: str) -> dict[str, int]:
        st = self.disk.statfs()
        names = ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree")
        return {name: getattr(st, name) for name in (*names, "f_favail", "f_flag", "f_namemax")}


class _FUSE(mfusepy.FUSE):  # type: ignore[misc]
    """mfusepy's libfuse 3 glue, with the file handle passed where libfuse gives one.

    mfusepy 3.1 drops the ``fuse_file_info`` of ``truncate`` and ``chmod``
    (so an ``ftruncate`` of an unlinked file, whose path is NULL, could not
    be served) and ignores ``rename``'s flags (RENAME_NOREPLACE would act as
    a plain rename): both are mended here.
    """

    def _path(self, path: bytes | None) -> str | None:
        return None if path is None else path.decode(self.encoding, self.errors)

    def truncate_fuse_3(self, path: bytes | None, length: int, fip: Any) -> int:
        fh = fip.contents.fh if fip else None
        return int(self.operations.truncate(self._path(path), length, fh))

    def chmod_fuse_3(self, path: bytes | None, mode: int, fip: Any) -> int:
        fh = fip.contents.fh if fip else None
        return int(self.operations.chmod(self._path(path), mode, fh))

    def rename_fuse_3(self, old: bytes, new: bytes, flags: int) -> int:
        if flags:
            return -errno.EINVAL
        return int(self.rename_fuse_2(old, new))


ORPHAN_GRACE = 5.0  # seconds the loop gets to end after an orphan's unmount (a hang guard)


class _Life:
    """What the control thread and the FUSE loop tell each other."""

    def __init__(self) -> None:
        self.served = threading.Event()  # the FUSE loop has returned
        self.orphaned = threading.Event()  # stdin ended while the loop still ran


def _control(disk: PowerDisk, mountpoint: str, life: _Life) -> None:
    for raw in sys.stdin:
        command, _, rest = raw.strip().partition(" ")
        if command == "ARM":
            label, count = json.loads(rest)
            disk.arm(str(label), int(count))
        elif command == "FREEZE":
            disk.freeze()
    if not life.served.is_set():
        _orphaned(disk, mountpoint, life)


def _orphaned(disk: PowerDisk, mountpoint: str, life: _Life) -> None:
    """Stdin ended with the mount up: the parent is gone (killed) or gave up on us; leave.

    The power goes (nothing changes any more), the mount is unmounted (lazily
    if a process still has files open on it), and the process exits: once
    the loop ends, or at once if the mount was busy (a lazily detached
    mount is served until its last file closes; exiting ends the
    connection, its users get ENOTCONN).  Nothing is cut: nobody waits for
    the report.
    """
    life.orphaned.set()
    with contextlib.suppress(Exception):  # stdout is a broken pipe now: FROZEN cannot be said
        disk.freeze()
    if _mounted(mountpoint):
        plain = ["fusermount3", "-u", mountpoint]
        if subprocess.run(plain, capture_output=True, check=False).returncode != 0:
            # Busy: detach it; the loop would serve the open files on, so leave now.
            lazy = ["fusermount3", "-uz", mountpoint]
            subprocess.run(lazy, capture_output=True, check=False)
            os._exit(1)
    if not life.served.wait(ORPHAN_GRACE):
        os._exit(1)


def _mounted(mountpoint: str) -> bool:
    """Whether ``mountpoint`` is in the mount table (read without touching the mount)."""
    with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
        return any(line.split()[1:2] == [mountpoint] for line in f)


def main(argv: Sequence[str] | None = None) -> int:
    """Mount, serve until unmounted, then leave the backing directory durable."""
    p = argparse.ArgumentParser(prog="python -m tests._powerfs")
    p.add_argument("backing")
    p.add_argument("mountpoint")
    p.add_argument("--model", choices=MODELS, default="strict")
    args = p.parse_args(argv)
    if sys.stdin.readline().strip() != "GO":  # started ahead of its mount (PowerFS.start)
        return 0
    disk = PowerDisk(
        args.backing, args.model, on_freeze=lambda info: _say("FROZEN " + json.dumps(info))
    )
    life = _Life()
    control = threading.Thread(
        target=_control, args=(disk, args.mountpoint, life), daemon=True, name="control"
    )
    control.start()
    try:
        _FUSE(
            Operations(disk),
            args.mountpoint,
            foreground=True,
            nothreads=True,
            use_ino=True,
            hard_remove=True,
            fsname="powerfs",
            subtype="powerfs",
        )
    except Exception:
        _say("ERROR " + json.dumps(traceback.format_exc()))
        return 1
    finally:
        life.served.set()
    if life.orphaned.is_set():
        disk.clean()
        return 1
    try:
        if disk.frozen is not None:
            _say("CUT " + json.dumps(disk.cut()))
        else:
            disk.clean()
            _say("CLEAN")
    except Exception:
        _say("ERROR " + json.dumps(traceback.format_exc()))
        return 1
    with contextlib.suppress(OSError):
        sys.stdout.close()
    return 0
