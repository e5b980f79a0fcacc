"""The S3 stores with real processes: two starting at once, two live writers, resuming.

The children are the ones of ``tests/writer/test_conflict.py``
(``tests/children/start_child.py``, ``conflict_child.py``) on an
``s3:BUCKET@URL`` store of moto's local server.  S3 has no lock: a second
live writer is not refused at open but at its first write after the
other's (``Failed("conflict")``), and a write told ``Written`` is never
replaced by one that expected an older revision.  Run with
``CHECKPOINTER_S3_MUTANT=unconditional`` (PUTs without conditions) the
tests of two writers fail.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from checkpointer import load
from tests import stress, torture
from tests._support import ROOT
from tests._support.two_writers import Terminal, count_refused, start_at_once
from tests.s3 import Place

KINDS = ["s3", "s3journal"]
STARTS = 20
TURNS = 3


@pytest.fixture
def place() -> Iterator[Place]:
    p = Place()
    p.env["PYTHONPATH"] = str(ROOT)
    yield p
    p.close()


def started(place: Place, kind: str, name: str, *, resume: bool = False) -> Terminal:
    """A conflict_child.py terminal on the key "shared", loaded and open."""
    return Terminal(place.spec(kind), "shared", name, place.env, resume=resume).start()


def contents(place: Place, kind: str) -> list[str]:
    checkpoint = load(place.store(kind), "shared")
    assert checkpoint is not None
    return [m["content"] for m in checkpoint.state["messages"]]


@pytest.mark.parametrize("kind", KINDS)
def test_two_processes_started_at_once_on_new_keys_never_lose_a_written_state(
    place: Place, kind: str
) -> None:
    """Two processes load 20 new keys (None) and write each at once (resume_from=None):
    for every key, a process whose last result was Written finds all its messages stored;
    the other is refused with a conflict, never told Written while its work is replaced.
    Again on new keys (three rounds at most) until the two overlapped on some key."""
    store = place.store(kind)
    refused = 0
    for round_ in range(3):
        keys = [f"new-{round_}-{i}" for i in range(STARTS)]
        ran = start_at_once(place.spec(kind), place.env, keys, TURNS)
        refused += count_refused(store, keys, ran, ("Failed:conflict",))
        if refused:
            break
    assert refused > 0  # the two did overlap: the case was exercised


@pytest.mark.parametrize("kind", KINDS)
def test_two_live_processes_cannot_both_make_progress(place: Place, kind: str) -> None:
    """A writes; B loads it and opens (no lock refuses B: its open write lands on A's
    checkpoint); A's next write is Failed('conflict') naming B, never a replacement of
    B's; B goes on; what is stored is A's first message and B's."""
    a = started(place, kind, "A")
    assert a.append("one")["result"] == "Written"
    b = started(place, kind, "B", resume=True)
    assert (b.loaded["n"], b.opened["writes"], b.opened["failures"]) == (1, 1, 0)
    refused = a.append("two")
    assert (refused["result"], refused["reason"]) == ("Failed", "conflict"), refused
    assert f"pid {b.proc.pid} on " in refused["error"]
    assert b.append("mine")["result"] == "Written"
    a_closed = a.close()
    assert (a_closed["result"], a_closed["reason"]) == ("Failed", "conflict")
    assert b.close()["result"] == "Written"
    assert contents(place, kind) == ["A: one", "B: mine"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_process_started_after_the_other_ended_resumes_and_writes(
    place: Place, kind: str
) -> None:
    """B started after A exited loads A's last checkpoint and writes on top of it."""
    a = started(place, kind, "A")
    assert a.append("one")["result"] == "Written"
    assert a.close()["failures"] == 0
    b = started(place, kind, "B", resume=True)
    assert b.opened["failures"] == 0
    assert b.append("two")["result"] == "Written"
    assert b.close()["failures"] == 0
    assert contents(place, kind) == ["A: one", "B: two"]


def test_kills_at_random_moments_lose_nothing() -> None:
    """The torture command on S3JournalStore (a commit is two objects), smoke size: after
    each SIGKILL the key loads, holds exactly one state the child produced, at least as
    new as its last Written (the full run: python -m tests.torture --store s3 ...)."""
    summary = torture.run(5, store="s3journal", max_bytes=512 << 10)
    assert summary.losses == 0, "\n".join(summary.lines())
    assert summary.kills == 5 and summary.writes >= 5


@pytest.mark.parametrize(("kind", "backend"), [("s3", "asyncio"), ("s3journal", "trio")])
def test_the_stress_model_holds_on_s3(kind: str, backend: str) -> None:
    """The stress suite's model, smoke size: appends, edits, reverts, writes at random;
    at every quiet point the stored checkpoint is the session; nothing older replaces newer."""
    summary = stress.run_one(stress.Spec(kind, backend, 11, ops=60, group="base"))
    assert summary.problems == [] and summary.quiet_checks >= 1
