"""``ls`` and ``prune`` over summary checkpoints and corrupt files moved aside (issue 16).

Real files in a tmp dir; ages set in the summaries' ``created_at`` and with
``os.utime``; what is planted in their place comes from ``test_security``.
Each command runs in this process (``main``) to keep the suite cheap.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from checkpointer import FileStore
from checkpointer._cli import main
from checkpointer.summaries import SummaryCheckpoint, summary_path, write_summary
from tests.cli.test_commands import NOW, age_file, hold_lock, put
from tests.stores.test_security import KINDS, Planted, snapshot
from tests.stores.test_security import (
    fifo_watchdog as fifo_watchdog,  # an open stuck on a FIFO: fail
)

OLD = timedelta(days=30)
STAMP = "20200101T000000.000001Z"  # a writer's move_aside stamp, years ago


@pytest.fixture(autouse=True)
def _no_log_handler(monkeypatch: pytest.MonkeyPatch) -> None:
    """main's logging.basicConfig would bind a handler to capsys's first stream."""
    monkeypatch.setattr(logging, "basicConfig", lambda **kw: None)


def run(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    """Run the command line in this process: (status, stdout, stderr)."""
    status = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return status, out, err


def summary(root: Path, key: str, age: timedelta = OLD) -> Path:
    """A summary checkpoint of ``key`` written ``age`` ago (its created_at)."""
    write_summary(root, key, SummaryCheckpoint(4, f"the gist of {key}", NOW - age, 4))
    return Path(summary_path(root, key))


def corrupt(root: Path, key: str, *, stamp: str = STAMP, age: timedelta = OLD) -> Path:
    """A corrupt file a writer moved aside at ``stamp``, last touched ``age`` ago."""
    path = root / f"{key}.corrupt-{stamp}"
    path.write_text("{garbage")
    age_file(path, age)
    return path


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_ls_shows_summaries_and_names_corrupt_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ls: a SUMMARY age per key, a row for a key with only a summary, corrupt files named."""
    put(tmp_path, "both", {"n": 1})
    put(tmp_path, "plain", {"n": 2})
    summary(tmp_path, "both", timedelta(hours=3))
    only = summary(tmp_path, "only", timedelta(days=20))
    aside = corrupt(tmp_path, "plain")
    status, out, err = run(capsys, "ls", tmp_path)
    assert (status, err) == (0, "")
    lines = out.splitlines()
    header = "KEY KIND UPDATED (UTC) SIZE SEQ TURNS LIVE PINNED LOCK SUMMARY TITLE"
    assert lines[0].split() == header.split()
    rows = {line.split()[0]: line.split() for line in lines[1:-1]}
    assert sorted(rows) == ["both", "only", "plain"]
    assert rows["both"][1] == "snapshot" and "3h ago" in lines[1]
    assert rows["plain"][-2:] == ["-", "-"]  # no summary; a state without a title
    assert rows["only"][1] == "summary" and " 20d ago  (a summary only: no checkpoint)" in lines[2]
    assert lines[-1] == (
        f"note: 1 corrupt file(s) a writer moved aside, kept for rescue by hand: {aside} "
        "(`checkpointer prune --corrupt` removes them)"
    )
    status, out, err = run(capsys, "ls", "--json", tmp_path)
    assert status == 0 and str(aside) in err  # stdout stays one JSON array
    by_key = {r["key"]: r for r in json.loads(out)}
    assert by_key["both"]["summary"] == str(tmp_path / "sessions" / "both" / "checkpoint.md")
    assert by_key["plain"]["summary"] is None and by_key["plain"]["summary_at"] is None
    assert (by_key["only"]["kind"], by_key["only"]["path"]) == ("summary", str(only))
    assert by_key["only"]["summary_at"].startswith(f"{(NOW - timedelta(days=20)):%Y-%m-%dT%H:%M}")


