"""transcript_prepare keeps the scan of a settled prefix and gives a full scan's result."""

from __future__ import annotations

import threading
import time
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkpointer import Failed, Snapshot
from checkpointer._transcript.prepare import _Prefixes, transcript_prepare
from checkpointer._values import Prepared
from checkpointer.messages import (
    ChatMessage,
    Message,
    TextBlock,
    ToolCall,
    ToolFunction,
    ToolResultBlock,
    close_dangling_tool_calls,
    count_turns,
    settle_running,
    validate_history,
)
from tests.transcripts import STYLES, Chat, Messages

IDS = ("a", "b", "c", "d")


# -- what a full prepare gives ---------------------------------------------------


def same_outcome(got: Prepared | Failed, want: Prepared | Failed, snapshot: Snapshot) -> None:
    """Two prepare results are the same: kind, counts, error text, messages written."""
    assert type(got) is type(want)
    if isinstance(got, Failed):
        assert isinstance(want, Failed)
        assert (got.reason, got.error) == (want.reason, want.error)
        return
    assert isinstance(want, Prepared)
    assert (got.repaired, got.settled, got.turns) == (want.repaired, want.settled, want.turns)
    assert (got.snapshot is snapshot) == (want.snapshot is snapshot)
    assert got.snapshot.state["messages"] == want.snapshot.state["messages"]
    assert [type(m) for m in got.snapshot.state["messages"]] == [
        type(m) for m in want.snapshot.state["messages"]
    ]


def reference(snapshot: Snapshot, *, settle: bool, repair: bool) -> Prepared | Failed:
    """The documented prepare, built from the public one-shot functions."""
    messages = snapshot.state["messages"]
    copy, settled = settle_running(messages) if settle else (list(messages), 0)
    copy, repaired = close_dangling_tool_calls(copy) if repair else (copy, 0)
    # what no dialect can check (a shape, a call without an id) is written as it is
    problems = [p for p in validate_history(copy) if p.kind != "unrecognised"]
    if problems:
        return Failed("not-sendable", "; ".join(p.describe("$.state.messages") for p in problems))
    if not settled and not repaired:
        return Prepared(snapshot=snapshot, turns=count_turns(messages))
    state = {**snapshot.state, "messages": copy}
    return Prepared(
        snapshot=Snapshot(snapshot.key, state, parent=snapshot.parent),
        repaired=repaired,
        settled=settled,
        turns=count_turns(messages),
    )


def like_reference(got: Prepared | Failed, want: Prepared | Failed) -> None:
    assert type(got) is type(want)
    if isinstance(got, Failed):
        assert isinstance(want, Failed)
        first = want.error.split("; ")[0]
        assert first in got.error
        return
    assert isinstance(want, Prepared)
    assert (got.repaired, got.settled, got.turns) == (want.repaired, want.settled, want.turns)
    assert got.snapshot.state["messages"] == want.snapshot.state["messages"]


def frozen_view(messages: Any) -> tuple[bytes, list[int]]:
    """The value (encoded) and identity of every message and of its content."""
    ids = [id(m) for m in messages]
    ids += [id(m.get("content") if isinstance(m, dict) else m.content) for m in messages]
    return msgspec.json.encode(list(messages)), ids


def cache_of(prepare: Any) -> _Prefixes:
    """The prepare step's cache of prefixes (white box)."""
    for cell in prepare.__closure__:
        if isinstance(cell.cell_contents, _Prefixes):
            return cell.cell_contents
    raise AssertionError("no prefix cache in the prepare step")


def prefix_length(prepare: Any, key: str) -> int:
    """How many messages of ``key`` the prepare step has scanned for good."""
    prefix = cache_of(prepare)._by_key.get(key)
    return 0 if prefix is None else len(prefix.messages)


def checked(prepare: Any, key: str, messages: list[Any]) -> Prepared | Failed:
    """``prepare`` on a snapshot of ``messages``, checked against a fresh prepare."""
    snapshot = Snapshot(key, {"messages": messages})
    got: Prepared | Failed = prepare(snapshot)
    same_outcome(got, transcript_prepare()(snapshot), snapshot)
    return got


# -- random histories and edits --------------------------------------------------

ids_st = st.lists(st.sampled_from(IDS), min_size=1, max_size=3, unique=True)


