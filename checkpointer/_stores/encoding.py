"""Encoding a state message by message: ``Transcript`` and its byte cache.

Only *settled* messages (deeply immutable: ``settledness``) are cached, by
``id()``, and the cache holds each one, so a cached id is the very object
encoded, unchanged (``msgspec.structs.force_setattr`` or ctypes get around it).
"""

from __future__ import annotations

import copy
import datetime
import decimal
import enum
import itertools
import uuid
import zoneinfo
from collections.abc import Iterable, Sequence
from typing import Any, Final, NamedTuple

import msgspec

from .._values import transcript_messages

__all__ = ["Transcript", "is_settled", "new_epoch", "state_pieces"]

# EXACT scalars equal (==) only values that encode the same; LOOSE ones do not:
# 2 == 2.0 == True == Decimal("2"), encoded 2, 2.0, true and "2".
_EXACT_SCALARS: Final = frozenset(
    {str, bytes, msgspec.Raw, type(None), uuid.UUID, datetime.date, datetime.timedelta}
)
_LOOSE_SCALARS: Final = frozenset({int, float, bool, decimal.Decimal})
_TZ_TYPES: Final = (datetime.timezone, zoneinfo.ZoneInfo)
_MAX_DEPTH = 32

# What ``settledness`` says of an object:
UNSETTLED: Final = 0  # it may change
LOOSE: Final = 1  # it never changes, but an object equal to it (==) may encode differently
EXACT: Final = 2  # it never changes, and whatever equals it (==) encodes the same


def is_settled(obj: object) -> bool:
    """Whether nothing reachable from ``obj`` can change (unknown types, builtin
    subclasses but Enums, and nesting past 32 levels count as changeable)."""
    return settledness(obj) != UNSETTLED


def settledness(obj: object, _depth: int = 0) -> int:
    """``UNSETTLED``, ``LOOSE`` or ``EXACT``: the least of ``obj`` and all it reaches.

    A number, a bool, an aware time or a frozenset (equal sets may iterate
    in different orders) makes it ``LOOSE``; frozen Structs and tuples are
    as settled as their contents; anything mutable is ``UNSETTLED``.
    """
    cls = type(obj)
    if cls in _EXACT_SCALARS:
        return EXACT
    if cls in _LOOSE_SCALARS:
        return LOOSE
    if _depth >= _MAX_DEPTH:
        return UNSETTLED
    if cls is tuple or cls is frozenset:
        return _least(EXACT if cls is tuple else LOOSE, obj, _depth + 1)  # type: ignore[arg-type]
    if cls is datetime.datetime or cls is datetime.time:
        tz = obj.tzinfo  # type: ignore[attr-defined]
        if tz is None:
            return EXACT
        return LOOSE if type(tz) in _TZ_TYPES else UNSETTLED
    if isinstance(obj, msgspec.Struct):
        if not obj.__struct_config__.frozen:
            return UNSETTLED
        return _least(EXACT, (getattr(obj, name) for name in obj.__struct_fields__), _depth + 1)
    if isinstance(obj, enum.Enum):
        level = settledness(obj.value, _depth + 1)
        if level == UNSETTLED:
            return UNSETTLED
        # A plain member equals only itself; a str one equals its value.
        exact = isinstance(obj, str) or cls.__eq__ is object.__eq__
        return level if exact else LOOSE
    return UNSETTLED


def _least(level: int, items: Iterable[object], depth: int) -> int:
    for item in items:
        level = min(level, settledness(item, depth))
        if level == UNSETTLED:
            break
    return level


class Split(NamedTuple):
    """A state cut around its transcript (see ``Transcript.split``)."""

    messages: list[Any] | tuple[Any, ...]  # the state's own: read on the caller's thread only
    head: bytes  # the encoded state up to the messages array
    tail: bytes  # ... and after it
    name: str  # the JSON key of the messages


