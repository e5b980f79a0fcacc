"""The caller's state versions and migrations; corrupt files moved aside."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest

from checkpointer import (
    CheckpointError,
    CheckpointWriter,
    Failed,
    FileStore,
    JournalStore,
    NewerVersionError,
    Snapshot,
    Written,
    load,
)
from checkpointer._stores.flock import probe_file_lock
from checkpointer._version import VERSION
from tests.conftest import FakeClock


class StateV3(msgspec.Struct):
    title: str
    messages: list[str]
    tags: list[str]


def write(root: Path, state: Any, *, version: int, key: str = "s") -> None:
    writer = CheckpointWriter(
        lambda: Snapshot(key, state), FileStore(root), state_version=version, exit_hooks=False
    )
    writer.open()
    writer.close()


def v1_to_v2(state: dict[str, Any]) -> dict[str, Any]:
    """v2 renamed 'name' to 'title'."""
    state = dict(state)
    state["title"] = state.pop("name")
    return state


def v2_to_v3(state: dict[str, Any]) -> dict[str, Any]:
    """v3 added 'tags', derived from the title (so the order of steps shows)."""
    return {**state, "tags": [state["title"].lower()]}


MIGRATIONS = {1: v1_to_v2, 2: v2_to_v3}


def test_the_envelope_carries_the_state_version(tmp_path: Path) -> None:
    """The writer's state_version is in every file's meta."""
    write(tmp_path, {"title": "T", "messages": [], "tags": []}, version=3)
    cp = load(FileStore(tmp_path), "s")
    assert cp is not None and cp.meta.state_version == 3


def test_migrations_run_in_order_then_the_type_is_checked(tmp_path: Path) -> None:
    """A v1 file loaded at v3 goes through 1->2 then 2->3 and decodes as the v3 type."""
    write(tmp_path, {"name": "Hello", "messages": ["a"]}, version=1)
    cp = load(FileStore(tmp_path), "s", StateV3, state_version=3, migrations=MIGRATIONS)
    assert cp is not None
    assert cp.state == StateV3(title="Hello", messages=["a"], tags=["hello"])
    assert cp.meta.state_version == 1  # meta is what the file says
    again = load(FileStore(tmp_path), "s", state_version=2, migrations=MIGRATIONS)
    assert again is not None and again.state == {"title": "Hello", "messages": ["a"]}


def test_a_current_file_needs_no_migration(tmp_path: Path) -> None:
    """A file at the reader's version is decoded directly."""
    write(tmp_path, {"title": "T", "messages": [], "tags": ["x"]}, version=3)
    boom = {2: lambda s: 1 / 0}
    cp = load(FileStore(tmp_path), "s", StateV3, state_version=3, migrations=boom)
    assert cp is not None and cp.state.tags == ["x"]


def test_a_newer_file_is_an_error_never_a_downgrade(tmp_path: Path) -> None:
    """A file of a newer state version than the reader supports is a NewerVersionError
    saying it was written by a newer version of the program, and what to do."""
    write(tmp_path, {"title": "T"}, version=4)
    with pytest.raises(NewerVersionError) as info:
        load(FileStore(tmp_path), "s", state_version=3, migrations=MIGRATIONS)
    assert info.value.path == str(tmp_path / "s.json")
    assert info.value.reason == (
        f"written by a newer version of the program (state version 4 with agent-checkpointer "
        f"{VERSION}): state version 4 is newer than this program supports (3); upgrade the "
        "program that reads it, or load it with state_version=4"
    )
    assert info.value.library_version == VERSION


def test_a_missing_or_failing_migration_is_an_error(tmp_path: Path) -> None:
    """A missing step names the version to register; a raising step names itself."""
    write(tmp_path, {"name": "T", "messages": []}, version=1)
    store = FileStore(tmp_path)
    with pytest.raises(CheckpointError, match=r"no migration from version 2; register"):
        load(store, "s", state_version=3, migrations={1: v1_to_v2})
    with pytest.raises(CheckpointError, match=r"migration from state version 1 to 2 raised Key"):
        load(store, "s", state_version=3, migrations={1: lambda s: s["nope"], 2: v2_to_v3})
    with pytest.raises(CheckpointError, match=r"missing required field `tags` - at `\$\.state`"):
        load(store, "s", StateV3, state_version=3, migrations={1: v1_to_v2, 2: lambda s: s})
    with pytest.raises(ValueError, match="state_version"):
        load(store, "s", migrations=MIGRATIONS)


