"""Agent messages: the shapes the library writes and reads, and checks of a history.

``ChatMessage`` and ``Message`` (with its blocks) are frozen msgspec Structs
a program may keep its transcript in (each encoded once in its life);
``validate_history`` and ``count_turns`` read the messages of every dialect
the library knows (chat, Anthropic, OpenAI Responses, pydantic-ai,
LangChain); ``close_dangling_tool_calls`` and ``settle_running`` repair a
copy.  A writer with ``transcript=Transcript()`` applies them itself.
"""

from ._transcript.history import count_turns, validate_history
from ._transcript.messages import (
    CLOSED_CALL_TEXT,
    INTERRUPTED_TEXT,
    ChatMessage,
    ContentBlock,
    HistoryProblem,
    Message,
    TextBlock,
    ToolCall,
    ToolFunction,
    ToolResultBlock,
    ToolUseBlock,
)
from ._transcript.repair import close_dangling_tool_calls, settle_running

__all__ = [
    "CLOSED_CALL_TEXT",
    "INTERRUPTED_TEXT",
    "ChatMessage",
    "ContentBlock",
    "HistoryProblem",
    "Message",
    "TextBlock",
    "ToolCall",
    "ToolFunction",
    "ToolResultBlock",
    "ToolUseBlock",
    "close_dangling_tool_calls",
    "count_turns",
    "settle_running",
    "validate_history",
]
