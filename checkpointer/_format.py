"""The on-disk format: the envelope, its meta, and loading it back.

A checkpoint file is one JSON object::

    {"format": 1, "meta": {...}, "state": ...}

``format`` is the version of this envelope; ``meta`` is a ``Meta``; ``state``
is whatever the source returned, encoded by msgspec.  The writer builds the
file from separately encoded pieces (see ``envelope_chunks``) so the state is
encoded once and joined in the worker thread, off the event loop.

Schema evolution follows msgspec's rules: a new field gets a default, an
existing field's type never changes, and ``FORMAT`` moves only when an old
reader could not read the new file correctly.

A file of a newer format (or a newer state version, ``_versions``) was
written by a newer version: ``load`` refuses it with ``NewerVersionError``
and a writer refuses its key, neither moves it aside as corrupt.  So that an
old reader can say which version to upgrade to, every future format keeps
``format`` at the top (a journal: in its first line) and the writing
library's version at ``meta.library_version``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import msgspec

from ._version import VERSION

if TYPE_CHECKING:
    from ._stores import Store

__all__ = [
    "FORMAT",
    "Checkpoint",
    "CheckpointError",
    "Meta",
    "NewerVersionError",
    "Snapshot",
    "TornTail",
    "WriterInfo",
    "decode_checkpoint",
    "decode_meta",
    "decode_state",
    "envelope_chunks",
    "load",
]

FORMAT = 1
"""The envelope version this library writes and the newest it reads."""

T = TypeVar("T")


class CheckpointError(Exception):
    """A checkpoint exists but cannot be trusted.

    Attributes:
        path: where the bad checkpoint is (the store's location for the key).
        reason: what is wrong with it, in one line.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class NewerVersionError(CheckpointError):
    """A checkpoint written by a newer version: kept as it is, never replaced.

    Its format is newer than this library reads, or its state version newer
    than the program asked for (``load(state_version=)``, the writer's
    ``state_version``).  Not damage: the message says what to upgrade to.

    Attributes:
        path: where the checkpoint is.
        reason: which version wrote it and what to upgrade, in one line.
        library_version: the agent-checkpointer version that wrote it, when
            the file says.
    """

    def __init__(self, path: str, reason: str, library_version: str | None = None) -> None:
        super().__init__(path, reason)
        self.library_version = library_version


class Snapshot(msgspec.Struct, frozen=True):
    """What the source hands the writer: the session's key and its state.

    ``state`` is anything msgspec can encode (dicts, lists, Structs,
    dataclasses, ...).  The writer encodes it at write time and does not keep
    it.  ``parent`` is the key of the session this one branched from; the
    writer copies it into ``Meta.parent`` at every write.
    """

    key: str
    state: Any
    parent: str | None = None


class WriterInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Which process wrote a checkpoint: ``pid`` on ``host``."""

    pid: int
    host: str


class Meta(msgspec.Struct, frozen=True, kw_only=True):
    """What a checkpoint file says about itself.

    Attributes:
        key: the session key.
        seq: 1 for the first write of the key, then one more on every write,
            across processes.
        created_at: UTC time of the key's first write; later writers keep it.
        updated_at: UTC time of this write.
        live: True while a writer has the key open; False after its final
            write (close, exit flush, signal).
        pinned: a sticky flag set with ``write_now(pin=...)``.
        turns: assistant messages in the file's transcript (set by the
            writer's ``prepare`` step, e.g. ``transcript_prepare``), or None.
        parent: the key of the session this one branched from
            (``Snapshot.parent`` at the time of the write), or None.
        writer: the process that wrote the file (pid, host).
        library_version: the agent-checkpointer version that wrote the file.
        state_version: the caller's own version of the state's schema
            (``CheckpointWriter(state_version=...)``); see ``load``.

    Fields after ``pinned`` came later: files written before them load with
    the defaults (msgspec's schema-evolution rules).
    """

    key: str
    seq: int
    created_at: datetime
    updated_at: datetime
    live: bool
    pinned: bool = False
    turns: int | None = None
    parent: str | None = None
    writer: WriterInfo | None = None
    library_version: str | None = None
    state_version: int = 0


class TornTail(msgspec.Struct, frozen=True, kw_only=True):
    """The end of a journal that ``load()`` ignored: an append that never finished.

    Attributes:
        line: the 1-based line number where the ignored bytes start.
        offset: their byte offset in the file.
        nbytes: how many bytes were ignored.
        reason: what was wrong with them, in one line.
    """

    line: int
    offset: int
    nbytes: int
    reason: str


class Checkpoint(msgspec.Struct, Generic[T], frozen=True):
    """A loaded checkpoint: its ``meta`` and its decoded ``state``.

    ``torn`` is set when a journal ended in an append that never finished
    (a crash mid-write): those bytes were ignored, everything before them
    loaded.  A writer that opens the journal truncates them away.
    """

    meta: Meta
    state: T
    torn: TornTail | None = None


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
_PREFIX = b'{"format":%d,"meta":' % FORMAT
_MIDDLE = b',"state":'
_SUFFIX = b"}"


def envelope_chunks(meta: Meta, state_json: bytes) -> list[bytes]:
    """The pieces of a checkpoint file, to be joined by the writer thread.

    Joining (not ``+``) matters: ``bytes.join`` releases the GIL for large
    results, so a 50 MB checkpoint does not stall the event loop.
    """
    return [_PREFIX, _META_ENCODER.encode(meta), _MIDDLE, state_json, _SUFFIX]


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
        _check_format(data, path)
        raise CheckpointError(path, f"not a checkpoint envelope: {exc}") from None
    except msgspec.DecodeError as exc:
        raise CheckpointError(path, f"not valid JSON (truncated or corrupt): {exc}") from None
    except RecursionError:  # msgspec's answer to deeply nested garbage
        raise CheckpointError(path, "nested too deeply to decode (corrupt?)") from None
    if envelope.format > FORMAT:
        raise _newer(path, envelope.format, envelope.meta.library_version)
    if envelope.format < 1:
        raise CheckpointError(path, f"unknown format version {envelope.format}")
    return envelope


def _check_format(data: bytes, path: str) -> None:
    """Raise ``NewerVersionError`` if ``data`` (a file, a journal's first line) is newer."""
    try:
        head = _HEAD_DECODER.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return
    if head.format > FORMAT:
        meta = head.meta if isinstance(head.meta, dict) else {}
        written_by = meta.get("library_version")
        raise _newer(path, head.format, written_by if isinstance(written_by, str) else None)


def _newer(path: str, version: int, written_by: str | None) -> NewerVersionError:
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
        raise CheckpointError(path, f"state is not valid JSON: {exc}") from None


def _type_name(type_: Any) -> str:
    return getattr(type_, "__name__", None) or repr(type_)


def load(
    store: Store,
    key: str,
    type: Any = Any,
    *,
    state_version: int | None = None,
    migrations: Mapping[int, Callable[[Any], Any]] | None = None,
) -> Checkpoint[Any] | None:
    """Load the checkpoint of ``key`` from ``store``.

    Args:
        store: where the checkpoint lives (a ``FileStore``, a
            ``JournalStore``, ...).
        key: the session key.
        type: what to decode the state as (any type msgspec understands);
            ``Any`` gives plain JSON values.
        state_version: the newest state version this program understands;
            None (the default) skips the version check.
        migrations: ``{old_version: function}``; each function takes the
            state of ``old_version`` as plain JSON values and returns it at
            ``old_version + 1``.  A file at an older version goes through
            them in order before it is decoded as ``type``.

    Returns:
        The checkpoint, or None when the store has none for ``key``.  After
        a migration, ``meta`` is still what the file says.

    Raises:
        ValueError: ``key`` is not a valid key for the store, or
            ``migrations`` was given without ``state_version``.
        NewerVersionError: the checkpoint is of a newer format, or of a newer
            state version than ``state_version``: written by a newer version
            (a ``CheckpointError``; the message says what to upgrade).
        CheckpointError: the checkpoint exists but is truncated, not JSON,
            not an envelope, a migration is missing or failed, or its state
            does not match ``type``.
    """
    if migrations and state_version is None:
        raise ValueError("migrations need state_version=, the version they migrate to")
    store.validate_key(key)
    location = store.location(key)
    from ._codec import StateStore, load_from  # here: _codec imports this module

    if isinstance(store, StateStore):  # a JournalStore: its own layout
        return load_from(
            store, location, key, type, state_version=state_version, migrations=migrations
        )
    try:
        data = store.read(key)
    except OSError as exc:
        raise CheckpointError(location, f"cannot be read: {_oserror(exc)}") from None
    if data is None:
        return None
    if state_version is not None:
        from ._versions import decode_versioned

        return decode_versioned(data, location, type, state_version, migrations or {})
    return decode_checkpoint(data, location, type)


def _oserror(exc: OSError) -> str:
    if not exc.errno and str(exc):  # a store's own error (no errno) says it all
        return str(exc)
    name = os.strerror(exc.errno) if exc.errno else type(exc).__name__
    return f"{name} ({type(exc).__name__})"
