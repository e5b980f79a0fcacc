"""Agent histories: sendable or not, repairs on a copy, O(1) fingerprints."""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Any

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from checkpointer import Failed, Snapshot
from checkpointer._transcript.fingerprint import transcript_fingerprint
from checkpointer._transcript.prepare import transcript_prepare
from checkpointer._values import Prepared
from checkpointer.messages import (
    CLOSED_CALL_TEXT,
    INTERRUPTED_TEXT,
    ChatMessage,
    Message,
    TextBlock,
    ToolCall,
    ToolFunction,
    ToolUseBlock,
    close_dangling_tool_calls,
    count_turns,
    settle_running,
    validate_history,
)
from tests.transcripts import STYLES, Chat, Messages, Style, field, role_of

styles = pytest.mark.parametrize("style", STYLES, ids=[s.name for s in STYLES])


def kinds(messages: list[Any]) -> list[tuple[str, int, str | None]]:
    return [(p.kind, p.index, p.call_id) for p in validate_history(messages)]


def frozen_view(messages: list[Any]) -> tuple[bytes, list[int]]:
    """The value (encoded) and the identity of every message and of its content."""
    ids = [id(m) for m in messages] + [id(field(m, "content")) for m in messages]
    return msgspec.json.encode(messages), ids


@styles
def test_complete_history_is_sendable(style: Style) -> None:
    """A history whose every call is answered in time has no problems; so has an empty one."""
    history = [
        *style.user("hi"),
        *style.call("a", "b"),
        *style.results("a", "b"),
        *style.answer("done"),
    ]
    assert validate_history(history) == []
    assert validate_history([]) == []
    assert close_dangling_tool_calls([]) == ([], 0)
    assert settle_running([]) == ([], 0)


@styles
def test_validate_reports_every_problem_in_one_pass(style: Style) -> None:
    """Orphan, unclosed and duplicate ids are all reported, in message order."""
    history = [
        *style.user("hi"),  # 0
        *style.results("ghost"),  # 1: orphan
        *style.call("a", "b"),  # 2: b never answered
        *style.results("a"),  # 3
        *style.answer("next"),  # 4
        *style.call("a"),  # 5: duplicate call id
        *style.call("c"),  # 6
        *style.results("c"),  # 7
        *style.results("c"),  # 8: answered twice
    ]
    assert kinds(history) == [
        ("orphan-result", 1, "ghost"),
        ("unclosed-call", 2, "b"),
        ("duplicate-id", 5, "a"),
        ("duplicate-id", 8, "c"),
    ]
    problem = validate_history(history)[0]
    assert problem.describe("$.messages") == (
        "$.messages[1]: tool result for 'ghost' answers no open tool call (orphan result)"
    )


@styles
def test_a_result_after_the_conversation_moved_on_is_late(style: Style) -> None:
    """A call must be answered before the next turn: later, the call is unclosed and the
    result an orphan, as the model APIs see it."""
    history = [*style.call("a"), *style.user("are you there?"), *style.results("a")]
    assert kinds(history) == [("unclosed-call", 0, "a"), ("orphan-result", 2, "a")]


@styles
def test_close_dangling_returns_a_repaired_copy(style: Style) -> None:
    """Each unanswered call gets one error result where the API expects it; the live list
    and its messages are untouched, by value and by identity."""
    live = [
        *style.user("hi"),
        *style.call("a", "b"),
        *style.results("a"),
        *style.user("go on"),
        *style.call("c"),
    ]
    before = frozen_view(live)
    repaired, count = close_dangling_tool_calls(live)
    assert frozen_view(live) == before
    assert repaired is not live
    assert count == 2
    assert validate_history(repaired) == []
    assert repaired[0] is live[0] and repaired[1] is live[1]  # untouched messages are shared
    closing = [m for m in repaired if CLOSED_CALL_TEXT in msgspec.json.encode(m).decode()]
    assert len(closing) == 2
    if isinstance(style, Chat):
        # after the call's own results, before the next user message
        assert [role_of(m) for m in repaired] == [
            "user", "assistant", "tool", "tool", "user", "assistant", "tool"
        ]  # fmt: skip
        assert field(repaired[3], "tool_call_id") == "b"
    else:
        # merged at the front of the next user message, or a new user message at the end
        assert [role_of(m) for m in repaired] == [
            "user",
            "assistant",
            "user",
            "user",
            "assistant",
            "user",
        ]
        assert repaired[2] is not live[2]
        blocks = field(repaired[2], "content")
        assert [field(b, "tool_use_id") for b in blocks] == ["b", "a"]
        assert field(blocks[0], "is_error") is True


