"""checkpointer: debounced, durable checkpoints for async agent sessions."""

from ._clock import Clock, MonotonicClock
from ._format import Checkpoint, CheckpointError, Meta, Snapshot, load
from ._postgres import KeyLockedError, PostgresStore, PostgresStoreError, StaleWriteError
from ._results import Failed, Result, Skipped, WriterStatistics, Written
from ._stores import FileStore, Store
from ._writer import CheckpointWriter

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "CheckpointWriter",
    "Clock",
    "Failed",
    "FileStore",
    "KeyLockedError",
    "Meta",
    "MonotonicClock",
    "PostgresStore",
    "PostgresStoreError",
    "Result",
    "Skipped",
    "Snapshot",
    "StaleWriteError",
    "Store",
    "WriterStatistics",
    "Written",
    "load",
]

__version__ = "0.1.0"
