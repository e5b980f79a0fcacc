"""checkpointer: debounced, durable checkpoints for async agent sessions."""

from ._format.versions import Migration
from ._load import load
from ._stores.base import (
    KeyLock,
    KeyLocked,
    LockHolder,
    LockingStore,
    ProbingStore,
    Staged,
    StateStore,
    Store,
)
from ._stores.encoding import Transcript
from ._stores.files import FileStore
from ._stores.journal.file import JournalStatistics, JournalStore
from ._stores.postgres.errors import KeyLockedError, PostgresStoreError, StaleWriteError
from ._stores.postgres.journal import PostgresJournalStore
from ._stores.postgres.store import PostgresStore
from ._stores.s3.client import S3StoreError
from ._stores.s3.journal import S3JournalStore
from ._stores.s3.store import S3Store
from ._stores.summaries import load_summary, summary_path, write_summary
from ._transcript.fingerprint import transcript_fingerprint
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
from ._transcript.prepare import transcript_prepare
from ._transcript.repair import close_dangling_tool_calls, settle_running
from ._transcript.summary import resume_context
from ._values import (
    Checkpoint,
    CheckpointError,
    CheckpointFailed,
    Failed,
    Meta,
    NewerVersionError,
    Prepared,
    Result,
    Skipped,
    Snapshot,
    SummaryCheckpoint,
    SummaryFailed,
    TornTail,
    WriterInfo,
    WriterStatistics,
    Written,
)
from ._version import VERSION
from ._writer.clock import Clock, MonotonicClock
from ._writer.collapse import collapse
from ._writer.service import CheckpointWriter

__all__ = [
    "CLOSED_CALL_TEXT",
    "INTERRUPTED_TEXT",
    "ChatMessage",
    "Checkpoint",
    "CheckpointError",
    "CheckpointFailed",
    "CheckpointWriter",
    "Clock",
    "ContentBlock",
    "Failed",
    "FileStore",
    "HistoryProblem",
    "JournalStatistics",
    "JournalStore",
    "KeyLock",
    "KeyLocked",
    "KeyLockedError",
    "LockHolder",
    "LockingStore",
    "Message",
    "Meta",
    "Migration",
    "MonotonicClock",
    "NewerVersionError",
    "PostgresJournalStore",
    "PostgresStore",
    "PostgresStoreError",
    "Prepared",
    "ProbingStore",
    "Result",
    "S3JournalStore",
    "S3Store",
    "S3StoreError",
    "Skipped",
    "Snapshot",
    "Staged",
    "StaleWriteError",
    "StateStore",
    "Store",
    "SummaryCheckpoint",
    "SummaryFailed",
    "TextBlock",
    "ToolCall",
    "ToolFunction",
    "ToolResultBlock",
    "ToolUseBlock",
    "TornTail",
    "Transcript",
    "WriterInfo",
    "WriterStatistics",
    "Written",
    "close_dangling_tool_calls",
    "collapse",
    "count_turns",
    "load",
    "load_summary",
    "resume_context",
    "settle_running",
    "summary_path",
    "transcript_fingerprint",
    "transcript_prepare",
    "validate_history",
    "write_summary",
]

__version__ = VERSION
