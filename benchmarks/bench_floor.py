"""Case 3, the floor: one full checkpoint end to end against the bare recipe.

A checkpoint here is ``await writer.write_now(force=True)``: snapshot,
encode (on the loop), one worker-thread hop, content digest, join, temp
write, fsync, replace, directory fsync.  The floor writes the very bytes of
that checkpoint file with bare ``os`` calls on the calling thread.  Both
run interleaved in the same process, alternating which goes first.  The bar:
the checkpoint, less the encode (measured on its own and reported), within
1.2x the floor.  The digest and join rows show where the rest goes.
``--quick`` runs 1 KiB to 5 MiB instead of 1 KiB to 50 MiB.
"""

from __future__ import annotations

import functools
import hashlib
import os
import time
from datetime import UTC, datetime
from typing import Any, Literal

import anyio
import msgspec

from checkpointer import CheckpointWriter, FileStore, Snapshot, Written
from checkpointer._format import Meta, envelope_chunks

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


_EPOCH = datetime(2025, 1, 1, tzinfo=UTC)


def _side_costs(state: dict[str, Any], n: int) -> dict[str, list[float]]:
    """Encode, digest and join of this state, each on its own."""
    encoder = msgspec.json.Encoder()
    out: dict[str, list[float]] = {"encode": [], "digest": [], "join": []}
    meta = Meta(key="floor", seq=1, created_at=_EPOCH, updated_at=_EPOCH, live=True)
    for _ in range(n):
        t0 = time.perf_counter()
        encoded = encoder.encode(state)
        t1 = time.perf_counter()
        hashlib.blake2b(encoded, digest_size=16).digest()
        t2 = time.perf_counter()
        b"".join(envelope_chunks(meta, encoded))
        t3 = time.perf_counter()
        out["encode"].append(t1 - t0)
        out["digest"].append(t2 - t1)
        out["join"].append(t3 - t2)
    return out


def _source(state: dict[str, Any]) -> Snapshot:
    return Snapshot("floor", state)


async def _async_pairs(root: str, state: dict[str, Any], n: int) -> tuple[list[float], list[float]]:
    ours: list[float] = []
    floor: list[float] = []
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
    return ours, floor


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
    for label, nbytes in QUICK_SIZES if quick else SIZES:
        state = state_of(nbytes)
        n = repeats(nbytes, quick)
        with scratch_dir("floor-") as root:
            if mode == "write_now":
                ours, floor = anyio.run(_async_pairs, root, state, n)
            else:
                ours, floor = _sync_pairs(root, state, n)
            file_bytes = os.path.getsize(os.path.join(root, "floor.json"))
        side = _side_costs(state, max(3, n // 2))
        s_ours, s_floor = stat(ours), stat(floor)
        s_encode, s_digest, s_join = (stat(side[k]) for k in ("encode", "digest", "join"))
        rows.append([label, file_bytes, s_ours, s_floor, s_encode, s_digest, s_join, n])
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
                "encode (on loop)",
                "blake2b digest",
                "join",
                "repeats",
            ],
            rows=rows,
        )
    )
    return report


def main(quick: bool) -> dict[str, Any]:
    report = measure(quick, "write_now")
    report.title = "The floor: one full checkpoint end to end vs the bare recipe"
    report.notes.append(
        "the digest (blake2b of the encoded state, to skip unchanged writes) and the join "
        "run in the worker thread on every write; the floor has neither"
    )
    return msgspec.to_builtins(report)  # type: ignore[no-any-return]
