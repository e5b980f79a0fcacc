"""The power-cut torture's child: checkpoint without pause on the mounted disk, until cut.

Forked by the helper of ``tests/powercut.py`` (``--zygote``) for every cut,
with a spec: the store's root on the mount, the store (``STORES``), the
backend (asyncio, trio, uvloop, or ``sync``: the synchronous writer), the
largest state, a seed, whether a *neighbour* runs, and a mutation
(``MUTATIONS``: one fsync removed, the sweep disabled, or a failed commit
reported written; in this process only).  It resumes from what the store
holds, runs a real ``CheckpointWriter`` and says on stdout (``<pid> <line>``,
one atomic write each): ``START``, ``READY <n> <writes> <failures>`` after
the writer's open and first write, ``OPENED <n>`` (dead writers' temp files
left after ``open()``), ``R <seq> <n>`` for every ``Written`` that
``write_now()`` or ``flush_sync()`` returned to the program (what the writer
tells the program is durable), ``W <seq> <n>`` after every store commit that
returned (the timer's writes too), ``S <n>`` after every summary checkpoint
written, ``E <call> eio|other <error>`` for every store call that raised
(EIO is the power cut), ``EIO load`` when the power went while it loaded,
``CORRUPT <error>``.

The neighbour is a thread that fsyncs the store's root at random moments,
as another session's write in the same root does: a temp file of this
writer then becomes durable while it is being written, so a cut can leave
it behind for the next writer's ``open()`` to sweep (without a neighbour no
temp file is ever durable: the writer's own directory fsync comes after its
rename).
"""

from __future__ import annotations

import errno
import hashlib
import inspect
import math
import os
import random
import stat
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec

import checkpointer._stores.atomic
import checkpointer._stores.files
import checkpointer._stores.flock
import checkpointer._stores.journal.file
import checkpointer._stores.safefs
import checkpointer._stores.summaries
from checkpointer import (
    Checkpoint,
    CheckpointError,
    CheckpointWriter,
    FileStore,
    JournalStore,
    Meta,
    Result,
    Snapshot,
    Transcript,
    load,
)
from checkpointer._stores.atomic import _TEMP_RE
from checkpointer._stores.base import KeyLock
from checkpointer._transcript.summary import safe_watermark
from checkpointer.stores import Staged, Store
from checkpointer.summaries import SummaryCheckpoint, collapse, load_summary, write_summary
from tests._support.harness import (
    KEY,
    LockingTappedStore,
    file_leftovers,
    file_transcript,
    on_loop,
    returned,
    say,
    sealed,
    state_for,
    victim,
)

__all__ = ["KEEP_LAST", "MUTATIONS", "STORES", "run_child", "summary_bytes", "summary_text"]

KEEP_LAST = 3  # messages a summary checkpoint leaves verbatim


# -- stores --------------------------------------------------------------------------------


_FILE_STEPS = (
    "create temp.json",
    "chmod temp.json",
    "write temp.json",
    "fsync temp.json",
    "rename temp.json",
    "fsyncdir",
    "mkdir",
    "create lock",
    "truncate lock",
    "write lock",
)
_JOURNAL_STEPS = (
    "write journal:append",
    "fsync journal:append",
    "write journal:compaction",
    "fsync journal:compaction",
    "create temp.jsonl",
    "chmod temp.jsonl",
    "write temp.jsonl",
    "fsync temp.jsonl",
    "rename temp.jsonl",
    "fsyncdir",
    "truncate journal",
    "fsync journal:truncate",
    "mkdir",
    "create lock",
    "write lock",
)
_SUMMARY_STEPS = (
    "create temp.md",
    "write temp.md",
    "fsync temp.md",
    "rename temp.md",
    "mkdir",
    *_FILE_STEPS[:6],
)


@dataclass(frozen=True)
class PowerStore:
    """A store to torture: how to make one, the steps to aim cuts at, whether it summarizes."""

    make: Callable[[str], Store]
    steps: tuple[str, ...]
    summaries: bool = False


