"""LangGraph's ``BaseCheckpointSaver``, kept by checkpointer.

``CheckpointSaver(store)`` is a LangGraph checkpointer over checkpointer's
public API, with the sync and async methods (``delete_for_runs``,
``copy_thread`` and ``prune`` included)::

    async with CheckpointSaver(JournalStore("threads")) as saver:
        graph = builder.compile(checkpointer=saver)
        await graph.ainvoke(inputs, {"configurable": {"thread_id": "t1"}})

A thread is one key (``thread_key(thread_id)``) holding an append-only log
of rows (``_log.py``).  In an async saver a thread's ``CheckpointWriter``
writes ``"async"`` puts at its timing and durable ones at once; otherwise
its ``KeyCommitter`` commits every put (``_owners.py``).  Durability,
conflicts and what SIGTERM keeps: docs/frameworks/langgraph.md.  asyncio
and sync, as LangGraph's API.
"""

from checkpointer import CheckpointFailed

from ._saver import CheckpointSaver, thread_key

__all__ = ["CheckpointFailed", "CheckpointSaver", "thread_key"]
