"""What a message shape (a *dialect*) tells the helpers, and field readers they share."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from typing import Any, Literal, TypeAlias

from ..messages import get_field

__all__ = [
    "NONE",
    "PLAIN",
    "TURN",
    "Classified",
    "Dialect",
    "Reading",
    "Window",
    "build",
    "first_by_id",
    "framework_class",
    "keyed",
    "seq",
    "short",
    "text_of",
    "tool_name",
]

Window: TypeAlias = Literal["run", "next", "turn", "free"]
"""Where a call must be answered: *run*, in the results right after its message (a run
of tool messages); *next*, in the message right after it; *turn*, in the requests of
results after it (pydantic-ai sends consecutive requests as one); *free*, anywhere
after it (the Responses API pairs a call and its output by id)."""

Reading: TypeAlias = tuple[Sequence[Any], Sequence[Any], bool | str, bool, bool]
"""What the scan reads of a message: (result ids, call ids, is a turn, keeps
the window of open calls, holds a running result).  A turn may be a message id
instead of True: messages in a row with the same id are parts of one turn (the
Claude Code CLI writes each block of a response as an entry of its own)."""

PLAIN: Reading = ((), (), False, False, False)
TURN: Reading = ((), (), True, False, False)


class Dialect:
    """One message shape: how the helpers read it, answer its calls, settle and show it.

    ``defers``: the framework persists a call open on purpose (a deferred tool,
    an approval): still open at the end of a paused run, it is *pending*.
    """

    name: str = ""
    window: Window = "run"
    defers: bool = False
    call_id: str = "id"  # the field of a call (in ``calls``) that holds its id
    branched: bool = False  # its messages may be of a branch (``branch``)

    def __repr__(self) -> str:
        return f"<dialect {self.name}>"

    def read(self, message: Any) -> Reading:
        """What the scan needs of ``message``: see ``Reading``."""
        raise NotImplementedError

    def branch(self, message: Any) -> str | None:
        """The branch of ``message`` (ADK's parallel agents): a call is answered, and its
        window ended, only by messages of a branch it sees (None: every call sees it)."""
        return None

    def calls(self, message: Any) -> Sequence[Any]:
        """The calls of ``message``, for ``answer`` to build on (none by default)."""
        return ()

    def answers(self, call_message: Any, call_ids: list[str]) -> list[Any]:
        """The results (messages, or parts for *next* and *turn* windows) closing ``call_ids``."""
        calls = first_by_id(self.calls(call_message), self.call_id)
        return [self.answer(call_message, calls.get(c), c) for c in call_ids]

    def answer(self, call_message: Any, call: Any, call_id: str) -> Any:
        raise NotImplementedError

    def merge(self, follower: Any, answers: list[Any]) -> Any:
        """*next* windows: ``follower`` with ``answers`` added, or None if it cannot take them."""
        return None

    def carrier(self, call_message: Any, answers: list[Any]) -> Any:
        """*next* windows: a new message holding ``answers``."""
        raise NotImplementedError

    def settle(self, message: Any, reason: str) -> tuple[Any, int]:
        """``message`` with its running results settled as errors, and how many."""
        return message, 0

    # The CLI's view: who speaks, what is said, the tools called, a user's text (else None).

    def label(self, message: Any) -> str:
        return self.name

    def text(self, message: Any) -> str:
        return ""

    def call_names(self, message: Any) -> list[str]:
        return []

    def user_text(self, message: Any) -> str | None:
        return None


Classified: TypeAlias = tuple[Dialect | None, Reading]
"""A message's dialect (None: no dialect recognises it) and what the scan reads of it."""

NONE: Classified = (None, PLAIN)


# -- reading fields of any dialect --------------------------------------------


def seq(value: Any) -> Sequence[Any]:
    return value if isinstance(value, (list, tuple)) else ()


def text_of(content: Any) -> str:
    """The text of a content: a string, or the strings and ``text`` of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        parts = (p if isinstance(p, str) else get_field(p, "text") for p in content)
        return " ".join(p for p in parts if isinstance(p, str))
    return ""


def keyed(block: Any, kinds: frozenset[str], marks: frozenset[str] = frozenset()) -> str | None:
    """The kind of a block that says it by its one key (Converse's ``{"toolUse": ...}``,
    Gemini's parts): the one key of ``kinds`` set (not None), beside ``marks`` (Gemini's
    ``thought``); None for a block of another shape, or of a key no dialect knows.  An
    object (a pydantic model) is read by its attributes."""
    fields = block if type(block) is dict else getattr(block, "__dict__", None)
    if type(fields) is not dict:
        return None
    found = None
    for key, value in fields.items():
        if value is None or key in marks:
            continue
        if found is not None or key not in kinds:
            return None
        found = key
    return found


def short(value: Any, width: int = 40) -> str:
    """An id or a name as a label shows it: cut to ``width`` with ``...``, as texts are."""
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def tool_name(value: Any) -> str:
    """A tool's name as the CLI shows it: ``?`` for a call without one."""
    return short(value) if isinstance(value, str) and value else "?"


def first_by_id(calls: Sequence[Any], field: str) -> dict[Any, Any]:
    """The calls by their id, the first of each id (as a search in order finds it)."""
    found: dict[Any, Any] = {}
    for call in calls:
        key = get_field(call, field)
        if isinstance(key, str):
            found.setdefault(key, call)
    return found


# -- building answers as the framework's own objects ---------------------------


def framework_class(obj: Any, name: str) -> Any:
    """The class ``name`` of ``obj``'s framework, in its module or a parent package, from
    ``sys.modules`` (loaded, since its objects are in hand)."""
    module = type(obj).__module__
    while module:
        found = getattr(sys.modules.get(module), name, None)
        if isinstance(found, type):
            return found
        module = module.rpartition(".")[0]
    return None


def build(cls: Any, fields: dict[str, Any]) -> Any:
    """``cls(**fields)``, but the fields it does not have (a dataclass, a pydantic model)."""
    if dataclasses.is_dataclass(cls):
        names = {f.name for f in dataclasses.fields(cls)}
    else:
        names = set(getattr(cls, "model_fields", fields))
    return cls(**{k: v for k, v in fields.items() if k in names})
