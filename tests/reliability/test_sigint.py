"""The signal matrix's missing cells: SIGINT with the writer idle and with a write in flight.

``tests/reliability/test_exit_hooks.py`` sends SIGTERM and SIGHUP with the writer idle, with
changes pending and with a write in flight, but SIGINT only with changes
pending.  These are the other two states, on asyncio, trio, uvloop and the
sync writer, with the same child program and the same control run (the
program without the writer) for the exit status.  The parameter is not
named ``case`` so that module's runner does not pick these up as well.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests._support import HANG_GUARD
from tests.reliability.test_exit_hooks import LAST, Case, Child, assert_flushed, drive

GAPS = [
    Case(("--signal", "INT", "--backend", backend, "--state", state), "INT")
    for backend in ("asyncio", "trio", "uvloop", "sync")
    for state in ("idle", "inflight")
]

Ran = dict[Case, tuple[Child, Child]]

_MKTEMP_LOCK = threading.Lock()


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ran]:
    """Every gap and its control, eight children at a time (they mostly wait)."""
    spawned: list[Child] = []

    def start(gap: Case, args: tuple[str, ...]) -> Child:
        with _MKTEMP_LOCK:  # TempPathFactory is not thread-safe
            root = tmp_path_factory.mktemp(str(gap))
        one = Child(root, *args)
        spawned.append(one)
        drive(one, gap, note=False)
        return one

    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = {
            gap: (
                pool.submit(start, gap, gap.args),
                pool.submit(start, gap, (*gap.args, "--no-writer")),
            )
            for gap in GAPS
        }
        yield {
            gap: (child.result(10 * HANG_GUARD), control.result(10 * HANG_GUARD))
            for gap, (child, control) in futures.items()
        }
    for one in spawned:
        one.kill()


@pytest.mark.parametrize("gap", GAPS, ids=str)
def test_sigint_when_idle_or_writing(ran: Ran, gap: Case) -> None:
    """Ctrl-C, idle or mid-write: the newest state lands live=False, same status as without us."""
    child, control = ran[gap]
    assert child.returncode == control.returncode, child.report()
    assert "KeyboardInterrupt" in child.stderr, child.report()
    assert child.said("HANDLERS")[2] == control.said("HANDLERS")[2]  # SIGINT left alone
    assert_flushed(child, LAST[gap.opt("--state")])
    if gap.opt("--state") == "inflight":  # the final write began while the worker was writing
        assert "OVERLAP\n" in child.out, child.report()
