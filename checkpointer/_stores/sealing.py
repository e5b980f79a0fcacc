"""Encryption at rest: ``Encryption`` (the keys) and the sealed record every store keeps.

Past 500 lines on purpose: the keys, the record's format and every refusal
(no key, wrong key, moved, truncated, plaintext, damaged) read as one
contract; split, each half would need the other to be understood.

A sealed record is one readable header line, then the nonce and the ciphertext::

    b"\\x00checkpointer-sealed " + JSON header + b"\\n" + nonce (12 bytes) + ciphertext + tag

The header names the algorithm, the key id, the store key and the position
(a checkpoint's revision, a journal row's offset) the record was sealed for,
the plaintext's size, and what the store keeps readable (a checkpoint's
meta).  The whole header line is the associated data: a record opened at
another key or position, cut short, or with its header edited, fails; so does
a plaintext record where a sealed one is expected.  Failing to open is never
damage (it may be the wrong key): ``DecryptionError``, and the record stays.
``cryptography`` is imported when an ``Encryption`` is made, never otherwise.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import msgspec

from .._format.envelope import MIDDLE, PREFIX
from .._values import CheckpointError, Meta

__all__ = [
    "MAGIC",
    "DecryptionError",
    "Encryption",
    "check_sealed_by",
    "check_sealer",
    "is_sealed",
    "open_end",
    "open_row",
    "open_rows",
    "seal",
    "seal_end",
    "seal_epoch",
    "seal_rows",
    "sealed_by",
    "unseal",
]

MAGIC = b"\x00checkpointer-sealed "
"""How a sealed record starts: no plaintext record (JSON, a journal) starts with a NUL."""

Algorithm = Literal["aes-256-gcm", "chacha20-poly1305"]
Why = Literal["no-key", "wrong-key", "moved", "plaintext", "truncated", "damaged"]
_ROW_HEAD, _ROW_TAIL = b'{"sealed":"', b'"}'  # a journal row sealed: one line of JSON
_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_NONCE, _TAG = 12, 16
_JSON_STARTS = frozenset(bytes([c]) for c in b'{["-0123456789tfn')  # how plaintext begins


class _Header(msgspec.Struct, frozen=True, omit_defaults=True):
    alg: str
    kid: str
    key: str
    at: str
    size: int
    meta: msgspec.Raw = msgspec.Raw(b"null")  # Raw | None does not decode
    fp: str = ""  # the key's fingerprint ("": sealed before there was one)
    v: int = 1


_ENCODE = msgspec.json.Encoder().encode
_HEADER = msgspec.json.Decoder(_Header)
_META_OR_NONE = msgspec.json.Decoder(Meta | None)


class DecryptionError(CheckpointError):
    """A record of an encrypted store cannot be opened: not damage, it is kept as it is.

    No key of the store's ``Encryption`` opens it (``why`` "no-key", or
    "wrong-key": the key of that id does not authenticate it, or its bytes
    were changed), it was sealed for another key or position ("moved"), it is
    cut short or without its revision ("truncated"), it is plaintext where a
    sealed record belongs ("plaintext"), or it is neither a sealed record nor
    plaintext (its marker damaged: "damaged").  A writer never moves
    it aside nor replaces it.

    Attributes:
        key: the store key.
        position: where in the key (a checkpoint's revision, a journal row's index).
        key_id: the id of the key it was sealed with (None: plaintext, or unreadable).
        why: which of the cases above.
        meta: the checkpoint's meta, kept readable in the record (None if none).
    """

    def __init__(
        self,
        path: str,
        reason: str,
        *,
        key: str,
        position: str,
        key_id: str | None,
        why: Why,
        meta: Meta | None = None,
    ) -> None:
        super().__init__(path, reason)
        self.key, self.position, self.key_id, self.why, self.meta = (
            key,
            position,
            key_id,
            why,
            meta,
        )


class Encryption:
    """The keys of an encrypted store: one current key that seals, older ones that open.

    ``FileStore(root, encryption=Encryption(key, key_id="2026-12"))``: every
    record the store writes is sealed with ``key`` (authenticated: AES-256-GCM,
    or ChaCha20-Poly1305), bound to its store key and position.  To rotate,
    make the new key current and keep the old ones in ``old_keys`` until
    ``checkpointer re-encrypt`` has sealed every record again.

    Args:
        key: the current key, 32 bytes (``os.urandom(32)``).
        key_id: its id, stored readable in every record it seals (1-64 letters,
            digits, ``.``, ``_``, ``-``): never the key itself.
        old_keys: ``{key_id: key}`` that open records but never seal.
        algorithm: ``"aes-256-gcm"`` (the default) or ``"chacha20-poly1305"``.

    Raises:
        ValueError: a key that is not 32 bytes, a bad id, an id given to two keys, an
            unknown algorithm.
        ImportError: ``cryptography`` is not installed (the ``encryption`` extra).
    """

    def __init__(
        self,
        key: bytes,
        *,
        key_id: str,
        old_keys: Mapping[str, bytes] | None = None,
        algorithm: Algorithm = "aes-256-gcm",
    ) -> None:
        try:
            from cryptography.hazmat.primitives.ciphers import aead
        except ImportError as exc:  # pragma: no cover - the extra is installed in tests
            raise ImportError(
                "encryption needs the cryptography package: pip install "
                "'agent-checkpointer[encryption]'"
            ) from exc
        if algorithm not in ("aes-256-gcm", "chacha20-poly1305"):
            raise ValueError(
                f"algorithm must be 'aes-256-gcm' or 'chacha20-poly1305', got {algorithm!r}"
            )
        self._kinds = {"aes-256-gcm": aead.AESGCM, "chacha20-poly1305": aead.ChaCha20Poly1305}
        self.algorithm: Algorithm = algorithm
        self.key_id = key_id
        old_keys = dict(old_keys or {})
        if old_keys.get(key_id, key) != key:
            raise ValueError(f"key id {key_id!r} is given twice: each key needs an id of its own")
        keys = {key_id: key, **old_keys}
        for kid, value in keys.items():
            if not isinstance(kid, str) or _KEY_ID.fullmatch(kid) is None:
                raise ValueError(f"a key id is 1-64 letters, digits, '.', '_', '-'; got {kid!r}")
            if not isinstance(value, bytes) or len(value) != 32:
                raise ValueError(f"key {kid!r} must be 32 bytes (os.urandom(32))")
        self._keys = keys
        self._prints = {kid: _fingerprint(value) for kid, value in keys.items()}
        self._aead: dict[tuple[str, str], Any] = {}

    def __reduce__(self) -> tuple[Any, ...]:  # the keys and algorithm; ciphers made anew
        old = {kid: key for kid, key in self._keys.items() if kid != self.key_id}
        return (_rebuild, (self._keys[self.key_id], self.key_id, old, self.algorithm))

    def __repr__(self) -> str:  # ids only: never a key
        return f"Encryption(key_id={self.key_id!r}, ids={sorted(self._keys)}, {self.algorithm})"

    @classmethod
    def from_text(cls, text: str, *, algorithm: Algorithm = "aes-256-gcm") -> Encryption:
        """Keys written as ``id:base64`` (whitespace or commas between; ``#`` comments), the
        first the current one: a key file's or ``CHECKPOINTER_KEYS``'s form.  ValueError if bad."""
        tokens = [t for line in text.splitlines() for t in re.split(r"[\s,]+", line.split("#")[0])]
        pairs: dict[str, bytes] = {}
        for number, token in enumerate(filter(None, tokens), 1):
            kid, colon, encoded = token.partition(":")
            try:
                key = base64.b64decode(encoded, validate=True)
            except binascii.Error:
                colon = ""
            if not colon or _KEY_ID.fullmatch(kid) is None:  # kid may be the key: never said
                raise ValueError(
                    f"key {number} is not written id:base64-of-32-bytes (its id, a colon, "
                    "then the key)"
                )
            if kid in pairs:
                raise ValueError(f"key id {kid!r} is given twice: each key needs an id of its own")
            pairs[kid] = key
        if not pairs:
            raise ValueError("no key given (id:base64-of-32-bytes, the current one first)")
        (kid, key), *old = pairs.items()
        return cls(key, key_id=kid, old_keys=dict(old), algorithm=algorithm)

    @staticmethod
    def new_key(key_id: str) -> str:
        """A fresh key in the ``from_text`` form (``id:base64``)."""
        return f"{key_id}:{base64.b64encode(os.urandom(32)).decode()}"

    def _cipher(self, alg: str, kid: str) -> Any:
        found = self._aead.get((alg, kid))
        if found is None:
            found = self._aead[alg, kid] = self._kinds[alg](self._keys[kid])
        return found

    def _refusal(
        self, kid: str, fp: str, at: str, alg: str | None = None
    ) -> tuple[str, Why] | None:
        """Why a record sealed with key ``kid`` of fingerprint ``fp`` (by ``alg``; found at
        ``at``) cannot open here, told without decrypting it; None if it may."""
        if alg is not None and alg not in self._kinds:
            why = (
                f"the record of {at} (key id {kid!r}) names an algorithm this "
                f"agent-checkpointer does not know, {alg!r}: its header was edited, "
                "or a newer version wrote it; kept as it is"
            )
            return why, "wrong-key"
        if kid not in self._keys:
            why = (
                f"the record of {at} is sealed with key id {kid!r}, "
                f"which this store's Encryption does not have (it has {sorted(self._keys)}): "
                "add that key to old_keys to read it; the record is kept as it is"
            )
            return why, "no-key"
        if fp and fp != self._prints[kid]:
            why = (
                f"the record of {at} was sealed with another key under the id "
                f"{kid!r} than this store's Encryption has (the key's fingerprint "
                "differs): give the key that sealed it; the record is kept as it is"
            )
            return why, "wrong-key"
        return None

    def seal(
        self, chunks: Iterable[bytes], *, key: str, position: str, meta: bytes | None
    ) -> list[bytes]:
        """The record of ``chunks`` (joined) at ``key``/``position``, ``meta`` kept readable;
        in two pieces (the ciphertext is not copied again to join them)."""
        data = b"".join(chunks)  # releases the GIL past 1 MiB
        header = _Header(
            self.algorithm,
            self.key_id,
            key,
            position,
            len(data),
            msgspec.Raw(b"null" if meta is None else meta),
            self._prints[self.key_id],
        )
        line = MAGIC + _ENCODE(header) + b"\n"
        nonce = os.urandom(_NONCE)
        sealed: bytes = self._cipher(self.algorithm, self.key_id).encrypt(nonce, data, line)
        return [line + nonce, sealed]

    def open(self, record: bytes, *, key: str, position: str, where: str) -> bytes:
        """The plaintext of a sealed ``record`` found at ``key``/``position``.

        Raises:
            DecryptionError: it cannot be opened here (the message says why).
        """
        line, header, body = _split(record, key=key, position=position, where=where)
        meta = _meta(header)

        def fail(reason: str, why: Why) -> DecryptionError:
            kid = header.kid
            return DecryptionError(
                where, reason, key=key, position=position, key_id=kid, why=why, meta=meta
            )

        at = f"key {key!r} at position {position}"
        if header.key != key or header.at != position:
            why = (
                f"a record sealed for key {header.key!r} at position {header.at} (key id "
                f"{header.kid!r}) found at {at}: moved or replayed from there; not loaded"
            )
            raise fail(why, "moved")
        if len(body) < _NONCE + header.size + _TAG:
            why = (
                f"the record of {at} (key id {header.kid!r}) is cut short: {len(body)} of "
                f"{_NONCE + header.size + _TAG} bytes after its header (truncated)"
            )
            raise fail(why, "truncated")
        refused = self._refusal(header.kid, header.fp, at, header.alg)
        if refused is not None:
            raise fail(*refused)
        from cryptography.exceptions import InvalidTag

        try:
            return bytes(
                self._cipher(header.alg, header.kid).decrypt(body[:_NONCE], body[_NONCE:], line)
            )
        except InvalidTag:
            why = (
                f"the record of {at} does not open with key id {header.kid!r}: the key "
                "under that id is not the one that sealed it, or its bytes were changed; "
                "kept as it is, not moved aside"
            )
            raise fail(why, "wrong-key") from None


def _fingerprint(key: bytes) -> str:
    """What a record says of the key that sealed it: a MAC of a constant under the key
    (a wrong key is told apart without decrypting), never the key."""
    return hmac.new(key, b"checkpointer key fingerprint", hashlib.sha256).hexdigest()[:16]


def check_sealer(encryption: Encryption | None, head: bytes, *, key: str, where: str) -> None:
    """A writer's check before it replaces a record it has not opened (``head``, its first
    bytes), without decrypting: ``DecryptionError`` if it is sealed with a key
    ``encryption`` does not hold (an id it lacks, the same id with another fingerprint, or
    no ``encryption`` at all)."""
    if not is_sealed(head):
        return
    _, header, _ = _split(head, key=key, position="?", where=where)
    if encryption is None:
        unseal(None, head, key=key, position=header.at, where=where)  # raises "no-key"
        return
    at = f"key {key!r} at position {header.at}"
    refused = encryption._refusal(header.kid, header.fp, at, header.alg)
    if refused is not None:
        reason, why = refused
        meta = _meta(header)
        raise DecryptionError(
            where, reason, key=key, position=header.at, key_id=header.kid, why=why, meta=meta
        )


def sealed_by(encryption: Encryption | None) -> str:
    """What a store keeps beside a record of the key that sealed it, readable without a
    key: ``"key_id:fingerprint"`` ("" without ``encryption``: plaintext)."""
    if encryption is None:
        return ""
    return f"{encryption.key_id}:{encryption._prints[encryption.key_id]}"


def check_sealed_by(
    encryption: Encryption | None, sealer: str, *, key: str, position: str, where: str
) -> None:
    """``check_sealer`` for a record whose ``sealed_by`` is kept beside it (an object's
    metadata): refused, never replaced, by a writer without the key that sealed it."""
    if not sealer:
        return
    kid, _, fp = sealer.partition(":")
    why: Why
    if encryption is None:
        reason, why = _no_key(kid), "no-key"
    else:
        refused = encryption._refusal(kid, fp, f"key {key!r} at position {position}")
        if refused is None:
            return
        reason, why = refused
    raise DecryptionError(where, reason, key=key, position=position, key_id=kid, why=why)


def _no_key(kid: str) -> str:
    return (
        f"encrypted (key id {kid!r}): give the store an Encryption with that key "
        "to read it (the CLI: --key-file or CHECKPOINTER_KEYS)"
    )


def _rebuild(
    key: bytes, key_id: str, old_keys: dict[str, bytes], algorithm: Algorithm
) -> Encryption:
    return Encryption(key, key_id=key_id, old_keys=old_keys, algorithm=algorithm)


def is_sealed(data: bytes) -> bool:
    """Whether ``data`` is a sealed record (read without any key)."""
    return data.startswith(MAGIC)


def _split(
    record: bytes, *, key: str, position: str, where: str
) -> tuple[bytes, _Header, memoryview]:
    end = record.find(b"\n", len(MAGIC))
    header = None
    if end >= 0:
        with contextlib.suppress(msgspec.DecodeError):
            header = _HEADER.decode(record[len(MAGIC) : end])
    if header is None:
        why = f"the record of key {key!r} at position {position} has no whole header (truncated)"
        raise DecryptionError(where, why, key=key, position=position, key_id=None, why="truncated")
    return record[: end + 1], header, memoryview(record)[end + 1 :]  # never copied


def _meta(header: _Header) -> Meta | None:
    try:
        return _META_OR_NONE.decode(header.meta)
    except msgspec.DecodeError:
        return None


def readable_meta(chunks: Sequence[bytes]) -> bytes | None:
    """The meta JSON of an envelope's chunks (``[PREFIX, meta, MIDDLE, ...]``), else None."""
    if len(chunks) >= 3 and chunks[0] == PREFIX and chunks[2] == MIDDLE:
        return chunks[1]
    return None


