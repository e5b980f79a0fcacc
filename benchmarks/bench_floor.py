"""Case 3, the floor: one full checkpoint end to end against the bare recipe.

A checkpoint here is ``await writer.write_now(force=True)``: snapshot,
encode (on the loop), one worker-thread hop, then the durable write: temp
file, the envelope and state pieces handed to ``os.writev`` (never joined),
fsync, replace, directory fsync.  The unchanged check compares the encoded
bytes themselves (a SHA-256 digest only for states above 64 MiB, which none
of the sizes here reaches).  The floor writes the very bytes of that
checkpoint file with bare ``os`` calls on the calling thread.  Both run
interleaved in the same process, alternating which goes first.  The bar:
the checkpoint, less the encode (measured on its own and reported), within
1.2x the floor.  The thread-hop column (the median round trip of an empty
``anyio.to_thread.run_sync``, timed in the same run) is what the writer adds
on top of the floor besides the encode.
``--quick`` runs 1 KiB to 5 MiB instead of 1 KiB to 50 MiB.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any, Literal

import anyio
import msgspec

from checkpointer import CheckpointWriter, FileStore, Snapshot, Written
from checkpointer._stores.envelopes import KEEP_BYTES

from ._harness import Report, Table, paired, ratio, scratch_dir, stat
from ._recipes import transcript_of, write_floor

SIZES: list[tuple[str, int]] = [
    ("1 KiB", 1 << 10),
    ("100 KiB", 100 << 10),
    ("10 MiB", 10 << 20),
    ("50 MiB", 50 << 20),
]
QUICK_SIZES: list[tuple[str, int]] = [  # the same code paths, a tenth of the bytes
    ("1 KiB", 1 << 10),
    ("100 KiB", 100 << 10),
    ("1 MiB", 1 << 20),
    ("5 MiB", 5 << 20),
]

Mode = Literal["write_now", "flush_sync"]


def repeats(nbytes: int, quick: bool) -> int:
    if quick:
        return 5 if nbytes <= 1 << 20 else 3
    return {1 << 10: 41, 100 << 10: 31, 10 << 20: 11}.get(nbytes, 7)


@functools.cache
def state_of(nbytes: int) -> dict[str, Any]:
    """The transcript of about ``nbytes`` shared by the cases (built once)."""
    return transcript_of(nbytes)


HOPS_PER_PAIR = 3  # empty thread hops timed after each pair (cheap; a steadier median)


def _encode_costs(state: dict[str, Any], n: int) -> list[float]:
    """The encode of this state on its own, ``n`` times."""
    encoder = msgspec.json.Encoder()
    out: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter()
        encoder.encode(state)
        out.append(time.perf_counter() - t0)
    return out


def _nothing() -> None:
    return None


def _source(state: dict[str, Any]) -> Snapshot:
    return Snapshot("floor", state)


async def _async_pairs(
    root: str, state: dict[str, Any], n: int
) -> tuple[list[float], list[float], list[float]]:
    """Paired write_now / floor times, and the round trips of an empty thread hop."""
    ours: list[float] = []
    floor: list[float] = []
    hops: list[float] = []
    store = FileStore(root)
    floor_path = os.path.join(root, "floor.json")
    async with CheckpointWriter(
        functools.partial(_source, state), store, write_on_start=False, exit_hooks=False
    ) as writer:
        first = await writer.write_now(force=True)  # warm-up; makes the file
        assert isinstance(first, Written), first
        data = store.read("floor")
        assert data is not None
        write_floor(floor_path, data)  # warm-up
        for i in range(n):
            state["rev"] = i
            for turn in (0, 1) if i % 2 else (1, 0):
                t0 = time.perf_counter()
                if turn == 0:
                    result = await writer.write_now(force=True)
                    assert isinstance(result, Written), result
                    ours.append(time.perf_counter() - t0)
                else:
                    write_floor(floor_path, data)
                    floor.append(time.perf_counter() - t0)
            for _ in range(HOPS_PER_PAIR):
                t0 = time.perf_counter()
                await anyio.to_thread.run_sync(_nothing)
                hops.append(time.perf_counter() - t0)
    return ours, floor, hops


def _sync_pairs(root: str, state: dict[str, Any], n: int) -> tuple[list[float], list[float]]:
    ours: list[float] = []
    floor: list[float] = []
    store = FileStore(root)
    floor_path = os.path.join(root, "floor.json")
    writer: CheckpointWriter[Snapshot] = CheckpointWriter(
        functools.partial(_source, state), store, write_on_start=False, exit_hooks=False
    )
    with writer:
        state["rev"] = -1
        first = writer.flush_sync()  # warm-up; makes the file
        assert isinstance(first, Written), first
        with open(store.location("floor"), "rb") as f:
            data = f.read()
        write_floor(floor_path, data)
        for i in range(n):
            state["rev"] = i  # a change, or flush_sync would skip as unchanged
            for turn in (0, 1) if i % 2 else (1, 0):
                t0 = time.perf_counter()
                if turn == 0:
                    result = writer.flush_sync()
                    assert isinstance(result, Written), result
                    ours.append(time.perf_counter() - t0)
                else:
                    write_floor(floor_path, data)
                    floor.append(time.perf_counter() - t0)
    return ours, floor


def measure(quick: bool, mode: Mode) -> Report:
    what = "write_now(force=True)" if mode == "write_now" else "flush_sync()"
    rows: list[list[Any]] = []
    report = Report(title="")
    largest = 0
    for label, nbytes in QUICK_SIZES if quick else SIZES:
        state = state_of(nbytes)
        n = repeats(nbytes, quick)
        hops: list[float] = []
        with scratch_dir("floor-") as root:
            if mode == "write_now":
                ours, floor, hops = anyio.run(_async_pairs, root, state, n)
            else:
                ours, floor = _sync_pairs(root, state, n)
            file_bytes = os.path.getsize(os.path.join(root, "floor.json"))
        largest = max(largest, file_bytes)
        s_ours, s_floor = stat(ours), stat(floor)
        s_encode = stat(_encode_costs(state, max(3, n // 2)))
        hop_cell: list[Any] = [stat(hops)] if mode == "write_now" else []
        rows.append([label, file_bytes, s_ours, s_floor, s_encode, *hop_cell, n])
        # Pairs ran back to back; the median of their ratios cancels the
        # disk's drift (fsync latency on a shared disk moves by 10x).
        value = paired([t - s_encode.median for t in ours], floor)
        report.ratios.append(
            ratio(
                f"{label}: ({what} - encode) / floor",
                value,
                "<=",
                1.2,
                note=(
                    f"median of {n} pairs; with encode {paired(ours, floor):.2f}x; "
                    f"medians {s_ours.median / s_floor.median:.2f}x"
                ),
            )
        )
        report.series[f"floor/{mode}/{label}"] = [(float(file_bytes), s_ours)]
    report.tables.append(
        Table(
            title=f"one checkpoint: {what} vs the floor (bare os recipe), same bytes",
            columns=[
                "state",
                "file bytes",
                what,
                "floor",
                "encode (on loop)" if mode == "write_now" else "encode (calling thread)",
                *(["thread hop"] if mode == "write_now" else []),
                "repeats",
            ],
            rows=rows,
        )
    )
    if largest <= KEEP_BYTES:
        report.notes.append(
            f"SHA-256 digest: none below {KEEP_BYTES >> 20} MiB; the writer compares an "
            "unchanged state byte for byte up to that size, so no digest runs at these sizes"
        )
    else:
        report.notes.append(
            f"states above {KEEP_BYTES >> 20} MiB are also SHA-256 digested to compare "
            "an unchanged state; that cost is not broken out here"
        )
    report.notes.append(
        "the pieces (envelope and state) go to os.writev as they are; nothing is joined"
    )
    return report


def main(quick: bool) -> dict[str, Any]:
    report = measure(quick, "write_now")
    report.title = "The floor: one full checkpoint end to end vs the bare recipe"
    report.notes.append(
        "thread hop: the median round trip of an empty anyio.to_thread.run_sync in the "
        "same run; besides the encode it is what write_now adds on top of the floor, "
        "which writes on the calling thread"
    )
    return msgspec.to_builtins(report)  # type: ignore[no-any-return]
