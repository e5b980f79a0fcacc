"""Encoding a state message by message: settled messages, the split, the cache, writev."""

from __future__ import annotations

import datetime
import enum
import errno
import os
import uuid
import zoneinfo
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkpointer import FileStore, JournalStore, Meta, Transcript, load
from checkpointer._stores.atomic import write_all
from checkpointer._stores.encoding import is_settled, state_pieces
from checkpointer._stores.envelopes import Envelopes

NOW = datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)


class Msg(msgspec.Struct, frozen=True):
    role: str
    content: str
    n: int = 0


class WithList(msgspec.Struct, frozen=True):
    parts: list[str]


class WithTuple(msgspec.Struct, frozen=True):
    parts: tuple[Any, ...]
    at: datetime.datetime | None = None


class Loose(msgspec.Struct):
    content: str


class Colour(enum.Enum):
    RED = "red"
    LIST = ("a", "b")


class Renamed(msgspec.Struct, rename="camel", tag=True):
    chat_history: list[Any]
    title: str = ""


class AsArray(msgspec.Struct, array_like=True):
    messages: list[Any]


class CustomTz(datetime.tzinfo):
    def utcoffset(self, dt: datetime.datetime | None) -> datetime.timedelta:
        return datetime.timedelta(hours=1)

    def dst(self, dt: datetime.datetime | None) -> datetime.timedelta:
        return datetime.timedelta(0)

    def tzname(self, dt: datetime.datetime | None) -> str:
        return "custom"


class Text(str):
    pass


def meta(seq: int, key: str = "k") -> Meta:
    return Meta(key=key, seq=seq, created_at=NOW, updated_at=NOW, live=True, revision=f"r{seq}")


def prev(seq: int) -> str | None:
    """The revision stored before the write of ``meta(seq)``."""
    return None if seq == 1 else f"r{seq - 1}"


@pytest.mark.parametrize(
    ("obj", "settled"),
    [
        ("text", True),
        (3, True),
        (2.5, True),
        (None, True),
        (b"raw", True),
        (Decimal("1.5"), True),
        (uuid.UUID(int=7), True),
        (NOW, True),
        (datetime.datetime(2025, 1, 1, tzinfo=zoneinfo.ZoneInfo("Europe/Paris")), True),
        (datetime.datetime(2025, 1, 1, tzinfo=CustomTz()), False),
        (datetime.date(2025, 1, 1), True),
        (Msg("user", "hi"), True),
        (WithTuple((Msg("a", "b"),), NOW), True),
        (WithTuple((Msg("a", "b"),)), True),
        (("a", 1, (None, b"x")), True),
        (frozenset({"a", 1}), True),
        (Colour.RED, True),
        (Colour.LIST, True),
        (WithList(["a"]), False),
        (WithTuple((WithList(["a"]),)), False),
        (("a", ["b"]), False),
        ({"role": "user"}, False),
        (["a"], False),
        (Loose("x"), False),
        (Text("a str subclass"), False),
        (object(), False),
    ],
)
def test_settled_means_nothing_reachable_can_change(obj: object, settled: bool) -> None:
    """Only deeply immutable values of known types count as settled (cacheable)."""
    assert is_settled(obj) is settled


def test_deep_nesting_is_not_settled() -> None:
    """Nesting deeper than the limit is treated as unsettled, conservatively."""
    value: object = "leaf"
    for _ in range(40):
        value = (value,)
    assert is_settled(value) is False


@pytest.mark.parametrize(
    "state",
    [
        {"messages": [], "title": "t"},
        {"title": "t", "messages": [Msg("user", "a"), {"role": "tool", "x": [1, 2]}], "n": 3},
        {"messages": (Msg("user", "a"),)},
        Renamed(chat_history=[Msg("user", 'q"u\\ote'), {"k": None}], title="x"),
    ],
    ids=["dict-empty", "dict-mixed", "dict-tuple", "struct-renamed-tagged"],
)
def test_spliced_state_is_the_bytes_of_one_encode(state: Any) -> None:
    """Head, messages and tail joined give exactly msgspec.json.encode(state)."""
    field = "chat_history" if isinstance(state, Renamed) else "messages"
    transcript = Transcript(field)
    split = transcript.split(state)
    assert split is not None
    chunks, _ = transcript.encode_messages(split.messages)
    joined = b"".join(state_pieces(split.head, chunks, split.tail))
    assert joined == msgspec.json.encode(state)


