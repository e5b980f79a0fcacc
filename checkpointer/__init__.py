"""checkpointer: debounced, durable checkpoints for async agent sessions."""

from ._clock import Clock, MonotonicClock
from ._format import Checkpoint, CheckpointError, Meta, Snapshot, load
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
    "Meta",
    "MonotonicClock",
    "Result",
    "Skipped",
    "Snapshot",
    "Store",
    "WriterStatistics",
    "Written",
    "load",
]

__version__ = "0.1.0"
