"""The transcript fingerprint costs the same at 10 and at 100,000 messages.

Run: ``python benchmarks/fingerprint.py``.  Prints the cost per call of
``transcript_fingerprint()`` for both sizes side by side, and of encoding the
history for comparison (what a content-based check would pay), then the
ratio, which must stay within 1.2.  Exits 1 if it does not.

Both histories end in the same kind of message, so only the length differs.
The figure is the best of several repeats: the least disturbed by a noisy
machine, and the right statistic for "does it depend on n".
"""

from __future__ import annotations

import sys
import timeit
from typing import Any

import msgspec

from checkpointer import Snapshot, transcript_fingerprint

SIZES = (10, 100_000)
LIMIT = 1.2


def history(n: int) -> list[dict[str, Any]]:
    """``n`` messages of a tool-using agent, ending in an assistant answer."""
    cycle: list[dict[str, Any]] = []
    for i in range(n):
        kind = (n - 1 - i) % 4  # so the last message is always kind 0
        if kind == 3:
            cycle.append({"role": "user", "content": f"question {i}"})
        elif kind == 2:
            call = {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            cycle.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == 1:
            cycle.append({"role": "tool", "tool_call_id": f"c{i - 1}", "content": "r" * 200})
        else:
            cycle.append({"role": "assistant", "id": "m-last", "content": "answer " * 40})
    return cycle


def cost(n: int, *, number: int = 20_000, repeat: int = 7) -> float:
    """Seconds per fingerprint of an ``n``-message snapshot (best of ``repeat``)."""
    fingerprint = transcript_fingerprint()
    snapshot = Snapshot("bench", {"messages": history(n), "pinned": False})
    return min(timeit.repeat(lambda: fingerprint(snapshot), number=number, repeat=repeat)) / number


def ratio(*, number: int = 20_000, repeat: int = 7) -> tuple[float, float, float]:
    """(cost at 10, cost at 100,000, their ratio)."""
    small, large = (cost(n, number=number, repeat=repeat) for n in SIZES)
    return small, large, large / small


def main() -> int:
    small, large, r = ratio()
    encode = msgspec.json.Encoder()
    print(f"{'messages':>10}  {'fingerprint':>12}  {'encode (for scale)':>18}")
    for n, fp_cost in zip(SIZES, (small, large), strict=True):
        data = history(n)
        enc = min(timeit.repeat(lambda: encode.encode(data), number=3, repeat=3)) / 3  # noqa: B023
        print(f"{n:>10,}  {fp_cost * 1e6:>9.2f} us  {enc * 1e6:>15.0f} us")
    print(f"ratio 100,000 / 10: {r:.2f} (limit {LIMIT})")
    return 0 if r <= LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
