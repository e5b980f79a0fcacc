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
scalar), and the reader (``_Reader``) reads the YAML that tools write for
that shape, in any of their styles: block and flow mappings, quoted keys,
plain and quoted scalars over several lines (folded as YAML folds them),
literal and folded block scalars, tags, anchors, comments, directives and
document markers (not aliases).  So a file re-saved by PyYAML or
ruamel.yaml still loads (``tests/test_summary_resave.py``).  The body is
the summary byte for byte: it may hold ``---`` lines, since the front
matter ends at its first ``---`` line and none of its own values can
contain one.
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


_INT = re.compile(r"^[+-]?[0-9]+$")
_FENCE = re.compile(r"^---(?:[ \t].*)?$")  # a document start marker, content may follow


def _parse(text: str, path: str) -> SummaryCheckpoint:
    lines = text.split("\n")
    if lines[0].rstrip("\r") != "---":
        raise CheckpointError(path, "does not start with a '---' front matter fence")
    first, end = _front_lines(lines)
    if end is None:
        raise CheckpointError(path, "the front matter has no closing '---' line")
    top = _front_matter([line.rstrip("\r") for line in lines[first:end]], path, first + 1)
    if end < len(lines) and lines[end].rstrip("\r") == "...":  # a YAML document end
        end += int(end + 1 < len(lines) and lines[end + 1].rstrip("\r") == "---")
    if not isinstance(top, dict):
        raise CheckpointError(path, "the front matter is not a mapping")
    meta = top.get("metadata")
    if not isinstance(meta, dict):
        raise CheckpointError(path, "the front matter has no 'metadata' mapping")
    if meta.get("type") != "checkpoint":
        raise CheckpointError(path, f"metadata.type is {meta.get('type')!r}, not 'checkpoint'")
    numbers = {}
    for name in ("watermark", "coveredMessages"):
        value = meta.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
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


def _front_matter(lines: list[str], path: str, number: int = 2) -> Any:
    """The YAML node of the front matter's lines (``lines[0]`` is line ``number`` of the file).

    The block and flow styles YAML tools write are read: block and flow
    mappings, plain, quoted and block (``|``, ``>``) scalars over several
    lines, tags (``!!int`` converts, the others are dropped), anchors,
    comments, ``? key`` entries; not aliases or block sequences of mappings.
    """
    lines = [line for line in lines if not line.startswith("%")]
    reader = _Reader("".join(line + "\n" for line in lines), path, number)
    value = reader.block(-1)
    reader.skip(newlines=True)
    if reader.at < len(reader.text):
        reader.fail("more after the front matter's mapping (not a 'key: value' line?)")
    return value


_FLOW_END = ",[]{}"


