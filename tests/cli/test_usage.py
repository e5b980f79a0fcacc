"""The command line's first-hour edges: --version, exit statuses, values argparse lets by."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

from checkpointer import CheckpointWriter, JournalStore, Snapshot, load
from checkpointer import __version__ as VERSION
from checkpointer.summaries import SummaryCheckpoint, summary_path, write_summary
from tests.cli.test_commands import NOW, agent, cli, cli_all, put


def test_version() -> None:
    """`checkpointer --version` and `python -m checkpointer --version` print the version, exit 0."""
    script, module = cli("--version"), cli("--version", module=True)
    for proc in (script, module):
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == f"agent-checkpointer {VERSION}\n"


def test_ls_exits_1_when_a_checkpoint_cannot_be_read(tmp_path: Path) -> None:
    """ls marks an unreadable file and exits 1 (as verify does), in the table and with --json."""
    put(tmp_path, "good", agent(1))
    cut = put(tmp_path, "cut", agent(1))
    cut.write_bytes(cut.read_bytes()[:50])
    table, as_json, only_good = cli_all(
        ["ls", tmp_path], ["ls", "--json", tmp_path], ["ls", tmp_path / "none"]
    )
    assert table.returncode == 1, table.stdout + table.stderr
    assert "! not valid JSON" in table.stdout
    assert "1 file(s) cannot be read" in table.stderr
    assert as_json.returncode == 1
    rows = {row["key"]: row for row in json.loads(as_json.stdout)}
    assert rows["cut"]["error"] and rows["good"]["error"] is None
    assert only_good.returncode == 1  # no such directory, as before
    cut.unlink()
    assert cli("ls", tmp_path).returncode == 0


def test_negative_values_are_usage_errors(tmp_path: Path) -> None:
    """`--last -1` and `--older-than -1d` (with or without `=`) are usage errors saying why."""
    put(tmp_path, "k", agent(1))
    last, older, older_eq, fine = cli_all(
        ["show", tmp_path, "k", "--last", "-1"],
        ["prune", tmp_path, "--older-than", "-1d"],
        ["prune", tmp_path, "--older-than=-1d"],
        ["show", tmp_path, "k", "--last", "0"],
    )
    assert last.returncode == 2 and "--last: -1 is negative" in last.stderr
    for proc in (older, older_eq):
        assert proc.returncode == 2
        assert "bad duration '-1d': a duration is not negative" in proc.stderr, proc.stderr
    assert fine.returncode == 0 and "last 0" not in fine.stdout
    assert (tmp_path / "k.json").exists()


def test_a_torn_journal_tail_is_shown_by_verify_and_show(tmp_path: Path) -> None:
    """verify warns of a torn tail and show names it, saying what was dropped; the file is kept."""
    messages: list[dict[str, str]] = [{"role": "user", "content": "hello"}]
    store = JournalStore(tmp_path)
    with CheckpointWriter(lambda: Snapshot("k", {"messages": messages}), store, exit_hooks=False):
        pass
    journal = tmp_path / "k.jsonl"
    torn = b'{"kind":"message","message":{"role":"assistant","con'  # a kill mid-append
    journal.write_bytes(journal.read_bytes() + torn)
    before = journal.read_bytes()
    checkpoint = load(store, "k")
    assert checkpoint is not None and checkpoint.torn is not None
    line, nbytes = checkpoint.torn.line, checkpoint.torn.nbytes
    verify, show = cli_all(["verify", tmp_path], ["show", tmp_path, "k"])
    assert verify.returncode == 0, verify.stdout + verify.stderr
    said = f"a torn tail was ignored: line {line} on, {nbytes} bytes at offset"
    assert f"warn {journal}: seq 2, 1 messages; {said}" in verify.stdout
    assert (
        verify.stdout.splitlines()[-1]
        == "1 checkpoint(s): 1 ok (1 with a torn tail ignored), 0 bad"
    )
    assert show.returncode == 0, show.stderr
    assert re.search(rf"^torn tail +line {line} on, {nbytes} bytes$", show.stdout, flags=re.M)
    assert show.stderr.startswith(f"checkpointer show: {journal}: {said}")
    assert journal.read_bytes() == before  # looking never cuts the tail


def test_prune_leaves_summaries_and_corrupt_files_alone(tmp_path: Path) -> None:
    """prune removes old checkpoints only: sessions/KEY/checkpoint.md and .corrupt-* files stay."""
    put(tmp_path, "free", agent(1), age=timedelta(days=30))
    write_summary(tmp_path, "free", SummaryCheckpoint(4, "the gist", NOW - timedelta(days=20), 4))
    summary = Path(summary_path(tmp_path, "free"))
    aside = tmp_path / "free.corrupt-20200101T000000.000001Z"
    aside.write_text("{garbage")
    proc = cli("prune", tmp_path, "--older-than", "7d")
    assert proc.returncode == 0, proc.stderr
    assert f"removed {tmp_path / 'free.json'} (updated 30d ago)" in proc.stdout
    assert str(summary) not in proc.stdout and str(aside) not in proc.stdout
    assert not (tmp_path / "free.json").exists()
    assert summary.read_text().count("the gist") == 1
    assert aside.read_text() == "{garbage"
