"""Security: nothing planted in a store's root makes the library write outside it.

In place of every file the stores touch (``<key>.json``, ``<key>.jsonl``,
``<key>.lock``, ``sessions/``, ``sessions/<key>/``, ``checkpoint.md``) each
test plants one thing: a symbolic link to a file outside the root (a copy of
the real file, the tempting case), one to a directory outside, a dangling
one, a FIFO, a hard link to a file outside.  Then one path runs over it: a
writer (``write_now`` on asyncio and trio, ``flush_sync``), ``load``,
``collapse``, ``load_summary``, each CLI command.  Checked each time:

* the bytes and mtimes of everything outside the root are as they were;
* the outcome is a ``Failed`` (or ``SummaryFailed``, ``CheckpointError``, a
  CLI error) naming the path and what is there, and the planted entry is
  left as it was, except a hard link at a name the library replaces by
  rename: that is written (the rename gives the name a new file; the other
  name keeps its bytes);
* once the planted entry is removed, the same path succeeds.

Never a wall-clock wait: a watchdog unblocks any open stuck on a FIFO after
20 s and fails the test (it never fires when the library is right).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from checkpointer import (
    CheckpointError,
    CheckpointWriter,
    Failed,
    FileStore,
    JournalStore,
    Result,
    Snapshot,
    Written,
    load,
)
from checkpointer._cli import main as cli_main
from checkpointer._stores import safefs as _safefs
from checkpointer._stores.safefs import UnreadableFile, read_fd
from checkpointer.summaries import (
    SummaryCheckpoint,
    SummaryFailed,
    collapse,
    load_summary,
    write_summary,
)
from tests._support import ROOT

KEY = "k"
KINDS = ("symlink-to-file", "symlink-to-dir", "dangling-symlink", "fifo", "hard-link")
REPLACED_BY_RENAME = {f"{KEY}.json", f"{KEY}.jsonl", "checkpoint.md"}
OLD = 1_000_000_000_000_000_000  # 2001-09-09, in ns: the mtime of everything outside

StoreFactory = Callable[[Path], FileStore]
STORES: dict[str, tuple[StoreFactory, str]] = {
    "FileStore": (FileStore, f"{KEY}.json"),
    "JournalStore": (JournalStore, f"{KEY}.jsonl"),
}
"""The stores whose files are opened here (a writer's transcript changes how a state is
encoded, not how its file is opened, locked or replaced)."""


# -- planting ---------------------------------------------------------------------------


Entry = tuple[int, bytes | str | None, int]


def snapshot(top: Path) -> dict[str, Entry]:
    """Every entry under ``top``, links not followed: its type, bytes or link target, mtime."""
    found: dict[str, Entry] = {".": (stat.S_IFDIR, None, os.lstat(top).st_mtime_ns)}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            content: bytes | str | None = None
            if stat.S_ISLNK(st.st_mode):
                content = os.readlink(path)
            elif stat.S_ISREG(st.st_mode):
                content = Path(path).read_bytes()
            found[os.path.relpath(path, top)] = (stat.S_IFMT(st.st_mode), content, st.st_mtime_ns)
    return found


class Planted:
    """One thing planted at ``path``, with bait outside the root it may point at."""

    def __init__(self, path: Path, kind: str, outside: Path) -> None:
        self.path = path
        self.kind = kind
        self.outside = outside
        outside.mkdir()
        bait, bait_dir, missing = outside / "bait", outside / "dir", outside / "missing"
        if path.is_dir() and not path.is_symlink():  # a directory target: its copy is the bait
            shutil.copytree(path, bait_dir)
            shutil.rmtree(path)
            bait.write_bytes(b"precious data\n")
        else:
            # The real file's bytes outside: what a library following the link would take.
            real = path.read_bytes() if path.is_file() and not path.is_symlink() else None
            bait.write_bytes(real or b"precious data\n")
            bait_dir.mkdir()
            (bait_dir / "inside").write_bytes(b"keep me\n")
            if os.path.lexists(path):
                path.unlink()
        if kind == "symlink-to-file":
            path.symlink_to(bait)
        elif kind == "symlink-to-dir":
            path.symlink_to(bait_dir)
        elif kind == "dangling-symlink":
            path.symlink_to(missing)
        elif kind == "fifo":
            os.mkfifo(path)
        else:
            os.link(bait, path)
        for dirpath, dirnames, filenames in os.walk(outside):
            for name in [*dirnames, *filenames, "."]:
                os.utime(os.path.join(dirpath, name), ns=(OLD, OLD), follow_symlinks=False)
        self.before = snapshot(outside)
        self.identity = self._identity()

    def _identity(self) -> tuple[int, int, int, str | None]:
        st = os.lstat(self.path)
        target = os.readlink(self.path) if stat.S_ISLNK(st.st_mode) else None
        return (st.st_ino, st.st_mode, st.st_mtime_ns, target)

    @property
    def refused(self) -> bool:
        """Whether the library must refuse it (all but a hard link at a renamed name)."""
        return not (self.kind == "hard-link" and self.path.name in REPLACED_BY_RENAME)

    @property
    def found(self) -> str:
        """The words the error must use for what is there."""
        if self.kind == "fifo":
            return f"{self.path} is a FIFO"
        if self.kind == "hard-link":
            if self.path.name in (KEY, "sessions"):
                return f"{self.path} is a regular file, not a directory"
            return f"{self.path} is a file with 2 hard links"
        target = {"symlink-to-file": "bait", "symlink-to-dir": "dir", "dangling-symlink": "missing"}
        return f"{self.path} is a symbolic link to '{self.outside / target[self.kind]}'"

    def check_outside(self) -> None:
        """Nothing outside the root changed: bytes, mtimes, entries."""
        assert snapshot(self.outside) == self.before

    def check_left(self) -> None:
        """The planted entry is still there, as it was."""
        assert self._identity() == self.identity

    def check(self, error: str | None) -> None:
        """Outside unchanged; refused with an error naming it, or replaced with its bait intact."""
        self.check_outside()
        if self.refused:
            assert error is not None and self.found in error, error
            self.check_left()
        else:  # a hard link at a renamed name: read, replaced, or removed (prune), never written
            assert error is None, error
            st = os.lstat(self.path) if os.path.lexists(self.path) else None
            assert st is None or self._identity() == self.identity or st.st_nlink == 1

    def remove(self) -> None:
        """Take the planted entry away (only what was planted)."""
        if self.refused:
            self.path.unlink()


@pytest.fixture(autouse=True)
def fifo_watchdog(tmp_path: Path) -> Iterator[None]:
    """Fail (instead of hanging) when an open waits on a planted FIFO: open its other end."""
    done = threading.Event()
    fired: list[str] = []

    def unblock() -> None:
        while not done.wait(20.0 if not fired else 1.0):
            for dirpath, dirnames, filenames in os.walk(tmp_path):
                for name in dirnames + filenames:
                    path = os.path.join(dirpath, name)
                    try:
                        if stat.S_ISFIFO(os.lstat(path).st_mode):
                            fired.append(path)
                            os.close(os.open(path, os.O_RDWR | os.O_NONBLOCK))
                    except OSError:  # gone meanwhile
                        continue

    thread = threading.Thread(target=unblock, daemon=True)
    thread.start()
    yield
    done.set()
    thread.join()
    assert not fired, f"an open blocked on the FIFO {fired[0]}"


# -- writers ----------------------------------------------------------------------------


class Session:
    """A growing transcript; ``snapshot`` is the writer's source."""

    def __init__(self, n: int = 1) -> None:
        self.messages: list[dict[str, str]] = []
        self.add(n)

    def add(self, n: int = 1) -> None:
        for _ in range(n):
            self.messages.append({"role": "user", "content": f"turn {len(self.messages)}"})

    def snapshot(self) -> Snapshot:
        return Snapshot(KEY, {"messages": list(self.messages)})


