"""Charts of a run, drawn when matplotlib is installed (extra ``bench``).

Each chart is drawn from the series of the cases it names, and every point
or bar carries its median as the tables print it, so a chart and the table
beside it show the same numbers:

* ``growth``: checkpoint cost against history length (the growth case);
* ``stall``: worst event-loop stall per approach (stall, peers, journal);
* ``sessions``: per-writer costs against the number of sessions;
* ``groupcommit``: a burst's checkpoints per second against the number of
  sessions, per backend: group commit, each directory fsync alone, the
  bare per-file recipe, and that recipe without its directory fsync (the
  ceiling of sharing it; the sessions case's burst series).

``python -m benchmarks`` draws PNGs next to its JSON; the pictures of the
performance page (``docs/charts/``) are SVGs redrawn from a run's JSON::

    python -m benchmarks._charts benchmarks/results/full.json
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from typing import Any

__all__ = ["draw"]

Points = list[tuple[float, dict[str, Any]]]

CHARTS: dict[str, tuple[str, ...]] = {
    "growth": ("growth",),
    "stall": ("stall", "peers", "journal"),
    "sessions": ("sessions",),
    "groupcommit": ("sessions",),
}
"""Chart -> the cases whose series it draws (a series name starts with the chart's prefix)."""

_PREFIX = {"growth": "growth/", "stall": "stall/", "sessions": "sessions/"}
_PREFIX["groupcommit"] = "sessions/"
_BURSTS = {
    "burst": "group commit",
    "burst-alone": "each dir fsync alone",
    "bare": "bare recipe",
    "ceiling": "bare, no dir fsync (not durable)",
}
"""The sessions case's burst series (``sessions/<metric>/<backend>``): the groupcommit chart's."""


def _series(results: dict[str, Any], chart: str) -> dict[str, Points]:
    found: dict[str, Points] = {}
    prefix = _PREFIX[chart]
    for case in CHARTS[chart]:
        result = results.get(case)
        if not isinstance(result, dict):
            continue
        for name, points in (result.get("series") or {}).items():
            if name.startswith(prefix):
                found[name[len(prefix) :]] = [(float(x), s) for x, s in points]
    return found


def _number(value: float, unit: str) -> str:
    from .__main__ import _number as number  # the tables' format

    return number(value, unit)


def _label(ax: Any, x: float, y: float, text: str) -> None:
    ax.annotate(text, (x, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)


def _growth(plt: Any, lines: dict[str, Points]) -> Any:
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for store, points in lines.items():
        xs = [x for x, _ in points]
        med = [s["median"] * 1e3 for _, s in points]
        ax.plot(xs, med, marker="o", label=store)
        ax.fill_between(
            xs, [s["p10"] * 1e3 for _, s in points], [s["p90"] * 1e3 for _, s in points], alpha=0.15
        )
        for x, (_, s) in zip(xs, points, strict=True):
            _label(ax, x, s["median"] * 1e3, _number(s["median"], s.get("unit", "s")))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("messages of history")
    ax.set_ylabel("one checkpoint adding one message (ms, median, p10-p90)")
    ax.set_title("Checkpoint cost vs history length, per store (growth case)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def _stall(plt: Any, series: dict[str, Points]) -> Any:
    groups: dict[str, dict[str, dict[str, Any]]] = {}
    for key, points in series.items():
        group, _, approach = key.partition("/")
        groups.setdefault(group, {})[approach] = points[0][1]
    fig, axes = plt.subplots(1, len(groups), figsize=(3.4 * len(groups), 4.8), squeeze=False)
    for ax, (group, bars) in zip(axes[0], groups.items(), strict=True):
        names = list(bars)
        med = [bars[n]["median"] * 1e3 for n in names]
        err_lo = [max(0.0, (bars[n]["median"] - bars[n]["p10"]) * 1e3) for n in names]
        err_hi = [max(0.0, (bars[n]["p90"] - bars[n]["median"]) * 1e3) for n in names]
        colors = [
            "tab:green" if n.startswith("checkpointer") or n == "journal" else "tab:gray"
            for n in names
        ]
        ax.bar(range(len(names)), med, yerr=[err_lo, err_hi], color=colors, capsize=3)
        for at, n in enumerate(names):
            _label(ax, at, med[at], _number(bars[n]["median"], bars[n].get("unit", "s")))
        ax.set_xticks(range(len(names)), names, rotation=40, ha="right", fontsize=8)
        ax.set_title(group, fontsize=9)
        ax.set_yscale("log")
        ax.grid(True, axis="y", which="both", alpha=0.3)
    axes[0][0].set_ylabel("worst event-loop stall (ms, median, p10-p90)")
    fig.suptitle("Event-loop stall per approach (1 ms ticker)")
    return fig


def _sessions(plt: Any, sessions: dict[str, Points]) -> Any:
    panels = [  # (metric, y label, scale of the median)
        ("open", "open, per writer (µs)", 1e6),
        ("close", "close, per writer (µs)", 1e6),
        ("memory", "RSS per open writer (KiB)", 1 / 1024),
        ("notify", "notify() in a burst (ns)", 1e9),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.4 * len(panels), 4.2), squeeze=False)
    for ax, (metric, label, scale) in zip(axes[0], panels, strict=True):
        for name, points in sessions.items():
            what, _, backend = name.partition("/")
            if what != metric:
                continue
            xs = [x for x, _ in points]
            ax.plot(
                xs,
                [p["median"] * scale for _, p in points],
                color={"asyncio": "tab:blue", "trio": "tab:orange"}.get(backend),
                marker="o",
                label=backend,
            )
            for x, (_, p) in zip(xs, points, strict=True):
                _label(ax, x, p["median"] * scale, _number(p["median"], p.get("unit", "s")))
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xlabel("sessions (writers) in one process")
        ax.set_title(label, fontsize=9)
        ax.set_ylim(bottom=0)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Many sessions in one event loop, one FileStore (sessions case)")
    return fig


def _groupcommit(plt: Any, sessions: dict[str, Points]) -> Any:
    backends = sorted({name.partition("/")[2] for name in sessions})
    fig, axes = plt.subplots(1, len(backends), figsize=(5.5 * len(backends), 4.6), squeeze=False)
    for ax, backend in zip(axes[0], backends, strict=True):
        for what, label in _BURSTS.items():
            points = sessions.get(f"{what}/{backend}")
            if not points:
                continue
            xs = [x for x, _ in points]
            style = "--" if what in ("bare", "ceiling") else "-"
            ax.plot(xs, [p["median"] for _, p in points], style, marker="o", label=label)
            for x, (_, p) in zip(xs, points, strict=True):
                _label(ax, x, p["median"], _number(p["median"], p.get("unit", "")))
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xlabel("sessions changing at once")
        ax.set_title(backend, fontsize=9)
        ax.set_ylim(bottom=0)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("checkpoints per second reaching disk")
    fig.suptitle("A burst of every session (FileStore): group commit against the per-file recipe")
    return fig


_DRAW: dict[str, Callable[[Any, dict[str, Points]], Any]] = {
    "growth": _growth,
    "stall": _stall,
    "sessions": _sessions,
    "groupcommit": _groupcommit,
}


def draw(results: dict[str, Any], out: str, mode: str, *, fmt: str = "png") -> list[str]:
    """Draw the charts of ``results`` (case -> report) into ``out``, each named
    ``<mode>-<chart>.<fmt>`` (``<chart>.<fmt>`` without a mode); lines saying what
    was written or why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ["charts: skipped (matplotlib is not installed: pip install -e '.[bench]')"]
    matplotlib.rcParams["svg.hashsalt"] = "checkpointer"  # the same run, the same SVG bytes
    lines: list[str] = []
    for chart, drawer in _DRAW.items():
        series = _series(results, chart)
        if not series:
            lines.append(f"chart {chart}: no series in this run ({', '.join(CHARTS[chart])})")
            continue
        fig = drawer(plt, series)
        fig.tight_layout()
        path = os.path.join(out, f"{mode}-{chart}.{fmt}" if mode else f"{chart}.{fmt}")
        metadata = {"Date": None} if fmt == "svg" else {}
        fig.savefig(path, dpi=110, metadata=metadata)
        plt.close(fig)
        lines.append(f"chart: {path}")
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks._charts", description="Draw the charts of a run's JSON."
    )
    parser.add_argument("results", help="a JSON written by python -m benchmarks")
    parser.add_argument("--out", default="docs/charts", help="where to write (%(default)s)")
    parser.add_argument("--format", default="svg", choices=["svg", "png"])
    args = parser.parse_args()
    with open(args.results, encoding="utf-8") as f:
        document = json.load(f)
    os.makedirs(args.out, exist_ok=True)
    for line in draw(document["cases"], args.out, "", fmt=args.format):
        print(line)
