"""S3JournalStore with encryption, against moto's server: the tampering cases of every
store, and those of a journal kept under a head (rows moved, dropped, replayed)."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from checkpointer import S3JournalStore, load
from checkpointer._cli import main
from checkpointer.stores import Encryption
from tests.s3 import Place
from tests.stores import sealed_cases
from tests.stores.s3.test_processes import started


class S3JournalRig:
    journal = True

    def __init__(self, place: Place) -> None:
        self.place = place
        self.raw = place.store("s3").s3

    def store(self, encryption: Encryption | None, **kw: Any) -> S3JournalStore:
        store: S3JournalStore = self.place.store("s3journal", encryption=encryption, **kw)
        return store

    def _get(self, name: str) -> bytes:
        answer = self.raw.call("get_object", Key=f"{self.raw.prefix}{name}")
        with answer["Body"] as body:
            data: bytes = body.read()
        return data

    def _put(self, name: str, data: bytes) -> None:
        self.raw.call("put_object", Key=f"{self.raw.prefix}{name}", Body=data)

    def _segments(self, key: str) -> list[str]:
        head = json.loads(self._get(f"{key}.journal"))
        return [f"{key}.segments/{name}" for name, _ in head["segments"]]

    def get(self, key: str) -> bytes:  # the segments' rows, in order
        return b"".join(self._get(name) for name in self._segments(key))

    def put(self, key: str, data: bytes) -> None:  # the last segment takes what is left
        *names, last = self._segments(key)
        for name in names:
            size = len(self._get(name))
            self._put(name, data[:size])
            data = data[size:]
        self._put(last, data)

    def copy(self, src: str, dst: str) -> None:  # the head and the segments it names
        for name in self._segments(src):
            self._put(dst + name[len(src) :], self._get(name))
        self._put(f"{dst}.journal", self._get(f"{src}.journal"))

    def rows(self, key: str) -> list[bytes]:
        return self.get(key).splitlines(keepends=True)

    def set_rows(self, key: str, rows: list[bytes]) -> None:
        first, *others = self._segments(key)
        self._put(first, b"".join(rows))
        for name in others:
            self._put(name, b"")


@pytest.fixture
def rig() -> Iterator[S3JournalRig]:
    place = Place()
    yield S3JournalRig(place)
    place.close()


@pytest.mark.parametrize("case", [*sealed_cases.CASES, *sealed_cases.HEADED_JOURNAL_CASES])
def test_tampering_is_refused(rig: S3JournalRig, case: Callable[[S3JournalRig], None]) -> None:
    """A flipped byte, a key's journal swapped for another's, plaintext planted, a segment
    cut short, rows reordered, dropped or replayed from before a compaction."""
    case(rig)


@sealed_cases.WRONG
def test_a_writer_with_the_wrong_key_leaves_the_journal(
    rig: S3JournalRig, wrong: Callable[[], Encryption | None]
) -> None:
    """Never moved aside nor replaced: the write fails and the segments are as they were."""
    sealed_cases.wrong_key_writer(rig, wrong)


OLD, NEW = "old:" + "AQ" * 21 + "A=", Encryption.new_key("new")


def reencrypt(place: Place, tmp_path: Path, *keys: str) -> tuple[int, str]:
    (tmp_path / "keys.txt").write_text("\n".join(keys) + "\n")
    argv = ["re-encrypt", f"s3://{place.bucket}/agents", "--key-file", str(tmp_path / "keys.txt")]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        status = main([*argv, "--endpoint-url", place.proxy.url])
    return status, out.getvalue()


def segments(rig: S3JournalRig, key: str) -> tuple[set[str], set[str]]:
    """The segments ``key``'s head names, and those stored."""
    named = set(rig._segments(key))
    listed = rig.place.store("s3").listing(f"{key}.segments/")
    return named, {item.name for item in listed}


def test_re_encrypt_seals_both_kinds_and_removes_the_old_segments(
    rig: S3JournalRig, tmp_path: Path
) -> None:
    """An object and a journal sealed with OLD: sealed again with NEW at their revisions,
    the journal still a journal, its old segments gone; NEW alone opens everything."""
    old = Encryption.from_text(OLD)
    sealed_cases.save(rig.place.store("s3", encryption=old), "snap")
    state = sealed_cases.chat(rig.store(old), 4, "chat")
    before = rig.place.store("s3journal", encryption=old).revision("chat")
    replaced, _ = segments(rig, "chat")
    status, out = reencrypt(rig.place, tmp_path, NEW, OLD)
    assert status == 0 and "2 sealed" in out, out
    only_new = Encryption.from_text(NEW)
    journal = rig.store(only_new)
    loaded = load(journal, "chat")
    assert loaded is not None and loaded.state == state and loaded.meta.revision == before
    assert load(rig.place.store("s3", encryption=only_new), "snap") is not None
    named, stored = segments(rig, "chat")
    assert named == stored and not replaced & stored, (replaced, named, stored)


@pytest.mark.parametrize("kind", ["s3", "s3journal"])
def test_re_encrypt_under_a_live_writer_loses_and_undoes_nothing(
    rig: S3JournalRig, tmp_path: Path, kind: str
) -> None:
    """A writer in another process (its ETag of the key cached) writes on after a
    re-encrypt: its next write lands (retried once the stale ETag is refused), never
    over the re-encrypted journal with the segments it replaced; NEW alone opens it."""
    place = rig.place
    place.env["CHECKPOINTER_KEYS"] = f"{NEW},{OLD}"
    agent = started(place, kind, "a")
    try:
        for text in ("one", "two"):
            assert agent.append(text)["result"] == "Written"
        replaced = segments(rig, "shared")[0] if kind == "s3journal" else set()
        status, out = reencrypt(place, tmp_path, NEW, OLD)
        assert status == 0 and "1 sealed" in out, out
        after = agent.append("three")
        assert after["result"] == "Written" or after["reason"] == "write-failed", after
        closed = agent.close()
    except BaseException:
        print(agent.finish())
        raise
    assert closed["result"] in ("Written", "Skipped"), closed
    store = place.store(kind, encryption=Encryption.from_text(NEW))
    loaded = load(store, "shared")
    assert loaded is not None
    assert [m["content"] for m in loaded.state["messages"]] == ["a: one", "a: two", "a: three"]
    if kind == "s3journal":
        named, stored = segments(rig, "shared")
        assert named <= stored and not named & replaced, (named, replaced)
