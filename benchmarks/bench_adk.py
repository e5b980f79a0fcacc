"""Case ``adk``: ``checkpointer.google_adk`` vs Google ADK's own SQLite session services.

The same run for each: an ADK ``Runner`` with an offline scripted model (a
``function_call``, then text once the tool answered), a session prefilled
with turns, then measured turns of four events each (the user's message,
the call, the tool's response, the answer); the tool sets session and
``user:`` state.  Persistences:

* checkpointer: ``CheckpointSessionService(JournalStore(root))``;
* ADK's ``SqliteSessionService`` (aiosqlite, a file);
* ADK's ``DatabaseSessionService("sqlite+aiosqlite:///...")``, if SQLAlchemy
  is installed (it is not a dependency of ADK's base install).

Figures per measured turn: bytes the process passed to write(2)
(``/proc/self/io``) and, in the full run, fsync + fdatasync calls counted
by ``strace -f -c`` around a child process that runs only the measured
turns.  A SIGKILL inside the tool of a turn, then the events stored
counted against those ``append_event`` had returned for.  A power cut is
reasoned from the syncs, not cut: every service syncs before
``append_event`` returns.  ``--quick`` runs in this process (no child, no
strace, no kill): three turns after two.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncGenerator
from typing import Any

import msgspec

from ._harness import Report, Table, bytes_written, ratio, scratch_dir

STRACE = "/usr/bin/strace"
APP, USER, SESSION = "bench", "u", "s"
_block = {"at": -1, "turn": 0}


def _service(kind: str, root: str) -> Any:
    if kind == "checkpointer":
        from checkpointer import JournalStore
        from checkpointer.google_adk import CheckpointSessionService

        return CheckpointSessionService(JournalStore(root))
    if kind == "adk-sqlite":
        from google.adk.sessions.sqlite_session_service import SqliteSessionService

        return SqliteSessionService(os.path.join(root, "sessions.db"))
    from google.adk.sessions.database_session_service import DatabaseSessionService

    return DatabaseSessionService(f"sqlite+aiosqlite:///{os.path.join(root, 'sessions.db')}")


def _kinds() -> tuple[list[str], list[str]]:
    """The persistences to run, and notes on those left out."""
    if importlib.util.find_spec("sqlalchemy") is None:
        note = "adk-database: not run (DatabaseSessionService needs SQLAlchemy: not installed)"
        return ["checkpointer", "adk-sqlite"], [note]
    return ["checkpointer", "adk-sqlite", "adk-database"], []


def _runner(service: Any) -> Any:
    from google.adk.agents import LlmAgent
    from google.adk.models.base_llm import BaseLlm
    from google.adk.models.llm_request import LlmRequest
    from google.adk.models.llm_response import LlmResponse
    from google.adk.runners import Runner
    from google.adk.tools.tool_context import ToolContext
    from google.genai import types

    class Scripted(BaseLlm):
        model: str = "scripted"

        async def generate_content_async(
            self, llm_request: LlmRequest, stream: bool = False
        ) -> AsyncGenerator[LlmResponse, None]:
            parts = llm_request.contents[-1].parts or []
            answer = next((p.function_response for p in parts if p.function_response), None)
            if answer is not None:
                part = types.Part(text=f"done: {(answer.response or {}).get('result')}")
            else:
                n = len(llm_request.contents)
                call = types.FunctionCall(id=f"c{n}", name="lookup", args={"q": parts[0].text})
                part = types.Part(function_call=call)
            yield LlmResponse(content=types.Content(role="model", parts=[part]))

    async def lookup(q: str, tool_context: ToolContext) -> str:
        """Look something up."""
        tool_context.state["user:lookups"] = tool_context.state.get("user:lookups", 0) + 1
        tool_context.state["last"] = q
        if _block["turn"] == _block["at"]:
            os.write(1, f"in-tool {os.getpid()}\n".encode())
            await asyncio.sleep(3600)
        return "answer: " + q * 20

    agent = LlmAgent(name="a", model=Scripted(), tools=[lookup])
    return Runner(agent=agent, app_name=APP, session_service=service)


async def _turns(kind: str, root: str, first: int, count: int) -> dict[str, float]:
    """Turns ``first`` .. ``first + count - 1``; bytes and seconds of them."""
    from google.genai import types

    logging.getLogger("google_adk").setLevel(logging.ERROR)  # its "no token usage" per call
    service = _service(kind, root)
    runner = _runner(service)
    if first == 0:
        await service.create_session(app_name=APP, user_id=USER, session_id=SESSION)
    before, t0 = bytes_written() or 0, time.perf_counter()
    for turn in range(first, first + count):
        _block["turn"] = turn
        text = f"question {turn} " + "lorem ipsum " * 20
        message = types.Content(role="user", parts=[types.Part(text=text)])
        async for _ in runner.run_async(user_id=USER, session_id=SESSION, new_message=message):
            pass
    figures = {"bytes": (bytes_written() or 0) - before, "seconds": time.perf_counter() - t0}
    if hasattr(service, "aclose"):
        await service.aclose()
    elif hasattr(service, "close"):
        await service.close()
    return figures


async def _events(kind: str, root: str) -> int:
    service = _service(kind, root)
    session = await service.get_session(app_name=APP, user_id=USER, session_id=SESSION)
    return 0 if session is None else len(session.events)


def _child(
    kind: str, root: str, first: int, count: int, *, trace: str | None = None, kill: bool = False
) -> Any:
    """This module as a child running those turns (``kill``: blocking in the last one's tool)."""
    args = [kind, root, str(first), str(count), *(["kill"] if kill else [])]
    command = [sys.executable, "-m", "benchmarks.bench_adk", *args]
    if trace is not None:
        command = [STRACE, "-f", "-c", "-e", "trace=fsync,fdatasync", "-o", trace, *command]
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": here}
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=here, env=env)


