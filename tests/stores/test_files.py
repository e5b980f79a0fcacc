"""FileStore and the atomic write underneath it, on real files in tmp_path."""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import stat
from pathlib import Path

import pytest

from checkpointer import FileStore, load
from checkpointer._stores.atomic import sweep_temps, write_atomic
from checkpointer._stores.base import check_key
from tests._support import tree


def temps(directory: Path) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.endswith(".tmp"))


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def eio(*args: object, **kwargs: object) -> None:
    raise OSError(errno.EIO, os.strerror(errno.EIO))


def fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


# -- write_atomic -------------------------------------------------------------


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        ([b"hello"], b"hello"),
        ([b"a", b"", b"bc", b"\x00\xff"], b"abc\x00\xff"),
        ([], b""),
        ([b"x" * 3_000_000], b"x" * 3_000_000),
    ],
)
def test_write_atomic_writes_exact_bytes(
    tmp_path: Path, chunks: list[bytes], expected: bytes
) -> None:
    """The file holds exactly the joined chunks and the byte count is returned."""
    target = tmp_path / "k.json"
    assert write_atomic(str(target), chunks) == len(expected)
    assert target.read_bytes() == expected
    assert temps(tmp_path) == []


def test_write_atomic_file_mode_is_0600_even_over_a_0644_file(tmp_path: Path) -> None:
    """A new file and a replaced wider-mode file both end up mode 0600."""
    target = tmp_path / "k.json"
    write_atomic(str(target), [b"one"])
    assert mode_of(target) == 0o600
    target.chmod(0o644)
    write_atomic(str(target), [b"two"])
    assert mode_of(target) == 0o600
    assert target.read_bytes() == b"two"


def test_writes_leave_the_programs_random_sequence_alone(tmp_path: Path) -> None:
    """A seeded program (an eval, a simulation) draws the same numbers with writes between."""
    import random

    random.seed(1234)
    alone = [random.random() for _ in range(5)]
    random.seed(1234)
    between = []
    for i in range(5):
        write_atomic(str(tmp_path / "x.json"), [b"%d" % i])
        between.append(random.random())
    assert between == alone


def test_filestore_creates_root_0700_on_first_write_not_before(tmp_path: Path) -> None:
    """The root does not exist after construction or open(); the first write makes it 0700."""
    root = tmp_path / "checkpoints"
    store = FileStore(root)
    store.open()
    assert not root.exists()
    store.write("s1", [b"{}"], revision="r1", expected=None)
    assert mode_of(root) == 0o700
    assert mode_of(root / "s1.json") == 0o600
    assert (root / "s1.json").read_bytes() == b"\x00checkpointer-revision r1\n{}"


def test_write_atomic_fsyncs_the_file_then_the_parent_directory(tmp_path: Path) -> None:
    """fsync runs on the temp file holding the full data, then on the target's directory."""
    seen: list[os.stat_result] = []

    def record(fd: int) -> None:
        seen.append(os.fstat(fd))
        os.fsync(fd)

    target = tmp_path / "k.json"
    write_atomic(str(target), [b"12345"], fsync=record)
    assert len(seen) == 2
    file_stat, dir_stat = seen
    assert stat.S_ISREG(file_stat.st_mode)
    assert file_stat.st_size == 5
    assert file_stat.st_ino == os.stat(target).st_ino  # the temp became the target
    assert stat.S_ISDIR(dir_stat.st_mode)
    assert dir_stat.st_ino == os.stat(tmp_path).st_ino


@pytest.mark.parametrize("fail", ["fsync", "replace"])
def test_failed_write_keeps_old_file_and_leaves_no_temp(tmp_path: Path, fail: str) -> None:
    """An fsync or rename error raises OSError; the old bytes stay and no temp remains."""
    target = tmp_path / "k.json"
    write_atomic(str(target), [b"old content"])
    before = tree(tmp_path)
    with pytest.raises(OSError, match="Input/output error") as info:
        if fail == "fsync":
            write_atomic(str(target), [b"new content"], fsync=eio)
        else:
            write_atomic(str(target), [b"new content"], replace=eio)
    assert info.value.errno == errno.EIO
    assert tree(tmp_path) == before
    assert target.read_bytes() == b"old content"


