"""Agent transcripts: the message shapes ("dialects") the helpers understand, as data.

Each dialect is one small object: how to read a message of its shape (the
results it gives, the calls it makes, whether it is a turn), where its
calls must be answered (its *window*), how to build the answer a repair
adds, how to settle a running result, and how the CLI shows a message.
``detect(message)`` picks a message's dialect, per message, without
configuration and without importing any framework: a few dict lookups for a
dict, the class's fields for an object (cached per class).

=============  =====================================  =====================  ======
dialect        a message is                           calls -> results       window
=============  =====================================  =====================  ======
chat           ``{"role": ...}`` (system, developer,  ``tool_calls[].id`` -> run
               user, assistant, tool, function);      ``role: "tool"``
               also Responses ``type: "message"``     ``tool_call_id``
anthropic      a role message whose content holds     ``tool_use`` ``id`` -> next
               ``tool_use`` / ``tool_result`` blocks  ``tool_result``
                                                      ``tool_use_id``
responses      a Responses / Agents SDK item without  ``*_call`` ``call_id`` free
               a role (``function_call``, ...)        -> ``*_call_output``
pydantic-ai    ``kind: "request" | "response"`` with  ``tool-call`` part ->  turn
               ``parts`` (dataclasses or their JSON)  ``tool-return`` or
                                                      ``retry-prompt`` part
langchain      ``type: "human" | "ai" | "tool" ...``  ``ai`` ``tool_calls``  run
               (objects, ``model_dump()`` dicts, or   -> ``tool``
               ``{"type", "data"}`` dicts)            ``tool_call_id``
=============  =====================================  =====================  ======

Windows: *run*, a call is answered by the results that directly follow its
message (a run of tool messages); *next*, by the message right after its
message; *turn*, by the requests of results that follow its response, up to the
next other message (pydantic-ai merges consecutive requests into one before it sends:
after an approval it records ``[response(A, D), request(return A),
request(return D)]``); *free*, by a result anywhere after it.  Turns are the assistant
messages (``role: "assistant"``, a pydantic-ai response, a LangChain ``ai``).

A repair answers a call with ``CLOSED_CALL_TEXT`` in the call's own
dialect and kind: a dict for a dict, our Struct for our Struct, and for a
pydantic-ai or LangChain object an object of that framework's class, looked
up by name in the module of the call's class (or a parent package) in
``sys.modules`` (the framework is loaded, since its objects are in hand;
nothing is imported), else the dict of its JSON form.  The openai package's
objects (chat, Responses) are answered with dicts: the input shapes the SDK
and the API take.

A role message with ``parts`` and no ``content`` is Gemini's (``{"role": "user" |
"model", "parts": [...]}``): none of ours, its user messages included, so it is
not read as a chat user.

A message no dialect recognises is left alone by every helper: it answers
nothing, calls nothing, is no turn and does not end a window; the scan
reports it (``unrecognised``), and nothing refuses it.

Past 500 lines on purpose: the five dialects are one table, each entry a
small class, and a reader compares them side by side; detection, which
must know them all, closes the file.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeAlias

import msgspec

from .messages import (
    CLOSED_CALL_TEXT,
    ChatMessage,
    Message,
    TextBlock,
    ToolResultBlock,
    block_type,
    clipped,
    get_field,
    replaced,
)

__all__ = [
    "ANTHROPIC",
    "CHAT",
    "DIALECTS",
    "LANGCHAIN",
    "PYDANTIC_AI",
    "RESPONSES",
    "Dialect",
    "Reading",
    "Window",
    "classify",
    "describe_shape",
    "detect",
    "holds_results",
]

Window: TypeAlias = Literal["run", "next", "turn", "free"]

Reading: TypeAlias = tuple[Sequence[Any], Sequence[Any], bool, bool, bool]
"""What the scan reads of a message: (result ids, call ids, is a turn, keeps
the window of open calls, holds a running result)."""

_PLAIN: Reading = ((), (), False, False, False)
_TURN: Reading = ((), (), True, False, False)


def _seq(value: Any) -> Sequence[Any]:
    return value if isinstance(value, (list, tuple)) else ()


def _text(content: Any) -> str:
    """The text of a content: a string, or the strings and ``text`` of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        parts = (p if isinstance(p, str) else get_field(p, "text") for p in content)
        return " ".join(p for p in parts if isinstance(p, str))
    return ""