def test_loading_without_versions_ignores_them(tmp_path: Path) -> None:
    """Callers who never use versions load any file as before."""
    write(tmp_path, {"x": 1}, version=7)
    cp = load(FileStore(tmp_path), "s")
    assert cp is not None and cp.state == {"x": 1}


def test_a_writer_never_replaces_a_newer_state_version(tmp_path: Path) -> None:
    """An older program's writer fails on a key holding a newer state version; the file stays."""
    write(tmp_path, {"title": "new"}, version=5)
    before = (tmp_path / "s.json").read_bytes()
    writer = CheckpointWriter(
        lambda: Snapshot("s", {"name": "old"}),
        FileStore(tmp_path),
        state_version=4,
        exit_hooks=False,
        write_on_start=False,
    ).open()
    result = writer.flush_sync()
    writer.close()
    assert isinstance(result, Failed) and result.reason == "newer-version"
    assert result.error == (
        f"not writing 's': {tmp_path / 's.json'}: written by a newer version of the program "
        f"(state version 5 with agent-checkpointer {VERSION}): this writer's state version is "
        "4; not replacing it (upgrade the program, or use another key)"
    )
    assert (tmp_path / "s.json").read_bytes() == before


def _newer_format(data: bytes, *, shape: bool) -> bytes:
    """``data`` (a file, or a journal) as a format-2 writer of agent-checkpointer 9.9.9
    would have written it; with ``shape``, its meta in a shape this version cannot read."""
    head, newline, rest = data.partition(b"\n")
    doc = msgspec.json.decode(head)
    doc["format"] = 2
    doc["meta"]["library_version"] = "9.9.9"
    if shape:
        doc["meta"]["seq"] = {"a new": "shape"}
    return msgspec.json.encode(doc) + newline + rest


def newer_file(root: Path, case: str) -> tuple[Any, Path]:
    """A key ``s`` whose checkpoint a newer version wrote: (its store, its file)."""
    if case == "state-version":
        write(root, {"n": -1}, version=5)
        return FileStore(root), root / "s.json"
    store: Any = JournalStore(root) if case.startswith("journal") else FileStore(root)
    writer = CheckpointWriter(
        lambda: Snapshot("s", {"messages": [{"role": "user"}]}), store, exit_hooks=False
    )
    with writer:
        pass
    path = Path(store.location("s"))
    path.write_bytes(_newer_format(path.read_bytes(), shape=case.endswith("shape")))
    return type(store)(root), path


CASES = ["snapshot", "snapshot-shape", "journal", "journal-shape", "state-version"]


@pytest.mark.parametrize("case", CASES)
def test_load_refuses_a_newer_format_and_names_the_version(tmp_path: Path, case: str) -> None:
    """A file or a journal of a newer format (known meta or not) is a NewerVersionError
    naming the agent-checkpointer version that wrote it; the file stays."""
    store, path = newer_file(tmp_path, case)
    before = path.read_bytes()
    with pytest.raises(NewerVersionError) as info:
        load(store, "s", state_version=1)
    if case == "state-version":
        assert info.value.reason.startswith("written by a newer version of the program")
    else:
        assert info.value.library_version == "9.9.9"
        assert info.value.reason.startswith(
            "written by a newer version (agent-checkpointer 9.9.9); upgrade agent-checkpointer "
            "to 9.9.9 or later to read it (format 2; "
        )
    assert path.read_bytes() == before


