"""Case: the prepare step's cost follows the messages added, not the history.

``transcript_prepare()`` keeps, per key, the scan of the history's settled
prefix (frozen Struct messages): a checkpoint that adds a message compares
the prefix by identity (one list ``==``, in C) and scans only the new
message.  Measured at 100 and 100,000 messages of a tool-using agent
(``ChatMessage`` Structs, ~300 B each), sizes interleaved:

1. **prepare alone** after appending one message, per call, against the
   floor any exact check pays (one list ``==`` of the history's references)
   and against a full scan (``validate_history``, what every checkpoint paid
   before).  Also the first call after the history changed (a full rescan)
   and an append that leaves a tool call open (closed on a copy, which
   copies the list).
2. **a journal checkpoint with prepare** (``await write_now()`` with
   ``JournalStore`` and ``transcript=Transcript()``, fsync included)
   after appending one message: the issue-4 promise, within 2x from 100 to
   100,000 messages.

Also ``python -m benchmarks.bench_prepare [--quick]``.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
import timeit
from typing import Any

import anyio
import msgspec

from checkpointer import CheckpointWriter, JournalStore, Snapshot, Transcript, Written
from checkpointer._transcript.prepare import transcript_prepare
from checkpointer.messages import ChatMessage, ToolCall, ToolFunction, validate_history

from ._harness import Report, Table, paired, ratio, scratch_dir, stat

SIZES = (100, 100_000)
CHECKPOINT_LIMIT = 2.0  # journal checkpoint with prepare, @100,000 over @100
FLOOR_LIMIT = 2.0  # prepare @100,000 over one list == of 100,000 references
SPEEDUP_BAR = 100.0  # a full scan @100,000 over prepare after an append


def history(n: int) -> list[ChatMessage]:
    """``n`` messages: a question, a tool call, its result, an answer, again."""
    out: list[ChatMessage] = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            out.append(ChatMessage(role="user", content=f"question {i}: " + "q" * 60))
        elif kind == 1:
            call = ToolCall(id=f"c{i}", function=ToolFunction(name="search", arguments="{}"))
            out.append(ChatMessage(role="assistant", tool_calls=(call,)))
        elif kind == 2:
            out.append(ChatMessage(role="tool", tool_call_id=f"c{i - 1}", content="r" * 200))
        else:
            out.append(ChatMessage(role="assistant", content="answer " * 40))
    return out


def _more(count: int, *, open_call: bool = False) -> list[ChatMessage]:
    if open_call:
        function = ToolFunction(name="search")
        return [
            ChatMessage(role="assistant", tool_calls=(ToolCall(id=f"x{j}", function=function),))
            for j in range(count)
        ]
    return [ChatMessage(role="user", content=f"more {j}") for j in range(count)]


class _Session:
    """One history and its prepare step; samples of appends, back to ``n`` between."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.messages = history(n)
        self.copy = list(self.messages)  # for the floor: same references, another list
        self.snapshot = Snapshot("bench", {"messages": self.messages})
        self.prepare = transcript_prepare()
        self.prepare(self.snapshot)

    def appends(self, extra: list[ChatMessage]) -> float:
        """Seconds per append + prepare; each call sees one new message."""
        prepare, snapshot, messages = self.prepare, self.snapshot, self.messages
        started = time.perf_counter()
        for message in extra:
            messages.append(message)
            prepare(snapshot)
        return (time.perf_counter() - started) / len(extra)

    def open_calls(self, calls: list[ChatMessage]) -> float:
        """Seconds per append of a tool call (closed on a copy) + prepare, then pop."""
        prepare, snapshot, messages = self.prepare, self.snapshot, self.messages
        started = time.perf_counter()
        for message in calls:
            messages.append(message)
            prepare(snapshot)
            messages.pop()
        return (time.perf_counter() - started) / len(calls)

    def rescan(self) -> float:
        """Back to ``n`` messages: the prefix no longer matches, so a full rescan (timed)."""
        del self.messages[self.n :]
        started = time.perf_counter()
        self.prepare(self.snapshot)
        return time.perf_counter() - started

    def floor(self, number: int) -> float:
        messages, copy = self.messages, self.copy
        return timeit.timeit(lambda: messages == copy, number=number) / number

    def full_scan(self) -> float:
        started = time.perf_counter()
        validate_history(self.messages)
        return time.perf_counter() - started


