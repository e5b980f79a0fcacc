"""load(): what a reader gets back from a checkpoint file, good or bad."""

from __future__ import annotations

import json
import os
import random
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import msgspec
import pytest

from checkpointer import (
    Checkpoint,
    CheckpointError,
    CheckpointWriter,
    FileStore,
    NewerVersionError,
    Snapshot,
    load,
)
from checkpointer._version import VERSION


class Message(msgspec.Struct, frozen=True):
    role: Literal["system", "user", "assistant"]
    content: str


class Transcript(msgspec.Struct, frozen=True):
    messages: list[Message]
    title: str = ""


class Dollar(msgspec.Struct, rename={"x": "$x"}):
    x: int


META = {
    "key": "s1",
    "seq": 3,
    "created_at": "2024-05-01T12:00:00Z",
    "updated_at": "2024-05-01T12:00:05.250000Z",
    "live": True,
}

STATE = {
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "héllo wörld ☃ 你好 🎉"},
        {"role": "assistant", "content": 'line\nbreak "quoted" \\ tab\t'},
        {"role": "user", "content": ""},
    ],
    "title": "t",
}


def checkpoint_bytes(envelope: object) -> bytes:
    return json.dumps(envelope).encode()


def good_envelope(**changes: object) -> dict[str, object]:
    envelope: dict[str, object] = {"format": 1, "meta": dict(META), "state": STATE}
    envelope.update(changes)
    return envelope


def write_with_writer(root: Path, state: object, key: str = "s1") -> FileStore:
    """Write ``state`` under ``key`` through a real, synchronous CheckpointWriter."""
    store = FileStore(root)
    with CheckpointWriter(lambda: Snapshot(key, state), store, exit_hooks=False):
        pass
    return store


def expect_error(store: FileStore, key: str = "s1", type: Any = Any) -> CheckpointError:
    """load() must raise CheckpointError naming the file; return it for more checks."""
    with pytest.raises(CheckpointError) as info:
        load(store, key, type)
    error = info.value
    assert error.path == store.location(key)
    assert error.path in str(error)
    assert error.reason in str(error)
    return error


# -- good files ----------------------------------------------------------------


def test_missing_key_loads_as_none(tmp_path: Path) -> None:
    """No file for the key (or no root at all) is None, not an error."""
    assert load(FileStore(tmp_path / "never-written"), "s1") is None
    store = write_with_writer(tmp_path, {"x": 1}, key="other")
    assert load(store, "s1") is None


@pytest.mark.parametrize(
    "state",
    [
        STATE,
        {"nested": {"deeper": {"list": [1, 2.5, None, True, {"k": ["v"]}]}}},
        ["a", 1, [], {}],
        "plain unicode: ünïcödé ✓",
        12345678901234567890,
        None,
        {},
    ],
    ids=["transcript", "nested", "list", "str", "bigint", "null", "empty"],
)
def test_state_written_by_the_writer_round_trips(tmp_path: Path, state: object) -> None:
    """Whatever the writer saved comes back equal as plain JSON values."""
    store = write_with_writer(tmp_path, state)
    checkpoint = load(store, "s1")
    assert checkpoint is not None
    assert checkpoint.state == state


def test_meta_written_by_the_writer_round_trips(tmp_path: Path) -> None:
    """key, seq, live and the UTC timestamps track the writer's writes."""
    store = FileStore(tmp_path)
    state: dict[str, int] = {"n": 1}
    before = datetime.now(UTC)
    with CheckpointWriter(lambda: Snapshot("s1", state), store, exit_hooks=False) as writer:
        first = load(store, "s1")
        assert first is not None
        assert (first.meta.key, first.meta.seq, first.meta.live) == ("s1", 1, True)
        assert first.meta.pinned is False
        assert before <= first.meta.created_at == first.meta.updated_at <= datetime.now(UTC)
        state = {"n": 2}
        writer.flush_sync()
        second = load(store, "s1")
        assert second is not None
        assert (second.meta.seq, second.meta.live, second.state) == (2, True, {"n": 2})
        assert second.meta.created_at == first.meta.created_at
        assert second.meta.updated_at > first.meta.updated_at
    final = load(store, "s1")
    assert final is not None
    assert (final.meta.seq, final.meta.live, final.state) == (3, False, {"n": 2})
    assert final.meta.created_at == first.meta.created_at
    assert final.meta.created_at.tzinfo is not None


def test_typed_state_decodes_into_structs(tmp_path: Path) -> None:
    """With type=Transcript the state comes back as that Struct, equal to what was saved."""
    saved = Transcript(
        messages=[Message("user", "hi ✓"), Message("assistant", "hello")], title="demo"
    )
    store = write_with_writer(tmp_path, saved)
    checkpoint = load(store, "s1", Transcript)
    assert isinstance(checkpoint, Checkpoint)
    assert isinstance(checkpoint.state, Transcript)
    assert checkpoint.state == saved


