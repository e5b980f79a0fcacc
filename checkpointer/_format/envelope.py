"""A checkpoint file (and a PostgreSQL row's bytes): ``{"format": 1, "meta": ..., "state": ...}``.

Every format keeps ``format`` first and ``meta.library_version``, so that an
older reader refuses a newer file naming the version to upgrade to."""

from __future__ import annotations

import functools
import re
from typing import Any

import msgspec

from .._values import Checkpoint, CheckpointError, Meta, NewerVersionError
from .._version import VERSION

__all__ = [
    "FORMAT",
    "MIDDLE",
    "PREFIX",
    "SUFFIX",
    "check_format",
    "decode_checkpoint",
    "decode_meta",
    "decode_raw",
    "decode_state",
    "envelope_chunks",
    "newer_format",
    "peek_meta",
]

FORMAT = 1
"""The envelope version this library writes and the newest it reads."""


class _Envelope(msgspec.Struct):
    format: int
    meta: Meta
    state: msgspec.Raw


class _Head(msgspec.Struct):
    """What every format keeps where an older reader finds it (see the module docstring)."""

    format: int
    meta: Any = None


_ENVELOPE_DECODER = msgspec.json.Decoder(_Envelope)
_HEAD_DECODER = msgspec.json.Decoder(_Head)
_META_ENCODER = msgspec.json.Encoder()
PREFIX = b'{"format":%d,"meta":' % FORMAT  # then the meta, MIDDLE, the state, SUFFIX
MIDDLE = b',"state":'
SUFFIX = b"}"


def envelope_chunks(meta: Meta, state_json: bytes) -> list[bytes]:
    """The pieces of a checkpoint file, joined by the writer thread (``bytes.join`` releases
    the GIL for large results: a 50 MB checkpoint does not stall the event loop)."""
    return [PREFIX, _META_ENCODER.encode(meta), MIDDLE, state_json, SUFFIX]


@functools.lru_cache(maxsize=64)
def _decoder_for(type_: Any) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(type_)


def _state_decoder(type_: Any) -> msgspec.json.Decoder[Any]:
    try:
        return _decoder_for(type_)
    except TypeError:  # an unhashable type expression: build one each time
        return msgspec.json.Decoder(type_)


def _decode_envelope(data: bytes, path: str) -> _Envelope:
    if not data:
        raise CheckpointError(path, "the file is empty (a write never finished?)")
    try:
        envelope = _ENVELOPE_DECODER.decode(data)
    except msgspec.ValidationError as exc:
        check_format(data, path)
        raise CheckpointError(path, f"not a checkpoint envelope: {exc}") from None
    except msgspec.DecodeError as exc:
        raise CheckpointError(path, not_json(data, exc)) from None
    except RecursionError:  # msgspec's answer to deeply nested garbage
        raise CheckpointError(path, "nested too deeply to decode (corrupt?)") from None
    if envelope.format > FORMAT:
        raise newer_format(path, envelope.format, envelope.meta.library_version)
    if envelope.format < 1:
        raise CheckpointError(path, f"unknown format version {envelope.format}")
    return envelope


_LONE_SURROGATE = re.compile(
    rb"(?<!\\)(?:\\\\)*(\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2})"
)
"""A ``\\uXXXX`` escape of half a UTF-16 pair without its other half (not after a ``\\``)."""


def not_json(data: bytes | msgspec.Raw, exc: msgspec.DecodeError) -> str:
    """Why msgspec cannot decode ``data``: it says "truncated" for a lone surrogate escape
    too (``"\\ud83d"``, JSON grammar that ``json.dumps`` writes for half an emoji)."""
    found = _LONE_SURROGATE.search(bytes(data))
    if found is not None:
        escape = found.group(1).decode()
        return (
            f"not readable: it holds a lone UTF-16 surrogate escape ({escape} at byte "
            f"{found.start(1)}), half of a character (an emoji cut in two?), which is no "
            "Unicode text; an encoder that allows it wrote the file (Python's json.dumps "
            "does): replace the escape, with \\ufffd say, to read it"
        )
    return f"not valid JSON (truncated or corrupt): {exc}"


def check_format(data: bytes, path: str) -> None:
    """Raise ``NewerVersionError`` if ``data`` (a file, a journal's first line) is newer."""
    try:
        head = _HEAD_DECODER.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return
    if head.format > FORMAT:
        meta = head.meta if isinstance(head.meta, dict) else {}
        written_by = meta.get("library_version")
        raise newer_format(path, head.format, written_by if isinstance(written_by, str) else None)


def newer_format(path: str, version: int, written_by: str | None) -> NewerVersionError:
    """The error for a file of format ``version``, newer than ``FORMAT``."""
    this = f"format {version}; this agent-checkpointer {VERSION} reads format {FORMAT}"
    if written_by is None:
        reason = f"written by a newer version ({this}); upgrade agent-checkpointer to read it"
    else:
        reason = (
            f"written by a newer version (agent-checkpointer {written_by}); upgrade "
            f"agent-checkpointer to {written_by} or later to read it ({this})"
        )
    return NewerVersionError(path, reason, written_by)


_META_DECODER = msgspec.json.Decoder(Meta)


def peek_meta(head: bytes) -> Meta | None:
    """The meta of an envelope this library wrote, from its first bytes; None if not there.

    The meta is the JSON between ``PREFIX`` and ``MIDDLE`` (no JSON string holds
    ``,"state":`` unescaped, no field of ``Meta`` is named ``state``).
    """
    if not head.startswith(PREFIX):
        return None
    end = head.find(MIDDLE, len(PREFIX))
    if end < 0:
        return None
    try:
        return _META_DECODER.decode(head[len(PREFIX) : end])
    except msgspec.DecodeError:
        return None


def decode_meta(data: bytes, path: str) -> Meta:
    """Decode only the meta of a checkpoint file (the state is skipped)."""
    return _decode_envelope(data, path).meta


def decode_checkpoint(data: bytes, path: str, type: Any = Any) -> Checkpoint[Any]:
    """Decode a whole checkpoint file, its state as ``type``.

    Raises:
        CheckpointError: the bytes are not a checkpoint this library can read,
            or the state does not match ``type`` (the message names the JSON
            path of the bad field, e.g. ``$.state.messages[3].role``).
    """
    envelope = _decode_envelope(data, path)
    return Checkpoint(meta=envelope.meta, state=decode_state(envelope.state, path, type))


def decode_raw(data: bytes, path: str) -> Checkpoint[msgspec.Raw]:
    """Decode a checkpoint file's meta, and its state as the raw JSON it is in the file."""
    envelope = _decode_envelope(data, path)
    return Checkpoint(meta=envelope.meta, state=envelope.state)


def decode_state(data: bytes | msgspec.Raw, path: str, type: Any = Any) -> Any:
    """Decode the JSON of a state as ``type``; errors name ``$.state...``."""
    try:
        return _state_decoder(type).decode(data)
    except msgspec.ValidationError as exc:
        # msgspec ends its message with " - at `$...`" (none at the root);
        # rewrite only that marker, not a "`$" inside a quoted field name.
        message, at, where = str(exc).rpartition(" - at `$")
        message = f"{message} - at `$.state{where}" if at else f"{where} - at `$.state`"
        raise CheckpointError(path, f"state does not match {_type_name(type)}: {message}") from None
    except msgspec.DecodeError as exc:
        raise CheckpointError(path, f"state {not_json(data, exc)}") from None


def _type_name(type_: Any) -> str:
    return getattr(type_, "__name__", None) or repr(type_)