def _kin(obj: Any, name: str) -> Any:
    """The class ``name`` of ``obj``'s framework, if loaded: its module or a parent package."""
    module = type(obj).__module__
    while module:
        found = getattr(sys.modules.get(module), name, None)
        if isinstance(found, type):
            return found
        module = module.rpartition(".")[0]
    return None


def _build(cls: Any, fields: dict[str, Any]) -> Any:
    """``cls(**fields)``, but the fields it does not have (a dataclass, a pydantic model)."""
    if dataclasses.is_dataclass(cls):
        names = {f.name for f in dataclasses.fields(cls)}
    else:
        names = set(getattr(cls, "model_fields", fields))
    return cls(**{k: v for k, v in fields.items() if k in names})


class Dialect:
    """One message shape: how the helpers read it, answer its calls, settle and show it.

    Attributes:
        name: as the docs and ``HistoryProblem`` texts say it.
        window: where a call's result must come (see the module docstring).
        defers: the framework leaves a call open on purpose (a deferred tool,
            one awaiting approval) and persists it so: such a call, still open
            at the end of a paused run, is *pending*, not unclosed
            (``history.py`` says when).
    """

    name: str = ""
    window: Window = "run"
    defers: bool = False

    def __repr__(self) -> str:
        return f"<dialect {self.name}>"

    def read(self, message: Any) -> Reading:
        """What the scan needs of ``message``: see ``Reading``."""
        raise NotImplementedError

    # -- repairs ---------------------------------------------------------------

    def answer(self, call_message: Any, call_id: str) -> Any:
        """The result (a message, or a part for a *next* window) that closes ``call_id``."""
        raise NotImplementedError

    def answers(self, call_message: Any, call_ids: list[str]) -> list[Any]:
        """``answer`` for each of ``call_ids``, all calls of ``call_message``."""
        return [self.answer(call_message, call_id) for call_id in call_ids]

    def merge(self, follower: Any, answers: list[Any]) -> Any:
        """*next* windows: ``follower`` with ``answers`` added, or None if it cannot take them."""
        return None

    def carrier(self, call_message: Any, answers: list[Any]) -> Any:
        """*next* windows: a new message holding ``answers``."""
        raise NotImplementedError

    def settle(self, message: Any, reason: str) -> tuple[Any, int]:
        """``message`` with its running results settled as errors, and how many."""
        return message, 0

    # -- display (the CLI) -----------------------------------------------------

    def label(self, message: Any) -> str:
        """Who speaks, for one line of ``show``: a role, an item type, a result's call id."""
        return self.name

    def text(self, message: Any) -> str:
        """What the message says."""
        return ""

    def call_names(self, message: Any) -> list[str]:
        """The names of the tools it calls (``?`` for a call without one)."""
        return []

    def user_text(self, message: Any) -> str | None:
        """The text of a user's message (the ``ls`` title), None for any other message."""
        return None


def _call_id(call: Any) -> Any:
    return call.get("id") if type(call) is dict else get_field(call, "id")


def _by_id(calls: Sequence[Any], field: str) -> dict[Any, Any]:
    """The calls by their id, the first of each id (as a search in order finds it)."""
    found: dict[Any, Any] = {}
    for call in calls:
        key = call.get(field) if type(call) is dict else get_field(call, field)
        if isinstance(key, str):
            found.setdefault(key, call)
    return found


def _name(value: Any) -> str:
    return _short(value) if isinstance(value, str) and value else "?"


def _short(value: Any, width: int = 40) -> str:
    """An id or a name as a label shows it: cut to ``width`` with ``...``, as texts are."""
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= width else text[: width - 3] + "..."


# -- chat-completions ------------------------------------------------------------


