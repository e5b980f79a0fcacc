"""The tampering cases every encrypted store must refuse, over a ``Rig`` of raw access.

Each store's test module gives a rig (its stores, and its raw records read and
written behind the store's back) and runs these cases.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import msgspec
import pytest

from checkpointer import CheckpointWriter, Failed, Snapshot, Transcript, load
from checkpointer._stores.base import new_revision
from checkpointer.stores import DecryptionError, Encryption

SECRET = "my password is hunter2"
STATE = {"messages": [{"role": "user", "content": SECRET}], "title": "Quarterly numbers"}


class Rig(Protocol):
    def store(self, encryption: Encryption | None) -> Any: ...
    def get(self, key: str) -> bytes: ...  # the record as stored
    def put(self, key: str, data: bytes) -> None: ...  # its revision marker left as it is
    def copy(self, src: str, dst: str) -> None: ...  # record and revision marker both


class RowsRig(Rig, Protocol):
    """A journal kept under a head (S3, PostgreSQL): its rows read and written raw."""

    def store(self, encryption: Encryption | None, **kw: Any) -> Any: ...
    def rows(self, key: str) -> list[bytes]: ...  # as stored, each with its row end
    def set_rows(self, key: str, rows: list[bytes]) -> None: ...  # the head left as it is


def enc(key_id: str = "k1", fill: int = 1, **kw: Any) -> Encryption:
    return Encryption(bytes([fill]) * 32, key_id=key_id, **kw)


def save(store: Any, key: str = "s1", state: object = STATE) -> None:
    with CheckpointWriter(lambda: Snapshot(key, state), store, exit_hooks=False):
        pass  # written on open, and at close
    assert store.revision(key) is not None


def chat(store: Any, turns: int, key: str = "s1") -> dict[str, list[dict[str, str]]]:
    """A session of ``turns`` messages, each checkpointed (an append each)."""
    state: dict[str, list[dict[str, str]]] = {"messages": []}
    with CheckpointWriter(
        lambda: Snapshot(key, state), store, exit_hooks=False, transcript=Transcript()
    ) as writer:
        for n in range(turns):
            state["messages"] = [*state["messages"], {"role": "user", "content": f"{SECRET} {n}"}]
            writer.flush_sync()
    return state


def refused(store: Any, key: str = "s1") -> DecryptionError:
    with pytest.raises(DecryptionError) as info:
        load(store, key)
    return info.value


def no_plaintext(rig: Rig) -> None:
    """What the user wrote is nowhere in the record; it loads back whole with its key."""
    store = rig.store(enc())
    save(store)
    data = rig.get("s1")
    assert SECRET.encode() not in data and b"Quarterly" not in data
    loaded = load(store, "s1")
    assert loaded is not None and loaded.state == STATE


def flipped(rig: Rig) -> None:
    """One bit of the ciphertext changed: refused, naming key, position and key id."""
    store = rig.store(enc())
    save(store)
    data = rig.get("s1")
    other = b"A" if data[-40:-39] != b"A" else b"B"  # a journal's base64 stays base64
    rig.put("s1", data[:-40] + other + data[-39:])
    error = refused(store)
    assert (error.why, error.key, error.key_id) == ("wrong-key", "s1", "k1")
    assert error.position in str(error)
    if not getattr(rig, "journal", False):  # a journal row's position is its offset
        assert error.position == store.revision("s1")


def swapped(rig: Rig) -> None:
    """b's record put at a: refused as moved, saying where it was sealed for."""
    store = rig.store(enc())
    save(store, "a", {"n": 1})
    save(store, "b", {"n": 2})
    rig.copy("b", "a")
    error = refused(store, "a")
    assert error.why == "moved" and "sealed for key 'b'" in str(error)


def planted(rig: Rig) -> None:
    """A plaintext record where a sealed one belongs does not load."""
    save(rig.store(None))
    assert refused(rig.store(enc())).why == "plaintext"


def truncated(rig: Rig) -> None:
    """A record cut short says so."""
    store = rig.store(enc())
    save(store)
    rig.put("s1", rig.get("s1")[:-5])
    assert refused(store).why == "truncated"


def wrong_key_writer(rig: Rig, wrong: Callable[[], Encryption | None]) -> None:
    """Not damage: the write fails, the record stays as it was (never moved aside)."""
    save(rig.store(enc()))
    before = rig.get("s1")
    box = {"n": 2}
    store = rig.store(wrong())
    with CheckpointWriter(lambda: Snapshot("s1", dict(box)), store, exit_hooks=False) as writer:
        box["n"] = 3
        result = writer.flush_sync()
    assert isinstance(result, Failed) and result.reason == "write-failed", result
    assert rig.get("s1") == before
    loaded = load(rig.store(enc()), "s1")
    assert loaded is not None and loaded.state == STATE