def written_store(tmp_path: Path, store: str) -> tuple[Path, StoreFactory, str]:
    """A root holding a real checkpoint of KEY (two messages), written and closed."""
    make, name = STORES[store]
    root = tmp_path / "root"
    with CheckpointWriter(Session(2).snapshot, make(root), exit_hooks=False):
        pass
    assert (root / name).is_file() and not (root / f"{KEY}.lock").exists()
    return root, make, name


def error_of(result: Result) -> str | None:
    """The error of a Failed (reason write-failed), None for a Written."""
    if isinstance(result, Failed):
        assert result.reason == "write-failed", result
        return result.error
    assert isinstance(result, Written), result
    return None


def writer_case(tmp_path: Path, store: str, target: str, kind: str) -> tuple[Planted, Session]:
    root, _, name = written_store(tmp_path, store)
    planted = Planted(
        root / (name if target == "checkpoint" else f"{KEY}.lock"), kind, tmp_path / "outside"
    )
    return planted, Session(3)


def check_recovered(tmp_path: Path, store: str, session: Session) -> None:
    make, _ = STORES[store]
    cp = load(make(tmp_path / "root"), KEY)
    assert cp is not None and cp.state == session.snapshot().state


@pytest.mark.anyio
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("target", ["checkpoint", "lock"])
@pytest.mark.parametrize("store", STORES)
async def test_writer_never_writes_through_a_planted_file(
    tmp_path: Path, store: str, target: str, kind: str
) -> None:
    """write_now over a planted file: Failed naming it, nothing outside changed; then Written."""
    planted, session = writer_case(tmp_path, store, target, kind)
    make, _ = STORES[store]
    writer = CheckpointWriter(
        session.snapshot, make(tmp_path / "root"), exit_hooks=False, write_on_start=False
    )
    async with writer:
        planted.check(error_of(await writer.write_now()))
        planted.remove()
        session.add()
        assert isinstance(await writer.write_now(), Written)
    planted.check_outside()
    check_recovered(tmp_path, store, session)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("target", ["checkpoint", "lock"])
@pytest.mark.parametrize("store", STORES)
def test_flush_sync_never_writes_through_a_planted_file(
    tmp_path: Path, store: str, target: str, kind: str
) -> None:
    """flush_sync over a planted file: Failed naming it, nothing outside changed; then Written."""
    planted, session = writer_case(tmp_path, store, target, kind)
    make, _ = STORES[store]
    writer = CheckpointWriter(
        session.snapshot, make(tmp_path / "root"), exit_hooks=False, write_on_start=False
    ).open()
    try:
        planted.check(error_of(writer.flush_sync()))
        planted.remove()
        session.add()
        assert isinstance(writer.flush_sync(), Written)
    finally:
        writer.close()
    planted.check_outside()
    check_recovered(tmp_path, store, session)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("store", STORES)