@pytest.mark.anyio
@pytest.mark.parametrize("case", CASES)
async def test_a_writer_refuses_a_key_a_newer_version_wrote(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    """The first write of a key a newer version wrote is Failed("newer-version") naming the
    version; the file stays in place (not moved aside), the key's lock is let go, and it is
    tried again at the next change only, not with backoff; once removed, the key is written."""
    store, path = newer_file(tmp_path, case)
    before = path.read_bytes()
    files = sorted(p.name for p in tmp_path.iterdir())
    state = {"n": 0}
    caplog.set_level(logging.WARNING, logger="checkpointer")
    async with CheckpointWriter(
        lambda: Snapshot("s", dict(state)),
        store,
        clock=clock,
        exit_hooks=False,
        write_on_start=False,
        state_version=1,
    ) as writer:
        result = await writer.write_now()
        assert isinstance(result, Failed) and result.reason == "newer-version"
        assert result.error.startswith(f"not writing 's': {path}: written by a newer version")
        assert "9.9.9" in result.error or case == "state-version"
        assert probe_file_lock(str(tmp_path / "s.lock")) is None
        await clock.advance(1000.0)
        assert writer.statistics().failures == 1  # no retry with backoff
        state["n"] = 1
        writer.notify()
        await clock.advance(2000.0)
        assert writer.statistics().failures == 2  # the next change tried again
        assert path.read_bytes() == before
        assert sorted(p.name for p in tmp_path.iterdir()) == files  # nothing moved aside
        path.unlink()
        state["n"] = 2
        writer.notify()
        await clock.advance(3000.0)
        assert writer.statistics().writes == 1
    warned = [r.getMessage() for r in caplog.records if "newer-version" in r.getMessage()]
    assert len(warned) == 1 and warned[0].endswith("; not retrying until the session changes")
    checkpoint = load(type(store)(tmp_path), "s")
    assert checkpoint is not None and checkpoint.state == {"n": 2}


@pytest.mark.anyio
async def test_a_corrupt_file_is_moved_aside_with_a_utc_stamp_and_logged(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A writer opening a key whose file cannot be loaded moves it to
    <key>.corrupt-<UTC timestamp>, logs where, starts afresh; nothing is lost."""
    garbage = b'{"format":1,"meta":{"key":"s"'
    (tmp_path / "s.json").write_bytes(garbage)
    caplog.set_level(logging.WARNING, logger="checkpointer")
    store = FileStore(tmp_path)
    async with CheckpointWriter(
        lambda: Snapshot("s", {"fresh": True}), store, clock=clock, exit_hooks=False
    ) as writer:
        result = await writer.write_now(force=True)
        assert isinstance(result, Written)
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("s.corrupt-")]
    assert len(aside) == 1
    assert aside[0].read_bytes() == garbage
    stamp = datetime.strptime(aside[0].name.removeprefix("s.corrupt-"), "%Y%m%dT%H%M%S.%fZ")
    assert abs(stamp.replace(tzinfo=UTC) - datetime.now(UTC)) < timedelta(minutes=5)
    assert any(str(aside[0]) in r.getMessage() for r in caplog.records)
    cp = load(store, "s")
    assert cp is not None and cp.state == {"fresh": True} and cp.meta.seq >= 1


_NEWER_ROWS = {
    "second-header": b'{"kind":"header","format":2,"meta":%s}',
    "unknown-kind": b'{"kind":"delta","format":2,"meta":%s,"ops":[]}',
}


@pytest.mark.parametrize("last", [False, True], ids=["middle", "last"])
@pytest.mark.parametrize("row", sorted(_NEWER_ROWS))
def test_a_journal_row_a_newer_version_wrote_is_newer_not_damage(
    tmp_path: Path, row: str, last: bool
) -> None:
    """A whole journal line this version does not know (a second header of a newer
    format, a row of an unknown kind), in the middle or last, is a NewerVersionError
    naming its version, never damage nor a torn tail; a writer leaves the file as it is."""
    store = JournalStore(tmp_path)
    writer = CheckpointWriter(
        lambda: Snapshot("s", {"messages": [{"role": "user"}]}), store, exit_hooks=False
    )
    with writer:
        pass
    path = tmp_path / "s.jsonl"
    newer_meta = b'{"key":"s","seq":9,"library_version":"9.9.9"}'
    lines = path.read_bytes().splitlines(keepends=True)
    at = len(lines) if last else 2
    lines.insert(at, _NEWER_ROWS[row] % newer_meta + b"\n")
    path.write_bytes(b"".join(lines))
    with pytest.raises(NewerVersionError) as info:
        load(JournalStore(tmp_path), "s")
    assert info.value.library_version == "9.9.9"
    assert info.value.reason.startswith(f"line {at + 1}: ")
    writer = CheckpointWriter(
        lambda: Snapshot("s", {"n": 1}), JournalStore(tmp_path), exit_hooks=False
    )
    writer.open()
    result = writer.flush_sync()
    writer.close()
    assert isinstance(result, Failed) and result.reason == "newer-version", result
    assert path.read_bytes() == b"".join(lines)
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".lock") == ["s.jsonl"]