def seal(
    encryption: Encryption | None, chunks: Sequence[bytes], *, key: str, position: str
) -> Sequence[bytes]:
    """A store's write seam: ``chunks`` as they are without encryption, else sealed."""
    if encryption is None:
        return chunks
    meta = readable_meta(chunks)
    return encryption.seal(chunks, key=key, position=position, meta=meta)


def unseal(
    encryption: Encryption | None, data: bytes, *, key: str, position: str, where: str
) -> bytes:
    """A store's read seam: the plaintext of ``data`` found at ``key``/``position``.

    Raises:
        DecryptionError: a sealed record and no ``encryption`` ("no-key", its
            readable meta on it), or one that does not open; plaintext where
            ``encryption`` expects a sealed record ("plaintext"); neither ("damaged").
        CheckpointError: an empty record where a sealed one belongs (nothing sealed in it).
    """
    if encryption is not None and is_sealed(data):
        return encryption.open(data, key=key, position=position, where=where)
    if encryption is None and is_sealed(data):
        _, header, _ = _split(data, key=key, position=position, where=where)
        raise DecryptionError(
            where,
            _no_key(header.kid),
            key=key,
            position=position,
            key_id=header.kid,
            why="no-key",
            meta=_meta(header),
        )
    if encryption is not None and not data:  # nothing sealed is lost if it is set aside
        raise CheckpointError(where, f"the record at key {key!r} position {position} is empty")
    if encryption is not None and data.lstrip()[:1] not in _JSON_STARTS:
        why = (
            f"the record at key {key!r} position {position} is neither sealed nor plaintext "
            "(its marker damaged?): kept as it is"
        )
        raise DecryptionError(where, why, key=key, position=position, key_id=None, why="damaged")
    if encryption is not None:
        why = (
            f"a plaintext record at key {key!r} position {position} of an encrypted store: "
            "planted, or written before encryption was on (`checkpointer re-encrypt "
            "--plaintext` seals it); not loaded"
        )
        raise DecryptionError(where, why, key=key, position=position, key_id=None, why="plaintext")
    return data


