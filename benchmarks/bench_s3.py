"""Object storage: what one checkpoint costs on S3, counted at the wire.

Run from the repository root (moto's S3 server, the ``[test]`` extra, is
started on 127.0.0.1 for the run)::

    python -m benchmarks.bench_s3            # 1,000 and 10,000 messages
    python -m benchmarks.bench_s3 --quick    # 1,000 only, fewer repeats

Four layouts side by side in one run, behind the same counting proxy
(``tests/s3.py``), each checkpointing a session of ~300 B messages after
one message is added:

* ``S3JournalStore``: a segment with the new message, then the head;
* ``S3Store``: the whole state, one conditional PUT;
* **one object per message**, Strands' ``S3SessionManager`` layout: the
  new message as its own object (a plain PUT, encoded on the loop);
* **one object per turn**: the whole transcript, ``json.dumps`` on the
  loop, one plain PUT (what most frameworks' S3 savers do).

Figures per checkpoint: requests and bytes sent (headers and bodies, at
the proxy; the median, and the mean over 40 checkpoints, which counts the
journal's compaction every ``max_segments`` = 32 checkpoints), the wall
time, and the worst lateness of a 1 ms ticker task (the event-loop stall).
The two peers are not fenced: they are the cost floor of their layouts,
not a safe alternative.  Ratios are against ``S3Store`` or a peer
measured in the same run; the proxy and moto run on this machine, so
times are loopback times (a real endpoint adds its round trips: the
request counts say how many).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread

from checkpointer import CheckpointWriter, Snapshot, Written

from ._harness import Cell, Report, Table, paired, ratio, stat

_SIZES_FULL = (1_000, 10_000)
_SIZES_QUICK = (1_000,)
_LAYOUTS = ("S3JournalStore", "S3Store", "object per message", "object per turn")


def _message(i: int) -> dict[str, str]:
    text = f"message {i}: "
    return {"role": "user" if i % 2 else "assistant", "content": text + "x" * (300 - len(text))}


async def _worst_lateness(action: Callable[[], Awaitable[Any]]) -> float:
    """Run ``action`` beside a 1 ms ticker; its worst lateness, seconds."""
    lateness: list[float] = []
    done = False

    async def ticker() -> None:
        while not done:
            started = time.perf_counter()
            await anyio.sleep(0.001)
            lateness.append(time.perf_counter() - started - 0.001)

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await anyio.sleep(0.003)
        await action()
        await anyio.sleep(0.002)
        done = True
    return max(lateness)


class _Peer:
    """A framework's own S3 layout: plain PUTs, the encoding on the loop."""

    def __init__(self, client: Any, bucket: str, key: str, per_message: bool) -> None:
        self.client, self.bucket, self.key, self.per_message = client, bucket, key, per_message

    async def save(self, messages: list[dict[str, str]]) -> None:
        if self.per_message:
            name = f"{self.key}/messages/message_{len(messages) - 1}.json"
            body = json.dumps(messages[-1]).encode()
        else:
            name, body = f"{self.key}/session.json", json.dumps({"messages": messages}).encode()
        await anyio.to_thread.run_sync(
            lambda: self.client.put_object(Bucket=self.bucket, Key=name, Body=body)
        )


async def _measure(
    proxy: Any, save: Callable[[], Awaitable[Any]], add: Callable[[], None], repeats: int
) -> dict[str, list[float]]:
    got: dict[str, list[float]] = {"requests": [], "bytes": [], "seconds": [], "stall": []}
    add()
    await save()  # warm: the session is stored, the store knows it
    for _ in range(repeats):
        add()
        proxy.reset_counts()
        started = time.perf_counter()
        got["stall"].append(await _worst_lateness(save))
        got["seconds"].append(time.perf_counter() - started)
        requests, sent, _ = proxy.counts()
        got["requests"].append(requests)
        got["bytes"].append(sent)
    return got


