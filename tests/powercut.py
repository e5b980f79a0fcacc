"""Power-cut torture: cut the power under a checkpointing process, check what was durable.

Run it from the repository root (as root, with Debian's ``fuse3``)::

    python -m tests.powercut --cuts 200 --store all

``tests.torture`` SIGKILLs the writer, which leaves the kernel's page cache
intact: it cannot tell whether the fsyncs are there at all.  Here the store
lives on ``tests._powerfs``, a FUSE filesystem that knows what an ``fsync``
made durable and forgets the rest when its power is cut (the idea of
LazyFS): file data written since the file's last fsync is lost, and a
create, rename, unlink or mkdir since the parent directory's last fsync is
undone (``--model strict``); ``--model ext4`` also lets a grown file keep
its size with zeros past its synced bytes.  Both models run by default.

For every cut: the filesystem is mounted over the durable state the last
cut left; a child process (forked from a helper, as in ``tests.torture``)
opens the store and checkpoints through a real ``CheckpointWriter``, on
asyncio, trio, uvloop or the sync writer, with timer writes, ``write_now()``
and ``flush_sync()`` from a worker thread, states ``state_for(n)`` that
grow and compact; it reports on its pipe every ``Written`` the writer
returned to it (``R <seq> <n>``), every store commit that returned (``W
<seq> <n>``: the timer's writes too), and every summary checkpoint (``S
<n>``).  A *neighbour* thread in the child fsyncs the store's root at random
moments, as another session's write in the same root would, so that the
temp file of a write in progress can become durable and outlive the cut.
The power goes either right
after the k-th call of a chosen kind (``create temp.json``, ``fsync
temp.json``, ``rename temp.json``, ``fsyncdir``, ``write journal:append``,
``fsync journal:compaction``, ...: every step of an atomic replace, of a
journal append, compaction and rewrite, of taking a lock), so cuts land
between any two steps, or at a random moment, or while the child starts.
The child runs on a little on the dead disk (its calls fail with EIO: any
``Written`` it is told then must still be on disk), then it is SIGKILLed,
the filesystem unmounted and rewritten to what was durable, and checked:

* the key loads (or is absent, only if nothing was ever reported written);
* its state is exactly ``state_for(n)`` for its ``n`` (one state the child
  produced, no mixture);
* it is at least as new as every ``Written`` the writer returned and every
  commit that returned, and never older than what an earlier cut left;
* a journal's torn tail (zeros, under ext4) is ignored by ``load``, never
  an error and never data;
* the next child opens the store, sweeps the dead writers' temp files that
  the cut left (counted: a temp of a killed child, made durable by the
  neighbour), takes the key's lock (the stale lock file of the cut writer,
  empty, zeros or naming it) and its first write succeeds.

``--store`` picks ``file``, ``file-transcript``, ``journal``, ``summary``
(a ``FileStore`` plus ``collapse``/``write_summary`` summary checkpoints)
or ``all``; lock files are checked in every store.  ``--mutate`` runs the
torture against code with one defect put in (``file-fsync``: the temp
file's fsync in ``write_atomic`` removed; ``dir-fsync``: its directory's
after the rename; ``journal-fsync``: the journal append's; ``sweep``:
``open()`` sweeps nothing; ``written-on-failure``: a commit's EIO is
swallowed, so the writer returns ``Written`` for it), by a seam in the
child only, and reports the cut that caught it: a check that passes with
the defect in would test nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from checkpointer import CheckpointError
from checkpointer._stores.flock import probe_file_lock
from checkpointer._transcript.summary import safe_watermark
from checkpointer.stores import TornTail
from checkpointer.summaries import load_summary, summary_path
from tests._powerfs import HANG_GUARD, MODELS, PowerFS
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
    state_for,
)
from tests._support.harness import zygote as fork_children
from tests.children.powercut_child import (
    KEEP_LAST,
    MUTATIONS,
    NEIGHBOUR_GAP,
    STORES,
    run_child,
    summary_bytes,
    summary_text,
)

__all__ = ["MUTATIONS", "STORES", "Summary", "main", "run", "summary_text"]

AIM_WAIT = 2.0  # seconds an aimed cut waits for its call before cutting anyway (not a timing test)
LINGER = 0.02  # seconds, at most, a child runs on the dead disk before the kill


# -- the summary checkpoints -------------------------------------------------------------


def check_summary(root: str, max_bytes: int, floor: list[int]) -> list[str]:
    """Check the summary checkpoint after a cut against ``floor[0]``, the newest ``n`` reported.

    ``floor[0]`` moves up to what the file holds.
    """
    try:
        found = load_summary(root, KEY)
    except CheckpointError as exc:
        return [f"the summary checkpoint does not load: {exc}"]
    if found is None:
        if floor[0] >= 0:
            return [f"the summary checkpoint is gone; n={floor[0]} was reported written"]
        return []
    head = found.summary.partition("\n")[0]
    if not head.startswith("n=") or not head[2:].isdigit():
        return [f"the summary has no sequence number: {found.summary[:60]!r}"]
    n = int(head[2:])
    problems = []
    watermark = safe_watermark(state_for(n, max_bytes)["messages"], KEEP_LAST)
    if found.summary != summary_text(n, summary_bytes(max_bytes)):
        problems.append(f"the summary is not the summary of n={n} (mixed/torn)")
    if (found.watermark, found.covered_messages) != (watermark, watermark):
        problems.append(f"the summary of n={n} has watermark {found.watermark}, not {watermark}")
    if n < floor[0]:
        problems.append(f"the summary holds n={n}, older than n={floor[0]} reported or seen")
    floor[0] = max(floor[0], n)
    return problems


# -- the parent ----------------------------------------------------------------------------


@dataclass
class Summary:
    """What a power-cut run did and found."""

    store: str
    model: str
    seed: int
    max_bytes: int
    mutate: str | None = None
    cuts: int = 0
    aimed: int = 0
    missed: int = 0  # aimed at a call that did not come in time: cut at that moment
    timed: int = 0
    early: int = 0
    writes: int = 0  # store commits that returned
    returned: int = 0  # Written results the writer returned to the program
    summaries: int = 0
    max_seq: int = 0
    undone: int = 0  # cuts after which the disk had dropped something
    zero_filled: int = 0  # files the ext4 model padded with zeros
    torn: int = 0
    zero_tails: int = 0
    stale_locks: Counter[str] = field(default_factory=Counter)
    temps: set[str] = field(default_factory=set)  # dead writers' temps a cut left
    swept: set[str] = field(default_factory=set)  # of those, seen gone after the next open
    caught_at: int | None = None
    seconds: float = 0.0
    steps: Counter[str] = field(default_factory=Counter)
    backends: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)

    @property
    def losses(self) -> int:
        return len(self.problems)

    def lines(self) -> list[str]:
        what = f"with the {self.mutate!r} mutation, " if self.mutate else ""
        locks = ", ".join(f"{k} {v}" for k, v in sorted(self.stale_locks.items())) or "none"
        return [
            f"powercut: {self.cuts} power cuts ({self.model} model) under a process "
            f"checkpointing to the {self.store!r} store, {what}states up to "
            f"{self.max_bytes / MIB:.1f} MiB, seed {self.seed}, {self.seconds:.1f} s",
            "  backends: " + ", ".join(f"{k} {v}" for k, v in sorted(self.backends.items())),
            f"  cuts: {self.aimed} right after a chosen call ({self.missed} of them waited "
            f"in vain and cut at that moment), {self.timed} at a random moment, "
            f"{self.early} while the child started",
            "  the power went right after: "
            + ", ".join(f"{k} {v}" for k, v in self.steps.most_common()),
            f"  Written returned to the program: {self.returned}; store commits returned: "
            f"{self.writes}; summary checkpoints reported: {self.summaries}; seq reached "
            f"{self.max_seq}",
            f"  cuts that dropped unsynced data or entries: {self.undone}; files left "
            f"zero-filled: {self.zero_filled}; torn journal tails ignored by load: {self.torn} "
            f"(all zeros: {self.zero_tails})",
            f"  stale lock files after a cut ({locks}), each taken by the next writer; "
            f"dead writers' temp files a cut left: {len(self.temps)}, swept by the next open: "
            f"{len(self.swept)}",
            f"  after every cut every key loaded, held exactly one state the child produced, "
            f"at least as new as every Written returned and commit reported, and the next "
            f"writer opened, swept and wrote: {'yes' if not self.problems else 'NO'}",
            *(f"  LOST: {p}" for p in self.problems),
            f"store={self.store} model={self.model} cuts={self.cuts} writes={self.writes} "
            f"returned={self.returned} summaries={self.summaries} undone={self.undone} "
            f"temps={len(self.temps)} swept={len(self.swept)} torn={self.torn} "
            f"zero_tails={self.zero_tails} stale_locks={sum(self.stale_locks.values())} "
            f"losses={self.losses}",
        ]


class _Planner:
    """Where the next cut goes: right after a chosen call, at a random moment, or early.

    Aimed cuts go to the step aimed at least so far; a step whose call did
    not come twice in a row is given up for this run (``truncate journal``
    happens only after a cut that left a torn tail, say).
    """

    def __init__(
        self, rng: random.Random, steps: Sequence[str], early: float, timed: float
    ) -> None:
        self.rng = rng
        self.steps = list(steps)
        self.early = early
        self.timed = timed
        self.aims: Counter[str] = Counter()
        self.misses: Counter[str] = Counter()
        self.seen: dict[str, int] = {}  # the most calls of a label one mount has seen

    def next(self) -> tuple[str, str, int]:
        dice = self.rng.random()
        if dice < self.early or not self.steps:
            return ("early", "", 0)
        if dice < self.early + self.timed:
            return ("timed", "", 0)
        fewest = min(self.aims[step] for step in self.steps)
        label = self.rng.choice([step for step in self.steps if self.aims[step] == fewest])
        self.aims[label] += 1
        most = self.seen.get(label, 4)
        return ("aim", label, self.rng.randint(1, max(1, min(4, most))))

    def saw(self, counts: dict[str, int], aimed: str | None, hit: bool) -> None:
        for label, count in counts.items():
            self.seen[label] = max(self.seen.get(label, 0), count)
        if aimed is None:
            return
        if hit:
            self.misses[aimed] = 0
            return
        self.misses[aimed] += 1
        if self.misses[aimed] >= 2 and aimed in self.steps:
            self.steps.remove(aimed)


def run(
    cuts: int = 200,
    *,
    store: str = "file",
    model: str = "strict",
    mutate: str | None = None,
    max_bytes: int = MIB,
    max_delay: float = 0.25,
    early: float = 0.1,
    timed: float = 0.2,
    seed: int | None = None,
    root: str | os.PathLike[str] | None = None,
    stop_on_loss: bool = False,
    progress: Callable[[str], object] | None = None,
) -> Summary:
    """Cut the power ``cuts`` times under a checkpointing child; check the store after each.

    Args:
        cuts: how many children to start and cut the power under.
        store: a name in ``STORES``.
        model: ``"strict"`` or ``"ext4"`` (see ``tests._powerfs.disk``).
        mutate: a name in ``MUTATIONS``: the children run with that defect.
        max_bytes: the largest state (see ``state_for``).
        max_delay: a cut at a random moment comes within this many seconds
            after the child is ready.
        early: the share of cuts while the child starts (its open, load,
            lock and first write); ``timed``: the share at a random moment;
            the rest go right after a chosen call.  A mutation run aims only.
        seed: chooses backends, cut points and the children's behaviour;
            random if None (printed).
        root: where the disk and the mount point go (a fresh temp directory
            by default, removed afterwards).
        stop_on_loss: stop at the first problem (``caught_at`` says when).
        progress: called with a line after every cut.
    """
    kind = STORES[store]
    seed = random.randrange(2**32) if seed is None else seed
    rng = random.Random(seed)
    summary = Summary(store=store, model=model, seed=seed, max_bytes=max_bytes, mutate=mutate)
    loops = [*backends(), "sync"]
    if mutate is not None:
        planner = _Planner(rng, MUTATIONS[mutate].steps, 0.0, 0.0)
        planner.seen = dict.fromkeys(MUTATIONS[mutate].steps, 4)
    else:
        planner = _Planner(rng, kind.steps, early, timed)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        where = stack.enter_context(scratch(root, "powercut"))
        zygote = stack.enter_context(contextlib.closing(Zygote("tests.powercut")))
        backing = os.path.join(where, "disk")
        mountpoint = os.path.join(where, "mnt")
        on_disk = os.path.join(backing, "store")  # the store's root, as the checks read it
        floor, summary_floor = Reported(), [-1]
        debris: set[str] = set()  # dead writers' temp files the last cuts left, not yet swept
        follow: tuple[str, str, int] | None = None  # a step that only the last cut made possible
        following = PowerFS(backing, mountpoint, model)
        stack.callback(lambda: following.close())  # the one started for a cut never made
        for i in range(cuts):
            plan = planner.next()
            if mutate is None and i == 0 and "mkdir" in kind.steps:
                plan = ("aim", "mkdir", 1)  # the fresh root: right after its mkdir
            elif follow is not None:
                plan, follow = follow, None
            if mutate is not None:  # past the first write, whose W the cut must not lose
                plan = (plan[0], plan[1], max(2, plan[2]))
            backend = rng.choice(loops)
            summary.backends[backend] += 1
            mutation = MUTATIONS[mutate] if mutate is not None else None
            linger = mutation.linger if mutation is not None else rng.uniform(0.0, LINGER)
            spec: dict[str, Any] = {
                "root": os.path.join(mountpoint, "store"),
                "store": store,
                "backend": backend,
                "max_bytes": max_bytes,
                "seed": rng.randrange(2**32),
                "mutate": mutate,
                "neighbour": mutation.neighbour if mutation is not None else NEIGHBOUR_GAP,
            }
            fs, following = following, PowerFS(backing, mountpoint, model)
            fs.mount()
            if i + 1 < cuts:
                following.start()  # the next cut's FUSE process starts while this one serves
            try:
                child, report, hit = _one_cut(fs, zygote, spec, plan, rng, max_delay, linger)
            finally:
                fs.close()
            summary.cuts += 1
            summary.aimed += plan[0] == "aim"
            summary.missed += plan[0] == "aim" and not hit
            summary.timed += plan[0] == "timed"
            summary.early += plan[0] == "early"
            after = (report["frozen"].get("after") or ["(nothing yet)"])[0]
            summary.steps[after] += 1
            summary.undone += bool(report["entries"] or report["files"])
            summary.zero_filled += report["zero_filled"]
            planner.saw(report["counts"], plan[1] if plan[0] == "aim" else None, hit)

            problems = _child_problems(child, debris, summary)
            commits, returned, newest, summarized = _reported(child)
            summary.writes += commits
            summary.returned += returned
            summary.summaries += len(summarized)
            floor.seq, floor.n = max(floor.seq, newest.seq), max(floor.n, newest.n)
            if summarized:
                summary_floor[0] = max(summary_floor[0], max(summarized))
            torn: list[TornTail] = []
            problems += check(kind.make(on_disk), max_bytes, floor, torn)
            if torn:
                if "truncate journal" in kind.steps:  # the next open cuts it off: cut there
                    step = rng.choice(("truncate journal", "fsync journal:truncate"))
                    follow = ("aim", step, 1)
                summary.torn += 1
                summary.zero_tails += _zeros_after(kind.make(on_disk).location(KEY), torn[0])
            if kind.summaries:
                problems += check_summary(on_disk, max_bytes, summary_floor)
            problems += _lock_problems(on_disk, summary)
            debris = {os.path.basename(path) for path in file_leftovers(on_disk)}
            summary.temps |= debris
            summary.max_seq = max(summary.max_seq, floor.seq)
            where_cut = f"after {after!r}"
            summary.problems += [f"cut {i + 1} ({backend}, {where_cut}): {p}" for p in problems]
            if progress is not None:
                aim = f"aim {plan[1]!r} #{plan[2]}" if plan[0] == "aim" else plan[0]
                progress(
                    f"cut {i + 1}/{cuts} {model} {backend:7} {aim}: power went {where_cut}; "
                    f"{returned} Written, {commits} commits, seq {floor.seq}, temps left "
                    f"{len(debris)}, losses {summary.losses}"
                )
            if problems:
                if summary.caught_at is None:
                    summary.caught_at = i + 1
                if stop_on_loss:
                    break
                # Start the next child afresh; the bad file stays, aside, for a look.
                with contextlib.suppress(OSError):
                    kind.make(on_disk).move_aside(KEY, f"lost-{i + 1}")
                if kind.summaries:
                    with contextlib.suppress(OSError):
                        aside = summary_path(on_disk, KEY)
                        os.replace(aside, f"{aside}.lost-{i + 1}")
                floor, summary_floor = Reported(), [-1]
        else:  # no child opens the store after the last cut: open it here
            with contextlib.suppress(OSError):
                kind.make(on_disk).open()
            if file_leftovers(on_disk):
                summary.problems.append("after the last cut: an open left dead writers' temps")
            else:
                summary.swept |= debris
    summary.seconds = time.monotonic() - started
    return summary


def _one_cut(
    fs: PowerFS,
    zygote: Zygote,
    spec: dict[str, Any],
    plan: tuple[str, str, int],
    rng: random.Random,
    max_delay: float,
    linger: float,
) -> tuple[Run, dict[str, Any], bool]:
    """Start a child on the mounted disk, cut the power as planned, kill it, unmount.

    The child runs on for ``linger`` seconds after the power went: what its
    writer tells it then (every call fails) must hold too.
    """
    how, label, count = plan
    if how == "aim":
        fs.arm(label, count)
    pid, child = zygote.spawn(spec)
    hit = False
    try:
        if how == "early":
            if zygote.wait(child, child.started):
                time.sleep(rng.uniform(0.0, 0.03))
        elif how == "timed":
            if zygote.wait(child, child.ready):
                time.sleep(rng.uniform(0.0, max_delay))
        else:
            hit = _wait_frozen(fs, zygote, child)
        fs.freeze()
        time.sleep(linger)
    finally:
        zygote.kill(pid)
    return child, fs.cut(), hit


def _wait_frozen(fs: PowerFS, zygote: Zygote, child: Run) -> bool:
    """Wait until the armed call froze the disk (True), or the child is stuck or ended."""
    deadline = time.monotonic() + HANG_GUARD
    ready_by: float | None = None
    while not fs.frozen.wait(0.005):
        now = time.monotonic()
        if child.ready.is_set() and ready_by is None:
            ready_by = now + AIM_WAIT
        if (ready_by is not None and now > ready_by) or now > deadline:
            return False
        if zygote.proc.poll() is not None or any(
            line.startswith("CORRUPT") for line in child.lines
        ):
            return False
    return True


def _reported(child: Run) -> tuple[int, int, Reported, list[int]]:
    """What the child reported: commits, Written returned, the newest of both, summaries.

    A ``Written`` the writer returned (``R``) and a store commit that
    returned (``W``) are both promises that the state is durable: the newest
    of either is what the disk must hold at least.
    """
    commits = returned = 0
    newest = Reported()
    summarized = []
    for line in child.lines:
        parts = line.split()
        if len(parts) == 3 and parts[0] in ("W", "R"):
            commits += parts[0] == "W"
            returned += parts[0] == "R"
            newest.seq = max(newest.seq, int(parts[1]))
            newest.n = max(newest.n, int(parts[2]))
        elif len(parts) == 2 and parts[0] == "S":
            summarized.append(int(parts[1]))
    return commits, returned, newest, summarized


def _child_problems(child: Run, debris: set[str], summary: Summary) -> list[str]:
    """What the child itself showed: how it ended, its first write, what its open left."""
    problems = []
    if child.status != -signal.SIGKILL:
        tail = "\n".join(child.lines[-5:])
        problems.append(f"the child ended with status {child.status} before the cut:\n{tail}")
    cut_short = False  # the power went before the child was through its start
    for line in child.lines:
        parts = line.split()
        if parts[0] == "E":
            if parts[2] == "other":
                problems.append(f"a store call failed, not by the power cut: {line}")
            else:
                cut_short = True
        elif parts[0] == "OPENED":
            if parts[1] == "eio":
                cut_short = True
            elif parts[1] != "0":
                problems.append(f"the open left {parts[1]} dead writers' temp files")
            else:
                summary.swept |= debris
        elif parts[0] == "READY" and not cut_short and parts[2:] != ["1", "0"]:
            problems.append(
                f"the first write of a new child failed (n={parts[1]}): {parts[2]} written, "
                f"{parts[3]} failed"
            )
        elif parts[0] == "CORRUPT":
            problems.append(f"the child could not load the checkpoint: {line}")
    return problems


def _zeros_after(path: str, torn: TornTail) -> bool:
    with open(path, "rb") as f:
        f.seek(torn.offset)
        tail = f.read()
    return bool(tail) and not tail.strip(b"\0")


def _lock_problems(root: str, summary: Summary) -> list[str]:
    """Count the stale lock file a cut left; a problem if it looks held by a live writer."""
    path = os.path.join(root, KEY + ".lock")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    kind = "empty" if not data else "zeros" if not data.strip(b"\0") else "naming the writer"
    summary.stale_locks[kind] += 1
    probe = probe_file_lock(path)
    if probe is not None and probe.alive and (probe.holder is None or _ours(probe.holder.pid)):
        return [f"the lock file of the cut writer looks held: {probe}"]
    return []


def _ours(pid: int) -> bool:
    """Whether ``pid`` is still one of our dead children (not reused by another process)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"tests.powercut" in f.read()
    except OSError:
        return False