def test_unknown_meta_fields_are_ignored(tmp_path: Path) -> None:
    """A file with extra meta and envelope fields (a compatible addition) still loads."""
    meta = dict(META, future_field=[1, 2])
    (tmp_path / "s1.json").write_bytes(checkpoint_bytes(good_envelope(meta=meta, extra={})))
    checkpoint = load(FileStore(tmp_path), "s1")
    assert checkpoint is not None
    assert checkpoint.meta.seq == 3
    assert checkpoint.state == STATE


# -- files that cannot be trusted ---------------------------------------------


def test_empty_file_is_an_error(tmp_path: Path) -> None:
    """A zero-byte file raises CheckpointError saying it is empty."""
    (tmp_path / "s1.json").write_bytes(b"")
    assert "empty" in expect_error(FileStore(tmp_path)).reason


def test_every_truncation_of_a_real_checkpoint_is_an_error(tmp_path: Path) -> None:
    """Cutting a writer-made file at any byte offset gives CheckpointError, never a result."""
    store = write_with_writer(tmp_path, STATE)
    path = Path(store.location("s1"))
    data = path.read_bytes()
    assert load(store, "s1") is not None
    for end in range(len(data)):
        path.write_bytes(data[:end])
        with pytest.raises(CheckpointError) as info:
            load(store, "s1")
        assert info.value.path == str(path), end


def test_random_bytes_are_an_error(tmp_path: Path) -> None:
    """Seeded random garbage, alone or after a valid-looking prefix, gives CheckpointError."""
    rng = random.Random(20240501)
    store = FileStore(tmp_path)
    path = Path(store.location("s1"))
    prefixes = [b"", b"{", b'{"format":1,', b'{"format":1,"meta":', b'{"format":1,"state":']
    for i in range(600):
        path.write_bytes(prefixes[i % len(prefixes)] + rng.randbytes(rng.randrange(1, 300)))
        expect_error(store)


def test_no_single_byte_corruption_crashes_load(tmp_path: Path) -> None:
    """Overwriting any one byte of a real file gives a checkpoint or CheckpointError, no crash."""
    store = write_with_writer(tmp_path, STATE)
    path = Path(store.location("s1"))
    data = path.read_bytes()
    errors = 0
    for offset in range(len(data)):
        for byte in (0x00, 0x22, 0x5D, 0xFF):  # NUL, '"', ']', invalid UTF-8
            path.write_bytes(data[:offset] + bytes([byte]) + data[offset + 1 :])
            try:
                load(store, "s1")
            except CheckpointError:
                errors += 1
    assert errors > len(data)  # most corruptions are caught, not silently accepted


_DEEP = b"[" * 100_000 + b"]" * 100_000
META_JSON = json.dumps(META).encode()


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (_DEEP, "Expected `object`, got `array`"),
        (b'{"format":1,"extra":' + _DEEP + b"}", "nested too deeply"),
        (b'{"format":1,"meta":' + META_JSON + b',"state":' + _DEEP + b"}", "nested too deeply"),
        (b'{"format":2,"meta":"changed","extra":' + _DEEP + b"}", "not a checkpoint envelope"),
    ],
    ids=["top", "extra-field", "state", "newer-and-deep"],
)
def test_deeply_nested_garbage_is_an_error(tmp_path: Path, data: bytes, expected: str) -> None:
    """Nesting past msgspec's recursion limit gives CheckpointError, not RecursionError."""
    (tmp_path / "s1.json").write_bytes(data)
    assert expected in expect_error(FileStore(tmp_path)).reason


@pytest.mark.parametrize(
    ("envelope", "expected"),
    [
        ([], "Expected `object`, got `array`"),
        ({}, "missing required field `format`"),
        (None, "Expected `object`, got `null`"),
        ("checkpoint", "Expected `object`, got `str`"),
        ({"format": 1}, "missing required field `meta`"),
        ({"format": 1, "meta": META}, "missing required field `state`"),
        ({"format": "1", "meta": META, "state": 1}, "`$.format`"),
        ({"format": 1.0, "meta": META, "state": 1}, "`$.format`"),
        ({"format": 1, "meta": [], "state": 1}, "`$.meta`"),
        (good_envelope(meta={"key": "s1"}), "missing required field `seq` - at `$.meta`"),
        (good_envelope(meta=dict(META, seq="3")), "`$.meta.seq`"),
        (good_envelope(meta=dict(META, seq=None)), "`$.meta.seq`"),
        (good_envelope(meta=dict(META, key=7)), "`$.meta.key`"),
        (good_envelope(meta=dict(META, live="yes")), "`$.meta.live`"),
        (good_envelope(meta=dict(META, pinned=1)), "`$.meta.pinned`"),
        (good_envelope(meta=dict(META, created_at="yesterday")), "`$.meta.created_at`"),
        (good_envelope(meta=dict(META, updated_at=1714564800)), "`$.meta.updated_at`"),
    ],
)
def test_valid_json_of_the_wrong_shape_is_an_error(
    tmp_path: Path, envelope: object, expected: str
) -> None:
    """JSON that is not a checkpoint envelope names what is wrong and where."""
    (tmp_path / "s1.json").write_bytes(checkpoint_bytes(envelope))
    error = expect_error(FileStore(tmp_path))
    assert "not a checkpoint envelope" in error.reason
    assert expected in error.reason


