"""The power-cut command (``tests/powercut.py``) end to end, through FUSE: every store and
model loses nothing, and each mutation is caught.

A module of its own: its runs take most of the power-cut tests' time, and a module is what
the suite's workers share out (``--dist loadfile``).
"""

from __future__ import annotations

import re

import pytest

from tests import powercut
from tests.reliability.test_powercut import SMALL, fuse  # noqa: F401

pytestmark = pytest.mark.usefixtures("fuse")  # skips, saying why, where FUSE cannot mount


def test_the_documented_command_loses_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    """python -m tests.powercut, 3 cuts per store and model: every check passes after every cut."""
    code = powercut.main(["--cuts", "3", "--store", "all", "--max-mib", "0.25", "-q"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("store=")]
    assert code == 0, out
    assert len(rows) == 2 * len(powercut.STORES), out  # every store, two models
    for row in rows:
        figures = dict(re.findall(r"(\w+)=(\w+)", row))
        assert figures["cuts"] == "3", row
        assert figures["losses"] == "0", row
    assert "| journal | ext4 |" in out


@pytest.mark.parametrize(
    ("mutation", "seen", "model"),
    [
        *(
            (mutation, seen, model)
            for mutation, seen in [
                ("file-fsync", "does not load"),
                ("dir-fsync", "the checkpoint is gone"),
                ("journal-fsync", "older than seq"),
            ]
            for model in ("strict", "ext4")
        ),
        # Neither depends on the model: one each.
        ("sweep", "the open left 1 dead writers' temp files", "strict"),
        ("written-on-failure", "older than seq", "ext4"),
    ],
)
def test_the_torture_catches_each_mutation(mutation: str, seen: str, model: str) -> None:
    """A removed fsync, no sweep, Written for a failed commit: an aimed cut shows it."""
    spec = powercut.MUTATIONS[mutation]
    summary = powercut.run(
        powercut.MUTATION_CUTS,
        store=spec.store,
        model=model,
        mutate=mutation,
        max_bytes=SMALL,
        seed=1,
        stop_on_loss=True,
    )
    assert summary.caught_at is not None, "\n".join(summary.lines())
    assert summary.caught_at <= powercut.MUTATION_CUTS
    assert seen in summary.problems[0], summary.problems[0]