class Transcript:
    """Where an agent state keeps its messages: the writer's one transcript setting.

    ``CheckpointWriter(source, store, transcript=Transcript("messages"))``
    then, on every store:

    * encodes the messages one by one, each settled message (deeply
      immutable, e.g. a frozen msgspec Struct) once in its life; a journal
      appends only the new ones;
    * with ``fingerprint``, skips a write whose transcript fingerprint (the
      count, the last message whole, the parent and pin) is unchanged; an
      in-place edit of an earlier message goes with the next change, or
      ``write_now(force=True)``;
    * with ``repair``, closes dangling tool calls and settles running ones
      in the copy it writes, refuses a history a model API would reject
      (``Failed("not-sendable")``), and counts the turns (``Meta.turns``).

    The messages are a list or a tuple under ``field`` of a dict, or of a
    msgspec Struct's attribute.  Any other state (no such field yet, None,
    a dict or a str under it; a list or a dataclass as the state) is taken
    whole by all three: encoded whole, fingerprinted whole, never repaired.
    """

    def __init__(
        self, field: str = "messages", *, repair: bool = True, fingerprint: bool = True
    ) -> None:
        if not isinstance(field, str) or not field:
            raise ValueError(f"Transcript field must be a non-empty str, got {field!r}")
        self.field = field
        self.repair = bool(repair)
        self.fingerprint = bool(fingerprint)
        self.encoder = msgspec.json.Encoder()
        # A marker no message or state can contain: a NUL and a random hex.
        self._marker = f"\x00checkpointer-transcript-{uuid.uuid4().hex}"
        self._marker_json = self.encoder.encode(self._marker)
        # (id -> bytes, id -> message, ids of LOOSE messages): one tuple,
        # swapped whole when pruned.
        self._cache: tuple[dict[int, bytes], dict[int, object], set[int]] = ({}, {}, set())
        self._names: dict[type, str | None] = {}
        self.misses = 0

    def __repr__(self) -> str:
        return f"Transcript({self.field!r})"

    def split(self, state: Any) -> Split | None:
        """Cut ``state`` around its messages (None if it has none), on the caller's thread."""
        messages = transcript_messages(state, self.field)
        if messages is None:
            return None
        if isinstance(state, dict):
            rest: Any = {**state, self.field: self._marker}
            name = self.field
        else:  # a Struct with the field
            found = self._struct_name(type(state))
            if found is None:
                return None  # array_like: no key to cut at, encoded whole
            name = found
            rest = copy.copy(state)  # no __post_init__, unlike structs.replace
            msgspec.structs.force_setattr(rest, self.field, self._marker)
        encoded = self.encoder.encode(rest)
        at = encoded.find(self._marker_json)
        end = at + len(self._marker_json)
        if at < 0 or encoded.find(self._marker_json, end) >= 0:
            return None  # pragma: no cover - the marker is random
        return Split(messages, encoded[:at], encoded[end:], name)

    def _struct_name(self, cls: type) -> str | None:
        if cls not in self._names:
            array_like = cls.__struct_config__.array_like  # type: ignore[attr-defined]
            fields = () if array_like else msgspec.structs.fields(cls)
            names = [info.encode_name for info in fields if info.name == self.field]
            self._names[cls] = names[0] if names else None
        return self._names[cls]

    def encode_messages(self, messages: Sequence[Any]) -> tuple[list[bytes], list[int]]:
        """The bytes of each message (settled ones from the cache), and the unsettled positions."""
        by_id, refs, loose = self._cache
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
                level = settledness(message)
                if level != UNSETTLED:
                    refs[id(message)] = message  # the reference first: see _prune
                    if level == LOOSE:
                        loose.add(id(message))
                    by_id[id(message)] = data
                else:
                    unsettled.append(at)
                chunks[at] = data
                missed += 1
                at += 1
        self.misses += missed
        return chunks, unsettled  # type: ignore[return-value]

    def prune(self, *live: Sequence[Any]) -> None:
        """Forget messages not in ``live`` (the transcript just encoded) once twice their number."""
        by_id, refs, loose = self._cache
        if len(refs) <= 2 * sum(map(len, live)) + 1024:
            return
        keep = {id(message) for messages in live for message in messages}
        new_by_id = {key: data for key, data in list(by_id.items()) if key in keep}
        self._cache = (new_by_id, {key: refs[key] for key in new_by_id}, loose & new_by_id.keys())

    def any_loose(self, messages: Sequence[Any]) -> bool:
        """Whether one of ``messages``, just encoded, is settled but ``LOOSE``."""
        loose = self._cache[2]
        return bool(loose) and any(map(loose.__contains__, map(id, messages)))

    def cached(self) -> int:
        """How many messages have their bytes cached."""
        return len(self._cache[0])


def state_pieces(head: bytes, chunks: list[bytes], tail: bytes) -> list[bytes]:
    """``head + "[" + ",".join(chunks) + "]" + tail`` as pieces, not joined (slices: C speed)."""
    if not chunks:
        return [head, b"[]", tail]
    pieces: list[bytes] = [b","] * (2 * len(chunks) + 3)
    pieces[0] = head
    pieces[1] = b"["
    pieces[2:-2:2] = chunks
    pieces[-2] = b"]"
    pieces[-1] = tail
    return pieces


new_epoch = itertools.count(1).__next__  # a number no other transcript layout here has
