"""The disk that forgets: a passthrough to a backing directory that knows what is durable.

``PowerDisk`` carries out file-system calls on a backing directory (paths
as FUSE gives them, ``/a/b`` from the mount root; open files by handle) and
keeps, beside the live tree, the tree a power cut would leave:

* per file (an inode, so hard links share it): its *durable content*, what
  it held at its last ``fsync``/``fdatasync`` (empty for a file created
  since); the first ``durable`` bytes of the backing file while nothing
  below that offset has changed, a private copy once something did;
* per directory: its *durable entries*, name -> node as they were at its
  last ``fsync`` (``fsyncdir``).  A create, rename, link, unlink, mkdir or
  rmdir since then is not in them.

``cut()`` (after the power is out and the mount is gone) rewrites the
backing directory to that durable tree: starting at the root (the mount
point itself always exists), every durable entry, each file with its durable
content.  Under the ``strict`` model that is all; under ``ext4`` a file
whose size grew since its last fsync keeps the new size and the bytes past
its durable content read as zeros (what ext4 with delayed allocation can
leave when the size reaches the journal before the data does; its
``auto_da_alloc`` help for a rename over an unsynced file is not modelled,
as with ``noauto_da_alloc``).  File modes and times are passed through and
not rolled back.

Every call that changes something gets a *label* (``"fsync temp.json"``,
``"write journal:append"``, ``"rename temp.json"``, ``"fsyncdir"``, see
``label_kind``) and is counted.  ``arm(label, count)`` freezes the disk right
after the ``count``-th call with that label; ``freeze()`` freezes it now.
A frozen disk has lost power: every later call fails with EIO and changes
nothing, so nothing after the cut point can become durable.  The first
refused call is remembered, so a cut report says between which two steps
the power went.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from checkpointer._stores.atomic import _TEMP_RE

__all__ = ["MODELS", "Dir", "File", "PowerDisk", "label_kind"]

MODELS = ("strict", "ext4")


def label_kind(name: str) -> str:
    """What a file is, by its name, for op labels: ``temp.json``, ``journal``, ``lock`` ..."""
    match = _TEMP_RE.match(name)
    if match is not None:
        target = match["name"]
        for suffix in (".jsonl", ".json", ".md"):
            if target.endswith(suffix):
                return "temp" + suffix
        return "temp"
    for suffix, kind in (
        (".jsonl", "journal"),
        (".json", "json"),
        (".lock", "lock"),
        (".md", "md"),
    ):
        if name.endswith(suffix):
            return kind
    return "file"


@dataclass(eq=False)
class File:
    """A file's inode: its live size and its durable content."""

    size: int
    durable: int | bytes  # int: the backing file's first `durable` bytes
    mode: int
    links: set[tuple[Dir, str]] = field(default_factory=set)
    drefs: int = 0  # durable entries that name it
    handles: int = 0
    grave: str | None = None  # a hard link that keeps it once its last name is gone
    last: str = ""  # what the last change to a journal was (append, compaction, truncate)


@dataclass(eq=False)
class Dir:
    """A directory: its live entries and its durable ones."""

    mode: int
    parent: Dir | None
    name: str
    live: dict[str, Node] = field(default_factory=dict)
    durable: dict[str, Node] = field(default_factory=dict)
    drefs: int = 0


Node = File | Dir


