"""The transcript helpers in the frameworks' dialects: detection, problems, repairs, fingerprint.

Responses / Agents SDK items, pydantic-ai messages (objects and JSON) and
LangChain messages (objects, ``model_dump()`` and ``messages_to_dict``
dicts), built by ``tests/dialect_forms.py``.  That the frameworks accept
the repaired histories back is ``tests/transcript/test_dialects_frameworks.py``.
"""

from __future__ import annotations

import copy
import logging
import os
from pathlib import Path
from typing import Any

import msgspec
import pytest

pytest.importorskip("pydantic_ai")
pytest.importorskip("langchain_core")

from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, ToolCallPart

from checkpointer import (
    CheckpointWriter,
    FileStore,
    JournalStore,
    Skipped,
    Snapshot,
    Transcript,
    Written,
    load,
)
from checkpointer._cli import main
from checkpointer._transcript.dialects import detect
from checkpointer._transcript.fingerprint import transcript_fingerprint
from checkpointer.messages import (
    CLOSED_CALL_TEXT,
    close_dangling_tool_calls,
    count_turns,
    settle_running,
    validate_history,
)
from tests.dialect_forms import FORMS, Form, LangChain

forms = pytest.mark.parametrize("form", FORMS, ids=[f.name for f in FORMS])
stored = pytest.mark.parametrize(
    "form",
    [f for f in FORMS if f.name != "langchain-objects"],  # msgspec cannot encode pydantic models
    ids=[f.name for f in FORMS if f.name != "langchain-objects"],
)


def kinds(messages: list[Any]) -> list[tuple[str, int, str | None]]:
    return [(p.kind, p.index, p.call_id) for p in validate_history(messages)]


def encoded(messages: list[Any]) -> bytes:
    return msgspec.json.encode(messages, enc_hook=lambda o: [type(o).__name__, vars(o)])


def dialect_name(message: Any) -> str | None:
    found = detect(message)
    return None if found is None else found.name


def text_of(form: Form, message: Any) -> Any:
    """Where a message's text is, as (holder, key) for an in-place edit."""
    if form.dialect == "pydantic-ai":
        part = message.parts[0] if not isinstance(message, dict) else message["parts"][0]
        return (part, "content")
    if isinstance(form, LangChain) and form.form == "dict":
        return (message["data"], "content")
    if isinstance(message, dict) and isinstance(message.get("content"), list):
        return (message["content"][0], "text")  # a Responses output message
    return (message, "content")


def set_text(holder: tuple[Any, str], text: str) -> None:
    obj, name = holder
    if isinstance(obj, dict):
        obj[name] = text
    else:
        setattr(obj, name, text)


# -- detection and problems ---------------------------------------------------------


@forms
def test_each_message_is_detected_and_a_complete_history_sendable(form: Form) -> None:
    """Every message is its dialect's; a complete history has no problem and counts its turns."""
    history = [
        *form.user("hi"),
        *form.call("a", "b"),
        *form.results("a", "b"),
        *form.answer("done"),
    ]
    assert {dialect_name(m) for m in history[1:-1]} == {form.dialect}  # calls and results
    assert validate_history(history) == []
    # Turns: assistant messages; a Responses call item is none (its answer message is).
    assert count_turns(history) == (1 if form.dialect == "responses" else 2)


@forms
def test_dangling_orphan_and_duplicate_in_every_dialect(form: Form) -> None:
    """The three problems the new user met are found in every dialect, with their indices."""
    dangling = [*form.user("hi"), *form.call("a"), *form.user("next")]
    assert kinds(dangling) == [("unclosed-call", 1, "a")]
    orphan = [*form.user("hi"), *form.results("z")]
    assert kinds(orphan) == [("orphan-result", 1, "z")]
    twice = [*form.user("hi"), *form.call("a"), *form.results("a"), *form.call("a")]
    assert ("duplicate-id", 3, "a") in kinds(twice)


def test_a_responses_output_may_come_after_a_user_message() -> None:
    """A Responses call's window does not end at a user message: the OpenAI Responses API
    pairs a call with its output by ``call_id`` wherever it comes (dialects.md says which
    stricter paths, the SDK's chat-completions converter among them, refuse it)."""
    call = {"type": "function_call", "call_id": "F", "name": "f", "arguments": "{}"}
    items = [
        {"role": "user", "content": "q"},
        call,
        {"role": "user", "content": "hurry"},
        {"type": "function_call_output", "call_id": "F", "output": "r"},
    ]
    assert validate_history(items) == []
    assert kinds(items[:3]) == [("unclosed-call", 1, "F")]  # without it: unclosed, not pending


