"""checkpointer: debounced, durable checkpoints for async agent sessions."""

from ._clock import Clock, MonotonicClock
from ._codec import Staged, StateStore
from ._encoding import Transcript
from ._format import Checkpoint, CheckpointError, Meta, Snapshot, TornTail, load
from ._journal import JournalStatistics, JournalStore
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
    "JournalStatistics",
    "JournalStore",
    "Meta",
    "MonotonicClock",
    "Result",
    "Skipped",
    "Snapshot",
    "Staged",
    "StateStore",
    "Store",
    "TornTail",
    "Transcript",
    "WriterStatistics",
    "Written",
    "load",
]

__version__ = "0.1.0"
