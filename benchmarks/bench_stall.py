"""Case 5, event-loop stall: a 1 ms ticker while a 10 MB or 50 MB transcript is saved.

The ticker asks to wake every millisecond and records how late it is: its
worst and p99 lag while one checkpoint runs is the stall every other task of
the agent sees.  Approaches, on asyncio, same state, interleaved:

* ``checkpointer``: ``write_now(force=True)``: encode on the loop (msgspec
  holds the GIL wherever it runs), digest, join and write in one hop;
* ``msgspec on loop``: ``msgspec.json.encode`` on the loop, then the bare
  recipe in one ``to_thread`` hop;
* ``json.dumps on loop``: the same with the standard library's encoder,
  what most hand-written savers do.

No bar of its own: the ratios say where checkpointer stands; the journal
issue's message cache is what is meant to cut this stall.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import msgspec

from checkpointer import CheckpointWriter, FileStore, Snapshot, Written

from ._harness import Report, Table, Ticker, percentile, ratio, scratch_dir, stat
from ._recipes import dumps, write_one_hop
from .bench_floor import state_of

SIZES: list[tuple[str, int]] = [("10 MiB", 10 << 20), ("50 MiB", 50 << 20)]
APPROACHES = ("checkpointer", "msgspec on loop", "json.dumps on loop")


async def _measure(
    root: str, state: dict[str, Any], n: int
) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = {name: [] for name in APPROACHES}
    path = os.path.join(root, "plain.json")
    encoder = msgspec.json.Encoder()

    async def plain_msgspec() -> None:
        await write_one_hop(path, encoder.encode(state))

    async def plain_json() -> None:
        await write_one_hop(path, dumps(state))

    async with CheckpointWriter(
        functools.partial(Snapshot, "stall", state),
        FileStore(root),
        write_on_start=False,
        exit_hooks=False,
    ) as writer:

        async def ours() -> None:
            result = await writer.write_now(force=True)
            assert isinstance(result, Written), result

        jobs: dict[str, Callable[[], Awaitable[None]]] = {
            "checkpointer": ours,
            "msgspec on loop": plain_msgspec,
            "json.dumps on loop": plain_json,
        }
        ticker = Ticker()
        async with anyio.create_task_group() as tg:
            await tg.start(ticker.run)
            for job in jobs.values():  # warm-up
                await job()
            for i in range(n):
                names = list(jobs) if i % 2 == 0 else list(reversed(jobs))
                for name in names:
                    state["rev"] = i
                    await anyio.sleep(0.01)  # let the ticker settle
                    mark = ticker.mark()
                    await jobs[name]()
                    await anyio.sleep(0.002)  # the lag of the last tick lands after the job
                    lags = sorted(ticker.since(mark))
                    out[name].append((lags[-1] if lags else 0.0, percentile(lags, 0.99)))
            ticker.stop()
    return out


def main(quick: bool) -> dict[str, Any]:
    report = Report(title="Event-loop stall: 1 ms ticker lag while one checkpoint runs")
    rows: list[list[Any]] = []
    for label, nbytes in SIZES:
        n = (1 if quick else 3) if nbytes > 20 << 20 else (2 if quick else 5)
        state = state_of(nbytes)
        with scratch_dir("stall-") as root:
            out = anyio.run(_measure, root, state, n)
        worst = {name: stat([w for w, _ in out[name]]) for name in APPROACHES}
        p99 = {name: stat([p for _, p in out[name]]) for name in APPROACHES}
        for name in APPROACHES:
            rows.append([label, name, worst[name], p99[name], n])
            report.series[f"stall/one {label} checkpoint/{name}"] = [
                (nbytes / (1 << 20), worst[name])
            ]
        for base in APPROACHES[1:]:
            report.ratios.append(
                ratio(
                    f"{label}: worst stall checkpointer / {base}",
                    worst["checkpointer"].median / worst[base].median,
                    note="no bar (the journal issue's cache aims at <= 0.2)",
                )
            )
    report.tables.append(
        Table(
            title="ticker lag while one checkpoint of the transcript runs (asyncio)",
            columns=["transcript", "approach", "worst lag", "p99 lag", "repeats"],
            rows=rows,
        )
    )
    return msgspec.to_builtins(report)  # type: ignore[no-any-return]
