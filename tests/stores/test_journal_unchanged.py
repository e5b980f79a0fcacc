"""What a journal counts as unchanged: the same bytes, never only ``==``.

Real threads, real files: a flush racing a write in flight, type-only edits,
tuple transcripts, and a flush bounded by exit_timeout while a commit is
stuck in the journal's lock.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from checkpointer import (
    CheckpointWriter,
    JournalStore,
    Limits,
    Skipped,
    Snapshot,
    Written,
    load,
)
from checkpointer._stores import atomic as _atomic
from checkpointer._stores.base import commit_deadline
from checkpointer._stores.journal import file as _journal
from checkpointer._stores.journal import staging as _staging
from tests.conftest import FakeClock
from tests.stores.test_journal import Msg, as_json, kinds, loaded, meta, prev, rows

WAIT = 60.0  # seconds a test waits on another thread before it calls it a hang


class Gate(JournalStore):
    """A JournalStore whose next commit, once ``hold`` is set, waits for ``release``.

    ``entered`` is set when that commit starts waiting; ``staged`` when a
    stage happens while it waits (a flush_sync from another thread).
    """

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.hold = False
        self.entered = threading.Event()
        self.release = threading.Event()
        self.staged = threading.Event()

    def stage(self, key: str, state: Any, transcript: Any = None) -> Any:
        staged = super().stage(key, state, transcript)
        if self.entered.is_set():
            self.staged.set()
        return staged

    def commit(self, key: str, meta: Any, staged: Any, **kw: Any) -> int:
        if self.hold:
            self.hold = False
            self.entered.set()
            assert self.release.wait(WAIT)
        return super().commit(key, meta, staged, **kw)


def _edit_in_place(messages: list[Any]) -> None:
    messages[-1]["content"] = "FINAL ANSWER"


def _replace(messages: list[Any]) -> None:
    messages[-1] = {"role": "assistant", "content": "FINAL ANSWER"}


def _nothing(messages: list[Any]) -> None:
    pass


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("edit", "last"),
    [(_edit_in_place, "FINAL ANSWER"), (_replace, "FINAL ANSWER"), (_nothing, "draft")],
    ids=["edit-in-place", "replace", "unchanged"],
)
async def test_a_flush_staged_while_a_write_is_in_flight_is_judged_on_its_bytes(
    tmp_path: Path, edit: Callable[[list[Any]], None], last: str
) -> None:
    """flush_sync from a thread, staged while a write of the key is in flight, after an
    edit of the last message, is Written and the disk holds the edit; unchanged, Skipped."""
    messages: list[Any] = [{"role": "user", "content": "question"}]
    state = {"title": "t", "messages": messages}
    store = Gate(tmp_path)
    async with CheckpointWriter(
        lambda: Snapshot("s1", state),
        store,
        exit_hooks=False,
        limits=Limits(exit_timeout=WAIT),
    ) as writer:
        messages.append({"role": "assistant", "content": "draft"})
        store.hold = True
        flushed: list[Any] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(writer.write_now)  # stages the draft, then waits in commit
            assert await anyio.to_thread.run_sync(store.entered.wait, WAIT)
            edit(messages)
            flush = threading.Thread(target=lambda: flushed.append(writer.flush_sync()))
            flush.start()
            assert await anyio.to_thread.run_sync(store.staged.wait, WAIT)
            store.release.set()  # the draft is written; then the flush runs
            await anyio.to_thread.run_sync(flush.join, WAIT)
        assert not flush.is_alive()
        if last == "draft":
            assert flushed == [Skipped("unchanged")]
        else:
            assert isinstance(flushed[0], Written)
        assert loaded(store).state == as_json(state)
        on_disk = Path(store.location("s1")).read_bytes()
        assert on_disk.count(b'"FINAL ANSWER"') == (last == "FINAL ANSWER")
    assert loaded(store).state["messages"][-1]["content"] == last


def test_a_stale_append_with_the_same_messages_is_a_meta_row_not_a_compaction(
    tmp_path: Path,
) -> None:
    """A delta staged before another commit appended the same messages is rebased on
    it: a meta row (a signal flush's live=False), not a rewrite of the history."""
    store = JournalStore(tmp_path)
    messages = [Msg("user", f"m{i}") for i in range(3)]
    state = {"title": "t", "messages": messages}
    store.commit("s1", meta(1), store.stage("s1", state), expected=prev(1))
    messages.append(Msg("assistant", "a"))
    in_flight = store.stage("s1", state)
    flush = store.stage("s1", state)  # staged before in_flight is committed
    assert flush.content() == in_flight.content()
    store.commit("s1", meta(2), in_flight, expected=prev(2))
    assert flush.content() == in_flight.content()  # the same state: the writer skips it
    store.commit("s1", meta(3, live=False), flush, expected=prev(3))  # ... unless the meta changed
    assert kinds(store) == ["header", "compaction", "message", "meta", "meta"]
    assert loaded(store).meta.live is False
    assert loaded(store).state == as_json(state)


def test_a_delta_stored_as_a_compaction_leaves_no_twin_that_looks_unchanged(
    tmp_path: Path,
) -> None:
    """Two deltas staged on one base (a message edited in place between them), the first
    stored as a compaction (the journal outgrown): the second is not 'unchanged'."""
    store = JournalStore(tmp_path, rewrite_factor=1.0001, rewrite_min_bytes=0)
    messages: list[Any] = [Msg("user", f"m{i}") for i in range(3)]
    state = {"title": "t", "messages": messages}
    store.commit("s1", meta(1), store.stage("s1", state), expected=prev(1))
    edited = {"role": "tool", "n": 1}
    messages.append(edited)
    in_flight = store.stage("s1", state)
    edited.update(role="user", n=False)  # edited in place while in_flight is unstored
    flush = store.stage("s1", state)
    written = in_flight.content()  # what the writer notes for in_flight, before its commit
    store.commit("s1", meta(2), in_flight, expected=prev(2))
    assert kinds(store) == ["header", "compaction"]  # a rewrite: the append outgrew it
    assert flush.content() != written  # another state: the writer writes it


# -- type-only changes ------------------------------------------------------------


class Typed(msgspec.Struct):
    role: str
    n: Any


class Frozen(msgspec.Struct, frozen=True):
    role: str
    n: Any


def typed_chat(kind: type) -> Any:
    """The session's schema with ``n`` typed ``kind``: what a typed load() checks."""
    row = msgspec.defstruct("Row", [("role", str), ("n", kind)])
    return msgspec.defstruct("TypedChat", [("title", str), ("messages", list[row])])  # type: ignore[valid-type]


TYPE_CHANGES = [(2.0, 2), (0, False), (1, True), (2, 2.0), (True, 1)]


@pytest.mark.anyio
@pytest.mark.parametrize(("before", "after"), TYPE_CHANGES, ids=lambda v: repr(v))
@pytest.mark.parametrize("where", [0, -1], ids=["earlier", "last"])
@pytest.mark.parametrize("shape", ["dict-in-place", "struct-in-place", "frozen-replaced"])
async def test_a_type_only_change_is_written(
    tmp_path: Path, clock: FakeClock, before: Any, after: Any, where: int, shape: str
) -> None:
    """A value that equals (==) its old one but encodes differently (2.0 -> 2, 0 -> False)
    is a change, edited in place or replaced: written, and a typed load() gets it back."""

    def message(n: Any) -> Any:
        if shape == "dict-in-place":
            return {"role": "tool", "n": n}
        return Typed("tool", n) if shape == "struct-in-place" else Frozen("tool", n)

    # The other messages hold the new value already, so one typed schema fits them all.
    messages = [message(after), message(before)] if where == 0 else [message(after)]
    state = {"title": "t", "messages": messages}
    store = JournalStore(tmp_path)
    async with CheckpointWriter(
        lambda: Snapshot("s1", state), store, clock=clock, exit_hooks=False
    ) as writer:
        # An append first: the earlier message was in the compaction, the last one
        # comes in this append.
        messages.append(message(after) if where == 0 else message(before))
        assert isinstance(await writer.write_now(), Written)
        assert kinds(store)[-2:] == ["message", "meta"]
        at = 1 if where == 0 else len(messages) - 1
        if shape == "dict-in-place":
            messages[at]["n"] = after
        elif shape == "struct-in-place":
            messages[at].n = after
        else:
            messages[at] = message(after)
        result = await writer.write_now()
        assert isinstance(result, Written), result
        assert kinds(store)[-1] == "compaction"
        checkpoint = load(store, "s1", typed_chat(type(after)))
        assert checkpoint is not None
        value = checkpoint.state.messages[at].n
        assert (value, type(value)) == (after, type(after))
        assert await writer.write_now() == Skipped("unchanged")


@pytest.mark.anyio
@pytest.mark.parametrize("shape", ["str-only", "with-numbers", "dicts"])
async def test_a_message_replaced_by_one_that_encodes_the_same_is_unchanged(
    tmp_path: Path, clock: FakeClock, shape: str
) -> None:
    """Replacing messages by new objects with the same bytes is Skipped, and appends go on:
    settled messages of strings (list ==), with numbers (identity scan), and dicts."""

    def message(i: int) -> Any:
        if shape == "str-only":
            return Msg("user", f"m{i}")
        return Frozen("user", i) if shape == "with-numbers" else {"role": "user", "n": i}

    messages = [message(i) for i in range(5)]
    state = {"title": "t", "messages": messages}
    store = JournalStore(tmp_path)
    async with CheckpointWriter(
        lambda: Snapshot("s1", state), store, clock=clock, exit_hooks=False
    ) as writer:
        messages.append(message(5))
        await writer.write_now()
        messages[1] = message(1)
        messages[-1] = message(5)
        assert await writer.write_now() == Skipped("unchanged")
        messages.append(message(6))
        assert isinstance(await writer.write_now(), Written)
        assert kinds(store)[-2:] == ["message", "meta"]
        assert await writer.write_now() == Skipped("unchanged")
    assert loaded(store).state == as_json(state)


def test_an_unsettled_message_edited_in_place_is_a_compaction(tmp_path: Path) -> None:
    """An in-place edit of a dict message, earlier or last, is seen at the next stage."""
    store = JournalStore(tmp_path)
    messages: list[Any] = [{"role": "user", "content": f"d{i}"} for i in range(4)]
    state = {"title": "t", "messages": messages}
    store.commit("s1", meta(1), store.stage("s1", state), expected=prev(1))
    for seq, at in [(2, 0), (3, -1)]:
        messages[at]["content"] = f"edited {seq}"
        staged = store.stage("s1", state)
        assert isinstance(staged, _staging.Full)
        store.commit("s1", meta(seq), staged, expected=prev(seq))
        assert loaded(store).state == as_json(state)


@pytest.mark.parametrize("scratch_busy", [False, True])
def test_dict_prefix_check_shared_buffer(tmp_path: Path, scratch_busy: bool) -> None:
    """The unsettled prefix check, through the store's one reused encode buffer (keys of
    different lengths take turns in it) or past it while it is busy: an in-place edit of
    an earlier dict is a compaction, an untouched prefix an append."""
    store = JournalStore(tmp_path)
    chats: dict[str, list[Any]] = {
        key: [{"role": "user", "content": f"{key} {i}"} for i in range(n)]
        for key, n in (("long", 300), ("short", 3))
    }
    for key, messages in chats.items():
        store.commit(key, meta(1), store.stage(key, {"messages": messages}), expected=prev(1))
    if scratch_busy:
        store._scratch_lock.acquire()
    try:
        for seq in (2, 3):
            for key, messages in chats.items():  # long then short: the buffer shrinks
                messages.append({"role": "assistant", "content": f"reply {seq}"})
                staged = store.stage(key, {"messages": messages})
                assert isinstance(staged, _staging.Delta), (key, seq)
                store.commit(key, meta(seq), staged, expected=prev(seq))
        for key, messages in chats.items():
            messages[1]["content"] = "edited"
            staged = store.stage(key, {"messages": messages})
            assert isinstance(staged, _staging.Full), key
            store.commit(key, meta(4), staged, expected=prev(4))
    finally:
        if scratch_busy:
            store._scratch_lock.release()
    for key, messages in chats.items():
        checkpoint = load(store, key)
        assert checkpoint is not None and checkpoint.state == as_json({"messages": messages})


# -- tuple transcripts --------------------------------------------------------------


class Chat(msgspec.Struct, frozen=True):
    """The natural immutable session: a frozen Struct with a tuple of messages."""

    title: str
    messages: tuple[Msg, ...]


class ListChat(msgspec.Struct):
    title: str
    messages: list[Msg]


@pytest.mark.anyio
async def test_a_tuple_transcript_appends_like_a_list(tmp_path: Path, clock: FakeClock) -> None:
    """A +1 message checkpoint of a tuple transcript writes the bytes the list one writes
    (a message row and a meta row, not the 20,000 messages again); idle, it is Skipped."""
    history = tuple(Msg("user", f"message {i}") for i in range(20_000))
    written: dict[str, int] = {}
    for shape in ("tuple", "list"):
        # The session, replaced whole at each turn when it is immutable.
        current: dict[str, Any] = {
            "chat": Chat("t", history) if shape == "tuple" else ListChat("t", list(history))
        }
        store = JournalStore(tmp_path / shape)
        source = functools.partial(lambda c: Snapshot("s1", c["chat"]), current)
        async with CheckpointWriter(source, store, clock=clock, exit_hooks=False) as writer:
            chat, new = current["chat"], Msg("assistant", "one more")
            if shape == "tuple":
                current["chat"] = msgspec.structs.replace(chat, messages=(*chat.messages, new))
            else:
                chat.messages.append(new)
            result = await writer.write_now()
            assert isinstance(result, Written)
            written[shape] = result.nbytes
            assert kinds(store)[2:] == ["message", "meta"]
            assert await writer.write_now() == Skipped("unchanged")
            assert writer.flush_sync() == Skipped("unchanged")
        assert loaded(store, type=type(current["chat"])).state == current["chat"]
    assert written["tuple"] == written["list"] < 1000


# -- exit_timeout ---------------------------------------------------------------------


@pytest.fixture
def stuck_writes(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, threading.Event]]:
    """Once ``arm`` is set, the journal's next append blocks inside write(2) (the file
    open, the journal's lock held) until ``release`` is set."""
    events = {name: threading.Event() for name in ("arm", "entered", "release")}
    real = _atomic.write_all

    def write_all(fd: int, pieces: Sequence[bytes]) -> int:
        if events["arm"].is_set() and not events["entered"].is_set():
            events["entered"].set()
            events["release"].wait(WAIT)
        return real(fd, pieces)

    monkeypatch.setattr(_journal, "write_all", write_all)
    yield events
    events["release"].set()


