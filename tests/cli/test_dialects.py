"""The CLI on histories of every dialect and adapter layout: ls, show, verify, escapes.

The files are written by real writers (and by the adapters, for their
layouts); the commands run in-process through ``main``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")
pytest.importorskip("langchain_core")

from checkpointer import CheckpointWriter, FileStore, JournalStore, Snapshot
from checkpointer._cli import main
from tests.dialect_forms import FORMS, Form

STORED = [f for f in FORMS if f.name != "langchain-objects"]  # msgspec cannot encode those
stored = pytest.mark.parametrize("form", STORED, ids=[f.name for f in STORED])

# OSC 52 (the clipboard), OSC 0 (the title), ESC[2J (clear), an 8-bit CSI, a bidi override.
EVIL = "x\x1b]52;c;Zm9v\x07\x1b]0;owned\x07\x1b[2J\x9b31m\u202e\x00\r"
RAW = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
"""What must never reach the terminal raw: every control character but the newline."""


def run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


def write(root: Path, key: str, messages: list[Any], store: Any = None) -> None:
    store = FileStore(root) if store is None else store
    state = {"messages": messages}
    writer = CheckpointWriter(lambda: Snapshot(key, state), store, exit_hooks=False)
    writer.open()
    writer.close()


def conversation(form: Form, text: str = "hi", call_id: str = "a") -> list[Any]:
    return [
        *form.user(text),
        *form.call(call_id),
        *form.results(call_id),
        *form.answer("done"),
    ]


@stored
def test_ls_show_verify_speak_every_dialect(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], form: Form
) -> None:
    """ls has the user's first words as title and the turns; show labels each message in its
    dialect's words (never ``?``); verify calls a complete history ok."""
    write(tmp_path, "k", conversation(form, "what is the weather"))
    status, out, _ = run(capsys, "ls", "--json", tmp_path)
    row = json.loads(out)[0]
    assert status == 0
    assert (row["title"], row["messages"]) == ("what is the weather", 4)
    assert row["turns"] == (1 if form.dialect == "responses" else 2)
    status, out, _ = run(capsys, "show", tmp_path, "k")
    lines = [line.strip() for line in out.splitlines() if line.strip().startswith("[")]
    assert status == 0 and len(lines) == 4
    assert not any(line.split(" ", 1)[1].startswith("?") for line in lines)
    assert "lookup" in lines[1]  # the call names its tool
    assert "r a" in lines[2]  # the result says what it returned
    assert "done" in lines[3]
    status, out, _ = run(capsys, "verify", tmp_path)
    assert status == 0
    assert out.startswith("ok   ")
    assert out.splitlines()[-1] == "1 checkpoint(s): 1 ok, 0 bad"


@stored
def test_verify_finds_the_problems_of_every_dialect(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], form: Form
) -> None:
    """A dangling call at the end is a warning, an orphan result is bad, in every dialect."""
    write(tmp_path, "dangling", [*form.user("hi"), *form.call("a")])
    write(tmp_path, "orphan", [*form.user("hi"), *form.results("z")])
    status, out, _ = run(capsys, "verify", tmp_path)
    assert status == 1
    lines = out.splitlines()
    assert lines[0].startswith("warn ") and "'a'" in lines[0]
    assert lines[1].startswith("BAD ") and "$.state.messages[1]" in lines[1]
    assert "orphan" in lines[1]
    assert "role is missing" not in out