# -- the command ---------------------------------------------------------------------------


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m tests.powercut",
        description="Cut the power under a checkpointing process (a FUSE filesystem that "
        "forgets what was not synced) and check what was durable after every cut.",
    )
    p.add_argument("--cuts", type=int, default=200, help="cuts per store and model (default 200)")
    p.add_argument(
        "--store",
        action="append",
        choices=[*STORES, "all"],
        help="the store, repeatable (default file); 'all' is every store",
    )
    p.add_argument(
        "--model",
        action="append",
        choices=[*MODELS, "all"],
        help="what a cut forgets, repeatable (default all): 'strict' or 'ext4'",
    )
    p.add_argument(
        "--mutate",
        action="append",
        choices=[*MUTATIONS, "all"],
        help="remove this fsync in the children and show a cut catches it (repeatable)",
    )
    p.add_argument("--max-mib", type=float, default=1.0, help="largest state in MiB (default 1)")
    p.add_argument("--seed", type=int, default=None, help="seed (default: random, printed)")
    p.add_argument("--root", default=None, help="where disk and mount go (default: a temp dir)")
    p.add_argument("-q", "--quiet", action="store_true", help="print the summaries only")
    p.add_argument("--zygote", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _chosen(names: list[str] | None, default: list[str], every: Sequence[str]) -> list[str]:
    chosen: list[str] = []
    for name in names or default:
        for one in every if name == "all" else [name]:
            if one not in chosen:
                chosen.append(one)
    return chosen


def main(argv: Sequence[str] | None = None) -> int:
    """The command; exit status 1 on a loss (or, with ``--mutate``, on a mutation not caught)."""
    args = _parse(argv)
    if args.zygote:
        return fork_children(run_child)
    if args.cuts < 1 or args.max_mib <= 0:
        print("powercut: --cuts must be >= 1 and --max-mib > 0", file=sys.stderr)
        return 2
    from tests._powerfs import unavailable

    reason = unavailable()
    if reason is not None:
        print(f"powercut: cannot mount the power-cut filesystem: {reason}", file=sys.stderr)
        return 2
    models = _chosen(args.model, ["all"], MODELS)
    max_bytes = int(args.max_mib * MIB)
    say = None if args.quiet else (lambda line: print(line, flush=True))
    if args.mutate:
        return _mutations(_chosen(args.mutate, [], list(MUTATIONS)), models, args, max_bytes, say)
    failed = 0
    rows = []
    for store in _chosen(args.store, ["file"], list(STORES)):
        for model in models:
            summary = run(
                args.cuts,
                store=store,
                model=model,
                max_bytes=max_bytes,
                seed=args.seed,
                root=None if args.root is None else os.path.join(args.root, store, model),
                progress=say,
            )
            print("\n".join(summary.lines()), flush=True)
            rows.append(summary)
            failed += summary.losses
    print("\n".join(_table(rows) + _steps_table(rows)), flush=True)
    return 1 if failed else 0


def _table(rows: list[Summary]) -> list[str]:
    out = [
        "",
        "| store | model | cuts (aimed / random / starting) | Written returned / commits | "
        "summaries reported | cuts that dropped something | zero-filled files | "
        "torn tails ignored | temps left / swept | states lost |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in rows:
        out.append(
            f"| {s.store} | {s.model} | {s.cuts} ({s.aimed} / {s.timed} / {s.early}) | "
            f"{s.returned} / {s.writes} | {s.summaries if s.store == 'summary' else '-'} | "
            f"{s.undone} | {s.zero_filled} | {s.torn} | {len(s.temps)} / {len(s.swept)} | "
            f"{s.losses} |"
        )
    return out


def _steps_table(rows: list[Summary]) -> list[str]:
    """Cuts per store (both models together) by the call right before the power went."""
    stores = list(dict.fromkeys(s.store for s in rows))
    steps: Counter[tuple[str, str]] = Counter()
    for s in rows:
        for label, count in s.steps.items():
            steps[s.store, label] += count
    order = [step for kind in STORES.values() for step in kind.steps]
    labels = sorted(
        {label for _, label in steps},
        key=lambda label: (order.index(label) if label in order else len(order), label),
    )
    out = [
        "",
        "| the power went right after | " + " | ".join(stores) + " |",
        "|---|" + "---|" * len(stores),
    ]
    for label in labels:
        cells = " | ".join(str(steps[store, label]) for store in stores)
        out.append(f"| `{label}` | {cells} |")
    return out


MUTATION_CUTS = 5
"""A mutation must be caught within this many cuts (they are aimed, so it is bounded)."""


def _mutations(
    names: list[str],
    models: list[str],
    args: argparse.Namespace,
    max_bytes: int,
    say: Callable[[str], object] | None,
) -> int:
    missed = 0
    out = [
        "",
        "| mutation | store | model | caught at cut | what the check saw |",
        "|---|---|---|---|---|",
    ]
    for name in names:
        mutation = MUTATIONS[name]
        for model in models:
            summary = run(
                min(args.cuts, MUTATION_CUTS),
                store=mutation.store,
                model=model,
                mutate=name,
                max_bytes=max_bytes,
                seed=args.seed,
                stop_on_loss=True,
                progress=say,
            )
            first = summary.problems[0].split(": ", 1)[1] if summary.problems else "nothing"
            first = re.sub(r"/\S*/disk/store/", "", first)  # the temp directory's path
            caught = f"{summary.caught_at} (of {MUTATION_CUTS})" if summary.caught_at else "NOT"
            out.append(f"| {name} | {mutation.store} | {model} | {caught} | {first[:120]} |")
            missed += summary.caught_at is None
    print("\n".join(out), flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
