"""``load()``: read a key's state as raw JSON, migrate or refuse its version, decode once."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from ._format.envelope import decode_state
from ._format.versions import decode_versioned
from ._stores.base import StateStore, Store
from ._stores.envelopes import Envelopes
from ._values import Checkpoint

__all__ = ["load"]


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
    states = store if isinstance(store, StateStore) else Envelopes(store)
    raw = states.read_checkpoint(key)
    if raw is None:
        return None
    if state_version is None:
        checkpoint = Checkpoint(meta=raw.meta, state=decode_state(raw.state, location, type))
    else:
        checkpoint = decode_versioned(raw, location, type, state_version, migrations or {})
    if raw.torn is not None:
        checkpoint = msgspec.structs.replace(checkpoint, torn=raw.torn)
    return checkpoint
