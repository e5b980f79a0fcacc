"""Encryption at rest, faults a crash or an operator leaves: recovered as plaintext is, and
a record that cannot be opened is never moved aside nor written over."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from checkpointer import CheckpointWriter, Failed, FileStore, Snapshot, Transcript, load
from checkpointer.stores import Encryption
from tests.stores import sealed_cases
from tests.stores.sealed_cases import SECRET, chat, enc, refused
from tests.stores.test_encryption_journal import JournalRig


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


@sealed_cases.WRONG
def test_a_writer_resumed_with_the_wrong_key_never_writes_over_the_file(
    tmp_path: Path, wrong: Callable[[], Encryption | None]
) -> None:
    """It knows the stored revision (resumed from a load with the right key) but holds not
    the key that sealed the file (another key under its id, or not its id, or none):
    told from the file's header at the conditional write, Failed, the file as it was."""
    sealed_cases.save(FileStore(tmp_path, encryption=enc()))
    before = (tmp_path / "s1.json").read_bytes()
    resumed = load(FileStore(tmp_path, encryption=enc()), "s1")
    box = {"n": 2}
    store = FileStore(tmp_path, encryption=wrong())
    with CheckpointWriter(
        lambda: Snapshot("s1", dict(box)), store, exit_hooks=False, resume_from=resumed
    ) as writer:
        box["n"] = 3
        result = writer.flush_sync()
    assert isinstance(result, Failed) and "DecryptionError" in result.error, result
    assert (tmp_path / "s1.json").read_bytes() == before
    assert not any(".corrupt-" in name for name in os.listdir(tmp_path))