def _row_position(first: bytes | None, offset: int) -> str:
    """A journal row's position: its offset in the journal that ``first`` (its sealed
    first line) begins; the first line's own is "0".  A row of another journal of the key
    (one rewritten since: another first line) opens at no offset of this one."""
    if first is None:
        return "0"
    return f"{hashlib.blake2b(first, digest_size=8).hexdigest()}+{offset}"


def seal_rows(
    encryption: Encryption | None,
    rows: list[bytes],
    *,
    key: str,
    first: bytes | None,
    offset: int,
) -> list[bytes]:
    """A journal's write seam: ``rows`` (whole lines) to append at ``offset`` of the journal
    whose sealed first line is ``first`` (None: ``rows`` begin a journal), each sealed."""
    if encryption is None:
        return rows
    sealed: list[bytes] = []
    for row in rows:
        body = row.rstrip(b"\n")
        record = b"".join(
            encryption.seal([body], key=key, position=_row_position(first, offset), meta=None)
        )
        line = b"%s%s%s%s" % (_ROW_HEAD, base64.b64encode(record), _ROW_TAIL, row[len(body) :])
        sealed.append(line)
        first = line if first is None else first
        offset += len(line)
    return sealed


def open_row(
    encryption: Encryption | None,
    line: bytes,
    offset: int,
    *,
    key: str,
    first: bytes,
    where: str,
) -> bytes:
    """A journal's read seam: the plaintext of ``line`` (without its newline), found at
    ``offset`` of the journal whose first line is ``first`` (with its newline)."""
    record = line
    if line.startswith(_ROW_HEAD):
        record = MAGIC  # cut short (said truncated), unless it decodes
        if line.endswith(_ROW_TAIL):
            with contextlib.suppress(binascii.Error):
                record = base64.b64decode(line[len(_ROW_HEAD) : -len(_ROW_TAIL)], validate=True)
    position = _row_position(None if offset == 0 else first, offset)
    return unseal(encryption, record, key=key, position=position, where=where)


