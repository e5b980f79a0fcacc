"""A synchronous LangGraph server under ``ulimit -n 256``, for ``test_langgraph_owners.py``.

    python -m tests.children.langgraph_sync_child ROOT N

One ``CheckpointSaver`` (``with``, its default ``max_open``) on the ``FileStore`` at
``ROOT`` serves threads ``t0`` ... ``t<N-1>`` one turn each (``"hi <i>"``,
``durability="sync"``) from 8 request threads, ``graph.invoke`` in each, then
prints ``{"step": "served", "descriptors": ...}`` (its open descriptors then).
It waits for a line on stdin (the test writes thread ``t0`` from its own process
meanwhile), runs a turn ``"again <i>"`` on ``t0`` and ``t1``, and prints
``{"step": "again", "t0": ..., "t1": ..., "t0_retried": ...}`` (``t0``'s turn run
again): each the messages after the turn, or the ``CheckpointFailed`` it raised
(``reason``, ``error``).  Then it closes the saver
and prints ``{"step": "closed"}``.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from langchain_core.messages import HumanMessage

from checkpointer import CheckpointFailed, FileStore
from checkpointer.langgraph import CheckpointSaver
from tests.children.adapter_child import langgraph_graph


def say(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def turn(graph: Any, thread_id: str, text: str) -> Any:
    config: Any = {"configurable": {"thread_id": thread_id}}
    try:
        result = graph.invoke({"messages": [HumanMessage(text)]}, config, durability="sync")
    except CheckpointFailed as exc:
        return {"reason": exc.result.reason, "error": exc.result.error}
    return [m.content for m in result["messages"]]


def main(root: str, n: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    with CheckpointSaver(FileStore(root)) as saver:
        graph = langgraph_graph(saver)
        with ThreadPoolExecutor(8) as requests:  # a threaded server's workers
            served = list(requests.map(lambda i: turn(graph, f"t{i}", f"hi {i}"), range(n)))
        failed = [i for i, messages in enumerate(served) if isinstance(messages, dict)]
        if failed:
            raise SystemExit(f"threads {failed[:5]} failed: {served[failed[0]]}")
        say(step="served", descriptors=len(os.listdir("/proc/self/fd")))
        sys.stdin.readline()
        t0, t1 = turn(graph, "t0", "again 0"), turn(graph, "t1", "again 1")
        say(step="again", t0=t0, t1=t1, t0_retried=turn(graph, "t0", "again 0"))
    say(step="closed")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
