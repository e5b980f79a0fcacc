"""The ``checkpointer`` console script, run for real in a subprocess."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest

from checkpointer import CheckpointWriter, FileStore, Snapshot
from checkpointer._cli import main, parse_duration
from checkpointer._stores.base import LockHolder
from checkpointer._stores.flock import acquire_file_lock, probe_file_lock
from tests._support import CHILDREN

_SCRIPT = Path(sys.executable).with_name("checkpointer")
CLI = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "checkpointer"]
LOCK_CHILD = CHILDREN / "lock_child.py"
NOW = datetime.now(UTC)
LONG = "Find the bug in parser.py: it crashes on empty input, and also on input with tabs"


def cli(*args: str | Path, module: bool = False) -> subprocess.CompletedProcess[str]:
    """Run the console script (or ``python -m checkpointer``) with ``args``."""
    command = [sys.executable, "-m", "checkpointer"] if module else CLI
    return subprocess.run(
        [*command, *map(str, args)], capture_output=True, text=True, timeout=60, check=False
    )


def cli_all(*commands: Sequence[str | Path]) -> list[subprocess.CompletedProcess[str]]:
    """Run several commands at once (each start costs ~0.3 s of imports)."""
    procs = [
        subprocess.Popen(
            [*CLI, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for args in commands
    ]
    done = []
    for args, proc in zip(commands, procs, strict=True):
        out, err = proc.communicate(timeout=60)
        done.append(subprocess.CompletedProcess(args, proc.returncode, out, err))
    return done


def put(
    root: Path,
    key: str,
    state: Any,
    *,
    age: timedelta = timedelta(minutes=5),
    seq: int = 3,
    live: bool = False,
    pinned: bool = False,
    meta_key: str | None = None,
) -> Path:
    """Write a checkpoint file as the writer would, last updated ``age`` ago."""
    updated = NOW - age
    meta = {
        "key": meta_key or key,
        "seq": seq,
        "created_at": updated - timedelta(hours=1),
        "updated_at": updated,
        "live": live,
        "pinned": pinned,
    }
    root.mkdir(exist_ok=True)
    path = root / f"{key}.json"
    path.write_bytes(msgspec.json.encode({"format": 1, "meta": meta, "state": state}))
    return path


def agent(turns: int, first: str = LONG) -> dict[str, Any]:
    """An agent history: per turn a user task, a tool call, its result, an answer."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    for n in range(turns):
        call = {"id": f"c{n}", "name": "grep"}
        messages += [
            {"role": "user", "content": first if n == 0 else f"and task {n}"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{n}", "content": "x " * 200},
            {"role": "assistant", "content": f"answer {n}"},
        ]
    return {"messages": messages}


def age_file(path: Path, age: timedelta) -> None:
    then = (NOW - age).timestamp()
    os.utime(path, (then, then))


HOLDER = f"pid {os.getpid()} on {socket.gethostname()} since "


@contextlib.contextmanager
def hold_lock(path: Path) -> Iterator[None]:
    """Hold ``path`` as a live writer does: the library's lock, this process named in it."""
    lock = acquire_file_lock(str(path))
    try:
        yield
    finally:
        lock.release()


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A root with an agent session (held lock), a pinned one, a plain state, debris."""
    root = tmp_path / "store"
    put(root, "alpha", agent(3), seq=9, live=True)
    put(root, "beta", agent(1, first="short task"), seq=2, pinned=True, age=timedelta(hours=2))
    put(root, "gamma", {"counter": 41}, seq=5, age=timedelta(days=1))
    (root / "beta.lock").write_text("")  # left over by a dead writer
    (root / ".alpha.json.0123456789abcdef.tmp").write_text("partial")  # not a checkpoint
    (root / "notes.txt").write_text("not a checkpoint either")
    return root


def test_help_from_the_console_script() -> None:
    """--help of the installed script and of `python -m checkpointer` list the commands."""
    top, prune = cli("--help"), cli("prune", "--help", module=True)
    assert top.returncode == 0 and prune.returncode == 0, top.stderr + prune.stderr
    assert top.stdout.startswith("usage: checkpointer [-h] [--version] COMMAND")
    for command in ("ls", "show", "verify", "prune", "demo"):
        assert f"    {command} " in top.stdout
    assert prune.stdout.startswith("usage: checkpointer prune [-h] --older-than DURATION")


@pytest.mark.parametrize("command", ["ls", "show", "verify", "prune", "demo"])
def test_help_on_every_command(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Each command's --help shows its usage and exits 0."""
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: checkpointer {command} [-h]")


def test_no_command_is_a_usage_error() -> None:
    """Without a command the tool says what it expects and exits 2."""
    proc = cli()
    assert proc.returncode == 2
    assert "COMMAND" in proc.stderr


def test_ls_json_reports_every_field(store: Path) -> None:
    """ls --json: one object per checkpoint with meta, turns, lock state and title."""
    with hold_lock(store / "alpha.lock"):
        proc = cli("ls", store, "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {r["key"]: r for r in json.loads(proc.stdout)}
    assert sorted(rows) == ["alpha", "beta", "gamma"]
    alpha, beta, gamma = rows["alpha"], rows["beta"], rows["gamma"]
    assert (alpha["seq"], alpha["turns"], alpha["messages"]) == (9, 6, 13)
    assert (alpha["live"], alpha["pinned"], alpha["lock"]) == (True, False, "alive")
    assert alpha["lock_holder"].startswith(HOLDER)
    assert alpha["title"].startswith("Find the bug in parser.py") and alpha["title"].endswith("...")
    assert len(alpha["title"]) == 48
    assert alpha["size"] == (store / "alpha.json").stat().st_size
    assert datetime.fromisoformat(alpha["updated_at"]) == NOW - timedelta(minutes=5)
    assert (beta["pinned"], beta["lock"], beta["title"]) == (True, "stale", "short task")
    assert (gamma["turns"], gamma["messages"], gamma["lock"], gamma["title"]) == (
        None,
        None,
        None,
        "",
    )


def test_ls_table_sorts(store: Path) -> None:
    """ls prints a header and one row per key, in the order --sort asks for."""
    by_key, by_seq, oldest_first = cli_all(
        ["ls", store], ["ls", store, "--sort", "seq"], ["ls", store, "--sort", "updated", "-r"]
    )
    assert by_key.returncode == 0, by_key.stderr
    lines = by_key.stdout.splitlines()
    assert lines[0].split() == [
        "KEY",
        "UPDATED",
        "(UTC)",
        "SIZE",
        "SEQ",
        "TURNS",
        "LIVE",
        "PINNED",
        "LOCK",
        "TITLE",
    ]
    assert [line.split()[0] for line in lines[1:]] == ["alpha", "beta", "gamma"]
    assert "Find the bug in parser.py" in lines[1] and "stale" in lines[2]
    assert [line.split()[0] for line in by_seq.stdout.splitlines()[1:]] == [
        "alpha",
        "gamma",
        "beta",
    ]
    assert [line.split()[0] for line in oldest_first.stdout.splitlines()[1:]] == [
        "gamma",
        "beta",
        "alpha",
    ]


def test_ls_reads_files_a_real_writer_wrote(tmp_path: Path) -> None:
    """A checkpoint written by CheckpointWriter lists, through `python -m checkpointer` too."""
    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    source = lambda: Snapshot("real", {"messages": messages})  # noqa: E731
    with CheckpointWriter(source, FileStore(tmp_path), exit_hooks=False) as writer:
        writer.flush_sync()
    proc = cli("ls", tmp_path, "--json", module=True)
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)
    assert (row["key"], row["seq"], row["live"], row["turns"], row["title"]) == (
        "real",
        2,  # the write on open, then the final one (live=False) on close
        False,
        1,
        "hello",
    )


def test_ls_empty_root_and_unreadable_file(tmp_path: Path) -> None:
    """An empty root says so (0); a corrupt file is listed with its reason and a hint (1)."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "broken.json").write_bytes(b'{"format": 1, "meta": {"key"')
    empty, proc = cli_all(["ls", tmp_path], ["ls", broken])
    assert (empty.returncode, empty.stdout.strip()) == (0, f"no checkpoints in {tmp_path}")
    assert proc.returncode == 1
    assert "broken" in proc.stdout and "! not valid JSON" in proc.stdout
    assert f"checkpointer verify {broken}" in proc.stderr


def unaligned(out: str) -> str:
    """show's output with the name column squeezed to two spaces (meta fields set its width)."""
    return re.sub(r"^(\S+) {2,}", r"\1  ", out, flags=re.M)


def test_show_meta_lock_and_last_messages(store: Path) -> None:
    """show prints the meta, the live lock holder and the last messages, truncated."""
    with hold_lock(store / "alpha.lock"):
        proc = cli("show", store, "alpha", "--last", "3")
    assert proc.returncode == 0, proc.stderr
    out = unaligned(proc.stdout)
    for line in ["key  alpha", "seq  9", "live  yes", "messages  13"]:
        assert line in out
    assert f"lock  alive {HOLDER}" in out
    assert "turns  6 (assistant messages)" in out
    assert "last 3 of 13 messages:" in out
    assert "[10] assistant:  -> 1 tool call(s): grep" not in out  # no stray spaces
    assert "[10] assistant: -> 1 tool call(s): grep" in out
    tool_line = next(line for line in out.splitlines() if "[11]" in line)
    assert tool_line.startswith("  [11] tool[c2]: x x x") and tool_line.endswith("...")
    assert len(tool_line) < 130
    assert "[12] assistant: answer 2" in out


def test_show_plain_state_and_raw(store: Path) -> None:
    """A state without messages is shown as JSON; --raw prints the file's exact bytes."""
    plain, raw = cli_all(["show", store, "gamma"], ["show", store, "gamma", "--raw"])
    assert plain.returncode == 0, plain.stderr
    assert 'state  {"counter":41}' in unaligned(plain.stdout)
    assert "lock  none" in unaligned(plain.stdout)
    assert raw.returncode == 0
    assert raw.stdout.encode() == (store / "gamma.json").read_bytes() + b"\n"


def test_show_unknown_invalid_and_corrupt_keys(store: Path) -> None:
    """An unknown key suggests a near one (1); an invalid key is a usage error (2)."""
    (store / "gamma.json").write_bytes(b'{"format": 1, "meta": {"ke')
    unknown, far, invalid, corrupt = cli_all(
        ["show", store, "alpah"],
        ["show", store, "zzz"],
        ["show", store, "../etc/passwd"],
        ["show", store, "gamma"],
    )
    assert unknown.returncode == 1
    assert "no checkpoint 'alpah'" in unknown.stderr and "did you mean 'alpha'?" in unknown.stderr
    assert far.returncode == 1 and f"checkpointer ls {store}" in far.stderr
    assert invalid.returncode == 2 and "invalid key '../etc/passwd'" in invalid.stderr
    assert corrupt.returncode == 1
    assert corrupt.stderr.startswith(f"checkpointer show: {store / 'gamma.json'}: ")
    assert "JSON" in corrupt.stderr


def test_missing_root_or_not_a_directory(tmp_path: Path) -> None:
    """Every command over a missing root, or a file, says so and exits 1."""
    missing = tmp_path / "nope"
    (tmp_path / "file").write_text("")
    *procs, not_dir = cli_all(
        ["ls", missing],
        ["show", missing, "k"],
        ["verify", missing],
        ["prune", missing, "--older-than", "1d"],
        ["ls", tmp_path / "file"],
    )
    for command, proc in zip(["ls", "show", "verify", "prune"], procs, strict=True):
        assert proc.returncode == 1
        assert proc.stderr.startswith(f"checkpointer {command}: no such directory: {missing}")
    assert not_dir.returncode == 1 and "not a directory" in not_dir.stderr


def test_verify_reports_each_bad_file(store: Path) -> None:
    """verify names each bad file and why, notes moved-aside files, exits 1; else 0."""
    good = cli("verify", store)
    assert good.returncode == 0, good.stdout
    assert good.stdout.splitlines()[-1] == "3 checkpoint(s): 3 ok, 0 bad"
    put(store, "renamed", {"n": 1}, meta_key="original")
    put(store, "history", {"messages": [{"role": "tool", "tool_call_id": "x", "content": ""}]})
    (store / "torn.json").write_bytes((store / "alpha.json").read_bytes()[:100])
    (store / "dir.json").mkdir()
    (store / "torn.corrupt-20240101T000000.000001Z").write_text("old")
    proc = cli("verify", store, "--quiet")
    assert proc.returncode == 1
    bad = {line.split()[1].rstrip(":"): line for line in proc.stdout.splitlines() if "BAD" in line}
    assert sorted(Path(p).name for p in bad) == [
        "dir.json",
        "history.json",
        "renamed.json",
        "torn.json",
    ]
    assert (
        f"BAD  {store / 'history.json'}: not sendable to a model API: $.state.messages[0]: "
        "tool result for 'x' answers no open tool call (orphan result)"
    ) in bad.values()
    assert "its meta says key 'original'" in bad[str(store / "renamed.json")]
    assert "not valid JSON" in bad[str(store / "torn.json")]
    assert "cannot be read" in bad[str(store / "dir.json")]
    assert "note " in proc.stdout and "torn.corrupt-20240101T000000.000001Z" in proc.stdout
    assert proc.stdout.splitlines()[-1] == "7 checkpoint(s): 3 ok, 4 bad"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("7d", 7 * 86400),
        ("12h", 12 * 3600),
        ("30m", 1800),
        ("45s", 45),
        ("2w", 14 * 86400),
        ("1h30m", 5400),
        ("1.5h", 5400),
        ("0s", 0),
        (" 7D ", 7 * 86400),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    """Durations are a number and a unit, or several summed."""
    assert parse_duration(text).seconds == seconds


@pytest.mark.parametrize("text", ["", "7", "d", "7x", "-1d", "7d3", "1 h", "seven days"])
def test_parse_duration_rejects(text: str) -> None:
    """Anything else is refused with the forms that work."""
    with pytest.raises(Exception, match=r"bad duration .*e\.g\. 7d, 12h, 30m"):
        parse_duration(text)


def test_prune_bad_duration_is_a_usage_error(store: Path) -> None:
    """A bad --older-than exits 2 and says what a duration looks like; nothing is removed."""
    proc, no_duration = cli_all(["prune", store, "--older-than", "7x"], ["prune", store])
    assert proc.returncode == 2
    assert "bad duration '7x'" in proc.stderr
    assert no_duration.returncode == 2 and "--older-than" in no_duration.stderr
    assert sorted(p.name for p in store.glob("*.json")) == ["alpha.json", "beta.json", "gamma.json"]


def test_prune_removes_old_and_stale_never_live_or_pinned(tmp_path: Path) -> None:
    """prune removes old checkpoints and every stale lock; a held lock or a pin keeps a key."""
    root = tmp_path / "store"
    old = timedelta(days=10)
    put(root, "old", {"n": 1}, age=old)
    put(root, "old-stale-lock", {"n": 2}, age=old)
    (root / "old-stale-lock.lock").write_text("")
    put(root, "old-held", {"n": 3}, age=old, live=True)
    put(root, "old-pinned", {"n": 4}, age=old, pinned=True)
    put(root, "young", {"n": 5}, age=timedelta(hours=1))
    (root / "young.lock").write_text("")  # stale, of a key that stays
    (root / "orphan-old.lock").write_text("")
    age_file(root / "orphan-old.lock", old)
    (root / "orphan-young.lock").write_text("")  # stale however young
    (root / "torn.json").write_bytes(b"{")
    age_file(root / "torn.json", old)
    with hold_lock(root / "old-held.lock"):
        before = sorted(p.name for p in root.iterdir())
        dry = cli("prune", root, "--older-than", "7d", "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert sorted(p.name for p in root.iterdir()) == before
        proc = cli("prune", root, "--older-than", "7d")
    assert proc.returncode == 0, proc.stderr
    gone = {"old.json", "old-stale-lock.json", "torn.json"}
    stale = {"old-stale-lock.lock", "young.lock", "orphan-old.lock", "orphan-young.lock"}
    released = {"old-held.lock"}  # by its holder, on leaving hold_lock
    assert sorted(p.name for p in root.iterdir()) == sorted(set(before) - gone - stale - released)
    removed = sorted(
        Path(line.split()[1]).name
        for line in proc.stdout.splitlines()[:-1]
        if line.startswith("removed ")
    )
    assert removed == sorted(gone | stale)
    assert (
        dry.stdout.replace("would remove", "removed").splitlines()[:-1]
        == (proc.stdout.splitlines()[:-1])
    )
    assert f"removed {root / 'old-stale-lock.lock'} (its lock file)" in proc.stdout
    assert f"removed {root / 'young.lock'} (stale lock, holder gone)" in proc.stdout
    assert f"kept {root / 'old-held.json'}: its lock holder is alive" in proc.stdout
    assert f"kept {root / 'old-pinned.json'}: pinned (updated 10d ago)" in proc.stdout
    assert proc.stdout.splitlines()[-1] == (
        "removed 3 file(s) older than 7d and 4 stale lock file(s), kept 2"
    )
    after = cli("prune", root, "--older-than", "7d")  # the holder is gone now
    assert f"removed {root / 'old-held.json'} (updated 10d ago)" in after.stdout


def test_prune_young_store_loses_only_its_stale_lock(store: Path) -> None:
    """With nothing old enough prune removes only stale locks, then says there is nothing."""
    proc = cli("prune", store, "--older-than", "30d")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"removed {store / 'beta.lock'} (stale lock, holder gone)",
        "removed 0 file(s) older than 30d and 1 stale lock file(s), kept 0",
    ]
    assert len(list(store.iterdir())) == 5
    again = cli("prune", store, "--older-than", "30d")
    assert again.stdout.strip() == f"nothing older than 30d and no stale locks in {store}"


def test_prune_keeps_a_file_written_after_it_was_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A session resumed and written between prune's listing and its lock is not removed."""
    path = put(tmp_path, "resumed", {"n": 1}, age=timedelta(days=10))
    put(tmp_path, "idle", {"n": 2}, age=timedelta(days=10))
    lock = FileStore.lock
    resumed: list[str] = []

    def resumed_first(self: FileStore, key: str, *, timeout: float = 0.0) -> Any:
        if key == "resumed" and not resumed:  # a writer takes the key and writes it first
            resumed.append(key)  # (the writer's own lock goes straight through)
            with CheckpointWriter(lambda: Snapshot(key, {"n": 3}), FileStore(self.root)):
                pass
        return lock(self, key, timeout=timeout)

    monkeypatch.setattr(FileStore, "lock", resumed_first)
    assert main(["prune", str(tmp_path), "--older-than", "7d"]) == 0
    out = capsys.readouterr().out
    assert f"kept {path}: written since it was listed" in out
    assert f"removed {tmp_path / 'idle.json'} (updated 10d ago)" in out
    assert "removed 1 file(s) older than 7d and 0 stale lock file(s), kept 1" in out
    assert msgspec.json.decode(path.read_bytes())["state"] == {"n": 3}


def test_sigkilled_writer_leaves_a_stale_lock_that_prune_removes(tmp_path: Path) -> None:
    """A writer killed by SIGKILL: ls says stale (even before it is reaped), prune removes it."""
    lock = tmp_path / "killed.lock"
    with subprocess.Popen(
        [sys.executable, str(LOCK_CHILD), str(tmp_path), "killed", "hold"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as child:
        try:
            assert child.stdout is not None
            assert json.loads(child.stdout.readline())["result"] == "Written"
            held = probe_file_lock(str(lock))
            assert held is not None and held.alive is True
            assert held.holder is not None and held.holder.pid == child.pid
            child.send_signal(signal.SIGKILL)
            os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # a zombie, not reaped
            zombie = probe_file_lock(str(lock))
            assert zombie is not None and zombie.alive is False
        finally:
            child.kill()
    (row,) = json.loads(cli("ls", tmp_path, "--json").stdout)
    assert (row["key"], row["live"], row["lock"]) == ("killed", True, "stale")
    assert row["lock_holder"].startswith(f"pid {child.pid} on {socket.gethostname()} since ")
    proc = cli("prune", tmp_path, "--older-than", "1d")
    assert proc.returncode == 0, proc.stderr
    assert f"removed {lock} (stale lock, holder gone)" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["killed.json"]


# -- the lock probe ls, show and prune use ---------------------------------------


def holder_file(path: Path, pid: int, host: str) -> None:
    """A lock file naming ``pid`` on ``host``, nobody holding it."""
    path.write_bytes(msgspec.json.encode(LockHolder(pid=pid, host=host, started_at=NOW)))


@pytest.fixture
def flock_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every flock the probe makes, recorded (and still made)."""
    calls: list[int] = []
    real = fcntl.flock

    def spy(fd: int, operation: int) -> None:
        calls.append(operation)
        real(fd, operation)

    monkeypatch.setattr(fcntl, "flock", spy)  # the module checkpointer._stores.flock calls
    return calls


def test_probe_of_a_holder_on_this_host_never_flocks(
    tmp_path: Path, flock_calls: list[int]
) -> None:
    """A lock naming a process of this host is judged by its pid, alive or dead, never flocked."""
    live, dead, none = tmp_path / "live.lock", tmp_path / "dead.lock", tmp_path / "none.lock"
    holder_file(live, os.getpid(), socket.gethostname())
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    holder_file(dead, int(gone.stdout), socket.gethostname())
    probes = [probe_file_lock(str(p)) for p in (live, dead, none)]
    assert [p.alive if p else None for p in probes] == [True, False, None]
    assert probes[2] is None  # no lock file at all
    assert flock_calls == []


@pytest.mark.parametrize("content", ["", "garbage", "other-host"])
def test_probe_asks_the_kernel_when_the_file_names_no_local_holder(
    tmp_path: Path, flock_calls: list[int], content: str
) -> None:
    """An empty or garbled file, or a holder on another host: a brief shared flock decides."""
    path = tmp_path / "k.lock"
    if content == "other-host":
        holder_file(path, os.getpid(), "elsewhere.invalid")
    else:
        path.write_text(content)
    free = probe_file_lock(str(path))
    assert free is not None and free.alive is False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        held = probe_file_lock(str(path))
    finally:
        os.close(fd)
    assert held is not None and held.alive is True
    assert (held.holder is not None) == (content == "other-host")
    assert flock_calls.count(fcntl.LOCK_SH | fcntl.LOCK_NB) == 2


USER = {"role": "user", "content": "q"}
CALLS = {"role": "assistant", "tool_calls": [{"id": "a"}, {"id": "b"}]}
RESULT_A = {"role": "tool", "tool_call_id": "a", "content": "ra"}
RESULT_B = {"role": "tool", "tool_call_id": "b", "content": "rb"}
ANSWER = {"role": "assistant", "content": "done"}
USE = {"role": "assistant", "content": [{"type": "tool_use", "id": "u", "name": "x"}]}
RESULT_U = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "u"}]}


@pytest.mark.parametrize(
    ("messages", "line"),
    [
        ([USER, CALLS, RESULT_B, RESULT_A, ANSWER], "ok   {path}: seq 3, 5 messages"),
        ([USER, USE, RESULT_U, ANSWER], "ok   {path}: seq 3, 4 messages"),
        ([USER, CALLS, RESULT_A, RESULT_B, ANSWER, USER, USE, RESULT_U], "ok   {path}: seq 3, 8"),
        (
            [USER, CALLS, RESULT_A],
            "warn {path}: seq 3, 3 messages; 1 tool call(s) open at the end, saved while the "
            "tool ran: 'b' ($.state.messages[1]); run them again or close them",
        ),
        (
            [USER, USE],
            "warn {path}: seq 3, 2 messages; 1 tool call(s) open at the end, saved while the "
            "tool ran: 'u' ($.state.messages[1])",
        ),
        (
            {"role": "user"},
            "note {path}: seq 3; $.state.messages is an object, not a list of messages: "
            "not checked",
        ),
        (
            [USER, "hi"],
            "note {path}: seq 3, 2 messages; unrecognised message shape at "
            "$.state.messages[1] (a string): not checked",
        ),
        (
            [{"content": "x"}],
            "note {path}: seq 3, 1 messages; unrecognised message shape at "
            "$.state.messages[0] (an object with keys 'content'): not checked",
        ),
        (
            [{"role": "robot"}],
            "note {path}: seq 3, 1 messages; unrecognised message shape at "
            "$.state.messages[0] (role 'robot'): not checked",
        ),
        (
            [USER, RESULT_A],
            "BAD  {path}: not sendable to a model API: $.state.messages[1]: tool result for "
            "'a' answers no open tool call (orphan result)",
        ),
        (
            [USER, CALLS, RESULT_A, RESULT_B, RESULT_A],
            "BAD  {path}: not sendable to a model API: $.state.messages[4]: tool call 'a' is "
            "answered a second time",
        ),
        (
            [USER, CALLS, RESULT_A, ANSWER],
            "BAD  {path}: not sendable to a model API: $.state.messages[1]: tool call 'b' has "
            "no result before the conversation goes on",
        ),
        (
            [USER, USE, USER],  # messages style: the next user message must answer it
            "BAD  {path}: not sendable to a model API: $.state.messages[1]: tool call 'u' has "
            "no result",
        ),
        (
            [USER, CALLS, RESULT_A, RESULT_B, ANSWER, CALLS],
            "BAD  {path}: not sendable to a model API: $.state.messages[5]: tool call id 'a' "
            "is used by an earlier call too",
        ),
    ],
)
def test_verify_checks_histories_with_validate_history(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], messages: Any, line: str
) -> None:
    """verify: a history a model API refuses is bad (exit 1); calls open at the end warn and
    shapes it does not know are a note, not bad (0)."""
    path = put(tmp_path, "s", {"messages": messages})
    status = main(["verify", str(tmp_path)])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(line.format(path=path)), out[0]
    assert status == (1 if line.startswith("BAD") else 0)
    if line.startswith("warn"):
        assert out[-1] == "1 checkpoint(s): 1 ok (1 with tool calls open at the end), 0 bad"
        assert "transcript=Transcript() closes them as it writes" in out[0]
    if line.startswith("note"):
        assert out[-1] == "1 checkpoint(s): 1 ok (1 with messages not checked), 0 bad"


def test_broken_pipe_is_quiet(store: Path) -> None:
    """`checkpointer ls ROOT | head -0` prints no traceback."""
    ls = subprocess.Popen([*CLI, "ls", str(store)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert ls.stdout is not None and ls.stderr is not None
    ls.stdout.close()
    assert ls.wait(timeout=30) in (0, 1)
    assert b"Traceback" not in ls.stderr.read()
    ls.stderr.close()


# -- hand-edited and odd files: never a traceback ------------------------------


def run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    """``main(argv)`` in this process: (status, stdout, stderr); an exception fails the test."""
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


def put_raw(root: Path, key: str, meta: dict[str, Any], state: Any) -> Path:
    """A checkpoint file with ``meta`` as given (any values), as a person might edit it."""
    root.mkdir(exist_ok=True)
    path = root / f"{key}.json"
    path.write_bytes(msgspec.json.encode({"format": 1, "meta": meta, "state": state}))
    return path


def test_timestamps_without_a_zone_are_utc(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A hand-written updated_at without a zone (load accepts it) is read as UTC by
    ls (sorted among zoned ones), show and prune, which ages it and removes it."""
    naive = (NOW - timedelta(hours=3)).replace(tzinfo=None).isoformat()
    meta = {"key": "naive", "seq": 1, "created_at": naive, "updated_at": naive, "live": False}
    put_raw(tmp_path, "naive", meta, {"messages": []})
    put(tmp_path, "zoned", {"messages": []}, age=timedelta(minutes=1))
    status, out, _ = run(capsys, "ls", tmp_path, "--sort", "updated")
    assert status == 0
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["zoned", "naive"]
    assert f"{NOW - timedelta(hours=3):%Y-%m-%d %H:%M:%S}" in out
    status, out, _ = run(capsys, "show", tmp_path, "naive")
    assert status == 0
    assert re.search(rf"updated_at +{NOW - timedelta(hours=3):%Y-%m-%d %H:%M:%S} UTC\n", out)
    status, out, _ = run(capsys, "prune", tmp_path, "--older-than", "2h")
    assert status == 0, out
    assert f"removed {tmp_path / 'naive.json'} (updated 3h ago)" in out
    assert (tmp_path / "zoned.json").exists() and not (tmp_path / "naive.json").exists()


@pytest.mark.parametrize("when", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_timestamps_at_the_ends_of_the_calendar(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], when: str
) -> None:
    """A timestamp whose UTC time is outside the calendar is shown as written, not a crash."""
    meta = {"key": "edge", "seq": 1, "created_at": when, "updated_at": when, "live": False}
    put_raw(tmp_path, "edge", meta, {"n": 1})
    for command in (["ls"], ["ls", "--json"], ["ls", "--sort", "updated"], ["verify"]):
        status, out, _ = run(capsys, *command, tmp_path)
        assert status == 0, out
    status, out, _ = run(capsys, "show", tmp_path, "edge")
    assert status == 0
    assert re.search(rf"updated_at +{re.escape(when.replace('T', ' '))}\n", out)
    status, out, _ = run(capsys, "prune", tmp_path, "--older-than", "1d", "--dry-run")
    assert status == 0
    assert ("would remove" in out) == when.startswith("0001")


def test_a_tool_call_whose_function_is_not_an_object(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """show lists a call whose function is a string (no name: '?'); verify calls the
    history bad, naming the field, since a model API would refuse it."""
    calls = [{"id": "c1", "type": "function", "function": "grep"}]
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "found"},
    ]
    put(tmp_path, "s", {"messages": messages})
    status, out, _ = run(capsys, "show", tmp_path, "s")
    assert status == 0
    assert "[1] assistant: -> 1 tool call(s): ?" in out
    status, out, _ = run(capsys, "verify", tmp_path)
    assert status == 1
    assert "$.state.messages[1].tool_calls[0].function: is a string, not an object" in out


@pytest.mark.parametrize(
    "calls", [True, "grep", [1], [{"id": ["a"]}], [{"id": "c1", "function": 2}]]
)
def test_odd_tool_calls_and_ids(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], calls: Any
) -> None:
    """tool_calls that are not a list of call objects, or ids that are lists, are bad
    for verify and shown by show, without a traceback."""
    messages = [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": ["x"]}]},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": {"id": 1}, "content": "found"},
    ]
    put(tmp_path, "s", {"messages": messages})
    for command in (["ls"], ["show"], ["verify"]):
        status, out, err = run(
            capsys, *command[:1], tmp_path, *(["s"] if command == ["show"] else [])
        )
        assert status == (1 if command == ["verify"] else 0), out + err
        if command == ["verify"]:
            assert "BAD " in out


