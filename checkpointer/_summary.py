"""Summary checkpoints: a long session collapsed to a summary and a tail.

Everything before a *watermark* index of the transcript is replaced by a
distilled summary; only the messages from the watermark on are replayed.
The summary lives beside the session at ``<root>/sessions/<key>/checkpoint.md``
as Markdown with a YAML front matter, so a memory indexer that reads
front-matter files picks it up unchanged::

    ---
    name: "session-42 checkpoint"
    description: "Summary of the first 120 messages of session session-42; ..."
    metadata:
      type: checkpoint
      watermark: 120
      createdAt: "2025-05-01T12:00:00.123456Z"
      coveredMessages: 120
    ---
    <the summary, verbatim>

No YAML library is needed: the front matter has a fixed shape, strings are
written as JSON strings (a JSON string is a valid YAML double-quoted
scalar), and the reader parses just that shape (plus single-quoted and plain
scalars, so a file re-saved by a YAML tool still loads).  The body is the
summary byte for byte: it may hold ``---`` lines, since the front matter
ends at its first ``---`` line and none of its own values can contain one.
"""

from __future__ import annotations

import inspect
import json
import os
import re
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

import anyio
import msgspec

from ._atomic import makedirs_durable, write_atomic
from ._format import CheckpointError
from ._stores import FileStore, check_key
from ._transcript import starts_with_results

__all__ = [
    "SUMMARY_PREFIX",
    "SummaryCheckpoint",
    "SummaryFailed",
    "collapse",
    "load_summary",
    "resume_context",
    "summary_path",
    "write_summary",
]

SUMMARY_PREFIX = "Summary of the earlier part of this conversation:"
"""How the default summary message of ``resume_context`` starts."""


class SummaryCheckpoint(msgspec.Struct, frozen=True):
    """A session collapsed up to ``watermark``.

    Attributes:
        watermark: the index of the first transcript message *not* covered:
            the resumed context is the summary, then ``messages[watermark:]``.
        summary: the distilled text, any length, any characters.
        created_at: when the summary was made, timezone-aware (stored as UTC).
        covered_messages: how many original messages the summary stands
            for (the watermark, unless summaries were chained).
    """

    watermark: int
    summary: str
    created_at: datetime
    covered_messages: int


class SummaryFailed(msgspec.Struct, frozen=True, kw_only=True):
    """``collapse`` wrote nothing.

    Attributes:
        reason: ``"summarize-failed"`` (the caller's function raised or
            returned something other than a str) or ``"write-failed"``.
        error: one line naming what failed.
        exception: the exception itself, to re-raise or inspect.
    """

    reason: Literal["summarize-failed", "write-failed"]
    error: str
    exception: BaseException


Root = str | os.PathLike[str] | FileStore


def summary_path(root: Root, key: str) -> str:
    """Where the summary checkpoint of ``key`` lives under ``root``.

    ``root`` is a directory or a ``FileStore`` (its root is used).

    Raises:
        ValueError: ``key`` is not a valid key.
    """
    check_key(key)
    base = root.root if isinstance(root, FileStore) else os.fspath(root)
    return os.path.join(base, "sessions", key, "checkpoint.md")


