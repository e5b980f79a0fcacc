"""Case 3, the floor: one full checkpoint end to end against the bare recipe.

A checkpoint here is ``await writer.write_now(force=True)``: snapshot,
encode (on the loop), one worker-thread hop, then the durable write: temp
file, the envelope and state pieces handed to ``os.writev`` (never joined),
fsync, replace, directory fsync.  The unchanged check compares the encoded
bytes themselves (their last 4 KiB first; a SHA-256 digest only for states
above 64 MiB, which none of the sizes here reaches).  The floor writes the
very bytes of that checkpoint file with bare ``os`` calls on the calling
thread.  Both run interleaved in the same process, alternating which goes
first.  The bar: the checkpoint, less the encode (measured on its own and
reported), within 1.1x the floor plus one empty thread hop (``anyio.
to_thread.run_sync`` of a no-op, timed right after each pair): the hop is
what an async write must pay, the rest is the writer's own overhead.

The breakdown table says where that overhead goes, each part timed alone
and warm on this run's objects: the locks (snapshot, I/O, key lock, commit
deadline), the meta (``Meta`` and its encoding), the unchanged check, the
write calls beyond the floor's (timed without fsync), the rest of the
writer's Python code (a flush into a store that does no I/O), and what is
left: the same code running on cold caches after the fsync's sleep, which
a warm loop does not see.
``--quick`` runs 1 KiB to 5 MiB instead of 1 KiB to 50 MiB.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import anyio
import msgspec

from checkpointer import CheckpointWriter, FileStore, Snapshot, Written, _exit
from checkpointer._format.envelope import envelope_chunks
from checkpointer._stores.atomic import write_atomic
from checkpointer._stores.base import commit_deadline, new_revision
from checkpointer._stores.envelopes import KEEP_BYTES
from checkpointer._values import Meta, WriterInfo
from checkpointer._writer.keystate import KeyState, utcnow

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

BAR = 1.1
"""(checkpoint - encode) / floor (flush_sync), / (floor + one empty hop) (write_now)."""

Mode = Literal["write_now", "flush_sync"]


def repeats(nbytes: int, quick: bool) -> int:
    if quick:
        return 3 if nbytes <= 1 << 20 else 2
    return {1 << 10: 61, 100 << 10: 41, 10 << 20: 15}.get(nbytes, 9)


@functools.cache
def state_of(nbytes: int) -> dict[str, Any]:
    """The transcript of about ``nbytes`` shared by the cases (built once)."""
    return transcript_of(nbytes)


HOST = socket.gethostname()
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


class _Times:
    """Paired wall times of ours and the floor, and the process's CPU time (user +
    system, all threads: the write_now's worker too) over each call."""

    def __init__(self) -> None:
        self.ours: list[float] = []
        self.floor: list[float] = []
        self.cpu_ours: list[float] = []
        self.cpu_floor: list[float] = []
        self.hops: list[float] = []
        self.cpu_hops: list[float] = []

    @contextlib.contextmanager
    def timing(self, wall: list[float], cpu: list[float]) -> Iterator[None]:
        c0, t0 = time.process_time(), time.perf_counter()
        yield
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)


async def _async_pairs(root: str, state: dict[str, Any], n: int) -> _Times:
    """Paired write_now / floor times, and the median empty thread hop after each pair."""
    times = _Times()
    store = FileStore(root)
    floor_path = os.path.join(root, "bare.json")  # the recipe's own file, beside the key's
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
                if turn == 0:
                    with times.timing(times.ours, times.cpu_ours):
                        result = await writer.write_now(force=True)
                    assert isinstance(result, Written), result
                else:
                    with times.timing(times.floor, times.cpu_floor):
                        write_floor(floor_path, data)
            pair_hops: list[float] = []
            hop_cpu: list[float] = []
            for _ in range(HOPS_PER_PAIR):
                with times.timing(pair_hops, hop_cpu):
                    await anyio.to_thread.run_sync(_nothing)
            times.hops.append(statistics.median(pair_hops))
            times.cpu_hops.append(statistics.median(hop_cpu))
    return times


