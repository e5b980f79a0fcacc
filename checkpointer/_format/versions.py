"""The caller's state versions: a newer file refused, an older one migrated step by step
(on plain JSON values) and then decoded as any load is."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from .._values import Checkpoint, CheckpointError, Meta, NewerVersionError
from .envelope import decode_state

__all__ = ["Migration", "decode_versioned", "newer_state"]

Migration = Callable[[Any], Any]  # a state at version v (plain JSON values) -> at v + 1

_ENCODER = msgspec.json.Encoder()


def decode_versioned(
    raw: Checkpoint[msgspec.Raw],
    path: str,
    type: Any,
    state_version: int,
    migrations: Mapping[int, Migration],
) -> Checkpoint[Any]:
    """Decode ``raw`` (its state still JSON), written at any state version up to
    ``state_version``, as ``type``; ``path`` names it in errors.

    Raises:
        CheckpointError: its state version is newer than ``state_version``,
            a migration step is missing or raised, or the (migrated) state
            does not match ``type``.
    """
    if isinstance(state_version, bool) or not isinstance(state_version, int) or state_version < 0:
        raise ValueError(f"state_version must be an int >= 0, got {state_version!r}")
    found = raw.meta.state_version
    if found > state_version:
        raise newer_state(
            path,
            raw.meta,
            f"state version {found} is newer than this program supports ({state_version}); "
            f"upgrade the program that reads it, or load it with state_version={found}",
        )
    if found == state_version:
        return Checkpoint(meta=raw.meta, state=decode_state(raw.state, path, type))
    state = msgspec.json.decode(bytes(raw.state))
    for version in range(found, state_version):
        migrate = migrations.get(version)
        if migrate is None:
            raise CheckpointError(
                path,
                f"state version {found} needs migrating to {state_version}, but there is "
                f"no migration from version {version}; register migrations[{version}]",
            )
        try:
            state = migrate(state)
        except Exception as exc:
            raise CheckpointError(
                path,
                f"migration from state version {version} to {version + 1} raised "
                f"{exc.__class__.__name__}: {exc}",  # ``type`` is the parameter here
            ) from exc
    try:
        state_json = _ENCODER.encode(state)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(
            path,
            f"migration to state version {state_version} returned a state that cannot be "
            f"encoded as JSON: {exc}",
        ) from exc
    return Checkpoint(meta=raw.meta, state=decode_state(state_json, path, type))


def newer_state(path: str, meta: Meta, detail: str) -> NewerVersionError:
    """The error for a file whose state version is newer than the program's."""
    by = f" with agent-checkpointer {meta.library_version}" if meta.library_version else ""
    return NewerVersionError(
        path,
        f"written by a newer version of the program (state version {meta.state_version}{by}): "
        + detail,
        meta.library_version,
    )
