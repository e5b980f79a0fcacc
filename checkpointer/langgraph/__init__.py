"""LangGraph's ``BaseCheckpointSaver``, kept by checkpointer: ``CheckpointSaver(store)``.

A thread is one key, ``thread_key(thread_id)``, holding a log of rows
(``_log.py``) that its writer or committer writes (``_threads.py``).
Durability, conflicts, what SIGTERM keeps: docs/frameworks/langgraph.md.
"""

from checkpointer import CheckpointFailed

from ._saver import CheckpointSaver, thread_key

__all__ = ["CheckpointFailed", "CheckpointSaver", "thread_key"]
