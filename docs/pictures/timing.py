"""Draw docs/concepts/timing.svg: the timing contract as timelines, from the real scheduler.

Each scenario drives ``checkpointer._schedule.Scheduler`` with a simulated
clock, the way the writer's timer does: events at scripted times, a write
started when ``decide`` says ``WRITE`` and ending a fixed time later.  Every
bar, band and bracket is placed from what the scheduler answered (its due
time, its ``first``, ``last`` and ``prev``), so a change of its rules changes
the picture, and tests/docs/test_timing_picture.py fails until it is redrawn::

    python docs/pictures/timing.py
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

from checkpointer import CheckpointWriter
from checkpointer._schedule import WRITE, Outcome, Scheduler, Wait

OUT = Path(__file__).resolve().parent.parent / "concepts" / "timing.svg"
# The pictures use the writer's defaults, resolved by the scheduler's own rule
# (a default debounce or min_interval gives way to a smaller max_wait).
_WRITER = inspect.signature(CheckpointWriter).parameters
_DEFAULTS = Scheduler(
    debounce=_WRITER["debounce"].default,
    min_interval=_WRITER["min_interval"].default,
    max_wait=_WRITER["max_wait"].default,
)


@dataclass(frozen=True)
class Scenario:
    """Events at scripted times, writes that take ``write_takes`` seconds each."""

    title: str
    events: tuple[float, ...]
    write_takes: float
    horizon: float  # seconds shown
    debounce: float = _DEFAULTS.debounce
    min_interval: float = _DEFAULTS.min_interval
    max_wait: float = _DEFAULTS.max_wait


@dataclass(frozen=True)
class Write:
    """One write of a run: when it was due, by which rule, and when it ran."""

    due: float
    rule: str  # "debounce", "max_wait" or "min_interval"
    anchor: float  # the time the rule counts from
    since: float  # the oldest unsaved change it covers
    start: float
    end: float


def _stream(start: float, stop: float, every: float) -> tuple[float, ...]:
    return tuple(round(start + i * every, 3) for i in range(int((stop - start) / every) + 1))


SCENARIOS = (
    Scenario(
        "debounce: a burst of events is one write, 0.5 s after its last event",
        events=(0.2, 0.3, 0.45, 0.6, 0.7, 2.4, 2.55, 2.8),
        write_takes=0.1,
        horizon=4.5,
    ),
    Scenario(
        "max_wait: a steady stream is written 5 s after its first unsaved change",
        events=_stream(0.2, 11.8, 0.4),
        write_takes=0.1,
        horizon=13.0,
    ),
    Scenario(
        "min_interval: two write starts are at least 1 s apart",
        events=(0.0, 0.7, 1.8, 3.3),
        write_takes=0.1,
        horizon=4.5,
    ),
    Scenario(
        "a slow write: the events during it become the next write, started when it ends",
        events=(0.2, 0.9, 1.1, 1.3, 2.6),
        write_takes=1.5,
        horizon=5.5,
    ),
)


def _rule(sched: Scheduler, due: float) -> tuple[str, float]:
    """Which term of the scheduler's rule set ``due``, and the time it counts from."""
    assert sched.first is not None
    terms = [("debounce", sched.last, sched.debounce), ("max_wait", sched.first, sched.max_wait)]
    if sched.prev is not None:  # the outer max: it wins a tie
        terms.insert(0, ("min_interval", sched.prev, sched.min_interval))
    for name, anchor, span in terms:
        if math.isclose(anchor + span, due, abs_tol=1e-9):
            return name, anchor
    raise ValueError(f"the scheduler's due time {due} is none of {terms}: update the picture")


def simulate(sc: Scenario) -> list[Write]:
    """Run the scenario on a simulated clock; return its writes."""
    sched = Scheduler(debounce=sc.debounce, min_interval=sc.min_interval, max_wait=sc.max_wait)
    events = sorted(sc.events)
    writes: list[Write] = []
    ends: float | None = None  # the end of the write in flight
    now = 0.0
    while True:
        # At one instant: the write in flight ends, then the events land, then the decision.
        if ends is not None and ends <= now:
            sched.end_write(now, Outcome.WRITTEN)
            ends = None
        while events and events[0] <= now:
            sched.event(events.pop(0))
        decision = sched.decide(now)
        if decision is WRITE:
            due, since = sched.due(), sched.first
            assert due is not None
            assert since is not None
            rule, anchor = _rule(sched, due)
            sched.begin_write(now)
            ends = now + sc.write_takes
            writes.append(Write(due, rule, anchor, since, now, ends))
            continue
        wake = [t for t in (ends, events[0] if events else None) if t is not None]
        if isinstance(decision, Wait):
            wake.append(decision.until)
        if not wake:
            return writes
        if min(wake) <= now:  # a loop that would never end: the scheduler broke its contract
            raise ValueError(f"at {now} the scheduler said {decision}: update the picture")
        now = min(wake)


# -- drawing ---------------------------------------------------------------

WIDTH, LEFT, RIGHT = 880, 120, 850  # plot from LEFT to RIGHT
TOP, PANEL = 74, 176  # the first panel's top, the height of one
COLORS = {"debounce": "#047857", "max_wait": "#b91c1c", "min_interval": "#6d28d9"}
INK, GREY, BAND, BAR = "#1f2937", "#6b7280", "#fde68a", "#2563eb"


def _n(v: float) -> str:
    return f"{v:.1f}".removesuffix(".0")


def _attrs(kw: dict[str, str]) -> str:
    """SVG attributes from keywords: ``stroke_width="1"`` is ``stroke-width="1"``."""
    return "".join(f' {k.replace("_", "-")}="{v}"' for k, v in kw.items())