@pytest.mark.parametrize("style", [Messages(False), Messages(True)], ids=["dict", "struct"])
def test_close_dangling_merges_into_a_text_user_message(style: Messages) -> None:
    """Messages style: a user message with plain text after the call gets the result
    first, then its text as a block."""
    live = [*style.call("a"), *style.user("what happened?")]
    repaired, count = close_dangling_tool_calls(live)
    assert count == 1
    assert validate_history(repaired) == []
    blocks = field(repaired[1], "content")
    assert field(blocks[1], "text") == "what happened?"
    assert field(live[1], "content") == "what happened?"


@styles
def test_settle_running_on_a_copy(style: Style) -> None:
    """A result still marked running becomes an error naming the interruption, on a copy."""
    live = [*style.call("a", "b"), *style.results("a", "b", running=("b",))]
    before = frozen_view(live)
    settled, count = settle_running(live)
    assert frozen_view(live) == before
    assert count == 1
    text = msgspec.json.encode(settled).decode()
    assert '"status":"running"' not in text
    assert '"status":"error"' in text
    assert INTERRUPTED_TEXT in text
    assert "running" in msgspec.json.encode(live).decode()


def test_repairs_keep_struct_types() -> None:
    """Repairs of Struct histories are Structs of the same types, decodable as before."""
    style = Messages(True)
    live = [*style.call("a")]
    repaired, _ = close_dangling_tool_calls(live)
    assert all(isinstance(m, Message) for m in repaired)
    decoded = msgspec.json.decode(msgspec.json.encode(repaired), type=list[Message])
    assert decoded == repaired
    chat = Chat(True)
    repaired, _ = close_dangling_tool_calls(chat.call("x"))
    assert all(isinstance(m, ChatMessage) for m in repaired)


# -- fingerprint ---------------------------------------------------------------


class OnlyTheEnd(list[Any]):
    """A history that refuses to be iterated: only len() and [-1] work."""

    def __iter__(self) -> Iterator[Any]:
        raise AssertionError("the fingerprint iterated the history")

    def __getitem__(self, index: Any) -> Any:
        if index != -1:
            raise AssertionError(f"the fingerprint read message {index!r}")
        return super().__getitem__(index)


def test_fingerprint_never_walks_or_encodes_the_history() -> None:
    """The fingerprint reads the count and the last message only: unencodable and
    unhashable earlier messages do not matter, and it is never iterated."""
    fp = transcript_fingerprint()
    history = OnlyTheEnd([object()] * 100_000 + [{"role": "assistant", "id": "m1", "content": "x"}])
    value = fp(Snapshot("k", {"messages": history}))
    hash(value)


def test_fingerprint_sees_what_it_promises() -> None:
    """Key, parent, count, last role/id/content length, and every field outside the messages
    (a pin flag, a revision, a title) change the fingerprint; an in-place edit of an earlier
    message does not."""
    fp = transcript_fingerprint()

    def state(**over: Any) -> dict[str, Any]:
        base: dict[str, Any] = {
            "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
            "pinned": False,
            "revision": 1,
        }
        base.update(over)
        return base

    ref = fp(Snapshot("k", state()))
    assert fp(Snapshot("k", state())) == ref
    last = {"role": "assistant", "content": "b"}
    variants = [
        Snapshot("k2", state()),
        Snapshot("k", state(), parent="p"),
        Snapshot("k", state(messages=[{"role": "user", "content": "a"}])),
        Snapshot("k", state(messages=[{"role": "user", "content": "a"}, {**last, "role": "tool"}])),
        Snapshot("k", state(messages=[{"role": "user", "content": "a"}, {**last, "id": "m9"}])),
        Snapshot(
            "k", state(messages=[{"role": "user", "content": "a"}, {**last, "content": "bb"}])
        ),
        Snapshot("k", state(pinned=True)),
        Snapshot("k", state(revision=2)),
        Snapshot("k", state(title="renamed")),
        Snapshot("k", state(revision=1.0)),  # a type-only change outside the messages
    ]
    assert all(fp(v) != ref for v in variants)
    edited = state()
    edited["messages"][0]["content"] = "a different first message"
    assert fp(Snapshot("k", edited)) == ref  # the documented price of O(1)


