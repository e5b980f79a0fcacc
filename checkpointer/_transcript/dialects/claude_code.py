"""Claude Code transcript entries (the CLI's JSONL, the Claude Agent SDK's ``SessionStore``):
``{"type", "uuid", "parentUuid", "message"}``, where ``message`` is Anthropic's shape."""

from __future__ import annotations

import uuid
from typing import Any

from ..messages import CLOSED_CALL_TEXT, block_type, get_field
from .base import NONE, Classified, Dialect, Reading, Window, seq
from .chat import ANTHROPIC, ANTHROPIC_BLOCKS, tool_blocks

__all__ = ["CLAUDE_CODE", "ENTRIES", "read_entry"]

ENTRIES = frozenset(
    {
        *("user", "assistant", "system", "attachment", "progress", "summary", "mode"),
        *("file-history-snapshot", "file-history-delta", "last-prompt", "continued-in"),
        *("resume-head-vouch", "content-replacement", "data-flow-records", "derived-from"),
        *("data-flow-incomplete", "api-request-shape", "api-request-blob", "api-request"),
        *("api-request-resumed", "fork-context-ref", "frame-link", "custom-title", "tag"),
        *("ended-by-model", "ai-title", "relocated", "agent-name", "agent-color", "pr-link"),
        *("agent-setting", "artifact-comment-monitor", "artifact-autoreact-ledger", "dev-mods"),
        *("bridge-session", "history-suppression", "attribution-snapshot", "permission-mode"),
        *("isolation-latch", "session-owner", "memory-mode", "atis-latch", "tools-used"),
        *("worktree-state", "cost-state", "queue-operation", "observer-ref"),
    }
)
"""Every entry type the bundled CLI (claude-agent-sdk 0.2.189) reads back from a transcript;
only ``user`` and ``assistant`` entries are sent to the model."""


_COPIED = ("isSidechain", "userType", "cwd", "sessionId", "version", "gitBranch", "agentId")
_ASIDE: Reading = ((), (), False, True, False)  # not sent to the model: keeps the window


def read_entry(entry: Any) -> Classified:
    """An entry's reading.  The CLI writes each block of a response as an entry of its own,
    all with the response's ``message.id``, and each result as an entry: the id is the turn
    (one turn, one window, however many entries), and a result entry keeps the window."""
    kind = entry.get("type")
    if kind not in ("user", "assistant"):
        return (CLAUDE_CODE, _ASIDE) if kind in ENTRIES else NONE
    message = entry.get("message")
    content = message.get("content") if type(message) is dict else None
    if type(content) is str:
        return (CLAUDE_CODE, ((), (), True, False, False)) if kind == "assistant" else _PROMPT
    if not isinstance(content, list):
        return NONE
    found = tool_blocks(kind, content, ANTHROPIC_BLOCKS)
    if found is None:
        return NONE
    ids = found[0]
    if kind == "assistant":
        turn = message.get("id")
        return CLAUDE_CODE, (
            (),
            ids,
            turn if isinstance(turn, str) and turn else True,
            False,
            False,
        )
    # The CLI sends user entries in a row as one message: one holding results keeps the window.
    return CLAUDE_CODE, (ids, (), False, bool(ids), False)


class _ClaudeCode(Dialect):
    name: str = "claude-code"
    window: Window = "run"

    def read(self, message: Any) -> Reading:
        return read_entry(message)[1]

    def calls(self, message: Any) -> list[Any]:
        content = seq(get_field(get_field(message, "message"), "content"))
        return [b for b in content if block_type(b) == "tool_use"]

    def answer(self, call_message: Any, call: Any, call_id: str) -> Any:
        """A result entry as the CLI writes one: a user entry whose parent is the call's."""
        result = {
            "type": "tool_result",
            "tool_use_id": call_id,
            "content": CLOSED_CALL_TEXT,
            "is_error": True,
        }
        entry = {k: call_message[k] for k in _COPIED if k in call_message}
        return {
            "type": "user",
            "uuid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"checkpointer:{call_id}")),
            "parentUuid": call_message.get("uuid"),
            **entry,
            "timestamp": call_message.get("timestamp"),
            "message": {"role": "user", "content": [result]},
        }

    def label(self, message: Any) -> str:
        return str(get_field(message, "type"))

    def text(self, message: Any) -> str:
        inner = get_field(message, "message")
        if isinstance(inner, dict):
            return ANTHROPIC.text(inner)
        said = get_field(message, "content") or get_field(message, "summary")
        return said if isinstance(said, str) else ""

    def call_names(self, message: Any) -> list[str]:
        inner = get_field(message, "message")
        return ANTHROPIC.call_names(inner) if isinstance(inner, dict) else []

    def user_text(self, message: Any) -> str | None:
        if get_field(message, "type") != "user" or get_field(message, "isMeta"):
            return None
        inner = get_field(message, "message")
        content = get_field(inner, "content")
        if any(block_type(b) == "tool_result" for b in seq(content)):
            return None
        return ANTHROPIC.text(inner) if isinstance(inner, dict) else None


CLAUDE_CODE = _ClaudeCode()
_PROMPT: Classified = (CLAUDE_CODE, ((), (), False, False, False))
