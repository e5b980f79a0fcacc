"""The tampering cases every encrypted store must refuse, over a ``Rig`` of raw access.

Each store's test module gives a rig (its stores, and its raw records read and
written behind the store's back) and runs these cases.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import pytest

from checkpointer import CheckpointWriter, Failed, Snapshot, load
from checkpointer.stores import DecryptionError, Encryption

SECRET = "my password is hunter2"
STATE = {"messages": [{"role": "user", "content": SECRET}], "title": "Quarterly numbers"}


class Rig(Protocol):
    def store(self, encryption: Encryption | None) -> Any: ...
    def get(self, key: str) -> bytes: ...  # the record as stored
    def put(self, key: str, data: bytes) -> None: ...  # its revision marker left as it is
    def copy(self, src: str, dst: str) -> None: ...  # record and revision marker both


def enc(key_id: str = "k1", fill: int = 1, **kw: Any) -> Encryption:
    return Encryption(bytes([fill]) * 32, key_id=key_id, **kw)


def save(store: Any, key: str = "s1", state: object = STATE) -> None:
    with CheckpointWriter(lambda: Snapshot(key, state), store, exit_hooks=False):
        pass  # written on open, and at close
    assert store.revision(key) is not None


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


WRONG = pytest.mark.parametrize(
    "wrong",
    [lambda: enc("k1", 9), lambda: enc("k2", 9), lambda: None],
    ids=["same-id-other-key", "unknown-id", "no-encryption"],
)
CASES = [no_plaintext, flipped, swapped, planted, truncated]
JOURNAL_CASES = [no_plaintext, flipped, swapped, planted]  # a cut at the end is a torn tail