def test_an_approval_left_pending_by_the_agents_sdk_is_unclosed() -> None:
    """The SDK's own ``[user, function_call]`` (a needs_approval tool) is an unclosed call,
    reported pending (``transcript_prepare`` stores it open)."""
    items = [
        {"role": "user", "content": "delete it"},
        {"type": "function_call", "call_id": "c1", "name": "rm", "arguments": "{}"},
    ]
    assert kinds(items) == [("unclosed-call", 1, "c1")]
    assert "pending" in validate_history(items)[0].detail


# -- repairs -------------------------------------------------------------------------


@forms
def test_repair_answers_in_the_calls_dialect_and_form(form: Form) -> None:
    """A dangling call is answered by a result of its dialect and representation, on a copy."""
    history = [*form.user("hi"), *form.call("a", "b"), *form.results("a"), *form.user("next")]
    before = encoded(history)
    repaired, count = close_dangling_tool_calls(history)
    assert count == 1
    assert validate_history(repaired) == []
    assert encoded(history) == before  # the input is not touched
    added = [m for m in repaired if all(m is not h for h in history)]
    assert added
    for message in added:
        assert dialect_name(message) == form.dialect
        assert isinstance(message, dict) == isinstance(history[-1], dict)
    assert CLOSED_CALL_TEXT in encoded(repaired).decode()


def test_running_results_are_settled_in_their_dialect() -> None:
    """A Responses output in progress and a LangChain tool dict still running become errors."""
    items = [
        {"role": "user", "content": "hi"},
        {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "a", "output": "", "status": "in_progress"},
    ]
    settled, count = settle_running(items)
    assert count == 1
    assert settled[2]["status"] == "incomplete" and settled[2]["output"]
    assert items[2]["status"] == "in_progress"
    lc = [
        {"type": "human", "content": "hi"},
        {"type": "ai", "content": "", "tool_calls": [{"name": "f", "args": {}, "id": "a"}]},
        {"type": "tool", "data": {"content": "", "tool_call_id": "a", "status": "running"}},
    ]
    settled, count = settle_running(lc)
    assert count == 1
    assert settled[2]["data"]["status"] == "error" and settled[2]["data"]["content"]


# -- the fingerprint -------------------------------------------------------------------


def _grow(form: Form, messages: list[Any]) -> None:
    holder = text_of(form, messages[-1])
    obj, name = holder
    set_text(holder, (obj[name] if isinstance(obj, dict) else getattr(obj, name)) + " and more")


def _edit_earlier(form: Form, messages: list[Any]) -> None:
    set_text(text_of(form, messages[0]), "edited")


def _type_only(form: Form, messages: list[Any]) -> None:
    """2 -> 2.0 in the last message's call arguments: equal in Python, not on disk."""
    last = messages[-1]
    if form.dialect == "responses":
        last["arguments_value"] = 2.0 if last.get("arguments_value") == 2 else 2
        return
    if form.dialect == "pydantic-ai":
        part = last["parts"][0] if isinstance(last, dict) else last.parts[0]
        args = part["args"] if isinstance(part, dict) else part.args
    elif isinstance(last, dict):
        fields = last.get("data", last)
        args = fields["tool_calls"][0]["args"]
    else:
        args = last.tool_calls[0]["args"]
    args["q"] = 2.0


@forms
@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "new-object"])
def test_fingerprint_sees_a_grown_last_answer(form: Form, in_place: bool) -> None:
    """A last answer grown (in place, or a new message replacing it) changes the fingerprint."""
    fingerprint = transcript_fingerprint()
    messages = [*form.user("hi"), *form.answer("done")]
    before = fingerprint(Snapshot("k", {"messages": messages}))
    if in_place:
        _grow(form, messages)
    else:
        messages[-1:] = form.answer("done and more")
    assert fingerprint(Snapshot("k", {"messages": messages})) != before


@forms
def test_fingerprint_sees_a_type_only_change_of_the_last_message(form: Form) -> None:
    """``2`` -> ``2.0`` in the last call's arguments (equal values) changes the fingerprint."""
    fingerprint = transcript_fingerprint()
    messages = [*form.user("hi"), *form.call("a")]
    if form.dialect == "responses":
        messages[-1]["arguments_value"] = 2
    before = fingerprint(Snapshot("k", {"messages": messages}))
    _type_only(form, messages)
    assert fingerprint(Snapshot("k", {"messages": messages})) != before


