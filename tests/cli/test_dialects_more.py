"""The CLI on Converse, Gemini / ADK and Claude Code histories, and on transcripts kept under
another field than ``messages``: ls, show and verify say what they hold, or that they cannot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from checkpointer import CheckpointWriter, FileStore, JournalStore, Snapshot, Transcript
from checkpointer._cli import main
from checkpointer.stores import Encryption
from tests.transcript.test_dialects_more import FORMS, NAMES, conversation

forms = pytest.mark.parametrize("make", FORMS, ids=NAMES)


def run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str]:
    capsys.readouterr()
    status = main([str(a) for a in argv])
    return status, capsys.readouterr().out


def write(store: Any, key: str, state: Any, transcript: Transcript | None = None) -> None:
    writer = CheckpointWriter(
        lambda: Snapshot(key, state), store, transcript=transcript, exit_hooks=False
    )
    writer.open()
    writer.close()


@forms
def test_ls_show_verify_read_each_new_dialect(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Any
) -> None:
    """The title is the user's first words, the turns are counted (a split response once),
    each message is labelled in its dialect's words; verify calls it ok."""
    f = make()
    write(FileStore(tmp_path), "k", {"messages": conversation(f)})
    status, out = run(capsys, "ls", "--json", tmp_path)
    row = json.loads(out)[0]
    assert (status, row["title"], row["turns"]) == (0, "hi", 3)
    status, out = run(capsys, "show", "--last", "100", tmp_path, "k")
    assert status == 0 and "(unrecognised)" not in out and "lookup" in out
    status, out = run(capsys, "verify", tmp_path)
    assert status == 0 and out.startswith("ok   ")


@forms
def test_verify_never_says_ok_of_a_broken_history(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Any
) -> None:
    """Results dropped mid-history and an orphan are bad; a call open at the end a warning;
    an unknown block a note: none is a plain ``ok``."""
    f = make()
    store = FileStore(tmp_path)
    write(store, "a-dropped", {"messages": conversation(f, drop=True)})
    write(store, "b-orphan", {"messages": conversation(f, orphan=True)})
    write(store, "c-open", {"messages": conversation(f, drop=True, end_open=True)})
    odd: dict[str, Any] = {"role": "model", "parts": [{"bogus": 1}]}
    if f.dialect == "converse":
        odd = {"role": "user", "content": [{"bogus": 1}]}
    elif f.dialect == "claude-code":
        odd = {"type": "assistant", "uuid": "x", "message": {"content": [{"type": "bogus"}]}}
    write(store, "d-unknown", {"messages": [f.user("hi"), odd]})
    status, out = run(capsys, "verify", tmp_path)
    words = [line.split()[0] for line in out.splitlines()[:4]]
    assert status == 1 and words == ["BAD", "BAD", "warn", "note"], out
    status, out = run(capsys, "ls", "--json", tmp_path)
    assert [(r["turns"], r["messages"]) for r in json.loads(out)][3] == (None, 2)
    status, out = run(capsys, "ls", tmp_path)
    header, *rows = out.splitlines()
    at = header.index("TURNS") + len("TURNS")  # right-aligned: the column ends there
    assert rows[3][at - 1] == "?" and rows[0][at - 1] != "?"  # cannot count; counted