class PowerDisk:
    """A passthrough to ``backing`` that can lose power and come back durable.

    Thread-safe: every call holds one lock (FUSE runs single-threaded here;
    the lock is for ``freeze``/``arm`` from the control thread).

    Args:
        backing: the directory that holds the live files.
        model: ``"strict"`` or ``"ext4"`` (see the module docstring).
        on_freeze: called (under the lock) when the disk freezes.
    """

    def __init__(
        self,
        backing: str,
        model: str = "strict",
        on_freeze: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        if model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {model!r}")
        self.backing = os.path.abspath(backing)
        self.model = model
        self.grave = self.backing + ".grave"
        shutil.rmtree(self.grave, ignore_errors=True)
        os.mkdir(self.grave, 0o700)
        self._on_freeze = on_freeze
        self._lock = threading.Lock()
        self._files: dict[int, File] = {}  # backing fd -> file
        self._dirs: dict[int, Dir] = {}  # directory handle -> directory
        self._next_dir_handle = 1
        self._graves = 0
        self.counts: dict[str, int] = {}
        self.ops = 0
        self.frozen: dict[str, Any] | None = None  # how and where the power went
        self._armed: tuple[str, int] | None = None
        self._last: tuple[str, str] | None = None
        self._refused: tuple[str, str] | None = None
        self.root = self._scan()

    # -- power ---------------------------------------------------------------

    def arm(self, label: str, count: int) -> None:
        """Freeze right after the ``count``-th call labelled ``label`` (counted from the start)."""
        with self._lock:
            self._armed = (label, count)
            if self.counts.get(label, 0) >= count:
                self._freeze("aim")

    def freeze(self) -> dict[str, Any]:
        """Cut the power now (idempotent); return how and where it went."""
        with self._lock:
            if self.frozen is None:
                self._freeze("command")
            assert self.frozen is not None
            return self.frozen

    def _freeze(self, by: str) -> None:
        self.frozen = {
            "by": by,
            "after": list(self._last) if self._last else None,
            "ops": self.ops,
            "armed": list(self._armed) if self._armed else None,
        }
        if self._on_freeze is not None:
            self._on_freeze(self.frozen)

    def _gate(self, label: str, path: str | None) -> None:
        """Refuse the call if the power is out (``label``: its label, or its name if none)."""
        if self.frozen is not None:
            if self._refused is None:
                self._refused = (label, path or "")
            raise OSError(errno.EIO, "the power is out")

    def _done(self, label: str, path: str | None) -> None:
        self.ops += 1
        count = self.counts[label] = self.counts.get(label, 0) + 1
        self._last = (label, path or "")
        if self._armed == (label, count):
            self._freeze("aim")

    # -- the live tree -------------------------------------------------------

    def _scan(self) -> Dir:
        """Everything in the backing directory at mount time is durable."""
        st = os.stat(self.backing)
        root = Dir(mode=stat.S_IMODE(st.st_mode), parent=None, name="")
        inodes: dict[int, File] = {}

        def walk(directory: Dir, real: str) -> None:
            with os.scandir(real) as entries:
                for entry in entries:
                    st = entry.stat(follow_symlinks=False)
                    node: Node
                    if stat.S_ISDIR(st.st_mode):
                        node = Dir(mode=stat.S_IMODE(st.st_mode), parent=directory, name=entry.name)
                        walk(node, entry.path)
                    elif stat.S_ISREG(st.st_mode):
                        node = inodes.get(st.st_ino) or File(
                            size=st.st_size, durable=st.st_size, mode=stat.S_IMODE(st.st_mode)
                        )
                        inodes[st.st_ino] = node
                        node.links.add((directory, entry.name))
                    else:
                        continue  # the tests make regular files and directories only
                    directory.live[entry.name] = node
                    directory.durable[entry.name] = node
                    node.drefs += 1

        walk(root, self.backing)
        return root

    def _lookup(self, path: str) -> Node:
        node: Node = self.root
        for part in path.strip("/").split("/"):
            if not part:
                continue
            if not isinstance(node, Dir) or part not in node.live:
                raise OSError(errno.ENOENT, "no such entry", path)
            node = node.live[part]
        return node

    def _parent(self, path: str) -> tuple[Dir, str]:
        head, name = os.path.split(path.rstrip("/"))
        parent = self._lookup(head)
        if not isinstance(parent, Dir):
            raise OSError(errno.ENOTDIR, "not a directory", head)
        return parent, name

    def _dir_path(self, directory: Dir) -> str:
        parts: list[str] = []
        node: Dir | None = directory
        while node is not None and node is not self.root:
            parts.append(node.name)
            node = node.parent
        if node is None:
            raise OSError(errno.ENOENT, "a removed directory has no path")
        return os.path.join(self.backing, *reversed(parts))

    def _real(self, node: Node) -> str:
        """Where the node's bytes are in the backing directory now."""
        if isinstance(node, Dir):
            return self._dir_path(node)
        for directory, name in node.links:
            with contextlib.suppress(OSError):
                return os.path.join(self._dir_path(directory), name)
        if node.grave is not None:
            return node.grave
        raise OSError(errno.ENOENT, "a file with no name left")

    def _file(self, path: str | None, fh: int | None) -> File:
        node = self._files.get(fh) if fh is not None else None
        if node is None:
            if path is None:
                raise OSError(errno.EBADF, "no such handle")
            found = self._lookup(path)
            if not isinstance(found, File):
                raise OSError(errno.EISDIR, "a directory", path)
            node = found
        return node

    def _label(self, op: str, path: str | None, node: File | None = None) -> str:
        kind = label_kind(os.path.basename(path)) if path else ""
        if not kind and node is not None:
            kind = next((label_kind(name) for _, name in node.links), "file")
        if kind == "journal" and node is not None and op in ("fsync", "write"):
            return f"{op} journal:{node.last or 'append'}"
        return f"{op} {kind or 'file'}"

    def _keep(self, node: File, below: int) -> None:
        """Copy the durable bytes aside before a change at offset ``below`` reaches them."""
        if isinstance(node.durable, int) and below < node.durable:
            if node.links or node.drefs:
                with open(self._real(node), "rb") as f:
                    node.durable = f.read(node.durable)
            else:  # nothing will ever name it again: its content does not matter
                node.durable = 0

    def _bury(self, node: Node) -> None:
        """Before a file loses its last name: keep its bytes if a durable entry still names it."""
        if (
            isinstance(node, File)
            and len(node.links) == 1
            and node.drefs > 0
            and isinstance(node.durable, int)
            and node.grave is None
        ):
            self._graves += 1
            grave = os.path.join(self.grave, str(self._graves))
            os.link(self._real(node), grave)
            node.grave = grave

    def _forget(self, node: Node) -> None:
        if isinstance(node, File) and node.drefs == 0 and node.grave is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(node.grave)
            node.grave = None

    # -- calls that change nothing -------------------------------------------

    def getattr(self, path: str | None, fh: int | None = None) -> os.stat_result:
        with self._lock:
            self._gate("getattr", path)
            if fh is not None and fh in self._files:
                return os.fstat(fh)
            if path is None:
                raise OSError(errno.EBADF, "no path and no handle")
            return os.lstat(self.backing + path)

    def readdir(self, path: str) -> list[tuple[str, int, int]]:
        """The live entries of a directory, ``.`` and ``..`` first: (name, inode, mode).

        The inode number matters: mounted with ``use_ino``, it is the
        entry's ``d_ino``, and glibc's ``readdir`` skips an entry whose
        ``d_ino`` is 0 (the listing would be empty).
        """
        with self._lock:
            self._gate("readdir", path)
            node = self._lookup(path)
            if not isinstance(node, Dir):
                raise OSError(errno.ENOTDIR, "not a directory", path)
            real = self._dir_path(node)
            up = self._dir_path(node.parent) if node.parent is not None else real
            entries = [(".", real), ("..", up)]
            entries += [(name, os.path.join(real, name)) for name in node.live]
            found = []
            for name, where in entries:
                st = os.lstat(where)
                found.append((name, st.st_ino, st.st_mode))
            return found

    def read(self, fh: int, size: int, offset: int) -> bytes:
        with self._lock:
            self._gate("read", None)
            return os.pread(fh, size, offset)

    def statfs(self) -> os.statvfs_result:
        with self._lock:
            self._gate("statfs", None)
            return os.statvfs(self.backing)

    def opendir(self, path: str) -> int:
        with self._lock:
            self._gate("opendir", path)
            node = self._lookup(path)
            if not isinstance(node, Dir):
                raise OSError(errno.ENOTDIR, "not a directory", path)
            handle = self._next_dir_handle
            self._next_dir_handle += 1
            self._dirs[handle] = node
            return handle

    def releasedir(self, handle: int) -> None:
        with self._lock:
            self._dirs.pop(handle, None)

    def release(self, fh: int) -> None:
        """Close a file handle; allowed with the power out (a dead process's files close)."""
        with self._lock:
            node = self._files.pop(fh, None)
            os.close(fh)
            if node is not None:
                node.handles -= 1

    # -- calls that change the live tree -------------------------------------

    def create(self, path: str, flags: int, mode: int) -> int:
        with self._lock:
            label = self._label("create", path)
            self._gate(label, path)
            parent, name = self._parent(path)
            flags = (flags | os.O_CREAT) & ~(os.O_APPEND | os.O_TRUNC | os.O_ACCMODE) | os.O_RDWR
            fd = os.open(self.backing + path, flags, mode)
            node = parent.live.get(name)
            if not isinstance(node, File):  # a new file (the usual case: the kernel looked first)
                node = File(size=0, durable=0, mode=stat.S_IMODE(mode))
                node.links.add((parent, name))
                parent.live[name] = node
            node.handles += 1
            self._files[fd] = node
            self._done(label, path)
            return fd

    def open(self, path: str, flags: int) -> int:
        with self._lock:
            truncating = bool(flags & os.O_TRUNC) and flags & os.O_ACCMODE != os.O_RDONLY
            label = self._label("truncate", path) if truncating else "open"
            self._gate(label, path)
            node = self._lookup(path)
            if not isinstance(node, File):
                raise OSError(errno.EISDIR, "a directory", path)
            # Read-write always (root may): durable bytes are copied through it before a change.
            strip = os.O_CREAT | os.O_EXCL | os.O_TRUNC | os.O_APPEND | os.O_ACCMODE
            fd = os.open(self.backing + path, flags & ~strip | os.O_RDWR)
            node.handles += 1
            self._files[fd] = node
            if truncating:
                self._keep(node, 0)
                os.ftruncate(fd, 0)
                node.size = 0
                node.last = "truncate"
                self._done(label, path)
            return fd

    def write(self, path: str | None, fh: int, data: bytes, offset: int) -> int:
        with self._lock:
            node = self._file(path, fh)
            if label_kind(self._name_of(path, node)) == "journal":
                if data.startswith(b'{"kind":"compaction"'):
                    node.last = "compaction"
                elif data.startswith(b'{"kind":') or node.last not in ("append", "compaction"):
                    node.last = "append"
            label = self._label("write", path, node)
            self._gate(label, path)
            self._keep(node, offset)
            written = os.pwrite(fh, data, offset)
            node.size = max(node.size, offset + written)
            self._done(label, path)
            return written

    def _name_of(self, path: str | None, node: File) -> str:
        if path:
            return os.path.basename(path)
        return next((name for _, name in node.links), "")

    def truncate(self, path: str | None, length: int, fh: int | None = None) -> None:
        with self._lock:
            node = self._file(path, fh)
            label = self._label("truncate", path, node)
            self._gate(label, path)
            self._keep(node, length)
            if fh is not None and fh in self._files:
                os.ftruncate(fh, length)
            else:
                os.truncate(self._real(node), length)
            node.size = length
            node.last = "truncate"
            self._done(label, path)

    def fsync(self, path: str | None, fh: int) -> None:
        """``fsync`` and ``fdatasync`` alike: the file's content and size become durable."""
        with self._lock:
            node = self._file(path, fh)
            label = self._label("fsync", path, node)
            self._gate(label, path)
            if node.links or node.grave is not None:
                node.durable = node.size  # the bytes stay where a name or the grave keeps them
            elif node.drefs:  # no name left, but a durable entry will bring it back: copy
                node.durable = os.pread(fh, node.size, 0) if fh in self._files else b""
            else:  # nothing will ever name it again: its content does not matter
                node.durable = 0
            self._done(label, path)

    def fsyncdir(self, path: str | None, handle: int) -> None:
        """The directory's entries as they are now become its durable entries."""
        with self._lock:
            self._gate("fsyncdir", path)
            directory = self._dirs.get(handle)
            if directory is None:
                if path is None:
                    raise OSError(errno.EBADF, "no such directory handle")
                found = self._lookup(path)
                if not isinstance(found, Dir):
                    raise OSError(errno.ENOTDIR, "not a directory", path)
                directory = found
            before = list(directory.durable.values())
            for node in before:
                node.drefs -= 1
            directory.durable = dict(directory.live)
            for node in directory.durable.values():
                node.drefs += 1
            for node in before:
                self._forget(node)
            self._done("fsyncdir", path)

    def mkdir(self, path: str, mode: int) -> None:
        with self._lock:
            self._gate("mkdir", path)
            parent, name = self._parent(path)
            os.mkdir(self.backing + path, mode)
            parent.live[name] = Dir(mode=stat.S_IMODE(mode), parent=parent, name=name)
            self._done("mkdir", path)

    def rmdir(self, path: str) -> None:
        with self._lock:
            self._gate("rmdir", path)
            parent, name = self._parent(path)
            node = parent.live.get(name)
            os.rmdir(self.backing + path)
            del parent.live[name]
            if isinstance(node, Dir):
                node.parent = None
            self._done("rmdir", path)

    def unlink(self, path: str) -> None:
        with self._lock:
            label = self._label("unlink", path)
            self._gate(label, path)
            parent, name = self._parent(path)
            node = parent.live.get(name)
            if node is None:
                raise OSError(errno.ENOENT, "no such entry", path)
            if isinstance(node, Dir):
                raise OSError(errno.EISDIR, "a directory", path)
            self._bury(node)
            os.unlink(self.backing + path)
            del parent.live[name]
            node.links.discard((parent, name))
            self._done(label, path)

    def rename(self, old: str, new: str) -> None:
        with self._lock:
            label = self._label("rename", old)
            self._gate(label, old)
            source, old_name = self._parent(old)
            target, new_name = self._parent(new)
            node = source.live.get(old_name)
            if node is None:
                raise OSError(errno.ENOENT, "no such entry", old)
            victim = target.live.get(new_name)
            if victim is node:  # two names of one file: rename(2) does nothing
                self._done(label, old)
                return
            if victim is not None:
                self._bury(victim)
            os.rename(self.backing + old, self.backing + new)
            del source.live[old_name]
            target.live[new_name] = node
            if isinstance(node, File):
                node.links.discard((source, old_name))
                node.links.add((target, new_name))
            else:
                node.parent, node.name = target, new_name
            if isinstance(victim, File):
                victim.links.discard((target, new_name))
            elif isinstance(victim, Dir):
                victim.parent = None
            self._done(label, old)

    def link(self, existing: str, new: str) -> None:
        with self._lock:
            label = self._label("link", existing)
            self._gate(label, existing)
            node = self._lookup(existing)
            if not isinstance(node, File):
                raise OSError(errno.EPERM, "cannot link a directory", existing)
            target, name = self._parent(new)
            os.link(self.backing + existing, self.backing + new)
            target.live[name] = node
            node.links.add((target, name))
            self._done(label, existing)

    def chmod(self, path: str | None, mode: int, fh: int | None = None) -> None:
        with self._lock:
            node: Node = self._file(path, fh) if fh is not None else self._lookup(path or "/")
            label = self._label("chmod", path, node if isinstance(node, File) else None)
            self._gate(label, path)
            if fh is not None and fh in self._files:
                os.fchmod(fh, mode)
            else:
                os.chmod(self._real(node), mode)
            node.mode = stat.S_IMODE(mode)
            self._done(label, path)

    def utimens(self, path: str, ns: tuple[int, int] | None) -> None:
        with self._lock:
            self._gate("utimens", path)
            if ns is None:
                os.utime(self.backing + path)
            else:
                os.utime(self.backing + path, ns=ns)

    # -- after the mount is gone ---------------------------------------------

    def cut(self) -> dict[str, Any]:
        """Rewrite the backing directory to the durable tree; report what was lost.

        Call it when nothing can reach the disk any more (the FUSE loop has
        returned).  The report: how the power went (``frozen``), the first
        call refused, and counts of what the cut undid: ``entries`` (names
        that differ between a directory's live and durable entries),
        ``files`` (durable files whose content is not their live content),
        ``zero_filled`` (files the ext4 model padded with zeros), and the
        ``counts`` of calls by label since the mount.
        """
        with self._lock:
            if self.frozen is None:
                self._freeze("command")
            fresh = self.backing + ".cut"
            shutil.rmtree(fresh, ignore_errors=True)
            os.mkdir(fresh, self.root.mode)
            report: dict[str, Any] = {
                "frozen": self.frozen,
                "refused": list(self._refused) if self._refused else None,
                "ops": self.ops,
                "counts": dict(self.counts),
                "entries": 0,
                "files": 0,
                "zero_filled": 0,
            }
            self._emit(self.root, fresh, {id(self.root)}, {}, report)
            old = self.backing + ".old"
            shutil.rmtree(old, ignore_errors=True)
            os.rename(self.backing, old)
            os.rename(fresh, self.backing)
            shutil.rmtree(old, ignore_errors=True)
            shutil.rmtree(self.grave, ignore_errors=True)
            return report

    def clean(self) -> None:
        """A clean unmount: everything is durable; drop the graves."""
        with self._lock:
            shutil.rmtree(self.grave, ignore_errors=True)

    def _emit(
        self,
        directory: Dir,
        at: str,
        seen: set[int],
        written: dict[int, str],
        report: dict[str, Any],
    ) -> None:
        live, durable = directory.live, directory.durable
        report["entries"] += sum(
            1 for name in live.keys() | durable.keys() if live.get(name) is not durable.get(name)
        )
        for name, node in sorted(durable.items()):
            path = os.path.join(at, name)
            if isinstance(node, Dir):
                if id(node) in seen:  # one directory under two durable names: kept once
                    continue
                seen.add(id(node))
                os.mkdir(path, node.mode)
                self._emit(node, path, seen, written, report)
            elif id(node) in written:  # a hard link
                os.link(written[id(node)], path)
            else:
                self._emit_file(node, path, report)
                written[id(node)] = path

    def _emit_file(self, node: File, path: str, report: dict[str, Any]) -> None:
        durable = node.durable
        length = durable if isinstance(durable, int) else len(durable)
        pad = node.size - length if self.model == "ext4" and node.size > length else 0
        if isinstance(durable, int):
            source = self._real(node)
            if os.stat(source).st_size == durable and not pad:
                os.link(source, path)  # unchanged since its fsync: the bytes as they are
                os.chmod(path, node.mode)
                return
            with open(source, "rb") as f:
                data = f.read(durable)
        else:
            data = durable
        report["files"] += 1
        report["zero_filled"] += bool(pad)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, node.mode)
        try:
            os.write(fd, data)
            if pad:
                os.ftruncate(fd, length + pad)  # a hole reads as zeros
        finally:
            os.close(fd)