class _Chat(Dialect):
    name: str = "chat"
    window: Window = "run"

    def read(self, message: Any) -> Reading:
        role, calls = get_field(message, "role"), get_field(message, "tool_calls")
        return _role_reading(role, calls, get_field(message, "content"), message)[1]

    def answer(self, call_message: Any, call_id: str) -> Any:
        if isinstance(call_message, ChatMessage):
            return ChatMessage(role="tool", tool_call_id=call_id, content=CLOSED_CALL_TEXT)
        return {"role": "tool", "tool_call_id": call_id, "content": CLOSED_CALL_TEXT}

    def settle(self, message: Any, reason: str) -> tuple[Any, int]:
        if get_field(message, "status") != "running":
            return message, 0
        return replaced(message, status="error", content=reason), 1

    def label(self, message: Any) -> str:
        role = str(get_field(message, "role"))
        call_id = get_field(message, "tool_call_id")
        return f"tool[{_short(call_id)}]" if role == "tool" and call_id is not None else role

    def text(self, message: Any) -> str:
        return _text(get_field(message, "content"))

    def call_names(self, message: Any) -> list[str]:
        names = []
        for call in _seq(get_field(message, "tool_calls")):
            function = get_field(call, "function")
            name = get_field(function, "name") if function is not None else None
            names.append(_name(name or get_field(call, "name")))
        return names

    def user_text(self, message: Any) -> str | None:
        return self.text(message) if get_field(message, "role") == "user" else None


# -- Anthropic-style messages --------------------------------------------------------


class _Anthropic(_Chat):
    name: str = "anthropic"
    window: Window = "next"

    # read: _Chat's, the one reading of a role message (``_role_reading``)

    def answer(self, call_message: Any, call_id: str) -> Any:
        if isinstance(call_message, Message):
            return ToolResultBlock(tool_use_id=call_id, content=CLOSED_CALL_TEXT, is_error=True)
        return {
            "type": "tool_result",
            "tool_use_id": call_id,
            "content": CLOSED_CALL_TEXT,
            "is_error": True,
        }

    def merge(self, follower: Any, answers: list[Any]) -> Any:
        if get_field(follower, "role") != "user":
            return None
        content = get_field(follower, "content")
        struct = isinstance(follower, Message)
        if isinstance(content, str):
            text: Any = TextBlock(content) if struct else {"type": "text", "text": content}
            existing: list[Any] = [text] if content else []
        else:
            existing = list(content or ())
        merged = answers + existing
        as_tuple = isinstance(content, tuple) or struct
        return replaced(follower, content=tuple(merged) if as_tuple else merged)

    def carrier(self, call_message: Any, answers: list[Any]) -> Any:
        if isinstance(call_message, Message):
            return Message(role="user", content=tuple(answers))
        return {"role": "user", "content": answers}

    def settle(self, message: Any, reason: str) -> tuple[Any, int]:
        content = get_field(message, "content")
        blocks, count = [], 0
        for block in _seq(content):
            if block_type(block) == "tool_result" and get_field(block, "status") == "running":
                block = replaced(block, status="error", is_error=True, content=reason)
                count += 1
            blocks.append(block)
        if not count:
            return message, 0
        return replaced(message, content=type(content)(blocks)), count

    def label(self, message: Any) -> str:
        return str(get_field(message, "role"))

    def text(self, message: Any) -> str:
        content = get_field(message, "content")
        said = [_text(content)]
        said.extend(
            f"[{_short(get_field(block, 'tool_use_id'))}] {_text(get_field(block, 'content'))}"
            for block in _seq(content)
            if block_type(block) == "tool_result"
        )
        return " ".join(s for s in said if s)

    def call_names(self, message: Any) -> list[str]:
        blocks = _seq(get_field(message, "content"))
        return [_name(get_field(b, "name")) for b in blocks if block_type(b) == "tool_use"]


# -- OpenAI Responses / Agents SDK items -------------------------------------------------

_CALL_OUTPUT = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "computer_call": "computer_call_output",
    "local_shell_call": "local_shell_call_output",
    "shell_call": "shell_call_output",
    "apply_patch_call": "apply_patch_call_output",
}
"""Responses items that call a tool the client runs, and the type of the item that answers."""