def test_fingerprint_of_blocks_and_structs() -> None:
    """For content blocks, the fingerprint follows the block count and the last block's text."""
    fp = transcript_fingerprint()
    style = Messages(True)
    one = fp(Snapshot("k", {"messages": style.answer("hello")}))
    two = fp(Snapshot("k", {"messages": style.answer("hello, world")}))
    assert one != two


def _last_fp(last: Any) -> Hashable:
    """The fingerprint of a two-message history ending in ``last``."""
    return transcript_fingerprint()(Snapshot("k", {"messages": [{"role": "user"}, last]}))


def _call(arguments: str) -> dict[str, Any]:
    function = {"name": "search", "arguments": arguments}
    return {
        "role": "assistant",
        "tool_calls": [{"id": "c1", "type": "function", "function": function}],
    }


LAST_EDITS = [
    # (before, after): the edits of the last message issue 11 names, then a few more
    (_call('{"q": "cat"}'), _call('{"q": "dog"}')),  # streamed arguments, same length
    (
        ChatMessage(role="assistant", tool_calls=(ToolCall("c1", ToolFunction("f", '{"a":1}')),)),
        ChatMessage(role="assistant", tool_calls=(ToolCall("c1", ToolFunction("f", '{"a":2}')),)),
    ),
    (
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"q": "a"}}],
        },
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"q": "b"}}],
        },
    ),
    (
        Message(role="assistant", content=(ToolUseBlock("t", "f", {"n": 1}),)),
        Message(role="assistant", content=(ToolUseBlock("t", "f", {"n": 2}),)),
    ),
    (
        Message(role="assistant", content=(TextBlock("abc"), ToolUseBlock("t", "f"))),
        Message(role="assistant", content=(TextBlock("abd"), ToolUseBlock("t", "f"))),
    ),
    ({"role": "assistant", "content": "cat"}, {"role": "assistant", "content": "dog"}),
    (ChatMessage(role="assistant", content="cat"), ChatMessage(role="assistant", content="dog")),
    (
        {"role": "tool", "tool_call_id": "c1", "content": 2},
        {"role": "tool", "tool_call_id": "c1", "content": 2.0},
    ),
    (
        {"role": "tool", "tool_call_id": "c1", "status": "running"},
        {"role": "tool", "tool_call_id": "c2", "status": "running"},
    ),
    (
        {"role": "assistant", "content": "x", "n": True},
        {"role": "assistant", "content": "x", "n": 1},
    ),
    ({"role": "assistant", "content": "x"}, {"role": "assistant", "content": "x", "extra": None}),
]


@pytest.mark.parametrize(("before", "after"), LAST_EDITS)
def test_fingerprint_sees_every_edit_of_the_last_message(before: Any, after: Any) -> None:
    """An edit of the last message changes the fingerprint, whatever it touches and
    even when no length or count changes (arguments, tool input, an earlier block, 2 -> 2.0)."""
    assert _last_fp(before) != _last_fp(after)
    assert _last_fp(before) == _last_fp(
        msgspec.json.decode(msgspec.json.encode(before), type=type(before))
    )


class Opaque:
    """A message msgspec cannot encode (a framework's own class, say)."""

    def __init__(self, role: str, content: Any) -> None:
        self.role = role
        self.content = content


class Slotted:
    """A message msgspec cannot encode, with slots and no ``__dict__``."""

    __slots__ = ("content", "role")

    def __init__(self, role: str, content: Any) -> None:
        self.role = role
        self.content = content


