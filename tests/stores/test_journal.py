"""JournalStore: rows, append vs compaction, torn tails, damage, rewrites, on real files."""

from __future__ import annotations

import contextlib
import datetime
import errno
import logging
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from checkpointer import (
    Checkpoint,
    CheckpointError,
    CheckpointWriter,
    FileStore,
    JournalStore,
    Limits,
    Meta,
    Skipped,
    Snapshot,
    Transcript,
    Written,
    load,
)
from tests._support import ROOT, child_env
from tests.conftest import FakeClock

pytestmark = pytest.mark.anyio

NOW = datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)


class Msg(msgspec.Struct, frozen=True):
    role: str
    content: str


class Chat(msgspec.Struct):
    title: str
    messages: list[Msg]


def meta(seq: int, key: str = "s1", **changes: Any) -> Meta:
    fields: dict[str, Any] = {"key": key, "seq": seq, "created_at": NOW, "updated_at": NOW}
    fields["live"] = True
    fields["revision"] = f"r{seq}"
    fields.update(changes)
    return Meta(**fields)


def prev(seq: int) -> str | None:
    """The revision stored before the write of ``meta(seq)``."""
    return None if seq == 1 else f"r{seq - 1}"


def rows(store: JournalStore, key: str = "s1") -> list[dict[str, Any]]:
    data = Path(store.location(key)).read_bytes()
    assert data.endswith(b"\n")
    return [msgspec.json.decode(line) for line in data.splitlines()]


def kinds(store: JournalStore, key: str = "s1") -> list[str]:
    return [row["kind"] for row in rows(store, key)]


def loaded(store: Any, key: str = "s1", type: Any = Any) -> Checkpoint[Any]:
    checkpoint = load(store, key, type)
    assert checkpoint is not None
    return checkpoint


def as_json(state: object) -> Any:
    return msgspec.json.decode(msgspec.json.encode(state))


class Session:
    """A stand-in agent: a title and settled messages."""

    def __init__(self, key: str = "s1") -> None:
        self.key = key
        self.messages: list[Any] = []
        self.state: dict[str, Any] = {"title": "t", "messages": self.messages}

    def add(self, n: int = 1, role: str = "user") -> None:
        for _ in range(n):
            self.messages.append(Msg(role, f"m{len(self.messages)}"))

    def snapshot(self) -> Snapshot:
        return Snapshot(self.key, self.state)

    def commit(self, store: Any, seq: int) -> None:
        """Stage the state on ``store`` and commit it as ``meta(seq)``, over ``prev(seq)``."""
        staged = store.stage(self.key, self.state)
        store.commit(self.key, meta(seq, self.key), staged, expected=prev(seq))

    def grow(self, store: Any, *added: int) -> None:
        """A history: ``added[i]`` messages, then a commit as seq ``i + 1``, for each ``i``."""
        for seq, n in enumerate(added, 1):
            self.add(n)
            self.commit(store, seq)


def writer_for(session: Session, store: Any, clock: FakeClock, **kw: Any) -> CheckpointWriter[Any]:
    kw.setdefault("debounce", 1.0)
    kw.setdefault("min_interval", 2.0)
    kw.setdefault("max_wait", 10.0)
    kw.setdefault("exit_hooks", False)
    return CheckpointWriter(session.snapshot, store, clock=clock, **kw)


# -- append or compaction -------------------------------------------------------


async def test_new_messages_are_appended(tmp_path: Path, clock: FakeClock) -> None:
    """A new file is a header and a compaction; new messages append rows and a meta row."""
    session = Session()
    session.add(2)
    store = JournalStore(tmp_path)
    async with writer_for(session, store, clock) as writer:
        assert kinds(store) == ["header", "compaction"]
        assert stat.S_IMODE(os.stat(store.location("s1")).st_mode) == 0o600
        before = os.path.getsize(store.location("s1"))
        session.add(3)
        result = await writer.write_now()
        assert isinstance(result, Written)
        assert result.nbytes == os.path.getsize(store.location("s1")) - before
        assert kinds(store)[2:] == ["message"] * 3 + ["meta"]
        assert [r["message"]["content"] for r in rows(store)[2:5]] == ["m2", "m3", "m4"]
        assert store.statistics().appends == 1
    checkpoint = loaded(store)
    assert checkpoint.state == as_json(session.state)
    assert checkpoint.meta.live is False
    assert kinds(store)[-1] == "meta"  # the close changed only the meta


