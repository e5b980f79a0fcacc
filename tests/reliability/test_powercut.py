"""Power cuts: the filesystem that forgets, the torture on it, and proof the check can fail.

``PowerDisk`` (the model of what a power cut keeps) is tested directly on
a backing directory, without FUSE.  The rest mounts it through FUSE and
skips, saying why, where that cannot be done (no ``/dev/fuse``, no
privilege, no ``fuse3``).  The full run is ``python -m tests.powercut
--cuts 200 --store all`` (``tests/powercut.py``); ``test_powercut_command.py``
runs it with 3 cuts per store and model, and shows each mutation (a removed
fsync, the sweep disabled, a failed commit reported written) caught.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from checkpointer import CheckpointWriter, FileStore, JournalStore, Snapshot, Written, load
from checkpointer._cli.directory import DirectoryRoot
from checkpointer._cli.roots import Entry
from checkpointer._stores.atomic import makedirs_durable
from checkpointer._transcript.summary import safe_watermark
from checkpointer.summaries import SummaryCheckpoint, load_summary
from checkpointer.summaries import write_summary as write_summary_checkpoint
from tests._powerfs import HANG_GUARD, PowerDisk, PowerFS, label_kind, unavailable
from tests._support import ROOT, tree
from tests._support.harness import KEY, state_for
from tests.children.powercut_child import KEEP_LAST, summary_bytes, summary_text
from tests.powercut import check_summary

SMALL = 64 * 1024
W = os.O_WRONLY | os.O_CREAT | os.O_EXCL


def put(disk: PowerDisk, path: str, data: bytes, *, sync: bool = True) -> None:
    """Create ``path`` with ``data``, fsync it if ``sync``, close it."""
    fd = disk.create(path, W, 0o600)
    disk.write(path, fd, data, 0)
    if sync:
        disk.fsync(path, fd)
    disk.release(fd)


def sync_dir(disk: PowerDisk, path: str = "/") -> None:
    handle = disk.opendir(path)
    disk.fsyncdir(path, handle)
    disk.releasedir(handle)


def durable(tmp_path: Path, setup: dict[str, bytes], model: str = "strict") -> PowerDisk:
    """A disk over a backing directory that holds ``setup`` (all of it durable)."""
    backing = tmp_path / "disk"
    backing.mkdir(exist_ok=True)
    for name, data in setup.items():
        (backing / name).write_bytes(data)
    return PowerDisk(str(backing), model)


# -- the model, without FUSE ---------------------------------------------------------------


@pytest.mark.parametrize("model", ["strict", "ext4"])
def test_a_create_not_followed_by_a_directory_fsync_is_undone(tmp_path: Path, model: str) -> None:
    """A file written and fsynced, but its directory never synced, is gone after the cut."""
    disk = durable(tmp_path, {}, model)
    put(disk, "/new", b"data")
    disk.cut()
    assert tree(tmp_path / "disk") == {}


@pytest.mark.parametrize(("model", "left"), [("strict", b""), ("ext4", b"\0\0\0\0")])
def test_a_synced_name_of_an_unsynced_file_keeps_no_data(
    tmp_path: Path, model: str, left: bytes
) -> None:
    """Directory synced, file not: empty under strict, its size in zeros under ext4."""
    disk = durable(tmp_path, {}, model)
    put(disk, "/new", b"data", sync=False)
    sync_dir(disk)
    disk.cut()
    assert tree(tmp_path / "disk") == {"new": left}


@pytest.mark.parametrize("dir_synced", [False, True])
def test_an_atomic_replace_is_durable_only_after_the_directory_fsync(
    tmp_path: Path, dir_synced: bool
) -> None:
    """Temp, write, fsync, rename: the old content after a cut, unless the directory was synced."""
    disk = durable(tmp_path, {"k.json": b"old"})
    put(disk, "/.k.json.1.x.tmp", b"new")
    disk.rename("/.k.json.1.x.tmp", "/k.json")
    if dir_synced:
        sync_dir(disk)
    report = disk.cut()
    assert tree(tmp_path / "disk") == {"k.json": b"new" if dir_synced else b"old"}
    assert report["entries"] == (0 if dir_synced else 1)  # k.json names another inode


@pytest.mark.parametrize(
    ("model", "synced", "left"),
    [
        ("strict", False, b"head\n"),
        ("ext4", False, b"head\n\0\0\0\0\0"),
        ("strict", True, b"head\ntail\n"),
        ("ext4", True, b"head\ntail\n"),
    ],
)
def test_an_append_survives_only_its_fsync(
    tmp_path: Path, model: str, synced: bool, left: bytes
) -> None:
    """An unsynced append is lost (strict) or zeros of its length (ext4); a synced one stays."""
    disk = durable(tmp_path, {"k.jsonl": b"head\n"}, model)
    fd = disk.open("/k.jsonl", os.O_WRONLY | os.O_APPEND)
    disk.write("/k.jsonl", fd, b"tail\n", 5)
    if synced:
        disk.fsync("/k.jsonl", fd)
    disk.release(fd)
    report = disk.cut()
    assert tree(tmp_path / "disk") == {"k.jsonl": left}
    assert report["zero_filled"] == (model == "ext4" and not synced)


@pytest.mark.parametrize("model", ["strict", "ext4"])
def test_overwrites_and_truncates_without_fsync_are_rolled_back(tmp_path: Path, model: str) -> None:
    """Bytes changed in place, a truncate, O_TRUNC: the synced content comes back."""
    disk = durable(tmp_path, {"a": b"abcdef", "b": b"123456", "c": b"xyz"}, model)
    fd = disk.open("/a", os.O_RDWR)
    disk.write("/a", fd, b"XY", 0)
    disk.truncate("/a", 3, fd)
    disk.release(fd)
    disk.truncate("/b", 1)
    disk.release(disk.open("/c", os.O_WRONLY | os.O_TRUNC))
    disk.cut()
    assert tree(tmp_path / "disk") == {"a": b"abcdef", "b": b"123456", "c": b"xyz"}


@pytest.mark.parametrize("synced", [False, True])
def test_an_unsynced_unlink_comes_back_with_the_inodes_durable_bytes(
    tmp_path: Path, synced: bool
) -> None:
    """An unlink is undone; the file holds what its inode last fsynced, even after the unlink."""
    disk = durable(tmp_path, {"k.lock": b"keep"})
    fd = disk.open("/k.lock", os.O_RDWR)
    disk.unlink("/k.lock")
    assert not (tmp_path / "disk" / "k.lock").exists()  # gone from the backing directory
    disk.write(None, fd, b"zz", 0)
    if synced:
        disk.fsync(None, fd)
    disk.release(fd)
    disk.cut()
    assert tree(tmp_path / "disk") == {"k.lock": b"zzep" if synced else b"keep"}


@pytest.mark.parametrize("model", ["strict", "ext4"])
def test_an_fsync_of_an_unlinked_truncated_file_is_what_its_durable_name_brings_back(
    tmp_path: Path, model: str
) -> None:
    """O_TRUNC, write, unlink while open, fsync: the unlink is undone, with the new bytes."""
    disk = durable(tmp_path, {"a": b"old", "b": b"gone"}, model)
    fd = disk.open("/b", os.O_RDWR)  # an orphan no durable entry names: nothing to keep
    disk.unlink("/b")
    sync_dir(disk)
    disk.write(None, fd, b"x", 0)
    disk.fsync(None, fd)
    disk.release(fd)
    fd = disk.open("/a", os.O_RDWR | os.O_TRUNC)  # the durable bytes are copied aside
    disk.write("/a", fd, b"new!", 0)
    disk.unlink("/a")
    disk.fsync(None, fd)
    disk.write(None, fd, b"N", 0)  # after the fsync: not durable
    disk.release(fd)
    disk.cut()
    assert tree(tmp_path / "disk") == {"a": b"new!"}


def test_a_rename_over_a_durable_file_is_undone_with_both_contents(tmp_path: Path) -> None:
    """Rename a onto b without a directory fsync: both names come back, each with its bytes."""
    disk = durable(tmp_path, {"a": b"A", "b": b"B"})
    disk.rename("/a", "/b")
    disk.cut()
    assert tree(tmp_path / "disk") == {"a": b"A", "b": b"B"}


def test_a_new_directory_needs_its_parent_synced(tmp_path: Path) -> None:
    """mkdir, then a file in it fully synced: all gone unless the parent directory was synced."""
    for parent_synced in (False, True):
        disk = durable(tmp_path, {})
        disk.mkdir("/d", 0o700)
        put(disk, "/d/f", b"data")
        sync_dir(disk, "/d")
        if parent_synced:
            sync_dir(disk, "/")
        disk.cut()
        assert tree(tmp_path / "disk") == ({"d": None, "d/f": b"data"} if parent_synced else {})


def test_a_remount_starts_from_the_durable_state(tmp_path: Path) -> None:
    """What a cut left is all durable for the next disk: another cut keeps it as it is."""
    disk = durable(tmp_path, {})
    put(disk, "/f", b"one")
    sync_dir(disk)
    disk.cut()
    again = PowerDisk(str(tmp_path / "disk"))
    fd = again.open("/f", os.O_WRONLY | os.O_APPEND)
    again.write("/f", fd, b" two", 3)
    again.release(fd)
    again.cut()
    assert tree(tmp_path / "disk") == {"f": b"one"}


def test_an_armed_cut_freezes_right_after_its_call_and_refuses_the_rest(tmp_path: Path) -> None:
    """arm('fsync json', 2): the second fsync happens, every later call fails with EIO."""
    disk = durable(tmp_path, {})
    disk.arm("fsync json", 2)
    put(disk, "/a.json", b"1")
    put(disk, "/b.json", b"2")  # its fsync is the second: the power goes right after it
    assert disk.frozen is not None and disk.frozen["after"] == ["fsync json", "/b.json"]
    with pytest.raises(OSError, match="the power is out") as caught:
        sync_dir(disk)
    assert caught.value.errno == errno.EIO
    report = disk.cut()
    assert report["refused"] == ["opendir", "/"]
    assert report["counts"] == {"create json": 2, "write json": 2, "fsync json": 2}
    assert tree(tmp_path / "disk") == {}


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        (".k.json.0123456789abcdef.tmp", "temp.json"),
        (".k.jsonl.0123456789abcdef.tmp", "temp.jsonl"),
        (".checkpoint.md.0123456789abcdef.tmp", "temp.md"),
        ("k.jsonl", "journal"),
        ("k.json", "json"),
        ("k.lock", "lock"),
        ("checkpoint.md", "md"),
        ("other", "file"),
    ],
)
def test_labels_name_what_a_file_is(name: str, kind: str) -> None:
    """Op labels say which file of the store a call touched, by its name."""
    assert label_kind(name) == kind


def test_journal_writes_are_labelled_append_or_compaction(tmp_path: Path) -> None:
    """A journal write is an append or a compaction by its first row; its fsync says which."""
    disk = durable(tmp_path, {"k.jsonl": b"head\n"})
    disk.arm("fsync journal:compaction", 1)
    fd = disk.open("/k.jsonl", os.O_WRONLY | os.O_APPEND)
    disk.write("/k.jsonl", fd, b'{"kind":"message"}\n', 5)
    disk.fsync("/k.jsonl", fd)
    disk.write("/k.jsonl", fd, b'{"kind":"compaction","state":', 24)
    disk.write("/k.jsonl", fd, b"{}}\n", 53)  # the rest of the same row
    disk.fsync("/k.jsonl", fd)
    disk.release(fd)
    report = disk.cut()
    assert report["counts"] == {
        "write journal:append": 1,
        "fsync journal:append": 1,
        "write journal:compaction": 2,
        "fsync journal:compaction": 1,
    }


# -- the summary check, without FUSE ---------------------------------------------------------


def summary_at(root: Path, n: int, text: str | None = None) -> None:
    watermark = safe_watermark(state_for(n, SMALL)["messages"], KEEP_LAST)
    body = summary_text(n, summary_bytes(SMALL)) if text is None else text
    checkpoint = SummaryCheckpoint(watermark, body, datetime(2024, 5, 1, tzinfo=UTC), watermark)
    write_summary_checkpoint(root, KEY, checkpoint)


def test_check_summary_accepts_the_summary_of_its_n_and_raises_the_floor(tmp_path: Path) -> None:
    """A summary that is exactly the child's for its n, not older: no problem; the floor moves."""
    summary_at(tmp_path, 30)
    floor = [20]
    assert check_summary(str(tmp_path), SMALL, floor) == []
    assert floor == [30]


