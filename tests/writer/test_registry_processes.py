"""``SessionRegistry`` in real processes: more sessions than ``ulimit -n`` allows, SIGTERM to
the process group of a server holding 1,000, a fork pool, a reopen after another process wrote.

Checked on the bytes stored for each key (``tests/children/registry_child.py``).  Roots are on
tmpfs when there is one: descriptors are the subject here, not fsync.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpointer import FileStore, load
from tests._support import HANG_GUARD, MANY, MAX_OPEN, Pumped, child_env

BACKENDS = ["asyncio", "trio"]


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    shm = Path("/dev/shm")
    if not shm.is_dir():
        yield tmp_path / "store"
        return
    import tempfile

    with tempfile.TemporaryDirectory(dir=shm) as where:
        yield Path(where) / "store"


def child(command: str, root: Path, n: int, backend: str, **kw: object) -> Pumped:
    argv = [sys.executable, "-m", "tests.children.registry_child", command, str(root), str(n)]
    return Pumped([*argv, backend], **kw)  # type: ignore[arg-type]


def run(command: str, root: Path, n: int, backend: str, timeout: float) -> str:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.children.registry_child",
            command,
            str(root),
            str(n),
            backend,
        ],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def counts(root: Path, n: int) -> dict[int, int]:
    """``{n: keys}`` of the stored checkpoints, ``-1`` for a key with none, ``-2`` for one live."""
    store = FileStore(root)
    found: dict[int, int] = {}
    for i in range(n):
        checkpoint = load(store, f"k{i}")
        value = -1 if checkpoint is None else -2 if checkpoint.meta.live else checkpoint.state["n"]
        found[value] = found.get(value, 0) + 1
    return found


@pytest.mark.parametrize("backend", BACKENDS)
def test_more_sessions_than_descriptors(root: Path, backend: str) -> None:
    """``MANY`` keys, each used once (64 requests at a time), in a process limited to
    ``DESCRIPTORS`` (fewer), at most ``MAX_OPEN`` open: all stored."""
    out = run("many", root, MANY, backend, timeout=900)
    stats = json.loads(out.splitlines()[-1])
    assert (stats["opened"], stats["failed"]) == (MANY, 0)
    assert stats["evicted"] >= MANY - MAX_OPEN  # openings in flight count as open too
    assert counts(root, MANY) == {1: MANY}


def test_a_pydantic_ai_server_holds_more_conversations_than_descriptors(
    root: Path,
) -> None:
    """A pydantic-ai ``CheckpointConversationStore`` saving ``MANY`` conversations (64 requests
    at a time) in a process limited to ``DESCRIPTORS`` (fewer): each conversation's message
    stored."""
    pytest.importorskip("pydantic_ai")
    from checkpointer.pydantic_ai import conversation_key

    out = run("pydantic", root, MANY, "asyncio", timeout=900)  # pydantic-ai runs on asyncio
    stats = json.loads(out.splitlines()[-1])
    assert (stats["opened"], stats["failed"]) == (MANY, 0)
    store = FileStore(root)
    wrong = []
    for i in range(MANY):
        checkpoint = load(store, conversation_key(f"c{i}"))
        texts = [] if checkpoint is None else checkpoint.state["messages"]
        if [m["message"]["parts"][0]["content"] for m in texts] != [f"hi {i}"]:
            wrong.append(i)
    assert wrong == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_sigterm_to_the_group_of_a_server_holding_1000_sessions_loses_none(
    root: Path, backend: str
) -> None:
    """SIGTERM to the process group while 1,000 keys hold changes debounced for an hour: each
    key's last state is on disk (one exit hook flushed them all), and the process died of it."""
    holder = child("hold", root, 1000, backend, new_session=True)
    try:
        holder.wait_line(lambda line: line == "ready", "the server holding 1,000 sessions")
        assert counts(root, 1000) == {-2: 1000}  # written live at n = 0; n = 1 not yet
        os.killpg(holder.proc.pid, signal.SIGTERM)
        holder.proc.wait(HANG_GUARD)
    finally:
        holder.kill()
    assert holder.proc.returncode == -signal.SIGTERM, holder.report()
    assert counts(root, 1000) == {1: 1000}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fork_pool_leaves_the_parents_sessions_alone(root: Path, backend: str) -> None:
    """Workers forked from a server use and close its registry, then are terminated: the parent
    still holds every key, and its later writes land."""
    for _ in range(3):  # the terminate race wants repeats
        assert run("fork", root, 50, backend, timeout=HANG_GUARD).splitlines()[-1] == "ok"
        assert counts(root, 50) == {2: 50}


