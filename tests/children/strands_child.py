"""A Strands Agent on a scripted offline model, checkpointed by ``CheckpointSessionManager``.

    python -m tests.children.strands_child ROOT SESSION TURNS [KILL]

Runs ``TURNS`` turns (each: the model calls ``lookup``, then answers with the
tool's result), each turn's prompt ``turn-<n>``; the agent state counts the
turns and the conversation manager is a ``SlidingWindowConversationManager(10)``
so its state (``removed_message_count``) moves.  With ``KILL`` the last
turn's tool prints ``in-tool PID`` and blocks: the parent test SIGKILLs it.
Prints ``done`` after the last turn.

    python -m tests.children.strands_child many ROOT N

A server under ``ulimit -n DESCRIPTORS`` (``tests._support``, ``limit_descriptors``;
so is ``let-go``): ``N`` sessions ``s<i>``, each its own agent
and manager, kept open together, each one turn; then all closed; prints ``done``.

    python -m tests.children.strands_child let-go ROOT N

Session ``chat``: one turn; then ``N`` other sessions opened (its lock let go
past the process's bound); prints ``let-go``; waits for a line on stdin
(another process writes ``chat``); a second turn: prints ``refused REASON``
or ``saved``.  The tests import ``scripted_agent`` to
resume in-process and ``converse_problems`` to check a history as Bedrock does.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

from strands import Agent, tool
from strands.agent.conversation_manager import SlidingWindowConversationManager
from strands.models.model import Model

from tests._support import limit_descriptors

WINDOW = 10
_block = {"on": False}


def converse_problems(messages: list[Any]) -> list[str]:
    """What Bedrock Converse rejects: a toolUse not answered in the next message, a toolResult
    without the toolUse just before it."""
    problems: list[str] = []
    for i, message in enumerate(messages):
        uses = {b["toolUse"]["toolUseId"] for b in message["content"] if "toolUse" in b}
        following = messages[i + 1]["content"] if i + 1 < len(messages) else []
        answered = {b["toolResult"]["toolUseId"] for b in following if "toolResult" in b}
        problems += [
            f"messages[{i}]: toolUse {u} has no toolResult" for u in sorted(uses - answered)
        ]
        before = messages[i - 1]["content"] if i else []
        asked = {b["toolUse"]["toolUseId"] for b in before if "toolUse" in b}
        results = {b["toolResult"]["toolUseId"] for b in message["content"] if "toolResult" in b}
        problems += [
            f"messages[{i}]: toolResult {r} has no toolUse" for r in sorted(results - asked)
        ]
    return problems


class ScriptedModel(Model):
    """Calls ``lookup`` with the prompt, then answers with the tool's result; refuses, as
    Bedrock does, a history that ``converse_problems`` finds wrong."""

    def __init__(self) -> None:
        self.calls = 0

    def update_config(self, **model_config: Any) -> None:
        pass

    def get_config(self) -> Any:
        return {}

    def structured_output(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    async def stream(self, messages: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        problems = converse_problems(messages)
        if problems:
            raise ValueError(f"ValidationException: {problems}")
        self.calls += 1
        last = messages[-1]["content"]
        yield {"messageStart": {"role": "assistant"}}
        results = [b["toolResult"] for b in last if "toolResult" in b]
        if results:
            text = " ".join(c.get("text", "") for r in results for c in r["content"])
            yield {"contentBlockDelta": {"delta": {"text": f"answer {text}"}}}
            yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "end_turn"}}
            return
        prompt = next(b["text"] for b in last if "text" in b)
        use = {"toolUseId": f"t{self.calls}-{prompt}", "name": "lookup"}
        yield {"contentBlockStart": {"start": {"toolUse": use}}}
        yield {"contentBlockDelta": {"delta": {"toolUse": {"input": f'{{"q": "{prompt}"}}'}}}}
        yield {"contentBlockStop": {}}
        yield {"messageStop": {"stopReason": "tool_use"}}


@tool
def lookup(q: str) -> str:
    """Look something up."""
    if _block["on"]:
        os.write(1, f"in-tool {os.getpid()}\n".encode())
        time.sleep(3600)
    return f"found:{q}"


def scripted_agent(session_manager: Any, **kwargs: Any) -> Agent:
    """The agent of these tests: the scripted model, ``lookup``, a window of ``WINDOW``
    (the benchmark's: its own ``lookup``, its own window)."""
    kwargs.setdefault("conversation_manager", SlidingWindowConversationManager(WINDOW))
    kwargs.setdefault("tools", [lookup])
    return Agent(
        model=ScriptedModel(),
        session_manager=session_manager,
        callback_handler=None,
        **kwargs,
    )


def turn(agent: Agent, n: int) -> None:
    """One turn: the prompt ``turn-<n>``; the agent state counts it."""
    agent.state.set("turns", (agent.state.get("turns") or 0) + 1)
    agent(f"turn-{n}")


def _one_turn(root: str, go: int) -> None:
    """A forked racer: wait for ``go``, open the session, count one turn in the agent state,
    save it, close; exit 0, or 3 if refused.  No model call: the racers overlap more."""
    from checkpointer import CheckpointFailed, JournalStore
    from checkpointer.strands import CheckpointSessionManager

    os.read(go, 1)
    try:
        with CheckpointSessionManager("chat", JournalStore(root)) as manager:
            agent = scripted_agent(manager)
            agent.state.set("turns", (agent.state.get("turns") or 0) + 1)
            manager.sync_agent(agent)
    except CheckpointFailed as exc:
        os.write(1, f"refused {exc.result.reason}\n".encode())
        os._exit(3)
    os._exit(0)


def race(root: str, trials: int) -> None:
    """Per trial, two forked processes open session ``chat`` under ``root/<trial>`` at once;
    prints ``trial N ran K`` (K of them ran their turn)."""
    for trial in range(trials):
        go_read, go_write = os.pipe()
        pids = []
        for _ in range(2):
            pid = os.fork()
            if pid == 0:
                os.close(go_write)
                _one_turn(os.path.join(root, str(trial)), go_read)
            pids.append(pid)
        os.close(go_read)
        os.write(go_write, b"gg")  # both start now
        os.close(go_write)
        codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
        assert set(codes) <= {0, 3}, codes
        print(f"trial {trial} ran {codes.count(0)}", flush=True)


def many(root: str, n: int) -> None:
    """``n`` sessions open at once, each one turn, in a process of ``DESCRIPTORS``."""
    from checkpointer import JournalStore
    from checkpointer.strands import CheckpointSessionManager

    limit_descriptors()
    store = JournalStore(root)
    managers = [CheckpointSessionManager(f"s{i}", store) for i in range(n)]
    for i, manager in enumerate(managers):
        turn(scripted_agent(manager), i)
    for manager in managers:
        manager.close()
    print("done", flush=True)


def let_go(root: str, n: int) -> None:
    """A session whose lock this process let go, written by another, then used again."""
    from checkpointer import CheckpointFailed, JournalStore
    from checkpointer.strands import CheckpointSessionManager

    limit_descriptors()
    store = JournalStore(root)
    first = CheckpointSessionManager("chat", store)
    agent = scripted_agent(first)
    turn(agent, 0)
    others = [CheckpointSessionManager(f"s{i}", store) for i in range(n)]
    for other in others:
        scripted_agent(other)  # its initialization commits: it holds its lock
    print("let-go", flush=True)
    sys.stdin.readline()
    try:
        turn(agent, 1)
    except CheckpointFailed as exc:
        print(f"refused {exc.result.reason}", flush=True)
    else:
        print("saved", flush=True)
    for manager in [first, *others]:
        manager.close()


def main() -> None:
    from checkpointer import JournalStore
    from checkpointer.strands import CheckpointSessionManager

    if sys.argv[1] == "race":
        race(sys.argv[2], int(sys.argv[3]))
        return
    if sys.argv[1] == "many":
        many(sys.argv[2], int(sys.argv[3]))
        return
    if sys.argv[1] == "let-go":
        let_go(sys.argv[2], int(sys.argv[3]))
        return
    root, session, turns = sys.argv[1], sys.argv[2], int(sys.argv[3])
    kill = len(sys.argv) > 4
    manager = CheckpointSessionManager(session, JournalStore(root))
    agent = scripted_agent(manager)
    for n in range(turns):
        _block["on"] = kill and n == turns - 1
        turn(agent, agent.state.get("turns") or 0)
    print("done", flush=True)


if __name__ == "__main__":
    main()
