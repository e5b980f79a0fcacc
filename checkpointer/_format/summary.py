"""The summary checkpoint's file: Markdown with a YAML front matter, to and from bytes.

A summary checkpoint (``_values.SummaryCheckpoint``) lives beside the
session at ``<root>/sessions/<key>/checkpoint.md`` (``_stores/summaries.py``)
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
scalar), and the reader parses just that shape: keys, one nested mapping,
and the three flow scalars (plain, single- and double-quoted, with YAML's
escapes), which may run over several lines, folded as YAML folds them.  So a
file re-saved by a YAML tool still loads: ``yaml.safe_dump`` wraps the long
``description`` at 80 columns.  The body is the summary byte for byte: it
may hold ``---`` lines, since the front matter ends at its first ``---``
line and none of its own values can contain one.
"""

from __future__ import annotations

import contextlib
import json
import re
import string
from datetime import UTC, datetime
from typing import Any

from .._values import CheckpointError, SummaryCheckpoint

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
    top = _front_matter([line.rstrip("\r") for line in lines[1:end]], path)
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


def _front_matter(lines: list[str], path: str) -> dict[str, Any]:
    """The mapping of the front matter's lines (line 2 of the file is ``lines[0]``)."""
    top: dict[str, Any] = {}
    section: dict[str, Any] | None = None
    at = 0
    while at < len(lines):
        number, line = at + 2, lines[at]
        at += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _LINE.match(line)
        if match is None:
            raise CheckpointError(path, f"line {number}: not a 'key: value' line: {line!r:.80}")
        indent, key, value = len(match["indent"]), match["key"], match["value"] or None
        if value is not None:
            value, used = _scalar(value, lines, at, indent, path, number)
            at += used
        if not indent:
            if value is None:
                section = top[key] = {}
            else:
                section = None
                top[key] = value
        elif section is None:
            raise CheckpointError(path, f"line {number}: indented {key!r} belongs to no mapping")
        elif value is None:
            raise CheckpointError(path, f"line {number}: {key!r} nests deeper than expected")
        else:
            section[key] = value
    return top


def _scalar(
    first: str, lines: list[str], at: int, indent: int, path: str, number: int
) -> tuple[Any, int]:
    """The scalar that starts with ``first`` and may go on in ``lines[at:]``.

    A quoted scalar goes on until its closing quote, a plain one over the
    lines indented deeper than its key (``indent``), as YAML has it: the
    line breaks are folded (one break is a space, each blank line a newline,
    the white space around a break dropped; in double quotes an escaped
    break joins the lines).  Returns the value and the lines used after the
    first.
    """
    quote = first[0] if first[0] in "\"'" else ""
    if not quote:
        used = 0
        raw = [_plain_part(first)]
        while at + used < len(lines) and raw[-1] is not None:
            line = lines[at + used]
            if line.strip() and len(line) - len(line.lstrip(" ")) <= indent:
                break  # the next key
            used += 1
            raw.append(_plain_part(line) if line.strip() else "")
        parts = [part for part in raw if part is not None]
        while len(parts) > 1 and not parts[-1]:
            parts.pop()  # blank lines after it are not part of it
            used -= 1
        value = _fold("\n".join(parts), quote="")
        return (int(value) if _INT.match(value) else value), used
    text, used = first, 0
    while (close := _closing(text, quote)) < 0:
        if at + used >= len(lines):
            raise CheckpointError(path, f"line {number}: a {_QUOTES[quote]} string never closed")
        line = lines[at + used]
        if line.strip() and len(line) - len(line.lstrip(" ")) <= indent:
            raise CheckpointError(path, f"line {number}: a {_QUOTES[quote]} string never closed")
        text += "\n" + line
        used += 1
    rest = text[close + 1 :].strip()
    if rest and not rest.startswith("#"):
        raise CheckpointError(path, f"line {number}: text after a {_QUOTES[quote]} string")
    try:
        value = _fold(text[1:close], quote=quote)
    except ValueError as exc:
        raise CheckpointError(
            path, f"line {number}: a bad {_QUOTES[quote]} string: {exc}"
        ) from None
    with contextlib.suppress(UnicodeError):  # "\\ud83d\\ude80", as JSON writes it: one character
        value = value.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
    return value, used


_QUOTES = {'"': "double-quoted", "'": "single-quoted"}


def _plain_part(line: str) -> str | None:
    """A line of a plain scalar up to a comment; None for a comment line (the scalar ends)."""
    stripped = line.strip()
    if stripped.startswith("#"):
        return None
    cut = re.search(r"[ \t]#", stripped)
    return stripped[: cut.start()] if cut else stripped


def _closing(text: str, quote: str) -> int:
    """The index of the quote closing the scalar ``text`` opens, or -1."""
    at = 1
    while at < len(text):
        char = text[at]
        if quote == '"' and char == "\\":
            at += 2
            continue
        if char == quote:
            if quote == "'" and text[at + 1 : at + 2] == "'":
                at += 2  # '' is one quote
                continue
            return at
        at += 1
    return -1


_ESCAPES = {
    "0": "\0", "a": "\a", "b": "\b", "t": "\t", "\t": "\t", "n": "\n", "v": "\v",
    "f": "\f", "r": "\r", "e": "\x1b", " ": " ", '"': '"', "/": "/", "\\": "\\",
    "N": "\x85", "_": "\xa0", "L": "\u2028", "P": "\u2029",
}  # fmt: skip
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}


def _fold(raw: str, *, quote: str) -> str:
    """A flow scalar's content (between its quotes) with its line breaks folded.

    Raises:
        ValueError: a bad escape in a double-quoted scalar.
    """
    out: list[str] = []
    space = ""  # white space so far, dropped if a line break follows it
    at, end = 0, len(raw)
    while at < end:
        char = raw[at]
        if char in " \t":
            space += char
            at += 1
            continue
        if char == "\n":
            space, blank = "", 0
            at += 1
            while True:
                while at < end and raw[at] in " \t":
                    at += 1
                if at < end and raw[at] == "\n":
                    blank += 1
                    at += 1
                    continue
                break
            out.append("\n" * blank if blank else " ")
            continue
        out.append(space)
        space = ""
        if quote == '"' and char == "\\":
            escape = raw[at + 1 : at + 2]
            if escape == "\n":  # an escaped line break: the lines join
                at += 2
                while at < end and raw[at] in " \t":
                    at += 1
                continue
            if escape in _ESCAPES:
                out.append(_ESCAPES[escape])
                at += 2
                continue
            size = _HEX_ESCAPES.get(escape, 0)
            digits = raw[at + 2 : at + 2 + size]
            if not size or len(digits) != size or not all(c in string.hexdigits for c in digits):
                raise ValueError(f"unknown escape {raw[at : at + 2 + size]!r}")
            out.append(chr(int(digits, 16)))
            at += 2 + size
            continue
        if quote == "'" and char == "'":
            at += 1  # the first of '', which stands for one quote
        out.append(raw[at])
        at += 1
    out.append(space)
    return "".join(out)
