"""What the commands print, and how values read in it.

The only module of the package that writes to stdout or stderr (the demo
prints its own lines, and argparse its usage).  The formatting helpers are
pure: a value in, a string out.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec

__all__ = [
    "OK",
    "PROBLEM",
    "USAGE",
    "ago",
    "error",
    "fields",
    "flush",
    "json_rows",
    "json_type",
    "line",
    "message_line",
    "one_line",
    "opt",
    "raw",
    "silence",
    "size",
    "table",
    "text",
    "utc",
    "value",
    "warning",
    "when",
    "write",
    "yes",
]

OK, PROBLEM, USAGE = 0, 1, 2
"""Exit statuses: all well; a problem with the store; a usage error (argparse's own)."""


# -- printing --------------------------------------------------------------------


def line(text: str = "") -> None:
    """One line on stdout."""
    print(text)


def error(command: str, message: str) -> None:
    """``checkpointer <command>: <message>`` on stderr."""
    print(f"checkpointer {command}: {message}", file=sys.stderr)


def warning(command: str, message: str, *, stdout: bool = False) -> None:
    """Like ``error``, on stdout where the command always said it there."""
    print(f"checkpointer {command}: {message}", file=sys.stdout if stdout else sys.stderr)


def table(rows: list[list[str]], *, right: set[int]) -> None:
    """Columns as wide as their widest cell; those in ``right`` right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        print("  ".join(cells).rstrip())


def fields(pairs: Sequence[tuple[str, str]]) -> None:
    """``name  value`` lines, the values aligned."""
    width = max(len(name) for name, _ in pairs)
    for name, value in pairs:
        print(f"{name:<{width}}  {value}")


def json_rows(rows: Sequence[msgspec.Struct]) -> None:
    """A JSON array, indented, for scripts."""
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(rows)).decode() + "\n")


def write(text: str) -> None:
    """Text on stdout, as it is."""
    sys.stdout.write(text)


def raw(data: bytes) -> None:
    """Bytes as they are, ending in a newline."""
    sys.stdout.flush()
    sys.stdout.buffer.write(data if data.endswith(b"\n") else data + b"\n")


def flush() -> None:
    """Flush stdout: a closed pipe shows here, not at interpreter exit."""
    sys.stdout.flush()


def silence() -> None:
    """Point stdout at /dev/null (its reader has gone): no second error at exit."""
    with contextlib.suppress(OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


# -- values in words -------------------------------------------------------------


def text(content: Any) -> str:
    """The text of a message's content: a string, or a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = (p.get("text") if isinstance(p, dict) else p for p in content)
        return " ".join(p for p in parts if isinstance(p, str))
    return "" if content is None else str(content)


def message_line(message: Any, width: int = 100) -> str:
    """A message on one line: role (a tool result's call id), text, the calls it makes."""
    if not isinstance(message, dict):
        return one_line(msgspec.json.encode(message).decode(), width)
    role = str(message.get("role", "?"))
    if role == "tool" and "tool_call_id" in message:
        role = f"tool[{message['tool_call_id']}]"
    said = text(message.get("content"))
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        names = ", ".join(_call_name(c) for c in calls)
        said = f"{said} -> {len(calls)} tool call(s): {names}".strip()
    return f"{role}: {one_line(said, width)}"


def _call_name(call: Any) -> str:
    """The function name of a tool call, ``?`` when it has none (a hand-edited call)."""
    if not isinstance(call, dict):
        return "?"
    function = call.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    return str(name or call.get("name") or "?")


def one_line(text: str, width: int) -> str:
    """Whitespace runs as one space, cut to ``width`` with ``...``."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def json_type(value: Any) -> str:
    """What kind of JSON value this is, in words."""
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
    """A size in bytes, KiB, MiB or GiB."""
    if n < 1024:
        return f"{n} B"
    scaled = n / 1024
    for unit in ("KiB", "MiB"):
        if scaled < 1024:
            return f"{scaled:.1f} {unit}"
        scaled /= 1024
    return f"{scaled:.1f} GiB"


def opt(value: int | None) -> str:
    """A number, or ``?`` when unknown."""
    return "?" if value is None else str(value)


def yes(value: bool | None) -> str:
    """yes, no, or ``?`` when unknown."""
    return "?" if value is None else "yes" if value else "no"


def value(value: Any) -> str:
    """A meta field's value, as ``show`` prints it."""
    if isinstance(value, bool):
        return yes(value)
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
