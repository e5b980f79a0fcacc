"""PNG charts of a run, drawn when matplotlib is installed (extra ``bench``).

``<mode>-growth.png`` (checkpoint cost against history length),
``<mode>-stall.png`` (event-loop stall per approach) and
``<mode>-sessions.png`` (per-writer costs against the number of sessions).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["draw"]


def _series(results: dict[str, Any], prefix: str) -> dict[str, list[tuple[float, dict[str, Any]]]]:
    found: dict[str, list[tuple[float, dict[str, Any]]]] = {}
    for result in results.values():
        if not isinstance(result, dict):
            continue
        for name, points in (result.get("series") or {}).items():
            if name.startswith(prefix):
                found[name[len(prefix) :]] = [(float(x), s) for x, s in points]
    return found


def draw(results: dict[str, Any], out: str, mode: str) -> list[str]:
    """Draw the charts; return lines saying what was written or why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ["charts: skipped (matplotlib is not installed: pip install -e '.[bench]')"]
    lines: list[str] = []

    growth = _series(results, "growth/")
    if growth:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for store, points in growth.items():
            xs = [x for x, _ in points]
            med = [s["median"] * 1e3 for _, s in points]
            lo = [s["p10"] * 1e3 for _, s in points]
            hi = [s["p90"] * 1e3 for _, s in points]
            ax.plot(xs, med, marker="o", label=store)
            ax.fill_between(xs, lo, hi, alpha=0.2)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("messages of history")
        ax.set_ylabel("one checkpoint adding one message (ms, median, p10-p90)")
        ax.set_title("Checkpoint cost vs history length, per store")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        path = os.path.join(out, f"{mode}-growth.png")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        lines.append(f"chart: {path}")

    stall = _series(results, "stall/")
    if stall:
        groups: dict[str, dict[str, dict[str, Any]]] = {}
        for key, points in stall.items():
            group, _, approach = key.partition("/")
            groups.setdefault(group, {})[approach] = points[0][1]
        fig, axes = plt.subplots(1, len(groups), figsize=(3.2 * len(groups), 4.5), squeeze=False)
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
            ax.set_xticks(range(len(names)), names, rotation=40, ha="right", fontsize=8)
            ax.set_title(group, fontsize=9)
            ax.set_yscale("log")
            ax.grid(True, axis="y", which="both", alpha=0.3)
        axes[0][0].set_ylabel("worst event-loop stall (ms, median, p10-p90)")
        fig.suptitle("Event-loop stall per approach (1 ms ticker)")
        fig.tight_layout()
        path = os.path.join(out, f"{mode}-stall.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        lines.append(f"chart: {path}")

    sessions = _series(results, "sessions/")
    if sessions:
        panels = [  # (metric, y label, scale of the median)
            ("open", "open, per writer (µs)", 1e6),
            ("close", "close, per writer (µs)", 1e6),
            ("memory", "RSS per open writer (KiB)", 1 / 1024),
            ("notify", "notify() in a burst (ns)", 1e9),
            ("burst", "checkpoints/s of a burst", 1.0),
        ]
        fig, axes = plt.subplots(1, len(panels), figsize=(3.3 * len(panels), 4), squeeze=False)
        for ax, (metric, label, scale) in zip(axes[0], panels, strict=True):
            for name, points in sessions.items():
                what, _, backend = name.partition("/")
                if what != metric and not (metric == "burst" and what == "bare"):
                    continue
                xs = [x for x, _ in points]
                style = "--" if what == "bare" else "-"
                ax.plot(
                    xs,
                    [p["median"] * scale for _, p in points],
                    style,
                    color={"asyncio": "tab:blue", "trio": "tab:orange"}.get(backend),
                    marker="o",
                    label=f"{backend} (bare recipe)" if what == "bare" else backend,
                )
            ax.set_xscale("log")
            ax.minorticks_off()
            ax.set_xlabel("sessions (writers) in one process")
            ax.set_title(label, fontsize=9)
            ax.set_ylim(bottom=0)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        fig.suptitle("Many sessions in one event loop, one FileStore")
        fig.tight_layout()
        path = os.path.join(out, f"{mode}-sessions.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        lines.append(f"chart: {path}")
    return lines
