"""checkpointer: debounced, durable checkpoints for async agent sessions.

The writer, the per-key committer, the session registry and what they take and give are here;
the rest is in public submodules named for what they hold:
``checkpointer.stores`` (the store contract, for a store of your own),
``checkpointer.messages`` (agent message shapes and history checks),
``checkpointer.summaries`` (summary checkpoints), ``checkpointer.clock``
(the clock a writer reads, for tests).
"""

from ._committer import KeyCommitter
from ._load import load
from ._registry import SessionRegistry
from ._stores.encoding import Transcript
from ._stores.files import FileStore
from ._stores.journal.file import JournalStore
from ._stores.postgres.journal import PostgresJournalStore
from ._stores.postgres.store import PostgresStore
from ._stores.s3.journal import S3JournalStore
from ._stores.s3.store import S3Store
from ._values import (
    Checkpoint,
    CheckpointError,
    CheckpointFailed,
    Failed,
    Limits,
    Meta,
    NewerVersionError,
    RegistryStatistics,
    Result,
    Skipped,
    Snapshot,
    WriterStatistics,
    Written,
)
from ._version import VERSION
from ._writer.service import CheckpointWriter

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "CheckpointFailed",
    "CheckpointWriter",
    "Failed",
    "FileStore",
    "JournalStore",
    "KeyCommitter",
    "Limits",
    "Meta",
    "NewerVersionError",
    "PostgresJournalStore",
    "PostgresStore",
    "RegistryStatistics",
    "Result",
    "S3JournalStore",
    "S3Store",
    "SessionRegistry",
    "Skipped",
    "Snapshot",
    "Transcript",
    "WriterStatistics",
    "Written",
    "load",
]

__version__ = VERSION