@pytest.mark.parametrize(
    "state",
    [
        {"title": "no transcript here"},
        {"messages": "not a list"},
        AsArray(messages=[]),
        ["a", "list", "state"],
        42,
    ],
    ids=["missing", "not-a-list", "array-like-struct", "list-state", "scalar"],
)
def test_states_without_a_transcript_are_not_split(state: Any) -> None:
    """A state with no messages list where the transcript says is encoded whole."""
    assert Transcript().split(state) is None


def test_transcript_field_must_be_a_name() -> None:
    """An empty field name is a ValueError at construction."""
    with pytest.raises(ValueError, match="field"):
        Transcript("")


def test_settled_messages_are_encoded_once() -> None:
    """Across checkpoints, each settled message is encoded once; unsettled ones each time."""
    transcript = Transcript()
    messages: list[Any] = [Msg("user", f"m{i}") for i in range(10)]
    messages.append({"role": "tool", "content": "a dict"})
    for _ in range(5):
        transcript.encode_messages(messages)
    assert transcript.misses == 10 + 5  # 10 settled once, the dict 5 times
    assert transcript.cached() == 10


def test_cache_is_pruned_when_it_doubles() -> None:
    """Messages dropped from the transcript leave the cache once it is twice the transcript."""
    transcript = Transcript()
    for generation in range(3):
        messages = [Msg("user", f"{generation}-{i}") for i in range(1000)]
        transcript.encode_messages(messages)
        transcript.prune(messages)
    assert transcript.cached() <= 2 * 1000 + 1024
    assert transcript.cached() >= 1000


class _Ops:
    """Random edits of a session: appends, replacements, in-place mutations, deletions."""

    def __init__(self) -> None:
        self.messages: list[Any] = []
        self.state: dict[str, Any] = {"title": "t", "messages": self.messages}
        self.counter = 0

    def apply(self, op: tuple[str, int]) -> None:
        kind, at = op
        self.counter += 1
        c = self.counter
        m = self.messages
        if kind == "append_settled":
            m.append(Msg("user", f"s{c}", c))
        elif kind == "append_dict":
            m.append({"role": "tool", "content": f"d{c}", "parts": [c]})
        elif kind == "append_unsettled_struct":
            m.append(WithList([f"u{c}"]))
        elif not m:
            return
        elif kind == "replace":
            m[at % len(m)] = Msg("assistant", f"r{c}", c)
        elif kind == "mutate":
            target = m[at % len(m)]
            if isinstance(target, dict):
                target["content"] = f"mutated {c}"
                target["parts"].append(c)
            elif isinstance(target, WithList):
                target.parts.append(f"mutated {c}")  # a frozen Struct's list changes
        elif kind == "delete":
            del m[at % len(m)]
        elif kind == "compact":
            m[: len(m) // 2] = [Msg("system", f"summary {c}")]
        elif kind == "title":
            self.state["title"] = f"title {c}"
        elif kind == "churn":
            # Drop and recreate objects so that freed ids may be reused.
            m[:] = [Msg(x.role, x.content, x.n) if isinstance(x, Msg) else x for x in m]


OPS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "append_settled",
                "append_settled",
                "append_dict",
                "append_unsettled_struct",
                "replace",
                "mutate",
                "delete",
                "compact",
                "title",
                "churn",
            ]
        ),
        st.integers(0, 1000),
    ),
    max_size=40,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=OPS)
def test_cache_never_serves_stale_bytes(tmp_path_factory: pytest.TempPathFactory, ops: Any) -> None:
    """After any edits, the snapshot on disk is byte for byte one encode of the state."""
    root = tmp_path_factory.mktemp("cache")
    store = FileStore(root)
    codec = Envelopes(store, Transcript())
    session = _Ops()
    for seq, op in enumerate(ops, 1):
        session.apply(op)
        codec.commit("k", meta(seq), codec.stage("k", session.state), expected=prev(seq))
        data = (root / "k.json").read_bytes()
        state_json = data[data.index(b',"state":') + len(b',"state":') : -1]
        assert state_json == msgspec.json.encode(session.state)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=OPS)