@forms
def test_fingerprint_sees_an_edit_of_an_earlier_part_of_the_last_message(form: Form) -> None:
    """A pydantic-ai response's first part, a LangChain call's args: any edit of the last
    message, not only of its end, changes the fingerprint."""
    fingerprint = transcript_fingerprint()
    if form.dialect == "pydantic-ai" and not isinstance(form.user("x")[0], dict):
        last: Any = ModelResponse(parts=[TextPart("thinking"), ToolCallPart("f", {}, "a")])
        messages = [*form.user("hi"), last]
        before = fingerprint(Snapshot("k", {"messages": messages}))
        last.parts[0].content = "thinkinG"
    else:
        messages = [*form.user("hi"), *form.call("a", "b")]
        before = fingerprint(Snapshot("k", {"messages": messages}))
        target = messages[1] if form.dialect == "responses" else messages[-1]
        if form.dialect == "responses":
            messages[1]["name"] = "other"  # the first of the two call items
            messages[-1]["arguments"] = '{"q": 3}'
        elif form.dialect == "pydantic-ai":
            target["parts"][0]["args"] = {"q": 3}
        elif isinstance(target, dict):
            fields = target.get("data", target)
            fields["tool_calls"][0]["args"] = {"q": 3}
        else:
            target.tool_calls[0]["args"] = {"q": 3}
    assert fingerprint(Snapshot("k", {"messages": messages})) != before


@stored
@pytest.mark.anyio
async def test_an_edit_of_an_earlier_message_is_written_with_the_next_change(
    tmp_path: Path, form: Form
) -> None:
    """The transcript fingerprint's one blind spot (an earlier message edited in place, count
    and last message as they were) is skipped, never lost: the next change writes it, and
    a revision counter in the snapshot's fingerprint makes the edit itself a write."""
    messages = [*form.user("hi"), *form.answer("done")]
    state: dict[str, Any] = {"messages": messages, "rev": 0}
    store = JournalStore(tmp_path)
    writer = CheckpointWriter(
        lambda: Snapshot("k", state, fingerprint=state["rev"]),
        store,
        exit_hooks=False,
        transcript=Transcript(),
    )
    async with writer:
        _edit_earlier(form, messages)
        assert isinstance(await writer.write_now(), Skipped)
        state["rev"] += 1  # the way out the docs give: a revision in the snapshot's fingerprint
        assert isinstance(await writer.write_now(), Written)
        _edit_earlier(form, messages)
        set_text(text_of(form, messages[0]), "edited twice")
        messages.extend(form.user("next"))
        assert isinstance(await writer.write_now(), Written)
    checkpoint = load(store, "k")
    assert checkpoint is not None
    assert "edited twice" in msgspec.json.encode(checkpoint.state["messages"][0]).decode()


# -- JournalStore of pydantic-ai's dataclasses ---------------------------------------------


@pytest.mark.anyio
async def test_journal_of_pydantic_ai_dataclasses_appends(tmp_path: Path) -> None:
    """ModelMessage dataclasses in a JournalStore: each checkpoint appends its new messages
    (bytes on disk grow by about their JSON), never a compaction of the whole history."""
    from pydantic_ai.messages import ToolReturnPart, UserPromptPart

    def turn(i: int) -> list[Any]:
        return [
            ModelRequest(parts=[UserPromptPart(f"question {i}")]),
            ModelResponse(parts=[ToolCallPart("lookup", {"q": i}, tool_call_id=f"c{i}")]),
            ModelRequest(parts=[ToolReturnPart("lookup", f"answer {i}", tool_call_id=f"c{i}")]),
            ModelResponse(parts=[TextPart(f"done {i}")]),
        ]

    messages: list[Any] = []
    store = JournalStore(tmp_path)
    path = Path(store.location("k"))
    writer = CheckpointWriter(
        lambda: Snapshot("k", {"messages": messages}),
        store,
        exit_hooks=False,
        transcript=Transcript(),
    )
    async with writer:
        for i in range(6):
            new = turn(i)
            messages.extend(new)
            start = path.stat().st_size
            assert isinstance(await writer.write_now(), Written)
            grown = path.stat().st_size - start
            assert len(msgspec.json.encode(new)) <= grown <= len(msgspec.json.encode(new)) + 500
        statistics = store.statistics("k")
    assert statistics.compactions == 0
    assert statistics.appends == 6
    assert os.path.getsize(path) < 2 * len(msgspec.json.encode(messages)) + 1000


