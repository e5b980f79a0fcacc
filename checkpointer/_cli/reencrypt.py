"""``checkpointer re-encrypt``: seal every checkpoint of a root again with the current key.

Each checkpoint is written again at its own revision, by the store's conditional write
and under the key's writer lock where the store has one: a writer that expects that
revision writes on undisturbed; a key a live writer holds is skipped and said, never
overwritten; one written since it was read is left (its writer sealed it).  A journal
stays a journal (a PostgreSQL one is compacted at its revision, in one transaction; an
S3 one is one new segment, the old ones removed).  A plaintext checkpoint is sealed only
with ``--plaintext``; one that no key opens is left as it is.
"""

from __future__ import annotations

import argparse
from typing import Any

from checkpointer import CheckpointError, JournalStore, PostgresJournalStore, S3JournalStore
from checkpointer.stores import KeyLocked, KeyLockedError, StaleWrite

from . import report
from .roots import (
    LINE_END,
    DecryptionError,
    Full,
    Root,
    compaction_row,
    decode_raw,
    envelope_chunks,
    header_line,
)

HELP = "seal every checkpoint again with the current key (after a key rotation)"
DESCRIPTION = (
    "Write every checkpoint of ROOT again, sealed with the current key (the first of "
    "--key-file or CHECKPOINTER_KEYS; the others open what they sealed). Each keeps its "
    "revision, so a writer running on it is not disturbed; a key a live writer holds is "
    "skipped and named: run it again once that writer has closed. Exit status 1 while "
    "any checkpoint was skipped or left unsealed."
)


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--plaintext",
        action="store_true",
        help="also seal checkpoints stored in plaintext (written before encryption was on)",
    )


def run(root: Root, args: argparse.Namespace) -> int:
    if root.encryption is None:
        report.error("re-encrypt", "give the keys: --key-file FILE or CHECKPOINTER_KEYS")
        return report.PROBLEM
    entries = root.scan()
    sealed = left = 0
    for entry in entries:
        store = root.stores[entry.kind]
        why = _reseal(store, entry.key, plaintext=args.plaintext)
        if why is None:
            sealed += 1
            report.line(f"sealed {entry.path}")
        else:
            left += 1
            report.line(f"left   {entry.path}: {why}")
    report.line(f"{len(entries)} checkpoint(s): {sealed} sealed with the current key, {left} left")
    return report.PROBLEM if left else report.OK


def _reseal(store: Any, key: str, *, plaintext: bool) -> str | None:
    """Seal ``key``'s checkpoint again with the current key; None, or why it was left."""
    try:
        revision = store.revision(key)
        found = _plain(store, key, plaintext=plaintext)
        if revision is None or found is None:
            return "removed meanwhile"
        meta, state = found
        if isinstance(store, PostgresJournalStore) and store.is_journal(key):
            store.commit(key, meta, Full(whole=state), expected=revision)  # a compaction
        else:
            chunks = _chunks(store, meta, state)
            store.write(key, chunks, revision=revision, expected=revision)
    except DecryptionError as exc:
        return exc.reason
    except (KeyLocked, KeyLockedError) as exc:
        return f"a live writer holds it, not overwritten: {exc}"
    except StaleWrite:
        return "written since it was read (by a writer, which sealed it)"
    except CheckpointError as exc:  # damaged: said, and on to the next key
        return f"it cannot be read, left as it is: {exc.reason}"
    return None


def _plain(store: Any, key: str, *, plaintext: bool) -> tuple[Any, bytes] | None:
    """The meta and state of ``key``'s checkpoint; a plaintext one (``DecryptionError``
    "plaintext") only with ``plaintext``."""
    keys = store.encryption
    try:
        checkpoint = _checkpoint(store, key)
    except DecryptionError as exc:
        if exc.why != "plaintext" or not plaintext:
            raise
        store.encryption = None  # this one read as it is stored
        try:
            checkpoint = _checkpoint(store, key)
        finally:
            store.encryption = keys
    return checkpoint


def _chunks(store: Any, meta: Any, state: bytes) -> list[bytes]:
    """What ``store.write`` takes: a journal file (a header and one compaction) or an envelope."""
    if isinstance(store, JournalStore | S3JournalStore):
        meta_json = envelope_chunks(meta, b"")[1]
        return [header_line(meta_json), *compaction_row(meta_json, None, [state], LINE_END)]
    return envelope_chunks(meta, state)


def _checkpoint(store: Any, key: str) -> tuple[Any, bytes] | None:
    if isinstance(store, JournalStore | S3JournalStore):
        found = store.read_checkpoint(key)
        return None if found is None else (found.meta, bytes(found.state))
    data = store.read(key)
    if data is None:
        return None
    raw = decode_raw(data, store.location(key))
    return raw.meta, bytes(raw.state)
