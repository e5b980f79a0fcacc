"""The journal's rows (file lines, or PostgreSQL rows), read back and built.

A checkpoint is one batch, written with one write and one fsync: zero or more
``message`` rows, then one row with the meta.  A crash can leave only an
unfinished last batch (a ``TornTail``, ignored); other damage cannot be trusted."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import msgspec

from .._values import CheckpointError, Meta, NewerVersionError, TornTail
from .._version import VERSION
from .envelope import FORMAT, check_format, newer_format

__all__ = [
    "LINE_END",
    "ROW_END",
    "JournalScan",
    "assemble",
    "assemble_rows",
    "compaction_row",
    "header_line",
    "message_rows",
    "meta_row",
    "scan_journal",
    "state_row",
]


class _Header(msgspec.Struct, tag="header", tag_field="kind"):
    """The first line, once: the format and the meta of the checkpoint that made the file."""

    format: int
    meta: Meta


class _Message(msgspec.Struct, tag="message", tag_field="kind"):
    """One message appended to the transcript."""

    message: msgspec.Raw


class _MetaRow(msgspec.Struct, tag="meta", tag_field="kind"):
    """Only the meta changed, or it closes an append of messages."""

    meta: Meta


class _StateRow(msgspec.Struct, tag="state", tag_field="kind"):
    """The rest of the state changed; its transcript is null (the transcript is the rows)."""

    meta: Meta
    state: msgspec.Raw


class _Compaction(msgspec.Struct, tag="compaction", tag_field="kind"):
    """The whole state; ``transcript`` names its transcript's key (None: it has none)."""

    meta: Meta
    state: msgspec.Raw
    transcript: str | None = None


_Row = _Header | _Message | _MetaRow | _StateRow | _Compaction
_ROWS = msgspec.json.Decoder(_Row)
_OBJECT = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ARRAY = msgspec.json.Decoder(list[msgspec.Raw])
_ENCODER = msgspec.json.Encoder()


_MESSAGE_HEAD = b'{"kind":"message","message":'
_META_HEAD = b'{"kind":"meta","meta":'
_STATE_HEAD = b'{"kind":"state","meta":'
_COMPACTION_HEAD = b'{"kind":"compaction","meta":'
_HEADER_HEAD = b'{"kind":"header","format":%d,"meta":' % FORMAT
LINE_END = b"}\n"
"""How a row ends in a journal file: one line each."""
ROW_END = b"}"
"""How a row ends in a PostgreSQL journal: one table row each."""


def _kind(row: _Row) -> str:
    return type(row).__struct_config__.tag  # type: ignore[return-value]


class JournalScan(NamedTuple):
    """A journal read and checked, up to its last complete checkpoint."""

    meta: Meta
    end: int  # byte offset just past the last committed row
    live: int  # bytes of the header line and the last compaction line
    compaction: _Compaction
    compaction_line: int
    after: list[_Row]  # committed rows after the last compaction
    torn: TornTail | None


def scan_journal(
    data: bytes, path: str, open_row: Callable[[bytes, int], bytes] | None = None
) -> JournalScan:
    """Parse a journal; ignore an unfinished last batch; reject any other damage.

    ``open_row(line, offset)``: an encrypted journal's plaintext of each
    complete line (a line cut short is a torn tail, never opened).

    Raises:
        CheckpointError: damage a crash cannot leave (not in the last batch);
            ``DecryptionError`` from ``open_row``.
        NewerVersionError: a row or a format that a newer version wrote.
    """
    if not data:
        raise CheckpointError(path, "the journal is empty (its creation never finished?)")
    size, hole = len(data), ""
    if (nul := data.find(b"\0")) >= 0:  # JSON never holds a raw NUL: a hole of a crash
        data, hole = _cut_hole(data, nul, path, open_row)
    rows, ends, partial, unparsable = _parse_rows(data, path, open_row)
    compaction, last_commit = _check_rows(rows, path)
    end = ends[last_commit]
    torn = None
    if end < size:
        pending = len(rows) - 1 - last_commit
        reasons = [
            f"{pending} message row(s) without the row that closes their append" if pending else "",
            unparsable,
            f"a last line of {len(partial)} bytes with no newline" if partial else "",
            hole,
        ]
        torn = TornTail(
            line=last_commit + 2,
            offset=end,
            nbytes=size - end,
            reason="an append that never finished: " + "; ".join(r for r in reasons if r),
        )
    last = rows[last_commit]
    assert not isinstance(last, _Message)
    return JournalScan(
        meta=last.meta,
        end=end,
        live=ends[0] + ends[compaction] - ends[compaction - 1],
        compaction=_compaction(rows, compaction),
        compaction_line=compaction + 1,
        after=rows[compaction + 1 : last_commit + 1],
        torn=torn,
    )


