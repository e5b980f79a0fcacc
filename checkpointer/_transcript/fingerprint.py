"""Agent transcripts: a fingerprint of the last message, for the writer's unchanged check."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import msgspec

from .._values import Snapshot
from .messages import get_field

__all__ = ["transcript_fingerprint"]


def transcript_fingerprint(
    *, field: str = "messages", pin: str = "pinned", extra: Sequence[str] = ()
) -> Callable[[Snapshot], Hashable]:
    """A structural fingerprint of a transcript: the one ``Transcript`` gives the writer.

    It is made of the key, the parent, the message count, the whole last
    message (its JSON, as the writer would encode it), the state's pin flag,
    and the state fields named in ``extra``.  So any change of the last
    message is seen (a streamed tool-call ``arguments``, a ``tool_use``
    block's ``input``, an earlier block, a same-length text, ``2`` to
    ``2.0``), at a cost bounded by that message's size: it costs the same
    at 10 and at 100,000 messages, because it never iterates, hashes or
    encodes the rest of the history.  The price: an edit of an earlier
    message that leaves the count and the last message as they were is not
    seen; name a revision counter in ``extra``, or use
    ``write_now(force=True)``, after such edits.

    The last message may be of any shape: a dict, a Struct, a dataclass,
    anything msgspec encodes; an object it cannot encode is taken as its
    class name and attributes (``__dict__`` and ``__slots__``), else its
    ``repr``.

    Args:
        field: the state's field (dict key or attribute) holding the messages.
        pin: the state's field holding a pin flag (absent counts as None).
        extra: more state fields to include; their values must be hashable.
    """
    names = tuple(extra)

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
            get_field(state, pin),
            tuple(get_field(state, name) for name in names),
        )

    return fingerprint


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