_OUTPUTS = frozenset(_CALL_OUTPUT.values())

_RESPONSES_ITEMS = frozenset(
    {
        *_CALL_OUTPUT,
        *_OUTPUTS,
        "reasoning",
        "item_reference",
        "file_search_call",
        "web_search_call",
        "image_generation_call",
        "code_interpreter_call",
        "tool_search_call",
        "tool_search_output",
        "mcp_list_tools",
        "mcp_approval_request",
        "mcp_approval_response",
        "mcp_call",
        "compaction",
        "compaction_trigger",
        "additional_tools",
        "configuration_update",
        "program",
        "program_output",
    }
)
"""Every Responses input item type without a role (hosted tools are answered by the server)."""


def _output_fields(output_type: str, text: str) -> dict[str, Any]:
    """What an output item of ``output_type`` says for ``text``, as the SDK builds its errors."""
    if output_type == "shell_call_output":
        return {
            "output": [{"stdout": "", "stderr": text, "outcome": {"type": "exit", "exit_code": 1}}]
        }
    if output_type == "apply_patch_call_output":
        return {"status": "failed", "output": text}
    if output_type == "computer_call_output":  # no screenshot to give: an empty one
        return {"status": "incomplete", "output": {"type": "computer_screenshot"}}
    return {"output": text}


class _Responses(Dialect):
    name: str = "responses"
    window: Window = "free"
    defers: bool = True

    def read(self, message: Any) -> Reading:
        kind = get_field(message, "type")
        if kind in _CALL_OUTPUT:
            return ((), (get_field(message, "call_id"),), False, False, False)
        if kind in _OUTPUTS:
            running = get_field(message, "status") in ("in_progress", "running")
            return ((get_field(message, "call_id"),), (), False, False, running)
        return _PLAIN

    def answer(self, call_message: Any, call_id: str) -> Any:
        output_type = _CALL_OUTPUT[get_field(call_message, "type")]
        return {
            "type": output_type,
            "call_id": call_id,
            **_output_fields(output_type, CLOSED_CALL_TEXT),
        }

    def settle(self, message: Any, reason: str) -> tuple[Any, int]:
        if get_field(message, "status") not in ("in_progress", "running"):
            return message, 0
        fields = {"status": "incomplete", **_output_fields(get_field(message, "type"), reason)}
        return replaced(message, **fields), 1

    def label(self, message: Any) -> str:
        call_id = get_field(message, "call_id")
        kind = str(get_field(message, "type"))
        return f"{kind}[{_short(call_id)}]" if call_id is not None else kind

    def text(self, message: Any) -> str:
        if get_field(message, "type") in _CALL_OUTPUT:
            arguments = get_field(message, "arguments") or get_field(message, "input")
            return arguments if isinstance(arguments, str) else ""
        output = get_field(message, "output")
        if isinstance(output, dict):
            return _text(output.get("text"))
        return _text(output) or _text(get_field(message, "summary"))

    def call_names(self, message: Any) -> list[str]:
        kind = get_field(message, "type")
        if kind not in _CALL_OUTPUT:
            return []
        return [_name(get_field(message, "name") or kind)]


# -- pydantic-ai messages ----------------------------------------------------------------


def _answers(part: Any) -> bool:
    """Whether a part of a pydantic-ai request answers a call: a tool return, a tool-bound retry."""
    kind = get_field(part, "part_kind")
    return kind == "tool-return" or (
        kind == "retry-prompt" and get_field(part, "tool_name") is not None
    )


def _results_of(parts: Sequence[Any]) -> list[Any]:
    return [p for p in parts if _answers(p)]