STORES: dict[str, PowerStore] = {
    "file": PowerStore(FileStore, _FILE_STEPS),
    "file-transcript": PowerStore(file_transcript, _FILE_STEPS),
    "journal": PowerStore(JournalStore, _JOURNAL_STEPS),
    "file-sealed": PowerStore(sealed(FileStore), _FILE_STEPS),
    "journal-sealed": PowerStore(sealed(JournalStore), _JOURNAL_STEPS),
    "summary": PowerStore(FileStore, _SUMMARY_STEPS, summaries=True),
}
"""The stores to cut the power under; ``summary`` adds summary checkpoints to a ``FileStore``."""


@dataclass(frozen=True)
class Mutation:
    """One defect put in, the store it matters to, and the steps that expose it.

    ``neighbour``: the most seconds between two of the neighbour's directory
    fsyncs in the children, 0 for none (none for the removed fsyncs, whose
    loss a neighbour's directory fsync could mend);
    ``linger``: seconds the child runs on after the power went, before it
    is killed (its calls then fail with EIO).
    """

    store: str
    steps: tuple[str, ...]
    what: str
    neighbour: float = 0.0
    linger: float = 0.0


MUTATIONS: dict[str, Mutation] = {
    "file-fsync": Mutation(
        "file",
        ("rename temp.json", "fsyncdir", "create temp.json"),
        "write_atomic without the fsync of the temp file",
    ),
    "dir-fsync": Mutation(
        "file",
        ("rename temp.json", "create temp.json", "fsync temp.json"),
        "write_atomic without the fsync of the directory after the rename",
    ),
    "journal-fsync": Mutation(
        "journal",
        ("write journal:append",),
        "the journal append without its fsync",
    ),
    "sweep": Mutation(
        "file",
        ("fsync temp.json", "rename temp.json"),
        "FileStore.open without the sweep of dead writers' temp files",
        neighbour=0.001,  # often: a cut leaves a temp file within a few cuts
    ),
    "written-on-failure": Mutation(
        "file",
        ("write temp.json", "fsync temp.json", "rename temp.json"),
        "the writer returns Written for a commit that raised (EIO)",
        linger=0.2,
    ),
}
"""The defects the torture must be shown to catch; each is put in by a seam in the child."""

NEIGHBOUR_GAP = 0.01  # seconds, at most, between two of the neighbour's directory fsyncs


def _mutate(kind: str) -> None:
    """Put one defect into the code under test, in this (child) process only.

    A removed fsync: ``os.fsync`` is replaced by one that does nothing for
    the chosen descriptors, and so are the ``fsync=os.fsync`` defaults bound
    at import in the store modules.  ``sweep``: every ``sweep_temps`` the
    store modules imported removes nothing.  ``written-on-failure`` is in
    ``_Reporting.commit``.  Not flags of the library: test seams.
    """
    if kind == "written-on-failure":
        return
    if kind == "sweep":
        swept = 0
        for name, module in list(sys.modules.items()):
            if name.startswith("checkpointer.") and hasattr(module, "sweep_temps"):
                setattr(module, "sweep_temps", _sweep_nothing)  # noqa: B010  # the seam
                swept += 1
        if not swept:
            raise RuntimeError("no store module imports sweep_temps: the seam is gone")
        return
    real = os.fsync

    def fsync(fd: Any) -> None:
        if not _dropped(kind, fd if isinstance(fd, int) else fd.fileno()):
            real(fd)

    os.fsync = fsync
    modules = (
        checkpointer._stores.atomic,
        checkpointer._stores.journal.file,
        checkpointer._stores.files,
        checkpointer._stores.flock,
        checkpointer._stores.safefs,
        checkpointer._stores.summaries,
    )
    for module in modules:
        for function in vars(module).values():
            if not inspect.isfunction(function):
                continue
            if function.__defaults__:
                function.__defaults__ = tuple(
                    fsync if value is real else value for value in function.__defaults__
                )
            keywords = function.__kwdefaults__ or {}
            for name, value in keywords.items():
                if value is real:
                    keywords[name] = fsync


def _sweep_nothing(directory: str) -> list[str]:
    return []


