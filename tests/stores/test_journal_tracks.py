"""A ``JournalStore`` object's memory of a journal (its track) never stands in for the file.

A store whose append failed (a full disk: ``RLIMIT_FSIZE`` here, a real
``EFBIG``) must still see another process's checkpoint before it writes; a
store that only reads never moves a journal aside, whatever it finds.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from checkpointer import (
    CheckpointError,
    CheckpointWriter,
    JournalStore,
    NewerVersionError,
    Snapshot,
    Written,
    load,
)

# One long-lived store object: two turns, a third that fails (the file may not grow), the
# close's write failing too; then, once the other process wrote, a writer resumed from the
# load() taken before it ("stale") or after it ("fresh").
_HOLDER = """
import resource, sys
from checkpointer import CheckpointWriter, JournalStore, Snapshot, load
root, mode = sys.argv[1:]
store = JournalStore(root)
messages = []
with CheckpointWriter(lambda: Snapshot("k", {"messages": messages}), store, exit_hooks=False) as w:
    for text in ("A0", "A1"):
        messages.append(text)
        assert type(w.flush_sync("manual")).__name__ == "Written"
    before = load(store, "k")
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, limits[1]))
    messages.append("A2")
    assert type(w.flush_sync("manual")).__name__ == "Failed"
resource.setrlimit(resource.RLIMIT_FSIZE, limits)
print("ready", flush=True)
sys.stdin.readline()
resume = before if mode == "stale" else load(store, "k")
mine = list(resume.state["messages"])
with CheckpointWriter(lambda: Snapshot("k", {"messages": mine}), store, resume_from=resume,
                      exit_hooks=False) as w:
    mine.append("A3")
    print(type(w.flush_sync("manual")).__name__, flush=True)
"""

_OTHER = """
import sys
from checkpointer import CheckpointWriter, JournalStore, Snapshot, load
store = JournalStore(sys.argv[1])
cp = load(store, "k")
messages = list(cp.state["messages"])
with CheckpointWriter(lambda: Snapshot("k", {"messages": messages}), store, resume_from=cp,
                      exit_hooks=False) as w:
    for text in ("B0", "B1"):
        messages.append(text)
        assert type(w.flush_sync("manual")).__name__ == "Written"
"""


def _python(script: str, *args: str) -> list[str]:
    return [sys.executable, "-c", script, *args]


@pytest.mark.parametrize("mode", ["stale", "fresh"])
def test_a_failed_append_never_hides_another_process_write(tmp_path: Path, mode: str) -> None:
    """After its append failed, a store still compares the revision the file holds now:
    a writer resumed from before the other process wrote is a conflict; from after, Written
    (by a rewrite: the file whose append failed is never appended to again)."""
    holder = subprocess.Popen(
        _python(_HOLDER, str(tmp_path), mode),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert holder.stdin is not None and holder.stdout is not None
    assert holder.stdout.readline() == "ready\n", holder.communicate()[1]
    other = subprocess.run(_python(_OTHER, str(tmp_path)), capture_output=True, text=True)
    assert other.returncode == 0, other.stderr
    inode = (tmp_path / "k.jsonl").stat().st_ino
    out, err = holder.communicate("go\n", timeout=60)
    assert holder.returncode == 0, err
    stored = load(JournalStore(tmp_path), "k")
    assert stored is not None
    if mode == "stale":
        assert out == "Failed\n"
        assert stored.state["messages"] == ["A0", "A1", "B0", "B1"]
    else:
        assert out == "Written\n"
        # Its append failed in this file: it rewrites it, never fsyncs it again.
        assert (tmp_path / "k.jsonl").stat().st_ino != inode
        assert stored.state["messages"] == ["A0", "A1", "B0", "B1", "A3"]


def _journal(root: Path) -> JournalStore:
    """A store that wrote ``k`` (three turns), and a reader that then looked at it."""
    messages: list[str] = []
    with CheckpointWriter(
        lambda: Snapshot("k", {"messages": messages}), JournalStore(root), exit_hooks=False
    ) as w:
        for text in ("0", "1", "2"):
            messages.append(text)
            w.flush_sync("manual")
    reader = JournalStore(root)
    assert reader.revision("k") is not None
    return reader


def _replaced(path: Path, data: bytes) -> None:
    """``path`` replaced with ``data`` by rename, as another process writes it."""
    path.with_suffix(".new").write_bytes(data)
    os.replace(path.with_suffix(".new"), path)


def test_a_reader_raises_a_newer_journal_and_keeps_it(tmp_path: Path) -> None:
    """A newer version's journal is NewerVersionError to every read, and left where it is."""
    reader = _journal(tmp_path)
    path = tmp_path / "k.jsonl"
    newer = path.read_bytes().replace(b'"format":1', b'"format":2', 1)
    _replaced(path, newer)
    for read in (reader.revision, reader.read_meta, reader.read_checkpoint):
        with pytest.raises(NewerVersionError):
            read("k")
    assert list(tmp_path.glob("k.*")) == [path]
    assert path.read_bytes() == newer


def test_a_reader_reports_a_damaged_journal_and_a_writer_moves_it_aside(tmp_path: Path) -> None:
    """A damaged journal is a CheckpointError to a read, which keeps it; a writer on the same
    store object starting afresh moves it aside and writes."""
    reader = _journal(tmp_path)
    path = tmp_path / "k.jsonl"
    _replaced(path, b"garbage\n")
    for read in (reader.revision, reader.read_meta, reader.read_checkpoint):
        with pytest.raises(CheckpointError):
            read("k")
    assert path.read_bytes() == b"garbage\n"
    messages: list[str] = []
    with CheckpointWriter(
        lambda: Snapshot("k", {"messages": messages}), reader, resume_from=None, exit_hooks=False
    ) as w:
        messages.append("new")
        assert isinstance(w.flush_sync("manual"), Written)
    assert [p.name for p in tmp_path.glob("k.corrupt-*")] != []
    assert load(JournalStore(tmp_path), "k").state == {"messages": ["new"]}  # type: ignore[union-attr]