class _PydanticAI(Dialect):
    name: str = "pydantic-ai"
    window: Window = "turn"
    defers: bool = True

    def read(self, message: Any) -> Reading:
        parts = _seq(get_field(message, "parts"))
        if get_field(message, "kind") == "response":
            ids = [
                get_field(p, "tool_call_id")
                for p in parts
                if get_field(p, "part_kind") == "tool-call"
            ]
            return ((), ids, True, False, False)
        # A request of results only keeps the window: consecutive requests are one
        # turn for pydantic-ai; a prompt in it moves the conversation on.
        results = _results_of(parts)
        ids = [get_field(p, "tool_call_id") for p in results]
        return (ids, (), False, len(results) == len(parts), False) if results else _PLAIN

    def answer(self, call_message: Any, call_id: str) -> Any:
        return self.answers(call_message, [call_id])[0]

    def answers(self, call_message: Any, call_ids: list[str]) -> list[Any]:
        calls = _by_id(_seq(get_field(call_message, "parts")), "tool_call_id")
        return [self._answer(call_message, calls.get(c), c) for c in call_ids]

    def _answer(self, call_message: Any, call: Any, call_id: str) -> Any:
        fields: dict[str, Any] = {
            "tool_name": _name(get_field(call, "tool_name")),
            "content": CLOSED_CALL_TEXT,
            "tool_call_id": call_id,
            "outcome": "interrupted",
        }
        if get_field(call, "tool_kind") is not None:
            fields["tool_kind"] = get_field(call, "tool_kind")
        timestamp = get_field(call_message, "timestamp")
        if timestamp is not None:  # as pydantic-ai's own repair: the response's, deterministic
            fields["timestamp"] = timestamp
        cls = None if type(call) is dict else _kin(call_message, "ToolReturnPart")
        return _build(cls, fields) if cls is not None else {"part_kind": "tool-return", **fields}

    def merge(self, follower: Any, answers: list[Any]) -> Any:
        if get_field(follower, "kind") != "request":
            return None
        parts = list(_seq(get_field(follower, "parts")))
        at = 0  # after its own results, where pydantic-ai's repair puts them
        for i, part in enumerate(parts):
            if _answers(part):
                at = i + 1
        return replaced(follower, parts=[*parts[:at], *answers, *parts[at:]])

    def carrier(self, call_message: Any, answers: list[Any]) -> Any:
        cls = None if type(call_message) is dict else _kin(call_message, "ModelRequest")
        return (
            _build(cls, {"parts": answers})
            if cls is not None
            else {"kind": "request", "parts": answers}
        )

    def label(self, message: Any) -> str:
        return str(get_field(message, "kind"))

    def text(self, message: Any) -> str:
        said = []
        for part in _seq(get_field(message, "parts")):
            kind = get_field(part, "part_kind")
            if kind in ("tool-return", "retry-prompt"):
                content = get_field(part, "content")
                body = _text(content) or (
                    "" if content is None else msgspec.json.encode(content, enc_hook=repr).decode()
                )
                said.append(f"[{_short(get_field(part, 'tool_call_id'))}] {body}")
            elif kind in ("user-prompt", "text", "system-prompt", "thinking"):
                said.append(_text(get_field(part, "content")))
        return " ".join(s for s in said if s)

    def call_names(self, message: Any) -> list[str]:
        parts = _seq(get_field(message, "parts"))
        return [
            _name(get_field(p, "tool_name"))
            for p in parts
            if get_field(p, "part_kind") == "tool-call"
        ]

    def user_text(self, message: Any) -> str | None:
        if get_field(message, "kind") != "request":
            return None
        prompts = [
            p
            for p in _seq(get_field(message, "parts"))
            if get_field(p, "part_kind") == "user-prompt"
        ]
        return " ".join(_text(get_field(p, "content")) for p in prompts) if prompts else None


# -- LangChain / LangGraph messages --------------------------------------------------------

_LANGCHAIN_TYPES = frozenset(
    {
        "human",
        "ai",
        "system",
        "tool",
        "function",
        "chat",
        "remove",
        "HumanMessageChunk",
        "AIMessageChunk",
        "SystemMessageChunk",
        "ToolMessageChunk",
        "FunctionMessageChunk",
        "ChatMessageChunk",
    }
)
_LANGCHAIN_RESULTS = frozenset({"tool", "ToolMessageChunk"})
_LANGCHAIN_TURNS = frozenset({"ai", "AIMessageChunk"})


def _fields(message: Any) -> Any:
    """A LangChain message's fields: the message, or its ``data`` (``messages_to_dict``)."""
    if type(message) is dict and "content" not in message:
        data = message.get("data")
        if isinstance(data, dict):
            return data
    return message