@pytest.mark.parametrize("pid", [2**31, 2**63, 2**64, 10**30])
def test_a_lock_file_naming_a_pid_no_process_can_have(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pid: int
) -> None:
    """A lock file naming a pid above the platform's range is judged by the kernel (a
    brief shared flock): stale when nobody holds it, alive when someone does."""
    put(tmp_path, "s", {"messages": []}, age=timedelta(days=2))
    lock = tmp_path / "s.lock"
    lock.write_bytes(
        msgspec.json.encode({"pid": pid, "host": socket.gethostname(), "started_at": NOW})
    )
    status, out, _ = run(capsys, "ls", tmp_path, "--json")
    assert status == 0
    assert json.loads(out)[0]["lock"] == "stale"
    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a holder the file does not name truly
        status, out, _ = run(capsys, "ls", tmp_path, "--json")
        assert status == 0 and json.loads(out)[0]["lock"] == "alive"
        status, out, _ = run(capsys, "prune", tmp_path, "--older-than", "1d")
        assert status == 0 and "kept" in out and (tmp_path / "s.json").exists()
    finally:
        os.close(fd)
    status, out, _ = run(capsys, "prune", tmp_path, "--older-than", "1d")
    assert status == 0
    assert not (tmp_path / "s.json").exists() and not lock.exists()


