"""A summary checkpoint's file: Markdown under a front matter a memory indexer reads.

Its strings are JSON strings (valid YAML double-quoted scalars); the body is the
summary byte for byte, after the first ``---`` line that ends the front matter."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

from .._values import CheckpointError, SummaryCheckpoint
from .frontmatter import front_matter

__all__ = ["decode_summary", "encode_summary", "not_text"]


def encode_summary(key: str, checkpoint: SummaryCheckpoint) -> bytes:
    """The bytes of ``checkpoint``'s file, the summary of session ``key``.

    Raises:
        ValueError: a negative count, a naive ``created_at``, or a summary
            that is not Unicode text (a lone surrogate).
        TypeError: a field of the wrong type.
    """
    for name in ("watermark", "covered_messages"):
        value = getattr(checkpoint, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {value!r}")
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    if not isinstance(checkpoint.summary, str):
        raise TypeError(f"summary must be a str, got {type(checkpoint.summary).__name__}")
    problem = not_text(checkpoint.summary)
    if problem is not None:
        raise ValueError(problem)
    created = checkpoint.created_at
    if not isinstance(created, datetime) or created.utcoffset() is None:
        raise ValueError(f"created_at must be a timezone-aware datetime, got {created!r}")
    description = (
        f"Summary of the first {checkpoint.covered_messages} messages of session {key}; "
        f"the transcript resumes at message {checkpoint.watermark}."
    )
    front = (
        f"---\nname: {_quote(f'{key} checkpoint')}\ndescription: {_quote(description)}\n"
        f"metadata:\n  type: checkpoint\n  watermark: {checkpoint.watermark}\n"
        f"  createdAt: {_quote(_iso(created))}\n"
        f"  coveredMessages: {checkpoint.covered_messages}\n---\n"
    )
    return (front + checkpoint.summary).encode("utf-8")


def decode_summary(data: bytes, path: str) -> SummaryCheckpoint:
    """The summary checkpoint in a file's bytes (``path`` names it in errors).

    Raises:
        CheckpointError: not UTF-8 text, or not a summary checkpoint (the
            reason names the line).
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointError(path, f"not UTF-8 text: {exc}") from None
    return _parse(text, path)


def not_text(summary: str) -> str | None:
    """Why ``summary`` cannot be written as UTF-8 (a lone surrogate), or None."""
    try:
        summary.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"it holds a lone surrogate {summary[exc.start]!r} at index {exc.start}, which "
            "UTF-8 cannot encode (text decoded with errors='surrogateescape'?); "
            "clean it first, e.g. summary.encode('utf-8', 'replace').decode()"
        )
    return None


def _quote(text: str) -> str:
    # A JSON string is a YAML double-quoted scalar with the same value.
    return json.dumps(text, ensure_ascii=True)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


_FENCE = re.compile(r"^---(?:[ \t].*)?$")  # a document start marker, content may follow


def _parse(text: str, path: str) -> SummaryCheckpoint:
    lines = text.split("\n")
    if lines[0].rstrip("\r") != "---":
        raise CheckpointError(path, "does not start with a '---' front matter fence")
    first, end = _front_lines(lines)
    if end is None:
        raise CheckpointError(path, "the front matter has no closing '---' line")
    top = front_matter([line.rstrip("\r") for line in lines[first:end]], path)
    if end < len(lines) and lines[end].rstrip("\r") == "...":  # a YAML document end
        end += int(end + 1 < len(lines) and lines[end + 1].rstrip("\r") == "---")
    if not isinstance(top, dict):
        raise CheckpointError(path, "the front matter is not a mapping")
    meta = top.get("metadata")
    if not isinstance(meta, dict):
        raise CheckpointError(path, "the front matter has no 'metadata' mapping")
    if meta.get("type") != "checkpoint":
        raise CheckpointError(path, f"metadata.type is {meta.get('type')!r:.80}, not 'checkpoint'")
    numbers = {}
    for name in ("watermark", "coveredMessages"):
        value = meta.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise CheckpointError(
                path, f"metadata.{name} must be an integer >= 0, got {value!r:.80}"
            )
        numbers[name] = value
    created = meta.get("createdAt")
    try:  # a str, or YAML's plain timestamp; in UTC it may leave datetime's range (year 1)
        moment = created if isinstance(created, datetime) else datetime.fromisoformat(str(created))
        utc = None if moment.utcoffset() is None else moment.astimezone(UTC)
    except (ValueError, OverflowError):
        utc = None
    if utc is None:
        raise CheckpointError(
            path,
            f"metadata.createdAt must be an ISO 8601 time with a zone (in UTC, years 1 to "
            f"9999), got {created!r:.80}",
        )
    body = text[sum(len(line) + 1 for line in lines[: end + 1]) :]
    return SummaryCheckpoint(
        watermark=numbers["watermark"],
        summary=body,
        created_at=utc,
        covered_messages=numbers["coveredMessages"],
    )


def _front_lines(lines: list[str]) -> tuple[int, int | None]:
    """Where the front matter's YAML starts and the index of the line that ends it.

    A YAML tool may have written directives (``%YAML 1.1``) and its own
    ``---`` document start after our opening fence, and may end the document
    with ``...`` before our closing fence.  None: no end.
    """
    at = 1
    while at < len(lines) and lines[at].startswith("%"):
        at += 1
    first = 1
    if at < len(lines) and _FENCE.match(lines[at].rstrip("\r")):
        first = at  # its own document start: the marker is read as part of the YAML
        lines[at] = " " * 3 + lines[at][3:]
        at += 1
    for end in range(at, len(lines)):
        if lines[end].rstrip("\r") in ("---", "..."):
            return first, end
    return first, None