class _LangChain(Dialect):
    name: str = "langchain"
    window: Window = "run"

    def read(self, message: Any) -> Reading:
        kind = get_field(message, "type")
        fields = _fields(message)
        if kind in _LANGCHAIN_RESULTS:
            running = get_field(fields, "status") == "running"
            return ((get_field(fields, "tool_call_id"),), (), False, True, running)
        if kind not in _LANGCHAIN_TURNS:
            return _PLAIN
        calls = _seq(get_field(fields, "tool_calls"))
        return ((), [_call_id(c) for c in calls], True, False, False) if calls else _TURN

    def answer(self, call_message: Any, call_id: str) -> Any:
        return self.answers(call_message, [call_id])[0]

    def answers(self, call_message: Any, call_ids: list[str]) -> list[Any]:
        calls = _by_id(_seq(get_field(_fields(call_message), "tool_calls")), "id")
        return [self._answer(call_message, calls.get(c), c) for c in call_ids]

    def _answer(self, call_message: Any, call: Any, call_id: str) -> Any:
        fields = _fields(call_message)
        result: dict[str, Any] = {
            "type": "tool",
            "content": CLOSED_CALL_TEXT,
            "tool_call_id": call_id,
            "status": "error",
        }
        if isinstance(get_field(call, "name"), str):
            result["name"] = get_field(call, "name")
        if type(call_message) is dict:
            return {"type": "tool", "data": result} if fields is not call_message else result
        cls = _kin(call_message, "ToolMessage")
        return _build(cls, result) if cls is not None else result

    def settle(self, message: Any, reason: str) -> tuple[Any, int]:
        fields = _fields(message)
        if get_field(fields, "status") != "running":
            return message, 0
        settled = replaced(fields, status="error", content=reason)
        return (settled if fields is message else {**message, "data": settled}), 1

    def label(self, message: Any) -> str:
        kind = str(get_field(message, "type"))
        call_id = get_field(_fields(message), "tool_call_id")
        return f"{kind}[{_short(call_id)}]" if kind in _LANGCHAIN_RESULTS else kind

    def text(self, message: Any) -> str:
        return _text(get_field(_fields(message), "content"))

    def call_names(self, message: Any) -> list[str]:
        return [
            _name(get_field(c, "name")) for c in _seq(get_field(_fields(message), "tool_calls"))
        ]

    def user_text(self, message: Any) -> str | None:
        return self.text(message) if get_field(message, "type") == "human" else None


CHAT = _Chat()
ANTHROPIC = _Anthropic()
RESPONSES = _Responses()
PYDANTIC_AI = _PydanticAI()
LANGCHAIN = _LangChain()
DIALECTS: tuple[Dialect, ...] = (CHAT, ANTHROPIC, RESPONSES, PYDANTIC_AI, LANGCHAIN)


# -- detection ------------------------------------------------------------------------------

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


Classified: TypeAlias = tuple["Dialect | None", Reading]
_NONE: Classified = (None, _PLAIN)
_CHAT_PLAIN: Classified = (CHAT, _PLAIN)
_CHAT_TURN: Classified = (CHAT, _TURN)