@pytest.mark.parametrize("cls", [Opaque, Slotted])
def test_fingerprint_sees_edits_of_a_last_message_msgspec_cannot_encode(cls: type) -> None:
    """A last message of a class msgspec cannot encode is fingerprinted by its attributes:
    an edit in place is seen, an equal rebuilt one is not."""
    message = cls("assistant", {"text": "cat"})
    before = _last_fp(message)
    assert _last_fp(cls("assistant", {"text": "cat"})) == before
    message.content = {"text": "dog"}
    assert _last_fp(message) != before
    message.content = {"text": "cat", "n": 2}
    after = _last_fp(message)
    message.content = {"text": "cat", "n": 2.0}
    assert _last_fp(message) != after


JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
JSON = st.recursive(
    JSON_LEAVES,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)
MESSAGES = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool"])},
    optional={
        "content": st.text(max_size=12)
        | st.lists(
            st.fixed_dictionaries(
                {"type": st.sampled_from(["text", "tool_use", "tool_result"])},
                optional={"text": st.text(max_size=8), "input": JSON, "id": st.text(max_size=3)},
            ),
            max_size=3,
        ),
        "tool_calls": st.lists(
            st.fixed_dictionaries(
                {
                    "id": st.text(max_size=3),
                    "function": st.fixed_dictionaries(
                        {"name": st.text(max_size=4), "arguments": st.text(max_size=12)}
                    ),
                }
            ),
            max_size=2,
        ),
        "id": st.text(max_size=4),
        "extra": JSON,
    },
)


def _mutate(value: Any, data: st.DataObject) -> Any:
    """``value`` with one change somewhere inside, drawn by ``data``; never mutates ``value``."""
    if isinstance(value, dict) and value and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(value)))
        return {**value, key: _mutate(value[key], data)}
    if isinstance(value, list) and value and data.draw(st.booleans()):
        index = data.draw(st.integers(0, len(value) - 1))
        return [*value[:index], _mutate(value[index], data), *value[index + 1 :]]
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return float(value) if data.draw(st.booleans()) else value + 1  # 2 -> 2.0: type only
    if isinstance(value, float):
        return int(value) if value.is_integer() and abs(value) < 2**53 else value / 2 or 1.0
    if isinstance(value, str):  # same length when it can be
        return ("b" if value[0] == "a" else "a") + value[1:] if value else "a"
    if isinstance(value, list):
        return value[:-1] if bool(value) and data.draw(st.booleans()) else [*value, None]
    if isinstance(value, dict):
        if bool(value) and data.draw(st.booleans()):
            key = data.draw(st.sampled_from(sorted(value)))
            return {k: v for k, v in value.items() if k != key}
        return {**value, "added-by-mutate": None}  # longer than any drawn key
    return 0  # None


@settings(max_examples=300, deadline=None)
@given(message=MESSAGES, data=st.data())
def test_any_mutation_of_the_last_message_changes_the_fingerprint(
    message: dict[str, Any], data: st.DataObject
) -> None:
    """Any one change anywhere in the last message, dict or Struct, changes the fingerprint."""
    mutated = _mutate(message, data)
    assert msgspec.json.encode(mutated) != msgspec.json.encode(message)  # the mutation is real
    assert _last_fp(mutated) != _last_fp(message)
    assert _last_fp(msgspec.json.decode(msgspec.json.encode(message))) == _last_fp(message)
    for cls in (ChatMessage, Message):
        try:
            before, after = msgspec.convert(message, cls), msgspec.convert(mutated, cls)
        except msgspec.ValidationError:
            continue  # not that Struct's shape
        if msgspec.json.encode(before) != msgspec.json.encode(after):
            assert _last_fp(before) != _last_fp(after)


# -- the prepare step ----------------------------------------------------------


@styles
def test_prepare_repairs_then_validates(style: Style) -> None:
    """prepare settles and closes on a copy and counts turns; the snapshot's state is new."""
    live = [*style.user("hi"), *style.call("a", "b"), *style.results("a", running=("a",))]
    state = {"messages": live, "other": 1}
    snapshot = Snapshot("k", state, parent="p0")
    prepared = transcript_prepare()(snapshot)
    assert isinstance(prepared, Prepared)
    assert (prepared.repaired, prepared.settled, prepared.turns) == (1, 1, 1)
    assert prepared.snapshot.state["messages"] is not live
    assert prepared.snapshot.state["other"] == 1
    assert prepared.snapshot.parent == "p0"
    assert state["messages"] is live
    assert validate_history(prepared.snapshot.state["messages"]) == []


