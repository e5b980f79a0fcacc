"""The object store: key ``k`` at ``s3://bucket/prefix/k.json``, one envelope object per key.

``S3Store`` implements ``Store`` (``base.py``) with conditional PUTs:

* **Fencing without a lock service.**  The revision of each checkpoint is
  kept in the object's metadata (``x-amz-meta-revision``), so
  ``revision()`` is a HEAD.  A write that expects no checkpoint PUTs with
  ``If-None-Match: *``; one that expects revision R PUTs with
  ``If-Match:`` the ETag of the object that holds R (remembered from this
  store's last PUT or read of the key, else learnt by a HEAD).  The service
  checks the condition atomically with the write: 412 when another writer
  replaced the object since, 404 when it was deleted (If-Match on a missing
  key).  Then a HEAD says what the key holds, and ``landed`` decides: this
  very write (botocore's retry of a PUT whose answer was lost meets the
  store's own new ETag) is written; anything else is ``StaleWrite``.
* **No lock.**  S3 has no lock service, so this store has no ``lock()``:
  two live writers of one key both start, and the second learns of the
  first at its first write (``Failed("conflict")``); neither ever replaces
  what the other wrote after it looked.
* **Sealed records are never replaced by a writer without their key.**
  With ``encryption``, an object keeps the id and fingerprint of the key
  that sealed it readable (``x-amz-meta-sealer``): the HEAD that finds the
  ETag to fence on (or the GET that remembered it) tells a writer whose
  ``Encryption`` does not hold that key, or that has none, and its write
  is refused (``DecryptionError``) without a request more.
* **Atomic and durable.**  One PUT replaces the whole object: a reader sees
  the old checkpoint or the new one.  It is durable when S3 answers 200.
* **Deletes** are writes: a writer whose key was deleted finds it gone at
  its next write (404 to its If-Match) and never recreates it.

The connection, its timeouts, forks and errors: ``client.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from ..._format.envelope import decode_meta
from ..base import KEY_PATTERN, check_key, landed
from ..sealing import (
    DecryptionError,
    Encryption,
    check_sealed_by,
    is_sealed,
    seal,
    sealed_by,
    unseal,
)
from .client import S3Client, condition_failed, error_code

__all__ = ["Listed", "S3Store"]


class Listed(NamedTuple):
    """An object a LIST found."""

    name: str  # under the prefix
    size: int
    modified: datetime
    etag: str


REVISION = "revision"
"""The user-metadata name of an object's revision (``x-amz-meta-revision``)."""
SEALER = "sealer"
"""The user-metadata name of the key that sealed an object (``sealing.sealed_by``)."""


class Seen(NamedTuple):
    """What a HEAD or GET of an object said (None: no object)."""

    revision: str | None
    etag: str | None
    sealer: str = ""  # "key_id:fingerprint" of the key that sealed it ("": plaintext)


