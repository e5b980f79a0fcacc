"""Crash torture: ``kill -9`` a checkpointing process at random moments, check the file each time.

Run it from the repository root::

    python -m tests.torture --kills 200

A child process runs a real ``CheckpointWriter`` on the chosen store with
small timers, on asyncio, trio or uvloop, and changes its session without
pause: the state for sequence number ``n`` is ``state_for(n)``, a transcript
of up to ``--max-mib`` MiB that grows by a message per number and is
replaced every ``EPOCH`` numbers, so the child is inside a durable write
most of the time (and a journal both appends and compacts).  Timer writes,
``write_now()`` and ``flush_sync()`` from a worker thread are mixed.  The
store is wrapped so that after each write that returned the child prints
``W <seq> <n>`` on its stdout pipe.  The parent kills the child with SIGKILL
at a random moment, either while the writer starts (open, the first write)
or while it runs, and then checks the file:

* it loads (no torn bytes; a journal may end in an unfinished append, which
  ``load`` ignores and reports, and which is counted);
* its state is exactly ``state_for(n)`` for the ``n`` it holds (no mixture
  of two writes);
* ``n`` and ``meta.seq`` are at least those of the last write the child
  reported (nothing that returned is lost) and never go back between kills;
* the leftovers of the interrupted write (temp files of a dead process) are
  gone once the next child has opened its store, and that child's first write
  succeeded (the key's lock went with the killed process).

It prints a summary per store; the exit status is 1 if anything was lost.
``--store`` picks the store (``file``, ``file-transcript``, ``journal``, their encrypted
``file-sealed`` and ``journal-sealed``,
``s3``, ``s3journal``, ``all``); another store is one more entry in ``STORES``.  ``--store naive``
is a deliberately unsafe store (writes in place) that shows the torture
catching torn files.

The children are forked from a helper process (this file with ``--zygote``)
that has imported everything once, so a kill costs milliseconds, not an
interpreter start; each child still opens the store, resumes from the file
and runs its own event loop, as a fresh process would.

A SIGKILL leaves the kernel's page cache intact: this tests atomicity
against a crashing process, not durability against a power cut (which needs
a VM or a fault-injecting block device).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import stat
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from checkpointer import CheckpointError, FileStore, JournalStore, Transcript, load
from checkpointer.stores import KeyLocked, Store, TornTail
from tests._support import scratch
from tests._support.harness import (
    KEY,
    MIB,
    Reported,
    Run,
    Zygote,
    backends,
    check,
    file_leftovers,
    file_transcript,
    on_loop,
    s3_store,
    say,
    sealed,
    tapped,
    victim,
)
from tests._support.harness import zygote as fork_children

__all__ = ["STORES", "StoreKind", "Summary", "main", "run"]


# -- stores under test -------------------------------------------------------------------


class NaiveStore(FileStore):
    """A deliberately unsafe store: rewrites the file in place, syncing each piece.

    What ``open(path, "wb").write(data)`` amounts to on a slow disk.  Only
    here to show that the torture notices torn files.
    """

    def write(self, key: str, chunks: Sequence[bytes], **kw: Any) -> int:
        os.makedirs(self.root, exist_ok=True)
        data = b"".join(chunks)
        with open(self.location(key), "wb") as f:
            for start in range(0, len(data), 256 * 1024):
                f.write(data[start : start + 256 * 1024])
                f.flush()
                os.fdatasync(f.fileno())
        return len(data)


@dataclass(frozen=True)
class StoreKind:
    """A store the torture can run: how to make one, and what a killed writer may leave.

    ``leftovers(root)`` lists what an interrupted write of a process that is
    gone left behind, which the next ``open()`` must clear away.
    """

    make: Callable[[str], Store]
    leftovers: Callable[[str], list[str]]
    unsafe: bool = False
    setup: Callable[[], object] | None = None  # before the children: a server to reach


def _no_leftovers(root: str) -> list[str]:
    return []  # unreferenced segments are swept after an hour, not at the next open


def _serve() -> object:
    from tests.s3 import serve_for_children

    return serve_for_children()


STORES: dict[str, StoreKind] = {
    "file": StoreKind(FileStore, file_leftovers),
    "file-transcript": StoreKind(file_transcript, file_leftovers),
    "journal": StoreKind(JournalStore, file_leftovers),
    "file-sealed": StoreKind(sealed(FileStore), file_leftovers),
    "journal-sealed": StoreKind(sealed(JournalStore), file_leftovers),
    "s3": StoreKind(s3_store("s3"), _no_leftovers, setup=_serve),
    "s3journal": StoreKind(s3_store("s3journal"), _no_leftovers, setup=_serve),
    "naive": StoreKind(NaiveStore, file_leftovers, unsafe=True),
}
"""The stores to torture: a new store is one more entry.