def test_load_never_reads_through_a_planted_file(tmp_path: Path, store: str, kind: str) -> None:
    """load over a planted file: CheckpointError naming it (a hard link loads); nothing changes."""
    root, make, name = written_store(tmp_path, store)
    planted = Planted(root / name, kind, tmp_path / "outside")
    if planted.refused:
        with pytest.raises(CheckpointError, match="cannot be read") as caught:
            load(make(root), KEY)
        assert caught.value.path == str(planted.path)
        planted.check(caught.value.reason)
    else:
        cp = load(make(root), KEY)
        assert cp is not None and cp.state == Session(2).snapshot().state
        planted.check(None)
    planted.remove()
    planted.check_outside()
    assert load(make(root), KEY) is None or not planted.refused


# -- summary checkpoints ----------------------------------------------------------------

SUMMARY_TARGETS = ("sessions", f"sessions/{KEY}", f"sessions/{KEY}/checkpoint.md")
WHEN = datetime(2025, 5, 1, 12, 0, tzinfo=UTC)


def summary_case(tmp_path: Path, target: str, kind: str) -> Planted:
    root = tmp_path / "root"
    write_summary(root, KEY, SummaryCheckpoint(1, "the first summary", WHEN, 1))
    return Planted(root / target, kind, tmp_path / "outside")


@pytest.mark.anyio
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("target", SUMMARY_TARGETS)
async def test_collapse_never_writes_through_a_planted_entry(
    tmp_path: Path, target: str, kind: str
) -> None:
    """collapse over a planted dir or file: SummaryFailed naming it, outside intact; then works."""
    planted = summary_case(tmp_path, target, kind)
    root = tmp_path / "root"
    messages = Session(6).messages
    result = await collapse(lambda done: f"{len(done)} done", root, KEY, messages, keep_last=2)
    if isinstance(result, SummaryFailed):
        assert result.reason == "write-failed", result
        assert isinstance(result.exception, OSError)
        planted.check(result.error)
    else:
        assert isinstance(result, SummaryCheckpoint), result
        planted.check(None)
    planted.remove()
    again = await collapse(lambda done: "recovered", root, KEY, messages, keep_last=2)
    assert isinstance(again, SummaryCheckpoint), again
    loaded = load_summary(root, KEY)
    assert loaded is not None and loaded.summary == "recovered"
    planted.check_outside()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("target", SUMMARY_TARGETS)
def test_load_summary_never_reads_through_a_planted_entry(
    tmp_path: Path, target: str, kind: str
) -> None:
    """load_summary over a planted dir or file: CheckpointError naming it; nothing changes."""
    planted = summary_case(tmp_path, target, kind)
    if planted.refused:
        with pytest.raises(CheckpointError, match="cannot be read") as caught:
            load_summary(tmp_path / "root", KEY)
        planted.check(caught.value.reason)
    else:
        loaded = load_summary(tmp_path / "root", KEY)
        assert loaded is not None and loaded.summary == "the first summary"
        planted.check(None)
    planted.remove()
    assert load_summary(tmp_path / "root", KEY) is None or not planted.refused
    planted.check_outside()


# -- the command line -------------------------------------------------------------------

COMMANDS: dict[str, list[str]] = {
    "ls": ["ls", "--json"],
    "show": ["show", "{root}", KEY],
    "show --raw": ["show", "--raw", "{root}", KEY],
    "verify": ["verify"],
    "prune": ["prune", "--older-than", "0s"],
}
CLI_TARGETS = {  # what is planted: (store, file)
    "snapshot": ("FileStore", f"{KEY}.json"),
    "journal": ("JournalStore", f"{KEY}.jsonl"),
    "lock": ("FileStore", f"{KEY}.lock"),
}


