"""Which dialect a message is, per message, without configuration or framework imports."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import msgspec

from ..messages import clipped
from .base import NONE, Classified, Dialect
from .chat import read_role
from .claude_code import ENTRIES, read_entry
from .gemini import GEMINI, is_event, read_gemini
from .langchain import LANGCHAIN, TYPES
from .pydantic_ai import PYDANTIC_AI
from .responses import ITEMS, RESPONSES

__all__ = ["classify", "describe_shape", "detect", "holds_results"]


def classify(message: Any) -> Classified:
    """``message``'s dialect (None: no dialect recognises it) and its ``Reading``.

    An object is read by its class's classifier, chosen once per class from
    its declared fields.
    """
    if type(message) is dict:  # inline: the hot path of the scan
        role = message.get("role")
        if role is not None:
            if "parts" in message and "content" not in message:
                return read_gemini(message)
            if _by_type(message.get("type")) is not LANGCHAIN:
                calls, content = message.get("tool_calls"), message.get("content")
                return read_role(role, calls, content, message)
            return LANGCHAIN, LANGCHAIN.read(message)  # a LangChain ChatMessage's dump
        kind = message.get("type")
        if kind is not None:
            if "parentUuid" in message or "uuid" in message or _entry_only(kind):
                return read_entry(message)  # LangChain has "system" too, without a uuid
            return _read(_by_type(kind), message)
        if is_event(message):
            return _event(message.get("content"))
        if message.get("kind") in ("request", "response") and isinstance(
            message.get("parts"), (list, tuple)
        ):
            return PYDANTIC_AI, PYDANTIC_AI.read(message)
        return NONE
    cls = type(message)
    classifier = _classifiers.get(cls)
    if classifier is None:
        classifier = _classifiers[cls] = _classifier(cls)
    return classifier(message)


def detect(message: Any) -> Dialect | None:
    """The dialect of ``message``, or None when no dialect recognises its shape."""
    return classify(message)[0]


def holds_results(message: Any) -> bool:
    """Whether ``message`` answers tool calls (so a transcript cannot start with it)."""
    return bool(classify(message)[1][0])


def describe_shape(message: Any) -> str:
    """A message no dialect recognises, in a few words (its type, or a dict's first keys)."""
    if isinstance(message, dict):
        role = message.get("role")
        if role is not None:
            return (
                f"role {clipped(role)}"
                if isinstance(role, str)
                else f"a role that is {describe_shape(role)}"
            )
        keys = [clipped(k) for k in list(message)[:4]]
        more = ", ..." if len(message) > 4 else ""
        return f"an object with keys {', '.join(keys)}{more}" if keys else "an empty object"
    names = {str: "a string", list: "a list", bool: "a boolean", type(None): "null"}
    if type(message) in names:
        return names[type(message)]
    if isinstance(message, (int, float)):
        return "a number"
    return f"a {type(message).__qualname__}"


_BY_TYPE = {**dict.fromkeys(ITEMS, RESPONSES), **dict.fromkeys(TYPES, LANGCHAIN)}


_ENTRIES_ONLY = ENTRIES - TYPES - ITEMS
"""Claude Code's entry types that no other dialect uses (a summary entry has no uuid)."""


def _event(content: Any) -> Classified:
    """An ADK event: its content's reading; without one (a state change), not sent."""
    if content is None:
        return GEMINI, ((), (), False, True, False)
    return read_gemini(content) if isinstance(content, dict) else NONE


def _by_type(kind: Any) -> Dialect | None:
    return _BY_TYPE.get(kind) if isinstance(kind, str) else None


def _entry_only(kind: Any) -> bool:
    return isinstance(kind, str) and kind in _ENTRIES_ONLY


def _read(dialect: Dialect | None, message: Any) -> Classified:
    return NONE if dialect is None else (dialect, dialect.read(message))


def _role_object(message: Any) -> Classified:
    calls = getattr(message, "tool_calls", None)
    return read_role(message.role, calls, getattr(message, "content", None), message)


def _typed_object(message: Any) -> Classified:
    kind = message.type
    if kind == "message" and getattr(message, "role", None) is not None:  # a Responses message
        return _role_object(message)
    return _read(_by_type(kind), message)


def _pydantic_ai_object(message: Any) -> Classified:
    if message.kind in ("request", "response") and isinstance(message.parts, (list, tuple)):
        return PYDANTIC_AI, PYDANTIC_AI.read(message)
    return NONE


def _any_object(message: Any) -> Classified:
    """An object of a class without declared fields: by the attributes it has."""
    if getattr(message, "role", None) is not None:
        return _role_object(message)
    if getattr(message, "type", None) is not None:
        return _typed_object(message)
    if getattr(message, "kind", None) is not None and hasattr(message, "parts"):
        return _pydantic_ai_object(message)
    return NONE


def _event_object(message: Any) -> Classified:
    content = message.content
    return (GEMINI, ((), (), False, True, False)) if content is None else read_gemini(content)


def _no_shape(message: Any) -> Classified:
    return NONE


def _declared(cls: type) -> frozenset[str] | None:
    """The field names of a Struct, dataclass or pydantic model class; None for other classes."""
    if issubclass(cls, msgspec.Struct):
        return frozenset(cls.__struct_fields__)
    if dataclasses.is_dataclass(cls):
        return frozenset(f.name for f in dataclasses.fields(cls))
    fields = getattr(cls, "model_fields", None)
    return frozenset(fields) if isinstance(fields, dict) else None


def _classifier(cls: type) -> Callable[[Any], Classified]:
    names = _declared(cls)
    if names is None:
        return _any_object
    if "type" in names:  # LangChain messages, Responses items (ChatMessage's dump: "chat")
        return _typed_object
    if "role" in names:
        return read_gemini if "parts" in names and "content" not in names else _role_object
    if "author" in names and "content" in names:  # an ADK Event
        return _event_object
    if "kind" in names and "parts" in names:
        return _pydantic_ai_object
    return _no_shape


_classifiers: dict[type, Callable[[Any], Classified]] = {}