def _parse_rows(
    data: bytes, path: str, open_row: Callable[[bytes, int], bytes] | None
) -> tuple[list[_Row], list[int], bytes, str]:
    """The rows of the complete lines, the offset after each, the bytes after the last
    newline, and why the last complete line is no row ("" if it is one)."""
    lines = data.split(b"\n")
    partial = lines.pop()  # b"" when the file ends with a newline, as it should
    rows: list[_Row] = []
    ends: list[int] = []
    offset = 0
    for number, stored in enumerate(lines, 1):
        line = stored if open_row is None else open_row(stored, offset)
        try:
            row = _ROWS.decode(line)
        except (msgspec.DecodeError, RecursionError) as exc:  # ValidationError included
            if number == 1:
                check_format(line, path)  # the format and library version, as a snapshot's
            else:
                _check_newer_row(line, number, lines[number:], path)
            if number == len(lines) and not partial:
                return rows, ends, partial, f"line {number} is not a journal row ({exc})"
            raise CheckpointError(
                path,
                f"line {number} is not a journal row ({exc}); a crash can only damage "
                "the last line, so this journal cannot be trusted",
            ) from None
        rows.append(row)
        offset += len(stored) + 1
        ends.append(offset)
    return rows, ends, partial, ""


def _check_rows(rows: list[_Row], path: str) -> tuple[int, int]:
    """The indices of the last compaction and of the last row that closes a batch."""
    if not rows or not isinstance(rows[0], _Header):
        raise CheckpointError(path, "line 1 is not a journal header: not a journal file")
    header = rows[0]
    if header.format > FORMAT:
        raise newer_format(path, header.format, header.meta.library_version)
    if header.format < 1:
        raise CheckpointError(path, f"unknown journal format version {header.format}")
    last_commit = compaction = -1
    for index, row in enumerate(rows[1:], 1):
        number = index + 1
        if isinstance(row, _Header):
            if row.format > FORMAT:
                raise _newer_row(path, number, f"a header of format {row.format}", row.meta)
            raise CheckpointError(path, f"line {number}: a second header row")
        if isinstance(row, _Compaction):
            compaction = index
        elif compaction < 0:
            raise CheckpointError(path, f"line {number}: a {_kind(row)} row before any compaction")
        elif (
            isinstance(row, _Message | _StateRow)
            and _compaction(rows, compaction).transcript is None
        ):
            raise CheckpointError(
                path,
                f"line {number}: a {_kind(row)} row, but the compaction at line "
                f"{compaction + 1} has no transcript",
            )
        if not isinstance(row, _Message):
            last_commit = index
    if last_commit < 0:
        raise CheckpointError(path, "no complete checkpoint after the header")
    return compaction, last_commit


_KINDS = frozenset({"header", "compaction", "message", "state", "meta"})


class _AnyRow(msgspec.Struct):
    """What any row of any version has: a ``kind``; maybe a ``format`` and a ``meta``."""

    kind: str
    format: int = 0
    meta: Any = None


_ANY_ROW = msgspec.json.Decoder(_AnyRow)


def _check_newer_row(line: bytes, number: int, later: list[bytes], path: str) -> None:
    """Raise ``NewerVersionError`` if ``line`` is a whole row that a newer version wrote:
    neither a crash's nor damage, wherever it is, so the writer leaves the key alone."""
    try:
        row = _ANY_ROW.decode(line)
    except (msgspec.DecodeError, RecursionError):
        return  # not a row of any version: damage (or a torn tail)
    if row.kind in _KINDS and row.format <= FORMAT:
        return  # a known row that does not decode: damage
    what = f"a {row.kind!r} row" + (f" of format {row.format}" if row.format > FORMAT else "")
    meta = row.meta
    for after in later:  # else the row that closes its batch says who wrote it
        if isinstance(meta, dict) and isinstance(meta.get("library_version"), str):
            break
        with contextlib.suppress(msgspec.DecodeError, RecursionError):
            meta = _ANY_ROW.decode(after).meta
    raise _newer_row(path, number, what, meta)


def _newer_row(path: str, number: int, what: str, meta: object) -> NewerVersionError:
    if isinstance(meta, Meta):
        written_by: object = meta.library_version
    else:
        written_by = meta.get("library_version") if isinstance(meta, dict) else None
    by = f"agent-checkpointer {written_by}" if isinstance(written_by, str) else "a newer version"
    return NewerVersionError(
        path,
        f"line {number}: {what}, written by {by}, which this agent-checkpointer {VERSION} "
        "does not know; upgrade agent-checkpointer to read it (the journal is kept as it is)",
        written_by if isinstance(written_by, str) else None,
    )