def run_cli(command: str, root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run one command in this process: (status, stdout, stdout + stderr)."""
    args = [str(root) if a == "{root}" else a for a in COMMANDS[command]]
    if "{root}" not in COMMANDS[command]:
        args.insert(1, str(root))
    status = cli_main(args)
    out, err = capsys.readouterr()
    return status, out, out + err


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("target", CLI_TARGETS)
@pytest.mark.parametrize("command", COMMANDS)
def test_cli_never_follows_or_removes_a_planted_file(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    target: str,
    kind: str,
) -> None:
    """Each command over a planted file: says what is there, changes nothing outside, no hang."""
    monkeypatch.setattr(logging, "basicConfig", lambda **kw: None)  # no handler on capsys's stream
    store, name = CLI_TARGETS[target]
    root, make, checkpoint = written_store(tmp_path, store)
    planted = Planted(root / name, kind, tmp_path / "outside")
    status, out, text = run_cli(command, root, capsys)
    touches = target != "lock" or command in ("ls", "show", "prune")  # verify, raw: no lock
    if not touches:
        assert status == 0, text
        planted.check_outside()
        planted.check_left()
    elif planted.refused:
        lock_seen = target == "lock" and command != "prune"  # a lock "cannot tell", not bad
        assert status == (0 if lock_seen else 1), text  # ls: 1 for a row it cannot read
        planted.check(text)
    else:
        assert status == 0, text
        planted.check(None)
    if command == "ls":
        (row,) = json.loads(out)
        if planted.refused and target == "lock":
            assert row["lock"] == "unknown" and planted.found in row["lock_holder"]
        elif planted.refused:
            assert planted.found in row["error"]
    planted.remove()
    if not os.path.lexists(root / checkpoint):  # a checkpoint again, to look at
        with CheckpointWriter(Session(2).snapshot, make(root), exit_hooks=False):
            pass
    status, _, text = run_cli(command, root, capsys)
    assert status == 0, text
    planted.check_outside()


# -- what the matrix does not cover ------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_temp_sweep_removes_a_planted_name_only(tmp_path: Path, kind: str) -> None:
    """A temp-named link, FIFO or hard link in the root: the sweep unlinks the name, no target."""
    root = tmp_path / "root"
    root.mkdir()
    planted = Planted(root / f".{KEY}.json.{'0' * 16}.tmp", kind, tmp_path / "outside")
    FileStore(root).open()
    assert not os.path.lexists(planted.path)
    planted.check_outside()


def test_exploit_a_lock_file_linked_outside_is_not_truncated(tmp_path: Path) -> None:
    """The issue's first exploit: <root>/k.lock -> a precious file; it keeps its bytes."""
    root = tmp_path / "root"
    root.mkdir()
    precious = tmp_path / "precious.txt"
    precious.write_bytes(b"precious data\n")
    (root / f"{KEY}.lock").symlink_to(precious)
    with CheckpointWriter(Session().snapshot, FileStore(root), exit_hooks=False) as writer:
        assert writer.statistics().failures == 1
    assert precious.read_bytes() == b"precious data\n"


def test_exploit_a_journal_linked_outside_is_not_appended_to(tmp_path: Path) -> None:
    """The issue's second exploit: <root>/k.jsonl -> a copy outside; the copy does not grow."""
    root = tmp_path / "root"
    with CheckpointWriter(Session().snapshot, JournalStore(root), exit_hooks=False):
        pass
    copy = tmp_path / "copy.jsonl"
    shutil.copy(root / f"{KEY}.jsonl", copy)
    (root / f"{KEY}.jsonl").unlink()
    (root / f"{KEY}.jsonl").symlink_to(copy)
    size = copy.stat().st_size
    with CheckpointWriter(Session(3).snapshot, JournalStore(root), exit_hooks=False) as writer:
        assert writer.statistics().writes == 0
    assert copy.stat().st_size == size
    assert (root / f"{KEY}.jsonl").is_symlink()


def test_journal_swapped_for_a_link_while_a_writer_runs(tmp_path: Path) -> None:
    """A journal swapped for a link mid-session: Failed naming it, the copy intact; then deleted."""
    root = tmp_path / "root"
    session = Session()
    with CheckpointWriter(session.snapshot, JournalStore(root), exit_hooks=False) as writer:
        path = root / f"{KEY}.jsonl"
        planted = Planted(path, "symlink-to-file", tmp_path / "outside")
        session.add()
        planted.check(error_of(writer.flush_sync()))
        planted.remove()  # the journal it replaced is gone: the key was deleted
        refused = writer.flush_sync()
        assert isinstance(refused, Failed) and "was deleted" in refused.error, refused
    assert not path.exists()
    planted.check_outside()


def test_journal_hard_linked_while_a_writer_runs_is_rewritten(tmp_path: Path) -> None:
    """A hard link made mid-session (a backup): the next write rewrites; the backup is intact."""
    root = tmp_path / "root"
    session = Session()
    store = JournalStore(root)
    with CheckpointWriter(session.snapshot, store, exit_hooks=False) as writer:
        backup = tmp_path / "backup.jsonl"
        os.link(root / f"{KEY}.jsonl", backup)
        kept = backup.read_bytes()
        rewrites = store.statistics().rewrites
        session.add()
        assert isinstance(writer.flush_sync(), Written)
        assert store.statistics().rewrites == rewrites + 1
        assert backup.read_bytes() == kept
        assert os.stat(root / f"{KEY}.jsonl").st_nlink == 1
        session.add()
        assert isinstance(writer.flush_sync(), Written)  # and appends again
        assert store.statistics().rewrites == rewrites + 1
    assert backup.read_bytes() == kept


def test_torn_journal_hard_linked_is_not_truncated_through_the_link(tmp_path: Path) -> None:
    """A torn tail in a hard-linked journal: not cut in place (the backup keeps it); rewritten."""
    root = tmp_path / "root"
    with CheckpointWriter(Session().snapshot, JournalStore(root), exit_hooks=False):
        pass
    path = root / f"{KEY}.jsonl"
    with path.open("ab") as f:
        f.write(b'{"kind":"message","mess')
    backup = tmp_path / "backup.jsonl"
    os.link(path, backup)
    kept = backup.read_bytes()
    session = Session(2)
    with CheckpointWriter(session.snapshot, JournalStore(root), exit_hooks=False) as writer:
        assert writer.statistics().writes == 1
    assert backup.read_bytes() == kept
    cp = load(JournalStore(root), KEY)
    assert cp is not None and cp.torn is None and cp.state == session.snapshot().state


@pytest.mark.parametrize("store", ["FileStore", "JournalStore"])
def test_a_hard_linked_corrupt_file_is_moved_aside_by_name(tmp_path: Path, store: str) -> None:
    """A hard link to an outside garbage file: renamed aside (the name), outside intact; Written."""
    root, make, name = written_store(tmp_path, store)
    (root / name).unlink()
    bait = tmp_path / "bait"
    bait.write_bytes(b"not a checkpoint\n")
    os.link(bait, root / name)
    before = (bait.read_bytes(), bait.stat().st_mtime_ns)
    session = Session(3)
    with CheckpointWriter(session.snapshot, make(root), exit_hooks=False) as writer:
        assert writer.statistics().writes == 1
    assert (bait.read_bytes(), bait.stat().st_mtime_ns) == before
    (aside,) = [p for p in root.iterdir() if ".corrupt-" in p.name]
    assert aside.stat().st_ino == bait.stat().st_ino
    check_recovered(tmp_path, store, session)


def test_a_symlinked_root_is_allowed(tmp_path: Path) -> None:
    """The root itself may be a link (users do that on purpose): writes, locks, summaries work."""
    real = tmp_path / "real"
    real.mkdir()
    root = tmp_path / "link"
    root.symlink_to(real)
    session = Session()
    with CheckpointWriter(session.snapshot, JournalStore(root), exit_hooks=False) as writer:
        assert writer.statistics().writes == 1
    write_summary(root, KEY, SummaryCheckpoint(1, "s", WHEN, 1))
    assert sorted(os.listdir(real)) == [f"{KEY}.jsonl", "sessions"]
    assert load_summary(root, KEY) is not None


def test_world_writable_root_without_sticky_bit_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A root anyone may write (no sticky bit) gets one warning per process; a sticky one none."""
    loose, sticky = tmp_path / "loose", tmp_path / "sticky"
    for root, mode in ((loose, 0o777), (sticky, 0o1777)):
        root.mkdir()
        root.chmod(mode)
    with caplog.at_level(logging.WARNING, logger="checkpointer"):
        for root in (loose, sticky, loose):
            with CheckpointWriter(Session().snapshot, FileStore(root), exit_hooks=False):
                pass
        write_summary(loose, KEY, SummaryCheckpoint(1, "s", WHEN, 1))
    warnings = [
        r.getMessage() for r in caplog.records if "writable by every user" in r.getMessage()
    ]
    assert len(warnings) == 1 and str(loose) in warnings[0]


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
STRANGER = 4242


@needs_root
@pytest.mark.parametrize("name", [f"{KEY}.lock", f"{KEY}.jsonl"])
def test_a_file_of_another_user_is_refused_even_in_their_root(tmp_path: Path, name: str) -> None:
    """A lock or journal of a third uid: Failed naming the uid, untouched; in their root too."""
    root, _, _ = written_store(tmp_path, "JournalStore")
    path = root / name
    if not path.exists():
        path.write_bytes(b"")
    os.chown(path, STRANGER, STRANGER)
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    session = Session(3)
    with CheckpointWriter(
        session.snapshot, JournalStore(root), exit_hooks=False, write_on_start=False
    ) as writer:
        error = error_of(writer.flush_sync())
        assert error is not None and f"{path} is owned by uid {STRANGER}" in error
        assert (path.read_bytes(), path.stat().st_mtime_ns) == before
        os.chown(root, STRANGER, STRANGER)  # their directory: still not this user's files
        error = error_of(writer.flush_sync())
        assert error is not None and f"{path} is owned by uid {STRANGER}" in error
        assert (path.read_bytes(), path.stat().st_mtime_ns) == before


@needs_root
def test_a_sessions_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    """sessions/ owned by a third uid: collapse writes nothing there and says whose it is."""
    root = tmp_path / "root"
    (root / "sessions").mkdir(parents=True)
    os.chown(root / "sessions", STRANGER, STRANGER)
    with pytest.raises(OSError, match=f"sessions is owned by uid {STRANGER}, not by"):
        write_summary(root, KEY, SummaryCheckpoint(1, "s", WHEN, 1))
    assert os.listdir(root / "sessions") == []


def test_reads_report_a_planted_fifo_without_waiting(tmp_path: Path) -> None:
    """A FIFO at the checkpoint, read by load and show --raw: an error at once, never a hang."""
    root = tmp_path / "root"
    root.mkdir()
    os.mkfifo(root / f"{KEY}.json")
    with pytest.raises(CheckpointError, match="is a FIFO"):
        load(FileStore(root), KEY)
    assert cli_main(["show", "--raw", str(root), KEY]) == 1


# -- reads are bounded ------------------------------------------------------------------

READERS: dict[str, str] = {  # a path that reads a checkpoint: the file it reads
    "load FileStore": f"{KEY}.json",
    "load JournalStore": f"{KEY}.jsonl",
    "load_summary": f"sessions/{KEY}/checkpoint.md",
    "ls": f"{KEY}.json",
    "show --raw": f"{KEY}.json",
    "verify": f"{KEY}.json",
    "writer FileStore": f"{KEY}.json",
    "writer JournalStore": f"{KEY}.jsonl",
}


def plant_sparse(root: Path, reader: str, size: int) -> Path:
    """A sparse file of ``size`` bytes where ``reader`` looks (it costs no disk)."""
    path = root / READERS[reader]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        f.truncate(size)
    return path


def read_outcome(reader: str, root: Path) -> str:
    """Run ``reader`` over ``root``: the error it reports, which it must report as a value."""
    if reader.startswith("writer"):
        make = FileStore if reader.endswith("FileStore") else JournalStore
        writer = CheckpointWriter(
            Session(2).snapshot, make(root), exit_hooks=False, write_on_start=False
        ).open()
        try:
            error = error_of(writer.flush_sync())
        finally:
            writer.close()
        assert error is not None
        return error
    if reader.startswith("load"):
        with pytest.raises(CheckpointError) as caught:
            if reader == "load_summary":
                load_summary(root, KEY)
            else:
                load((FileStore if reader.endswith("FileStore") else JournalStore)(root), KEY)
        return str(caught.value)
    args = {"ls": ["ls", str(root)], "show --raw": ["show", "--raw", str(root), KEY]}
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli_main(args.get(reader, [reader, str(root)]))
    assert status == 1, out.getvalue() + err.getvalue()
    return out.getvalue() + err.getvalue()


_LIMITED_CHILD = """
import json, resource, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from tests.stores.test_security import READERS, read_outcome
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[3]), int(sys.argv[3])))
print(json.dumps({reader: read_outcome(reader, Path(sys.argv[2]) / str(n))
                  for n, reader in enumerate(READERS)}))