def _text(x: float, y: float, s: str, *, anchor: str = "start", size: int = 11, **kw: str) -> str:
    at = f'x="{_n(x)}" y="{_n(y)}" font-size="{size}" text-anchor="{anchor}"'
    return f"<text {at}{_attrs(kw)}>{escape(s)}</text>"


def _line(x1: float, y1: float, x2: float, y2: float, color: str, **kw: str) -> str:
    at = f'x1="{_n(x1)}" y1="{_n(y1)}" x2="{_n(x2)}" y2="{_n(y2)}" stroke="{color}"'
    return f"<line {at}{_attrs(kw)}/>"


def _rect(x: float, y: float, w: float, h: float, color: str, **kw: str) -> str:
    at = f'x="{_n(x)}" y="{_n(y)}" width="{_n(w)}" height="{_n(h)}" fill="{color}"'
    return f"<rect {at}{_attrs(kw)}/>"


def _axis(top: float, horizon: float, x: float) -> list[str]:
    """The time axis under a panel, in seconds."""
    y = top + 140
    step = 1.0 if horizon > 6 else 0.5
    out = [_line(LEFT, y, RIGHT, y, GREY), _text(LEFT - 10, y + 4, "seconds", anchor="end")]
    for i in range(int(horizon / step) + 1):
        t = LEFT + i * step * x
        out.append(_line(t, y, t, y + 4, GREY))
        out.append(_text(t, y + 15, _n(i * step), anchor="middle", size=10, fill=GREY))
    return out


def _panel(number: int, sc: Scenario, top: float) -> list[str]:
    """One scenario: its events, the rule that made each write due, its writes."""
    writes = simulate(sc)
    x = (RIGHT - LEFT) / sc.horizon  # pixels a second

    def at(t: float) -> float:
        return LEFT + t * x

    ev, writes_y = top + 42, top + 118
    settings = (
        f"debounce {_n(sc.debounce)} s, min_interval {_n(sc.min_interval)} s, "
        f"max_wait {_n(sc.max_wait)} s; a write takes {_n(sc.write_takes)} s"
    )
    out = [
        _text(LEFT - 100, top + 10, f"{number}. {sc.title}", size=13, font_weight="bold"),
        _text(LEFT - 100, top + 25, settings, fill=GREY),
        _text(LEFT - 10, ev + 4, "events", anchor="end"),
        _text(LEFT - 10, top + 80, "due by", anchor="end"),
        _text(LEFT - 10, writes_y + 4, "writes", anchor="end"),
    ]
    out += [_rect(at(w.since), ev - 11, at(w.start) - at(w.since), 22, BAND) for w in writes]
    out.append(_line(LEFT, ev, RIGHT, ev, GREY, stroke_width="0.5"))
    out += [_line(at(t), ev - 8, at(t), ev + 8, INK, stroke_width="1.5") for t in sc.events]
    for i, w in enumerate(writes):
        y = top + 76 + 16 * (i % 2)  # alternate rows, so neighbouring labels do not collide
        color, a, d = COLORS[w.rule], at(w.anchor), at(w.due)
        out += [
            _line(a, y, d, y, color, stroke_width="1.5"),
            _line(a, y - 4, a, y + 4, color, stroke_width="1.5"),
            _line(d, y - 4, d, y + 4, color, stroke_width="1.5"),
            _text((a + d) / 2, y - 4, w.rule, anchor="middle", size=10, fill=color),
        ]
        if w.start > w.due:  # held back by the write in flight
            out.append(_line(d, y, at(w.start), y, GREY, stroke_dasharray="3 2"))
        out.append(_line(at(w.start), y + 4, at(w.start), writes_y - 7, GREY, stroke_width="0.5"))
        width = at(w.end) - at(w.start)  # a white edge parts back-to-back writes
        out.append(_rect(at(w.start), writes_y - 7, width, 14, BAR, stroke="#ffffff"))
        if width > 60:
            label = f"write {i + 1}"
            out.append(
                _text(at(w.start) + width / 2, writes_y + 4, label, anchor="middle", fill="#ffffff")
            )
    return out + _axis(top, sc.horizon, x)


def _legend(y: float) -> list[str]:
    x = LEFT - 100
    return [
        _line(x, y - 8, x, y + 4, INK, stroke_width="1.5"),
        _text(x + 6, y, "an event"),
        _rect(x + 70, y - 9, 22, 14, BAND),
        _text(x + 98, y, "unsaved changes"),
        _rect(x + 200, y - 7, 22, 10, BAR),
        _text(x + 228, y, "a write, start to end"),
        _line(x + 360, y - 2, x + 390, y - 2, COLORS["debounce"], stroke_width="1.5"),
        _text(x + 396, y, "the rule that made it due (dashed: waiting for the write in flight)"),
    ]


def draw(scenarios: tuple[Scenario, ...] = SCENARIOS) -> str:
    """The SVG of the scenarios, one panel each."""
    height = TOP + PANEL * len(scenarios)
    body = [
        _rect(0, 0, WIDTH, height, "#ffffff"),
        _text(LEFT - 100, 26, "When events become writes", size=16, font_weight="bold"),
        *_legend(52),
    ]
    for i, sc in enumerate(scenarios):
        body += _panel(i + 1, sc, TOP + PANEL * i)
    return "\n".join(
        [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'viewBox="0 0 {WIDTH} {height}" font-family="Helvetica, Arial, sans-serif" '
            f'fill="{INK}">',
            "<title>The timing contract: when events become writes</title>",
            *body,
            "</svg>",
            "",
        ]
    )


def main() -> None:
    OUT.write_bytes(draw().encode("utf-8"))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
