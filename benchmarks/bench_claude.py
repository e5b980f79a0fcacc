"""Case ``claude``: the Claude Code CLI's own transcript vs its ``CheckpointSessionStore`` mirror.

One SDK session (``ClaudeSDKClient``, ``session_store_flush="eager"``) on
the real bundled CLI against a scripted Messages API on 127.0.0.1, turns of
one Bash tool call each, run under ``strace -f``: the bytes each side
passed to write(2) and its fsync/fdatasync calls, by file (the CLI's JSONL
under ``CLAUDE_CONFIG_DIR/projects``; the store's root, ours, with durability
``"async"`` on a ``JournalStore``).  Then the same session SIGKILLed inside a
tool: the entries on each side.  A power cut loses what was not synced:
reasoned from the syncs (the FUSE power-cut harness cannot host the CLI, a
400 MB Bun binary that starts its tools in sessions of their own).

``python -m benchmarks.bench_claude [--quick]``; a child run is
``--child ROOT URL CONFIG TURNS [FLAG]``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import msgspec

from ._harness import Report, Table, ratio, scratch_dir

_CALL = re.compile(
    r"^(?P<pid>\d+) +(?P<call>write|pwrite64|writev|pwritev|pwritev2|fsync|fdatasync)"
    r"\((?P<fd>\d+)<(?P<path>[^>]*)>.*= (?P<ret>-?\d+)"
)


def _child(root: str, url: str, config: str, turns: int, flag: str | None) -> None:
    """One session of ``turns`` turns (the last one killed inside its tool when ``flag``)."""
    import anyio
    from claude_agent_sdk import ClaudeAgentOptions, ClaudeSDKClient, ResultMessage

    from checkpointer import JournalStore
    from checkpointer.claude_agent_sdk import CheckpointSessionStore
    from tests.children.claude_child import CLI, MODEL, cli_env

    async def run() -> None:
        async with CheckpointSessionStore(JournalStore(root)) as sessions:
            options = ClaudeAgentOptions(
                model=MODEL,
                cwd=root,
                allowed_tools=["Bash"],
                session_store=sessions,
                session_store_flush="eager",
                env=cli_env(url, config),
                cli_path=CLI,
            )
            async with ClaudeSDKClient(options) as client:
                for turn in range(turns):
                    last = flag is not None and turn == turns - 1
                    command = f"echo $$ > {flag} && exec sleep 120" if last else f"echo turn-{turn}"
                    await client.query(f"turn {turn} RUN: {command}")
                    async for message in client.receive_response():
                        if isinstance(message, ResultMessage):
                            break

    if flag is not None:
        os.setsid()  # a group of its own, to be killed without strace
    anyio.run(run)


def _session(turns: int, *, kill: bool) -> dict[str, Any]:
    """Run a child session under strace; what each side wrote and synced, and its entries."""
    from tests.children.claude_child import MessagesServer

    with scratch_dir("claude-") as where, MessagesServer() as api:
        root, config = os.path.join(where, "store"), os.path.join(where, "config")
        os.makedirs(root)
        os.makedirs(config)
        flag = os.path.join(where, "in-tool") if kill else None
        trace = os.path.join(where, "strace")
        argv = [sys.executable, "-m", "benchmarks.bench_claude", "--child"]
        argv += [root, api.url, config, str(turns), *([flag] if flag else [])]
        strace = ["strace", "-f", "-y", "-qq", "-o", trace, "-e", "trace=" + _CALLS]
        proc = subprocess.Popen(strace + argv, start_new_session=True, stdout=subprocess.DEVNULL)
        try:
            if flag is not None:
                _kill_in_tool(proc, root, flag)
            proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        figures = _tally(trace, root, os.path.join(config, "projects"))
        figures["entries"] = _entries(root, os.path.join(config, "projects"))
        return figures


_CALLS = "write,pwrite64,writev,pwritev,pwritev2,fsync,fdatasync"


def _kill_in_tool(proc: subprocess.Popen[bytes], root: str, flag: str) -> None:
    """SIGKILL the session (its process group, its tool) once its tool runs and is mirrored."""
    from checkpointer import JournalStore, load

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        keys = JournalStore(root).keys()
        if os.path.exists(flag) and keys:
            checkpoint = load(JournalStore(root), keys[0])
            if checkpoint is not None and "exec sleep" in str(checkpoint.state["messages"][-6:]):
                break
        time.sleep(0.05)
    # The session only (its own process group): strace, alive, then writes out its log.
    with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
        os.killpg(int(f.read().split()[0]), signal.SIGKILL)
    with open(flag) as f:
        tool = f.read().strip()
    if tool:
        os.kill(int(tool), signal.SIGKILL)


def _tally(trace: str, root: str, projects: str) -> dict[str, Any]:
    """Bytes written and syncs of each side, from the strace log."""
    counts: Counter[str] = Counter()
    with open(trace, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = _CALL.match(line)
            if m is None or int(m["ret"]) < 0:
                continue
            path = m["path"]
            side = "ours" if path.startswith(root) else "cli" if path.startswith(projects) else None
            if side is None:
                continue
            if m["call"] in ("fsync", "fdatasync"):
                counts[f"{side} syncs"] += 1
            else:
                counts[f"{side} bytes"] += int(m["ret"])
                counts[f"{side} writes"] += 1
    return dict(counts)


def _entries(root: str, projects: str) -> dict[str, int]:
    """The transcript entries each side holds now (the main session's)."""
    from checkpointer import JournalStore, load

    ours = 0
    for key in JournalStore(root).keys():  # noqa: SIM118 -- a Store, not a mapping
        checkpoint = load(JournalStore(root), key)
        if checkpoint is not None and checkpoint.state["subpath"] is None:
            ours += len(checkpoint.state["messages"])
    cli = 0
    for dirpath, _, names in os.walk(projects):
        for name in names:
            if name.endswith(".jsonl") and os.sep + "subagents" not in dirpath:
                with open(os.path.join(dirpath, name), "rb") as f:
                    cli += sum(1 for line in f if line.strip())
    return {"ours": ours, "cli": cli}


def main(quick: bool) -> dict[str, Any]:
    """Per-turn bytes and syncs of each side, and what a SIGKILL in a tool leaves on each."""
    report = Report(title="Claude Code: the CLI's transcript vs the CheckpointSessionStore mirror")
    if shutil.which("strace") is None:
        report.notes.append("claude: not run (strace is not installed)")
        return msgspec.to_builtins(report)  # type: ignore[no-any-return]
    try:
        import claude_agent_sdk  # noqa: F401
    except ImportError as exc:
        report.notes.append(f"claude: not run ({exc})")
        return msgspec.to_builtins(report)  # type: ignore[no-any-return]
    turns = 1 if quick else 5
    run = _session(turns, kill=False)
    killed = _session(turns, kill=True)
    per = {k: v / turns for k, v in run.items() if k != "entries"}
    report.tables.append(
        Table(
            title=f"{turns} turns with a Bash tool call each (eager mirroring), per turn",
            columns=["persistence", "bytes written", "write calls", "fsync/fdatasync"],
            rows=[
                [
                    name,
                    f"{per.get(f'{side} bytes', 0) / 1024:.1f} KiB",
                    f"{per.get(f'{side} writes', 0):.1f}",
                    f"{per.get(f'{side} syncs', 0):.1f}",
                ]
                for name, side in (("Claude Code CLI (its JSONL)", "cli"), ("checkpointer", "ours"))
            ],
        )
    )
    left, clean = killed["entries"], run["entries"]
    report.tables.append(
        Table(
            title="Transcript entries on each side: at a clean end, after a SIGKILL in a tool",
            columns=["persistence", "clean end", "after the kill", "fsyncs before the kill"],
            rows=[
                [name, str(clean[side]), str(left[side]), str(killed.get(f"{side} syncs", 0))]
                for name, side in (("Claude Code CLI (its JSONL)", "cli"), ("checkpointer", "ours"))
            ],
        )
    )
    cli_bytes = per.get("cli bytes", 0.0)
    report.ratios += [
        ratio(
            "bytes per turn, checkpointer / the CLI's JSONL",
            per.get("ours bytes", 0.0) / cli_bytes if cli_bytes else None,
            note="the mirror holds what the CLI writes, less the lines the SDK does not mirror",
        ),
        ratio(
            "syncs per turn, checkpointer (the CLI: none)",
            per.get("ours syncs", 0.0),
            ">=",
            1 / turns,  # coalesced across quick turns: at least one for the run
            note=f"the CLI: {per.get('cli syncs', 0.0):.1f}",
        ),
        ratio(
            "entries kept by a SIGKILL in a tool / at a clean end, checkpointer",
            left["ours"] / clean["ours"] if clean["ours"] else None,
            note=f"{left['ours']} of {clean['ours']}; the CLI: {left['cli']} of {clean['cli']}",
        ),
    ]
    return msgspec.to_builtins(report)  # type: ignore[no-any-return]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        root, url, config, turns = sys.argv[2:6]
        _child(root, url, config, int(turns), sys.argv[6] if len(sys.argv) > 6 else None)
    else:
        from .__main__ import render

        quick = "--quick" in sys.argv
        out = main(quick)
        print(f"== claude ({'quick' if quick else 'full'}): {out['title']}")
        print("\n".join(render("claude", out)))