def _sync_pairs(root: str, state: dict[str, Any], n: int) -> _Times:
    times = _Times()
    store = FileStore(root)
    floor_path = os.path.join(root, "bare.json")  # the recipe's own file, beside the key's
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
                if turn == 0:
                    with times.timing(times.ours, times.cpu_ours):
                        result = writer.flush_sync()
                    assert isinstance(result, Written), result
                else:
                    with times.timing(times.floor, times.cpu_floor):
                        write_floor(floor_path, data)
    return times


# -- where the overhead goes -------------------------------------------------------


class _NoIO(FileStore):
    """A ``FileStore`` whose writes do no I/O: the writer's own code, timed alone."""

    def write(self, key: str, chunks: Sequence[bytes], **kw: Any) -> int:
        return sum(map(len, chunks))


def _no_fsync(fd: int) -> None:
    return None


def _warm(func: Callable[[], object], n: int) -> float:
    """Seconds per call of ``func``, the best of five loops of ``n`` calls."""
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            func()
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def _parts(root: str, state: dict[str, Any], data: bytes) -> dict[str, float]:
    """The writer's work besides the encode and the floor's I/O, each part timed warm.

    Every part runs the library's own objects and calls as one write does.
    """
    big = len(data) > 1 << 20
    n = 3 if big else 300
    writer: CheckpointWriter[Snapshot] = CheckpointWriter(
        functools.partial(_source, state), _NoIO(root), write_on_start=False, exit_hooks=False
    )
    parts: dict[str, float] = {}
    with writer:
        state["rev"] = -1
        writer.flush_sync()
        core = writer._core
        location = core._store.location("floor")

        def locks() -> None:
            with _exit.busy():
                with core._snapshot_lock:
                    pass
                with commit_deadline(5.0):
                    core._io_lock.acquire(timeout=5.0)
                    core._locks.acquire("floor", location)
                    core._io_lock.release()

        parts["locks"] = _warm(locks, 300)
        seen = core.keys.by_key["floor"].base
        assert seen is not None

        def meta() -> None:
            now = utcnow()
            built = Meta(
                key="floor",
                seq=seen.seq + 1,
                created_at=seen.created_at,
                updated_at=now,
                live=True,
                turns=None,
                writer=WriterInfo(pid=os.getpid(), host=HOST),
                library_version=seen.library_version,
                revision=new_revision(),
            )
            envelope_chunks(built, b"")

        parts["meta"] = _warm(meta, 300)
        held = KeyState(seen, known=True)
        held.content, held.base = data, msgspec.structs.replace(seen, live=True, pinned=False)
        changed = data[:-2] + b"9}"  # what a new rev looks like: same length, new tail
        parts["unchanged check"] = _warm(lambda: held.holds(changed, True, None, None), n)
        # The calls on tmpfs where there is one: no journal or writeback to
        # add noise to what is a difference of Python and syscalls.
        calls_dir = "/dev/shm" if os.path.isdir("/dev/shm") else root
        atomic_path = os.path.join(calls_dir, f"parts-atomic-{os.getpid()}.json")
        floor_path = os.path.join(calls_dir, f"parts-floor-{os.getpid()}.json")
        pieces = [data[:64], data[64:-1], data[-1:]]  # as the envelope's pieces go out
        ours = _warm(lambda: write_atomic(atomic_path, pieces, fsync=_no_fsync), n // 3 or 1)
        floor = _warm(lambda: write_floor(floor_path, data, fsync=_no_fsync), n // 3 or 1)
        parts["write calls"] = ours - floor
        for path in (atomic_path, floor_path):
            os.unlink(path)
        encoder = msgspec.json.Encoder()
        encode = _warm(lambda: encoder.encode(state), n)  # warm too, as the flush below
        i = 0

        def flush() -> None:
            nonlocal i
            i += 1
            state["rev"] = i
            writer.flush_sync()

        whole = _warm(flush, n)
        parts["other python"] = max(0.0, whole - encode - sum(parts.values()))
    return parts


PART_NAMES = ["locks", "meta", "unchanged check", "write calls", "other python"]


def measure(quick: bool, mode: Mode) -> Report:
    what = "write_now(force=True)" if mode == "write_now" else "flush_sync()"
    rows: list[list[Any]] = []
    breakdown: list[list[Any]] = []
    report = Report(title="")
    largest = 0
    cold: list[str] = []
    for label, nbytes in QUICK_SIZES if quick else SIZES:
        state = state_of(nbytes)
        n = repeats(nbytes, quick)
        with scratch_dir("floor-") as root:
            if mode == "write_now":
                times = anyio.run(_async_pairs, root, state, n)
            else:
                times = _sync_pairs(root, state, n)
            ours, floor, hops = times.ours, times.floor, times.hops
            floor_file = os.path.join(root, "bare.json")  # the recipe's own file, beside the key's
            file_bytes = os.path.getsize(floor_file)
            with open(floor_file, "rb") as f:
                data = f.read()
            s_encode = stat(_encode_costs(state, max(3, n // 2)))
            parts = _parts(root, state, data)
        largest = max(largest, file_bytes)
        s_ours, s_floor = stat(ours), stat(floor)
        hop_cell: list[Any] = [stat(hops)] if mode == "write_now" else []
        rows.append([label, file_bytes, s_ours, s_floor, s_encode, *hop_cell, n])
        # Pairs ran back to back; the median of their ratios cancels the
        # disk's drift (fsync latency on a shared disk moves by 10x).
        base = [f + h for f, h in zip(floor, hops, strict=True)] if hops else floor
        value = paired([t - s_encode.median for t in ours], base)
        over = sorted(t - s_encode.median - b for t, b in zip(ours, base, strict=True))
        overhead = over[len(over) // 2]
        cpu_base = times.cpu_floor
        if times.cpu_hops:
            cpu_base = [f + h for f, h in zip(cpu_base, times.cpu_hops, strict=True)]
        cpu = sorted(c - s_encode.median - b for c, b in zip(times.cpu_ours, cpu_base, strict=True))
        known = sum(parts.values())
        breakdown.append(
            [
                label,
                overhead,
                *[parts[name] for name in PART_NAMES],
                overhead - known,
                cpu[len(cpu) // 2],
            ]
        )
        if nbytes <= 100 << 10 and known > 0:
            cold.append(f"{label} {cpu[len(cpu) // 2] / known:.1f}x")
        base_name = "(floor + empty hop)" if hops else "floor"
        report.ratios.append(
            ratio(
                f"{label}: ({what} - encode) / {base_name}",
                value,
                "<=",
                BAR,
                note=(
                    f"median of {n} pairs; with encode {paired(ours, base):.2f}x; "
                    f"medians {s_ours.median / s_floor.median:.2f}x of the floor alone"
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
    report.tables.append(
        Table(
            title=(
                f"where {what} spends beyond encode + floor"
                + (" + hop" if mode == "write_now" else "")
                + " (median of the pairs; parts timed alone, warm)"
            ),
            columns=["state", "overhead", *PART_NAMES, "rest (cold)", "CPU beyond floor"],
            rows=breakdown,
        )
    )
    report.notes.append(
        "breakdown: locks = snapshot + I/O lock, key lock (held), commit deadline; meta = "
        "Meta and its encoding; unchanged check = the byte compare against the last write "
        "(its last 4 KiB first); write calls = write_atomic less the floor's calls, without "
        "fsync; other python = a flush into a store without I/O, less the parts and the "
        "encode; rest = the overhead left: the same code run cold after the fsync's sleep; "
        "CPU beyond floor = the process's CPU time (user + system, every thread) of the "
        "checkpoint less the floor's (and the empty hop's, for write_now) and the encode's, "
        "median of the pairs"
    )
    report.notes.append(
        "cold: the overhead is CPU time (CPU beyond floor is about the overhead, not a wait "
        "on the disk), yet the parts timed warm are a fraction of it: the CPU beyond the "
        "floor is " + ", ".join(cold) + " the parts' warm sum (timed in a loop, the "
        "write calls on tmpfs). The writer's Python and syscalls cost that much more "
        "right after an fsync's sleep, on the disk's filesystem: the floor's few lines "
        "slow down alike. Only less code per write would close the gap"
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
        "thread hop: the median round trip of an empty anyio.to_thread.run_sync right after "
        "each pair; the bar counts one per write_now, which the floor (on the calling "
        "thread) does not pay"
    )
    return msgspec.to_builtins(report)  # type: ignore[no-any-return]
