"""Encryption at rest on JournalStore: rows sealed one by one, bound to key and offset."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from checkpointer import CheckpointWriter, JournalStore, Snapshot, Transcript, load
from checkpointer.stores import Encryption
from tests.stores import sealed_cases
from tests.stores.sealed_cases import SECRET, enc, refused


class JournalRig:
    journal = True

    def __init__(self, root: Path) -> None:
        self.root = root

    def store(self, encryption: Encryption | None, **kw: Any) -> JournalStore:
        return JournalStore(self.root, encryption=encryption, **kw)

    def get(self, key: str) -> bytes:
        return (self.root / f"{key}.jsonl").read_bytes()

    def put(self, key: str, data: bytes) -> None:
        (self.root / f"{key}.jsonl").write_bytes(data)

    def copy(self, src: str, dst: str) -> None:
        self.put(dst, self.get(src))


def chat(store: JournalStore, turns: int, key: str = "s1") -> dict[str, list[dict[str, str]]]:
    """A session of ``turns`` messages, each checkpointed (an append each)."""
    state: dict[str, list[dict[str, str]]] = {"messages": []}
    with CheckpointWriter(
        lambda: Snapshot(key, state), store, exit_hooks=False, transcript=Transcript()
    ) as writer:
        for n in range(turns):
            state["messages"] = [*state["messages"], {"role": "user", "content": f"{SECRET} {n}"}]
            writer.flush_sync()
    return state


@pytest.mark.parametrize("case", sealed_cases.JOURNAL_CASES)
def test_tampering_is_refused(tmp_path: Path, case: Callable[[JournalRig], None]) -> None:
    """The cases every encrypted store refuses, on a journal file."""
    case(JournalRig(tmp_path))


@sealed_cases.WRONG
def test_a_writer_with_the_wrong_key_never_sets_the_journal_aside(
    tmp_path: Path, wrong: Callable[[], Encryption | None]
) -> None:
    """Not damage: the write fails, the journal stays as it was, nothing moved aside."""
    sealed_cases.wrong_key_writer(JournalRig(tmp_path), wrong)
    assert not any(".corrupt-" in name for name in os.listdir(tmp_path))


def test_appends_and_compactions_stay_sealed_and_load(tmp_path: Path) -> None:
    """Messages appended row by row, then compacted and rewritten: all sealed, all loads."""
    store = JournalRig(tmp_path).store(enc(), rewrite_factor=1.5, rewrite_min_bytes=0)
    state = chat(store, 12)
    stats = store.statistics()
    assert stats.appends > 0 and stats.rewrites > 1, stats
    data = (tmp_path / "s1.jsonl").read_bytes()
    assert SECRET.encode() not in data and b'"messages"' not in data
    assert all(line.startswith(b'{"sealed":"') for line in data.splitlines())
    loaded = load(JournalRig(tmp_path).store(enc()), "s1")
    assert loaded is not None and loaded.state == state


def test_a_cut_last_line_is_a_torn_tail_and_a_cut_inside_is_refused(tmp_path: Path) -> None:
    """The crash rule holds: a last line cut short is ignored (the checkpoint before it
    loads); a line cut short before it, or a row dropped, is refused."""
    rig = JournalRig(tmp_path)
    state = chat(rig.store(enc()), 4)
    data = rig.get("s1")
    lines = data.splitlines(keepends=True)
    rig.put("s1", data[:-7])
    loaded = load(rig.store(enc()), "s1")
    assert loaded is not None and loaded.torn is not None
    assert loaded.state["messages"] == state["messages"][: len(loaded.state["messages"])]
    rig.put("s1", b"".join([*lines[:2], lines[2][:-9] + b"\n", *lines[3:]]))
    assert refused(rig.store(enc())).why in ("truncated", "wrong-key")
    rig.put("s1", b"".join([*lines[:2], *lines[3:]]))
    assert refused(rig.store(enc())).why == "moved"


def test_rows_swapped_or_replayed_from_an_older_journal_are_refused(tmp_path: Path) -> None:
    """Two rows of one journal swapped, or a row of the key's journal before a rewrite put
    at its old offset in the new one: refused as moved."""
    rig = JournalRig(tmp_path)
    chat(rig.store(enc()), 3)
    old = rig.get("s1").splitlines(keepends=True)
    rig.put("s1", b"".join([old[0], old[2], old[1], *old[3:]]))
    assert refused(rig.store(enc())).why == "moved"
    rig.put("s1", b"".join(old))
    chat(rig.store(enc(), rewrite_factor=1.01, rewrite_min_bytes=0), 3)  # rewritten fresh
    new = rig.get("s1").splitlines(keepends=True)
    assert new[0] != old[0]
    rig.put("s1", b"".join([new[0], old[1], *new[2:]]))
    assert refused(rig.store(enc())).why == "moved"


def test_a_writer_cuts_a_torn_tail_and_appends_sealed(tmp_path: Path) -> None:
    """A crashed append's bytes are cut by the next writer, whose rows then load."""
    rig = JournalRig(tmp_path)
    chat(rig.store(enc()), 2)
    rig.put("s1", rig.get("s1") + b'{"sealed":"AAAA')
    state = chat(rig.store(enc()), 3)
    loaded = load(rig.store(enc()), "s1")
    assert loaded is not None and loaded.torn is None and loaded.state == state


def test_a_power_cut_hole_in_the_last_batch_is_a_torn_tail_as_in_plaintext(
    tmp_path: Path,
) -> None:
    """NUL bytes over the first row of the last batch (message, message, meta), the rest of
    it on disk: the checkpoint before loads, the writer carries on in place; under a key of
    the same id but other bytes the rows after the hole do not open: refused, never set aside."""
    rig = JournalRig(tmp_path)
    box: dict[str, list[dict[str, str]]] = {"messages": []}
    with CheckpointWriter(
        lambda: Snapshot("s1", box), rig.store(enc()), exit_hooks=False, transcript=Transcript()
    ) as writer:
        for turn in range(3):
            state = {"messages": list(box["messages"])}
            box["messages"] = [
                *box["messages"],
                *({"role": "user", "content": f"{SECRET} {turn}{c}"} for c in "ab"),
            ]
            writer.flush_sync()
        lines = rig.get("s1").split(b"\n")  # [..., message, message, meta, b""] at the cut
    lines[-4] = b"\0" * len(lines[-4])
    rig.put("s1", b"\n".join(lines))
    loaded = load(rig.store(enc()), "s1")
    assert loaded is not None and loaded.torn is not None and loaded.state == state
    assert refused(rig.store(enc(fill=9))).why == "wrong-key"
    chat(rig.store(enc(fill=9)), 5)
    assert os.listdir(tmp_path) == ["s1.jsonl"]
    chat(rig.store(enc()), 5)
    assert os.listdir(tmp_path) == ["s1.jsonl"]