@pytest.mark.parametrize("when", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_a_lock_file_started_outside_the_calendar(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], when: str
) -> None:
    """A lock file whose start time is outside the calendar in UTC is shown as written."""
    put(tmp_path, "s", {"messages": []})
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "started_at": when}
    (tmp_path / "s.lock").write_bytes(msgspec.json.encode(holder))
    status, out, _ = run(capsys, "show", tmp_path, "s")
    assert status == 0
    shown = f"alive pid {os.getpid()} on {socket.gethostname()} since {when}"
    assert re.search(rf"lock +{re.escape(shown)} \(", out), out
    status, out, _ = run(capsys, "ls", tmp_path, "--json")
    assert status == 0 and json.loads(out)[0]["lock"] == "alive"


def test_verify_names_the_version_that_wrote_a_newer_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A snapshot and a journal of a newer format are BAD in verify, saying which
    agent-checkpointer version to upgrade to; ls marks them; neither is touched."""
    meta = {"key": "s", "seq": 1, "created_at": NOW, "updated_at": NOW, "live": False}
    newer = {**meta, "library_version": "9.9.9"}
    snapshot = tmp_path / "s.json"
    snapshot.write_bytes(msgspec.json.encode({"format": 2, "meta": newer, "state": {}}))
    journal = tmp_path / "j.jsonl"
    header = {"kind": "header", "format": 3, "meta": {**newer, "key": "j", "seq": "new shape"}}
    journal.write_bytes(msgspec.json.encode(header) + b"\n")
    before = snapshot.read_bytes(), journal.read_bytes()
    status, out, _ = run(capsys, "verify", tmp_path)
    assert status == 1
    for path, version in ((journal, 3), (snapshot, 2)):
        assert (
            f"BAD  {path}: written by a newer version (agent-checkpointer 9.9.9); upgrade "
            f"agent-checkpointer to 9.9.9 or later to read it (format {version}; " in out
        )
    status, out, _ = run(capsys, "ls", tmp_path)
    assert status == 1 and out.count("! written by a newer version") == 2
    assert (snapshot.read_bytes(), journal.read_bytes()) == before