@pytest.mark.anyio
async def test_a_signal_flush_does_not_wait_past_exit_timeout_for_a_stuck_commit(
    tmp_path: Path, clock: FakeClock, stuck_writes: dict[str, threading.Event]
) -> None:
    """With a commit stuck in write(2) holding the journal's lock, flush_sync("signal")
    returns while it is still stuck (exit_timeout=0.2), its state durably on disk."""
    messages: list[Any] = [Msg("user", "question")]
    state = {"title": "t", "messages": messages}
    store = JournalStore(tmp_path)
    async with writer_for_state(state, store, clock, limits=Limits(exit_timeout=0.2)) as writer:
        messages.append(Msg("assistant", "a1"))
        stuck_writes["arm"].set()
        done: list[Any] = []
        async with anyio.create_task_group() as tg:

            async def write() -> None:
                done.append(await writer.write_now())

            tg.start_soon(write)
            assert await anyio.to_thread.run_sync(stuck_writes["entered"].wait, WAIT)
            messages.append(Msg("assistant", "a2"))
            flushed: list[Any] = []
            flush = threading.Thread(target=lambda: flushed.append(writer.flush_sync("signal")))
            flush.start()
            await anyio.to_thread.run_sync(flush.join, WAIT)
            assert not flush.is_alive(), "the flush waited for the stuck commit"
            assert done == []  # the stuck commit is still stuck
            assert isinstance(flushed[0], Written)
            checkpoint = loaded(store)
            assert checkpoint.state == as_json(state)
            assert checkpoint.meta.live is False
            stuck_writes["release"].set()
        assert kinds(store)[:2] == ["header", "compaction"]
    assert loaded(store).state == as_json(state)


def writer_for_state(
    state: dict[str, Any], store: JournalStore, clock: FakeClock, **kw: Any
) -> CheckpointWriter[Any]:
    kw.setdefault("exit_hooks", False)
    return CheckpointWriter(lambda: Snapshot("s1", state), store, clock=clock, **kw)


def test_store_calls_under_a_deadline_raise_timeout_error_naming_the_file(
    tmp_path: Path,
) -> None:
    """read_meta and update_meta past a commit deadline raise TimeoutError naming the path."""
    store = JournalStore(tmp_path)
    store.commit("s1", meta(1), store.stage("s1", {"messages": []}), expected=prev(1))
    with store._lock, commit_deadline(0.01):
        with pytest.raises(TimeoutError, match=r"s1\.jsonl.*exit_timeout"):
            store.read_meta("s1")
        with pytest.raises(TimeoutError, match=r"s1\.jsonl"):
            store.update_meta("s1", meta(2), expected="r1")
    assert store.read_meta("s1") == meta(1)  # no deadline: it waits, and gets the lock
    assert rows(store)[-1]["kind"] == "compaction"