``file-transcript`` is a ``FileStore`` that encodes messages one by one
(through a ``Transcript``) and joins them in the worker thread; ``journal``
appends batches to a JSON Lines file and rewrites it (temp file and rename)
when it outgrows its content, so kills land in appends and in rewrites;
``s3`` and ``s3journal`` write to moto's S3 server, started on 127.0.0.1
for the run (kills land between a segment and its head).
"""


# -- the child ---------------------------------------------------------------------------


async def _child(spec: dict[str, Any]) -> int:
    """Checkpoint a session that changes without pause, until killed."""
    cache = Transcript() if spec["store"] == "file-transcript" else None
    store = tapped(STORES[spec["store"]].make(spec["root"]), cache)
    try:
        previous = load(store, KEY)
    except CheckpointError as exc:
        say(f"CORRUPT {exc}")
        return 3
    return await victim(store, 0 if previous is None else int(previous.state["n"]), spec)


def _run_child(spec: dict[str, Any]) -> int:
    return on_loop(_child, spec)


# -- the parent --------------------------------------------------------------------------


@dataclass
class Summary:
    """What a torture run did and found."""

    store: str
    seed: int
    max_bytes: int
    kills: int = 0
    early_kills: int = 0
    writes: int = 0
    max_seq: int = 0
    largest: int = 0
    temps: int = 0
    torn: int = 0
    swept: int = 0
    seconds: float = 0.0
    backends: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def losses(self) -> int:
        return len(self.problems)

    @property
    def mid_write(self) -> int:
        """Kills that provably landed inside a write: a temp file or a torn append left."""
        return self.temps + self.torn

    def lines(self) -> list[str]:
        return [
            f"torture: {self.kills} kills (SIGKILL) of a process checkpointing to the "
            f"{self.store!r} store, states up to {self.max_bytes / MIB:.1f} MiB, "
            f"seed {self.seed}, {self.seconds:.1f} s",
            "  backends: " + ", ".join(f"{k} {v}" for k, v in sorted(self.backends.items())),
            f"  killed while starting (open, first write): {self.early_kills}",
            f"  writes the child reported done: {self.writes}; seq reached {self.max_seq}; "
            f"largest file {self.largest / MIB:.2f} MiB",
            f"  kills that landed mid-write: {self.mid_write} (left a temp file: {self.temps}, "
            f"temp files swept by the next open: {self.swept}; left a torn append, "
            f"which load ignored: {self.torn})",
            f"  after every kill the file loaded, held exactly the state of its sequence "
            f"number, and was at least as new as the last reported write: "
            f"{'yes' if not self.problems else 'NO'}",
            *(f"  LOST: {p}" for p in self.problems),
            f"store={self.store} kills={self.kills} writes={self.writes} "
            f"max_seq={self.max_seq} mid_write={self.mid_write} temps={self.temps} "
            f"swept={self.swept} torn={self.torn} losses={self.losses}",
        ]


def run(
    kills: int = 200,
    *,
    store: str = "file",
    max_bytes: int = 4 * MIB,
    max_delay: float = 0.25,
    early: float = 0.15,
    seed: int | None = None,
    root: str | os.PathLike[str] | None = None,
    stop_on_loss: bool = False,
    progress: Callable[[str], object] | None = None,
) -> Summary:
    """Kill a checkpointing child ``kills`` times and check the file after each kill.

    Args:
        kills: how many children to start and SIGKILL.
        store: a name in ``STORES``.
        max_bytes: the largest state (see ``state_for``).
        max_delay: a running child is killed uniformly within this many
            seconds after it is ready.
        early: the share of kills aimed at a child still starting (within
            30 ms of entering the writer: the open and the first write).
        seed: chooses backends, moments and the children's behaviour;
            random if None (printed in the summary).
        root: the store's directory (a fresh temp directory by default,
            removed afterwards).
        stop_on_loss: stop at the first problem.
        progress: called with a line after every kill.
    """
    kind = STORES[store]
    seed = random.randrange(2**32) if seed is None else seed
    rng = random.Random(seed)
    summary = Summary(store=store, seed=seed, max_bytes=max_bytes)
    loops = backends()
    started = time.monotonic()
    if kind.setup is not None:
        kind.setup()  # before the helper process starts: the children inherit its address
    with scratch(root, "torture") as where, contextlib.closing(Zygote("tests.torture")) as zygote:
        floor = Reported()
        debris: set[str] = set()  # killed writers' leftovers, until an open is seen
        for i in range(kills):
            backend = rng.choice(loops)
            summary.backends[backend] = summary.backends.get(backend, 0) + 1
            aim_early = rng.random() < early
            spec: dict[str, Any] = {"root": where, "store": store, "backend": backend}
            spec.update(max_bytes=max_bytes, seed=rng.randrange(2**32))
            pid, child = zygote.spawn(spec)
            problems: list[str] = []
            try:
                if aim_early:  # while it opens the store and writes its first checkpoint
                    if zygote.wait(child, child.started):
                        time.sleep(rng.uniform(0.0, 0.03))
                    else:
                        problems.append("the child never started")
                elif zygote.wait(child, child.ready):
                    # The child's writer has opened the store: the debris must be gone.
                    problems += _swept(kind, where, debris, summary)
                    problems += _started_well(child)
                    time.sleep(rng.uniform(0.0, max_delay))
                else:
                    problems.append("the child never got ready")
            finally:
                zygote.kill(pid)
            if child.status != -signal.SIGKILL:
                tail = "\n".join(child.lines[-5:])
                problems.append(
                    f"the child ended with status {child.status} before the kill:\n{tail}\n"
                    f"{zygote.stderr()[-2000:]}"
                )
            summary.kills += 1
            summary.early_kills += aim_early
            fresh = set(kind.leftovers(where)) - debris  # what this kill left behind
            summary.temps += bool(fresh)
            debris |= fresh
            count, newest = child.reported()
            summary.writes += count
            floor.seq, floor.n = max(floor.seq, newest.seq), max(floor.n, newest.n)
            torn: list[TornTail] = []
            problems += check(kind.make(where), max_bytes, floor, torn)
            summary.torn += bool(torn)
            with contextlib.suppress(OSError):
                size = os.path.getsize(kind.make(where).location(KEY))
                summary.largest = max(summary.largest, size)
            summary.max_seq = max(summary.max_seq, floor.seq)
            summary.problems += [f"kill {i + 1} ({backend}): {p}" for p in problems]
            if progress is not None:
                moment = "starting" if aim_early else "running"
                progress(
                    f"kill {i + 1}/{kills} {backend:7} {moment}: {count:3} writes, "
                    f"seq {floor.seq}, losses {summary.losses}"
                )
            if problems:
                if stop_on_loss:
                    break
                # Start the next child afresh; the bad file stays, aside, for a look.
                with contextlib.suppress(OSError, KeyLocked):
                    kind.make(where).move_aside(KEY, f"lost-{i + 1}")
                floor = Reported()
        else:  # no child opens the store after the last kill: open it here
            with contextlib.suppress(OSError):
                kind.make(where).open()
            summary.problems += [
                f"after the last kill: {p}" for p in _swept(kind, where, debris, summary)
            ]
    summary.seconds = time.monotonic() - started
    return summary


def _started_well(child: Run) -> list[str]:
    """A problem if the child's first write failed (say, a lock the killed child kept)."""
    ready = next(line for line in child.lines if line.startswith("READY "))
    _, n, writes, failures = ready.split()
    if failures != "0" or writes != "1":
        return [
            f"the first write of a new child failed (n={n}): {writes} written, {failures} failed"
        ]
    return []