def test_ls_status_is_unchanged_by_summaries_and_corrupt_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ls exits 0 over a damaged summary (``!``, said on stderr) and over corrupt files only."""
    put(tmp_path, "k", {"n": 1})
    path = summary(tmp_path, "k")
    path.write_text("not a summary")
    status, out, err = run(capsys, "ls", tmp_path)
    assert status == 0
    assert out.splitlines()[1].split()[-1] == "!" and err.startswith(f"checkpointer ls: {path}: ")
    (tmp_path / "k.json").unlink()
    path.unlink()
    aside = corrupt(tmp_path, "k")
    status, out, err = run(capsys, "ls", tmp_path)
    assert (status, err) == (0, "")
    assert out.splitlines()[0] == f"no checkpoints in {tmp_path}" and str(aside) in out


def test_prune_keeps_summaries_and_corrupt_files_and_says_how_to_remove_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without the flags prune keeps them, counts those old enough, and names the flags."""
    put(tmp_path, "gone", {"n": 1}, age=OLD)
    kept = [summary(tmp_path, "gone"), summary(tmp_path, "orphan"), corrupt(tmp_path, "gone")]
    summary(tmp_path, "young", timedelta(hours=1))  # not old enough: not counted
    status, out, err = run(capsys, "prune", tmp_path, "--older-than", "7d")
    assert (status, err) == (0, "")
    assert out.splitlines() == [
        f"removed {tmp_path / 'gone.json'} (updated 30d ago)",
        "removed 1 file(s) older than 7d and 0 stale lock file(s), kept 0",
        "kept 2 summary checkpoint(s) and 1 corrupt file(s) older than 7d: "
        "add --summaries --corrupt to remove them",
    ]
    assert all(p.is_file() for p in kept)
    status, out, _ = run(capsys, "prune", tmp_path, "--older-than", "7d", "--summaries")
    assert status == 0 and out.splitlines()[-1] == (
        "kept 1 corrupt file(s) older than 7d: add --corrupt to remove them"
    )


def test_prune_summaries_go_with_their_key_and_dry_run_lists_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--summaries: an old summary goes once its key has no checkpoint left; never before."""
    put(tmp_path, "old", {"n": 1}, age=OLD)
    put(tmp_path, "young", {"n": 2}, age=timedelta(hours=1))
    put(tmp_path, "pinned", {"n": 3}, age=OLD, pinned=True)
    goes = {key: summary(tmp_path, key) for key in ("old", "orphan")}
    stays = {key: summary(tmp_path, key) for key in ("young", "pinned")}
    stays["fresh"] = summary(tmp_path, "fresh", timedelta(days=1))
    before = snapshot(tmp_path)
    args = ("prune", tmp_path, "--older-than", "7d", "--summaries")
    status, dry, err = run(capsys, *args, "--dry-run")
    assert (status, err) == (0, "") and snapshot(tmp_path) == before
    status, out, err = run(capsys, *args)
    assert (status, err) == (0, "")
    assert dry.replace("would remove", "removed") == out
    for key, path in goes.items():
        assert f"removed {path} (a summary, written 30d ago; its key has no checkpoint left)" in out
        assert not (tmp_path / "sessions" / key).exists()
    for key in ("young", "pinned"):
        assert f"kept {stays[key]}: a summary of a key whose checkpoint stays" in out
    assert all(p.read_text().count("the gist of") == 1 for p in stays.values())
    assert out.splitlines()[-1] == (
        "removed 1 file(s) older than 7d, 2 summary checkpoint(s) and 0 stale lock file(s), kept 3"
    )
    assert tree(tmp_path / "sessions") == sorted([*stays, *(f"{k}/checkpoint.md" for k in stays)])


def test_prune_summary_directory_keeps_what_is_not_ours(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dead write's temp file goes with the summary; another file keeps the directory."""
    dead = summary(tmp_path, "dead").parent / ".checkpoint.md.0123456789abcdef.tmp"
    dead.write_text("half a summary")
    mine = summary(tmp_path, "notes").parent / "my-notes.txt"
    mine.write_text("keep me")
    status, out, err = run(capsys, "prune", tmp_path, "--older-than", "7d", "--summaries")
    assert (status, err) == (0, "")
    assert not (tmp_path / "sessions" / "dead").exists()
    assert tree(tmp_path / "sessions") == ["notes", "notes/my-notes.txt"]
    assert f"; {mine.parent} holds other files, so it stays" in out