@st.composite
def batches(draw: st.DrawFn) -> list[Any]:
    """A few messages of one style and form: a user turn, an answer, a call, its results."""
    style = draw(st.sampled_from(STYLES))
    kind = draw(st.sampled_from(["user", "answer", "call", "results", "odd"]))
    if kind == "user":
        return style.user(draw(st.sampled_from(["hi", "go on"])))
    if kind == "answer":
        return style.answer("done")
    ids = draw(ids_st)
    if kind == "call":
        return style.call(*ids)
    if kind == "results":
        running = tuple(draw(st.lists(st.sampled_from(ids), unique=True)))
        return style.results(*ids, running=running)
    return [odd(draw(st.integers(min_value=0, max_value=5)))]


def odd(which: int) -> Any:
    """A new message the prefix must not take: lists in Structs, running, no id."""
    if which == 0:
        return ChatMessage(role="user", content=[{"type": "tool_result", "tool_use_id": "a"}])
    if which == 1:
        return Message(role="user", content=({"type": "tool_result", "tool_use_id": "b"},))  # type: ignore[arg-type]
    if which == 2:
        running = ToolResultBlock(tool_use_id="c", status="running")
        return Message(role="user", content=(TextBlock("x"), running))
    if which == 3:
        return {"role": "tool", "tool_call_id": None, "content": "?"}
    if which == 4:
        return ChatMessage(role="tool", tool_call_id="d", status="running")
    calls = [ToolCall(id="a", function=ToolFunction(name="f"))]
    return ChatMessage(role="assistant", tool_calls=calls)  # type: ignore[arg-type]


index = st.integers(min_value=0, max_value=60)
edits = st.one_of(
    st.tuples(st.just("append"), batches()),
    st.tuples(st.just("append"), batches()),
    st.tuples(st.just("append"), batches()),
    st.tuples(st.just("replace"), index, batches()),
    st.tuples(st.just("replace-last"), batches()),
    st.tuples(st.just("equal-copy"), index),
    st.tuples(st.just("insert"), index, batches()),
    st.tuples(st.just("delete"), index),
    st.tuples(st.just("truncate"), index),
    st.tuples(st.just("mutate"), index, index, index),
    st.tuples(st.just("mutate"), index, index, index),
    st.tuples(st.just("new-list")),
    st.tuples(st.just("as-tuple")),
    st.tuples(st.just("other-key")),
)


VALUES: dict[str, list[str | None]] = {
    "tool_call_id": [*IDS, None],
    "status": ["running", "done", None],
    "role": ["user", "assistant", "tool"],
    "call-id": [*IDS, None],
    "block-id": [*IDS, None],
    "block-status": ["running", "done", None],
}


def edits_of(message: Any) -> list[str]:
    """The in-place edits ``message`` allows: of a dict, or of a list in a Struct."""
    if isinstance(message, dict):
        out = ["role", "tool_call_id", "status"]
        if message.get("tool_calls"):
            out.append("call-id")
    else:
        out = ["call-id"] if isinstance(getattr(message, "tool_calls", None), list) else []
    content = message.get("content") if isinstance(message, dict) else message.content
    if isinstance(content, list) and content and isinstance(content[-1], dict):
        out += ["block-id", "block-status"]
    return out


def mutate(history: list[Any], at: int, which: int, value: int) -> None:
    """Edit in place one of the messages that can be, the way an agent might."""
    mutable = [m for m in history if edits_of(m)]
    if not mutable:
        return
    message = mutable[at % len(mutable)]
    options = edits_of(message)
    what = options[which % len(options)]
    new = VALUES[what][value % len(VALUES[what])]
    if what == "call-id":
        if isinstance(message, dict):
            message["tool_calls"][0]["id"] = new
        else:
            # None too: an id-less call, which the scan skips
            message.tool_calls[0] = ToolCall(id=new, function=ToolFunction(name="f"))  # type: ignore[arg-type]
    elif what in ("block-id", "block-status"):
        content: list[Any] = message["content"] if isinstance(message, dict) else message.content
        content[-1]["tool_use_id" if what == "block-id" else "status"] = new
    elif new is None:
        message.pop(what, None)
    else:
        message[what] = new