def wrong_key_overwrite(rig: Rig, wrong: Callable[[], Encryption | None]) -> None:
    """Refused by the write itself, whatever told the writer what is stored: a writer
    resumed from a load made with the right key (a fleet's worker with a stale key config)
    fails naming the key id, and so do a write and a meta update expecting the stored
    revision; the record still opens with its key, at the revision it had."""
    save(rig.store(enc()))
    before, right = rig.get("s1"), rig.store(enc())
    resumed, data = load(right, "s1"), right.read("s1")  # its own form, which write() takes
    assert resumed is not None and data is not None
    store, box = rig.store(wrong()), {"n": 2}
    with CheckpointWriter(
        lambda: Snapshot("s1", dict(box)), store, exit_hooks=False, resume_from=resumed
    ) as writer:
        box["n"] = 3
        result = writer.flush_sync()
    assert isinstance(result, Failed) and result.reason == "write-failed", result
    assert "'k1'" in result.error, result
    stored = resumed.meta.revision
    meta = msgspec.structs.replace(resumed.meta, revision=new_revision())
    calls: list[Callable[[], object]] = [
        lambda: store.write("s1", [data], revision=new_revision(), expected=stored)
    ]
    if hasattr(store, "update_meta"):
        calls.append(lambda: store.update_meta("s1", meta, expected=stored))
    for call in calls:
        with pytest.raises(DecryptionError) as info:
            call()
        assert info.value.key_id == "k1", info.value
    assert rig.get("s1") == before and right.revision("s1") == resumed.meta.revision
    loaded = load(rig.store(enc()), "s1")
    assert loaded is not None and loaded.state == STATE


WRONG = pytest.mark.parametrize(
    "wrong",
    [lambda: enc("k1", 9), lambda: enc("k2", 9), lambda: None],
    ids=["same-id-other-key", "unknown-id", "no-encryption"],
)
CASES = [no_plaintext, flipped, swapped, planted, truncated]
JOURNAL_CASES = [no_plaintext, flipped, swapped, planted]  # a cut at the end is a torn tail


def appended_and_compacted(rig: RowsRig) -> None:
    """Messages appended row by row, then compacted: every row sealed, all of it loads."""
    store = rig.store(enc(), rewrite_factor=1.5, rewrite_min_bytes=0)
    state = chat(store, 12)
    assert store.appends > 0 and store.compactions > 1, (store.appends, store.compactions)
    rows = rig.rows("s1")
    assert len(rows) > 1 and all(row.startswith(b'{"sealed":"') for row in rows), rows
    assert not any(SECRET.encode() in row for row in rows)
    loaded = load(rig.store(enc()), "s1")
    assert loaded is not None and loaded.state == state


def rows_reordered(rig: RowsRig) -> None:
    """Two rows of the key swapped: refused as moved."""
    chat(rig.store(enc()), 3)
    rows = rig.rows("s1")
    rig.set_rows("s1", [rows[0], rows[2], rows[1], *rows[3:]])
    assert refused(rig.store(enc())).why == "moved"


def row_dropped_inside(rig: RowsRig) -> None:
    """A row taken out between two others: the rows after it are refused as moved."""
    chat(rig.store(enc()), 3)
    rows = rig.rows("s1")
    rig.set_rows("s1", [rows[0], *rows[2:]])
    assert refused(rig.store(enc())).why == "moved"


def last_row_dropped(rig: RowsRig) -> None:
    """The last row taken out (an earlier checkpoint's rows under the head): truncated."""
    chat(rig.store(enc()), 3)
    rig.set_rows("s1", rig.rows("s1")[:-1])
    error = refused(rig.store(enc()))
    assert error.why == "truncated" and "dropped" in str(error), error


def replayed_compaction(rig: RowsRig) -> None:
    """The key's rows put back as they were before its last compaction: refused."""
    store = rig.store(enc(), rewrite_factor=1.01, rewrite_min_bytes=0)
    chat(store, 2)
    old = rig.rows("s1")
    chat(store, 3)  # compacted again: a new first row
    assert rig.rows("s1")[0] != old[0]
    rig.set_rows("s1", old)
    assert refused(rig.store(enc())).why == "truncated"


def fenced(rig: RowsRig) -> None:
    """Fencing as without encryption: a writer resumed from a checkpoint another writer
    has since replaced gets a conflict, and what the other wrote loads."""
    state = chat(rig.store(enc()), 2)
    stale = load(rig.store(enc()), "s1")
    newer = chat(rig.store(enc()), 3)
    mine = {"messages": [*state["messages"], {"role": "user", "content": "late"}]}
    with CheckpointWriter(
        lambda: Snapshot("s1", mine), rig.store(enc()), exit_hooks=False, resume_from=stale
    ) as writer:
        result = writer.flush_sync()
    assert isinstance(result, Failed) and result.reason == "conflict", result
    loaded = load(rig.store(enc()), "s1")
    assert loaded is not None and loaded.state == newer


HEADED_JOURNAL_CASES = [
    fenced,
    appended_and_compacted,
    rows_reordered,
    row_dropped_inside,
    last_row_dropped,
    replayed_compaction,
]