async def test_burst_of_events_is_one_append(tmp_path: Path, clock: FakeClock) -> None:
    """The timing contract holds for a journal: a burst inside the debounce is one append."""
    session = Session()
    store = JournalStore(tmp_path)
    async with writer_for(session, store, clock) as writer:
        for _ in range(20):
            session.add()
            writer.notify()
        await clock.advance(0.9)
        assert kinds(store) == ["header", "compaction"]
        await clock.advance(2.0)
        assert kinds(store) == ["header", "compaction", *["message"] * 20, "meta"]


async def test_unchanged_state_is_skipped(tmp_path: Path, clock: FakeClock) -> None:
    """Nothing new is Skipped('unchanged'), and the file is not touched."""
    session = Session()
    session.add(2)
    store = JournalStore(tmp_path)
    async with writer_for(session, store, clock) as writer:
        size = os.path.getsize(store.location("s1"))
        assert await writer.write_now() == Skipped("unchanged")
        assert os.path.getsize(store.location("s1")) == size


async def test_meta_only_change_is_a_meta_row(tmp_path: Path, clock: FakeClock) -> None:
    """Pinning an unchanged session appends one meta row, which load honours."""
    session = Session()
    session.add()
    store = JournalStore(tmp_path)
    async with writer_for(session, store, clock) as writer:
        assert isinstance(await writer.write_now(pin=True), Written)
        assert kinds(store) == ["header", "compaction", "meta"]
        assert loaded(store).meta.pinned is True


async def test_rest_of_state_change_is_a_state_row(tmp_path: Path, clock: FakeClock) -> None:
    """A changed title (and a new message) is message rows then a state row."""
    session = Session()
    session.add(2)
    store = JournalStore(tmp_path)
    async with writer_for(session, store, clock) as writer:
        session.state["title"] = "renamed"
        session.add()
        await writer.write_now()
        assert kinds(store)[2:] == ["message", "state"]
        assert rows(store)[-1]["state"] == {"title": "renamed", "messages": None}
        assert loaded(store).state == as_json(session.state)


def _replace_middle(s: Session) -> None:
    s.messages[3] = Msg("assistant", "edited")


def _truncate(s: Session) -> None:
    del s.messages[-2:]


def _agent_compaction(s: Session) -> None:
    s.messages[:-2] = [Msg("system", "summary")]


def _reorder(s: Session) -> None:
    s.messages.reverse()


def _mutate_dict_in_place(s: Session) -> None:
    s.messages[1]["content"] = "changed in place"


def _swap_for_equal_dict(s: Session) -> None:
    s.messages[1] = dict(s.messages[1])  # a new object, equal: not a change


@pytest.mark.parametrize(
    ("edit", "dicts", "expected"),
    [
        (_replace_middle, False, "compaction"),
        (_truncate, False, "compaction"),
        (_agent_compaction, False, "compaction"),
        (_reorder, False, "compaction"),
        (_mutate_dict_in_place, True, "compaction"),
        (_swap_for_equal_dict, True, None),
    ],
    ids=["replace", "truncate", "agent-compaction", "reorder", "mutate-dict", "equal-dict"],
)
async def test_changed_history_is_a_compaction(
    tmp_path: Path, clock: FakeClock, edit: Any, dicts: bool, expected: str | None
) -> None:
    """An edited, truncated, compacted or reordered history is one compaction row."""
    session = Session()
    if dicts:
        session.messages.extend({"role": "user", "content": f"d{i}"} for i in range(6))
    else:
        session.add(6)
    store = JournalStore(tmp_path)
    async with writer_for(session, store, clock) as writer:
        session.add()
        await writer.write_now()  # an append: the writer now knows the prefix
        assert kinds(store)[-1] == "meta"
        edit(session)
        result = await writer.write_now()
        if expected is None:
            assert result == Skipped("unchanged")
        else:
            assert isinstance(result, Written)
            assert kinds(store)[-1] == expected
            assert store.statistics().compactions == 1
        assert loaded(store).state == as_json(session.state)
        session.add()
        await writer.write_now()  # and appends resume on top of the compaction
        assert kinds(store)[-2:] == ["message", "meta"]
        assert loaded(store).state == as_json(session.state)


