"""Agent messages: our message Structs, and checks and repairs of a history of any dialect."""

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