def apply(edit: tuple[Any, ...], history: list[Any]) -> list[Any]:
    """Apply one edit to ``history`` in place, or return a new list."""
    kind = edit[0]
    n = len(history)
    if kind == "append":
        history.extend(edit[1])
    elif kind == "replace" and n:
        history[edit[1] % n : edit[1] % n + 1] = edit[2]
    elif kind == "replace-last" and n:
        history[-1:] = edit[1]
    elif kind == "equal-copy" and n:
        at = edit[1] % n
        m = history[at]
        history[at] = dict(m) if isinstance(m, dict) else msgspec.structs.replace(m)
    elif kind == "insert":
        at = edit[1] % (n + 1)
        history[at:at] = edit[2]
    elif kind == "delete" and n:
        del history[edit[1] % n]
    elif kind == "truncate":
        del history[edit[1] % (n + 1) :]
    elif kind == "mutate":
        mutate(history, *edit[1:])
    elif kind == "new-list":
        return list(history)
    return history


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    flags=st.tuples(st.booleans(), st.booleans()),
    start=st.lists(batches(), max_size=12),
    steps=st.lists(edits, min_size=1, max_size=40),
)
def test_incremental_prepare_equals_a_full_prepare(
    flags: tuple[bool, bool], start: list[list[Any]], steps: list[tuple[Any, ...]]
) -> None:
    """After any appends, edits in place, replacements, insertions, truncations, new
    lists and key switches, the prepare step that keeps its scan gives what a fresh one
    gives, and what the one-shot functions give; it never changes the live history."""
    settle, repair = flags
    incremental = transcript_prepare(settle=settle, repair=repair)
    histories = {"k1": [m for batch in start for m in batch], "k2": []}
    key = "k1"
    for edit in steps:
        if edit[0] == "other-key":
            key = "k2" if key == "k1" else "k1"
        histories[key] = apply(edit, histories[key])
        messages: Any = histories[key]
        if edit[0] == "as-tuple":
            messages = tuple(messages)
        snapshot = Snapshot(key, {"messages": messages, "title": "t"}, parent="p")
        before = frozen_view(messages)
        got = incremental(snapshot)
        assert frozen_view(messages) == before
        want = transcript_prepare(settle=settle, repair=repair)(snapshot)
        same_outcome(got, want, snapshot)
        like_reference(got, reference(snapshot, settle=settle, repair=repair))


# -- the rule, case by case ------------------------------------------------------


