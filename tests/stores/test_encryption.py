"""Encryption at rest on FileStore: sealed files, tampering refused by name, never set aside."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from checkpointer import (
    CheckpointError,
    CheckpointWriter,
    Failed,
    FileStore,
    JournalStore,
    Snapshot,
    load,
)
from checkpointer.stores import DecryptionError, Encryption, StaleWrite
from tests.stores import sealed_cases

SECRET = "my password is hunter2"
STATE = {"messages": [{"role": "user", "content": SECRET}], "title": "Quarterly numbers"}


def enc(key_id: str = "k1", fill: int = 1, **kw: Any) -> Encryption:
    return Encryption(bytes([fill]) * 32, key_id=key_id, **kw)


def save(store: FileStore, key: str = "s1", state: object = STATE) -> None:
    with CheckpointWriter(lambda: Snapshot(key, state), store, exit_hooks=False):
        pass  # written on open, and at close
    assert store.revision(key) is not None


def refused(store: FileStore, key: str = "s1") -> DecryptionError:
    with pytest.raises(DecryptionError) as info:
        load(store, key)
    return info.value


@pytest.mark.parametrize("algorithm", ["aes-256-gcm", "chacha20-poly1305"])
def test_a_sealed_file_loads_with_its_key_and_holds_no_plaintext(
    tmp_path: Path, algorithm: Any
) -> None:
    """What the user wrote is nowhere in the file; the state and meta load back whole."""
    store = FileStore(tmp_path, encryption=enc(algorithm=algorithm))
    save(store)
    data = (tmp_path / "s1.json").read_bytes()
    assert SECRET.encode() not in data and b"Quarterly" not in data
    loaded = load(store, "s1")
    assert loaded is not None and loaded.state == STATE and loaded.meta.seq == 2


class FileRig:
    def __init__(self, root: Path) -> None:
        self.root = root

    def store(self, encryption: Encryption | None) -> FileStore:
        return FileStore(self.root, encryption=encryption)

    def get(self, key: str) -> bytes:
        return (self.root / f"{key}.json").read_bytes()

    def put(self, key: str, data: bytes) -> None:
        (self.root / f"{key}.json").write_bytes(data)

    def copy(self, src: str, dst: str) -> None:
        self.put(dst, self.get(src))


@pytest.mark.parametrize("case", sealed_cases.CASES)
def test_tampering_is_refused(tmp_path: Path, case: Callable[[FileRig], None]) -> None:
    """The cases every encrypted store refuses (tests/stores/sealed_cases.py), on files."""
    case(FileRig(tmp_path))


def test_the_revision_and_meta_read_without_the_key(tmp_path: Path) -> None:
    """revision() needs no key; load without one says encrypted, with its id and readable meta."""
    store = FileStore(tmp_path, encryption=enc())
    save(store)
    sealed = load(store, "s1")
    assert sealed is not None
    bare = FileStore(tmp_path)
    assert bare.revision("s1") == sealed.meta.revision
    error = refused(bare)
    assert (error.why, error.key_id, error.key) == ("no-key", "k1", "s1")
    assert error.meta is not None and error.meta.seq == 2
    assert "encrypted (key id 'k1')" in str(error)


def test_a_flipped_byte_is_refused_naming_key_position_and_key_id(tmp_path: Path) -> None:
    """One bit changed in the ciphertext, or in the readable meta, and nothing loads."""
    store = FileStore(tmp_path, encryption=enc())
    save(store)
    path = tmp_path / "s1.json"
    good = path.read_bytes()
    revision = store.revision("s1")
    for at in (len(good) - 40, good.index(b'"seq":') + 6):
        path.write_bytes(good[:at] + bytes([good[at] ^ 1]) + good[at + 1 :])
        error = refused(store)
        assert error.why == "wrong-key", error
        assert (error.key, error.position, error.key_id) == ("s1", revision, "k1")
        assert f"key 's1' at position {revision}" in str(error) and "'k1'" in str(error)


def test_a_file_swapped_between_two_keys_is_refused_as_moved(tmp_path: Path) -> None:
    """b's file copied over a's (revision line and all) says where it was sealed for."""
    store = FileStore(tmp_path, encryption=enc())
    save(store, "a", {"n": 1})
    save(store, "b", {"n": 2})
    (tmp_path / "a.json").write_bytes((tmp_path / "b.json").read_bytes())
    error = refused(store, "a")
    assert error.why == "moved" and "sealed for key 'b'" in str(error)


def test_a_revision_line_rewritten_is_refused_as_moved(tmp_path: Path) -> None:
    """A record replayed at another revision of its own key does not open either."""
    store = FileStore(tmp_path, encryption=enc())
    save(store)
    path = tmp_path / "s1.json"
    revision = store.revision("s1")
    assert revision is not None
    path.write_bytes(path.read_bytes().replace(revision.encode(), b"0123456789abcdef", 1))
    assert refused(store).why == "moved"


def test_a_planted_plaintext_file_is_refused(tmp_path: Path) -> None:
    """A plaintext checkpoint where a sealed one belongs does not load."""
    save(FileStore(tmp_path))
    error = refused(FileStore(tmp_path, encryption=enc()))
    assert error.why == "plaintext" and error.key_id is None


@pytest.mark.parametrize("cut", [1, 17, 200])
def test_a_truncated_file_is_refused_as_truncated(tmp_path: Path, cut: int) -> None:
    """A file cut short anywhere says so, in its body or its header."""
    store = FileStore(tmp_path, encryption=enc())
    save(store)
    path = tmp_path / "s1.json"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - cut] if cut < 200 else data[:cut])
    assert refused(store).why == "truncated"


def test_old_keys_open_and_an_unknown_key_id_is_named(tmp_path: Path) -> None:
    """A rotated store reads what the old key sealed; a missing key is named by its id."""
    save(FileStore(tmp_path, encryption=enc("old", 1)))
    rotated = FileStore(tmp_path, encryption=enc("new", 2, old_keys={"old": bytes([1]) * 32}))
    loaded = load(rotated, "s1")
    assert loaded is not None and loaded.state == STATE
    error = refused(FileStore(tmp_path, encryption=enc("new", 2)))
    assert error.why == "no-key" and error.key_id == "old" and "'old'" in str(error)


@pytest.mark.parametrize(
    "wrong",
    [lambda: enc("k1", 9), lambda: enc("k2", 9), lambda: None],
    ids=["same-id-other-key", "unknown-id", "no-encryption"],
)
def test_a_writer_with_the_wrong_key_never_sets_the_file_aside(
    tmp_path: Path, wrong: Callable[[], Encryption | None]
) -> None:
    """Not damage: the write fails, the sealed file stays as it was, nothing moved aside."""
    save(FileStore(tmp_path, encryption=enc()))
    before = sorted(os.listdir(tmp_path)), (tmp_path / "s1.json").read_bytes()
    store = FileStore(tmp_path, encryption=wrong())
    box = {"n": 2}
    with CheckpointWriter(lambda: Snapshot("s1", dict(box)), store, exit_hooks=False) as writer:
        box["n"] = 3
        result = writer.flush_sync()
    assert isinstance(result, Failed) and result.reason == "write-failed", result
    assert "s1" in result.error
    assert (sorted(os.listdir(tmp_path)), (tmp_path / "s1.json").read_bytes()) == before


def test_a_damaged_plaintext_file_is_still_set_aside(tmp_path: Path) -> None:
    """The fresh start keeps its meaning for real damage (the contrast of the test above)."""
    (tmp_path / "s1.json").write_bytes(b'{"format":1,"meta":')
    save(FileStore(tmp_path))
    assert any(".corrupt-" in name for name in os.listdir(tmp_path))


def test_the_conditional_write_works_on_sealed_files(tmp_path: Path) -> None:
    """A stale write is refused by revision, without the store opening anything."""
    store = FileStore(tmp_path, encryption=enc())
    save(store)
    stored = store.revision("s1")
    with pytest.raises(StaleWrite):
        store.write("s1", [b"{}"], revision="r2", expected="not-it")
    store.write("s1", [b"{}"], revision="r2", expected=stored)
    assert FileStore(tmp_path).revision("s1") == "r2"
    assert store.read("s1") == b"{}"


@pytest.mark.parametrize(
    "text",
    ["", "k1", "k1:bm90MzI=", "bad id:" + "A" * 44, "k1:!!!"],
)
def test_bad_key_text_is_refused(text: str) -> None:
    """A key file's or the environment's keys must each be id:base64 of 32 bytes."""
    with pytest.raises(ValueError, match=r"key|id"):
        Encryption.from_text(text)


def test_key_text_puts_the_current_key_first() -> None:
    """The first key seals; the others only open; repr shows ids, never a key."""
    text = f"# keys\n{Encryption.new_key('new')}\n{Encryption.new_key('old')}"
    keys = Encryption.from_text(text)
    assert keys.key_id == "new" and "old" in repr(keys) and text.split(":")[1][:8] not in repr(keys)


def test_the_core_never_imports_cryptography() -> None:
    """Without an Encryption, importing and using the library leaves cryptography unloaded."""
    code = (
        "import sys, tempfile, checkpointer, checkpointer.stores\n"
        "from checkpointer import FileStore, JournalStore, load\n"
        "FileStore(tempfile.mkdtemp()).write('k', [b'x'], revision='r', expected=None)\n"
        "assert 'cryptography' not in sys.modules, 'imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_no_summary_is_written_in_plaintext_beside_sealed_files(tmp_path: Path) -> None:
    """write_summary refuses an encrypted FileStore: a title is what a user wrote."""
    from datetime import UTC, datetime

    from checkpointer.summaries import SummaryCheckpoint, write_summary

    summary = SummaryCheckpoint(
        watermark=1, summary=SECRET, created_at=datetime.now(UTC), covered_messages=1
    )
    with pytest.raises(ValueError, match="summary checkpoints are not"):
        write_summary(FileStore(tmp_path, encryption=enc()), "s1", summary)
    assert not (tmp_path / "sessions").exists()


def test_key_text_never_says_a_key() -> None:
    """A bare key (no ``id:``), or a key with a bad id: refused without echoing it."""
    secret = Encryption.new_key("k1").partition(":")[2]
    for text in (secret, f"{Encryption.new_key('ok')}\n{secret}", f"bad/id:{secret}"):
        with pytest.raises(ValueError, match="id:base64") as info:
            Encryption.from_text(text)
        assert secret not in str(info.value) and secret[:8] not in str(info.value)


@pytest.mark.parametrize("ids", [("prod", "prod"), ("new", "old", "old")])
def test_an_id_given_to_two_keys_is_refused_naming_it(ids: tuple[str, ...]) -> None:
    """Two keys under one id: one would be dropped and what it sealed not open."""
    text = "\n".join(Encryption.new_key(kid) for kid in ids)
    with pytest.raises(ValueError, match=f"key id {ids[-1]!r} is given twice"):
        Encryption.from_text(text)
    with pytest.raises(ValueError, match="given twice"):
        Encryption(b"\1" * 32, key_id="k1", old_keys={"k1": b"\2" * 32})


def test_an_encryption_pickles_for_a_spawned_process(tmp_path: Path) -> None:
    """Its keys and algorithm go through pickle (a spawn or forkserver pool's way); its
    ciphers are made anew there, and what it seals opens with the original."""
    import multiprocessing
    import pickle

    keys = enc(algorithm="chacha20-poly1305", old_keys={"k0": b"\2" * 32})
    save(FileStore(tmp_path, encryption=keys))
    copy = pickle.loads(pickle.dumps(keys))
    assert repr(copy) == repr(keys)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        pool.apply(save, (FileStore(tmp_path, encryption=copy), "s2"))
    for key in ("s1", "s2"):
        loaded = load(FileStore(tmp_path, encryption=keys), key)
        assert loaded is not None and loaded.state == STATE


def test_an_edited_algorithm_is_not_said_a_missing_key(tmp_path: Path) -> None:
    """The header names an algorithm nobody knows: said so, not "no key k1" beside "has k1"."""
    store = FileStore(tmp_path, encryption=enc())
    save(store)
    path = tmp_path / "s1.json"
    path.write_bytes(path.read_bytes().replace(b'"alg":"aes-256-gcm"', b'"alg":"aes-256-gcn"'))
    error = refused(store)
    assert "'aes-256-gcn'" in str(error) and "does not have" not in str(error)


def test_an_empty_file_is_damage_a_writer_sets_aside(tmp_path: Path) -> None:
    """Nothing sealed is in it: moved aside like a damaged plaintext file, never a key
    blocked for good."""
    (tmp_path / "s1.json").write_bytes(b"")
    store = FileStore(tmp_path, encryption=enc())
    with pytest.raises(CheckpointError, match="empty") as info:
        load(store, "s1")
    assert not isinstance(info.value, DecryptionError)
    save(store)
    assert any(".corrupt-" in name for name in os.listdir(tmp_path))
    loaded = load(store, "s1")
    assert loaded is not None and loaded.state == STATE


@pytest.mark.parametrize(
    ("store", "given"),
    [(FileStore, "store"), (FileStore, "directory"), (JournalStore, "directory")],
)
def test_collapse_writes_no_summary_beside_sealed_files(
    tmp_path: Path, store: type[FileStore] | type[JournalStore], given: str
) -> None:
    """Given the store or its directory, collapse returns SummaryFailed and writes nothing:
    the directory's checkpoint of that key is sealed."""
    import anyio

    from checkpointer.summaries import SummaryFailed, collapse

    sealed = store(tmp_path, encryption=enc())
    save(sealed)
    messages = [{"role": "user", "content": f"{SECRET} {n}"} for n in range(30)]
    root = sealed if given == "store" else tmp_path
    result = anyio.run(collapse, lambda m: m[0]["content"], root, "s1", messages)
    assert isinstance(result, SummaryFailed) and "encrypted" in result.error, result
    assert not (tmp_path / "sessions").exists()
