"""``Envelopes``: any bytes ``Store`` as a ``StateStore``, one envelope per checkpoint.

A state is staged (encoded) on the caller's thread, the only place it may be
read safely, and committed whole with ``store.write`` in a worker.
"""

from __future__ import annotations

import hashlib
import operator
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from .._format.envelope import decode_meta, decode_raw, envelope_chunks
from .._text import oserror
from .._values import Checkpoint, CheckpointError, Meta
from .base import Staged, StaleWrite, StateStore, Store, fences
from .encoding import Transcript, state_pieces

__all__ = ["KEEP_BYTES", "Envelopes", "read_for_load", "state_store"]

KEEP_BYTES = 64 * 1024 * 1024
"""States encoded to at most this many bytes are compared byte for byte."""


@dataclass(slots=True, eq=False)
class _Whole:
    """A state encoded in one piece on the caller's thread."""

    data: bytes
    _digest: bytes | None = None

    def content(self) -> object:
        # Up to KEEP_BYTES the bytes themselves (memcmp, no hashing on the write
        # path); above, SHA-256, which releases the GIL.
        if len(self.data) <= KEEP_BYTES:
            return self.data
        if self._digest is None:
            self._digest = hashlib.sha256(self.data).digest()
        return ("sha256", self._digest)

    def pieces(self) -> list[bytes]:
        return [self.data]


@dataclass(slots=True, eq=False)
class _Spliced:
    """A state cut around its transcript: the messages' bytes come from the cache."""

    head: bytes
    chunks: list[bytes]
    tail: bytes

    def content(self) -> object:
        # Exact, and cheap: cached chunks compare by identity, fresh ones by memcmp.
        return (self.head, self.tail, self.chunks)

    def pieces(self) -> list[bytes]:
        return state_pieces(self.head, self.chunks, self.tail)


@dataclass(slots=True, eq=False)
class _Prefix:
    """The messages of the last state staged for a key, and their bytes."""

    key: str
    messages: list[Any]  # compared by identity only
    chunks: list[bytes]
    unsettled: list[int]  # positions encoded again at every stage


class Envelopes:
    """``StateStore`` over any bytes ``Store``; ``transcript`` None encodes states whole."""

    def __init__(self, store: Store, transcript: Transcript | None = None) -> None:
        self.store = store
        self.transcript = transcript
        self._encoder = msgspec.json.Encoder()
        self._prefix: _Prefix | None = None
        self._prefix_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Envelopes({self.store!r}, transcript={self.transcript!r})"

    def stage(
        self, key: str, state: Any, transcript: Transcript | None = None
    ) -> _Whole | _Spliced:
        transcript = transcript or self.transcript
        if transcript is not None:
            split = transcript.split(state)
            if split is not None:
                chunks = self._encode_messages(transcript, key, split.messages)
                return _Spliced(split.head, chunks, split.tail)
        return _Whole(self._encoder.encode(state))

    def _encode_messages(
        self, transcript: Transcript, key: str, messages: Sequence[Any]
    ) -> list[bytes]:
        """The bytes of each message: by position when the messages start with the very
        objects (``is``) of the last stage (unsettled ones encoded again), else from the cache."""
        if isinstance(messages, list) and self._prefix_lock.acquire(blocking=False):
            try:  # not blocking: a signal handler may re-enter on this thread
                chunks = self._extend_prefix(transcript, key, messages)
            finally:
                self._prefix_lock.release()
            if chunks is not None:
                return chunks
        chunks, unsettled = transcript.encode_messages(messages)
        transcript.prune(messages)
        if self._prefix_lock.acquire(blocking=False):
            try:
                self._prefix = _Prefix(key, list(messages), list(chunks), unsettled)
            finally:
                self._prefix_lock.release()
        return chunks

    def _extend_prefix(
        self, transcript: Transcript, key: str, messages: list[Any]
    ) -> list[bytes] | None:
        prefix = self._prefix
        if prefix is None or prefix.key != key:
            return None
        n = len(prefix.messages)
        if len(messages) < n or not all(map(operator.is_, messages, prefix.messages)):
            return None
        new = messages[n:]
        new_chunks, new_unsettled = transcript.encode_messages(new)
        chunks = prefix.chunks + new_chunks
        encode = transcript.encoder.encode
        for at in prefix.unsettled:  # identical, but mutable: encode again
            chunks[at] = encode(messages[at])
        prefix.messages.extend(new)
        prefix.chunks.extend(new_chunks)
        prefix.unsettled.extend(n + at for at in new_unsettled)
        transcript.prune(messages)
        return chunks

    def commit(self, key: str, meta: Meta, staged: Staged, *, expected: str | None) -> int:
        if not isinstance(staged, (_Whole, _Spliced)):
            raise TypeError(f"Envelopes cannot commit {type(staged).__name__}")
        head, meta_json, middle, _, tail = envelope_chunks(meta, b"")
        chunks = [head, meta_json, middle, *staged.pieces(), tail]
        return self.store.write(key, chunks, revision=meta.revision, expected=expected)

    def read_meta(self, key: str) -> Meta | None:
        data = self.store.read(key)
        if data is None:
            return None
        return decode_meta(data, self.store.location(key))

    def update_meta(self, key: str, meta: Meta, *, expected: str) -> None:
        data = self.store.read(key)
        old = None if data is None else decode_raw(data, self.store.location(key))
        if old is None or old.meta.revision != expected:  # refused before the write's check
            stored = None if old is None else old.meta.revision
            raise StaleWrite(key, expected=expected, stored=stored)
        chunks = envelope_chunks(meta, bytes(old.state))
        self.store.write(key, chunks, revision=meta.revision, expected=expected)

    def read_checkpoint(self, key: str) -> Checkpoint[msgspec.Raw] | None:
        self.store.validate_key(key)
        data = read_for_load(self.store, key)
        return None if data is None else decode_raw(data, self.store.location(key))


def read_for_load(store: Store, key: str) -> bytes | None:
    """``store.read(key)``, an ``OSError`` raised as the ``CheckpointError`` of ``load``."""
    try:
        return store.read(key)
    except OSError as exc:
        raise CheckpointError(store.location(key), f"cannot be read: {oserror(exc)}") from exc


def state_store(store: Store, transcript: Transcript | None = None) -> StateStore:
    """The ``StateStore`` a writer uses for ``store``; ``TypeError`` unless it ``fences``."""
    if isinstance(store, StateStore):
        if not fences(store):
            raise TypeError(f"{store!r}: its commit() takes no `expected` revision")
        return store
    if not fences(store):
        raise TypeError(
            f"{store!r} cannot refuse a stale write: its write() takes no `expected` "
            "revision, so two writers of one key could replace each other's work (see "
            "'Writing a store' in the docs); implement it, or wrap it in "
            "checkpointer.stores.unfenced() if your program makes sure that one writer at "
            "a time writes each key"
        )
    return Envelopes(store, transcript)