def chat_history(n: int, struct: bool = True) -> list[Any]:
    style = Chat(struct)
    out: list[Any] = []
    for i in range(n // 4):
        out += [*style.user(f"q{i}"), *style.call(f"c{i}"), *style.results(f"c{i}")]
        out += style.answer(f"a{i}")
    return out


def test_in_place_edit_of_a_dict_message_is_seen() -> None:
    """A dict message edited in place (its tool_call_id) changes the outcome at once:
    dicts are never taken into the kept prefix."""
    history = chat_history(40, struct=False)
    prepare = transcript_prepare()
    assert isinstance(checked(prepare, "k", history), Prepared)
    history[6]["tool_call_id"] = "zzz"
    result = checked(prepare, "k", history)
    assert isinstance(result, Failed) and result.reason == "not-sendable"
    assert "$.state.messages[6]: tool result for 'zzz'" in result.error
    assert prefix_length(prepare, "k") == 0


def test_struct_prefix_is_kept_and_a_replacement_inside_it_is_seen() -> None:
    """Frozen Struct messages are scanned once; replacing one inside the prefix by a
    different message is seen (the list comparison fails), by an equal copy is not."""
    history = chat_history(400)
    prepare = transcript_prepare()
    assert isinstance(checked(prepare, "k", history), Prepared)
    assert prefix_length(prepare, "k") == len(history) - 1  # the last one is kept out
    history.append(ChatMessage(role="user", content="more"))
    assert isinstance(checked(prepare, "k", history), Prepared)
    assert prefix_length(prepare, "k") == len(history) - 1
    history[5] = msgspec.structs.replace(history[5])  # equal: the same history
    assert isinstance(checked(prepare, "k", history), Prepared)
    assert prefix_length(prepare, "k") == len(history) - 1
    history[6] = ChatMessage(role="tool", tool_call_id="zzz", content="?")
    result = checked(prepare, "k", history)
    assert isinstance(result, Failed)
    assert "$.state.messages[6]: tool result for 'zzz'" in result.error


@pytest.mark.parametrize("style", [Chat(True), Messages(True)], ids=["chat", "messages"])
def test_running_results_stay_out_of_the_prefix(style: Chat | Messages) -> None:
    """A running result far back stops the prefix before it, so its settling (on a copy)
    and the scan of the copy resume from the prefix; when it finishes, it is taken in."""
    head = [*style.user("hi"), *style.call("a", "b")]
    running = style.results("a", "b", running=("a",))
    tail = [*style.user("meanwhile"), *style.answer("still waiting")] * 10
    history = [*head, *running, *tail]
    prepare = transcript_prepare()
    result = checked(prepare, "k", history)
    assert isinstance(result, Prepared) and result.settled == 1
    assert prefix_length(prepare, "k") == history.index(running[0])
    for _ in range(3):
        history.append(style.user("more")[0])
        again = checked(prepare, "k", history)
        assert isinstance(again, Prepared) and again.settled == 1
    at = history.index(running[0])
    history[at : at + len(running)] = style.results("a", "b")
    done = checked(prepare, "k", history)
    assert isinstance(done, Prepared) and done.settled == 0
    assert prefix_length(prepare, "k") == len(history) - 1


@pytest.mark.parametrize("style", [Chat(True), Messages(True)], ids=["chat", "messages"])
def test_an_unanswered_call_stops_the_prefix_where_its_window_ends(
    style: Chat | Messages,
) -> None:
    """A call the conversation moved on from is closed on a copy at every checkpoint:
    the prefix stops at the message that ended its window, and the copy resumes there."""
    history = [*style.user("hi"), *style.call("a"), *style.user("never mind")]
    history += [*style.answer("ok"), *style.user("next")] * 5
    prepare = transcript_prepare()
    for _ in range(3):
        result = checked(prepare, "k", history)
        assert isinstance(result, Prepared) and result.repaired == 1
        assert prefix_length(prepare, "k") == 2
        history.append(style.user("more")[0])


class Unreadable:
    """A message whose role cannot be read: reading it raises."""

    @property
    def role(self) -> str:
        raise RuntimeError("this message cannot be read")


def test_an_exception_drops_the_prefix_and_the_next_call_is_right() -> None:
    """A history the scan cannot read raises as before (the writer turns it into a
    Failed); the half-fed prefix is dropped, and the next checkpoint is exact."""
    history: list[Any] = chat_history(40)
    prepare = transcript_prepare()
    checked(prepare, "k", history)
    history.append(Unreadable())
    with pytest.raises(RuntimeError):
        checked(prepare, "k", history)
    assert prefix_length(prepare, "k") == 0
    history[-1] = ChatMessage(role="user", content="fine")
    assert isinstance(checked(prepare, "k", history), Prepared)


def test_a_busy_cache_falls_back_to_a_full_scan() -> None:
    """While another call holds the cache (a thread, or a signal handler re-entering),
    prepare scans in full instead of waiting, with the same result."""
    history = chat_history(40)
    history += Chat(True).call("open")
    prepare = transcript_prepare()
    checked(prepare, "k", history)
    with cache_of(prepare)._lock:
        busy = checked(prepare, "k", history)
    assert isinstance(busy, Prepared) and busy.repaired == 1
    assert prefix_length(prepare, "k") == len(history) - 1  # untouched meanwhile


def test_threads_and_many_keys() -> None:
    """Threads checkpointing more keys than are kept get exact results throughout."""
    prepare = transcript_prepare()
    errors: list[BaseException] = []

    def session(key: str) -> None:
        history = chat_history(20)
        try:
            for i in range(60):
                history += Chat(True).call(f"{key}-{i}") if i % 3 == 0 else Chat(True).user("x")
                checked(prepare, key, history)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=session, args=(f"k{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_an_append_costs_the_new_messages_not_the_history() -> None:
    """At 50,000 Struct messages, a checkpoint after one append costs under a twentieth
    of one full scan (best of three tries, for a noisy machine)."""
    history = chat_history(50_000)
    prepare = transcript_prepare()
    snapshot = Snapshot("k", {"messages": history})
    prepare(snapshot)
    extra = Chat(True).user("more")
    tries = []
    for _ in range(3):
        t0 = time.perf_counter()
        validate_history(history)
        full = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(20):
            history += extra
            prepare(snapshot)
        append = (time.perf_counter() - t0) / 20
        tries.append(append / full)
        if tries[-1] < 1 / 20:
            return
    raise AssertionError(f"append / full scan: {tries}")
