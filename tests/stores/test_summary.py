"""Summary checkpoints: the front-matter file, collapse, and the resumed context."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml

from checkpointer import CheckpointError, CheckpointWriter, FileStore, Snapshot
from checkpointer._cli import main
from checkpointer._format.frontmatter import front_matter
from checkpointer._stores.atomic import write_atomic
from checkpointer._transcript.summary import SUMMARY_PREFIX
from checkpointer.messages import validate_history
from checkpointer.summaries import (
    SummaryCheckpoint,
    SummaryFailed,
    collapse,
    load_summary,
    resume_context,
    summary_path,
    write_summary,
)
from tests.transcripts import Chat, Messages

WHEN = datetime(2025, 5, 1, 12, 30, 15, 123456, tzinfo=UTC)

SUMMARIES = {
    "plain": "The user wants a trip plan.",
    "empty": "",
    "non-ascii": "Zürich → 東京, naïve café, emoji 🚀, RTL שלום",
    "multi-line": "First line.\n\nSecond paragraph\n  indented\n",
    "fences": "---\nname: not the real name\n---\nmetadata:\n  type: nope\n---",
    "yaml-special": "key: value # no comment\n- [a, b] {c: d} & *ref ! | > % @ `t` 'q' \"dq\"",
    "crlf-and-tabs": "line one\r\nline\ttwo\r\n",
    "trailing-spaces": "   spaced   \n\n\n",
}


@pytest.mark.parametrize("summary", SUMMARIES.values(), ids=SUMMARIES.keys())
def test_round_trip(tmp_path: Path, summary: str) -> None:
    """What is written is read back exactly, whatever the summary holds."""
    checkpoint = SummaryCheckpoint(120, summary, WHEN, 118)
    path = write_summary(tmp_path, "s-1", checkpoint)
    assert path == str(tmp_path / "sessions" / "s-1" / "checkpoint.md")
    assert load_summary(tmp_path, "s-1") == checkpoint


@pytest.mark.parametrize("summary", SUMMARIES.values(), ids=SUMMARIES.keys())
def test_front_matter_is_yaml_an_indexer_reads(tmp_path: Path, summary: str) -> None:
    """A YAML parser reads the front matter as name, description and metadata (type,
    watermark, createdAt, coveredMessages); the body after it is the summary."""
    path = write_summary(tmp_path, "s-1", SummaryCheckpoint(7, summary, WHEN, 7))
    text = Path(path).read_bytes().decode("utf-8")
    assert text.startswith("---\n")
    front, body = text[4:].split("\n---\n", 1)
    assert body == summary
    assert yaml.safe_load(front) == {
        "name": "s-1 checkpoint",
        "description": (
            "Summary of the first 7 messages of session s-1; the transcript resumes at message 7."
        ),
        "metadata": {
            "type": "checkpoint",
            "watermark": 7,
            "createdAt": "2025-05-01T12:30:15.123456Z",
            "coveredMessages": 7,
        },
    }


def test_created_at_is_stored_as_utc(tmp_path: Path) -> None:
    """A time in another zone is stored and loaded as the same instant in UTC; a naive
    time is refused."""
    tokyo = WHEN.astimezone(timezone(timedelta(hours=9)))
    write_summary(tmp_path, "s", SummaryCheckpoint(1, "x", tokyo, 1))
    loaded = load_summary(tmp_path, "s")
    assert loaded is not None
    assert loaded.created_at == WHEN and loaded.created_at.utcoffset() == timedelta(0)
    assert (
        'createdAt: "2025-05-01T12:30:15.123456Z"' in Path(summary_path(tmp_path, "s")).read_text()
    )
    with pytest.raises(ValueError, match="timezone-aware"):
        write_summary(tmp_path, "s", SummaryCheckpoint(1, "x", datetime(2025, 1, 1), 1))
    with pytest.raises(ValueError, match="watermark"):
        write_summary(tmp_path, "s", SummaryCheckpoint(-1, "x", WHEN, 1))


def test_a_file_resaved_by_a_yaml_tool_still_loads(tmp_path: Path) -> None:
    """Plain and single-quoted scalars, reordered keys and comments are read too."""
    path = Path(summary_path(tmp_path, "s"))
    path.parent.mkdir(parents=True)
    path.write_text(
        "---\n# edited by hand\nmetadata:\n  coveredMessages: 3\n  type: checkpoint\n"
        "  createdAt: 2025-05-01T12:30:15.123456+00:00\n  watermark: 4\n"
        "name: 'it''s s'\ndescription: plain words\n---\nbody\n",
        encoding="utf-8",
    )
    assert load_summary(tmp_path, "s") == SummaryCheckpoint(4, "body\n", WHEN, 3)


def resaved(path: Path, **dump: Any) -> str:
    """Re-save the front matter of ``path`` the way a YAML tool does: load, then dump."""
    text = path.read_text(encoding="utf-8")
    front, body = text[4:].split("\n---\n", 1)
    dumped: str = yaml.safe_dump(yaml.safe_load(front), **dump)
    again = "---\n" + dumped + "---\n" + body
    path.write_text(again, encoding="utf-8")
    return again


@pytest.mark.parametrize(
    "dump",
    [{}, {"width": 30}, {"sort_keys": False}, {"allow_unicode": True, "width": 40}],
    ids=["default", "narrow", "unsorted", "unicode"],
)
@pytest.mark.parametrize("key", ["session-42", "k" * 90, "a.b_c-" * 30])
def test_a_summary_resaved_by_pyyaml_still_loads(
    tmp_path: Path, dump: dict[str, Any], key: str
) -> None:
    """yaml.safe_load then yaml.safe_dump (which wraps the long description at 80
    columns, or as told) gives a file load_summary reads as it was written."""
    checkpoint = SummaryCheckpoint(120, SUMMARIES["fences"], WHEN, 118)
    path = Path(write_summary(tmp_path, key, checkpoint))
    again = resaved(path, **dump)
    assert len(again.split("\n---\n", 1)[0].splitlines()) > 8  # it wrapped a line or more
    assert load_summary(tmp_path, key) == checkpoint
    resaved(path, **dump)  # and once more: what we read is what YAML reads
    assert load_summary(tmp_path, key) == checkpoint


AWKWARD = [
    "  leading and trailing  ",
    "tab\there",
    'a "double" and a \\ backslash',
    "a: colon, # not a comment",
    "it's 'quoted'",
    "line\nbreak, and\n\nblank lines\n",
    "Zürich → 東京 🚀 \x85\u2028",
    "word " * 40,
    "x" * 100 + " " + "y" * 100,
]


@pytest.mark.parametrize("width", [20, 80])
def test_the_reader_folds_flow_scalars_as_pyyaml_reads_them(width: int) -> None:
    """Plain, single- and double-quoted scalars over several lines, as yaml.safe_dump
    writes them, read to the values yaml.safe_load reads."""
    values = {f"v{i}": text for i, text in enumerate(AWKWARD)}
    dumped = yaml.safe_dump({**values, "metadata": values}, width=width)
    assert yaml.safe_load(dumped) == {**values, "metadata": values}
    assert front_matter(dumped.splitlines(), "front matter") == {
        **values,
        "metadata": values,
    }


def test_missing_is_none(tmp_path: Path) -> None:
    """No summary checkpoint yet: None (also when the root does not exist)."""
    assert load_summary(tmp_path, "s") is None
    assert load_summary(tmp_path / "nowhere", "s") is None


GOOD_META = (
    "metadata:\n  type: checkpoint\n  watermark: 1\n"
    '  createdAt: "2025-05-01T00:00:00Z"\n  coveredMessages: 1\n'
)

MALFORMED = {
    "no-front-matter": "just a summary\n",
    "unclosed": "---\n" + GOOD_META + "body\n",
    "no-metadata": "---\nname: x\n---\nbody",
    "wrong-type": "---\n" + GOOD_META.replace("checkpoint", "note") + "---\n",
    "bad-watermark": "---\n" + GOOD_META.replace("watermark: 1", "watermark: -3") + "---\n",
    "text-watermark": "---\n" + GOOD_META.replace("watermark: 1", "watermark: many") + "---\n",
    "bad-time": "---\n" + GOOD_META.replace("2025-05-01T00:00:00Z", "yesterday") + "---\n",
    "naive-time": "---\n" + GOOD_META.replace("00:00:00Z", "00:00:00") + "---\n",
    "bad-quote": '---\nname: "unterminated\n' + GOOD_META + "---\n",
    "not-key-value": "---\n" + GOOD_META + "- a list item\n---\n",
    "too-deep": "---\nmetadata:\n  type:\n---\n",
    # PyYAML parses these but cannot build them (ValueError, RecursionError), or our
    # reader's int() refuses the digits, or the time leaves datetime's range in UTC.
    "impossible-date": "---\n"
    + GOOD_META.replace('"2025-05-01T00:00:00Z"', "2024-13-45")
    + "---\n",
    "year-0": "---\n"
    + GOOD_META.replace('"2025-05-01T00:00:00Z"', "0000-01-01 00:00:00Z")
    + "---\n",
    "year-1-east": "---\n"
    + GOOD_META.replace("2025-05-01T00:00:00Z", "0001-01-01T00:00+01:00")
    + "---\n",
    "deep-nesting": "---\nmetadata: " + "[" * 3000 + "]" * 3000 + "\n---\n",
    "5000-digit-watermark": "---\n"
    + GOOD_META.replace("watermark: 1", "watermark: " + "9" * 5000)
    + "---\n",
}


@pytest.mark.parametrize("text", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_is_an_error_with_the_path(tmp_path: Path, text: str) -> None:
    """A file that is not a summary checkpoint raises CheckpointError naming its path."""
    path = Path(summary_path(tmp_path, "s"))
    path.parent.mkdir(parents=True)
    path.write_text(text, encoding="utf-8")
    with pytest.raises(CheckpointError) as info:
        load_summary(tmp_path, "s")
    assert info.value.path == str(path)
    assert str(path) in str(info.value)


def test_ls_shows_a_summary_yaml_cannot_build_as_damaged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``checkpointer ls`` marks it ``!`` and goes on, as for any damaged summary."""
    with CheckpointWriter(lambda: Snapshot("k", {"n": 1}), FileStore(tmp_path), exit_hooks=False):
        pass
    path = Path(summary_path(tmp_path, "k"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(MALFORMED["impossible-date"], encoding="utf-8")
    assert main(["ls", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[1].split()[-1] == "!" and err.startswith(f"checkpointer ls: {path}: ")


def test_not_utf8_is_an_error(tmp_path: Path) -> None:
    """Bytes that are not UTF-8 raise CheckpointError too."""
    path = Path(summary_path(tmp_path, "s"))
    path.parent.mkdir(parents=True)
    path.write_bytes(b"---\n\xff\xfe\n---\n")
    with pytest.raises(CheckpointError, match="not UTF-8"):
        load_summary(tmp_path, "s")


def test_written_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write that fails at the rename leaves the previous summary whole and no temp file."""
    old = SummaryCheckpoint(3, "old summary", WHEN, 3)
    write_summary(tmp_path, "s", old)

    def replace(src: str, dst: str, **dir_fds: int) -> None:
        raise OSError(5, "Input/output error")

    def failing(path: str, chunks: Any, **kw: Any) -> int:
        return write_atomic(path, chunks, replace=replace, **kw)

    monkeypatch.setattr("checkpointer._stores.summaries.write_atomic", failing)
    with pytest.raises(OSError, match="Input/output"):
        write_summary(tmp_path, "s", SummaryCheckpoint(9, "new summary", WHEN, 9))
    assert load_summary(tmp_path, "s") == old
    assert os.listdir(tmp_path / "sessions" / "s") == ["checkpoint.md"]


def test_private_like_the_checkpoints(tmp_path: Path) -> None:
    """The summary is as private as the checkpoint files: 0600, in 0700 directories."""
    root = tmp_path / "root"
    path = Path(write_summary(root, "s", SummaryCheckpoint(1, "x", WHEN, 1)))
    modes = [p.stat().st_mode & 0o777 for p in (root, root / "sessions", path.parent, path)]
    assert modes == [0o700, 0o700, 0o700, 0o600]


def test_store_as_root(tmp_path: Path) -> None:
    """A FileStore can stand for its root."""
    write_summary(FileStore(tmp_path), "s", SummaryCheckpoint(1, "x", WHEN, 1))
    assert load_summary(tmp_path, "s") is not None


# -- collapse and resume -------------------------------------------------------


def long_history(style: Chat | Messages, turns: int) -> list[Any]:
    out: list[Any] = []
    for n in range(turns):
        out += [
            *style.user(f"q{n}"),
            *style.call(f"c{n}"),
            *style.results(f"c{n}"),
            *style.answer(f"a{n}"),
        ]
    return out


@pytest.mark.anyio
@pytest.mark.parametrize("style", [Chat(False), Messages(True)], ids=["chat", "messages"])
async def test_collapse_then_resume(tmp_path: Path, style: Chat | Messages) -> None:
    """collapse summarizes all but the tail, never splitting a call from its results, and
    writes the checkpoint; resume_context is the summary then the tail, and sendable."""
    history = long_history(style, 5)  # 20 messages
    seen: list[list[Any]] = []

    async def summarize(messages: list[Any]) -> str:
        seen.append(messages)
        return f"{len(messages)} messages about trips"

    # keep_last=2 would start the tail at a tool result (index 18): back to the call.
    result = await collapse(summarize, tmp_path, "s", history, keep_last=2)
    assert isinstance(result, SummaryCheckpoint)
    assert (result.watermark, result.covered_messages) == (17, 17)
    assert seen == [history[:17]]
    assert result.created_at.tzinfo is not None
    assert abs(result.created_at - datetime.now(UTC)) < timedelta(minutes=5)
    assert load_summary(tmp_path, "s") == result
    context = resume_context(history, result)
    text = SUMMARY_PREFIX + "\n\n17 messages about trips"
    assert context[0] == {"role": "user", "content": text}
    assert context[1:] == history[17:]
    assert validate_history(context) == []
    assert resume_context(history, None) == history


@pytest.mark.anyio
async def test_a_summarize_failure_is_returned_and_nothing_is_written(tmp_path: Path) -> None:
    """An exception in the caller's summarize is returned as SummaryFailed (with the
    exception), never swallowed, and no file is written or replaced."""
    history = long_history(Chat(False), 3)
    error = RuntimeError("model overloaded")

    def summarize(messages: list[Any]) -> str:
        raise error

    result = await collapse(summarize, tmp_path, "s", history, keep_last=2)
    assert isinstance(result, SummaryFailed)
    assert result.reason == "summarize-failed" and result.exception is error
    assert "model overloaded" in result.error
    assert not os.path.exists(summary_path(tmp_path, "s"))
    old = SummaryCheckpoint(2, "old", WHEN, 2)
    write_summary(tmp_path, "s", old)
    wrong: Any = lambda messages: 42  # noqa: E731
    result = await collapse(wrong, tmp_path, "s", history, keep_last=2)
    assert isinstance(result, SummaryFailed) and "returned int" in result.error
    assert load_summary(tmp_path, "s") == old


@pytest.mark.anyio
async def test_nothing_to_collapse(tmp_path: Path) -> None:
    """A history no longer than keep_last is not collapsed: None, and no call of summarize."""
    called: list[int] = []

    def summarize(messages: list[Any]) -> str:
        called.append(1)
        return "never"

    result = await collapse(summarize, tmp_path, "s", [{"role": "user"}])
    assert result is None and called == []
    with pytest.raises(ValueError, match="keep_last"):
        await collapse(lambda m: "", tmp_path, "s", [], keep_last=-1)


@pytest.mark.anyio
async def test_keep_last_zero_summarizes_everything(tmp_path: Path) -> None:
    """keep_last=0 (the documented lower bound) summarizes every message; the tail is
    empty and the resumed context is the summary alone."""
    history = long_history(Chat(False), 2)
    result = await collapse(lambda m: f"{len(m)} messages", tmp_path, "s", history, keep_last=0)
    assert isinstance(result, SummaryCheckpoint)
    assert result.watermark == len(history)
    assert load_summary(tmp_path, "s") == result
    assert resume_context(history, result) == [
        {"role": "user", "content": f"{SUMMARY_PREFIX}\n\n{len(history)} messages"}
    ]


@pytest.mark.anyio
async def test_a_summary_that_is_not_unicode_text_is_summary_failed(tmp_path: Path) -> None:
    """A lone surrogate in the summary is SummaryFailed naming its index, not an
    exception out of collapse; the previous file stays; write_summary says why."""
    history = long_history(Chat(False), 3)
    old = SummaryCheckpoint(2, "old", WHEN, 2)
    write_summary(tmp_path, "s", old)
    result = await collapse(lambda m: "ok \udc80 then", tmp_path, "s", history, keep_last=2)
    assert isinstance(result, SummaryFailed)
    assert result.reason == "summarize-failed"
    assert "surrogate '\\udc80' at index 3" in result.error
    assert isinstance(result.exception, ValueError)
    assert load_summary(tmp_path, "s") == old
    with pytest.raises(ValueError, match="lone surrogate"):
        write_summary(tmp_path, "s", SummaryCheckpoint(2, "\ud800", WHEN, 2))
    assert load_summary(tmp_path, "s") == old


def test_resume_context_refuses_a_transcript_older_than_its_summary() -> None:
    """A summary past the end of the transcript is a ValueError saying what to do."""
    with pytest.raises(ValueError, match="older than the summary"):
        resume_context([{"role": "user", "content": "x"}], SummaryCheckpoint(5, "s", WHEN, 5))
    made = resume_context([], SummaryCheckpoint(0, "s", WHEN, 0), make_message=lambda t: ("m", t))
    assert made == [("m", SUMMARY_PREFIX + "\n\ns")]
