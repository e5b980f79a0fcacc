"""The README's aiofiles figure: a durable atomic 1 KiB write, nine hops vs one.

The same recipe (temp file, write, fsync, close, replace, directory fsync)
awaited step by step through aiofiles, against the whole recipe in one
``anyio.to_thread.run_sync`` hop as checkpointer does it; interleaved, on
asyncio (aiofiles does not run under trio).  On the disk under test, and on
``/dev/shm`` where fsync costs nothing, which isolates the hops.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

import anyio
import msgspec

from ._harness import Report, Table, paired, ratio, scratch_dir, stat
from ._recipes import aiofiles_hops, write_aiofiles, write_one_hop

PAYLOAD = os.urandom(1024)


async def _pairs(root: str, n: int) -> tuple[list[float], list[float]]:
    step_path = os.path.join(root, "aiofiles.json")
    hop_path = os.path.join(root, "one-hop.json")
    steps: list[float] = []
    hops: list[float] = []
    for _ in range(3):  # warm-up: the executors' threads
        await write_aiofiles(step_path, PAYLOAD)
        await write_one_hop(hop_path, PAYLOAD)
    for i in range(n):
        for turn in (0, 1) if i % 2 else (1, 0):
            t0 = time.perf_counter()
            if turn == 0:
                await write_aiofiles(step_path, PAYLOAD)
                steps.append(time.perf_counter() - t0)
            else:
                await write_one_hop(hop_path, PAYLOAD)
                hops.append(time.perf_counter() - t0)
    return steps, hops


def main(quick: bool) -> dict[str, Any]:
    try:
        import aiofiles  # noqa: F401
    except ImportError:
        report = Report(title="aiofiles step by step vs one thread hop")
        report.ratios.append(
            ratio("1 KiB on disk: aiofiles / one hop", None, note="aiofiles is not installed")
        )
        return msgspec.to_builtins(report)  # type: ignore[no-any-return]
    n = 15 if quick else 61
    rows: list[list[Any]] = []
    report = Report(title=f"aiofiles step by step ({aiofiles_hops()} hops) vs one thread hop")
    places: list[tuple[str, str | None]] = [("disk", None)]
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        places.append(("tmpfs", "/dev/shm"))
    for place, base in places:
        if base is None:
            with scratch_dir("aiofiles-") as root:
                steps, hops = anyio.run(_pairs, root, n, backend="asyncio")
        else:
            with tempfile.TemporaryDirectory(dir=base) as root:
                steps, hops = anyio.run(_pairs, root, n, backend="asyncio")
        s_steps, s_hops = stat(steps), stat(hops)
        rows.append([f"1 KiB on {place}", s_steps, s_hops, s_steps.median - s_hops.median, n])
        report.ratios.append(
            ratio(
                f"1 KiB on {place}: aiofiles / one hop",
                paired(steps, hops),
                note=(
                    f"median of {n} pairs; medians {s_steps.median * 1e3:.2f} ms "
                    f"vs {s_hops.median * 1e3:.2f} ms"
                ),
            )
        )
    report.tables.append(
        Table(
            title="durable atomic replace of a 1 KiB file (asyncio)",
            columns=[
                "write",
                "aiofiles step by step",
                "one to_thread hop",
                "difference",
                "repeats",
            ],
            rows=rows,
        )
    )
    return msgspec.to_builtins(report)  # type: ignore[no-any-return]