def test_check_summary_flags_mixed_older_and_missing_summaries(tmp_path: Path) -> None:
    """Another n's text, an older n than reported, or none after one was reported: flagged."""
    assert check_summary(str(tmp_path), SMALL, [5]) == [
        "the summary checkpoint is gone; n=5 was reported written"
    ]
    summary_at(tmp_path, 30, text="n=30\n" + summary_text(31, 4096)[5:])
    assert check_summary(str(tmp_path), SMALL, [-1]) == [
        "the summary is not the summary of n=30 (mixed/torn)"
    ]
    summary_at(tmp_path, 30)
    assert check_summary(str(tmp_path), SMALL, [31]) == [
        "the summary holds n=30, older than n=31 reported or seen"
    ]


# -- through FUSE ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuse() -> None:
    """Skip, saying why, where a FUSE filesystem cannot be mounted."""
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"power-cut tests need FUSE: {reason}")


@pytest.fixture
def mounted(fuse: None, tmp_path: Path) -> Iterator[PowerFS]:
    fs = PowerFS(str(tmp_path / "disk"), str(tmp_path / "mnt"))
    fs.mount()
    try:
        yield fs
    finally:
        fs.close()


@pytest.mark.parametrize("store", ["file", "journal", "summary"])
def test_the_first_write_into_a_new_root_survives_a_power_cut(mounted: PowerFS, store: str) -> None:
    """A store that makes its own root: what it reported written is there after the cut."""
    root = os.path.join(mounted.mountpoint, "sessions-root")
    if store == "summary":
        summary_at(Path(root), 12)
    else:
        made = FileStore(root) if store == "file" else JournalStore(root)
        lock = made.lock(KEY)  # the writer locks first: the lock makes the directory
        raw = [b'{"format":1}'] if store == "file" else [b"{}\n"]
        made.write(KEY, raw, revision="r0", expected=None)
        lock.release()
    mounted.cut()
    on_disk = os.path.join(mounted.backing, "sessions-root")
    if store == "summary":
        assert load_summary(on_disk, KEY) is not None
    else:
        assert os.path.exists(
            os.path.join(on_disk, KEY + (".json" if store == "file" else ".jsonl"))
        )


