"""What the commands print: the one module that writes output.  A checkpoint holds untrusted
text, so all of it goes through ``safe`` (control characters escaped; in table cells and
fields, newlines and tabs too): a session cannot drive the terminal.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec

from .roots import detect

OK, PROBLEM, USAGE = 0, 1, 2  # exit statuses: all well; a store's problem; a usage error

# Escaped: C0 controls (in text, not newline and tab), DEL, C1 controls (8-bit CSI
# and OSC), and the line separators and bidirectional overrides.
_CONTROL = r"\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_IN_TEXT = re.compile(f"[{_CONTROL}]")
_IN_CELL = re.compile(rf"[\t\n{_CONTROL}]")
_IN_JSON = re.compile(r"[\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(text: str, *, cell: bool = False) -> str:
    """``text`` with its control characters (in a ``cell``, newlines and tabs too) escaped."""
    return (_IN_CELL if cell else _IN_TEXT).sub(_escape, text)


def line(text: str = "") -> None:
    print(safe(text))


def error(command: str, message: str, *, stdout: bool = False) -> None:
    """``checkpointer <command>: <message>``, an error or a warning, on stderr (or stdout)."""
    print(safe(f"checkpointer {command}: {message}"), file=sys.stdout if stdout else sys.stderr)


def table(rows: list[list[str]], *, right: set[int]) -> None:
    rows = [[safe(cell, cell=True) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        print("  ".join(cells).rstrip())


def fields(pairs: Sequence[tuple[str, str]]) -> None:
    width = max(len(name) for name, _ in pairs)
    for name, value in pairs:
        print(f"{safe(name, cell=True):<{width}}  {safe(value, cell=True)}")


def json_rows(rows: Sequence[msgspec.Struct]) -> None:
    """A JSON array, indented, for scripts (control characters as ``\\u`` escapes)."""
    text = msgspec.json.format(msgspec.json.encode(rows)).decode()
    sys.stdout.write(_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text) + "\n")


def raw(data: bytes) -> None:
    """Bytes as they are, ending in a newline; escaped (``safe``) when stdout is a terminal."""
    sys.stdout.flush()
    if sys.stdout.isatty():
        data = safe(data.decode("utf-8", "backslashreplace")).encode()
    sys.stdout.buffer.write(data if data.endswith(b"\n") else data + b"\n")


def flush() -> None:
    sys.stdout.flush()


def silence() -> None:
    """Point stdout at /dev/null (its reader has gone): no second error at exit."""
    with contextlib.suppress(OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


UNCOUNTED = "?"
"""The turns of a history holding a message of a shape no dialect knows: not counted."""


def message_line(message: Any, width: int = 100) -> str:
    """A message on one line, in its dialect's words (else its JSON): who, text, calls made."""
    dialect = detect(message)
    if dialect is None:
        return "(unrecognised) " + one_line(msgspec.json.encode(message).decode(), width)
    said = dialect.text(message)
    calls = dialect.call_names(message)
    if calls:
        said = f"{said} -> {len(calls)} tool call(s): {', '.join(calls)}".strip()
    return f"{dialect.label(message)}: {one_line(said, width)}"


def some(texts: Sequence[str], *, sep: str = ", ", most: int = 3) -> str:
    shown = sep.join(texts[:most])
    return shown if len(texts) <= most else f"{shown} and {len(texts) - most} more"


def one_line(text: str, width: int) -> str:
    """Whitespace runs as one space, cut to ``width`` with ``...``."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "missing or null"
    return names.get(type(value), "a number" if isinstance(value, (int, float)) else "?")


def utc(value: datetime) -> datetime:
    """A meta time as UTC: one without a zone (hand-written) is UTC, as the writer's are."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def when(value: datetime | None, suffix: str = "") -> str:
    """A time in UTC to the second (``?`` when unknown)."""
    if value is None:
        return "?"
    try:
        return f"{utc(value).astimezone(UTC):%Y-%m-%d %H:%M:%S}{suffix}"
    except OverflowError:  # outside the calendar once in UTC: as written
        return str(value)


def size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    scaled = n / 1024
    for unit in ("KiB", "MiB"):
        if scaled < 1024:
            return f"{scaled:.1f} {unit}"
        scaled /= 1024
    return f"{scaled:.1f} GiB"


def value(value: Any) -> str:
    """A value as ``ls`` and ``show`` print it (``?`` when unknown)."""
    if value is None:
        return "?"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return when(value, " UTC")
    if isinstance(value, msgspec.Struct):
        value = msgspec.structs.asdict(value)
    if isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def ago(seconds: float) -> str:
    """An age, in its largest whole unit: ``10d``, ``3h``, ``5m``, ``7s``."""
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= length:
            return f"{seconds / length:.0f}{unit}"
    return f"{max(seconds, 0):.0f}s"