def _first_row(row: bytes) -> bytes:
    """What a headed journal's rows are bound to (``seal_rows``' ``first``): a digest of its
    sealed compaction row (kept in place of the row, which may be large)."""
    return hashlib.blake2b(row, digest_size=16).digest()


def seal_end(encryption: Encryption | None, *, key: str, first: bytes, size: int) -> bytes:
    """What a journal's head keeps of its rows (the first ``first``, ``size`` bytes in all),
    sealed: an empty record at their end, so a row dropped from the end is refused too."""
    if encryption is None:
        return b""
    position = f"end {_row_position(first, size)}"
    return b"".join(encryption.seal([], key=key, position=position, meta=None))


def seal_epoch(
    encryption: Encryption | None, rows: list[bytes], *, key: str
) -> tuple[list[bytes], bytes, bytes]:
    """A headed journal's compaction seam: ``rows`` that begin its rows (a compaction
    first) sealed, the digest they are bound to, and their end sealed (plain: as they are)."""
    if encryption is None:
        return rows, b"", b""
    [head] = seal_rows(encryption, rows[:1], key=key, first=None, offset=0)
    first = _first_row(head)
    sealed = [head, *seal_rows(encryption, rows[1:], key=key, first=first, offset=len(head))]
    return sealed, first, seal_end(encryption, key=key, first=first, size=sum(map(len, sealed)))


