"""Case 7, cost growth: one checkpoint that adds one message, against history length.

For each store in ``STORES``: a writer over a transcript of N messages
(about 200 bytes each); append one message, ``await write_now()``, time it
end to end.  A store whose cost follows the size of the change stays flat;
one that rewrites the whole session grows with N.  Adding a store is one
entry in ``STORES``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio
import msgspec

from checkpointer import CheckpointWriter, FileStore, Snapshot, Store, Written

from ._harness import Report, Table, ratio, scratch_dir, stat
from ._recipes import message, transcript

STORES: list[tuple[str, Callable[[str], Store]]] = [
    ("FileStore", FileStore),
]
"""(name, factory of a store rooted in a scratch directory)."""

LENGTHS = (100, 1_000, 10_000, 100_000)
SIZE = 200


def repeats(n: int, quick: bool) -> int:
    if quick:
        return 3 if n < 100_000 else 2
    return 21 if n <= 1_000 else 11 if n <= 10_000 else 7


async def _measure(store: Store, n: int, reps: int) -> list[float]:
    messages = transcript(n, SIZE)
    out: list[float] = []
    async with CheckpointWriter(
        lambda: Snapshot("growth", {"messages": messages}), store, exit_hooks=False
    ) as writer:  # write_on_start writes the history once: the warm-up
        for _ in range(reps):
            messages.append(message(len(messages), SIZE))
            t0 = time.perf_counter()
            result = await writer.write_now()
            out.append(time.perf_counter() - t0)
            assert isinstance(result, Written), result
    return out


def main(quick: bool) -> dict[str, Any]:
    report = Report(title="Cost growth: one checkpoint adding one message, vs history length")
    rows: list[list[Any]] = []
    for name, factory in STORES:
        series = []
        for n in LENGTHS:
            with scratch_dir("growth-") as root:
                samples = anyio.run(_measure, factory(root), n, repeats(n, quick))
            s = stat(samples)
            series.append((float(n), s))
            rows.append([name, n, s, len(samples)])
        report.series[f"growth/{name}"] = series
        first, last = series[0][1].median, series[-1][1].median
        report.ratios.append(
            ratio(
                f"{name}: cost @{LENGTHS[-1]:,} / @{LENGTHS[0]:,} messages",
                last / first,
                note="no bar for a whole-file store (the journal issue: <= 2x)",
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