@pytest.mark.parametrize(
    ("stamp", "touched", "goes"),
    [
        (STAMP, OLD, True),
        (STAMP, timedelta(hours=1), False),  # touched since: someone is rescuing it
        ("now", OLD, False),  # moved aside just now (an old file)
    ],
)
def test_prune_corrupt_ages_by_its_move_and_its_mtime(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    stamp: str,
    touched: timedelta,
    goes: bool,
) -> None:
    """--corrupt removes a corrupt file only when both its name's time and its mtime are old."""
    if stamp == "now":  # computed here: test ids must be the same in every xdist worker
        stamp = f"{NOW:%Y%m%dT%H%M%S}.000001Z"
    path = corrupt(tmp_path, "k", stamp=stamp, age=touched)
    status, out, err = run(capsys, "prune", tmp_path, "--older-than", "7d", "--corrupt")
    assert (status, err) == (0, "")
    assert path.exists() != goes
    if goes:
        assert out.splitlines() == [
            f"removed {path} (a corrupt file, moved aside 30d ago)",
            "removed 0 file(s) older than 7d, 1 corrupt file(s) and 0 stale lock file(s), kept 0",
        ]
    else:
        assert out.strip() == f"nothing older than 7d and no stale locks in {tmp_path}"


def test_prune_leaves_a_live_key_its_summary_and_corrupt_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """While a writer holds the key's lock, its summary and corrupt files stay (said why)."""
    path, aside = summary(tmp_path, "held"), corrupt(tmp_path, "held")
    with hold_lock(tmp_path / "held.lock"):
        status, out, _ = run(
            capsys, "prune", tmp_path, "--older-than", "7d", "--summaries", "--corrupt"
        )
    assert status == 0
    assert f"kept {path}: its lock holder is alive" in out
    assert f"kept {aside}: its lock holder is alive" in out
    assert path.is_file() and aside.is_file()


def test_prune_keeps_a_summary_written_after_it_was_listed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A summary rewritten (or a checkpoint written) between the listing and the lock stays."""
    rewritten, revived = summary(tmp_path, "rewritten"), summary(tmp_path, "revived")
    lock = FileStore.lock

    def meanwhile(self: FileStore, key: str, *, timeout: float = 0.0) -> Any:
        if key == "rewritten":  # a collapse() of a resumed session
            summary(Path(self.root), key, timedelta(0))
        if key == "revived":  # a writer started on the key again
            put(Path(self.root), key, {"n": 1})
        return lock(self, key, timeout=timeout)

    monkeypatch.setattr(FileStore, "lock", meanwhile)
    status, out, _ = run(capsys, "prune", tmp_path, "--older-than", "7d", "--summaries")
    assert status == 0
    assert f"kept {rewritten}: written since it was listed" in out
    assert f"kept {revived}: its key has a checkpoint again" in out
    assert rewritten.is_file() and revived.is_file()


PLANTED_TARGETS = ("sessions", "sessions/k", "sessions/k/checkpoint.md", f"k.corrupt-{STAMP}")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("target", PLANTED_TARGETS)
def test_ls_and_prune_never_follow_or_remove_a_planted_entry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str, kind: str
) -> None:
    """A link, FIFO, hard link for a summary or corrupt file: named and left; outside unchanged."""
    root = tmp_path / "root"
    summary(root, "k")
    corrupt(root, "k")
    planted = Planted(root / target, kind, tmp_path / "outside")
    # Unlinking a hard-linked name changes nothing outside, as for a checkpoint.
    removable = kind == "hard-link" and target.endswith(("checkpoint.md", STAMP))
    status, out, err = run(capsys, "ls", root)
    assert status == 0, out + err
    if not removable:
        assert planted.found in err, out + err
    planted.check_outside()
    args = ("prune", root, "--older-than", "7d", "--summaries", "--corrupt")
    status, out, err = run(capsys, *args)
    planted.check_outside()
    if removable:
        assert status == 0, out + err
        assert not os.path.lexists(planted.path) or os.lstat(planted.path).st_nlink == 1
    else:
        assert status == 1 and planted.found in err, out + err
        planted.check_left()
        planted.remove()
        assert run(capsys, *args)[0] == 0
    assert [p for p in root.rglob("*") if not p.is_dir()] == []  # ours went, once it was gone
    planted.check_outside()


def test_prune_fsyncs_the_directories_it_removed_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """After unlinking, the root, sessions/ and sessions/<key>/ are fsynced (a power cut)."""
    put(tmp_path, "k", {"n": 1}, age=OLD)
    summary(tmp_path, "k")
    corrupt(tmp_path, "k")
    synced: list[str] = []
    fsync = os.fsync

    def recording(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recording)
    args = ("prune", tmp_path, "--older-than", "7d", "--summaries", "--corrupt")
    status, out, err = run(capsys, *args)
    assert (status, err) == (0, ""), out
    assert tree(tmp_path) == ["sessions"]
    for directory in (tmp_path, tmp_path / "sessions", tmp_path / "sessions" / "k"):
        assert str(directory) in synced, synced