_SYNC_LINE = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?f(?:data)?sync$", re.M)


def _syncs(trace: str) -> int:
    """fsync + fdatasync calls in a ``strace -c`` summary."""
    with open(trace, encoding="utf-8") as f:
        return sum(int(m[1]) for m in _SYNC_LINE.finditer(f.read()))


def _measure(kind: str, history: int, turns: int) -> dict[str, float]:
    """Bytes, seconds and syncs per measured turn, from a child (under strace if it exists)."""
    with scratch_dir("adk-") as root:
        _child(kind, root, 0, history).communicate(timeout=600)
        trace = os.path.join(root, "strace.txt") if os.path.exists(STRACE) else None
        out, _ = _child(kind, root, history, turns, trace=trace).communicate(timeout=600)
        figures = json.loads(out.strip().splitlines()[-1])
        figures["syncs"] = math.nan if trace is None else _syncs(trace)
    return {name: value / turns for name, value in figures.items()}


def _killed(kind: str, at: int) -> int:
    """Events acknowledged but not stored after a SIGKILL inside turn ``at``'s tool."""
    with scratch_dir("adk-kill-") as root:
        child = _child(kind, root, 0, at + 1, kill=True)
        line = child.stdout.readline() if child.stdout else ""
        os.kill(int(line.split()[1]), signal.SIGKILL)
        child.communicate(timeout=120)
        stored = asyncio.run(_events(kind, root))
    return 4 * at + 2 - stored  # each turn 4 events; the killed one its message and call


def main(quick: bool) -> dict[str, Any]:
    """One table: per persistence, bytes and syncs per turn and what a SIGKILL lost."""
    report = Report(title="Google ADK: CheckpointSessionService vs ADK's SQLite services")
    try:
        import google.adk  # noqa: F401
    except ImportError as exc:
        report.notes.append(f"not run ({exc})")
        return msgspec.to_builtins(report)  # type: ignore[no-any-return]
    kinds, report.notes = _kinds()
    history, turns = (2, 3) if quick else (50, 20)
    rows: dict[str, dict[str, float]] = {}
    for kind in kinds:
        if quick:
            with scratch_dir("adk-") as root:
                asyncio.run(_turns(kind, root, 0, history))
                figures = asyncio.run(_turns(kind, root, history, turns))
            rows[kind] = {k: v / turns for k, v in figures.items()}
            rows[kind] |= {"syncs": math.nan, "lost": math.nan}
        else:
            rows[kind] = _measure(kind, history, turns) | {"lost": _killed(kind, 3)}
    report.tables.append(
        Table(
            title=(
                f"per turn of 4 events, after {history} turns ({turns} measured"
                + ("" if quick else "; time under strace, which slows each sync")
                + ")"
            ),
            columns=["persistence", "bytes written", "fsync+fdatasync", "time", "SIGKILL lost"],
            rows=[
                [
                    kind,
                    f"{r['bytes'] / 1024:.1f} KiB",
                    "n/a" if math.isnan(r["syncs"]) else f"{r['syncs']:.1f}",
                    f"{r['seconds'] * 1e3:.0f} ms",
                    "n/a" if math.isnan(r["lost"]) else f"{r['lost']:.0f} events",
                ]
                for kind, r in rows.items()
            ],
        )
    )
    ours, peer = rows["checkpointer"], rows["adk-sqlite"]
    report.ratios.append(
        ratio("bytes per turn checkpointer / adk-sqlite", ours["bytes"] / peer["bytes"], "<", 1)
    )
    if not quick:
        syncs = ours["syncs"] / peer["syncs"] if peer["syncs"] else None
        report.ratios.append(ratio("syncs per turn checkpointer / adk-sqlite", syncs, "<=", 1))
    report.notes.append(
        "power cut: not cut (tests/powercut.py's FUSE filesystem hosts one store's files, not "
        "SQLite's); every service syncs before append_event returns, so a cut loses at most the "
        "event being appended"
    )
    return msgspec.to_builtins(report)  # type: ignore[no-any-return]


if __name__ == "__main__":
    if sys.argv[1:] in ([], ["--quick"]):  # the case alone: python -m benchmarks.bench_adk
        print(json.dumps(main(quick=sys.argv[1:] == ["--quick"]), indent=1))
    else:  # a child of _child: KIND ROOT FIRST COUNT [kill]
        kind, root, first, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        if sys.argv[5:] == ["kill"]:
            _block["at"] = first + count - 1
        print(json.dumps(asyncio.run(_turns(kind, root, first, count))), flush=True)
