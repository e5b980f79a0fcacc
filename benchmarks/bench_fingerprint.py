"""Case: the transcript fingerprint costs the same at 10 and at 100,000 messages.

``transcript_fingerprint()`` reads the message count and encodes the last
message only (a cost bounded by that message's size).  Timed in timeit-style
loops over snapshots of 10 and of 100,000 messages that end in the same kind
of message, so only the length differs;
the bar (<= 1.2x) uses the minimum of the repeats, the least disturbed run.
Encoding the same histories is shown for scale: it is what a content check
would pay.  Also ``python -m benchmarks.bench_fingerprint``.
"""

from __future__ import annotations

import sys
import timeit
from typing import Any

import msgspec

from checkpointer import Snapshot
from checkpointer._transcript.fingerprint import transcript_fingerprint

from ._harness import Report, Table, ratio, stat

SIZES = (10, 100_000)
LIMIT = 1.2


def history(n: int) -> list[dict[str, Any]]:
    """``n`` messages of a tool-using agent, the last always an assistant answer."""
    out: list[dict[str, Any]] = []
    for i in range(n):
        kind = (n - 1 - i) % 4
        if kind == 3:
            out.append({"role": "user", "content": f"question {i}"})
        elif kind == 2:
            call = {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == 1:
            out.append({"role": "tool", "tool_call_id": f"c{i - 1}", "content": "r" * 200})
        else:
            out.append({"role": "assistant", "id": "m-last", "content": "answer " * 40})
    return out


def measure(number: int, repeats: int) -> dict[int, list[float]]:
    """Seconds per fingerprint, ``repeats`` samples per size, sizes interleaved."""
    fingerprint = transcript_fingerprint()
    snapshots = {n: Snapshot("bench", {"messages": history(n), "pinned": False}) for n in SIZES}
    samples: dict[int, list[float]] = {n: [] for n in SIZES}
    for _ in range(repeats):
        for n, snapshot in snapshots.items():
            timer = timeit.Timer(lambda s=snapshot: fingerprint(s))  # type: ignore[misc]
            samples[n].append(timer.timeit(number) / number)
    return samples


def growth(number: int = 2_000, repeats: int = 5) -> float:
    """The least cost at 100,000 messages over the least at 10."""
    samples = measure(number, repeats)
    return min(samples[SIZES[1]]) / min(samples[SIZES[0]])


def main(quick: bool) -> dict[str, Any]:
    number, repeats = (5_000, 7) if quick else (50_000, 21)
    samples = measure(number, repeats)
    encoder = msgspec.json.Encoder()
    rows: list[list[Any]] = []
    for n in SIZES:
        data = history(n)
        encode = min(timeit.repeat(lambda d=data: encoder.encode(d), number=1, repeat=3))  # type: ignore[misc]
        rows.append([n, min(samples[n]), stat(samples[n]), encode])
    report = Report(
        title="Transcript fingerprint: cost at 10 and at 100,000 messages",
        tables=[
            Table(
                title=f"seconds per fingerprint, {repeats} repeats of {number:,} calls",
                columns=["messages", "min", "median [p10-p90]", "encode once (for scale)"],
                rows=rows,
            )
        ],
    )
    small, large = min(samples[SIZES[0]]), min(samples[SIZES[1]])
    report.ratios.append(
        ratio(f"fingerprint @{SIZES[1]:,} vs @{SIZES[0]:,} msgs", large / small, "<=", LIMIT)
    )
    return msgspec.to_builtins(report)  # type: ignore[no-any-return]


if __name__ == "__main__":
    figures = main(quick="--quick" in sys.argv)
    for row in figures["tables"][0]["rows"]:
        n, least, _, encode = row
        print(
            f"{n:>10,} messages: fingerprint {least * 1e6:6.2f} us, encode {encode * 1e3:8.2f} ms"
        )
    line = figures["ratios"][0]
    verdict = "met" if line["ok"] else "MISSED"
    print(f"{line['name']}: {line['value']:.2f}x (bar <= {LIMIT}x: {verdict})")
    sys.exit(0 if line["ok"] else 1)