"""


def test_a_memory_error_while_reading_is_an_error_naming_the_file(tmp_path: Path) -> None:
    """A 3 GiB file in a process limited to 1.5 GiB: each reader names path, size, MemoryError."""
    size, limit = 3 << 30, 3 << 29
    paths = [plant_sparse(tmp_path / str(n), reader, size) for n, reader in enumerate(READERS)]
    repo = str(ROOT)
    proc = subprocess.run(
        [sys.executable, "-c", _LIMITED_CHILD, repo, str(tmp_path), str(limit)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    said = json.loads(proc.stdout)
    for path, reader in zip(paths, READERS, strict=True):
        text = " ".join(said[reader].split())
        assert f"{path} is {size} bytes (3.0 GiB)" in text, (reader, text)
        assert "(MemoryError)" in text and "Traceback" not in text, (reader, text)


@pytest.fixture
def grow_after_fstat(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path], list[int]]:
    """Arm a file to grow by 64 MiB right after the library's first fstat of it.

    What another process writing into it (``ftruncate`` larger) does at the
    worst moment; returns the sizes fstat saw, filled in as it happens.
    """

    def arm(path: Path) -> list[int]:
        inode, real = os.stat(path).st_ino, os.fstat
        seen: list[int] = []

        def fstat(fd: int) -> os.stat_result:
            st = real(fd)
            if not seen and st.st_ino == inode:
                seen.append(st.st_size)
                os.truncate(path, st.st_size + (64 << 20))
            return st

        monkeypatch.setattr(os, "fstat", fstat)
        return seen

    return arm


@pytest.mark.parametrize("reader", ["load FileStore", "load_summary", "writer FileStore"])
def test_a_file_growing_while_read_is_an_error_naming_both_sizes(
    tmp_path: Path, grow_after_fstat: Callable[[Path], list[int]], reader: str
) -> None:
    """A snapshot or summary that grows while read: an error with both sizes; the rest unread."""
    if reader == "load_summary":
        root = tmp_path / "root"
        write_summary(root, KEY, SummaryCheckpoint(1, "the summary", WHEN, 1))
    else:
        root, _, _ = written_store(tmp_path, "FileStore")
    path = root / READERS[reader]
    seen = grow_after_fstat(path)
    text = " ".join(read_outcome(reader, root).split())
    (size,) = seen
    grown = size + (64 << 20)
    assert f"{path} grew while being read, from {size} bytes when opened to {grown} bytes" in text
    # Left as it is (the writer's close, reading it whole, moved it aside by name as corrupt).
    assert grown in [p.stat().st_size for p in path.parent.iterdir() if p.is_file()]


def test_a_journal_growing_while_read_loads_what_was_there(
    tmp_path: Path, grow_after_fstat: Callable[[Path], list[int]]
) -> None:
    """A journal read without its lock may see an append: load keeps what fstat saw."""
    root, _, name = written_store(tmp_path, "JournalStore")
    seen = grow_after_fstat(root / name)
    cp = load(JournalStore(root), KEY)
    assert seen and cp is not None and cp.state == Session(2).snapshot().state


@pytest.mark.parametrize("growing", [False, True])
def test_read_fd_reads_what_fstat_said_and_never_more(tmp_path: Path, growing: bool) -> None:
    """read_fd of a file past its fstat size: that many bytes (growing) or UnreadableFile."""
    path = tmp_path / "f"
    path.write_bytes(b"0123456789" * 2)
    fd = os.open(path, os.O_RDONLY)
    try:
        if growing:
            assert read_fd(fd, 10, str(path), growing=True) == b"0123456789"
            assert os.read(fd, 100) == b"0123456789"  # the rest was left unread
        else:
            with pytest.raises(UnreadableFile, match="from 10 bytes when opened to 20 bytes"):
                read_fd(fd, 10, str(path))
    finally:
        os.close(fd)


# -- whose files are trusted, and which roots are warned about ----------------------------


@needs_root
@pytest.mark.parametrize("place", ["shared", "theirs"])
def test_a_root_another_user_made_is_never_trusted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, place: str
) -> None:
    """uid 4242's root, in a sticky shared dir (a /tmp squat) or in a dir only root can write
    (their home): their forged state, summary and lock refused, untouched. Warned once."""
    parent = tmp_path / "place"
    parent.mkdir(mode=0o1777 if place == "shared" else 0o755)
    parent.chmod(0o1777 if place == "shared" else 0o755)
    root = parent / "ckpt"
    forged = Snapshot(KEY, {"messages": [{"role": "system", "content": "forged by uid 4242"}]})
    with CheckpointWriter(lambda: forged, FileStore(root), exit_hooks=False):
        pass
    write_summary(root, KEY, SummaryCheckpoint(1, "a forged summary", WHEN, 1))
    (root / f"{KEY}.lock").write_bytes(b"")
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [".", *dirnames, *filenames]:
            os.chown(os.path.join(dirpath, name), STRANGER, STRANGER)
    before = snapshot(root)
    with caplog.at_level(logging.WARNING, logger="checkpointer"):
        if place in ("shared", "theirs"):
            with pytest.raises(CheckpointError, match=f"is owned by uid {STRANGER}"):
                load(FileStore(root), KEY)
            with pytest.raises(CheckpointError, match=f"sessions is owned by uid {STRANGER}"):
                load_summary(root, KEY)
            writer = CheckpointWriter(
                Session(3).snapshot, FileStore(root), exit_hooks=False, write_on_start=False
            ).open()
            try:
                error = error_of(writer.flush_sync())
            finally:
                writer.close()
            assert error is not None and f"{KEY}.lock is owned by uid {STRANGER}" in error
            assert "may have planted it" in error
            assert snapshot(root) == before
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.getMessage().startswith(
            f"checkpointer: {root} is owned by uid {STRANGER}, not by this process"
        )
    ]
    assert len(warnings) == 1, caplog.records


ROOTS: dict[str, tuple[int, int | None, int | None, str | None]] = {
    # a root: mode, owner uid, group gid (None: this process's), what the warning says
    "0777": (0o777, None, None, "writable by every user without the sticky bit"),
    "1777": (0o1777, None, None, None),
    "2770 shared group": (0o2770, None, STRANGER, "writable by group gid 4242 without the"),
    "3770 shared group, sticky": (0o3770, None, STRANGER, None),
    "0770 this user's group": (0o770, None, None, "writable by group"),
    "0755 of another user": (0o755, STRANGER, None, f"owned by uid {STRANGER}, not by this"),
    "1777 of another user": (0o1777, STRANGER, None, f"owned by uid {STRANGER}, not by this"),
}


@needs_root
@pytest.mark.parametrize("case", ROOTS)
def test_a_root_others_can_change_is_warned_about_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    """One warning per process for a root another user owns, or a group or all can write."""
    mode, uid, gid, says = ROOTS[case]
    if gid == STRANGER:
        with contextlib.suppress(KeyError):
            said = _safefs._group(STRANGER)
            says = says and says.replace("gid 4242", said)
    root = tmp_path / "root"
    root.mkdir()
    os.chown(root, -1 if uid is None else uid, -1 if gid is None else gid)
    root.chmod(mode)
    with caplog.at_level(logging.WARNING, logger="checkpointer"):
        for _ in range(2):
            FileStore(root).open()
    warnings = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith(f"checkpointer: {root}")
    ]
    if says is None:
        assert warnings == []
    else:
        assert len(warnings) == 1 and says in warnings[0], warnings
        assert "give the store a directory of its own" in warnings[0]


# -- a lock file holds a holder or nothing -------------------------------------------------


def test_a_file_renamed_in_as_the_lock_is_not_overwritten(tmp_path: Path) -> None:
    """A file of this user with other bytes renamed in as k.lock: Failed naming it, bytes kept."""
    root, _, _ = written_store(tmp_path, "FileStore")
    settings, precious = (
        tmp_path / "settings.conf",
        b"precious settings; nobody else may write this\n",
    )
    settings.write_bytes(precious)
    os.utime(settings, ns=(OLD, OLD))
    lock = root / f"{KEY}.lock"
    os.rename(settings, lock)
    session = Session(3)
    writer = CheckpointWriter(
        session.snapshot, FileStore(root), exit_hooks=False, write_on_start=False
    ).open()
    try:
        error = error_of(writer.flush_sync())
        assert (
            error is not None
            and f"{lock} is a file of {len(precious)} bytes that hold no " in error
        )
        os.rename(lock, settings)
        assert settings.read_bytes() == precious
        assert settings.stat().st_mtime_ns == OLD
        assert isinstance(writer.flush_sync(), Written)
    finally:
        writer.close()
    check_recovered(tmp_path, "FileStore", session)


DEAD_HOLDER = b'{"pid":4194303,"host":"elsewhere","started_at":"2026-01-01T00:00:00Z"}'


@pytest.mark.parametrize(
    "content",
    [b"", b"\0" * 68, DEAD_HOLDER[:20], DEAD_HOLDER],
    ids=["empty", "nul", "torn", "dead"],
)
def test_a_lock_file_a_writer_left_behind_is_taken_over(tmp_path: Path, content: bytes) -> None:
    """Empty, NUL-filled or torn (a power cut) or a dead holder's: taken, and it names us."""
    root, _, _ = written_store(tmp_path, "FileStore")
    lock = root / f"{KEY}.lock"
    lock.write_bytes(content)
    held = FileStore(root).lock(KEY)
    try:
        assert json.loads(lock.read_bytes())["pid"] == os.getpid()
    finally:
        held.release()