def measure_prepare(*, quick: bool) -> dict[str, Any]:
    """Samples per size: append, open-call append, floor, rescan, full scan."""
    repeats, number = (5, 50) if quick else (21, 50)
    sessions = {n: _Session(n) for n in SIZES}
    names = ("append", "open call", "floor", "rescan", "full scan")
    samples: dict[int, dict[str, list[float]]] = {n: {k: [] for k in names} for n in SIZES}
    extra, calls = _more(number), _more(10, open_call=True)
    for _ in range(repeats):
        for n, session in sessions.items():
            got = samples[n]
            got["append"].append(session.appends(extra))
            got["rescan"].append(session.rescan())  # back to n messages
            got["floor"].append(session.floor(20))
            got["open call"].append(session.open_calls(calls))
            got["full scan"].append(session.full_scan())
    return {"samples": samples}


async def _checkpoints(root: str, repeats: int) -> dict[int, list[float]]:
    """Seconds of ``write_now()`` with a journal and prepare, one message added each."""
    times: dict[int, list[float]] = {n: [] for n in SIZES}
    async with contextlib.AsyncExitStack() as stack:
        writers = []
        for n in SIZES:
            messages = history(n)
            snapshot = Snapshot(f"s{n}", {"title": f"s{n}", "messages": messages})
            writer = CheckpointWriter(
                lambda s=snapshot: s,  # type: ignore[misc]
                JournalStore(root),
                transcript=Transcript(fingerprint=False),  # the prepare step, every write
                exit_hooks=False,
            )
            await stack.enter_async_context(writer)
            messages.append(ChatMessage(role="user", content="warm-up"))
            await writer.write_now()  # the whole session once, and its prefix scanned
            writers.append((n, messages, writer))
        for i in range(repeats):
            for n, messages, writer in writers:
                messages.append(ChatMessage(role="user", content=f"more {i}"))
                started = time.perf_counter()
                result = await writer.write_now()
                times[n].append(time.perf_counter() - started)
                if not isinstance(result, Written):
                    raise RuntimeError(f"checkpoint did not write: {result!r}")
    return times


def main(quick: bool) -> dict[str, Any]:
    small, large = SIZES
    got = measure_prepare(quick=quick)["samples"]
    with scratch_dir("prepare-") as root:
        checkpoints = anyio.run(_checkpoints, root, 11 if quick else 41)

    def row(n: int) -> list[Any]:
        s = got[n]
        return [
            n,
            stat(s["append"]),
            stat(s["floor"]),
            stat(s["open call"]),
            stat(s["rescan"]),
            stat(s["full scan"]),
            stat(checkpoints[n]),
        ]

    report = Report(
        title="Transcript prepare: cost of a checkpoint that adds one message",
        tables=[
            Table(
                title="seconds per call, median [p10-p90]",
                columns=[
                    "messages",
                    "prepare after 1 append",
                    "floor: one list ==",
                    "append leaving a call open",
                    "first call after an edit",
                    "full scan (before)",
                    "journal checkpoint + prepare",
                ],
                rows=[row(n) for n in SIZES],
            )
        ],
    )
    append = {n: statistics.median(got[n]["append"]) for n in SIZES}
    report.ratios.append(
        ratio(
            f"prepare after 1 append @{large:,} vs @{small:,} msgs",
            append[large] / append[small],
            note="an exact check reads each of the history's references once, "
            "~1 ns a message: see the floor ratio",
        )
    )
    report.ratios.append(
        ratio(
            f"prepare after 1 append @{large:,} / one list == of {large:,} references",
            paired(got[large]["append"], got[large]["floor"]),
            "<=",
            FLOOR_LIMIT,
        )
    )
    report.ratios.append(
        ratio(
            f"full scan / prepare after 1 append @{large:,} msgs",
            paired(got[large]["full scan"], got[large]["append"]),
            ">=",
            SPEEDUP_BAR,
        )
    )
    report.ratios.append(
        ratio(
            f"journal checkpoint + prepare @{large:,} vs @{small:,} msgs",
            statistics.median(checkpoints[large]) / statistics.median(checkpoints[small]),
            "<=",
            CHECKPOINT_LIMIT,
        )
    )
    return msgspec.to_builtins(report)  # type: ignore[no-any-return]


if __name__ == "__main__":
    figures = main(quick="--quick" in sys.argv)
    columns = figures["tables"][0]["columns"]
    for values in figures["tables"][0]["rows"]:
        print(f"{values[0]:>10,} messages:")
        for name, cell in zip(columns[1:], values[1:], strict=True):
            print(f"    {name:<30} {cell['median'] * 1e6:12.1f} us")
    for line in figures["ratios"]:
        bar = f"bar {line['op']} {line['bar']}x: {'met' if line['ok'] else 'MISSED'}"
        print(f"{line['name']}: {line['value']:.2f}x ({bar if line['bar'] else 'no bar'})")
    sys.exit(0 if all(line["ok"] is not False for line in figures["ratios"]) else 1)
