"""Gemini contents (google-genai, Google ADK): a role (``user`` / ``model``) and parts keyed by
their kind, in snake_case or camelCase JSON or as objects; and ADK events, read by their content."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec

from ..messages import CLOSED_CALL_TEXT, get_field, replaced
from .base import (
    NONE,
    Classified,
    Dialect,
    Reading,
    Window,
    build,
    framework_class,
    keyed,
    seq,
    short,
    text_of,
    tool_name,
)

__all__ = ["GEMINI", "is_event", "read_gemini"]

_CALL, _RESULT = ("function_call", "functionCall"), ("function_response", "functionResponse")
_KINDS = (
    *("text", "inline_data", "file_data", "executable_code", "code_execution_result"),
    *("tool_call", "tool_response"),  # the server's own tools, answered by the server
)
_MARKS = (
    *("thought", "thought_signature", "video_metadata", "media_resolution", "part_metadata"),
    *("audio_transcription", "media_processing", "speech_metadata"),
)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word.title() for word in rest)


PARTS = frozenset([*_CALL, *_RESULT, *_KINDS, *map(_camel, _KINDS)])
"""The kinds of a ``Part`` (google-genai's fields, and their JSON aliases)."""
MARKS = frozenset([*_MARKS, *map(_camel, _MARKS)])
"""Fields a part may carry beside its kind (a thought's flag, metadata)."""


def is_event(message: Any) -> bool:
    """An ADK ``Event`` (a dump, snake_case or camelCase): its turn is in ``content``."""
    return "author" in message and ("invocation_id" in message or "invocationId" in message)


def _content(message: Any) -> Any:
    """Where a message's role and parts are: an ADK event's ``content``, else itself."""
    return get_field(message, "content") if _event(message) else message


def _event(message: Any) -> bool:
    return is_event(message) if type(message) is dict else hasattr(message, "author")


def _parts(message: Any, kinds: tuple[str, str]) -> list[Any]:
    """The bodies of ``message``'s parts of ``kinds`` (a kind and its alias)."""
    found = []
    for part in seq(get_field(_content(message), "parts")):
        kind = keyed(part, PARTS, MARKS)
        if kind in kinds:
            found.append(get_field(part, kind))
    return found


def _json(value: Any) -> str:
    return "" if value is None else msgspec.json.encode(value, enc_hook=repr).decode()


def read_gemini(content: Any) -> Classified:
    """A content's reading: calls from the model, their answers from the user (the next
    content, as the API wants); any part it does not know, unrecognised."""
    role = get_field(content, "role")
    calls: list[str] = []
    results: list[str] = []
    parts = get_field(content, "parts")
    if role not in ("user", "model") or not isinstance(parts, (list, tuple, type(None))):
        return NONE
    for part in parts or ():
        kind = keyed(part, PARTS, MARKS)
        if kind in _CALL or kind in _RESULT:
            if role != ("model" if kind in _CALL else "user"):
                return NONE
            call_id = get_field(get_field(part, kind), "id")
            if not isinstance(call_id, str):  # paired by position, which the scan cannot check
                return NONE
            (calls if kind in _CALL else results).append(call_id)
        elif kind is None:
            return NONE
    return (
        GEMINI,
        ((), calls, True, False, False) if role == "model" else (results, (), False, False, False),
    )


class _Gemini(Dialect):
    name: str = "gemini"
    window: Window = "next"
    branched: bool = True

    def branch(self, message: Any) -> str | None:
        branch = get_field(message, "branch") if _event(message) else None
        return branch if isinstance(branch, str) else None

    def read(self, message: Any) -> Reading:
        content = _content(message)
        if content is None:  # an event without a turn (a state change): not sent
            return ((), (), False, True, False)
        return read_gemini(content)[1]

    def calls(self, message: Any) -> list[Any]:
        return _parts(message, _CALL)

    def answer(self, call_message: Any, call: Any, call_id: str) -> Any:
        response = {
            "id": call_id,
            "name": get_field(call, "name"),
            "response": {"error": CLOSED_CALL_TEXT},
        }
        if type(call) is not dict:
            cls = framework_class(call, "Part")
            return cls.model_validate({"function_response": response})
        camel = any("functionCall" in p for p in seq(get_field(_content(call_message), "parts")))
        return {"functionResponse" if camel else "function_response": response}

    def merge(self, follower: Any, answers: list[Any]) -> Any:
        content = _content(follower)
        if get_field(content, "role") != "user" or read_gemini(content)[0] is None:
            return None
        merged = replaced(content, parts=[*answers, *seq(get_field(content, "parts"))])
        return replaced(follower, content=merged) if _event(follower) else merged

    def carrier(self, call_message: Any, answers: list[Any]) -> Any:
        content: Any = {"role": "user", "parts": answers}
        if type(call_message) is not dict:
            called = _content(call_message)
            content = type(called).model_validate(content)
        if not _event(call_message):
            return content
        # An event of the user's, in the call's invocation, at the call's time: ADK's
        # services order events by time.
        ids = ",".join(get_field(r, "id") or "" for r in _parts({"parts": answers}, _RESULT))
        fields = {
            "author": "user",
            "id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"checkpointer:{ids}")),
            "content": content,
        }
        for name in ("timestamp", "branch"):  # in the call's branch: its agent sees it
            if get_field(call_message, name) is not None:
                fields[name] = get_field(call_message, name)
        if type(call_message) is not dict:
            fields["invocation_id"] = get_field(call_message, "invocation_id")
            return build(framework_class(call_message, "Event"), fields)
        invocation = "invocationId" if "invocationId" in call_message else "invocation_id"
        return {**fields, invocation: call_message.get(invocation)}

    def label(self, message: Any) -> str:
        if _event(message):
            return f"event {short(get_field(message, 'author'))}"
        return str(get_field(message, "role"))

    def text(self, message: Any) -> str:
        content = _content(message)
        said = [text_of(get_field(content, "parts"))]
        said.extend(
            f"[{short(get_field(r, 'id'))}] {_json(get_field(r, 'response'))}"
            for r in _parts(message, _RESULT)
        )
        return " ".join(s for s in said if s)

    def call_names(self, message: Any) -> list[str]:
        return [tool_name(get_field(c, "name")) for c in _parts(message, _CALL)]

    def user_text(self, message: Any) -> str | None:
        content = _content(message)
        if get_field(content, "role") != "user" or _parts(message, _RESULT):
            return None
        return text_of(get_field(content, "parts"))


GEMINI = _Gemini()
