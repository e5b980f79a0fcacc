"""Case ``strands``: ``CheckpointSessionManager`` against Strands' own ``FileSessionManager``.

One Strands Agent on the tests' scripted offline model (each turn: a prompt of
~200 bytes, a tool call, its result, an answer: four messages of 300 to 700 bytes,
``tests/children/strands_child.py``), ``SlidingWindowConversationManager(W)``
(Strands' default, W = 40), run in this process with Strands' sync call:

* checkpointer: ``CheckpointSessionManager`` on a ``JournalStore``, with the
  window, and with a ``NullConversationManager`` (no trimming);
* Strands: ``FileSessionManager`` (one JSON file per message, ``agent.json``
  per change; written to a temp file and renamed, never fsynced).

Per turn, before the window is full and once it trims: bytes passed to
write(2) (``/proc/self/io``) and the fsync/fdatasync calls of every thread
(``/usr/bin/strace -f -c`` attached to this process for the measured turns;
"n/a" without strace or ptrace).  A forked child per manager is SIGKILLed
inside its third turn's tool: the messages its successor restores, out of
those the agent held.  What a power cut loses is reasoned from the syncs:
``tests/powercut.py`` checks a ``CheckpointWriter``'s own states and cannot
host Strands' files.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from typing import Any

import msgspec

from ._harness import Report, Table, bytes_written, ratio, scratch_dir

STRACE = "/usr/bin/strace"
TEXT = "x" * 200
_kill_in_tool = {"on": False}


def _agent(manager: Any, window: int | None) -> Any:
    """The tests' scripted agent (a tool call, its result, an answer), with a tool that can
    SIGKILL this process."""
    from strands import tool
    from strands.agent.conversation_manager import (
        NullConversationManager,
        SlidingWindowConversationManager,
    )

    from tests.children.strands_child import scripted_agent

    @tool
    def lookup(q: str) -> str:
        """Look something up."""
        if _kill_in_tool["on"]:
            os.kill(os.getpid(), signal.SIGKILL)
        return f"found {q}"

    conversation = (
        NullConversationManager() if window is None else SlidingWindowConversationManager(window)
    )
    return scripted_agent(manager, tools=[lookup], conversation_manager=conversation)


def _manager(kind: str, root: str) -> Any:
    if kind == "strands":
        from strands.session import FileSessionManager

        return FileSessionManager("chat", storage_dir=root)
    from checkpointer import JournalStore
    from checkpointer.strands import CheckpointSessionManager

    return CheckpointSessionManager("chat", JournalStore(root))


@contextlib.contextmanager
def _syncs() -> Iterator[dict[str, float]]:
    """fsync + fdatasync calls of this process's threads during the block (nan: no strace)."""
    out: dict[str, float] = {"syncs": float("nan")}
    if not os.path.exists(STRACE):
        yield out
        return
    with scratch_dir("strace-") as tmp:
        log = os.path.join(tmp, "counts")
        argv = [STRACE, "-f", "-c", "-e", "trace=fsync,fdatasync", "-o", log]
        proc = subprocess.Popen([*argv, "-p", str(os.getpid())], stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        attached = "attached" in proc.stderr.readline()
        try:
            yield out
        finally:
            proc.send_signal(signal.SIGINT)
            proc.communicate()
            if attached and os.path.exists(log):
                text = open(log, encoding="ascii").read()  # noqa: SIM115 -- read once
                rows = [line.split() for line in text.splitlines()]
                calls = [int(r[3]) for r in rows if r and r[-1] in ("fsync", "fdatasync")]
                out["syncs"] = float(sum(calls))  # "% time, seconds, usecs/call, calls, ..."


def _turns(agent: Any, first: int, count: int) -> dict[str, float]:
    """Run ``count`` turns; bytes and syncs per turn."""
    before = bytes_written()
    with _syncs() as syncs:
        for n in range(first, first + count):
            agent(f"turn {n} {TEXT}")
    after = bytes_written()
    written = float("nan") if before is None or after is None else after - before
    return {"bytes": written / count, "syncs": syncs["syncs"] / count}


def _run(kind: str, window: int | None, warm: int, fill: int, measured: int) -> dict[str, float]:
    with scratch_dir(f"strands-{kind}-") as root:
        manager = _manager(kind.split("+")[0], root)
        agent = _agent(manager, window)
        early = _turns(agent, 0, warm)
        for n in range(warm, fill):
            agent(f"turn {n} {TEXT}")
        late = _turns(agent, fill, measured)
        with contextlib.suppress(AttributeError):
            manager.close()
    return {
        "bytes early": early["bytes"],
        "syncs early": early["syncs"],
        "bytes full": late["bytes"],
        "syncs full": late["syncs"],
    }


def _sigkill(kind: str, window: int) -> tuple[int, int]:
    """(messages held when SIGKILLed inside the third turn's tool, messages restored)."""
    with scratch_dir(f"strands-kill-{kind}-") as root:
        pid = os.fork()
        if pid == 0:
            agent = _agent(_manager(kind, root), window)
            for n in range(3):
                _kill_in_tool["on"] = n == 2
                agent(f"turn {n} {TEXT}")
            os._exit(0)
        os.waitpid(pid, 0)
        agent = _agent(_manager(kind, root), window)
        restored = len(agent.messages)
        with contextlib.suppress(AttributeError):
            agent._session_manager.close()
    return 10, restored  # two turns of four, then the third's prompt and its toolUse


def _expire() -> str:
    try:
        with open("/proc/sys/vm/dirty_expire_centisecs", encoding="ascii") as f:
            return f"{int(f.read()) / 100:g} s"
    except OSError:
        return "the kernel's writeback delay"


def main(quick: bool) -> dict[str, Any]:
    """The table, the SIGKILL losses, the power-cut reasoning; a ``Report`` as a dict."""
    window, warm, fill, measured = (8, 1, 4, 3) if quick else (40, 8, 12, 10)
    runs = {
        "checkpointer JournalStore": ("ours", window),
        "checkpointer JournalStore, no trimming": ("ours+null", None),
        "Strands FileSessionManager": ("strands", window),
    }
    report = Report(title="Strands: CheckpointSessionManager vs FileSessionManager")
    try:
        figures = {name: _run(kind, w, warm, fill, measured) for name, (kind, w) in runs.items()}
        kills = {kind: _sigkill(kind, window) for kind in ("ours", "strands")}
    except ImportError as exc:
        report.notes.append(f"strands: not run ({exc})")
        return msgspec.to_builtins(report)  # type: ignore[no-any-return]
    report.tables.append(
        Table(
            title=(
                f"strands: per turn (4 messages), window {window}: turns 0-{warm - 1} "
                f"(not full) and {fill}-{fill + measured - 1} (trimming)"
            ),
            columns=["persistence", "bytes (not full)", "syncs", "bytes (trimming)", "syncs"],
            rows=[[name, *map(_cell, f.values())] for name, f in figures.items()],
        )
    )
    ours, null, peer = (figures[name] for name in runs)
    held, restored = kills["ours"]
    peer_held, peer_restored = kills["strands"]
    report.ratios += [
        ratio(
            "bytes/turn trimming / not full (journal, window)",
            ours["bytes full"] / ours["bytes early"],
            note="once it trims, each turn's end rewrites the window",
        ),
        ratio(
            "bytes/turn window / no trimming (journal, trimming)",
            ours["bytes full"] / null["bytes full"],
        ),
        ratio(
            "bytes/turn checkpointer / FileSessionManager (trimming)",
            ours["bytes full"] / peer["bytes full"],
        ),
        ratio(
            "syncs/turn checkpointer (trimming), FileSessionManager has "
            f"{_cell(peer['syncs full'])}",
            ours["syncs full"],
        ),
        ratio(
            f"messages restored after SIGKILL in a tool, checkpointer "
            f"{restored}/{held}, FileSessionManager {peer_restored}/{peer_held}",
            restored / held,
            ">=",
            1,
        ),
    ]
    report.notes.append(
        "a power cut loses nothing checkpointer committed (file and directory "
        "fsynced before each hook returns); FileSessionManager never syncs, so it loses "
        f"what the kernel had not written back (dirty data older than {_expire()} is), and "
        "a message file renamed unsynced can come back missing or empty"
    )
    return msgspec.to_builtins(report)  # type: ignore[no-any-return]


def _cell(value: float) -> str:
    if value != value:  # nan
        return "n/a"
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(main("--quick" in sys.argv), indent=1)[:20000])
