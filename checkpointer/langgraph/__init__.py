"""LangGraph's ``BaseCheckpointSaver``, kept by checkpointer.

``CheckpointSaver(store)`` is a LangGraph checkpointer over checkpointer's
public API, with the sync and async methods (``delete_for_runs``,
``copy_thread`` and ``prune`` included)::

    async with CheckpointSaver(JournalStore("threads")) as saver:
        graph = builder.compile(checkpointer=saver)
        await graph.ainvoke(inputs, {"configurable": {"thread_id": "t1"}})

A thread is one key, ``thread_key(thread_id)``, holding a log of rows
(``_log.py``), written by its writer or committer (``_threads.py``).
Durability, conflicts and what SIGTERM keeps: docs/frameworks/langgraph.md.
"""

from checkpointer import CheckpointFailed

from ._saver import CheckpointSaver, thread_key

__all__ = ["CheckpointFailed", "CheckpointSaver", "thread_key"]