def _dropped(kind: str, fd: int) -> bool:
    mode = os.fstat(fd).st_mode
    if kind == "dir-fsync":
        return stat.S_ISDIR(mode) and _called_from() == "write_atomic"
    if not stat.S_ISREG(mode):
        return False
    name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
    if kind == "file-fsync":
        return _TEMP_RE.match(name) is not None
    if kind == "journal-fsync":
        return name.endswith(".jsonl")
    raise ValueError(f"unknown mutation {kind!r}")


def _called_from() -> str | None:
    """Which of write_atomic and makedirs_durable the current fsync is made for, if either."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name in ("write_atomic", "makedirs_durable"):
            return frame.f_code.co_name
        frame = frame.f_back  # type: ignore[assignment]
    return None


# -- the summary checkpoints -----------------------------------------------------------------


def summary_text(n: int, max_bytes: int) -> str:
    """The summary the child writes at sequence number ``n``: says ``n``, then filler."""
    size = int(math.exp(random.Random(f"summary/{n}").uniform(math.log(64), math.log(max_bytes))))
    tag = hashlib.blake2b(f"summary/{n}".encode(), digest_size=16).hexdigest()
    return f"n={n}\n" + (tag * (size // len(tag) + 1))[:size]


def summary_bytes(max_bytes: int) -> int:
    return max(65, max_bytes // 16)


# -- the child -----------------------------------------------------------------------------


def _eio(exc: BaseException) -> bool:
    """Whether an error is the power cut itself (the frozen disk answers EIO)."""
    return getattr(exc, "errno", None) == errno.EIO or "Input/output error" in str(exc)


class _Reporting(LockingTappedStore):
    """The torture's reporting store, which also says what failed and what ``open()`` left.

    ``E <call> eio|other <error>`` for every store call that raised (EIO is
    the power cut; anything else is for the parent to judge), ``OPENED <n>``
    after ``open()``: how many temp files of dead writers are still there.
    """

    def _failed(self, call: str, exc: BaseException) -> None:
        text = " ".join(str(exc).split())[:300]
        say(f"E {call} {'eio' if _eio(exc) else 'other'} {type(exc).__name__}: {text}")

    def open(self) -> None:
        try:
            super().open()
        except Exception as exc:
            self._failed("open", exc)
            raise
        try:
            left = file_leftovers(os.path.dirname(self.location(KEY)))
        except OSError:
            say("OPENED eio")
        else:
            say(f"OPENED {len(left)}")

    swallow = False  # the written-on-failure mutation: a commit's error is not raised

    def commit(self, key: str, meta: Meta, staged: Staged, **kw: Any) -> int:
        try:
            return super().commit(key, meta, staged, **kw)
        except Exception as exc:
            self._failed("commit", exc)
            if self.swallow:
                return 0  # the writer takes the commit for done: it returns Written
            raise

    def read_meta(self, key: str) -> Meta | None:
        try:
            return super().read_meta(key)
        except Exception as exc:
            self._failed("read_meta", exc)
            raise

    def update_meta(self, key: str, meta: Meta, *, expected: str) -> None:
        try:
            super().update_meta(key, meta, expected=expected)
        except Exception as exc:
            self._failed("update_meta", exc)
            raise

    def read_checkpoint(self, key: str) -> Checkpoint[msgspec.Raw] | None:
        try:
            return super().read_checkpoint(key)
        except Exception as exc:
            self._failed("read_checkpoint", exc)
            raise

    def lock(self, key: str, *, timeout: float = 0.0) -> KeyLock:
        try:
            return super().lock(key, timeout=timeout)
        except Exception as exc:
            self._failed("lock", exc)
            raise


def _start(spec: dict[str, Any]) -> tuple[_Reporting, int] | int:
    """The child's store and the ``n`` to resume from, or an exit code."""
    if spec.get("mutate"):
        _mutate(spec["mutate"])
    cache = Transcript() if spec["store"] == "file-transcript" else None
    store = _Reporting(STORES[spec["store"]].make(spec["root"]), cache)
    store.swallow = spec.get("mutate") == "written-on-failure"
    if spec.get("neighbour"):
        threading.Thread(
            target=_neighbour,
            args=(spec["root"], float(spec["neighbour"]), spec["seed"]),
            daemon=True,
            name="neighbour",
        ).start()
    try:
        previous = load(store, KEY)
        n = 0 if previous is None else int(previous.state["n"])
        if STORES[spec["store"]].summaries:
            # The state may be older than the summary (its write was still
            # due at the cut): go on from the newer, as an agent whose
            # summary covers more than its transcript would start over from
            # the summary, so summaries never go back.
            summary = load_summary(spec["root"], KEY)
            if summary is not None:
                n = max(n, int(summary.summary.partition("\n")[0][2:]))
    except (CheckpointError, OSError) as exc:
        if _eio(exc):  # the power went while it loaded: wait for the kill
            say("EIO load")
            parent = os.getppid()
            while os.getppid() == parent:  # not for ever: the helper may be gone
                time.sleep(0.1)
            return 5
        say(f"CORRUPT {exc}")
        return 3
    return store, n


