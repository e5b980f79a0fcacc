"""The command line says a bad argument in the user's words, and a closed pipe is a quiet 0.

Issue 16: ``--older -1d`` (an abbreviation) said "expected one argument";
``ls --last -1`` showed the rewritten ``--last=-1`` under the top-level usage;
``show ... | head`` could exit 1.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.cli.test_commands import CLI, agent, cli_all, put


def test_abbreviated_option_with_a_negative_value_says_why(tmp_path: Path) -> None:
    """`prune --older -1d` and `show --la -1` name the bad value, as the full spellings do."""
    put(tmp_path, "k", agent(1))
    older, short, last = cli_all(
        ["prune", tmp_path, "--older", "-1d"],
        ["prune", tmp_path, "--o", "-1d"],
        ["show", tmp_path, "k", "--la", "-1"],
    )
    for proc in (older, short):
        assert proc.returncode == 2, proc.stderr
        assert "bad duration '-1d': a duration is not negative" in proc.stderr, proc.stderr
        assert "expected one argument" not in proc.stderr
    assert last.returncode == 2 and "--last: -1 is negative" in last.stderr, last.stderr
    assert (tmp_path / "k.json").exists()


def test_unknown_option_is_said_as_typed_under_the_commands_usage(tmp_path: Path) -> None:
    """`ls ROOT --last -1`: "unrecognized arguments: --last -1" under `checkpointer ls`'s usage."""
    put(tmp_path, "k", agent(1))
    (proc,) = cli_all(["ls", tmp_path, "--last", "-1"])
    assert proc.returncode == 2
    assert proc.stderr.startswith("usage: checkpointer ls "), proc.stderr
    assert "checkpointer ls: error: unrecognized arguments: --last -1\n" in proc.stderr
    assert "--last=-1" not in proc.stderr


def test_show_into_a_closed_pipe_exits_0_quietly(tmp_path: Path) -> None:
    """`checkpointer show ROOT KEY | head`: a reader closing early is exit 0, stderr empty."""
    put(tmp_path, "k", agent(500))  # far more than a pipe's 64 KiB of output
    show = subprocess.Popen(
        [*CLI, "show", str(tmp_path), "k", "--last", "2000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert show.stdout is not None and show.stderr is not None
    show.stdout.read(100)  # `head -c 100`
    show.stdout.close()
    with show.stderr:
        err = show.stderr.read()
    assert show.wait(timeout=60) == 0, err
    assert err == b""
