"""Case 5, event-loop stall: a 1 ms ticker while a 10 MB or 50 MB transcript is saved.

The ticker asks to wake every millisecond and records how late it is: its
worst and p99 lag while one checkpoint runs is the stall every other task of
the agent sees.  Approaches, on asyncio, same state, interleaved:

* ``checkpointer``: ``write_now(force=True)`` with ``FileStore(root)``: encode
  on the loop (msgspec holds the GIL wherever it runs), then digest and
  write in one hop;
* ``checkpointer + cache``: the same with ``FileStore(root,
  transcript=Transcript())`` over the same messages as frozen Structs (the
  same bytes on disk): each message is encoded once, at the warm-up, and
  the file is written piece by piece in the worker;
* ``msgspec on loop``: ``msgspec.json.encode`` on the loop, then the bare
  recipe in one ``to_thread`` hop;
* ``json.dumps on loop``: the same with the standard library's encoder,
  what most hand-written savers (and the naive peer) do;
* ``json.dumps in a thread``: encode and write in one executor hop, as the
  debounce peer (Home Assistant's model) does; the encoder holds the GIL;
* ``langgraph aput``: ``AsyncSqliteSaver.aput`` of the transcript (its
  serializer runs on the loop, the insert in aiosqlite's thread).

No bar of its own: the ratios say where checkpointer stands (the journal
case holds the bar on the message cache).  ``--quick`` runs 1 and 5 MiB.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import msgspec

from checkpointer import CheckpointWriter, FileStore, Snapshot, Transcript, Written

from ._harness import Report, Table, Ticker, percentile, ratio, scratch_dir, stat
from ._recipes import dumps, settled, write_floor, write_one_hop
from .bench_floor import state_of

SIZES: list[tuple[str, int]] = [("10 MiB", 10 << 20), ("50 MiB", 50 << 20)]
QUICK_SIZES: list[tuple[str, int]] = [("1 MiB", 1 << 20), ("5 MiB", 5 << 20)]
APPROACHES = (
    "checkpointer",
    "checkpointer + cache",
    "msgspec on loop",
    "json.dumps on loop",
    "json.dumps in a thread",
    "langgraph aput",
)


def _langgraph_missing() -> str | None:
    try:
        import langgraph.checkpoint.sqlite.aio  # noqa: F401
    except ImportError:
        return "langgraph-checkpoint-sqlite is not installed"
    return None


async def _measure(
    root: str, state: dict[str, Any], n: int
) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = {}
    path = os.path.join(root, "plain.json")
    frozen: dict[str, Any] = {"messages": settled(state["messages"])}  # the cached writer's
    encoder = msgspec.json.Encoder()

    async def plain_msgspec() -> None:
        await write_one_hop(path, encoder.encode(state))

    async def plain_json() -> None:
        await write_one_hop(path, dumps(state))

    def json_and_write() -> None:
        write_floor(path, dumps(state))

    async def json_in_thread() -> None:  # the debounce peer: serialise in the executor
        await anyio.to_thread.run_sync(json_and_write)

    async with contextlib.AsyncExitStack() as stack:
        writer = await stack.enter_async_context(
            CheckpointWriter(
                functools.partial(Snapshot, "stall", state),
                FileStore(root),
                write_on_start=False,
                exit_hooks=False,
            )
        )
        cached_writer = await stack.enter_async_context(
            CheckpointWriter(
                functools.partial(Snapshot, "stall-cached", frozen),
                FileStore(root),
                transcript=Transcript(repair=False, fingerprint=False),
                write_on_start=False,
                exit_hooks=False,
            )
        )

        async def ours() -> None:
            result = await writer.write_now(force=True)
            assert isinstance(result, Written), result

        async def ours_cached() -> None:
            result = await cached_writer.write_now(force=True)
            assert isinstance(result, Written), result

        jobs: dict[str, Callable[[], Awaitable[None]]] = {
            "checkpointer": ours,
            "checkpointer + cache": ours_cached,
            "msgspec on loop": plain_msgspec,
            "json.dumps on loop": plain_json,
            "json.dumps in a thread": json_in_thread,
        }
        if _langgraph_missing() is None:
            from langgraph.checkpoint.base import empty_checkpoint
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

            saver = await stack.enter_async_context(
                AsyncSqliteSaver.from_conn_string(os.path.join(root, "lg.sqlite"))
            )
            await saver.setup()
            config: Any = {"configurable": {"thread_id": "stall", "checkpoint_ns": ""}}

            async def langgraph() -> None:
                nonlocal config
                checkpoint = empty_checkpoint()
                checkpoint["channel_values"] = {"messages": state["messages"]}
                config = await saver.aput(config, checkpoint, {}, {})

            jobs["langgraph aput"] = langgraph
        for name in jobs:
            out[name] = []
        ticker = Ticker()
        async with anyio.create_task_group() as tg:
            await tg.start(ticker.run)
            for job in jobs.values():  # warm-up; fills the cache, as a long session has
                await job()
            for i in range(n):
                names = list(jobs) if i % 2 == 0 else list(reversed(jobs))
                for name in names:
                    state["rev"] = frozen["rev"] = i
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
    for label, nbytes in QUICK_SIZES if quick else SIZES:
        n = 2 if quick else 3 if nbytes > 20 << 20 else 5
        state = state_of(nbytes)
        with scratch_dir("stall-") as root:
            out = anyio.run(_measure, root, state, n)
        worst = {name: stat([w for w, _ in out[name]]) for name in out}
        p99 = {name: stat([p for _, p in out[name]]) for name in out}
        for name in APPROACHES:
            if name not in out:
                rows.append([label, name, f"not run: {_langgraph_missing()}"])
                continue
            rows.append([label, name, worst[name], p99[name], n])
            report.series[f"stall/one {label} checkpoint/{name}"] = [
                (nbytes / (1 << 20), worst[name])
            ]
        pairs = [("checkpointer", base) for base in APPROACHES[2:]]
        pairs += [
            ("checkpointer + cache", "checkpointer"),
            ("checkpointer + cache", "msgspec on loop"),
        ]
        for ours, base in pairs:
            report.ratios.append(
                ratio(
                    f"{label}: worst stall {ours} / {base}",
                    worst[ours].median / worst[base].median if base in worst else None,
                    note="" if base in worst else f"not run: {_langgraph_missing()}",
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
