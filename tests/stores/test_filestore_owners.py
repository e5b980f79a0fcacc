"""FileStore under the ownership contract: a store of the user's own over it, a delete
through the writer's own store object, and stores (a Store, a StateStore) written for the
API before revisions."""

from __future__ import annotations

import functools
import inspect
import os
import threading
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from checkpointer import (
    CheckpointWriter,
    Failed,
    FileStore,
    JournalStore,
    Meta,
    Snapshot,
    Written,
    load,
)
from checkpointer._stores import atomic, files
from checkpointer.stores import KeyLock, check_key, unfenced


class Compressed:
    """A wrapper as the docs describe one: it forwards ``revision``, ``expected`` and ``lock``."""

    def __init__(self, inner: FileStore) -> None:
        self.inner = inner

    def validate_key(self, key: str) -> None:
        self.inner.validate_key(key)

    def location(self, key: str) -> str:
        return self.inner.location(key)

    def open(self) -> None:
        self.inner.open()

    def write(
        self, key: str, chunks: Sequence[bytes], *, revision: str, expected: str | None
    ) -> int:
        data = zlib.compress(b"".join(chunks))
        return self.inner.write(key, [data], revision=revision, expected=expected)

    def read(self, key: str) -> bytes | None:
        data = self.inner.read(key)
        return None if data is None else zlib.decompress(data)

    def revision(self, key: str) -> str | None:
        return self.inner.revision(key)

    def keys(self) -> list[str]:
        return self.inner.keys()

    def delete(self, key: str) -> bool:
        return self.inner.delete(key)

    def move_aside(self, key: str, suffix: str) -> str | None:
        return self.inner.move_aside(key, suffix)

    def lock(self, key: str, *, timeout: float = 0.0) -> KeyLock:
        return self.inner.lock(key, timeout=timeout)


def test_a_wrapper_transforming_the_bytes_keeps_writing(tmp_path: Path) -> None:
    """FileStore keeps the revision of bytes it cannot read itself; an envelope stays JSON."""
    store = Compressed(FileStore(tmp_path / "wrapped"))
    state = {"n": 0}
    with CheckpointWriter(
        lambda: Snapshot("k", dict(state)), store, resume_from=load(store, "k"), exit_hooks=False
    ) as writer:
        results = []
        for n in (1, 2, 3):
            state["n"] = n
            results.append(writer.flush_sync("manual"))
    assert all(isinstance(r, Written) for r in results), results
    checkpoint = load(store, "k")
    assert checkpoint is not None and checkpoint.state == {"n": 3}
    assert store.revision("k") == checkpoint.meta.revision

    plain = FileStore(tmp_path / "plain")
    with CheckpointWriter(lambda: Snapshot("k", {"n": 1}), plain, exit_hooks=False):
        pass
    assert Path(plain.location("k")).read_bytes().startswith(b'{"format":')


def test_a_delete_through_the_writers_store_during_its_write_is_never_undone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The delete waits for the write in flight (its check and rename), then removes the key;
    the writer's next write is a conflict and nothing brings the key back."""
    store = FileStore(tmp_path)
    state = {"n": 0}
    writer = CheckpointWriter(
        lambda: Snapshot("k", dict(state)), store, resume_from=None, exit_hooks=False
    ).open()
    state["n"] = 1
    assert isinstance(writer.flush_sync("manual"), Written)
    in_write, go = threading.Event(), threading.Event()
    write_atomic = atomic.write_atomic

    def paused(path: str, chunks: Sequence[bytes]) -> int:
        in_write.set()
        go.wait(10)
        return write_atomic(path, chunks)

    monkeypatch.setattr(files, "write_atomic", paused)
    results: list[object] = []
    state["n"] = 2
    flush = threading.Thread(target=lambda: results.append(writer.flush_sync("manual")))
    flush.start()
    assert in_write.wait(10)
    delete = threading.Thread(target=lambda: results.append(store.delete("k")))
    delete.start()
    delete.join(1.0)  # long enough for a delete that does not wait to be done
    go.set()
    flush.join()
    delete.join()
    assert True in results
    assert not os.path.exists(store.location("k")), "the deleted key came back"
    state["n"] = 3
    refused = writer.flush_sync("manual")
    assert isinstance(refused, Failed) and refused.reason == "conflict", refused
    writer.close()
    assert load(store, "k") is None