async def test_struct_state_with_typed_load(tmp_path: Path, clock: FakeClock) -> None:
    """A msgspec Struct state appends like a dict state and loads back as the Struct."""
    chat = Chat(title="typed", messages=[Msg("user", "a")])
    store = JournalStore(tmp_path)
    async with CheckpointWriter(
        lambda: Snapshot("s1", chat), store, clock=clock, exit_hooks=False
    ) as writer:
        chat.messages.append(Msg("assistant", "b"))
        await writer.write_now()
        assert kinds(store)[2:] == ["message", "meta"]
    assert loaded(store, type=Chat).state == chat


async def test_state_without_a_transcript_is_compacted_each_change(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A state with no messages list is written whole (compaction rows), skipped unchanged."""
    state: dict[str, Any] = {"n": 0}
    store = JournalStore(tmp_path)
    async with CheckpointWriter(
        lambda: Snapshot("s1", state), store, clock=clock, exit_hooks=False
    ) as writer:
        state["n"] = 1
        await writer.write_now()
        assert await writer.write_now() == Skipped("unchanged")
        assert kinds(store) == ["header", "compaction", "compaction"]
        assert rows(store)[-1]["transcript"] is None
    assert loaded(store).state == {"n": 1}


async def test_custom_transcript_field(tmp_path: Path, clock: FakeClock) -> None:
    """Transcript('history') appends the messages found under another key."""
    state: dict[str, Any] = {"history": [{"role": "user", "content": "a"}]}
    store = JournalStore(tmp_path)
    async with CheckpointWriter(
        lambda: Snapshot("s1", state),
        store,
        transcript=Transcript("history", repair=False),
        clock=clock,
        exit_hooks=False,
    ) as writer:
        state["history"].append({"role": "assistant", "content": "b"})
        await writer.write_now()
        assert kinds(store)[2:] == ["message", "meta"]
    assert loaded(store).state == state


async def test_key_change_marks_the_old_journal_not_live(tmp_path: Path, clock: FakeClock) -> None:
    """When the source moves to a new key, the old journal gets a meta row with live=False."""
    session = Session("a")
    session.add(2)
    store = JournalStore(tmp_path)
    async with writer_for(session, store, clock) as writer:
        session.key = "b"
        writer.notify()
        await clock.advance(5.0)
        assert kinds(store, "a")[-1] == "meta"
        a = loaded(store, "a")
        assert a.meta.live is False
        assert a.state == as_json(session.state)
        assert loaded(store, "b").meta.live is True


async def test_journal_and_snapshot_load_to_equal_states(tmp_path: Path, clock: FakeClock) -> None:
    """The same session through a journal and two snapshots loads to equal states, each step."""
    session = Session()
    stores: list[Any] = [
        JournalStore(tmp_path / "journal", rewrite_min_bytes=600),
        FileStore(tmp_path / "snapshot"),
        FileStore(tmp_path / "cached"),
    ]
    cache = Transcript(repair=False, fingerprint=False)
    async with contextlib.AsyncExitStack() as stack:
        writers = [
            await stack.enter_async_context(
                writer_for(session, s, clock, transcript=cache if i == 2 else None)
            )
            for i, s in enumerate(stores)
        ]
        steps: list[Callable[[], object]] = [
            lambda: session.add(3),
            lambda: session.state.update(title="renamed"),
            lambda: session.messages.append({"role": "tool", "content": "a dict"}),
            lambda: session.add(1, "assistant"),
            lambda: _agent_compaction(session),
            lambda: session.add(5),
            lambda: _truncate(session),
            lambda: session.add(40),
        ]
        for step in steps:
            step()
            for w in writers:
                assert isinstance(await w.write_now(), Written)
            states = [loaded(s).state for s in stores]
            assert states[0] == states[1] == states[2] == as_json(session.state)
    assert store_rewrites(stores[0]) >= 2  # the small threshold made it rewrite
    typed = [loaded(s, type=dict[str, Any]).state for s in stores]
    assert typed[0] == typed[1] == typed[2]


def store_rewrites(store: JournalStore) -> int:
    return store.statistics().rewrites


# -- loading every row kind -------------------------------------------------------


def _line(obj: object) -> bytes:
    return msgspec.json.encode(obj) + b"\n"


def _meta(seq: int, **changes: Any) -> dict[str, Any]:
    return msgspec.to_builtins(meta(seq, **changes))  # type: ignore[no-any-return]


def hand_written(*extra: bytes) -> bytes:
    """A journal written by hand: every row kind, in a valid order."""
    return b"".join(
        [
            _line({"kind": "header", "format": 1, "meta": _meta(1)}),
            _line(
                {
                    "kind": "compaction",
                    "meta": _meta(1),
                    "transcript": "messages",
                    "state": {"title": "a", "messages": [{"c": 0}], "n": 1},
                }
            ),
            _line({"kind": "message", "message": {"c": 1}}),
            _line({"kind": "meta", "meta": _meta(2)}),
            _line({"kind": "message", "message": {"c": 2}}),
            _line(
                {
                    "kind": "state",
                    "meta": _meta(3),
                    "state": {"title": "b", "messages": None, "n": 2},
                }
            ),
            _line({"kind": "meta", "meta": _meta(4, pinned=True)}),
            *extra,
        ]
    )


def test_load_applies_every_row_kind(tmp_path: Path) -> None:
    """Messages append, a state row replaces the rest, the last row's meta wins."""
    (tmp_path / "s1.jsonl").write_bytes(hand_written())
    checkpoint = loaded(JournalStore(tmp_path))
    assert checkpoint.state == {"title": "b", "messages": [{"c": 0}, {"c": 1}, {"c": 2}], "n": 2}
    assert checkpoint.meta.seq == 4
    assert checkpoint.meta.pinned is True
    assert checkpoint.torn is None


def test_load_starts_from_the_last_compaction(tmp_path: Path) -> None:
    """Rows before the last compaction stay in the file but do not count."""
    later = _line(
        {
            "kind": "compaction",
            "meta": _meta(5),
            "transcript": "messages",
            "state": {"messages": [{"c": 9}]},
        }
    )
    closing = _line({"kind": "meta", "meta": _meta(6)})
    (tmp_path / "s1.jsonl").write_bytes(
        hand_written(later, _line({"kind": "message", "message": 7}), closing)
    )
    checkpoint = loaded(JournalStore(tmp_path))
    assert checkpoint.state == {"messages": [{"c": 9}, 7]}
    assert checkpoint.meta.seq == 6


def test_unknown_fields_in_rows_are_ignored(tmp_path: Path) -> None:
    """A newer writer's extra fields do not stop an older reader (format 1)."""
    future: dict[str, Any] = {**_meta(5), "future": 1}
    extra = _line({"kind": "meta", "meta": future, "also": [1]})
    (tmp_path / "s1.jsonl").write_bytes(hand_written(extra))
    assert loaded(JournalStore(tmp_path)).meta.seq == 5


# -- torn tails ----------------------------------------------------------------------

_TORN = {
    "partial-line": (b'{"kind":"message","mess', 8, "no newline"),
    "garbage-last-line": (b"\x00\x00\x00\x00\n", 8, "NUL bytes from line 8"),
    "unclosed-append": (
        _line({"kind": "message", "message": {"c": 3}}) + b'{"kind":"mes',
        8,
        "without the row that closes",
    ),
    "unclosed-complete": (_line({"kind": "message", "message": {"c": 3}}), 8, "1 message row"),
}


@pytest.mark.parametrize("case", list(_TORN), ids=list(_TORN))
def test_torn_tail_is_ignored_and_reported(tmp_path: Path, case: str) -> None:
    """An unfinished last append loads as the checkpoint before it, with a TornTail."""
    tail, line, reason = _TORN[case]
    good = hand_written()
    (tmp_path / "s1.jsonl").write_bytes(good + tail)
    checkpoint = loaded(JournalStore(tmp_path))
    assert checkpoint.meta.seq == 4
    assert checkpoint.state["messages"] == [{"c": 0}, {"c": 1}, {"c": 2}]
    torn = checkpoint.torn
    assert torn is not None
    assert (torn.line, torn.offset, torn.nbytes) == (line, len(good), len(tail))
    assert reason in torn.reason


async def test_torn_tail_is_truncated_when_a_writer_opens(tmp_path: Path, clock: FakeClock) -> None:
    """A writer opening the journal cuts the torn tail away, then appends after it."""
    store = JournalStore(tmp_path)
    session = Session()
    session.add(2)
    async with writer_for(session, store, clock):
        pass
    good = Path(store.location("s1")).read_bytes()
    Path(store.location("s1")).write_bytes(good + b'{"kind":"message","message":{"ro')
    assert loaded(JournalStore(tmp_path)).torn is not None
    reopened = JournalStore(tmp_path)
    async with writer_for(session, reopened, clock) as writer:
        assert Path(store.location("s1")).read_bytes()[: len(good)] == good
        session.add()
        await writer.write_now()
    checkpoint = loaded(reopened)
    assert checkpoint.torn is None
    assert checkpoint.state == as_json(session.state)


def test_a_reader_never_cuts_an_append_in_flight(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """While another writer holds the key, its unfinished batch is left to it by a reader's
    revision() and read_meta() (no cut, no warning); the holder's lock decides."""
    store = JournalStore(tmp_path)
    session = Session()
    session.add(2)
    with CheckpointWriter(session.snapshot, store, exit_hooks=False):
        pass
    path = Path(store.location("s1"))
    path.write_bytes(path.read_bytes() + b'{"kind":"message","message":{"ro')  # in flight
    in_flight = path.read_bytes()
    holder = JournalStore(tmp_path).lock("s1")  # the appending writer (another store object)
    try:
        reader = JournalStore(tmp_path)
        with caplog.at_level(logging.WARNING, logger="checkpointer"):
            assert reader.revision("s1") is not None
            assert reader.read_meta("s1") is not None
            assert loaded(reader).torn is not None
        assert path.read_bytes() == in_flight
        assert not [r for r in caplog.records if "changed behind" in r.getMessage()]
    finally:
        holder.release()
    with CheckpointWriter(session.snapshot, JournalStore(tmp_path), exit_hooks=False):
        assert path.read_bytes() != in_flight  # the next holder cut it
    assert loaded(JournalStore(tmp_path)).torn is None


def test_a_reader_keeps_up_with_appends_in_flight(tmp_path: Path) -> None:
    """revision() and read_meta() of a reader while a writer appends large batches: never
    an error for the file growing under the read; each answer is a revision written."""
    session = Session()
    writer = CheckpointWriter(session.snapshot, JournalStore(tmp_path), exit_hooks=False).open()
    reader = JournalStore(tmp_path)
    written: set[str] = set()
    errors: list[BaseException] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            try:
                seen = reader.revision("s1")
                meta = reader.read_meta("s1")
            except BaseException as exc:
                errors.append(exc)
                return
            assert seen is not None and meta is not None

    thread = threading.Thread(target=read)
    thread.start()
    try:
        for n in range(60):
            session.messages.append({"role": "user", "content": f"{n}" + "x" * 200_000})
            result = writer.flush_sync()
            assert isinstance(result, Written), result
            written.add(result.revision)
    finally:
        done.set()
        thread.join(30.0)
        writer.close()
    assert errors == []
    final = load(JournalStore(tmp_path), "s1")
    assert final is not None and reader.revision("s1") == final.meta.revision


# -- damage --------------------------------------------------------------------------


@pytest.mark.parametrize("line", [2, 3, 5])
def test_garbage_before_the_last_line_is_an_error_naming_it(tmp_path: Path, line: int) -> None:
    """A damaged line with more lines after it is a CheckpointError with its line number."""
    lines = hand_written().splitlines(keepends=True)
    lines[line - 1] = b'{"kind":"message","message":\n'
    (tmp_path / "s1.jsonl").write_bytes(b"".join(lines))
    with pytest.raises(CheckpointError, match=rf"line {line} is not a journal row") as info:
        load(JournalStore(tmp_path), "s1")
    assert info.value.path == str(tmp_path / "s1.jsonl")


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty"),
        (b'{"format":1,"meta":{},"state":{}}', "not a journal"),
        (_line({"kind": "header", "format": 1, "meta": _meta(1)}), "no complete checkpoint"),
        (_line({"kind": "header", "format": 2, "meta": _meta(1)}) + b"{}\n", "newer"),
        (_line({"format": 3, "future": True}) + b"{}\n", "newer"),
        (
            _line({"kind": "header", "format": 1, "meta": _meta(1)})
            + _line({"kind": "message", "message": 1})
            + _line({"kind": "meta", "meta": _meta(2)}),
            "before any compaction",
        ),
        (hand_written(_line({"kind": "header", "format": 1, "meta": _meta(9)})), "second header"),
    ],
    ids=["empty", "snapshot-file", "header-only", "newer", "newer-unknown", "no-compaction", "2nd"],
)
def test_files_that_are_not_journals_are_errors(tmp_path: Path, data: bytes, reason: str) -> None:
    """Empty files, other formats and impossible row orders are CheckpointErrors."""
    (tmp_path / "s1.jsonl").write_bytes(data)
    with pytest.raises(CheckpointError, match=reason):
        load(JournalStore(tmp_path), "s1")