def test_journal_always_loads_the_session(
    tmp_path_factory: pytest.TempPathFactory, ops: Any
) -> None:
    """After any edits, the journal loads to the state in memory (as JSON values)."""
    root = tmp_path_factory.mktemp("journal")
    store = JournalStore(root, rewrite_min_bytes=2048)
    session = _Ops()
    for seq, op in enumerate(ops, 1):
        session.apply(op)
        store.commit("k", meta(seq), store.stage("k", session.state), expected=prev(seq))
        checkpoint = load(store, "k")
        assert checkpoint is not None
        assert checkpoint.torn is None
        assert checkpoint.meta.seq == seq
        assert checkpoint.state == msgspec.json.decode(msgspec.json.encode(session.state))


def test_a_replaced_message_gets_its_own_bytes(tmp_path: Path) -> None:
    """Replacing a settled message by a new object, even an equal one, encodes the new one."""
    codec = Envelopes(FileStore(tmp_path), Transcript())
    messages: list[Any] = [Msg("user", "a", 1), Msg("user", "b", 2)]
    state = {"messages": messages}
    codec.commit("k", meta(1), codec.stage("k", state), expected=prev(1))
    messages[0] = Msg("user", "a", True)  # == the old one (1 == True), encodes differently
    codec.commit("k", meta(2), codec.stage("k", state), expected=prev(2))
    assert b'"n":true' in (tmp_path / "k.json").read_bytes()


def test_state_pieces_of_no_messages() -> None:
    """An empty transcript is an empty JSON array between head and tail."""
    assert b"".join(state_pieces(b'{"m":', [], b"}")) == b'{"m":[]}'


def test_write_all_survives_short_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """writev that writes a few bytes at a time still writes every piece, in order."""
    real = os.write

    def stingy(fd: int, buffers: Any) -> int:  # a short write: a prefix of the whole
        return real(fd, b"".join(bytes(b) for b in buffers)[:37])

    monkeypatch.setattr(os, "writev", stingy)
    pieces = [f"piece-{i};".encode() for i in range(1100)] + [b"", b"end"]
    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        assert write_all(fd, pieces) == sum(map(len, pieces))
    finally:
        os.close(fd)
    assert path.read_bytes() == b"".join(pieces)


def test_write_all_refuses_a_zero_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writev that makes no progress is an OSError, not an endless loop."""
    monkeypatch.setattr(os, "writev", lambda fd, buffers: 0)
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with pytest.raises(OSError, match="writev wrote 0"):
            write_all(fd, [b"x"])
    finally:
        os.close(fd)


def test_unwritable_root_is_an_os_error(tmp_path: Path) -> None:
    """A root under a regular file fails the commit with ENOTDIR, and nothing else."""
    (tmp_path / "file").write_bytes(b"")
    codec = Envelopes(FileStore(tmp_path / "file" / "root"), Transcript())
    staged = codec.stage("k", {"messages": [Msg("user", "a")]})
    with pytest.raises(NotADirectoryError) as info:
        codec.commit("k", meta(1), staged, expected=prev(1))
    assert info.value.errno == errno.ENOTDIR


def test_a_stage_reentered_while_the_prefix_is_busy_does_not_wait(tmp_path: Path) -> None:
    """A signal handler's flush staging mid-stage on the same thread never blocks."""
    codec = Envelopes(FileStore(tmp_path), Transcript())
    messages: list[Any] = [Msg("user", "a")]
    state = {"messages": messages}
    codec.commit("k", meta(1), codec.stage("k", state), expected=prev(1))
    messages.append(Msg("user", "b"))
    with codec._prefix_lock:  # as if the handler interrupted a stage holding it
        staged = codec.stage("k", state)
    codec.commit("k", meta(2), staged, expected=prev(2))
    data = (tmp_path / "k.json").read_bytes()
    assert data.endswith(b',"state":' + msgspec.json.encode(state) + b"}")
