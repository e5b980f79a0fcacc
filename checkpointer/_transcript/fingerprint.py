"""Agent transcripts: a fingerprint for the writer's unchanged check (the end, and the rest)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Hashable
from typing import Any

import msgspec

from .._values import Snapshot
from .messages import get_field

__all__ = ["transcript_fingerprint"]


def transcript_fingerprint(*, field: str = "messages") -> Callable[[Snapshot], Hashable]:
    """A structural fingerprint of a transcript: the one ``Transcript`` gives the writer.

    It is made of the key, the parent, the message count, the whole last
    message and everything in the state but the messages (their JSON, as the
    writer would encode them).  So any change of the last message is seen (a
    streamed tool-call ``arguments``, a same-length text, ``2`` to ``2.0``),
    and any change outside the messages (a title, a tool's state, a pin),
    at a cost bounded by those: it costs the same at 10 and at 100,000
    messages, because it never iterates, hashes or encodes the rest of the
    history.  The price: an edit of an earlier message that leaves the count
    and the last message as they were is not seen; give the snapshot a
    revision counter as its own fingerprint, or use
    ``write_now(force=True)``, after such edits.

    The messages may be of any shape: a dict, a Struct, a dataclass,
    anything msgspec encodes; an object it cannot encode is taken as its
    class name and attributes (``__dict__`` and ``__slots__``), else its
    ``repr``.

    Args:
        field: the state's field (dict key or attribute) holding the messages.
    """

    def fingerprint(snapshot: Snapshot) -> Hashable:
        state = snapshot.state
        messages = get_field(state, field)
        if messages is None:
            raise TypeError(f"the state has no {field!r} field")
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
    """``state`` without its messages: a dict of its other fields (their values as they are)."""
    if isinstance(state, dict):
        return {k: v for k, v in state.items() if k != field}
    if isinstance(state, msgspec.Struct):
        names = state.__struct_fields__
    elif dataclasses.is_dataclass(state):
        names = tuple(f.name for f in dataclasses.fields(state))
    else:
        return None
    return {name: getattr(state, name) for name in names if name != field}


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