# -- what open() cannot tell ---------------------------------------------------------------


@pytest.mark.parametrize("name", [f"{KEY}.json", f"{KEY}.jsonl", f"{KEY}.lock", "checkpoint.md"])
def test_a_device_that_says_enoent_is_named_not_taken_for_no_file(
    tmp_path: Path, name: str
) -> None:
    """A planted device whose open says ENOENT (ptmx outside devpts): refused by name, left."""
    root = tmp_path / "root"
    path = root / f"sessions/{KEY}/{name}" if name == "checkpoint.md" else root / name
    path.parent.mkdir(parents=True)
    try:
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(5, 2))
    except PermissionError:
        pytest.skip("mknod is not permitted here (needs CAP_MKNOD)")
    found = f"{path} is a character device"
    if name == "checkpoint.md":
        with pytest.raises(CheckpointError, match=found):
            load_summary(root, KEY)
    else:
        make = JournalStore if name.endswith(".jsonl") else FileStore
        if name != f"{KEY}.lock":
            with pytest.raises(CheckpointError, match=found):
                load(make(root), KEY)
        writer = CheckpointWriter(
            Session(2).snapshot, make(root), exit_hooks=False, write_on_start=False
        ).open()
        try:
            error = error_of(writer.flush_sync())
        finally:
            writer.close()
        assert error is not None and found in error
    assert stat.S_ISCHR(os.lstat(path).st_mode)


