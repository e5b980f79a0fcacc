"""S3Store with encryption, against moto's server: the tampering cases of every store."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from checkpointer import CheckpointWriter, Failed, S3Store, Snapshot
from checkpointer.stores import DecryptionError, Encryption
from tests.s3 import Place
from tests.stores import sealed_cases


class S3Rig:
    def __init__(self, place: Place) -> None:
        self.place = place
        self.raw = place.store("s3").s3

    def store(self, encryption: Encryption | None) -> S3Store:
        store: S3Store = self.place.store("s3", encryption=encryption)
        return store

    def _object(self, key: str) -> dict[str, Any]:
        answer: dict[str, Any] = self.raw.call("get_object", Key=f"{self.raw.prefix}{key}.json")
        return answer

    def get(self, key: str) -> bytes:
        with self._object(key)["Body"] as body:
            data: bytes = body.read()
        return data

    def put(self, key: str, data: bytes, metadata: dict[str, str] | None = None) -> None:
        metadata = metadata if metadata is not None else self._object(key)["Metadata"]
        self.raw.call(
            "put_object", Key=f"{self.raw.prefix}{key}.json", Body=data, Metadata=metadata
        )

    def copy(self, src: str, dst: str) -> None:
        self.put(dst, self.get(src), self._object(src)["Metadata"])


@pytest.fixture
def rig() -> Iterator[S3Rig]:
    place = Place()
    yield S3Rig(place)
    place.close()


@pytest.mark.parametrize("case", sealed_cases.CASES)
def test_tampering_is_refused(rig: S3Rig, case: Callable[[S3Rig], None]) -> None:
    """A flipped byte, an object swapped between keys, plaintext planted, a cut object."""
    case(rig)


@sealed_cases.WRONG
def test_a_writer_with_the_wrong_key_leaves_the_object(
    rig: S3Rig, wrong: Callable[[], Encryption | None]
) -> None:
    """Never moved aside nor replaced: the write fails and the object is as it was."""
    sealed_cases.wrong_key_writer(rig, wrong)


@sealed_cases.WRONG
def test_a_write_with_the_wrong_key_is_refused_by_the_store(
    rig: S3Rig, wrong: Callable[[], Encryption | None]
) -> None:
    """Checked at the write, not only at a read before it: a writer handed the meta, a
    write and a meta update expecting the stored revision all fail; the object as it was."""
    sealed_cases.wrong_key_overwrite(rig, wrong)


def test_a_sealed_object_without_its_revision_metadata_is_kept(rig: S3Rig) -> None:
    """Restored from a backup, or copied by a tool that drops x-amz-meta-*: load and
    revision() say so, and a writer resumed from "absent" fails without moving it aside."""
    sealed_cases.save(rig.store(sealed_cases.enc()))
    data = rig.get("s1")
    rig.put("s1", data, metadata={})
    store = rig.store(sealed_cases.enc())
    assert "without its revision metadata" in str(sealed_cases.refused(store))
    with pytest.raises(DecryptionError, match="without its revision metadata"):
        store.revision("s1")
    with CheckpointWriter(
        lambda: Snapshot("s1", {"n": 1}), store, exit_hooks=False, resume_from=None
    ) as writer:
        assert isinstance(writer.flush_sync(), Failed)
    names = [o["Key"] for o in rig.raw.call("list_objects_v2").get("Contents", [])]
    assert names == [f"{rig.raw.prefix}s1.json"] and rig.get("s1") == data