async def _layout(name: str, n: int, place: Any, repeats: int) -> dict[str, list[float]]:
    messages = [_message(i) for i in range(n)]
    key = f"{name.replace(' ', '-')}-{n}"

    def add() -> None:
        messages.append(_message(len(messages)))

    if name.startswith("object per"):
        client = place.store("s3").s3.client()  # botocore, through the proxy
        peer = _Peer(client, place.bucket, key, name.endswith("message"))
        return await _measure(place.proxy, lambda: peer.save(messages), add, repeats)
    store = place.store("s3journal" if name == "S3JournalStore" else "s3")
    state = {"messages": messages}
    writer = CheckpointWriter(lambda: Snapshot(key, state), store, exit_hooks=False)
    async with writer:

        async def save() -> None:
            result = await writer.write_now()
            if not isinstance(result, Written):
                raise RuntimeError(f"{name}: the checkpoint did not write: {result!r}")

        return await _measure(place.proxy, save, add, repeats)


def measure(*, quick: bool) -> dict[tuple[str, int], dict[str, list[float]]]:
    """Per layout and size, per checkpoint: requests, bytes, seconds, stall."""
    from tests.s3 import Place

    place = Place()
    sizes = _SIZES_QUICK if quick else _SIZES_FULL
    repeats = 5 if quick else 40  # past max_segments (32): a journal compaction is counted
    found: dict[tuple[str, int], dict[str, list[float]]] = {}
    try:
        for n in sizes:
            for name in _LAYOUTS:
                found[name, n] = anyio.run(_layout, name, n, place, repeats)
    finally:
        place.close()
    return found


def main(quick: bool) -> dict[str, Any]:
    """The table and ratios; a ``Report`` as a dict."""
    from tests.s3 import start_error

    report = Report(title="Object storage: one checkpoint adding one message, at the wire")
    why = start_error()
    if why is not None:
        report.notes.append(f"skipped: {why}")
        return _builtins(report)
    found = measure(quick=quick)
    rows: list[list[Cell]] = []
    for (name, n), got in found.items():
        rows.append(
            [
                name,
                n,
                stat(got["requests"], ""),
                stat(got["bytes"], "B"),
                _kib(sum(got["bytes"]) / len(got["bytes"])),
                stat(got["seconds"]),
                stat(got["stall"]),
            ]
        )
    report.tables.append(
        Table(
            title="per checkpoint (requests and bytes sent counted at the proxy)",
            columns=[
                "layout",
                "messages",
                "requests",
                "bytes sent",
                "mean bytes",
                "time",
                "worst stall",
            ],
            rows=rows,
        )
    )
    for n in sorted({n for _, n in found}):
        journal, snapshot = found["S3JournalStore", n], found["S3Store", n]
        turn = found["object per turn", n]
        report.ratios += [
            ratio(
                f"@{n:,} messages: mean bytes sent S3JournalStore / S3Store",
                sum(journal["bytes"]) / sum(snapshot["bytes"]),
                "<",
                0.1,
                note="compactions counted",
            ),
            ratio(
                f"@{n:,} messages: worst stall S3JournalStore / object per turn",
                paired(journal["stall"], turn["stall"]),
                note="the peer encodes the transcript on the loop",
            ),
        ]
    report.notes.append(
        "the peers PUT without conditions (not fenced); the S3 stores PUT conditionally"
    )
    return _builtins(report)


def _kib(n: float) -> str:
    return f"{n / 1024:.1f} KiB"


def _builtins(report: Report) -> dict[str, Any]:
    import msgspec

    built: dict[str, Any] = msgspec.to_builtins(report)
    return built


if __name__ == "__main__":
    from .__main__ import render

    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_s3")
    parser.add_argument("--quick", action="store_true", help="1,000 messages, 5 repeats")
    args = parser.parse_args()
    print(f"python -m benchmarks.bench_s3{' --quick' if args.quick else ''}")
    print("\n".join(render("s3", main(args.quick))))