class S3Store:
    """Checkpoints as objects in an S3 bucket: key ``k`` at ``s3://bucket/prefix/k.json``.

    Each checkpoint is one conditional PUT of the whole state (see the
    module docstring).  For sessions that grow, ``S3JournalStore`` uploads
    only what changed.

    Args:
        bucket: the bucket (it must exist).
        prefix: a folder in the bucket ("" for the top; "/" is added).
        endpoint_url: an S3-compatible service (MinIO, R2, ...); None for AWS.
        region: the region; None reads it as the AWS SDKs do (``AWS_REGION``,
            the profile).  Credentials and retries are always read that way.
        connect_timeout: seconds to connect, per attempt of each request.
        read_timeout: seconds to wait for data, per attempt of each request.
        encryption: seal every object (``Encryption``): only its revision
            and meta stay readable (see the docs page "Encryption at rest").

    Raises:
        ImportError: botocore is not installed (the ``s3`` extra).
        ValueError: an invalid bucket name, prefix or timeout.
    """

    suffix = ".json"

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 10.0,
        encryption: Encryption | None = None,
    ) -> None:
        self.encryption = encryption
        self.s3 = S3Client(
            bucket,
            prefix,
            endpoint_url=endpoint_url,
            region=region,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
        )
        # object name -> what was last seen of it; each update is one dict operation,
        # atomic without a lock (none to be left held in a forked child)
        self._etags: dict[str, Seen] = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.s3.where!r})"

    @property
    def bucket(self) -> str:
        return self.s3.bucket

    @property
    def prefix(self) -> str:
        return self.s3.prefix

    def validate_key(self, key: str) -> None:
        check_key(key)

    def location(self, key: str) -> str:
        return self.s3.url(key + self.suffix)

    def open(self) -> None:
        """Nothing to prepare: the client connects on first use."""

    def probe(self) -> bool:
        """True once the endpoint answers again after a write could not reach it."""
        return self.s3.probe()

    # -- writes --------------------------------------------------------------

    def write(
        self, key: str, chunks: Sequence[bytes], *, revision: str, expected: str | None
    ) -> int:
        """PUT the joined chunks at ``key`` if it holds revision ``expected`` (see ``Store.write``).

        Raises:
            StaleWrite: the key holds another revision, or none.
            S3StoreError: the endpoint, bucket or credentials failed.
        """
        check_key(key)
        sealed = seal(self.encryption, chunks, key=key, position=revision)
        body = b"".join(sealed)  # in the worker thread: a large join releases the GIL
        self.put(key + self.suffix, key, body, revision=revision, expected=expected)
        return len(body)

    def put(self, name: str, key: str, body: bytes, *, revision: str, expected: str | None) -> None:
        """PUT ``body`` at ``name`` (of ``key``) if it holds ``expected``: the fenced write."""
        params: dict[str, Any] = {"Key": self.s3.prefix + name, "Body": body}
        sealer = sealed_by(self.encryption)
        params["Metadata"] = {REVISION: revision}
        if sealer:  # read back by the HEAD or GET a writer's If-Match is learnt from
            params["Metadata"][SEALER] = sealer
        params["ContentType"] = "application/json"
        if expected is None:
            params["IfNoneMatch"] = "*"
        else:
            etag = self._etag(name, key, revision, expected)
            if etag is None:
                return  # this very write landed already
            params["IfMatch"] = etag
        try:
            answer = self.s3.call("put_object", **params)
        except Exception as exc:
            self._forget(name)
            if not condition_failed(exc):
                raise
            seen = self.head(name, key)
            if not landed(key, seen.revision, revision, expected):
                raced = f"{self.s3.url(name)}: a concurrent write raced; will retry"
                raise OSError(raced) from None
            self._remember(name, Seen(revision, seen.etag, sealer))
            return
        self._remember(name, Seen(revision, answer["ETag"], sealer))

    def _etag(self, name: str, key: str, revision: str, expected: str) -> str | None:
        """The ETag of the object holding ``expected``; None if it holds ``revision`` already.

        Raises:
            StaleWrite: it holds neither.
            DecryptionError: it is sealed with a key this store's ``Encryption`` lacks.
        """
        seen = self._etags.get(name)
        if seen is None or seen.revision != expected:
            seen = self.head(name, key)
            if landed(key, seen.revision, revision, expected):
                return None
        where = self.location(key)
        check_sealed_by(self.encryption, seen.sealer, key=key, position=expected, where=where)
        return seen.etag

    def _remember(self, name: str, seen: Seen) -> None:
        if seen.revision is None or seen.etag is None:
            self._etags.pop(name, None)
        else:
            self._etags[name] = seen

    def _forget(self, name: str) -> None:
        self._remember(name, Seen(None, None))

    # -- reads ---------------------------------------------------------------

    def head(self, name: str, key: str) -> Seen:
        """What the object ``name`` holds now (its revision None if there is none)."""
        try:
            answer = self.s3.call("head_object", Key=self.s3.prefix + name)
        except Exception as exc:
            if error_code(exc) in ("NoSuchKey", "404"):
                return Seen(None, None)
            raise
        metadata = answer.get("Metadata", {})
        revision = metadata.get(REVISION)
        if revision is None:  # put there by another tool: the revision is in the bytes
            data = self.get(name)
            if data is not None and is_sealed(data):
                raise self._unbound(key)
            revision = None if data is None else self.revision_in(key, data)
        return Seen(revision, answer["ETag"], metadata.get(SEALER, ""))

    def _unbound(self, key: str) -> DecryptionError:
        """A sealed object without the metadata that says its revision: not damage."""
        why = (
            f"a sealed object without its revision metadata (x-amz-meta-{REVISION}): restored "
            "from a backup, or copied by a tool that drops user metadata?  Its revision is "
            "unknown, so it is neither loaded nor written over; copy it back with its metadata "
            f'({REVISION} = the revision its header line names, "at")'
        )
        where = self.location(key)
        return DecryptionError(where, why, key=key, position="?", key_id=None, why="truncated")

    def revision_in(self, key: str, data: bytes) -> str | None:
        """The revision an object's bytes say (an envelope's meta)."""
        return decode_meta(data, self.location(key)).revision

    def get(self, name: str) -> bytes | None:
        """The bytes of the object ``name``, or None."""
        found = self.fetch(name)
        return None if found is None else found[0]

    def fetch(self, name: str) -> tuple[bytes, str] | None:
        """The bytes and ETag of the object ``name``, or None."""
        try:
            answer = self.s3.call("get_object", Key=self.s3.prefix + name)
        except Exception as exc:
            if error_code(exc) in ("NoSuchKey", "404"):
                return None
            raise
        with answer["Body"] as body:
            data: bytes = body.read()
        metadata = answer.get("Metadata", {})
        revision = metadata.get(REVISION)
        if revision is not None:
            self._remember(name, Seen(revision, answer["ETag"], metadata.get(SEALER, "")))
        return data, answer["ETag"]

    def read(self, key: str) -> bytes | None:
        """The bytes of ``key``'s object, or None."""
        check_key(key)
        name = key + self.suffix
        found = self.fetch(name)
        if found is None:
            return None
        seen = self._etags.get(name)  # the revision fetch saw on it (its metadata)
        at = "(none in its metadata)"
        if seen is not None and seen.etag == found[1] and seen.revision is not None:
            at = seen.revision
        elif self.encryption is not None and is_sealed(found[0]):
            raise self._unbound(key)
        return unseal(self.encryption, found[0], key=key, position=at, where=self.location(key))

    def revision(self, key: str) -> str | None:
        """The revision ``key`` holds (None: no checkpoint): one HEAD."""
        check_key(key)
        return self.head(key + self.suffix, key).revision

    def keys(self) -> list[str]:
        """The keys with a checkpoint under the prefix, sorted (one LIST per 1,000 objects)."""
        n = len(self.suffix)
        found = [
            item.name[:-n]
            for item in self.listing()
            if item.name.endswith(self.suffix) and KEY_PATTERN.fullmatch(item.name[:-n])
        ]
        return sorted(found)

    def listing(self, folder: str = "") -> list[Listed]:
        """The objects in ``folder``, as one LIST per 1,000 gives them."""
        found: list[Listed] = []
        params: dict[str, Any] = {"Prefix": self.s3.prefix + folder, "Delimiter": "/"}
        start = len(self.s3.prefix)
        while True:
            answer = self.s3.call("list_objects_v2", **params)
            found.extend(
                Listed(item["Key"][start:], item["Size"], item["LastModified"], item["ETag"])
                for item in answer.get("Contents", [])
            )
            if not answer.get("IsTruncated"):
                return found
            params["ContinuationToken"] = answer["NextContinuationToken"]

    # -- deletes -------------------------------------------------------------

    def delete(self, key: str, *, etag: str | None = None) -> bool:
        """Remove ``key``'s object; False if there was none.

        A writer of the key finds it gone at its next write (its If-Match
        meets no object) and never recreates it.  There is no lock to
        refuse the delete while a writer is live: delete keys whose
        sessions are over.  ``etag``: only if it is still that object (a
        prune removes only what it looked at); else the service's refusal,
        a botocore ``ClientError`` (``PreconditionFailed``), is raised.
        """
        check_key(key)
        return self.remove(key + self.suffix, etag)

    def remove(self, name: str, etag: str | None = None) -> bool:
        """Delete the object ``name`` (only if its ETag is ``etag``); False if there was none."""
        self._forget(name)
        params = {"Key": self.s3.prefix + name}
        try:
            if etag is None:  # S3 answers a DELETE alike whether the object was there or not
                self.s3.call("head_object", **params)
            else:
                params["IfMatch"] = etag
            self.s3.call("delete_object", **params)
        except Exception as exc:
            if error_code(exc) in ("NoSuchKey", "404"):
                return False
            raise
        return True

    def move_aside(self, key: str, suffix: str) -> str | None:
        """Put ``key``'s object at ``k.<suffix>`` and delete it; where it went, or None.

        None also when the object changed before its DELETE (a writer made
        the key again): that object stays and the copy goes.
        """
        check_key(key)
        found = self.fetch(key + self.suffix)
        return None if found is None else self.put_aside(key, suffix, *found)

    def put_aside(self, key: str, suffix: str, body: bytes, etag: str) -> str | None:
        """PUT ``body`` at ``k.<suffix>``, then delete ``key``'s object if it is still ``etag``."""
        target = f"{key}.{suffix}"
        self.s3.call("put_object", Key=self.s3.prefix + target, Body=body)
        try:
            if self.remove(key + self.suffix, etag):
                return self.s3.url(target)
        except Exception as exc:
            if not condition_failed(exc):
                raise
        self.remove(target)  # the key holds another object now: it stays, the copy goes
        return None