class OldStore:
    """A store written for the API before revisions: ``write(key, chunks)``, no ``revision``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def validate_key(self, key: str) -> None:
        check_key(key)

    def location(self, key: str) -> str:
        return str(self.root / key)

    def open(self) -> None:
        self.root.mkdir(exist_ok=True)

    def write(self, key: str, chunks: Sequence[bytes]) -> int:
        Path(self.location(key)).write_bytes(b"".join(chunks))
        return sum(map(len, chunks))

    def read(self, key: str) -> bytes | None:
        path = Path(self.location(key))
        return path.read_bytes() if path.exists() else None

    def keys(self) -> list[str]:
        return sorted(os.listdir(self.root))

    def delete(self, key: str) -> bool:
        path = Path(self.location(key))
        if not path.exists():
            return False
        path.unlink()
        return True

    def move_aside(self, key: str, suffix: str) -> str | None:
        return None


def test_unfenced_takes_a_store_without_revision(tmp_path: Path) -> None:
    """unfenced() reads the revision from the stored envelope's meta."""
    old = OldStore(tmp_path)
    store = unfenced(old)
    assert store.revision("k") is None
    for n in (1, 2):
        with CheckpointWriter(
            functools.partial(Snapshot, "k", {"n": n}),
            store,
            resume_from=load(store, "k"),
            exit_hooks=False,
        ) as writer:
            pass
        assert isinstance(writer.statistics().last_result, Written)
    checkpoint = load(store, "k")
    assert checkpoint is not None and checkpoint.state == {"n": 2}
    assert store.revision("k") == checkpoint.meta.revision


class OldStateStore:
    """A StateStore written for the API before revisions: ``commit`` and ``update_meta`` take
    no ``expected`` (a journal underneath, which is told what it holds: no check)."""

    def __init__(self, root: Path) -> None:
        self.inner = JournalStore(root)
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _held(self, key: str) -> str | None:
        meta = self.inner.read_meta(key)
        return None if meta is None else meta.revision

    def commit(self, key: str, meta: Meta, staged: Any) -> int:
        self.calls.append("commit")
        return self.inner.commit(key, meta, staged, expected=self._held(key))

    def update_meta(self, key: str, meta: Meta) -> None:
        self.calls.append("update_meta")
        held = self._held(key)
        assert held is not None
        self.inner.update_meta(key, meta, expected=held)


def test_unfenced_takes_a_state_store_without_expected(tmp_path: Path) -> None:
    """unfenced() over an old StateStore: commit and update_meta called without ``expected``."""
    old = OldStateStore(tmp_path)
    key = ["a"]
    source = lambda: Snapshot(key[0], {"n": 1})  # noqa: E731
    with CheckpointWriter(source, unfenced(old), exit_hooks=False) as writer:
        key[0] = "b"  # the session moves on: "a" is marked not live (update_meta)
        assert isinstance(writer.flush_sync(), Written)
    assert old.calls[:3] == ["commit", "update_meta", "commit"]
    for name in "ab":
        checkpoint = load(old, name)
        assert checkpoint is not None and (checkpoint.state, checkpoint.meta.live) == (
            {"n": 1},
            False,
        )


def test_unfenced_keeps_the_store_s_capabilities_when_looked_up_statically(tmp_path: Path) -> None:
    """``unfenced(FileStore)`` keeps its lock and the rest of a ``Store`` when its
    attributes are looked up without ``__getattr__``, as Python 3.12's ``isinstance()``
    against a protocol does."""
    wrapped = unfenced(FileStore(tmp_path))
    for name in ("lock", "open", "read", "keys", "delete", "move_aside", "location"):
        assert callable(inspect.getattr_static(wrapped, name)), name