def _neighbour(root: str, gap: float, seed: int) -> None:
    """Fsync ``root`` every 0 to ``gap`` seconds, as another key's write in the same root does."""
    parent = os.getppid()
    rng = random.Random(seed ^ 0x5EED)
    while os.getppid() == parent:
        time.sleep(rng.uniform(0.0, gap))
        try:
            fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue  # not made yet, or the power is out
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)


async def _summarize(root: str, n: int, max_bytes: int) -> None:
    messages = state_for(n, max_bytes)["messages"]
    text = summary_text(n, summary_bytes(max_bytes))
    done = await collapse(lambda _: text, root, KEY, messages, keep_last=KEEP_LAST)
    if isinstance(done, SummaryCheckpoint):
        say(f"S {n}")


def _summarize_sync(root: str, n: int, max_bytes: int) -> None:
    watermark = safe_watermark(state_for(n, max_bytes)["messages"], KEEP_LAST)
    if watermark == 0:
        return
    text = summary_text(n, summary_bytes(max_bytes))
    checkpoint = SummaryCheckpoint(watermark, text, datetime.now(UTC), watermark)
    try:
        write_summary(root, KEY, checkpoint)
    except OSError:
        return
    say(f"S {n}")


async def _child(spec: dict[str, Any]) -> int:
    """Checkpoint a session that changes without pause, on an event loop, until killed."""
    started = _start(spec)
    if isinstance(started, int):
        return started
    store, n = started
    if not STORES[spec["store"]].summaries:
        return await victim(store, n, spec)

    async def summarize(n: int) -> None:
        await _summarize(spec["root"], n, int(spec["max_bytes"]))

    return await victim(store, n, spec, summarize)


def _sync_child(spec: dict[str, Any]) -> int:
    """The same with the synchronous writer: ``flush_sync`` from this thread and from others."""
    parent = os.getppid()
    started = _start(spec)
    if isinstance(started, int):
        return started
    store, n = started
    summaries = STORES[spec["store"]].summaries
    max_bytes = int(spec["max_bytes"])
    rng = random.Random(spec["seed"])

    def source() -> Snapshot:
        return Snapshot(KEY, state_for(n, max_bytes))

    writer = CheckpointWriter(source, store)
    say("START")
    with writer:
        stats = writer.statistics()
        say(f"READY {n} {stats.writes} {stats.failures}")
        while os.getppid() == parent:
            n += 1
            writer.notify()
            dice = rng.random()
            if dice < 0.25:
                returned(writer.flush_sync(), n)
            elif dice < 0.35:
                results: list[Result] = []
                worker = threading.Thread(target=_flush_into, args=(writer, results))
                worker.start()
                worker.join()
                returned(results[0], n)
            elif summaries and dice < 0.4:
                _summarize_sync(spec["root"], n, max_bytes)
            else:
                time.sleep(rng.uniform(0.0, 0.004))
    return 4


def _flush_into(writer: CheckpointWriter[Any], results: list[Result]) -> None:
    results.append(writer.flush_sync())


def run_child(spec: dict[str, Any]) -> int:
    if spec["backend"] == "sync":
        return _sync_child(spec)
    return on_loop(_child, spec)
