"""S3JournalStore with encryption, against moto's server: the tampering cases of every
store, and those of a journal kept under a head (rows moved, dropped, replayed)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from checkpointer import S3JournalStore
from checkpointer.stores import Encryption
from tests.s3 import Place
from tests.stores import sealed_cases


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


@pytest.mark.parametrize("case", sealed_cases.CASES + sealed_cases.HEADED_JOURNAL_CASES)
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
