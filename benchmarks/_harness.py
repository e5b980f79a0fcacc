"""What every case shares: statistics, the report shape, a loop ticker, scratch space."""

from __future__ import annotations

import contextlib
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import anyio
import anyio.abc
import msgspec

__all__ = [
    "Cell",
    "Ratio",
    "Report",
    "Stat",
    "Table",
    "Ticker",
    "bytes_written",
    "machine",
    "paired",
    "percentile",
    "ratio",
    "scratch_dir",
    "stat",
]

Unit = Literal["s", "B", "x", ""]


class Stat(msgspec.Struct, frozen=True, kw_only=True):
    """A measured quantity: median and p10-p90 spread of repeated samples."""

    median: float
    p10: float
    p90: float
    unit: Unit = "s"
    samples: list[float] = msgspec.field(default_factory=list)


Cell = Stat | float | int | str | None


class Table(msgspec.Struct, kw_only=True):
    title: str
    columns: list[str]
    rows: list[list[Cell]]


class Ratio(msgspec.Struct, frozen=True, kw_only=True):
    """A ratio against a baseline of the same run, and the bar it must clear.

    ``ok`` is None when the ratio could not be measured (a peer that is not
    installed) or carries no bar.
    """

    name: str
    value: float | None
    op: Literal["<", "<=", ">=", ""] = ""
    bar: float | None = None
    ok: bool | None = None
    note: str = ""


class Report(msgspec.Struct, kw_only=True):
    """What a case's ``main(quick)`` returns, as ``msgspec.to_builtins(report)``."""

    title: str
    tables: list[Table] = msgspec.field(default_factory=list)
    ratios: list[Ratio] = msgspec.field(default_factory=list)
    series: dict[str, list[tuple[float, Stat]]] = msgspec.field(default_factory=dict)
    notes: list[str] = msgspec.field(default_factory=list)


def percentile(sorted_samples: Sequence[float], q: float) -> float:
    """The q-th quantile (0..1) of already sorted samples, linearly interpolated."""
    if not sorted_samples:
        return math.nan
    pos = (len(sorted_samples) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_samples) - 1)
    return sorted_samples[lo] + (sorted_samples[hi] - sorted_samples[lo]) * (pos - lo)


def stat(samples: Sequence[float], unit: Unit = "s", *, keep: bool = True) -> Stat:
    """Median and p10-p90 of ``samples`` (kept for the JSON unless ``keep`` is False)."""
    ordered = sorted(samples)
    return Stat(
        median=percentile(ordered, 0.5),
        p10=percentile(ordered, 0.1),
        p90=percentile(ordered, 0.9),
        unit=unit,
        samples=list(samples) if keep else [],
    )


def paired(numerators: Sequence[float], denominators: Sequence[float]) -> float:
    """Median of per-pair ratios: each pair ran back to back, so drift cancels."""
    ratios = sorted(a / b for a, b in zip(numerators, denominators, strict=True) if b > 0)
    return percentile(ratios, 0.5)


def ratio(
    name: str,
    value: float | None,
    op: Literal["<", "<=", ">=", ""] = "",
    bar: float | None = None,
    note: str = "",
) -> Ratio:
    """A ratio line; ``ok`` is computed from ``op`` and ``bar``."""
    ok: bool | None = None
    if value is not None and bar is not None and not math.isnan(value):
        ok = value < bar if op == "<" else value <= bar if op == "<=" else value >= bar
    return Ratio(name=name, value=value, op=op, bar=bar, ok=ok, note=note)


# -- measuring ---------------------------------------------------------------


class Ticker:
    """A task that asks to wake every ``period`` seconds and records how late it was.

    Its lag is the event-loop stall a latency-sensitive task of the agent
    (a websocket heartbeat, a UI stream) would see.
    """

    def __init__(self, period: float = 0.001) -> None:
        self.period = period
        self.lags: list[float] = []
        self._scope: anyio.CancelScope | None = None

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        period = self.period
        clock = time.perf_counter
        with anyio.CancelScope() as self._scope:
            task_status.started()
            while True:
                t0 = clock()
                await anyio.sleep(period)
                self.lags.append(clock() - t0 - period)

    def mark(self) -> int:
        return len(self.lags)

    def since(self, mark: int) -> list[float]:
        return self.lags[mark:]

    def stop(self) -> None:
        if self._scope is not None:
            self._scope.cancel()


@contextlib.asynccontextmanager
async def ticking(period: float = 0.001) -> Any:
    """Run a ``Ticker`` for the duration of the block."""
    ticker = Ticker(period)
    async with anyio.create_task_group() as tg:
        await tg.start(ticker.run)
        await anyio.sleep(period * 3)  # let it reach its steady state
        try:
            yield ticker
        finally:
            ticker.stop()


def bytes_written() -> int | None:
    """Bytes this process has passed to write(2) so far, all threads (Linux).

    A uniform measure of what each approach writes, including what a
    database writes to its journal; None where ``/proc/self/io`` is missing.
    """
    try:
        with open("/proc/self/io", encoding="ascii") as f:
            for line in f:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def timeit_min(func: Callable[[], object], number: int) -> float:
    """Seconds per call of ``func`` over a loop of ``number`` calls."""
    t0 = time.perf_counter()
    for _ in range(number):
        func()
    return (time.perf_counter() - t0) / number


@contextlib.contextmanager
def scratch_dir(prefix: str) -> Iterator[str]:
    """A fresh directory on the disk under test (next to the repository)."""
    base = os.environ.get("CHECKPOINTER_BENCH_DIR") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results", "scratch"
    )
    os.makedirs(base, exist_ok=True)
    path = tempfile.mkdtemp(prefix=prefix, dir=base)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _filesystem(path: str) -> str:
    try:
        out = subprocess.run(
            ["df", "-T", path], capture_output=True, text=True, timeout=10, check=False
        ).stdout.splitlines()
        device, fstype = out[-1].split()[:2]
        return f"{fstype} on {device}"
    except (OSError, IndexError, ValueError, subprocess.SubprocessError):
        return "unknown"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict[str, str]:
    """What the figures were measured on."""
    import importlib.metadata as md

    versions = {}
    for dist in ("anyio", "msgspec", "aiofiles", "langgraph-checkpoint-sqlite", "matplotlib"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            versions[dist] = "not installed"
    with scratch_dir("fs-") as probe:
        fs = _filesystem(probe)
    return {
        "nproc": str(os.cpu_count()),
        "cpu": _cpu_model(),
        "python": sys.version.split()[0],
        "os": f"{platform.system()} {platform.release()}",
        "filesystem": fs,
        **versions,
    }
