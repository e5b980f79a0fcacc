"""The commands over an S3 store: ROOT is ``s3://bucket/prefix`` (``--endpoint-url``).

``S3Root`` is the ``Root`` (``roots.py``) of an ``S3Store`` and an
``S3JournalStore`` sharing a prefix: one LIST finds both kinds (snapshot
objects ``<key>.json``, journal heads ``<key>.journal``) and the objects a
writer moved aside (``<key>.corrupt-<UTC time>``), and everything else goes
through the store API, so a journal is read as its head and segments.
There are no locks to look at: S3 has none.  ``prune`` deletes a key
only after looking at it again (``recheck``): a writer that resumed it
since the listing keeps it; one that writes it after the delete finds it
gone and never brings it back (its conditional PUT is refused).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from checkpointer import S3JournalStore, S3Store, load
from checkpointer.stores import KEY_PATTERN, S3StoreError, check_key

from . import sidefiles
from .roots import Entry, Extra, Extras, Loaded, LockView, Recheck, Removal, RootError, Scan, Words

__all__ = ["S3Root", "is_s3"]

_SCHEME = "s3://"


def is_s3(root: str) -> bool:
    """Whether a ROOT argument names an S3 bucket rather than a directory."""
    return root.startswith(_SCHEME)


class S3Root:
    """The keys under an S3 prefix: snapshot objects and journal heads."""

    words = Words(
        entry="object",
        unreadable="{n} key(s) cannot be read; `checkpointer verify {where}` says why",
        unreadable_on_stdout=False,
        prune_noun="checkpoint(s)",
        count_hint=True,
    )
    kinds: tuple[str, ...] = ("snapshot", "journal")
    lock_files = False
    mtimes = True
    has_extras = False
    failure: tuple[type[Exception], ...] = (S3StoreError,)

    def __init__(self, url: str, endpoint_url: str | None) -> None:
        bucket, _, prefix = url[len(_SCHEME) :].partition("/")
        try:
            self.stores: dict[str, Any] = {
                "snapshot": S3Store(bucket, prefix, endpoint_url=endpoint_url),
                "journal": S3JournalStore(bucket, prefix, endpoint_url=endpoint_url),
            }
        except (ImportError, ValueError) as exc:  # no botocore, a bad bucket name
            raise RootError(str(exc)) from None
        self.where = self.stores["snapshot"].s3.url("").rstrip("/")
        self._listed: dict[str, tuple[int, datetime]] = {}
        self._asides: list[str] = []

    def close(self) -> None:
        pass

    def validate_key(self, key: str) -> None:
        check_key(key)

    def scan(self) -> Scan:
        entries = []
        self._asides = []
        for name, size, modified in self.stores["snapshot"].listing():
            if sidefiles.ASIDE.search(name):
                self._asides.append(self.stores["snapshot"].s3.url(name))
            for kind, store in self.stores.items():
                key = name[: -len(store.suffix)]
                if name.endswith(store.suffix) and KEY_PATTERN.fullmatch(key):
                    entry = Entry(key, kind, store.location(key))
                    self._listed[entry.path] = (size, modified)
                    entries.append(entry)
        return Scan(entries, frozenset())

    def lock(self, key: str) -> LockView | None:
        return None  # S3 has no locks

    def measure(self, entry: Entry) -> tuple[int, datetime | None]:
        listed = self._listed.get(entry.path)
        if listed is None:
            data = self.raw(entry)
            return (0 if data is None else len(data)), None
        return listed

    def load(self, entry: Entry) -> Loaded | None:
        checkpoint = load(self.stores[entry.kind], entry.key)
        if checkpoint is None:
            return None
        return Loaded(checkpoint.meta, checkpoint.state, checkpoint.torn)

    def raw(self, entry: Entry) -> bytes | None:
        data: bytes | None = self.stores[entry.kind].read(entry.key)
        return data

    def asides(self) -> list[str]:
        return list(self._asides)

    def planted(self, entry: Entry) -> str | None:
        return None

    def extras(self) -> Extras:
        return Extras([], [])

    def extra(self, entry: Entry) -> Extra | None:
        return None

    def delete(
        self,
        key: str,
        old: Sequence[tuple[Entry, str]],
        *,
        recheck: Recheck,
        stale: str | None,
    ) -> list[Removal]:
        done: list[Removal] = []
        for entry, reason in old:
            kept = recheck(entry)
            if kept is not None:
                done.append(Removal(entry.path, "kept", kept))
            elif self.stores[entry.kind].delete(key):
                done.append(Removal(entry.path, "removed", reason))
        return done