def _killed_before_its_lock(path: str) -> bool:
    try:
        return stat.S_IMODE(os.stat(path).st_mode) == 0
    except OSError:
        return False


def _swept(kind: StoreKind, root: str, debris: set[str], summary: Summary) -> list[str]:
    """After an open: count the debris that went; a problem for any that stayed."""
    unswept = sorted(p for p in debris if os.path.exists(p))
    unswept += [p for p in kind.leftovers(root) if p not in debris]
    # A temp killed before its lock (mode 000) is kept until old (atomic.STALE_AFTER):
    # the sweep cannot tell it from a write that is about to lock it.
    unswept = [p for p in unswept if not _killed_before_its_lock(p)]
    summary.swept += len(debris) - len(unswept)
    debris.clear()
    return [f"an open left a dead writer's leftovers {unswept}"] if unswept else []


# -- the command ---------------------------------------------------------------------------


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m tests.torture",
        description="SIGKILL a checkpointing process at random moments and check the file "
        "after every kill.",
    )
    p.add_argument("--kills", type=int, default=200, help="how many kills (default 200)")
    p.add_argument(
        "--store",
        action="append",
        choices=[*sorted(STORES), "all"],
        help="the store to torture, repeatable (default file); 'all' is every safe "
        "store; 'naive' is deliberately unsafe",
    )
    p.add_argument("--max-mib", type=float, default=4.0, help="largest state in MiB (default 4)")
    p.add_argument(
        "--max-delay",
        type=float,
        default=0.25,
        help="kill a running child within this many seconds (default 0.25)",
    )
    p.add_argument("--seed", type=int, default=None, help="seed (default: random, printed)")
    p.add_argument("--root", default=None, help="store directory (default: a fresh temp dir)")
    p.add_argument("-q", "--quiet", action="store_true", help="print the summary only")
    p.add_argument("--zygote", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """The command: ``python -m tests.torture [--kills N] ...``; exit status 1 on a loss."""
    args = _parse(argv)
    if args.zygote:
        return fork_children(_run_child)
    if args.kills < 1 or args.max_mib <= 0 or args.max_delay < 0:
        print("torture: --kills must be >= 1, --max-mib > 0, --max-delay >= 0", file=sys.stderr)
        return 2
    stores: list[str] = []
    for name in args.store or ["file"]:
        for one in [n for n, k in STORES.items() if not k.unsafe] if name == "all" else [name]:
            if one not in stores:
                stores.append(one)
    losses = 0
    for store in stores:
        summary = run(
            args.kills,
            store=store,
            max_bytes=int(args.max_mib * MIB),
            max_delay=args.max_delay,
            seed=args.seed,
            root=None if args.root is None else os.path.join(args.root, store),
            progress=None if args.quiet else lambda line: print(line, flush=True),
        )
        print("\n".join(summary.lines()), flush=True)
        losses += summary.losses
    return 1 if losses else 0


if __name__ == "__main__":
    sys.exit(main())
