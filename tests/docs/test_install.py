"""Installing as the docs say: an editable install is typed; the wheel ships the whole package."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests._support import ROOT

PACKAGE = ROOT / "checkpointer"

USER_PROGRAM = '''\
"""A user's typed program: checked with mypy --strict from outside the clone."""

import anyio

from checkpointer import CheckpointWriter, Failed, FileStore, Limits, Result, Snapshot
from checkpointer import Written, load

messages: list[dict[str, object]] = []


def describe(result: Result) -> str:
    if isinstance(result, Written):
        return f"seq {result.seq}"
    if isinstance(result, Failed):
        return result.error
    return result.reason


async def main() -> None:
    store = FileStore(".checkpoints")
    writer: CheckpointWriter[Snapshot] = CheckpointWriter(
        lambda: Snapshot("s", {"messages": messages}, fingerprint=len(messages)),
        store,
        limits=Limits(lock_timeout=1.0),
    )
    async with writer:
        messages.append({"role": "user", "content": "hello"})
        writer.notify()
        print(describe(await writer.write_now()))
    checkpoint = load(store, "s")
    print(checkpoint.meta.seq if checkpoint is not None else None)


anyio.run(main)
'''

# Each line is an error mypy must see: only a typed package makes them errors.
WRONG_PROGRAM = """\
from checkpointer import CheckpointWriter, FileStore, Snapshot

writer: CheckpointWriter[Snapshot] = CheckpointWriter(lambda: Snapshot("s", {}), FileStore("x"))
writer.notify(1)
count: str = writer.statistics().writes
"""


def _installed() -> importlib.metadata.Distribution | None:
    """This environment's installed agent-checkpointer (not a stale egg-info on sys.path)."""
    for dist in importlib.metadata.distributions(name="agent-checkpointer"):
        if dist.read_text("direct_url.json") is not None:
            return dist
    return None


def _editable_root(dist: importlib.metadata.Distribution | None) -> Path | None:
    """The directory ``dist`` is installed editable from, if it is."""
    text = dist.read_text("direct_url.json") if dist is not None else None
    if text is None:
        return None
    info = json.loads(text)
    if not info.get("dir_info", {}).get("editable"):
        return None
    return Path(info["url"].removeprefix("file://"))


def test_editable_install_is_typed(tmp_path: Path) -> None:
    """mypy --strict, run outside the clone, finds the editable install and uses its types."""
    dist = _installed()
    root = _editable_root(dist)
    if dist is None or root is None or root.resolve() != ROOT:
        pytest.skip(f"agent-checkpointer is not installed editable from {ROOT} here")
    site = Path(str(dist.locate_file("")))
    finders = sorted(site.glob("__editable__*checkpointer*finder.py"))
    assert not finders, (
        f"{finders[0]} is an import hook mypy cannot follow (an editable install by the old "
        f"setuptools backend); reinstall: pip install -e '{ROOT}[test]'"
    )
    cache = str(ROOT / ".mypy_cache" / "install-test")  # warm after the first run (gitignored)
    (tmp_path / "user.py").write_text(USER_PROGRAM, encoding="utf-8")
    (tmp_path / "wrong.py").write_text(WRONG_PROGRAM, encoding="utf-8")
    args = ["--strict", "--no-error-summary", "--cache-dir", cache, "user.py", "wrong.py"]
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", *args],
        cwd=tmp_path,  # outside the clone: only the install can make `checkpointer` importable
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    errors = proc.stdout.splitlines()
    assert not [e for e in errors if e.startswith("user.py")], proc.stdout + proc.stderr
    wrong = [e for e in errors if e.startswith("wrong.py")]
    assert len(wrong) == 2, proc.stdout + proc.stderr
    assert "[call-arg]" in wrong[0] and "[assignment]" in wrong[1], proc.stdout


def test_the_wheel_ships_the_whole_package() -> None:
    """The wheel holds every module of checkpointer/, every subpackage, and py.typed."""
    from hatchling.builders.wheel import WheelBuilder

    builder = WheelBuilder(str(ROOT))
    shipped = {f.distribution_path for f in builder.recurse_included_files()}
    wanted = {
        p.relative_to(ROOT).as_posix() for p in PACKAGE.rglob("*") if p.suffix in (".py", ".typed")
    }
    wanted = {w for w in wanted if "__pycache__" not in w}
    assert "checkpointer/py.typed" in wanted
    assert wanted <= shipped, sorted(wanted - shipped)
    assert not [s for s in shipped if not s.startswith("checkpointer/")], shipped


def test_the_user_program_runs(tmp_path: Path) -> None:
    """The typed program the install test checks also runs, so it is a real program."""
    proc = subprocess.run(
        [sys.executable, "-c", USER_PROGRAM],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["seq", "2", "3"], proc.stdout  # the close wrote seq 3
