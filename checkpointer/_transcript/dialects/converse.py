"""Bedrock Converse (and Strands) messages: a role and blocks keyed by their kind."""

from __future__ import annotations

from typing import Any

from ..messages import CLOSED_CALL_TEXT, get_field, replaced
from .base import NONE, Classified, Dialect, Window, keyed, seq, short, text_of, tool_name

__all__ = ["CONVERSE", "read_converse"]

BLOCKS = frozenset(
    {
        "text",
        "image",
        "document",
        "video",
        "audio",
        "toolUse",
        "toolResult",
        "guardContent",
        "cachePoint",
        "reasoningContent",
        "citationsContent",
        "searchResult",
        "toolAddition",
        "toolRemoval",
    }
)
"""The members of Converse's ``ContentBlock`` (botocore's bedrock-runtime model)."""


def _blocks(message: Any, kind: str) -> list[Any]:
    """The bodies of ``message``'s blocks of ``kind`` (``toolUse``: the calls)."""
    blocks = seq(get_field(message, "content"))
    return [get_field(b, kind) for b in blocks if keyed(b, BLOCKS) == kind]


class _Converse(Dialect):
    """Calls are ``toolUse`` blocks; their results ``toolResult`` blocks in the next user
    message (the Converse API refuses a history otherwise)."""

    name: str = "converse"
    window: Window = "next"
    call_id: str = "toolUseId"

    def read(self, message: Any) -> Any:
        return read_converse(get_field(message, "role"), get_field(message, "content"))[1]

    def calls(self, message: Any) -> list[Any]:
        return _blocks(message, "toolUse")

    def answer(self, call_message: Any, call: Any, call_id: str) -> Any:
        content = [{"text": CLOSED_CALL_TEXT}]
        return {"toolResult": {"toolUseId": call_id, "status": "error", "content": content}}

    def merge(self, follower: Any, answers: list[Any]) -> Any:
        if get_field(follower, "role") != "user" or detect_converse(follower) is None:
            return None
        return replaced(follower, content=[*answers, *seq(get_field(follower, "content"))])

    def carrier(self, call_message: Any, answers: list[Any]) -> Any:
        return {"role": "user", "content": answers}

    def label(self, message: Any) -> str:
        return str(get_field(message, "role"))

    def text(self, message: Any) -> str:
        said = [text_of(get_field(message, "content"))]
        said.extend(
            f"[{short(get_field(r, 'toolUseId'))}] {text_of(get_field(r, 'content'))}"
            for r in _blocks(message, "toolResult")
        )
        return " ".join(s for s in said if s)

    def call_names(self, message: Any) -> list[str]:
        return [tool_name(get_field(c, "name")) for c in _blocks(message, "toolUse")]

    def user_text(self, message: Any) -> str | None:
        if get_field(message, "role") != "user" or _blocks(message, "toolResult"):
            return None
        return text_of(get_field(message, "content"))


CONVERSE = _Converse()


def detect_converse(message: Any) -> Dialect | None:
    content = get_field(message, "content")
    if not isinstance(content, (list, tuple)):
        return None
    return read_converse(get_field(message, "role"), content)[0]


def read_converse(role: Any, content: Any) -> Classified:
    """A role message whose content holds a block without a ``type``: Converse's if every
    block is a Converse block in its place (a call from the assistant, a result from the
    user), else unrecognised."""
    calls: list[str] = []
    results: list[str] = []
    for block in seq(content):
        kind = keyed(block, BLOCKS)
        if kind == "toolUse" or kind == "toolResult":
            if role != ("assistant" if kind == "toolUse" else "user"):
                return NONE
            call_id = get_field(get_field(block, kind), "toolUseId")
            if not isinstance(call_id, str):
                return NONE  # an id-less call cannot be checked: not passed as fine
            (calls if kind == "toolUse" else results).append(call_id)
        elif kind is None:
            return NONE
    if role == "assistant":
        return CONVERSE, ((), calls, True, False, False)
    return (CONVERSE, (results, (), False, False, False)) if role == "user" else NONE