def open_end(encryption: Encryption | None, end: bytes, *, key: str, where: str) -> None:
    """Check that ``encryption`` opens a journal head's ``end`` (at the position it names):
    a writer's check before it writes over rows it has not read (``DecryptionError``)."""
    position = "end"
    if is_sealed(end):
        position = _split(end, key=key, position=position, where=where)[1].at
    unseal(encryption, end, key=key, position=position, where=where)


def open_rows(
    encryption: Encryption | None,
    rows: list[bytes],
    end: bytes,
    *,
    key: str,
    where: str,
    meta: Meta | None,
) -> list[bytes]:
    """A headed journal's read seam (S3, PostgreSQL): the plaintext of ``rows`` (as stored,
    each with its row end, its compaction first), checked against ``end``.

    Raises:
        DecryptionError: a row or the end that does not open there ("truncated": rows
            dropped from the end, or added after it), with ``meta`` (the head's, readable).
    """
    first, offset, opened, at = _first_row(rows[0] if rows else b""), 0, [], ""
    try:
        for row in rows:
            line = row.rstrip(b"\n")
            opened.append(open_row(encryption, line, offset, key=key, first=first, where=where))
            opened[-1] += row[len(line) :]
            offset += len(row)
        at = f"end {_row_position(first, offset)}"
        unseal(encryption, end, key=key, position=at, where=where)
    except DecryptionError as exc:
        exc.meta = exc.meta or meta
        if exc.why != "moved" or exc.position != at:
            raise
        why = (
            f"the rows of key {key!r} end at {at}, not where its head (sealed with key id "
            f"{exc.key_id!r}) says: rows were dropped from the end, or added; not loaded"
        )
        kid = exc.key_id
        raise DecryptionError(
            where, why, key=key, position=at, key_id=kid, why="truncated", meta=meta
        ) from None
    return opened
