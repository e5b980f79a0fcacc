"""A reader of the YAML that a summary checkpoint's front matter is, in any tool's style.

``summary.py`` writes the front matter in one fixed shape; PyYAML,
ruamel.yaml or a person may re-save it in another: block or flow mappings,
quoted keys, plain and quoted scalars over several lines (folded as YAML
folds them), literal and folded block scalars with their indicators, tags
(``!!int`` converts, ``!!str`` keeps text, the others are dropped),
anchors, comments, ``? key`` entries.  Not read: aliases, and block
sequences (no front matter of ours has one).  The runtime has no YAML
library, hence this reader; ``tests/test_summary_resave.py`` compares it
with both libraries.
"""

from __future__ import annotations

import contextlib
import re
import string
from typing import Any

from .._values import CheckpointError

__all__ = ["front_matter"]

_INT = re.compile(r"^[+-]?[0-9]+$")


def front_matter(lines: list[str], path: str, number: int = 2) -> Any:
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
