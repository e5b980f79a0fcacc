"""The command line's first-hour edges: --version, exit statuses, values argparse lets by."""

from __future__ import annotations

import json
from pathlib import Path

from checkpointer import __version__ as VERSION

from .test_cli import agent, cli, cli_all, put


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