def _cut_hole(
    data: bytes, nul: int, path: str, open_row: Callable[[bytes, int], bytes] | None
) -> tuple[bytes, str]:
    """The journal before the line holding its first NUL byte, and why the rest is a torn tail.

    Our JSON never holds a raw NUL: zeros are a hole a power cut left in the
    last append (pages reached the disk out of order).  So from that line on,
    every line must be a hole or a row of one batch, its closing row last;
    anything else, or a NUL in line 1 (fsynced before its rename), is damage.
    A sealed row after the hole is opened where it lies (``DecryptionError`` if
    it does not open: never damage).
    """
    start = data.rfind(b"\n", 0, nul) + 1
    number = data.count(b"\n", 0, start) + 1
    if number == 1:
        raise CheckpointError(
            path, "line 1 holds NUL bytes: a damaged file, not a journal a crash can leave"
        )
    rest = data[start:].split(b"\n")
    closed, at = False, start
    for offset, stored in enumerate(rest):
        where = f"line {number + offset}"
        line, at = stored, at + len(stored) + 1
        if closed and (line or offset < len(rest) - 1):
            raise CheckpointError(
                path,
                f"{where} follows a complete append after the NUL bytes of line {number}: "
                "a crash can only damage the last append, so this journal cannot be trusted",
            )
        if b"\0" in line or offset == len(rest) - 1:
            continue  # a hole, or the last line cut short
        if open_row is not None:
            line = open_row(stored, at - len(stored) - 1)
        try:
            row = _ROWS.decode(line)
        except (msgspec.DecodeError, RecursionError) as exc:
            raise CheckpointError(
                path,
                f"{where} is not a journal row ({exc}), after the NUL bytes of line {number}: "
                "this journal cannot be trusted",
            ) from None
        closed = not isinstance(row, _Message)
    return data[:start], f"NUL bytes from line {number} on (a hole a power cut left)"


def _compaction(rows: list[_Row], index: int) -> _Compaction:
    row = rows[index]
    assert isinstance(row, _Compaction)
    return row


def assemble(scan: JournalScan, path: str) -> bytes:
    """The state as of the last committed row, as JSON: the last compaction's state with
    the rows after it applied (older rows stay in the file until a rewrite)."""
    compaction = scan.compaction
    messages = [row.message for row in scan.after if isinstance(row, _Message)]
    states = [row.state for row in scan.after if isinstance(row, _StateRow)]
    if not messages and not states:
        return bytes(compaction.state)
    name = compaction.transcript
    assert name is not None  # scan_journal checked it
    try:
        base = _OBJECT.decode(compaction.state)
        existing = _ARRAY.decode(base[name])
        rest = _OBJECT.decode(states[-1]) if states else base
    except (msgspec.DecodeError, RecursionError, KeyError) as exc:
        raise CheckpointError(
            path,
            f"line {scan.compaction_line}: the compaction's state has no "
            f"{name!r} array to append to ({exc})",
        ) from None
    existing.extend(messages)
    rest[name] = msgspec.Raw(b"".join([b"[", b",".join(existing), b"]"]))
    return _ENCODER.encode(rest)


def header_line(meta_json: bytes) -> bytes:
    """The first line of a journal file: the format and the meta that created it."""
    return b"".join([_HEADER_HEAD, meta_json, LINE_END])


def message_rows(chunks: Sequence[bytes], end: bytes) -> list[bytes]:
    """A ``message`` row for each encoded message, ending in ``end``."""
    return [b"".join([_MESSAGE_HEAD, chunk, end]) for chunk in chunks]


def meta_row(meta_json: bytes, end: bytes) -> bytes:
    """A ``meta`` row: only the meta changed, or it closes an append of messages."""
    return b"".join([_META_HEAD, meta_json, end])


def state_row(meta_json: bytes, head: bytes, tail: bytes, end: bytes) -> bytes:
    """A ``state`` row: the rest of the state (``head`` and ``tail`` around a null transcript)."""
    return b"".join([_STATE_HEAD, meta_json, b',"state":', head, b"null", tail, end])


def compaction_row(
    meta_json: bytes, transcript: str | None, state: Sequence[bytes], end: bytes
) -> list[bytes]:
    """The pieces of a ``compaction`` row (the whole state, its transcript at ``transcript``),
    to be written with ``writev`` and never joined in memory."""
    name = b"null" if transcript is None else _ENCODER.encode(transcript)
    return [_COMPACTION_HEAD, meta_json, b',"transcript":', name, b',"state":', *state, end]


def assemble_rows(meta_json: bytes, bodies: Sequence[bytes | None], where: str) -> bytes:
    """The state of a PostgreSQL journal key's rows (a compaction first), as JSON: read
    as a journal file's lines, the head's meta closing them as a ``meta`` line would."""
    lines = [header_line(meta_json)]
    lines.extend(body + b"\n" for body in bodies if body is not None)
    lines.append(meta_row(meta_json, LINE_END))
    data = b"".join(lines)
    return assemble(scan_journal(data, where), where)