# -- shapes no dialect knows ------------------------------------------------------------------

ODD = {"speaker": "robot", "said": "beep"}


@pytest.mark.anyio
async def test_an_unrecognised_shape_never_blocks_a_write_and_is_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """A message of an unknown shape is written as it is, logged once per writer naming its
    path, and ``verify`` notes it as unrecognised (not bad, exit 0)."""
    messages: list[Any] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "more"},
        {"role": "assistant", "content": "sure"},
        ODD,
    ]
    caplog.set_level(logging.WARNING, logger="checkpointer")
    writer = CheckpointWriter(
        lambda: Snapshot("k", {"messages": messages}),
        FileStore(tmp_path),
        exit_hooks=False,
        transcript=Transcript(),
    )
    async with writer:
        for text in ("a", "b", "c"):
            messages.append({"role": "user", "content": text})
            assert isinstance(await writer.write_now(), Written)
    said = [r.getMessage() for r in caplog.records if "do not recognise" in r.getMessage()]
    assert len(said) == 1
    assert "$.state.messages[4]" in said[0]
    checkpoint = load(FileStore(tmp_path), "k")
    assert checkpoint is not None and checkpoint.state["messages"][4] == ODD
    capsys.readouterr()
    assert main(["verify", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "unrecognised message shape at $.state.messages[4]" in out
    assert "BAD" not in out


def test_an_unrecognised_shape_does_not_hide_real_problems() -> None:
    """An unknown message is left alone: a dangling call before it is still closed after it."""
    messages = [{"role": "user", "content": "hi"}, *copy.deepcopy(FORMS[0].call("a")), ODD]
    assert kinds(messages) == [("unclosed-call", 1, "a"), ("unrecognised", 2, None)]
    repaired, count = close_dangling_tool_calls(messages)
    assert count == 1 and [p.kind for p in validate_history(repaired)] == ["unrecognised"]


@stored
@pytest.mark.anyio
async def test_prepare_writes_the_repaired_history_in_every_dialect(
    tmp_path: Path, form: Form
) -> None:
    """A writer with a transcript closes a dangling call of any dialect in the file
    (the messages in memory untouched) and counts the turns."""
    messages = [*form.user("hi"), *form.call("a", "b")]  # killed while the tools ran
    if form.dialect == "responses":  # else the Agents SDK's approval pause: stored open
        messages += form.user("next")
    before = encoded(messages)
    writer = CheckpointWriter(
        lambda: Snapshot("k", {"messages": messages}),
        FileStore(tmp_path),
        exit_hooks=False,
        transcript=Transcript(fingerprint=False),
    )
    async with writer:
        result = await writer.write_now(force=True)
    assert isinstance(result, Written) and result.repaired == 2
    assert encoded(messages) == before
    checkpoint = load(FileStore(tmp_path), "k")
    assert checkpoint is not None
    on_disk = checkpoint.state["messages"]
    assert validate_history(on_disk) == []
    assert CLOSED_CALL_TEXT in msgspec.json.encode(on_disk).decode()
    assert checkpoint.meta.turns == (0 if form.dialect == "responses" else 1)  # no answer yet


class _CountedList(list[Any]):
    """A list that counts the passes over it."""

    passes = 0

    def __iter__(self) -> Any:
        type(self).passes += 1
        return super().__iter__()


@pytest.mark.parametrize("dialect", ["pydantic-ai", "langchain"])
def test_closing_k_parallel_calls_reads_their_message_a_few_times(dialect: str) -> None:
    """Closing K calls of one message passes over its calls a few times, not once per call
    (a search per answer made closing 4000 calls take over a second)."""
    k = 50
    if dialect == "pydantic-ai":
        parts = [
            {"part_kind": "tool-call", "tool_name": "f", "tool_call_id": f"c{i}"} for i in range(k)
        ]
        call: dict[str, Any] = {"kind": "response", "parts": _CountedList(parts)}
        first: dict[str, Any] = {
            "kind": "request",
            "parts": [{"part_kind": "user-prompt", "content": "q"}],
        }
    else:
        calls = [{"name": "f", "args": {}, "id": f"c{i}"} for i in range(k)]
        call = {"type": "ai", "content": "", "tool_calls": _CountedList(calls)}
        first = {"type": "human", "content": "q"}
    _CountedList.passes = 0
    repaired, count = close_dangling_tool_calls([first, call])
    assert count == k and validate_history(repaired) == []
    assert _CountedList.passes < 10
