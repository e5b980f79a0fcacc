"""Case 7, cost growth: one checkpoint that adds one message, against history length.

For each store in ``STORES``: a writer over a transcript of N messages
(about 200 bytes each, frozen Structs, so the message cache can keep their
bytes); append one message, ``await write_now()``, time it end to end.  A
store whose cost follows the size of the change stays flat; one that
rewrites the whole session grows with N.  Adding a store is one entry in
``STORES``.

* ``FileStore``: the whole state encoded on the loop, the file rewritten;
* ``FileStore+Transcript``: each message encoded once (the cache), the file
  still rewritten whole, piece by piece in the worker;
* ``JournalStore``: the new message appended (one write, one fsync).

The lengths of a store are timed interleaved (one checkpoint at each, round
after round), so the disk's drift hits them alike.  ``--quick`` stops at
10,000 messages.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable
from typing import Any

import anyio
import msgspec

from checkpointer import CheckpointWriter, FileStore, JournalStore, Snapshot, Transcript, Written
from checkpointer.stores import Store

from ._harness import Report, Table, ratio, scratch_dir, stat
from ._recipes import SettledMessage, message, settled, transcript

STORES: list[tuple[str, Callable[[str], Store], float | None]] = [
    ("FileStore", FileStore, None),
    ("FileStore+Transcript", FileStore, None),
    ("JournalStore", JournalStore, 2.0),
]
"""(name, factory of a store rooted in a scratch directory, bar on its growth ratio).

A name with ``+Transcript`` gives its writer a transcript: the message cache only.
"""

LENGTHS = (100, 1_000, 10_000, 100_000)
QUICK_LENGTHS = (100, 1_000, 10_000)  # the same code paths, a tenth of the bytes
SIZE = 200


def lengths(quick: bool) -> tuple[int, ...]:
    return QUICK_LENGTHS if quick else LENGTHS


def repeats(n: int, quick: bool, *, flat: bool = False) -> int:
    """Checkpoints timed at ``n`` messages; a store meant to stay ``flat`` is cheap at any n."""
    if quick:
        return 3
    return 21 if flat or n <= 1_000 else 11 if n <= 10_000 else 7


async def _measure(
    factory: Callable[[str], Store],
    root: str,
    histories: dict[int, list[SettledMessage]],
    reps: dict[int, int],
    cached: bool,
) -> dict[int, list[float]]:
    """Time checkpoints at every length, interleaved: the disk's drift hits them alike."""
    out: dict[int, list[float]] = {n: [] for n in histories}
    sessions: list[tuple[int, list[SettledMessage], CheckpointWriter[Snapshot]]] = []
    async with contextlib.AsyncExitStack() as stack:
        for n, history in histories.items():
            messages = list(history)  # the same message objects for every store
            writer = CheckpointWriter(
                functools.partial(_snapshot, messages),
                factory(os.path.join(root, str(n))),
                transcript=Transcript(repair=False, fingerprint=False) if cached else None,
                exit_hooks=False,
            )  # write_on_start writes the history once: the warm-up (and fills the cache)
            await stack.enter_async_context(writer)
            sessions.append((n, messages, writer))
        for round_ in range(max(reps.values())):
            for n, messages, writer in sessions if round_ % 2 else reversed(sessions):
                if round_ >= reps[n]:
                    continue
                messages.append(settled([message(len(messages), SIZE)])[0])
                t0 = time.perf_counter()
                result = await writer.write_now()
                out[n].append(time.perf_counter() - t0)
                assert isinstance(result, Written), result
    return out


def _snapshot(messages: list[SettledMessage]) -> Snapshot:
    return Snapshot("growth", {"messages": messages})


def main(quick: bool) -> dict[str, Any]:
    report = Report(title="Cost growth: one checkpoint adding one message, vs history length")
    rows: list[list[Any]] = []
    sizes = lengths(quick)
    histories = {n: settled(transcript(n, SIZE)) for n in sizes}
    for name, factory, bar in STORES:
        reps = {n: repeats(n, quick, flat=bar is not None) for n in sizes}
        with scratch_dir("growth-") as root:
            cached = name.endswith("+Transcript")
            samples = anyio.run(_measure, factory, root, histories, reps, cached)
        series = [(float(n), stat(samples[n])) for n in sizes]
        rows += [[name, int(x), s, len(samples[int(x)])] for x, s in series]
        report.series[f"growth/{name}"] = series
        first, last = series[0][1].median, series[-1][1].median
        report.ratios.append(
            ratio(
                f"{name}: cost @{sizes[-1]:,} / @{sizes[0]:,} messages",
                last / first,
                "<=" if bar is not None else "",
                bar,
                note="the cost follows the change; sizes interleaved"
                if bar
                else "a whole-file store: grows with it",
            )
        )
    report.tables.append(
        Table(
            title=f"write_now() after appending one message of ~{SIZE} B",
            columns=["store", "messages", "checkpoint cost", "repeats"],
            rows=rows,
        )
    )
    return msgspec.to_builtins(report)  # type: ignore[no-any-return]
