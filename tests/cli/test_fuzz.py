"""The command line over damaged files, smoke size: no command prints a traceback.

The full run is ``python -m tests.cli_fuzz --examples 500`` (``tests/cli_fuzz.py``):
every JSON value of every file of a real root replaced by values of other
types and ranges (or deleted), then random damage.  Here: the sweep over one
snapshot and one lock file with fewer values, a few random roots, and the
harness shown to catch a crash.
"""

from __future__ import annotations

import pytest

from checkpointer._cli import report
from tests import cli_fuzz
from tests.cli_fuzz import Crash


def test_sweep_of_a_snapshot_and_a_lock_file() -> None:
    """Each value of a snapshot and of a lock file, replaced or deleted: no crash."""
    values: list[object] = [
        None,
        2**64,
        "x",
        "2026-01-01T00:00:00",
        "0001-01-01T00:00:00+01:00",
        [],
    ]
    assert cli_fuzz.run_sweep(values, files=["chat.json", "chat.lock"]) > 400


def test_random_damage() -> None:
    """A few roots of randomly damaged files (values, cuts, flipped bytes): no crash."""
    cli_fuzz.fuzz(5)


def test_the_harness_catches_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    """A command that raises is a Crash naming the command and the damaged file."""

    def broken(message: object, width: int = 100) -> str:
        raise AttributeError("'str' object has no attribute 'get'")

    monkeypatch.setattr(report, "message_line", broken)
    with pytest.raises(Crash, match=r"checkpointer show .* AttributeError(.|\n)*damaged chat"):
        cli_fuzz.check([("chat.json", cli_fuzz.base()["chat.json"])])
