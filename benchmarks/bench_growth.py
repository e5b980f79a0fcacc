"""Case 7, cost growth: one checkpoint that adds one message, against history length.

For each store in ``STORES``: a writer over a transcript of N messages
(about 200 bytes each, frozen Structs, so the message cache can keep their
bytes); append one message, ``await write_now()``, time it end to end.  A
store whose cost follows the size of the change stays flat; one that
rewrites the whole session grows with N.  Adding a store is one entry in
``STORES``.  The journal case's cost table measures this same step, with
these messages (``text``).

* ``FileStore``: the whole state encoded on the loop, the file rewritten;
* ``FileStore+Transcript``: each message encoded once (the cache), the file
  still rewritten whole, piece by piece in the worker;
* ``JournalStore``: the new message appended (one write, one fsync).  Its
  check that the history before it is unchanged compares each message's
  pointer with the one it wrote (a C list ``==``);
* ``JournalStore, numbers``: messages with an int (``2 == 2.0``, but not
  the same bytes), so an equal message proves nothing: the check is an
  identity scan, a Python-speed step per message of history.

The lengths of a store are timed interleaved (one checkpoint at each, round
after round), so the disk's drift hits them alike.  ``--quick`` stops at
10,000 messages; ``python -m benchmarks.bench_growth --million`` times the
journals alone up to 1,000,000.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import time
from collections.abc import Callable
from typing import Any

import anyio
import msgspec

from checkpointer import CheckpointWriter, FileStore, JournalStore, Snapshot, Transcript, Written
from checkpointer.stores import Store

from ._harness import Report, Table, ratio, scratch_dir, stat
from ._recipes import SettledMessage, message, settled


class Text(msgspec.Struct, frozen=True):
    """A settled message of strings: whatever equals it (==) encodes the same."""

    role: str
    content: str


def text(i: int, size: int) -> Text:
    """The i-th message of a transcript of ``Text``, ``size`` bytes encoded, about."""
    m = message(i, size)
    return Text(m["role"], f"{i}: {m['content']}")


def numbers(i: int, size: int) -> SettledMessage:
    """The i-th message with its number: settled, but an equal one may encode otherwise."""
    return settled([message(i, size)])[0]


STORES: list[tuple[str, Callable[[str], Store], float | None, Callable[[int, int], Any]]] = [
    ("FileStore", FileStore, None, text),
    ("FileStore+Transcript", FileStore, None, text),
    ("JournalStore", JournalStore, 2.0, text),
    ("JournalStore, numbers", JournalStore, None, numbers),
]
"""(name, factory of a store rooted in a scratch directory, bar on its growth ratio,
the messages).  A name with ``+Transcript`` gives its writer a transcript: the
message cache only."""

LENGTHS = (100, 1_000, 10_000, 100_000)
QUICK_LENGTHS = (100, 1_000, 10_000)  # the same code paths, a tenth of the bytes
MILLION_LENGTHS = (100, 10_000, 100_000, 1_000_000)  # --million: the journals alone
SIZE = 200


def lengths(quick: bool, *, million: bool = False) -> tuple[int, ...]:
    return MILLION_LENGTHS if million else QUICK_LENGTHS if quick else LENGTHS


def repeats(n: int, quick: bool, *, flat: bool = False) -> int:
    """Checkpoints timed at ``n`` messages; a store meant to stay ``flat`` is cheap at any n."""
    if quick:
        return 3
    return 21 if flat or n <= 1_000 else 11 if n <= 10_000 else 7


async def _measure(
    factory: Callable[[str], Store],
    root: str,
    histories: dict[int, list[Any]],
    reps: dict[int, int],
    cached: bool,
    make: Callable[[int, int], Any],
) -> dict[int, list[float]]:
    """Time checkpoints at every length, interleaved: the disk's drift hits them alike."""
    out: dict[int, list[float]] = {n: [] for n in histories}
    sessions: list[tuple[int, list[Any], CheckpointWriter[Snapshot]]] = []
    async with contextlib.AsyncExitStack() as stack:
        for n, history in histories.items():
            messages = list(history)  # the same message objects for every store
            writer = CheckpointWriter(
                functools.partial(_snapshot, messages),
                factory(os.path.join(root, str(n))),
                transcript=Transcript(repair=False, fingerprint=False) if cached else None,
                exit_hooks=False,
            )  # write_on_start writes the history once: the warm-up (and fills the cache)
            await stack.enter_async_context(writer)
            sessions.append((n, messages, writer))
        for round_ in range(max(reps.values())):
            for n, messages, writer in sessions if round_ % 2 else reversed(sessions):
                if round_ >= reps[n]:
                    continue
                messages.append(make(len(messages), SIZE))
                t0 = time.perf_counter()
                result = await writer.write_now()
                out[n].append(time.perf_counter() - t0)
                assert isinstance(result, Written), result
    return out


def _snapshot(messages: list[Any]) -> Snapshot:
    return Snapshot("growth", {"messages": messages})


def main(quick: bool, *, million: bool = False) -> dict[str, Any]:
    """The table, one series per store and the growth ratios; ``million``: the journals
    alone, up to 1,000,000 messages."""
    report = Report(title="Cost growth: one checkpoint adding one message, vs history length")
    rows: list[list[Any]] = []
    sizes = lengths(quick, million=million)
    for name, factory, bar, make in STORES:
        if million and factory is not JournalStore:
            continue
        history = [make(i, SIZE) for i in range(sizes[-1])]  # shared: one object per message
        histories = {n: history[:n] for n in sizes}
        reps = {n: repeats(n, quick, flat=bar is not None or million) for n in sizes}
        with scratch_dir("growth-") as root:
            cached = name.endswith("+Transcript")
            samples = anyio.run(_measure, factory, root, histories, reps, cached, make)
        del history, histories
        series = [(float(n), stat(samples[n])) for n in sizes]
        rows += [[name, int(x), s, len(samples[int(x)])] for x, s in series]
        report.series[f"growth/{name}"] = series
        first, last = series[0][1].median, series[-1][1].median
        report.ratios.append(
            ratio(
                f"{name}: cost @{sizes[-1]:,} / @{sizes[0]:,} messages",
                last / first,
                "<=" if bar is not None else "",
                bar,
                note=_NOTES[name],
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


_NOTES = {
    "FileStore": "a whole-file store: grows with it",
    "FileStore+Transcript": "a whole-file store: grows with it",
    "JournalStore": "the cost follows the change; sizes interleaved",
    "JournalStore, numbers": "checking an int-holding history takes an identity "
    "scan (a step per message), since an equal message (2 == 2.0) may encode otherwise",
}


if __name__ == "__main__":
    from .__main__ import render

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_growth", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="up to 10,000 messages")
    parser.add_argument(
        "--million", action="store_true", help="the journals alone, up to 1,000,000 messages"
    )
    args = parser.parse_args()
    out = main(args.quick, million=args.million)
    print(f"== growth: {out['title']}")
    print("\n".join(render("growth", out)))
