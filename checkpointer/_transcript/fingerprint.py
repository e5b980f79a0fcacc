"""Agent transcripts: a fingerprint for the writer's unchanged check (the end, and the rest)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable
from typing import Any

import msgspec

from .._values import Snapshot, transcript_messages

__all__ = ["transcript_fingerprint"]


def transcript_fingerprint(*, field: str = "messages") -> Callable[[Snapshot], Hashable]:
    """The writer's unchanged check for a transcript (``Transcript`` gives it).

    The key, the parent, the message count, the whole last message and the
    state but its messages, as JSON: any change is seen but an edit of an
    earlier message that keeps the count and the last message, at a cost
    that does not grow with the history.  After such edits give the snapshot
    a revision counter as its own fingerprint, or ``write_now(force=True)``.
    A state without messages (``transcript_messages``) is taken whole, as JSON.
    An object msgspec cannot encode counts as its class and attributes
    (``__dict__``, ``__slots__``), else its ``repr``.
    """

    def fingerprint(snapshot: Snapshot) -> Hashable:
        state = snapshot.state
        messages = transcript_messages(state, field)
        if messages is None:
            return (snapshot.key, snapshot.parent, _whole(state))
        count = len(messages)
        return (
            snapshot.key,
            snapshot.parent,
            count,
            _whole(messages[-1]) if count else None,
            _whole(_without(state, field)),
        )

    return fingerprint


def _without(state: Any, field: str) -> Any:
    """``state`` (a dict or a Struct) without its messages; a Struct stays one, so its
    tag and renamed fields are encoded as the store encodes them."""
    if isinstance(state, dict):
        return {k: v for k, v in state.items() if k != field}
    return msgspec.structs.replace(state, **{field: ()})


def _attributes(obj: Any) -> Any:
    """What the fingerprint encodes of an object msgspec cannot: class and attributes."""
    names: dict[str, Any] = dict(getattr(obj, "__dict__", None) or {})
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in names and name not in ("__dict__", "__weakref__"):
                with contextlib.suppress(AttributeError):  # an unset slot
                    names[name] = getattr(obj, name)
    if not names:
        return repr(obj)
    return [type(obj).__module__, type(obj).__qualname__, names]


_WHOLE = msgspec.json.Encoder(enc_hook=_attributes)


def _whole(message: Any) -> Hashable:
    """The last message as JSON: any change of it changes the bytes (``2`` vs ``2.0``)."""
    try:
        return _WHOLE.encode(message)
    except Exception:  # unencodable even so (a cycle, a key of an odd type)
        return ("repr", type(message).__qualname__, repr(message))
