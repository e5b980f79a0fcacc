"""Encoding a state message by message: the transcript and its byte cache.

A ``Transcript`` says where a state keeps its messages (a list under a key of
a dict state, or an attribute of a msgspec Struct state).  The stores use it
to encode the state in pieces, on the caller's thread:

* the *rest* of the state is encoded with a unique marker string in place of
  the messages, then cut at the marker into ``head`` and ``tail``;
* each message is encoded on its own; the bytes of a *settled* message are
  cached, so it is encoded once in its life;
* the worker thread writes ``head + "[" + ",".join(chunks) + "]" + tail``
  (the same bytes one ``encode(state)`` would give) piece by piece with
  ``os.writev``, which releases the GIL, without building the whole file
  in memory (``state_pieces``).

Why the cache is never stale
----------------------------
A message is *settled* when it is deeply immutable: an instance of a frozen
msgspec Struct, a tuple or a frozenset whose contents are, recursively, of
immutable types (str, int, float, bool, None, bytes, Decimal, UUID, date,
time, timedelta, datetime with no or a standard tzinfo, Enum members of
such values, and settled Structs and tuples).  Only settled messages are
cached, keyed by ``id()``, and the cache holds a reference to each message
it keys.  So:

1. an id in the cache belongs to the very object that was encoded: that
   object is alive (the cache holds it), and two live objects never share an
   id;
2. that object has not changed since it was encoded: nothing reachable from
   it can change;
3. the same encoder gives the same bytes for the same unchanged object.

Anything else (dicts, lists, plain Structs, dataclasses) is encoded afresh at
every checkpoint.  The only ways around this are the ones that break
immutability itself: ``msgspec.structs.force_setattr`` after construction,
ctypes, or changing a Struct class after its instances were encoded.
"""

from __future__ import annotations

import copy
import datetime
import decimal
import enum
import itertools
import uuid
import zoneinfo
from collections.abc import Sequence
from typing import Any, Final, NamedTuple

import msgspec

__all__ = ["Split", "Transcript", "decoded_copy", "is_settled", "new_epoch", "state_pieces"]

_SCALARS: Final = frozenset(
    {
        str,
        int,
        float,
        bool,
        type(None),
        bytes,
        decimal.Decimal,
        uuid.UUID,
        datetime.date,
        datetime.timedelta,
    }
)
_TZ_TYPES: Final = (datetime.timezone, zoneinfo.ZoneInfo)
_MAX_DEPTH = 32

# Per Struct type: the attribute names of a frozen Struct, None for a mutable one.
_struct_fields: dict[type, tuple[str, ...] | None] = {}


def is_settled(obj: object, _depth: int = 0) -> bool:
    """Whether nothing reachable from ``obj`` can change: safe to cache its bytes.

    Conservative: an unknown type, a subclass of a builtin other than an
    Enum, or nesting deeper than 32 levels counts as not settled.
    """
    cls = type(obj)
    if cls in _SCALARS:
        return True
    if _depth >= _MAX_DEPTH:
        return False
    if cls is tuple or cls is frozenset:
        return all(is_settled(item, _depth + 1) for item in obj)  # type: ignore[attr-defined]
    if cls is datetime.datetime or cls is datetime.time:
        tz = obj.tzinfo  # type: ignore[attr-defined]
        return tz is None or type(tz) in _TZ_TYPES
    if isinstance(obj, msgspec.Struct):
        names = _struct_fields.get(cls, ())
        if names == ():
            config = cls.__struct_config__  # type: ignore[attr-defined]
            names = cls.__struct_fields__ if config.frozen else None  # type: ignore[attr-defined]
            _struct_fields[cls] = names
        if names is None:
            return False
        return all(is_settled(getattr(obj, name), _depth + 1) for name in names)
    if isinstance(obj, enum.Enum):
        return is_settled(obj.value, _depth + 1)
    return False


class Split(NamedTuple):
    """A state cut around its transcript (see ``Transcript.split``)."""

    messages: list[Any] | tuple[Any, ...]
    """The state's own list (or tuple) of messages: not a copy.

    Read it on the caller's thread only, and copy what must outlive the call.
    """
    head: bytes
    """The encoded state up to where the messages array goes."""
    tail: bytes
    """The encoded state after the messages array."""
    name: str
    """The JSON key of the messages in the encoded state."""