def test_retry_after_fsync_error_uses_a_fresh_temp_file(tmp_path: Path) -> None:
    """After a failed fsync the next write fsyncs a new temp, and the failed one is gone."""
    target = tmp_path / "k.json"
    failed: list[str] = []
    retried: list[str] = []

    def fail_once(fd: int) -> None:
        failed.append(fd_path(fd))
        eio()

    def record(fd: int) -> None:
        retried.append(fd_path(fd))
        os.fsync(fd)

    with pytest.raises(OSError, match="Input/output error"):
        write_atomic(str(target), [b"data"], fsync=fail_once)
    write_atomic(str(target), [b"data"], fsync=record)
    assert len(failed) == 1
    assert retried[0] != failed[0]
    assert not os.path.exists(failed[0])
    assert target.read_bytes() == b"data"
    assert temps(tmp_path) == []


def test_failed_directory_fsync_raises_after_the_new_content_is_in_place(tmp_path: Path) -> None:
    """A directory-fsync error is reported, the rename has happened and no temp remains."""
    target = tmp_path / "k.json"
    write_atomic(str(target), [b"old"])
    calls: list[int] = []

    def fail_second(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 2:
            eio()
        os.fsync(fd)

    with pytest.raises(OSError, match="Input/output error"):
        write_atomic(str(target), [b"new"], fsync=fail_second)
    assert target.read_bytes() == b"new"
    assert temps(tmp_path) == []


@pytest.mark.parametrize("root", ["blocker/sub", "blocker"])
def test_root_under_or_at_a_regular_file_raises_and_creates_nothing(
    tmp_path: Path, root: str
) -> None:
    """A root that is, or lies under, a regular file fails with OSError and writes nothing."""
    (tmp_path / "blocker").write_bytes(b"not a directory")
    before = tree(tmp_path)
    store = FileStore(tmp_path / root)
    store.open()  # sweeping a non-directory is not an error
    with pytest.raises((NotADirectoryError, FileExistsError)):
        store.write("s1", [b"{}"], revision="r1", expected=None)
    assert tree(tmp_path) == before


# -- sweep_temps -------------------------------------------------------------


def temp_name(name: str) -> str:
    """The name ``write_atomic`` gives a temp of ``name``."""
    return f".{name}.{secrets.token_hex(8)}.tmp"


def test_sweep_removes_only_temps_no_write_holds(tmp_path: Path) -> None:
    """Free temps go; a locked one, a young one of mode 000 (its writer may be about to
    lock it) and names that are not our temps stay."""
    stale = [temp_name("s1.json"), temp_name("a.b-c.json"), temp_name("checkpoint.md")]
    locked, young = temp_name("s1.json"), temp_name("s2.json")
    kept = [
        locked,
        young,
        ".bashrc",
        ".s1.json.tmp",
        ".s1.json.4242.abc123_x.tmp",
        f"{temp_name('s1.json')}.bak",
        temp_name("s1.json")[1:],
        "s1.json",
    ]
    for name in stale + kept:
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / young).chmod(0)
    fd = os.open(tmp_path / locked, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another open file description: a live write
        removed = sweep_temps(str(tmp_path))
    finally:
        os.close(fd)
    assert sorted(removed) == sorted(str(tmp_path / name) for name in stale)
    assert sorted(os.listdir(tmp_path)) == sorted(kept)


def test_a_sweep_does_not_even_try_the_lock_of_a_young_temp_of_mode_000(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A temp of mode 000 may be one its writer is about to lock: the sweep keeps it and
    never tries its lock (held at that instant, it would make the writer's own fail)."""
    young = tmp_path / temp_name("k.json")
    young.write_bytes(b"")
    young.chmod(0)
    tried: list[int] = []
    real = fcntl.flock

    def spy(fd: int, operation: int) -> None:
        tried.append(operation)
        real(fd, operation)

    monkeypatch.setattr(fcntl, "flock", spy)
    assert sweep_temps(str(tmp_path)) == []
    assert tried == [] and young.exists()


def test_sweep_keeps_the_temp_of_a_write_in_progress(tmp_path: Path) -> None:
    """A sweep during our own write keeps its temp; a free temp of the same shape goes."""
    seen: list[str] = []

    def sweep_mid_write(fd: int) -> None:
        if not seen:
            name = os.path.basename(fd_path(fd))
            seen.append(name)
            assert name.startswith(".k.json.") and name.endswith(".tmp")
            assert sweep_temps(str(tmp_path)) == []
        os.fsync(fd)

    write_atomic(str(tmp_path / "k.json"), [b"data"], fsync=sweep_mid_write)
    assert (tmp_path / "k.json").read_bytes() == b"data"
    (tmp_path / seen[0]).write_bytes(b"half")  # the same name, left by a killed write
    assert sweep_temps(str(tmp_path)) == [str(tmp_path / seen[0])]
    assert os.listdir(tmp_path) == ["k.json"]


def test_sweep_skips_an_entry_it_cannot_remove_and_goes_on(tmp_path: Path) -> None:
    """An unremovable temp-named entry (a directory) does not stop the sweep of the rest."""
    directory, debris = temp_name("a.json"), temp_name("b.json")
    (tmp_path / directory).mkdir()
    (tmp_path / debris).write_bytes(b"x")
    assert sweep_temps(str(tmp_path)) == [str(tmp_path / debris)]
    assert os.listdir(tmp_path) == [directory]


def test_sweep_of_a_missing_directory_is_empty(tmp_path: Path) -> None:
    """Sweeping a directory that does not exist removes nothing and creates nothing."""
    assert sweep_temps(str(tmp_path / "missing")) == []
    assert tree(tmp_path) == {}


def test_filestore_open_sweeps_stale_temps(tmp_path: Path) -> None:
    """FileStore.open() removes a dead writer's temp and keeps the checkpoint."""
    store = FileStore(tmp_path)
    store.write("s1", [b"{}"], revision="r1", expected=None)
    stale = tmp_path / temp_name("s1.json")
    stale.write_bytes(b"{")
    store.open()
    assert not stale.exists()
    assert os.listdir(tmp_path) == ["s1.json"]


def test_filestore_open_sweeps_once_per_root_and_process(tmp_path: Path) -> None:
    """The sweep lists a root once per process (10,000 writers opening on one root list
    it once); a forked child, another process, sweeps it again at its first open."""
    FileStore(tmp_path).open()
    stale = tmp_path / temp_name("s1.json")
    stale.write_bytes(b"{")
    FileStore(tmp_path).open()  # a second writer's open: no second listing
    assert stale.exists()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            FileStore(tmp_path).open()
            os._exit(0 if not stale.exists() else 1)
        finally:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not stale.exists()


def test_filestore_open_sweeps_a_root_new_to_the_process_on_the_inode_of_one_swept(
    tmp_path: Path,
) -> None:
    """A root this process never opened is swept at its first open, though it has the
    (st_dev, st_ino) of one it swept: ext4 and tmpfs give a new directory the inode of one
    just deleted (here: the swept directory renamed, which keeps its inode for certain)."""
    swept, fresh = tmp_path / "swept", tmp_path / "fresh"
    swept.mkdir()
    FileStore(swept).open()
    swept.rename(fresh)
    stale = fresh / temp_name("s1.json")
    stale.write_bytes(b"{")
    FileStore(fresh).open()
    assert not stale.exists()


# -- FileStore ---------------------------------------------------------------


def test_keys_lists_only_valid_checkpoint_keys_sorted(tmp_path: Path) -> None:
    """keys() is the sorted valid keys of *.json files, ignoring temps, asides and others."""
    store = FileStore(tmp_path)
    for key in ["b", "a", "Z", "_", "x.json", "a-1.v2"]:
        store.write(key, [b"{}"], revision="r1", expected=None)
    for name in [
        temp_name("a.json"),
        "a.corrupt-20240101T000000.000000Z",
        ".hidden.json",
        "bad key.json",
        "notes.txt",
        "json",
        ".json",
        f"{'k' * 201}.json",
    ]:
        (tmp_path / name).write_bytes(b"{}")
    assert store.keys() == ["Z", "_", "a", "a-1.v2", "b", "x.json"]


def test_keys_of_a_missing_root_is_empty(tmp_path: Path) -> None:
    """A store whose root was never written has no keys and creates no root."""
    assert FileStore(tmp_path / "none").keys() == []
    assert not (tmp_path / "none").exists()


def test_read_returns_bytes_or_none(tmp_path: Path) -> None:
    """read() gives the stored bytes, None for a missing key or a missing root."""
    store = FileStore(tmp_path / "root")
    assert store.read("s1") is None
    store.write("s1", [b"abc"], revision="r1", expected=None)
    assert store.read("s1") == b"abc"
    assert store.read("s2") is None


def test_delete_removes_once(tmp_path: Path) -> None:
    """delete() removes the file and says True, then False when there is nothing."""
    store = FileStore(tmp_path)
    store.write("s1", [b"{}"], revision="r1", expected=None)
    store.write("s2", [b"{}"], revision="r1", expected=None)
    assert store.delete("s1") is True
    assert not (tmp_path / "s1.json").exists()
    assert store.delete("s1") is False
    assert store.keys() == ["s2"]
    assert FileStore(tmp_path / "missing").delete("s1") is False


def test_move_aside_renames_out_of_the_key_space(tmp_path: Path) -> None:
    """move_aside() keeps the bytes under root/key.suffix, drops the key, None if absent."""
    store = FileStore(tmp_path)
    store.write("s1", [b"broken"], revision="r1", expected=None)
    target = store.move_aside("s1", "corrupt-1")
    assert target == str(tmp_path / "s1.corrupt-1")
    assert Path(target).read_bytes() == b"\x00checkpointer-revision r1\nbroken"
    assert store.read("s1") is None
    assert store.keys() == []
    assert store.move_aside("s1", "corrupt-2") is None
    assert sorted(os.listdir(tmp_path)) == ["s1.corrupt-1"]


# -- keys ----------------------------------------------------------------------

INVALID_KEYS: list[object] = [
    "",
    "a" * 201,
    ".",
    "..",
    ".hidden",
    "a/b",
    "../escape",
    "../../escape",
    "/abs",
    "a\\b",
    "a\0b",
    "a\n",
    " ",
    "a b",
    " a",
    "é",
    "caf\u00e9",
    "\u0661",  # an Arabic-Indic digit: str.isdigit() but not ASCII
    "a:b",
    "a*",
    5,
    None,
    b"x",
    ["a"],
]

VALID_KEYS = ["a" * 200, "a.b-c_d", "-x", "_", "0", "a..b", "x.", "A-Z_0.9"]


@pytest.mark.parametrize("key", INVALID_KEYS, ids=repr)
def test_check_key_rejects_with_the_key_and_the_rule(key: object) -> None:
    """An invalid key raises ValueError quoting the key and stating the rule."""
    with pytest.raises(ValueError, match="invalid key") as info:
        check_key(key)
    message = str(info.value)
    shown = repr(key)
    assert (shown if len(shown) <= 80 else shown[:77]) in message
    assert "1-200 ASCII letters, digits, '.', '_' or '-', not starting with '.'" in message


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("", "it is empty"),
        ("a" * 201, "it has 201 characters"),
        (".hidden", "it starts with '.'"),
        ("a/b", "it contains '/'"),
        ("é", "it contains 'é'"),
        (5, "it is of type int, not str"),
    ],
)
def test_check_key_says_which_part_of_the_rule_is_broken(key: object, why: str) -> None:
    """The message names the specific violation."""
    with pytest.raises(ValueError, match=why):
        check_key(key)


@pytest.mark.parametrize("key", INVALID_KEYS, ids=repr)
def test_filestore_with_an_invalid_key_touches_nothing(tmp_path: Path, key: object) -> None:
    """write/read/delete/move_aside/load with an invalid key raise ValueError and create nothing."""
    store = FileStore(tmp_path / "a" / "root")
    store.write("existing", [b"{}"], revision="r1", expected=None)
    before = tree(tmp_path)
    bad: str = key  # type: ignore[assignment]  # the point: callers pass anything
    with pytest.raises(ValueError, match="invalid key"):
        store.write(bad, [b"{}"], revision="r1", expected=None)
    with pytest.raises(ValueError, match="invalid key"):
        store.read(bad)
    with pytest.raises(ValueError, match="invalid key"):
        store.delete(bad)
    with pytest.raises(ValueError, match="invalid key"):
        store.move_aside(bad, "corrupt")
    with pytest.raises(ValueError, match="invalid key"):
        load(store, bad)
    assert tree(tmp_path) == before


def test_invalid_key_does_not_create_the_root(tmp_path: Path) -> None:
    """A rejected first write leaves the missing root missing."""
    store = FileStore(tmp_path / "root")
    with pytest.raises(ValueError, match="invalid key"):
        store.write("../x", [b"{}"], revision="r1", expected=None)
    assert tree(tmp_path) == {}


@pytest.mark.parametrize("key", VALID_KEYS)
def test_valid_edge_keys_round_trip(tmp_path: Path, key: str) -> None:
    """Edge-case valid keys are accepted and stored at root/<key>.json."""
    assert check_key(key) == key
    store = FileStore(tmp_path)
    assert store.write(key, [b"{}"], revision="r1", expected=None) == 28
    assert (tmp_path / f"{key}.json").read_bytes() == b"\x00checkpointer-revision r1\n{}"
    assert store.read(key) == b"{}"
    assert store.revision(key) == "r1"
    assert store.keys() == [key]
    assert store.location(key) == str(tmp_path / f"{key}.json")


def test_filestore_rejects_an_empty_root() -> None:
    """FileStore('') is refused rather than writing into the working directory."""
    with pytest.raises(ValueError, match="non-empty path"):
        FileStore("")
