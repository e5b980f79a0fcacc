"""OpenAI Responses / Agents SDK items: no role, a ``type``; a call is answered by id."""

from __future__ import annotations

from typing import Any

from ..messages import CLOSED_CALL_TEXT, get_field, replaced
from .base import PLAIN, Dialect, Reading, Window, short, text_of, tool_name

__all__ = ["ITEMS", "RESPONSES"]

_CLIENT_CALLS = ("function", "custom_tool", "computer", "local_shell", "shell", "apply_patch")
_CALL_OUTPUT = {f"{name}_call": f"{name}_call_output" for name in _CLIENT_CALLS}
"""Responses items that call a tool the client runs, and the type of the item that answers."""

_OUTPUTS = frozenset(_CALL_OUTPUT.values())

ITEMS = frozenset(
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

_RUNNING = ("in_progress", "running")


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
            running = get_field(message, "status") in _RUNNING
            return ((get_field(message, "call_id"),), (), False, False, running)
        return PLAIN

    def answer(self, call_message: Any, call: Any, call_id: str) -> Any:
        output_type = _CALL_OUTPUT[get_field(call_message, "type")]
        return {
            "type": output_type,
            "call_id": call_id,
            **_output_fields(output_type, CLOSED_CALL_TEXT),
        }

    def settle(self, message: Any, reason: str) -> tuple[Any, int]:
        if get_field(message, "status") not in _RUNNING:
            return message, 0
        fields = {"status": "incomplete", **_output_fields(get_field(message, "type"), reason)}
        return replaced(message, **fields), 1

    def label(self, message: Any) -> str:
        call_id = get_field(message, "call_id")
        kind = str(get_field(message, "type"))
        return f"{kind}[{short(call_id)}]" if call_id is not None else kind

    def text(self, message: Any) -> str:
        if get_field(message, "type") in _CALL_OUTPUT:
            arguments = get_field(message, "arguments") or get_field(message, "input")
            return arguments if isinstance(arguments, str) else ""
        output = get_field(message, "output")
        if isinstance(output, dict):
            return text_of(output.get("text"))
        return text_of(output) or text_of(get_field(message, "summary"))

    def call_names(self, message: Any) -> list[str]:
        kind = get_field(message, "type")
        if kind not in _CALL_OUTPUT:
            return []
        return [tool_name(get_field(message, "name") or kind)]


RESPONSES = _Responses()