class Transcript:
    """Where a state keeps its messages, so they can be encoded once each.

    Give one to a store: ``JournalStore(root)`` uses ``Transcript()`` by
    default; ``FileStore(root, transcript=Transcript())`` turns on the
    message cache for whole-file snapshots.

    The state must be a dict with a list (or tuple) of messages under
    ``field``, or a msgspec Struct with such an attribute.  Any other state
    is encoded whole, as without a transcript.  Messages that are settled
    (deeply immutable, e.g. frozen msgspec Structs of strings and numbers)
    are encoded once and their bytes cached; others are encoded at every
    checkpoint.  See the module docstring for why the cache is never stale.

    Args:
        field: the dict key or Struct attribute holding the messages.

    Raises:
        ValueError: ``field`` is not a non-empty string.
    """

    def __init__(self, field: str = "messages") -> None:
        if not isinstance(field, str) or not field:
            raise ValueError(f"Transcript field must be a non-empty str, got {field!r}")
        self.field = field
        self.encoder = msgspec.json.Encoder()
        # A marker no message or state can contain: a NUL and a random hex.
        self._marker = f"\x00checkpointer-transcript-{uuid.uuid4().hex}"
        self._marker_json = self.encoder.encode(self._marker)
        # (id -> bytes, id -> message): one tuple, swapped whole when pruned.
        self._cache: tuple[dict[int, bytes], dict[int, object]] = ({}, {})
        self._names: dict[type, str | None] = {}
        self.hits = 0
        self.misses = 0

    def __repr__(self) -> str:
        return f"Transcript({self.field!r})"

    def split(self, state: Any) -> Split | None:
        """Cut ``state`` around its messages, or None if it has none.

        Runs on the caller's thread: it encodes everything but the messages.
        """
        if isinstance(state, dict):
            if self.field not in state:
                return None
            messages = state[self.field]
            rest: Any = {**state, self.field: self._marker}
            name = self.field
        elif isinstance(state, msgspec.Struct):
            found = self._struct_name(type(state))
            if found is None:
                return None
            name = found
            messages = getattr(state, self.field)
            rest = copy.copy(state)  # no __post_init__, unlike structs.replace
            msgspec.structs.force_setattr(rest, self.field, self._marker)
        else:
            return None
        if not isinstance(messages, list | tuple):
            return None
        encoded = self.encoder.encode(rest)
        at = encoded.find(self._marker_json)
        end = at + len(self._marker_json)
        if at < 0 or encoded.find(self._marker_json, end) >= 0:
            return None  # pragma: no cover - the marker is random
        return Split(messages, encoded[:at], encoded[end:], name)

    def _struct_name(self, cls: type) -> str | None:
        try:
            return self._names[cls]
        except KeyError:
            pass
        name = None
        if not cls.__struct_config__.array_like:  # type: ignore[attr-defined]
            for info in msgspec.structs.fields(cls):
                if info.name == self.field:
                    name = info.encode_name
        self._names[cls] = name
        return name

    def encode_messages(self, messages: Sequence[Any]) -> tuple[list[bytes], list[int]]:
        """Encode each message, from the cache when it is settled.

        Returns:
            The bytes of each message, and the positions of the messages that
            are not settled (encoded now, not cached).
        """
        by_id, refs = self._cache
        chunks: list[bytes | None] = list(map(by_id.get, map(id, messages)))
        unsettled: list[int] = []
        missed = 0
        if None in chunks:
            encode = self.encoder.encode
            at = 0
            while True:
                try:
                    at = chunks.index(None, at)
                except ValueError:
                    break
                message = messages[at]
                data = encode(message)
                if is_settled(message):
                    refs[id(message)] = message  # the reference first: see _prune
                    by_id[id(message)] = data
                else:
                    unsettled.append(at)
                chunks[at] = data
                missed += 1
                at += 1
        self.hits += len(chunks) - missed
        self.misses += missed
        return chunks, unsettled  # type: ignore[return-value]

    def prune(self, *live: Sequence[Any]) -> None:
        """Forget messages not in ``live`` once the cache is twice their number.

        Callers pass the whole transcript they just encoded (in parts, if it
        is in parts).  Amortised O(1) per message: the cache is rebuilt only
        when it has doubled.
        """
        by_id, refs = self._cache
        if len(refs) <= 2 * sum(map(len, live)) + 1024:
            return
        keep: set[int] = set()
        for messages in live:
            keep.update(map(id, messages))
        items = list(by_id.items())
        new_by_id = {key: data for key, data in items if key in keep}
        self._cache = (new_by_id, {key: refs[key] for key in new_by_id})

    def cached(self) -> int:
        """How many messages have their bytes cached."""
        return len(self._cache[0])


def state_pieces(head: bytes, chunks: list[bytes], tail: bytes) -> list[bytes]:
    """The pieces of an encoded state, in order, to be written as they are.

    ``head + "[" + ",".join(chunks) + "]" + tail``, without the joins: the
    stores write the pieces with ``os.writev`` (``_atomic.write_all``), so no
    large buffer is built, faulted in and freed while holding the GIL.
    Built with slice assignments: C speed, a few nanoseconds a message.
    """
    if not chunks:
        return [head, b"[]", tail]
    pieces: list[bytes] = [b","] * (2 * len(chunks) + 3)
    pieces[0] = head
    pieces[1] = b"["
    pieces[2:-2:2] = chunks
    pieces[-2] = b"]"
    pieces[-1] = tail
    return pieces


_epochs = itertools.count(1)


def new_epoch() -> int:
    """A number no other transcript layout in this process has."""
    return next(_epochs)


def decoded_copy(message: object, data: bytes) -> object:
    """A private copy of an unsettled message, decoded from its bytes.

    It compares equal (``==``) to the message while the message keeps the
    value it had when encoded; the caller can never mutate it.  An object()
    (equal to nothing) when the bytes do not decode back to the type.
    """
    try:
        if isinstance(message, msgspec.Struct):
            return msgspec.json.decode(data, type=type(message))
        return msgspec.json.decode(data)
    except (msgspec.DecodeError, TypeError):
        return object()