@styles
def test_prepare_refuses_what_repair_cannot_fix(style: Style) -> None:
    """An orphan result makes the snapshot not sendable, with the JSON path in the error."""
    live = [*style.user("hi"), *style.results("ghost")]
    result = transcript_prepare()(Snapshot("k", {"messages": live}))
    assert isinstance(result, Failed)
    assert result.reason == "not-sendable"
    assert "$.state.messages[1]" in result.error
    assert "'k'" in result.error


def test_prepare_without_repair_refuses_dangling_calls() -> None:
    """With repair=False an unclosed call is refused rather than repaired."""
    style = Chat(False)
    result = transcript_prepare(repair=False)(Snapshot("k", {"messages": style.call("a")}))
    assert isinstance(result, Failed) and result.reason == "not-sendable"
    assert "$.state.messages[0]: tool call 'a' has no result" in result.error


def test_prepare_on_struct_state_and_missing_field() -> None:
    """A Struct state is copied with msgspec.structs.replace; a state without messages is not."""

    class State(msgspec.Struct, frozen=True):
        messages: list[Any]
        title: str

    style = Chat(True)
    state = State(messages=style.call("a"), title="t")
    prepared = transcript_prepare()(Snapshot("k", state))
    assert isinstance(prepared, Prepared)
    assert isinstance(prepared.snapshot.state, State)
    assert prepared.snapshot.state.title == "t"
    assert len(prepared.snapshot.state.messages) == 2
    assert len(state.messages) == 1
    whole = Snapshot("k", {"history": []})  # no messages: passed on whole, not refused
    assert transcript_prepare()(whole) == Prepared(snapshot=whole)


def test_count_turns() -> None:
    """Turns are the assistant messages."""
    style = Chat(False)
    history = [*style.user("a"), *style.call("x"), *style.results("x"), *style.answer("b")]
    assert count_turns(history) == 2


def test_content_in_a_list_subclass_is_read_as_blocks() -> None:
    """Blocks held in a list (or tuple) subclass are read like a list's: a call there is
    seen, reported when unanswered, and closed by the repair."""

    class Blocks(list[Any]):
        pass

    call = {"type": "tool_use", "id": "a", "name": "search", "input": {}}
    history = [{"role": "assistant", "content": Blocks([call])}, {"role": "user", "content": "?"}]
    assert kinds(history) == [("unclosed-call", 0, "a")]
    repaired, count = close_dangling_tool_calls(history)
    assert count == 1
    assert validate_history(repaired) == []


NAMES = ["tool", "assistant", "user", "tool_use", "tool_result", "running", "a"]
ODD = st.recursive(
    JSON_LEAVES | st.sampled_from(NAMES),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(NAMES), inner),
    max_leaves=8,
)
_FIELDS = ("content", "tool_calls", "tool_call_id", "id", "type", "tool_use_id", "status")
ODD_BLOCK = st.fixed_dictionaries(
    {}, optional={name: ODD | st.sampled_from(NAMES) for name in _FIELDS}
)
ODD_MESSAGE = ODD | st.fixed_dictionaries(
    {"role": st.sampled_from(NAMES) | ODD},
    optional={
        **{name: ODD | st.sampled_from(NAMES) for name in _FIELDS},
        "content": ODD | st.lists(ODD_BLOCK, max_size=3),
        "tool_calls": ODD | st.lists(ODD_BLOCK, max_size=3),
    },
)


@settings(max_examples=100, deadline=None)
@given(messages=st.lists(ODD_MESSAGE, max_size=6))
@example(messages=[{"role": None, "type": []}])  # a list "type": was unhashable in a set test
def test_odd_histories_are_problems_never_exceptions(messages: list[Any]) -> None:
    """Any JSON at all (list ids, tool_calls that are not lists, ...) gets an answer from
    every helper, never an exception: a hand-edited file is a problem to report."""
    validate_history(messages)
    count_turns(messages)
    settle_running(messages)
    close_dangling_tool_calls(messages)
    transcript_prepare()(Snapshot("k", {"messages": messages}))
    transcript_fingerprint()(Snapshot("k", {"messages": messages}))