def test_makedirs_durable_fsyncs_the_parent_of_every_directory_it_makes(tmp_path: Path) -> None:
    """Each new directory's parent is fsynced after its mkdir; an existing tree costs nothing."""
    synced: list[int] = []

    def record(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        os.fsync(fd)

    makedirs_durable(str(tmp_path / "a" / "b"), 0o700, record)
    assert synced == [tmp_path.stat().st_ino, (tmp_path / "a").stat().st_ino]
    assert (tmp_path / "a" / "b").stat().st_mode & 0o777 == 0o700
    makedirs_durable(str(tmp_path / "a" / "b"), 0o700, record)
    assert len(synced) == 2


def test_a_parent_that_cannot_be_looked_at_is_reported_as_such(tmp_path: Path) -> None:
    """A parent whose stat fails (here ELOOP; EIO on a dying disk) is that error, not EEXIST."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(OSError, match="symbolic links") as caught:
        makedirs_durable(str(loop / "root"), 0o700)
    assert caught.value.errno == errno.ELOOP


def test_listings_on_the_mount_show_every_entry(fuse: None, tmp_path: Path) -> None:
    """listdir, keys() and open()'s sweep of a dead writer's temp see the files on the mount."""
    backing = tmp_path / "disk"
    backing.mkdir()
    (backing / "a.json").write_bytes(b"{}")
    (backing / "sub").mkdir()
    temp = ".a.json.0123456789abcdef.tmp"
    (backing / temp).write_bytes(b"half")
    with PowerFS(str(backing), str(tmp_path / "mnt")) as fs:
        assert sorted(os.listdir(fs.mountpoint)) == sorted([temp, "a.json", "sub"])
        assert {e.name: e.inode() for e in os.scandir(fs.mountpoint)}["a.json"] == os.stat(
            backing / "a.json"
        ).st_ino
        store = FileStore(fs.mountpoint)
        assert store.keys() == ["a"]
        store.open()
        assert sorted(os.listdir(fs.mountpoint)) == ["a.json", "sub"]
        fs.unmount()
    assert sorted(os.listdir(backing)) == ["a.json", "sub"]


def test_closing_a_frozen_mount_unmounts_it(fuse: None, tmp_path: Path) -> None:
    """close() after a freeze leaves no mount behind (a frozen root cannot even be stat'ed)."""
    fs = PowerFS(str(tmp_path / "disk"), str(tmp_path / "mnt"))
    fs.mount()
    fs.freeze()
    fs.close()
    with open("/proc/self/mounts", encoding="utf-8") as f:
        assert fs.mountpoint not in f.read()


_PARENT = """
import sys
from tests._powerfs import PowerFS
fs = PowerFS(sys.argv[1], sys.argv[2])
fs.mount()
assert fs._proc is not None
print(fs._proc.pid, flush=True)
sys.stdin.read()
"""


def _wait_gone(pid: int) -> bool:
    """Wait (a hang guard, not a timing check) until the process ``pid`` has ended."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], HANG_GUARD)[0])
    finally:
        os.close(fd)


def _mounts() -> str:
    with open("/proc/self/mounts", encoding="utf-8") as f:
        return f.read()


@pytest.mark.parametrize("busy", [False, True])
def test_a_sigkilled_parent_leaves_no_mount_and_no_server(
    fuse: None, tmp_path: Path, busy: bool
) -> None:
    """SIGKILL the process that mounted: its FUSE server unmounts and exits, even if busy."""
    mountpoint = tmp_path / "mnt"
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, str(tmp_path / "disk"), str(mountpoint)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert parent.stdout is not None
    server = int(parent.stdout.readline())
    held = os.open(mountpoint / "held", os.O_RDWR | os.O_CREAT, 0o600) if busy else None
    try:
        parent.kill()
        parent.wait()
        assert _wait_gone(server), f"the FUSE server {server} outlived its parent"
        assert f" {mountpoint} " not in _mounts()
    finally:
        if held is not None:
            with contextlib.suppress(OSError):
                os.close(held)
        for stream in (parent.stdin, parent.stdout):
            if stream is not None:
                stream.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signal.SIGKILL)  # only if the test failed: leave nothing behind
        subprocess.run(["fusermount3", "-uz", str(mountpoint)], capture_output=True, check=False)


# -- removals and renames: durable once they return ----------------------------------------


@contextlib.contextmanager
def mounted_over(tmp_path: Path, store: str) -> Iterator[tuple[PowerFS, FileStore]]:
    """A mount whose durable state holds ``root/<KEY>`` written by ``store``; the store on it."""
    backing = tmp_path / "disk"
    made = FileStore if store == "file" else JournalStore
    raw = [b'{"format":1}'] if store == "file" else [b"{}\n"]
    made(backing / "root").write(KEY, raw, revision="r0", expected=None)
    fs = PowerFS(str(backing), str(tmp_path / "mnt"))
    fs.mount()
    try:
        yield fs, made(os.path.join(fs.mountpoint, "root"))
    finally:
        fs.close()


def on_disk(fs: PowerFS) -> list[str]:
    """The names in the root after the cut (listed in the backing, not through the mount)."""
    return sorted(os.listdir(os.path.join(fs.backing, "root")))


@pytest.mark.parametrize("store", ["file", "journal"])
def test_a_delete_survives_a_power_cut(fuse: None, tmp_path: Path, store: str) -> None:
    """delete() returned True: after the cut the checkpoint is still gone, never back."""
    with mounted_over(tmp_path, store) as (fs, made):
        name = os.path.basename(made.location(KEY))
        assert name in on_disk(fs)
        assert made.delete(KEY) is True
        fs.cut()
        assert name not in on_disk(fs)


@pytest.mark.parametrize("store", ["file", "journal"])
def test_a_move_aside_survives_a_power_cut(fuse: None, tmp_path: Path, store: str) -> None:
    """move_aside() returned its target: after the cut the key is gone and the target holds it."""
    with mounted_over(tmp_path, store) as (fs, made):
        target = made.move_aside(KEY, "corrupt-1")
        assert target is not None
        fs.cut()
        # the key's lock file (taken for the move) may stay: it holds no state
        kept = [name for name in on_disk(fs) if not name.endswith(".lock")]
        assert kept == [os.path.basename(target)]


def test_a_prune_survives_a_power_cut(fuse: None, tmp_path: Path) -> None:
    """prune's deletion (under the key's lock) said removed: after the cut the file is gone."""
    with mounted_over(tmp_path, "file") as (fs, made):
        root = DirectoryRoot(made.root)
        entry = Entry(KEY, "snapshot", made.location(KEY))
        done = root.delete(KEY, [(entry, "old")], recheck=lambda _: None, stale=None)
        assert [(r.path, r.outcome) for r in done] == [(entry.path, "removed")]
        fs.cut()
        assert KEY + ".json" not in on_disk(fs)


# -- a root that was there already: made durable by the first write -------------------------


def write_through_writer(store: FileStore) -> object:
    """A sync CheckpointWriter on ``store``: open, one new message, flush_sync; its result."""
    messages = ["hello"]
    with CheckpointWriter(lambda: Snapshot(KEY, {"messages": list(messages)}), store) as writer:
        messages.append("world")
        writer.notify()
        return writer.flush_sync()


@pytest.mark.parametrize("store", ["file", "journal"])
def test_a_root_the_app_made_survives_a_power_cut(mounted: PowerFS, store: str) -> None:
    """A root made with os.makedirs (never fsynced) holds what the writer reported after a cut."""
    root = os.path.join(mounted.mountpoint, "agent", "checkpoints")
    os.makedirs(root)
    made = FileStore(root) if store == "file" else JournalStore(root)
    assert isinstance(write_through_writer(made), Written)
    mounted.cut()
    on_disk = os.path.join(mounted.backing, "agent", "checkpoints")
    loaded = load(FileStore(on_disk) if store == "file" else JournalStore(on_disk), KEY)
    assert loaded is not None and loaded.state == {"messages": ["hello", "world"]}


@pytest.mark.parametrize("given", ["path", "store"])
def test_a_summary_dir_that_was_there_survives_a_power_cut(mounted: PowerFS, given: str) -> None:
    """sessions/<key>/ made by someone else (never fsynced): the summary written is there after."""
    root = os.path.join(mounted.mountpoint, "store")
    os.makedirs(os.path.join(root, "sessions", KEY))
    checkpoint = SummaryCheckpoint(3, "the gist", datetime.now(UTC), 3)
    write_summary_checkpoint(root if given == "path" else FileStore(root), KEY, checkpoint)
    mounted.cut()
    assert load_summary(os.path.join(mounted.backing, "store"), KEY) == checkpoint


def test_the_root_is_made_durable_once_per_store_object(tmp_path: Path, monkeypatch: Any) -> None:
    """The directories above the root are fsynced at a store's first write only, and per key."""
    root = tmp_path / "a" / "root"
    root.mkdir(parents=True)
    synced: list[int] = []
    real = os.fsync

    def record(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        real(fd)

    monkeypatch.setattr(os, "fsync", record)
    above = {(tmp_path / "a").stat().st_ino, tmp_path.stat().st_ino}
    for store in (FileStore(root), JournalStore(root)):
        for key in (KEY, KEY + "-2"):
            store.write(key, [b"{}\n"], revision="r0", expected=None)
        write_summary_checkpoint(store, KEY, SummaryCheckpoint(1, "s", datetime.now(UTC), 1))
        assert sorted(i for i in synced if i in above) == sorted(above)  # each once
        dirs = above | {root.stat().st_ino, (root / "sessions").stat().st_ino}
        synced.clear()
        write_summary_checkpoint(store, KEY, SummaryCheckpoint(2, "s", datetime.now(UTC), 2))
        assert not dirs & set(synced)  # the key's second summary: only its file and directory
        synced.clear()
