"""Summary checkpoints: a long session collapsed to a summary and a recent tail."""

from ._stores.summaries import load_summary, summary_path, write_summary
from ._transcript.summary import resume_context
from ._values import SummaryCheckpoint, SummaryFailed
from ._writer.collapse import collapse

__all__ = [
    "SummaryCheckpoint",
    "SummaryFailed",
    "collapse",
    "load_summary",
    "resume_context",
    "summary_path",
    "write_summary",
]
