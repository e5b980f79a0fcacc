"""A final write that fails is loud: an ERROR on the "checkpointer" logger, and in statistics()."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from checkpointer import CheckpointWriter, Failed, Snapshot, Written, load
from tests.conftest import FaultyStore

LOGGER = "checkpointer"


def errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.ERROR]


@pytest.mark.anyio
async def test_a_failed_final_write_at_close_is_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`async with` ends normally, but the failure is an ERROR and statistics() keeps it."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    store = FaultyStore(tmp_path)
    state = {"n": 0}
    async with CheckpointWriter(lambda: Snapshot("k", dict(state)), store, exit_hooks=False) as w:
        state["n"] = 1
        store.failing = True  # the disk fills up before the close
    stats = w.statistics()
    assert isinstance(stats.last_failure, Failed) and stats.last_failure.reason == "write-failed"
    assert stats.last_result == stats.last_failure
    (record,) = errors(caplog)
    assert record.getMessage().startswith("checkpointer: the final write at close failed")
    assert str(store.location("k")) in record.getMessage()
    retrying = [r for r in caplog.records if "retrying with backoff" in r.getMessage()]
    assert not retrying  # a final write is never retried: it does not say it will be
    checkpoint = load(store, "k")
    assert checkpoint is not None and checkpoint.state == {"n": 0}  # the previous one stays


def test_a_failed_final_write_of_close_is_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The synchronous close says the same, and its result is the Failed it returns."""
    store = FaultyStore(tmp_path)
    writer = CheckpointWriter(lambda: Snapshot("k", {"n": 1}), store, exit_hooks=False).open()
    store.failing = True
    result = writer.close()
    assert isinstance(result, Failed)
    assert writer.statistics().last_failure == result == writer.statistics().last_result
    assert len(errors(caplog)) == 1


@pytest.mark.anyio
async def test_statistics_keep_the_last_result_and_the_last_failure(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """last_result follows every write; last_failure stays after a success; DEBUG logs each."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    store = FaultyStore(tmp_path)
    state = {"n": 0}
    writer = CheckpointWriter(lambda: Snapshot("k", dict(state)), store, exit_hooks=False)
    async with writer:
        assert isinstance(writer.statistics().last_result, Written)  # the write on start
        assert writer.statistics().last_failure is None
        store.failing, state["n"] = True, 1
        failed = await writer.write_now()
        assert isinstance(failed, Failed)
        store.failing, state["n"] = False, 2
        written = await writer.write_now()
        assert isinstance(written, Written)
        stats = writer.statistics()
        assert (stats.last_result, stats.last_failure) == (written, failed)
    assert not errors(caplog)  # the final write worked
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert sum(m.startswith("checkpointer: Written(") for m in debug) == 3  # start, now, close
    assert sum(m.startswith("checkpointer: Failed(") for m in debug) == 1


CHILD = textwrap.dedent(
    """
    import os, shutil, sys
    from checkpointer import CheckpointWriter, FileStore, Snapshot

    root = sys.argv[1]
    writer = CheckpointWriter(lambda: Snapshot("k", {"n": 1}), FileStore(root))
    writer.open()  # never closed: the exit flush writes the last state
    shutil.rmtree(root)
    open(root, "w").close()  # a file where the store's directory was: the flush fails
    """
)


def test_a_failed_final_write_at_exit_is_an_error_on_stderr(tmp_path: Path) -> None:
    """A script whose exit flush fails says so at ERROR on stderr (logging's last resort)."""
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "root")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr  # the program's own status: it did nothing wrong
    assert "checkpointer: the final write at exit failed (write-failed)" in proc.stderr