def write_summary(root: Root, key: str, checkpoint: SummaryCheckpoint) -> str:
    """Write ``checkpoint`` atomically and durably; return its path.

    Blocking: from async code, run it in a worker thread (``collapse`` does).

    Raises:
        ValueError: a bad key, a negative count, or a naive ``created_at``.
        TypeError: a field of the wrong type.
        OSError: the write failed; the previous file, if any, is intact.
    """
    path = summary_path(root, key)
    for name in ("watermark", "covered_messages"):
        value = getattr(checkpoint, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {value!r}")
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    if not isinstance(checkpoint.summary, str):
        raise TypeError(f"summary must be a str, got {type(checkpoint.summary).__name__}")
    created = checkpoint.created_at
    if not isinstance(created, datetime) or created.utcoffset() is None:
        raise ValueError(f"created_at must be a timezone-aware datetime, got {created!r}")
    front = "\n".join(
        [
            "---",
            f"name: {_quote(f'{key} checkpoint')}",
            "description: "
            + _quote(
                f"Summary of the first {checkpoint.covered_messages} messages of session "
                f"{key}; the transcript resumes at message {checkpoint.watermark}."
            ),
            "metadata:",
            "  type: checkpoint",
            f"  watermark: {checkpoint.watermark}",
            f"  createdAt: {_quote(_iso(created))}",
            f"  coveredMessages: {checkpoint.covered_messages}",
            "---",
            "",
        ]
    )
    data = (front + checkpoint.summary).encode("utf-8")
    # makedirs gives its mode to the last directory only: the root and sessions/
    # are made one by one, 0700 like a FileStore's root, each durably (a new
    # directory needs its parent fsynced to survive a power cut).
    sessions = os.path.dirname(os.path.dirname(path))
    for directory in (os.path.dirname(sessions), sessions):
        if directory:
            makedirs_durable(directory, 0o700)
    write_atomic(path, [data])
    return path


def load_summary(root: Root, key: str) -> SummaryCheckpoint | None:
    """Load the summary checkpoint of ``key``; None if there is none.

    Raises:
        ValueError: ``key`` is not a valid key.
        CheckpointError: the file exists but cannot be read or is not a
            summary checkpoint (``.path`` is the file, ``.reason`` says why).
    """
    path = summary_path(root, key)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CheckpointError(path, f"cannot be read: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointError(path, f"not UTF-8 text: {exc}") from None
    return _parse(text, path)


async def collapse(
    summarize: Callable[[list[Any]], Awaitable[str] | str],
    root: Root,
    key: str,
    messages: Sequence[Any],
    *,
    keep_last: int = 20,
) -> SummaryCheckpoint | SummaryFailed | None:
    """Summarize all but the last messages and write the summary checkpoint.

    The watermark is ``len(messages) - keep_last``, moved earlier while it
    would split a tool call from its results (so the tail starts where a
    model API accepts it).  ``summarize`` gets ``messages[:watermark]`` as a
    new list and returns the summary (often a model call; sync or async).

    Args:
        summarize: the caller's function that writes the summary.
        root: the directory (or ``FileStore``) of the session.
        key: the session key.
        messages: the whole transcript.
        keep_last: how many recent messages stay verbatim (at least).

    Returns:
        The ``SummaryCheckpoint`` written; ``SummaryFailed`` when
        ``summarize`` failed or the write did (nothing is written then, and
        the exception is in it); None when there is nothing to collapse.
        Cancellation propagates, and nothing is written then either.

    Raises:
        ValueError: a bad key or a negative ``keep_last``.
    """
    check_key(key)
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 0:
        raise ValueError(f"keep_last must be an int >= 0, got {keep_last!r}")
    watermark = _safe_watermark(messages, keep_last)
    if watermark == 0:
        return None
    try:
        summary = summarize(list(messages[:watermark]))
        if inspect.isawaitable(summary):
            summary = await summary
    except Exception as exc:
        return SummaryFailed(
            reason="summarize-failed", error=f"summarize() raised {_one_line(exc)}", exception=exc
        )
    if not isinstance(summary, str):
        error = f"summarize() returned {type(summary).__name__}, expected str"
        return SummaryFailed(reason="summarize-failed", error=error, exception=TypeError(error))
    checkpoint = SummaryCheckpoint(watermark, summary, datetime.now(UTC), watermark)
    try:
        await anyio.to_thread.run_sync(write_summary, root, key, checkpoint)
    except OSError as exc:
        return SummaryFailed(
            reason="write-failed",
            error=f"cannot write {summary_path(root, key)}: {_one_line(exc)}",
            exception=exc,
        )
    return checkpoint


def resume_context(
    messages: Sequence[Any],
    checkpoint: SummaryCheckpoint | None,
    *,
    make_message: Callable[[str], Any] | None = None,
) -> list[Any]:
    """The context to send on resume: the summary as one message, then the tail.

    Args:
        messages: the whole transcript (as loaded).
        checkpoint: the summary checkpoint, or None (then a copy of
            ``messages`` is returned).
        make_message: builds the summary message from its text; by default
            ``{"role": "user", "content": SUMMARY_PREFIX + "\\n\\n" + summary}``,
            which both message styles accept.

    Raises:
        ValueError: the watermark lies past the end of ``messages`` (the
            transcript is older than the summary: resume from it in full).
    """
    if checkpoint is None:
        return list(messages)
    if checkpoint.watermark > len(messages):
        raise ValueError(
            f"the summary covers messages up to {checkpoint.watermark}, but the transcript "
            f"has {len(messages)}: the transcript is older than the summary; resume from "
            "the full transcript instead"
        )
    text = f"{SUMMARY_PREFIX}\n\n{checkpoint.summary}"
    first = make_message(text) if make_message is not None else {"role": "user", "content": text}
    return [first, *messages[checkpoint.watermark :]]


# -- helpers -------------------------------------------------------------------


def _safe_watermark(messages: Sequence[Any], keep_last: int) -> int:
    watermark = max(0, len(messages) - keep_last)
    while watermark > 0 and starts_with_results(messages[watermark]):
        watermark -= 1
    return watermark


def _quote(text: str) -> str:
    # A JSON string is a YAML double-quoted scalar with the same value.
    return json.dumps(text, ensure_ascii=True)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


_LINE = re.compile(
    r"^(?P<indent> *)(?P<key>[A-Za-z_][A-Za-z0-9_-]*):(?:[ \t]+(?P<value>.*?))?[ \t]*$"
)
_INT = re.compile(r"^[+-]?[0-9]+$")


def _parse(text: str, path: str) -> SummaryCheckpoint:
    lines = text.split("\n")
    if lines[0].rstrip("\r") != "---":
        raise CheckpointError(path, "does not start with a '---' front matter fence")
    end = next((i for i in range(1, len(lines)) if lines[i].rstrip("\r") == "---"), None)
    if end is None:
        raise CheckpointError(path, "the front matter has no closing '---' line")
    top: dict[str, Any] = {}
    section: dict[str, Any] | None = None
    for number, raw in enumerate(lines[1:end], start=2):
        line = raw.rstrip("\r")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _LINE.match(line)
        if match is None:
            raise CheckpointError(path, f"line {number}: not a 'key: value' line: {line!r:.80}")
        key, value = match["key"], match["value"]
        if not match["indent"]:
            if value is None:
                section = top[key] = {}
            else:
                section = None
                top[key] = _scalar(value, path, number)
        elif section is None:
            raise CheckpointError(path, f"line {number}: indented {key!r} belongs to no mapping")
        elif value is None:
            raise CheckpointError(path, f"line {number}: {key!r} nests deeper than expected")
        else:
            section[key] = _scalar(value, path, number)
    meta = top.get("metadata")
    if not isinstance(meta, dict):
        raise CheckpointError(path, "the front matter has no 'metadata' mapping")
    if meta.get("type") != "checkpoint":
        raise CheckpointError(path, f"metadata.type is {meta.get('type')!r}, not 'checkpoint'")
    numbers = {}
    for name in ("watermark", "coveredMessages"):
        value = meta.get(name)
        if not isinstance(value, int) or value < 0:
            raise CheckpointError(path, f"metadata.{name} must be an integer >= 0, got {value!r}")
        numbers[name] = value
    created = meta.get("createdAt")
    try:
        moment = datetime.fromisoformat(created) if isinstance(created, str) else None
    except ValueError:
        moment = None
    if moment is None or moment.utcoffset() is None:
        raise CheckpointError(
            path, f"metadata.createdAt must be an ISO 8601 time with a zone, got {created!r}"
        )
    body = text[sum(len(line) + 1 for line in lines[: end + 1]) :]
    return SummaryCheckpoint(
        watermark=numbers["watermark"],
        summary=body,
        created_at=moment.astimezone(UTC),
        covered_messages=numbers["coveredMessages"],
    )


def _scalar(value: str, path: str, number: int) -> Any:
    if value.startswith('"'):
        try:
            return json.loads(value)
        except ValueError:
            raise CheckpointError(path, f"line {number}: a bad double-quoted string") from None
    if value.startswith("'"):
        if len(value) < 2 or not value.endswith("'"):
            raise CheckpointError(path, f"line {number}: a bad single-quoted string")
        return value[1:-1].replace("''", "'")
    if _INT.match(value):
        return int(value)
    return value