WRITE_ELSEWHERE = textwrap.dedent(
    """
    import sys
    from checkpointer import CheckpointWriter, FileStore, Snapshot, load
    store = FileStore(sys.argv[1])
    base = load(store, "k0")
    with CheckpointWriter(lambda: Snapshot("k0", {"n": 100}), store, resume_from=base):
        pass
    """
)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_key_closed_for_idleness_reopens_from_another_process_write(
    root: Path, backend: str
) -> None:
    """Closed for idleness, written by another process, used again: the server resumes from the
    other's checkpoint and builds on it (101), never over it."""
    server = child("reopen", root, 1, backend, stdin=subprocess.PIPE)
    try:
        server.wait_line(lambda line: line == "idle", "the key closed for idleness")
        subprocess.run(
            [sys.executable, "-c", WRITE_ELSEWHERE, str(root)],
            env=child_env(),
            check=True,
            timeout=HANG_GUARD,
        )
        assert server.proc.stdin is not None
        server.proc.stdin.write("go\n")
        server.proc.stdin.close()
        assert server.wait_line(lambda line: line.startswith("resumed"), "the reopen") == (
            "resumed 100"
        )
        server.proc.wait(HANG_GUARD)
    finally:
        if server.proc.stdin is not None and not server.proc.stdin.closed:
            server.proc.stdin.close()
        server.kill()
    assert server.proc.returncode == 0, server.report()
    checkpoint = load(FileStore(root), "k0")
    assert checkpoint is not None and checkpoint.state == {"n": 101}


def killed(script: str, root: Path, backend: str) -> None:
    """Run ``script`` (its argv: the root, the backend): it must die of its own SIGTERM."""
    done = subprocess.run(
        [sys.executable, "-c", script, str(root), backend],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        check=False,
    )
    assert done.returncode == -signal.SIGTERM, done.stderr[-3000:]


SIGTERM_AS_A_CLOSE_STARTS = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    import anyio
    from checkpointer import FileStore, SessionRegistry, Snapshot

    start = threading.Thread.start

    def start_after_sigterm(thread):  # the signal lands as the final write's thread starts
        if thread.name == "checkpointer-final-write":
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)  # its handler runs here, before start()
        start(thread)

    threading.Thread.start = start_after_sigterm
    state = {}

    async def main():
        async with SessionRegistry(
            lambda key: Snapshot(key, {"n": state[key]}),
            FileStore(sys.argv[1]),
            resume=lambda key: state.update({key: 0}),
            debounce=0.0,
        ) as registry:
            async with registry.session("k0"):
                state["k0"] = 5
            await registry.release("k0")
            await anyio.sleep(30)

    anyio.run(main, backend=sys.argv[2])
    """
)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sigterm_as_a_close_s_final_write_starts_ends_the_process(root: Path, backend: str) -> None:
    """SIGTERM landing as a key's close starts its final write's thread: the process dies of it,
    the key's last state stored (the exit hook wrote it), not a signal swallowed."""
    killed(SIGTERM_AS_A_CLOSE_STARTS, root, backend)
    assert counts(root, 1) == {5: 1}


SIGTERM_AS_A_KEY_OPENS = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    import anyio
    from checkpointer import CheckpointWriter, FileStore, SessionRegistry, Snapshot, load

    class Slow(FileStore):
        slow = False

        def write(self, key, chunks, **kw):
            written = super().write(key, chunks, **kw)
            if self.slow:  # landed; SIGTERM comes before the opening ends
                threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGTERM)).start()
                time.sleep(1.0)
            return written

    store = Slow(sys.argv[1])
    state = {}

    def resume(key):
        checkpoint = load(store, key)
        state[key] = checkpoint.state["n"]
        return checkpoint

    async def main():
        async with CheckpointWriter(lambda: Snapshot("k0", {"n": 6}), store, resume_from=None):
            pass
        source = lambda key: Snapshot(key, {"n": state[key]})
        async with SessionRegistry(source, store, resume=resume) as registry:
            store.slow = True
            async with registry.session("k0"):
                state["k0"] = 7

    anyio.run(main, backend=sys.argv[2])
    """
)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sigterm_as_a_key_opens_stores_it_ended(root: Path, backend: str) -> None:
    """SIGTERM as a key's opening write lands: the exit hook writes it too (``live=False``),
    not left as a live session's checkpoint."""
    killed(SIGTERM_AS_A_KEY_OPENS, root, backend)
    assert counts(root, 1) == {6: 1}
