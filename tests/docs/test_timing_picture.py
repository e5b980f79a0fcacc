"""The timing page's picture is the one docs/pictures/timing.py draws from the scheduler today."""

from __future__ import annotations

import runpy
from typing import Any

from tests.docblocks import ROOT

SCRIPT = ROOT / "docs" / "pictures" / "timing.py"
PICTURE = ROOT / "docs" / "concepts" / "timing.svg"


def _script() -> dict[str, Any]:
    return runpy.run_path(str(SCRIPT), run_name="timing_picture")


def test_committed_picture_is_what_the_scheduler_draws() -> None:
    """timing.svg is, byte for byte, what the script draws from the real Scheduler."""
    script = _script()
    assert script["OUT"] == PICTURE
    drawn = script["draw"]().encode("utf-8")
    assert PICTURE.read_bytes() == drawn, "the scheduler changed: python docs/pictures/timing.py"


def test_picture_shows_what_the_page_says() -> None:
    """Each panel shows the rule its sentence on the page names: a redraw cannot contradict it."""
    script = _script()
    debounce, max_wait, min_interval, slow = (script["simulate"](s) for s in script["SCENARIOS"])
    assert [w.rule for w in debounce] == ["debounce", "debounce"]
    assert [w.rule for w in max_wait][:2] == ["max_wait", "max_wait"]
    assert "min_interval" in [w.rule for w in min_interval]
    assert [w.start > w.due for w in slow] == [False, True, True]  # waited for the write in flight
    assert [w.start for w in slow[1:]] == [w.end for w in slow[:-1]]


def test_timing_page_embeds_the_picture() -> None:
    """timing.md shows timing.svg by a relative link (GitHub, the site) and says how to redraw."""
    text = (ROOT / "docs" / "concepts" / "timing.md").read_text(encoding="utf-8")
    assert "](timing.svg)" in text
    assert "`python docs/pictures/timing.py`" in text