def test_no_single_byte_corruption_crashes_load(tmp_path: Path) -> None:
    """Flip any byte: load returns a checkpoint or raises CheckpointError, nothing else."""
    good = hand_written()
    store = JournalStore(tmp_path)
    for at in range(0, len(good), 3):
        data = bytearray(good)
        data[at] ^= 0x5A
        (tmp_path / "s1.jsonl").write_bytes(bytes(data))
        with contextlib.suppress(CheckpointError):
            load(store, "s1")


async def test_a_damaged_journal_is_moved_aside_by_a_writer(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A writer never appends to a journal it cannot trust: it moves it aside, starts afresh."""
    lines = hand_written().splitlines(keepends=True)
    lines[2] = b"garbage\n"
    (tmp_path / "s1.jsonl").write_bytes(b"".join(lines))
    session = Session()
    session.add()
    store = JournalStore(tmp_path)
    async with writer_for(session, store, clock):
        pass
    aside = [p.name for p in tmp_path.iterdir() if p.name.startswith("s1.corrupt-")]
    assert len(aside) == 1
    assert loaded(store).state == as_json(session.state)


def test_missing_journal_loads_as_none(tmp_path: Path) -> None:
    """No file, no checkpoint."""
    assert load(JournalStore(tmp_path), "s1") is None


def test_unreadable_journal_is_an_error(tmp_path: Path) -> None:
    """A directory in place of the journal is a CheckpointError naming the path."""
    (tmp_path / "s1.jsonl").mkdir()
    with pytest.raises(CheckpointError, match="cannot be read"):
        load(JournalStore(tmp_path), "s1")


# -- bounded growth and failures ----------------------------------------------------------


def test_rewrite_keeps_the_journal_within_its_threshold(tmp_path: Path) -> None:
    """After every checkpoint the file is within max(min, factor * live); rewrites happen."""
    store = JournalStore(tmp_path, rewrite_factor=2.0, rewrite_min_bytes=2000)
    session = Session()
    for seq in range(1, 200):
        session.add()
        if seq % 50 == 0:
            _agent_compaction(session)
        session.commit(store, seq)
        stats = store.statistics("s1")
        assert stats.size == os.path.getsize(store.location("s1"))
        assert stats.live is not None
        assert stats.threshold == max(2000, int(2.0 * stats.live))
        assert stats.size <= stats.threshold
    assert store.statistics().rewrites >= 3
    assert loaded(store).state == as_json(session.state)


def test_a_rewrite_leaves_header_and_one_compaction(tmp_path: Path) -> None:
    """A rewritten journal is a fresh file: a header and a single compaction row."""
    store = JournalStore(tmp_path, rewrite_min_bytes=0, rewrite_factor=1.5)
    session = Session()
    session.grow(store, 10)
    for seq in range(2, 40):
        session.add()
        session.commit(store, seq)
        if kinds(store) == ["header", "compaction"] and seq > 2:
            break
    else:
        pytest.fail("the journal was never rewritten")
    assert loaded(store).state == as_json(session.state)
    assert rows(store)[0]["meta"]["seq"] == seq


@pytest.mark.parametrize("bad", [1.0, 0.5, float("inf"), "2"])
def test_rewrite_factor_must_exceed_one(tmp_path: Path, bad: Any) -> None:
    """A factor that would rewrite at every checkpoint (or never) is a ValueError."""
    with pytest.raises(ValueError, match="rewrite_factor"):
        JournalStore(tmp_path, rewrite_factor=bad)


def test_stale_staged_append_becomes_a_compaction(tmp_path: Path) -> None:
    """An append staged before another commit is written as a compaction, never duplicated."""
    store = JournalStore(tmp_path)
    session = Session()
    session.grow(store, 3)
    session.add()
    older = store.stage("s1", session.state)
    session.add()
    newer = store.stage("s1", session.state)
    store.commit("s1", meta(2), newer, expected=prev(2))
    store.commit(
        "s1", meta(3), older, expected=prev(3)
    )  # the writer would skip it; the store stays correct
    assert kinds(store)[-1] == "compaction"
    assert len(loaded(store).state["messages"]) == 4


def test_a_journal_changed_behind_the_store_is_reread(tmp_path: Path) -> None:
    """Another store appending to the same key is noticed; ours writes a compaction."""
    ours, theirs = JournalStore(tmp_path), JournalStore(tmp_path)
    session = Session()
    session.grow(ours, 2)
    theirs.read_meta("s1")
    other = {"title": "theirs", "messages": [*session.messages, Msg("user", "x")]}
    theirs.commit("s1", meta(2), theirs.stage("s1", other), expected=prev(2))
    session.add()
    session.commit(ours, 3)
    assert kinds(ours)[-1] == "compaction"
    assert loaded(ours).state == as_json(session.state)


def test_failed_append_is_rewritten_from_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a failed fsync the file is never fsynced again: the next commit rewrites it."""
    store = JournalStore(tmp_path)
    session = Session()
    session.grow(store, 2)
    inode = os.stat(store.location("s1")).st_ino
    real_fsync = os.fsync

    def eio(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    session.add()
    staged = store.stage("s1", session.state)
    monkeypatch.setattr(os, "fsync", eio)
    with pytest.raises(OSError, match="Input/output"):
        store.commit("s1", meta(2), staged, expected=prev(2))
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert loaded(store).meta.seq == 1  # the failed append was cut off again
    session.add()
    store.commit("s1", meta(3), store.stage("s1", session.state), expected="r1")
    assert kinds(store) == ["header", "compaction"]
    assert os.stat(store.location("s1")).st_ino != inode
    assert loaded(store).state == as_json(session.state)


async def test_writer_reports_a_failed_append_and_recovers(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failing append is a Failed value; the retry rewrites the journal, nothing is lost."""
    session = Session()
    session.add()
    store = JournalStore(tmp_path)
    real_fsync = os.fsync
    failing = {"on": False}

    def fsync(fd: int) -> None:
        if failing["on"]:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    async with writer_for(
        session,
        store,
        clock,
        limits=Limits(retry_initial=1.0),
    ) as writer:
        failing["on"] = True
        session.add()
        result = await writer.write_now()
        assert result.__class__.__name__ == "Failed"
        failing["on"] = False
        writer.notify()
        await clock.advance(10.0)
        assert writer.statistics().failure_streak == 0
        assert loaded(store).state == as_json(session.state)


def test_store_api_validates_keys(tmp_path: Path) -> None:
    """Keys are checked like FileStore's: no path tricks."""
    store = JournalStore(tmp_path)
    with pytest.raises(ValueError, match="invalid key"):
        store.commit("../x", meta(1), store.stage("../x", {"messages": []}), expected=prev(1))
    assert store.keys() == []
    store.commit("ok", meta(1, key="ok"), store.stage("ok", {"messages": []}), expected=prev(1))
    assert store.keys() == ["ok"]
    assert store.delete("ok") is True
    assert store.keys() == []


# -- the example and the command line ------------------------------------------------


def test_example_and_command_line_read_journals(tmp_path: Path) -> None:
    """examples/journal_session.py runs; `checkpointer ls` and `verify` read its journal."""
    env = child_env()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *args], capture_output=True, text=True, env=env, timeout=60
        )

    example = run(str(ROOT / "examples" / "journal_session.py"), "--root", str(tmp_path))
    assert example.returncode == 0, example.stderr
    assert "compactions 1" in example.stdout
    listing = run("-m", "checkpointer", "ls", str(tmp_path))
    assert listing.returncode == 0, listing.stderr
    assert "demo-journal" in listing.stdout
    verified = run("-m", "checkpointer", "verify", str(tmp_path))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "1 ok, 0 bad" in verified.stdout
    with open(tmp_path / "demo-journal.jsonl", "ab") as f:
        f.write(b"garbage\n" + _line({"kind": "meta", "meta": _meta(99, key="demo-journal")}))
    damaged = run("-m", "checkpointer", "verify", str(tmp_path))
    assert damaged.returncode == 1
    assert "is not a journal row" in damaged.stdout


def test_a_stage_reentered_while_the_witnesses_are_busy_does_not_wait(tmp_path: Path) -> None:
    """Staging while the witness list is in use (a re-entrant flush) writes a compaction."""
    store = JournalStore(tmp_path)
    session = Session()
    session.grow(store, 2)
    session.add()
    with store._witness_lock:  # as if a signal handler interrupted a stage holding it
        staged = store.stage("s1", session.state)
    store.commit("s1", meta(2), staged, expected=prev(2))
    assert kinds(store)[-1] == "compaction"
    assert loaded(store).state == as_json(session.state)


async def test_state_versions_and_migrations_apply_to_journals(
    tmp_path: Path, clock: FakeClock
) -> None:
    """load(state_version=, migrations=) migrates a journal's state like a snapshot's."""
    session = Session()
    session.add(2)
    store = JournalStore(tmp_path)
    async with writer_for(session, store, clock, state_version=1) as writer:
        session.add()
        await writer.write_now()
    migrated = loaded_versioned(store, 2, {1: lambda s: {**s, "title": s["title"].upper()}})
    assert migrated.state["title"] == "T"
    assert len(migrated.state["messages"]) == 3
    assert migrated.meta.state_version == 1
    with pytest.raises(CheckpointError, match="newer than this program"):
        load(store, "s1", state_version=0)


def loaded_versioned(store: JournalStore, version: int, migrations: Any) -> Checkpoint[Any]:
    checkpoint = load(store, "s1", state_version=version, migrations=migrations)
    assert checkpoint is not None
    return checkpoint