class _Reader:
    """A reader of the YAML that summary front matter is, after any tool re-saved it."""

    def __init__(self, text: str, path: str, number: int) -> None:
        self.text, self.path, self.number, self.at = text, path, number, 0

    def fail(self, why: str, at: int | None = None) -> None:
        line = self.number + self.text.count("\n", 0, self.at if at is None else at)
        raise CheckpointError(self.path, f"line {line}: {why}")

    def column(self, at: int | None = None) -> int:
        at = self.at if at is None else at
        return at - (self.text.rfind("\n", 0, at) + 1)

    def peek(self, n: int = 1) -> str:
        return self.text[self.at : self.at + n]

    def skip(self, *, newlines: bool) -> None:
        """Skip spaces, tabs and comments; and line breaks when ``newlines``."""
        text = self.text
        while self.at < len(text):
            char = text[self.at]
            if char in " \t" or (char == "\n" and newlines):
                self.at += 1
            elif char == "#" and (self.at == 0 or text[self.at - 1] in " \t\n"):
                end = text.find("\n", self.at)
                self.at = len(text) if end < 0 else end
            else:
                return

    def properties(self) -> str | None:
        """Tags and anchors before a node; the tag, if any."""
        tag = None
        while self.peek() in ("!", "&"):
            match = re.compile(r"[^ \t\n,\[\]{}]*").match(self.text, self.at)
            assert match is not None
            if self.peek() == "!":
                tag = match.group()
            self.at = match.end()
            self.skip(newlines=False)
        if self.peek() == "*":
            self.fail("an alias (*name): not read in a summary's front matter")
        return tag

    def block(self, indent: int) -> Any:
        """The node at the reader, in block context, a child of a node at ``indent``."""
        self.skip(newlines=True)
        tag = self.properties()
        if self.peek() in ("\n", "#") or (self.peek() == "" and tag):
            self.skip(newlines=True)
        if self.at >= len(self.text) or self.column() <= indent:
            return _tagged(tag, None, self) if tag else None
        char = self.peek()
        if char in "|>":
            return _tagged(tag, self.block_scalar(indent), self)
        if char in "{[":
            return _tagged(tag, self.flow(), self)
        if char == "-" and self.peek(2) in ("-", "- ", "-\n"):
            self.fail("a block sequence item (- ...): not a 'key: value' line")
        if char == "?" and self.peek(2) in ("? ", "?\n"):
            return self.mapping(self.column())
        start = self.at
        key, quoted = self.scalar_in_line()
        self.skip(newlines=False)
        if self.peek() == ":" and self.peek(2) in (":", ": ", ":\n", ":\t"):
            self.at = start
            return self.mapping(self.column())
        if not quoted:
            self.at = start
            return _tagged(tag, _resolve(self.plain(indent, flow=False), tag), self)
        return _tagged(tag, key, self)

    def mapping(self, indent: int) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        while True:
            if self.column() != indent:
                self.fail("indented text that belongs to no mapping")
            if self.peek() == "?":
                self.at += 1
                key = self.block(indent)
                self.skip(newlines=True)
                if self.peek() != ":" or self.column() != indent:
                    self.fail("a '? key' with no ': value'")
            else:
                key, _ = self.scalar_in_line()
                self.skip(newlines=False)
                if self.peek() != ":":
                    self.fail("not a 'key: value' line")
            self.at += 1
            out[key] = self.block(indent)
            self.skip(newlines=True)
            if self.at >= len(self.text) or self.column() < indent:
                return out

    def scalar_in_line(self) -> tuple[Any, bool]:
        """A mapping key: a quoted scalar, or a plain one up to ``: `` on its line."""
        if self.peek() in ("'", '"'):
            return self.quoted(), True
        match = re.compile(r"[^\n]*?(?=:(?:[ \t\n]|$)|[ \t]#|\n|$)").match(self.text, self.at)
        assert match is not None
        self.at = match.end()
        return _resolve(match.group().strip()), False

    def quoted(self) -> str:
        quote, number = self.peek(), self.at
        close = _closing(self.text[self.at :], quote)
        if close < 0:
            self.fail(f"a {_QUOTES[quote]} string never closed", number)
        raw = self.text[self.at + 1 : self.at + close]
        self.at += close + 1
        try:
            value = _fold(raw, quote=quote)
        except ValueError as exc:
            self.fail(f"a bad {_QUOTES[quote]} string: {exc}", number)
        with contextlib.suppress(UnicodeError):  # "\\ud83d\\ude80", as JSON writes it
            value = value.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
        return value

    def plain(self, indent: int, *, flow: bool) -> str:
        """A plain scalar, over the lines indented deeper than ``indent`` (any, in flow)."""
        parts: list[str] = []
        text = self.text
        while True:
            end = self.at
            while end < len(text) and text[end] != "\n":
                char = text[end]
                if char == "#" and end > 0 and text[end - 1] in " \t":
                    break
                if flow and (
                    char in _FLOW_END
                    or (
                        char == ":" and text[end + 1 : end + 2] in ("", " ", "\t", "\n", *_FLOW_END)
                    )
                ):
                    break
                end += 1
            parts.append(text[self.at : end].strip())
            self.at = end
            if end >= len(text) or text[end] != "\n":
                break
            following = end + 1
            nxt = text.find("\n", following)
            line = text[following : len(text) if nxt < 0 else nxt]
            if line.strip() and (len(line) - len(line.lstrip(" ")) <= indent and not flow):
                break
            if line.lstrip().startswith("#"):
                break
            self.at = following
        while len(parts) > 1 and not parts[-1]:
            parts.pop()
        return _fold("\n".join(parts), quote="")

    def block_scalar(self, indent: int) -> str:
        """A literal (``|``) or folded (``>``) block scalar, with its indicators."""
        style = self.peek()
        match = re.compile(r"[|>]([+-]?)([1-9]?)([+-]?)").match(self.text, self.at)
        assert match is not None
        chomp, digit = match[1] or match[3], match[2]
        self.at = match.end()
        self.skip(newlines=False)
        if self.peek() not in ("", "\n"):
            self.fail("text after a block scalar's indicator")
        text = self.text
        own = max(indent, 0) + int(digit) if digit else None
        taken: list[str] = []
        pos = self.at + 1 if self.peek() == "\n" else len(text) + 1
        while pos < len(text):  # after the last line break: no line
            newline = text.find("\n", pos)
            line_end = len(text) if newline < 0 else newline
            line = text[pos:line_end]
            depth = len(line) - len(line.lstrip(" "))
            if line.strip():
                if own is None:
                    own = depth
                if depth < own or own <= indent:
                    break
            taken.append(line)
            self.at, pos = line_end, line_end + 1
        content = [line[own or 0 :] if line.strip() else "" for line in taken]
        trail = 0
        while content and not content[-1]:
            content.pop()
            trail += 1
        value = content[0] if content else ""
        k = 1
        while k < len(content):
            blanks = 0
            while not content[k]:
                blanks, k = blanks + 1, k + 1
            prev, line = content[k - blanks - 1], content[k]
            if style == ">" and prev[:1] not in ("", " ", "\t") and line[0] not in " \t":
                value += "\n" * blanks if blanks else " "  # folded: a break is a space
            else:
                value += "\n" * (blanks + 1)
            value += line
            k += 1
        if chomp == "-" or not content:
            return value + "\n" * trail if chomp == "+" else value
        return value + "\n" + ("\n" * trail if chomp == "+" else "")

    def flow(self) -> Any:
        """A flow node: ``{...}``, ``[...]`` or a scalar, over any lines."""
        self.skip(newlines=True)
        tag = self.properties()
        self.skip(newlines=True)
        char = self.peek()
        if char in "{[":
            close = "}" if char == "{" else "]"
            self.at += 1
            mapping: dict[Any, Any] = {}
            items: list[Any] = []
            while True:
                self.skip(newlines=True)
                if self.peek() == close:
                    self.at += 1
                    break
                if self.peek() == "?":
                    self.at += 1
                key = self.flow()
                self.skip(newlines=True)
                value = None
                if self.peek() == ":":
                    self.at += 1
                    self.skip(newlines=True)
                    value = None if self.peek() in (",", close) else self.flow()
                    self.skip(newlines=True)
                if char == "{":
                    mapping[key] = value
                else:
                    items.append(key if value is None else {key: value})
                if self.peek() == ",":
                    self.at += 1
                elif self.peek() != close:
                    self.fail(f"a flow {'mapping' if char == '{' else 'sequence'} never closed")
            return _tagged(tag, mapping if char == "{" else items, self)
        if char in ("'", '"'):
            return _tagged(tag, self.quoted(), self)
        if char == "" or char in _FLOW_END:
            return _tagged(tag, None, self) if tag else None
        return _tagged(tag, _resolve(self.plain(-1, flow=True), tag), self)


_STR_TAGS = ("!!str", "!<tag:yaml.org,2002:str>")


def _resolve(plain: str, tag: str | None = None) -> Any:
    """A plain scalar's value: an int, null, or the text (always the text if tagged so)."""
    if tag in _STR_TAGS:
        return plain
    if _INT.match(plain):
        return int(plain)
    if plain in ("", "~", "null", "Null", "NULL"):
        return None
    return plain


def _tagged(tag: str | None, value: Any, reader: _Reader) -> Any:
    """``value`` as its tag has it: ``!!int`` converts, ``!!str`` keeps text; others drop."""
    if tag in ("!!int", "!<tag:yaml.org,2002:int>") and isinstance(value, str):
        if not _INT.match(value.strip()):
            reader.fail(f"!!int {value!r} is not an integer")
        return int(value)
    if tag in _STR_TAGS and value is None:
        return ""
    return value


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