@pytest.mark.parametrize("call", ["write_summary", "load_summary"])
@pytest.mark.parametrize("swap", ["link", "removed", "file"])
def test_a_directory_swapped_while_opened_is_named_as_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swap: str, call: str
) -> None:
    """sessions/ swapped at the open (for a link and back, away, for a file): an error naming the
    whole path and what happened, never "a directory, not a directory" (load: gone is None)."""
    root = tmp_path / "root"
    write_summary(root, KEY, SummaryCheckpoint(1, "s", WHEN, 1))
    sessions, aside = root / "sessions", tmp_path / "aside"
    real_open = os.open
    swapped: list[str] = []

    def swapping_open(
        path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None
    ) -> int:
        if path != "sessions" or dir_fd is None or swapped:
            return real_open(path, flags, mode, dir_fd=dir_fd)
        swapped.append(swap)
        os.rename(sessions, aside)
        if swap == "link":
            sessions.symlink_to(aside)
        elif swap == "file":
            sessions.write_bytes(b"")
        try:
            return real_open(path, flags, mode, dir_fd=dir_fd)
        finally:
            if swap != "removed":
                sessions.unlink()
            if swap == "link":
                os.rename(aside, sessions)

    monkeypatch.setattr(os, "open", swapping_open)
    if call == "load_summary" and swap == "removed":
        assert load_summary(root, KEY) is None and swapped
        return
    with pytest.raises((OSError, CheckpointError), match="sessions") as caught:
        if call == "write_summary":
            write_summary(root, KEY, SummaryCheckpoint(2, "t", WHEN, 2))
        else:
            load_summary(root, KEY)
    assert isinstance(caught.value, CheckpointError) == (call == "load_summary")
    text = str(caught.value)
    assert swapped and str(sessions) in text, text
    assert "is a directory, not a directory" not in text
    expected = {
        "link": "not a directory when opened (a link or a file?) and a directory just after",
        "removed": "removed or renamed while being opened",
        "file": "Not a directory, then removed or renamed while being opened",
    }
    assert expected[swap] in text, text


# -- the command line looks at the entry, not its target ------------------------------------


def test_ls_and_show_report_a_planted_link_itself_not_its_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """ls --json and show over k.json -> a secret: the link's size and time, not the secret's."""
    monkeypatch.setattr(logging, "basicConfig", lambda **kw: None)
    secret = tmp_path / "secret"
    secret.write_bytes(b"x" * 123457)
    os.utime(secret, ns=(OLD, OLD))
    root = tmp_path / "root"
    root.mkdir()
    link = root / f"{KEY}.json"
    link.symlink_to(secret)
    assert cli_main(["ls", "--json", str(root)]) == 1  # listed, and not read
    (row,) = json.loads(capsys.readouterr().out)
    st = os.lstat(link)
    assert row["size"] == st.st_size != 123457
    assert row["mtime"] == datetime.fromtimestamp(st.st_mtime, UTC).isoformat().replace(
        "+00:00", "Z"
    )
    assert cli_main(["show", str(root), KEY]) == 1
    out = capsys.readouterr().out
    assert f"({st.st_size} B, snapshot)" in out and "120.6 KiB" not in out