@pytest.mark.anyio
async def test_adapter_layouts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A pydantic-ai conversation (entries chained by parent id) reads as its history."""
    from pydantic_ai.conversation import Conversation

    from checkpointer.pydantic_ai import CheckpointConversationStore

    messages = conversation(FORMS[1], "from pydantic-ai")
    async with CheckpointConversationStore(JournalStore(tmp_path)) as store:
        await store.save(Conversation(conversation_id="c1", messages=messages))
    status, out, _ = run(capsys, "ls", "--json", tmp_path)
    row = json.loads(out)[0]
    assert (row["title"], row["turns"], row["messages"]) == ("from pydantic-ai", 2, 4)
    status, out, _ = run(capsys, "verify", tmp_path)
    assert status == 0 and out.splitlines()[-1] == "1 checkpoint(s): 1 ok, 0 bad"


@pytest.mark.parametrize("store", ["file", "journal"])
def test_nothing_from_a_session_reaches_the_terminal_raw(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], store: str
) -> None:
    """Control characters in any field a command shows (texts, call ids, tool results, an
    unrecognised message's keys) are printed as escapes by ls, show and verify."""
    made = FileStore(tmp_path) if store == "file" else JournalStore(tmp_path)
    for form in STORED:
        messages = [
            *conversation(form, "hi " + EVIL, "a" + EVIL),
            *form.call("b" + EVIL),
            {"odd" + EVIL: EVIL},
        ]
        write(tmp_path, form.name, messages, made)
    outputs = [run(capsys, "ls", tmp_path), run(capsys, "ls", "--json", tmp_path)]
    outputs += [run(capsys, "show", tmp_path, form.name) for form in STORED]
    outputs.append(run(capsys, "verify", tmp_path))
    for status, out, err in outputs:
        assert status in (0, 1)
        assert not RAW.search(out), out
        assert not RAW.search(err), err
    assert "\\x1b]52" in outputs[0][1]  # shown, as an escape


def test_verify_says_a_torn_tail_and_an_unrecognised_shape_together(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A journal with a torn tail and a message of no known shape is one warn line saying
    both, counted in both; the exit status stays 0."""
    write(
        tmp_path,
        "k",
        [{"role": "user", "content": "hi"}, {"speaker": "robot"}],
        JournalStore(tmp_path),
    )
    with open(tmp_path / "k.jsonl", "ab") as journal:
        journal.write(b'{"kind": "message", "unfinished')
    status, out, _ = run(capsys, "verify", tmp_path)
    lines = out.splitlines()
    assert status == 0
    assert lines[0].startswith("warn ")
    assert "a torn tail was ignored" in lines[0]
    assert "unrecognised message shape at $.state.messages[1]" in lines[0]
    assert lines[-1] == (
        "1 checkpoint(s): 1 ok (1 with a torn tail ignored, 1 with messages not checked), 0 bad"
    )


def huge_fields(s: str) -> dict[str, list[Any]]:
    """A history per dialect whose every id, name, role and key is ``s``."""
    call = {"id": s, "type": "function", "function": {"name": s, "arguments": s}}
    return {
        "chat": [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": s, "content": "x"},
            {"role": "tool", "tool_call_id": s + "2", "content": "x"},
        ],
        "anthropic": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": s, "name": s}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": s + "2"}]},
        ],
        "responses": [
            {"type": "function_call", "call_id": s, "name": s, "arguments": "{}"},
            {"type": "function_call_output", "call_id": s + "2", "output": "x"},
        ],
        "pydantic-ai": [
            {"kind": "response", "parts": [{"part_kind": "tool-call", "tool_call_id": s}]},
            {"kind": "request", "parts": [{"part_kind": "tool-return", "tool_call_id": s + "2"}]},
        ],
        "langchain": [
            {"type": "ai", "content": "", "tool_calls": [{"name": s, "args": {}, "id": s}]},
            {"type": "tool", "content": "x", "tool_call_id": s + "2"},
        ],
        "unrecognised": [{"role": s}, {s: 1}, {"role": {"x": s}}],
    }


def test_huge_ids_names_roles_and_keys_are_cut(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``show`` and ``verify`` cut every id, tool name, role and key they print, as they cut
    message texts: a 200 000-character call id is a few dozen characters of output."""
    s = "B" * 200_000
    files = huge_fields(s)
    for key, messages in files.items():
        write(tmp_path, key, messages)
    _, out, err = run(capsys, "verify", tmp_path)
    assert len(out + err) < 5000 and "characters)" in out
    for key in files:
        _, out, err = run(capsys, "show", tmp_path, key)
        assert len(out + err) < 5000, key


def test_a_lone_surrogate_escape_is_named_not_called_truncated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file with ``"\\ud83d"`` (JSON grammar, as Python's json.dumps writes half an emoji)
    is reported for that escape, with its byte offset, never as truncated or corrupt JSON."""
    write(tmp_path, "s", [{"role": "user", "content": "placeholder"}])
    path = tmp_path / "s.json"
    doc = json.loads(path.read_text())
    doc["state"]["messages"][0]["content"] = "emoji cut in half: \ud83d"
    path.write_text(json.dumps(doc))  # ensure_ascii: the escape, not a raw surrogate
    assert json.loads(path.read_text())  # readable JSON grammar
    commands: list[list[str | Path]] = [["verify", tmp_path], ["show", tmp_path, "s"]]
    for command in commands:
        status, out, err = run(capsys, *command)
        assert status == 1
        assert "lone UTF-16 surrogate escape (\\ud83d at byte" in out + err
        assert "truncated" not in out + err