def _role_reading(role: Any, calls: Any, content: Any, message: Any) -> Classified:
    """A role message's dialect (chat, or Anthropic when its content holds tool blocks) and
    reading, in one pass: the hot path of the scan (dicts read inline, shared results)."""
    if role == "assistant":
        if calls:
            if type(calls) is list or isinstance(calls, (list, tuple)):
                ids = [c.get("id") if type(c) is dict else get_field(c, "id") for c in calls]
                return CHAT, ((), ids, True, False, False)
            return _CHAT_TURN
        if content is None or type(content) is str:
            return _CHAT_TURN
    elif role == "tool":
        if type(message) is dict:
            call_id, status = message.get("tool_call_id"), message.get("status")
        else:
            call_id = getattr(message, "tool_call_id", None)
            status = getattr(message, "status", None)
        return CHAT, ((call_id,), (), False, True, status == "running")
    elif not isinstance(role, str) or role not in _ROLES:
        return _NONE
    elif calls or content is None or type(content) is str:
        return _CHAT_PLAIN
    assistant = role == "assistant"
    if not content or not isinstance(content, (list, tuple)):
        return _CHAT_TURN if assistant else _CHAT_PLAIN
    ids = []
    blocks = False  # any tool block: Anthropic
    running = False
    for block in content:
        fields = block if type(block) is dict else None
        kind = block_type(block) if fields is None else fields.get("type")
        if kind == "tool_use":
            blocks = True
            if assistant:
                ids.append(get_field(block, "id") if fields is None else fields.get("id"))
        elif kind == "tool_result":
            blocks = True
            if not assistant:
                if fields is None:
                    ids.append(get_field(block, "tool_use_id"))
                    running = running or get_field(block, "status") == "running"
                else:
                    ids.append(fields.get("tool_use_id"))
                    running = running or fields.get("status") == "running"
    if not blocks:
        return _CHAT_TURN if assistant else _CHAT_PLAIN
    if assistant:
        return ANTHROPIC, ((), ids, True, False, False)
    return ANTHROPIC, (ids, (), False, False, running)


def _langchain_type(kind: Any) -> bool:
    return isinstance(kind, str) and kind in _LANGCHAIN_TYPES


def _by_type(kind: Any) -> Dialect | None:
    if not isinstance(kind, str):
        return None
    if kind in _LANGCHAIN_TYPES:
        return LANGCHAIN
    if kind in _RESPONSES_ITEMS:
        return RESPONSES
    return None


def _read(dialect: Dialect | None, message: Any) -> Classified:
    return _NONE if dialect is None else (dialect, dialect.read(message))


def _role_object(message: Any) -> Classified:
    calls = getattr(message, "tool_calls", None)
    return _role_reading(message.role, calls, getattr(message, "content", None), message)


def _typed_object(message: Any) -> Classified:
    kind = message.type
    if kind == "message" and getattr(message, "role", None) is not None:  # a Responses message
        return _role_object(message)
    return _read(_by_type(kind), message)


def _pydantic_ai_object(message: Any) -> Classified:
    if message.kind in ("request", "response") and isinstance(message.parts, (list, tuple)):
        return PYDANTIC_AI, PYDANTIC_AI.read(message)
    return _NONE


def _any_object(message: Any) -> Classified:
    """An object of a class without declared fields: by the attributes it has."""
    if getattr(message, "role", None) is not None:
        return _role_object(message)
    if getattr(message, "type", None) is not None:
        return _typed_object(message)
    if getattr(message, "kind", None) is not None and hasattr(message, "parts"):
        return _pydantic_ai_object(message)
    return _NONE


def _no_shape(message: Any) -> Classified:
    return _NONE


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
        return _no_shape if "parts" in names and "content" not in names else _role_object
    if "kind" in names and "parts" in names:
        return _pydantic_ai_object
    return _no_shape


_classifiers: dict[type, Callable[[Any], Classified]] = {}


def classify(message: Any) -> Classified:
    """``message``'s dialect and what the scan reads of it (``Reading``), in one call.

    The dialect is None when no dialect recognises the shape (the reading
    is then empty).  A dict costs a few lookups; an object, its class's
    classifier (chosen once per class from its declared fields) and reads.
    """
    if type(message) is dict:  # inline: the hot path of the scan
        role = message.get("role")
        if role is not None:
            if "parts" in message and "content" not in message:  # Gemini's (a user's too)
                return _NONE
            if "type" not in message or not _langchain_type(message["type"]):
                calls, content = message.get("tool_calls"), message.get("content")
                return _role_reading(role, calls, content, message)
            return LANGCHAIN, LANGCHAIN.read(message)  # a LangChain ChatMessage's dump
        kind = message.get("type")
        if kind is not None:
            return _read(_by_type(kind), message)
        if message.get("kind") in ("request", "response") and isinstance(
            message.get("parts"), (list, tuple)
        ):
            return PYDANTIC_AI, PYDANTIC_AI.read(message)
        return _NONE
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