def test_verify_and_show_follow_the_field_a_journal_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A journal whose transcript is ``events`` is checked and counted there, its shapes
    unknown to every dialect included (no guess could find those)."""
    events = [{"who": "user", "said": "hi"}, {"who": "bot", "said": "yo"}]
    state = {"events": events, "notes": [1, 2, 3]}
    write(JournalStore(tmp_path), "k", state, Transcript(field="events"))
    status, out = run(capsys, "verify", tmp_path)
    assert status == 0 and out.startswith("note ") and "2 messages" in out
    assert "$.state.events[0]" in out
    status, out = run(capsys, "show", tmp_path, "k")
    assert "turns            ? (a message of a shape no dialect knows)" in out
    assert "messages         2" in out


def test_the_recorded_field_wins_over_messages_and_the_journal_is_read_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A journal that records ``events`` is checked there, though the state has a
    ``messages`` list too (a UI's notifications): its dangling call is BAD, not a silent ok.
    The field comes from the same read as the checkpoint."""
    events = conversation(FORMS[1](), drop=True)  # ADK events, a call left unanswered
    state = {"events": events, "messages": []}
    write(JournalStore(tmp_path), "k", state, Transcript(field="events", repair=False))
    reads: list[str] = []
    real = JournalStore.read

    def counted(store: JournalStore, key: str) -> bytes | None:
        reads.append(key)
        return real(store, key)

    monkeypatch.setattr(JournalStore, "read", counted)
    status, out = run(capsys, "verify", tmp_path)
    assert status == 1 and out.startswith("BAD  ") and "$.state.events[1]" in out, out
    assert reads == ["k"]
    status, out = run(capsys, "ls", "--json", tmp_path)
    assert [(r["turns"], r["messages"]) for r in json.loads(out)] == [(3, 5)]


def test_a_snapshot_with_several_histories_says_none_was_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A snapshot records no field: of two lists a dialect knows, neither is guessed, and
    verify says so (a note naming both), never a silent ok."""
    events = conversation(FORMS[1](), drop=True)
    state = {"events": events, "log": [{"role": "user", "content": "audit line"}]}
    write(FileStore(tmp_path), "k", state)
    status, out = run(capsys, "verify", tmp_path)
    assert status == 0  # a note: not damage
    assert out.startswith("note ") and "'events', 'log'" in out and "none checked" in out, out


def test_a_snapshot_names_no_field_its_one_history_is_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A snapshot records no field: the one list of the state a dialect knows is its history;
    a state without one has no history (``-``), not zero turns."""
    f = FORMS[1]()  # ADK events, snake_case
    write(FileStore(tmp_path), "adk", {"events": conversation(f, drop=True), "id": "s"})
    write(FileStore(tmp_path), "plain", {"count": 3, "items": [1, 2]})
    status, out = run(capsys, "verify", tmp_path)
    assert status == 1 and out.startswith("BAD  ") and "$.state.events[1]" in out
    status, out = run(capsys, "ls", "--json", tmp_path)
    rows = {r["key"]: r for r in json.loads(out)}
    assert (rows["adk"]["turns"], rows["adk"]["messages"]) == (3, 5)
    assert (rows["plain"]["turns"], rows["plain"]["messages"]) == (None, None)


def test_show_takes_a_key_that_starts_with_a_dash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``show ROOT [options] -- -key``, as the Claude SDK's project keys need."""
    write(FileStore(tmp_path), "-home-me-proj", {"messages": conversation(FORMS[-1]())})
    for argv in (
        ("show", tmp_path, "--", "-home-me-proj"),
        ("show", tmp_path, "--last", "1", "--", "-home-me-proj"),
        ("show", "--raw", "--", tmp_path, "-home-me-proj"),
    ):
        status, out = run(capsys, *argv)
        assert status == 0 and "-home-me-proj" in out, argv


def test_a_sealed_journal_is_checked_in_its_recorded_field_with_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An encrypted journal's rows are opened in the same one read that finds its field:
    with the key its ``events`` are checked (a dangling call is BAD); without, it is
    said to be encrypted, not damaged."""
    key = Encryption.new_key("k1")
    events = conversation(FORMS[1](), drop=True)
    store = JournalStore(tmp_path / "root", encryption=Encryption.from_text(key))
    write(store, "k", {"events": events, "messages": []}, Transcript("events", repair=False))
    keys = tmp_path / "keys.txt"
    keys.write_text(key + "\n")
    status, out = run(capsys, "verify", tmp_path / "root", "--key-file", keys)
    assert status == 1 and out.startswith("BAD  ") and "$.state.events[1]" in out, out
    status, out = run(capsys, "verify", tmp_path / "root")
    assert status == 0 and "encrypted" in out, out