@pytest.mark.parametrize(
    ("state", "type", "expected"),
    [
        (
            {"messages": [*STATE["messages"][:3], {"role": "robot", "content": "x"}]},
            Transcript,
            "`$.state.messages[3].role`",
        ),
        (
            {"messages": [*STATE["messages"][:3], {"role": 5, "content": "x"}]},
            Transcript,
            "`$.state.messages[3].role`",
        ),
        (
            {"messages": [{"content": "x"}]},
            Transcript,
            "missing required field `role` - at `$.state.messages[0]`",
        ),
        ({"messages": "none"}, Transcript, "`$.state.messages`"),
        ([1, 2, "three"], list[int], "`$.state[2]`"),
        ({"a": 1}, int, "Expected `int`, got `object` - at `$.state`"),
        (None, Transcript, "Expected `object`, got `null` - at `$.state`"),
        ({}, Dollar, "Object missing required field `$x` - at `$.state`"),
        ({"$x": "1"}, Dollar, "Expected `int`, got `str` - at `$.state.$x`"),
    ],
)
def test_state_of_the_wrong_type_names_the_json_path(
    tmp_path: Path, state: object, type: Any, expected: str
) -> None:
    """A state that does not match the requested type gives its $.state... path."""
    store = write_with_writer(tmp_path, state)
    error = expect_error(store, type=type)
    assert "state does not match" in error.reason
    assert expected in error.reason
    assert load(store, "s1") is not None  # the file itself is fine as plain JSON


@pytest.mark.parametrize(
    ("envelope", "version"),
    [
        ({"format": 2, "meta": META, "state": STATE}, 2),
        ({"format": 99, "meta": META, "state": STATE}, 99),
        ({"format": 2, "header": {"id": "s1"}, "body": [1, 2]}, 2),
        ({"format": 99, "meta": ["changed", "shape"], "state": STATE}, 99),
        ({"meta": {"key": 1}, "format": 2}, 2),
        ({"format": 3, "meta": {"library_version": 7}}, 3),
    ],
)
def test_newer_format_says_so_and_names_the_version(
    tmp_path: Path, envelope: object, version: int
) -> None:
    """A newer format version, whatever its shape, is a NewerVersionError saying so and to
    upgrade; the file stays where it is."""
    (tmp_path / "s1.json").write_bytes(checkpoint_bytes(envelope))
    error = expect_error(FileStore(tmp_path))
    assert isinstance(error, NewerVersionError)
    assert error.reason == (
        f"written by a newer version (format {version}; this agent-checkpointer {VERSION} "
        "reads format 1); upgrade agent-checkpointer to read it"
    )
    assert error.library_version is None
    assert (tmp_path / "s1.json").read_bytes() == checkpoint_bytes(envelope)


@pytest.mark.parametrize(
    "envelope",
    [
        {"format": 2, "meta": {**META, "library_version": "9.9.9"}, "state": STATE},
        {"format": 2, "meta": {"library_version": "9.9.9", "key": ["a new shape"]}, "body": 1},
    ],
)
def test_newer_format_names_the_version_that_wrote_it(tmp_path: Path, envelope: object) -> None:
    """A newer format's meta.library_version is named as the version to upgrade to."""
    (tmp_path / "s1.json").write_bytes(checkpoint_bytes(envelope))
    error = expect_error(FileStore(tmp_path))
    assert isinstance(error, NewerVersionError)
    assert error.library_version == "9.9.9"
    assert error.reason.startswith(
        "written by a newer version (agent-checkpointer 9.9.9); upgrade agent-checkpointer "
        f"to 9.9.9 or later to read it (format 2; this agent-checkpointer {VERSION} reads format 1)"
    )


@pytest.mark.parametrize("version", [0, -1, -99])
def test_format_zero_or_negative_is_an_error(tmp_path: Path, version: int) -> None:
    """Versions below 1 never existed: CheckpointError naming the version."""
    (tmp_path / "s1.json").write_bytes(checkpoint_bytes(good_envelope(format=version)))
    assert f"unknown format version {version}" in expect_error(FileStore(tmp_path)).reason


def test_a_directory_in_place_of_the_file_is_an_error(tmp_path: Path) -> None:
    """root/key.json being a directory gives CheckpointError, not IsADirectoryError."""
    (tmp_path / "s1.json").mkdir()
    assert "cannot be read" in expect_error(FileStore(tmp_path)).reason


@pytest.mark.parametrize("key", ["", "../s1", ".s1", "a/b", "s 1", None, 5])
def test_invalid_key_raises_value_error_and_reads_nothing(tmp_path: Path, key: Any) -> None:
    """load() with an invalid key raises ValueError and does not create the root."""
    root = tmp_path / "root"
    with pytest.raises(ValueError, match="invalid key"):
        load(FileStore(root), key)
    assert os.listdir(tmp_path) == []
