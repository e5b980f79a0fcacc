"""checkpointer.langgraph: one writer per thread, across processes (issue 22).

A saver reads a thread it does not hold as the store holds it now (the
stored revision compared, the thread read again only when it changed); a
put changes the thread as LangGraph last read it, and the store refuses it
if another process wrote or deleted the thread meanwhile (``"conflict"``);
a thread a live writer holds is not deleted (``"locked"``).  Real processes
(``tests/children/langgraph_child.py``) on real files; the graph is plain
LangGraph nodes.  Asyncio only, as LangGraph's async API.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import IO, Any

import anyio
import anyio.to_thread
import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig

from checkpointer import FileStore, JournalStore, load
from checkpointer.langgraph import CheckpointFailed, CheckpointSaver, thread_key
from checkpointer.stores import Store
from tests._support import MANY, MAX_OPEN, ROOT, child_env
from tests.children.adapter_child import CONFIG, langgraph_graph

pytestmark = pytest.mark.anyio

TIMEOUT = 120.0  # a hang guard for a child's answer, never a timing assertion
KINDS = ["file", "journal"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _store(kind: str, root: Path) -> Store:
    return JournalStore(root) if kind == "journal" else FileStore(root)


def _child(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.children.langgraph_child", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=child_env(),
    )


class Zygote:
    """``langgraph_child zygote``: LangGraph imported once, in a process that forks each agent."""

    def __init__(self) -> None:
        self.requests, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.requests.settimeout(TIMEOUT + 30)  # a hang guard: a reap waits out the watchdog
        with theirs:
            argv = [sys.executable, "-m", "tests.children.langgraph_child", "zygote"]
            self.proc = subprocess.Popen(
                [*argv, str(theirs.fileno())], pass_fds=[theirs.fileno()], cwd=ROOT, env=child_env()
            )
        self._lock = threading.Lock()

    def _ask(self, request: list[Any], fds: list[int] | None = None) -> int:
        with self._lock:
            socket.send_fds(self.requests, [json.dumps(request).encode()], fds or [])
            answer = self.requests.recv(64)
        assert answer, f"the zygote ended (exit {self.proc.wait()})"
        return int(answer)

    def spawn(self, *args: str) -> tuple[int, IO[str], IO[str]]:
        """A forked agent running ``langgraph_child ARGS``: its pid, stdin and stdout."""
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        try:
            pid = self._ask(["spawn", list(args)], [stdin_r, stdout_w])
        finally:
            os.close(stdin_r)
            os.close(stdout_w)
        return pid, open(stdin_w, "w"), open(stdout_r)

    def reap(self, pid: int) -> int:
        """Wait for the agent ``pid`` to end: its exit code."""
        return self._ask(["reap", pid])

    def close(self) -> None:
        self.requests.close()
        self.proc.wait(TIMEOUT)


@pytest.fixture(scope="module")
def zygote() -> Iterator[Zygote]:
    forks = Zygote()
    yield forks
    forks.close()


class Agent:
    """A LangGraph agent in a process of its own (``langgraph_child serve``) on thread "chat",
    forked by the module's zygote."""

    def __init__(self, zygote: Zygote, kind: str, root: Path, *idle_timeout: str) -> None:
        self._zygote = zygote
        self.pid, self._stdin, self._stdout = zygote.spawn(
            "serve", f"{kind}:{root}", "chat", *idle_timeout
        )
        self.returncode: int | None = None
        self._watchdog = threading.Timer(TIMEOUT, self._kill)
        self._watchdog.start()
        assert self._read()["step"] == "ready"

    def _kill(self) -> None:
        if self.returncode is None:  # not reaped: the pid is still this agent's
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def wait(self) -> int:
        if self.returncode is None:
            self.returncode = self._zygote.reap(self.pid)
        return self.returncode

    def _read(self) -> dict[str, Any]:
        line = self._stdout.readline()
        assert line, f"agent {self.pid} ended (exit {self.wait()})"
        answer: dict[str, Any] = json.loads(line)
        return answer

    def send(self, command: str) -> dict[str, Any]:
        self._stdin.write(command + "\n")
        self._stdin.flush()
        return self._read()

    def turns(self, *texts: str) -> list[str]:
        """Run turns that must succeed; the messages after the last one."""
        messages: list[str] = []
        for text in texts:
            answer = self.send(f"turn {text}")
            assert "failed" not in answer, answer
            messages = answer["messages"]
        return messages

    def close(self) -> dict[str, Any]:
        answer = self.send("close")
        self.wait()
        self._watchdog.cancel()
        return answer

    def kill(self) -> None:
        self._watchdog.cancel()
        self._kill()
        self.wait()
        for pipe in (self._stdin, self._stdout):
            with contextlib.suppress(OSError):  # a write the dead agent never read
                pipe.close()


@pytest.fixture
def agents(zygote: Zygote) -> Iterator[Callable[..., Agent]]:
    started: list[Agent] = []

    def start(kind: str, root: Path, *idle_timeout: str) -> Agent:
        agent = Agent(zygote, kind, root, *idle_timeout)
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.kill()


def _contents(state: Any) -> list[str]:
    return [m.content for m in state.values.get("messages", [])]


async def _stored(kind: str, root: Path) -> list[str]:
    """The messages of thread "chat" as the store holds them (a fresh saver's reading)."""
    async with CheckpointSaver(_store(kind, root)) as fresh:
        return _contents(await langgraph_graph(fresh).aget_state(CONFIG))


def _turn(text: str) -> list[str]:
    return [text, "", f"answer:{text}", f"done: answer:{text}"]


# -- reading a thread another process writes --------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_a_saver_that_read_an_empty_thread_goes_on_from_what_another_process_wrote(
    tmp_path: Path, kind: str, agents: Callable[[str, Path], Agent]
) -> None:
    """Read empty; another process runs three turns and exits; the next invoke keeps them."""
    async with CheckpointSaver(_store(kind, tmp_path)) as saver:
        graph = langgraph_graph(saver)
        assert _contents(await graph.aget_state(CONFIG)) == []
        other = agents(kind, tmp_path)
        theirs = other.turns("b0", "b1", "b2")
        assert other.close() == {"pid": other.pid, "step": "close"}
        result = await graph.ainvoke({"messages": [HumanMessage("a0")]}, CONFIG)
    assert [m.content for m in result["messages"]] == [*theirs, *_turn("a0")]
    assert await _stored(kind, tmp_path) == [*theirs, *_turn("a0")]


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_long_lived_reader_sees_a_worker_s_new_turns(
    tmp_path: Path, kind: str, mode: str, agents: Callable[[str, Path], Agent]
) -> None:
    """A saver that never writes the thread (a server showing it) shows each turn of a worker."""
    worker = agents(kind, tmp_path)
    saver = CheckpointSaver(_store(kind, tmp_path))

    async def shown() -> tuple[list[str], int, int]:
        graph = langgraph_graph(saver)
        if mode == "sync":
            state = graph.get_state(CONFIG)
            return _contents(state), len(list(saver.list(CONFIG))), len(list(saver.list(None)))
        state = await graph.aget_state(CONFIG)
        listed = [t async for t in saver.alist(CONFIG)]
        return _contents(state), len(listed), len([t async for t in saver.alist(None)])

    async with saver if mode == "async" else _sync(saver):
        assert await shown() == ([], 0, 0)
        for n in range(1, 4):
            messages = worker.turns(f"w{n}")
            contents, listed, everything = await shown()
            assert contents == messages and len(messages) == 4 * n
            assert listed == everything == len(list(_checkpoints(kind, tmp_path)))
        worker.close()
        assert (await shown())[0] == messages


class _sync:
    """``with saver`` as an async context manager, for one test body over both modes."""

    def __init__(self, saver: CheckpointSaver) -> None:
        self.saver = saver

    async def __aenter__(self) -> CheckpointSaver:
        return self.saver.__enter__()

    async def __aexit__(self, *exc_info: Any) -> None:
        self.saver.__exit__(*exc_info)


def _checkpoints(kind: str, root: Path) -> Iterator[dict[str, Any]]:
    """The checkpoint rows stored for thread "chat" (the bytes, decoded as JSON)."""
    stored = load(_store(kind, root), thread_key("chat"))
    assert stored is not None
    return (row for row in stored.state["messages"] if row["row"] == "checkpoint")


class _Counting:
    """A store of one's own that counts the reads of a whole checkpoint (``load``)."""

    def __init__(self, inner: Store) -> None:
        self._inner = inner
        self.loads = 0

    def read_checkpoint(self, key: str) -> Any:
        self.loads += 1
        return self._inner.read_checkpoint(key)  # type: ignore[attr-defined]

    def read(self, key: str) -> bytes | None:
        self.loads += 1
        return self._inner.read(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_reader_reads_the_thread_again_only_when_it_changed(
    tmp_path: Path, kind: str, agents: Callable[[str, Path], Agent]
) -> None:
    """Reads of an unchanged thread compare its revision: no checkpoint is read again."""
    worker = agents(kind, tmp_path)
    worker.turns("w1")
    store = _Counting(_store(kind, tmp_path))
    async with CheckpointSaver(store) as saver:
        graph = langgraph_graph(saver)
        for _ in range(5):
            assert len(_contents(await graph.aget_state(CONFIG))) == 4
        assert store.loads == 1
        worker.turns("w2")
        for _ in range(5):
            assert len(_contents(await graph.aget_state(CONFIG))) == 8
        assert store.loads == 2
    worker.close()


# -- a write between the read and the put ---------------------------------------------------


class _Pausing(CheckpointSaver):
    """Runs ``meanwhile`` as the first put begins (after LangGraph read the thread); every put
    waits for it (LangGraph runs a step's put and put_writes at once)."""

    def __init__(self, store: Store, meanwhile: Callable[[], object]) -> None:
        super().__init__(store)
        self._meanwhile: Callable[[], object] | None = meanwhile
        self._gate = threading.Lock()

    def _pause(self) -> None:
        with self._gate:
            meanwhile, self._meanwhile = self._meanwhile, None
            if meanwhile is not None:
                meanwhile()

    def put(self, config: RunnableConfig, *args: Any) -> RunnableConfig:
        self._pause()
        return super().put(config, *args)

    def put_writes(self, config: RunnableConfig, *args: Any) -> None:
        self._pause()
        super().put_writes(config, *args)

    async def aput(self, config: RunnableConfig, *args: Any) -> RunnableConfig:
        await anyio.to_thread.run_sync(self._pause)
        return await super().aput(config, *args)

    async def aput_writes(self, config: RunnableConfig, *args: Any) -> None:
        await anyio.to_thread.run_sync(self._pause)
        await super().aput_writes(config, *args)


@pytest.mark.parametrize("durability", ["sync", "async"])
@pytest.mark.parametrize("kind", KINDS)
async def test_another_process_writing_between_the_read_and_the_put_is_a_conflict(
    tmp_path: Path, kind: str, durability: Any, agents: Callable[[str, Path], Agent]
) -> None:
    """The thread was empty when the run read it; three turns of another process land before
    its first put: "conflict" (from the run, or with "async" from the saver's close), their
    turns stay, the saver shows them, and a run from there goes on."""
    theirs: list[str] = []
    inputs = {"messages": [HumanMessage("a0")]}
    raised: list[CheckpointFailed] = []
    try:
        async with _Pausing(
            _store(kind, tmp_path), _other_process(kind, tmp_path, agents, theirs)
        ) as saver:
            graph = langgraph_graph(saver)
            try:
                await graph.ainvoke(inputs, CONFIG, durability=durability)
            except CheckpointFailed as exc:
                raised.append(exc)
            assert len(theirs) == 12
            assert await _stored(kind, tmp_path) == theirs
            assert _contents(await graph.aget_state(CONFIG)) == theirs
            result = await graph.ainvoke(inputs, CONFIG, durability=durability)
            assert [m.content for m in result["messages"]] == [*theirs, *_turn("a0")]
    except CheckpointFailed as exc:
        raised.append(exc)
    _one_conflict(raised)
    assert await _stored(kind, tmp_path) == [*theirs, *_turn("a0")]


@pytest.mark.parametrize("kind", KINDS)
async def test_the_same_conflict_in_a_synchronous_program(
    tmp_path: Path, kind: str, agents: Callable[[str, Path], Agent]
) -> None:
    """As above with ``with`` and ``graph.invoke``: the invoke raises, then goes on from there."""
    theirs: list[str] = []
    inputs = {"messages": [HumanMessage("a0")]}
    raised: list[CheckpointFailed] = []
    with _Pausing(_store(kind, tmp_path), _other_process(kind, tmp_path, agents, theirs)) as saver:
        graph = langgraph_graph(saver)
        try:
            graph.invoke(inputs, CONFIG)
        except CheckpointFailed as exc:
            raised.append(exc)
        assert _contents(graph.get_state(CONFIG)) == theirs and len(theirs) == 12
        result = graph.invoke(inputs, CONFIG)
        assert [m.content for m in result["messages"]] == [*theirs, *_turn("a0")]
    _one_conflict(raised)
    assert await _stored(kind, tmp_path) == [*theirs, *_turn("a0")]


def _other_process(
    kind: str, root: Path, agents: Callable[[str, Path], Agent], theirs: list[str]
) -> Callable[[], None]:
    def run() -> None:
        other = agents(kind, root)
        theirs.extend(other.turns("b0", "b1", "b2"))
        other.close()

    return run


def _one_conflict(raised: list[CheckpointFailed]) -> None:
    assert len(raised) == 1
    assert raised[0].result.reason == "conflict"
    assert "was written by another writer" in str(raised[0])


# -- deleting a thread another process writes ----------------------------------------------


async def _delete(saver: CheckpointSaver, how: str) -> None:
    if how == "delete_thread":
        await anyio.to_thread.run_sync(saver.delete_thread, "chat")
    elif how == "adelete_thread":
        await saver.adelete_thread("chat")
    else:
        await saver.aprune(["chat"], strategy="delete")


@pytest.mark.parametrize("how", ["delete_thread", "adelete_thread", "aprune"])
@pytest.mark.parametrize("kind", KINDS)
async def test_deleting_a_thread_another_process_holds_is_refused(
    tmp_path: Path, kind: str, how: str, agents: Callable[[str, Path], Agent]
) -> None:
    """A live writer of another process holds the thread: the delete raises "locked" naming it,
    and every turn that process runs, before and after, is stored."""
    holder = agents(kind, tmp_path)
    holder.turns("h0")
    async with CheckpointSaver(_store(kind, tmp_path)) as saver:
        with pytest.raises(CheckpointFailed) as raised:
            await _delete(saver, how)
        assert raised.value.result.reason == "locked"
        assert f"pid {holder.pid}" in str(raised.value) and "'chat'" in str(raised.value)
        assert _contents(await langgraph_graph(saver).aget_state(CONFIG)) == _turn("h0")
    messages = holder.turns("h1", "h2")
    assert holder.close() == {"pid": holder.pid, "step": "close"}
    assert messages == [*_turn("h0"), *_turn("h1"), *_turn("h2")]
    assert await _stored(kind, tmp_path) == messages


@pytest.mark.parametrize("kind", ["unlocked-file", "unlocked-journal"])
async def test_a_writer_whose_thread_was_deleted_never_brings_it_back(
    tmp_path: Path, kind: str, agents: Callable[[str, Path], Agent]
) -> None:
    """On a store of one's own with no lock (it still fences), another process deletes the
    thread a live saver writes: that saver's next turn raises "conflict" ("was deleted"), it
    shows the thread empty, and neither the turn nor its close writes the thread back."""
    writer = agents(kind, tmp_path)
    writer.turns("w0", "w1")
    plain = kind.removeprefix("unlocked-")
    async with CheckpointSaver(_store(plain, tmp_path)) as saver:
        await saver.adelete_thread("chat")
    gone = load(_store(plain, tmp_path), thread_key("chat"))
    assert gone is None
    answer = writer.send("turn w2")
    assert answer["failed"]["reason"] == "conflict" and "was deleted" in answer["failed"]["error"]
    assert load(_store(plain, tmp_path), thread_key("chat")) is None
    assert writer.send("state")["messages"] == []
    assert writer.close() == {"pid": writer.pid, "step": "close"}
    assert load(_store(plain, tmp_path), thread_key("chat")) is None
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(thread_key("chat") + ".")]


# -- two processes started at once on a new thread, many times, under load ---------------------

REPEATS = 20
AT_ONCE = 4  # repetitions side by side (each its own root): their waits overlap


@pytest.fixture
def cpu_load() -> Iterator[None]:
    """A process spinning on one CPU for the test's length (the machine has two)."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()


@pytest.mark.parametrize("kind", KINDS)
async def test_two_processes_started_at_once_on_a_new_thread_lose_no_turn(
    tmp_path: Path, kind: str, cpu_load: None
) -> None:
    """Each reads the new thread, waits a random moment, runs three turns: every turn that
    returned is stored; one that began after the other closed its saver is never refused."""
    race = _child("race", kind, str(tmp_path), str(REPEATS), str(AT_ONCE))
    out, _ = race.communicate(timeout=REPEATS * TIMEOUT)
    assert race.returncode == 0
    reports = [json.loads(line) for line in out.splitlines()]
    assert len(reports) == 2 * REPEATS
    outcomes = []
    for rep in range(REPEATS):
        a, b = sorted((r for r in reports if r["rep"] == rep), key=lambda r: r["name"])
        stored = await _stored(kind, tmp_path / str(rep))
        for agent, other in ((a, b), (b, a)):
            for turn in agent["turns"]:
                assert turn in stored, (rep, agent, stored)
            if agent["started"] is not None and agent["started"] > other["closed"]:
                assert agent["failed"] is None and len(agent["turns"]) == 3, (rep, agent)
        assert len(a["turns"]) == 3 or len(b["turns"]) == 3, (rep, a, b)
        after = any(
            x["started"] is not None and x["started"] > y["closed"] for x, y in ((a, b), (b, a))
        )
        outcomes.append((after, *sorted((len(a["turns"]), len(b["turns"])))))
    # -s shows how the repetitions went: (one began after the other closed, turns, turns)
    print(f"{kind}: {sorted(Counter(outcomes).items())}")


# -- a server of many threads; a thread let go for idleness -------------------------------------


def test_a_server_holds_more_threads_than_descriptors(tmp_path: Path) -> None:
    """``MANY`` threads, one turn each (``"sync"``: each key taken), 64 runs at a time, in a
    process limited to fewer descriptors: each thread's turn stored, its key let go."""
    root = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp_path  # descriptors, not fsync
    with tempfile.TemporaryDirectory(dir=root) as where:
        done = subprocess.run(
            [sys.executable, "-m", "tests.children.langgraph_child", "many", where, str(MANY)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=child_env(),
            timeout=1800,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        stats = json.loads(done.stdout.splitlines()[-1])
        # A key let go between a run's puts (64 runs at once, the bound near it) reopens, fenced.
        assert stats["opened"] >= MANY and (stats["failed"], stats["open"]) == (0, 0)
        assert stats["evicted"] >= MANY - MAX_OPEN
        wrong = []
        with CheckpointSaver(FileStore(where)) as saver:
            graph = langgraph_graph(saver)
            for i in range(MANY):
                stored = load(FileStore(where), thread_key(f"t{i}"))
                state = graph.get_state({"configurable": {"thread_id": f"t{i}"}})
                if stored is None or stored.meta.live or _contents(state) != _turn(f"hi {i}"):
                    wrong.append(i)
        assert wrong == []


@pytest.mark.parametrize("kind", KINDS)
async def test_a_thread_closed_for_idleness_reopens_from_another_process_write(
    tmp_path: Path, kind: str, agents: Callable[..., Agent]
) -> None:
    """A server's thread, let go for idleness, gets a turn from another process; the server's
    next turn goes on from it, and the store holds the three turns."""
    server = agents(kind, tmp_path, "0.05")
    server.turns("a0")
    assert server.send("idle")["step"] == "idle"
    other = agents(kind, tmp_path)
    assert other.turns("b0") == [*_turn("a0"), *_turn("b0")]
    other.close()
    assert server.turns("c0") == [*_turn("a0"), *_turn("b0"), *_turn("c0")]
    assert server.close() == {"pid": server.pid, "step": "close"}
    assert await _stored(kind, tmp_path) == [*_turn("a0"), *_turn("b0"), *_turn("c0")]


class _LetGo(CheckpointSaver):
    """Each put after the first waits until the thread's writer was closed for idleness; the
    third runs ``meanwhile`` first (LangGraph runs a step's put and put_writes at once), once
    no put is writing and the thread is let go, and every other put waits for it: a put of
    the run's beside it would take the thread's lock from the other process."""

    def __init__(self, store: Store, meanwhile: Callable[[], object] | None = None) -> None:
        super().__init__(store, idle_timeout=0.01)
        self._meanwhile = meanwhile
        self._puts = 0
        self._writing = 0
        self._gate = anyio.Lock()

    async def _let_go(self, *, writing: bool) -> None:
        """Wait until the thread's writer is closed (and, ``writing``, no put of ours writes)."""
        while (writing and self._writing) or self._threads.registry.statistics().open:  # noqa: ASYNC110
            await anyio.sleep(0.005)

    @contextlib.asynccontextmanager
    async def _put(self) -> AsyncIterator[None]:
        self._puts += 1
        if self._puts > 1:
            await self._let_go(writing=False)
        async with self._gate:
            meanwhile = self._meanwhile
            if self._puts >= 3 and meanwhile is not None:
                self._meanwhile = None
                await self._let_go(writing=True)  # a put that passed the gate first ends first
                await anyio.to_thread.run_sync(meanwhile)
            self._writing += 1
        try:
            yield
        finally:
            self._writing -= 1

    async def aput(self, config: RunnableConfig, *args: Any) -> RunnableConfig:
        async with self._put():
            return await super().aput(config, *args)

    async def aput_writes(self, config: RunnableConfig, *args: Any) -> None:
        async with self._put():
            await super().aput_writes(config, *args)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_run_goes_on_over_its_thread_let_go_between_puts(tmp_path: Path, kind: str) -> None:
    """The thread's writer closes for idleness between each two puts of a run: each reopening
    goes on from what the last one wrote, and the turn is stored whole."""
    async with _LetGo(_store(kind, tmp_path)) as saver:
        result = await langgraph_graph(saver).ainvoke(
            {"messages": [HumanMessage("a0")]}, CONFIG, durability="sync"
        )
        assert saver._threads.registry.statistics().closed_idle >= 3
    assert [m.content for m in result["messages"]] == _turn("a0")
    assert await _stored(kind, tmp_path) == _turn("a0")


@pytest.mark.parametrize("kind", KINDS)
async def test_another_process_writing_while_a_run_s_thread_is_let_go_is_a_conflict(
    tmp_path: Path, kind: str, agents: Callable[..., Agent]
) -> None:
    """Another process runs a turn while a run's thread is let go between two puts: the run's
    next put raises "conflict", and the other's turn stays (never built over)."""
    theirs: list[str] = []
    with pytest.raises(CheckpointFailed) as raised:
        async with _LetGo(
            _store(kind, tmp_path), _other_process(kind, tmp_path, agents, theirs)
        ) as saver:
            await langgraph_graph(saver).ainvoke(
                {"messages": [HumanMessage("a0")]}, CONFIG, durability="sync"
            )
    assert raised.value.result.reason == "conflict"
    assert "since this saver let it go" in str(raised.value)
    assert theirs[-4:] == _turn("b2")
    assert await _stored(kind, tmp_path) == theirs


# -- a synchronous server of more threads than descriptors ----------------------------------


def test_a_sync_server_holds_more_threads_than_descriptors_under_ulimit_256(
    tmp_path: Path,
) -> None:
    """A ``with`` saver (default ``max_open``) serving 400 threads from 8 request threads under
    ``ulimit -n 256``: each turn stored; a thread let go resumes fenced (one another process
    wrote meanwhile raises "conflict", and a new run goes on from the other's turn; one it
    did not write goes on)."""
    root = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp_path  # descriptors, not fsync
    with tempfile.TemporaryDirectory(dir=root) as where:
        server = subprocess.Popen(
            [sys.executable, "-m", "tests.children.langgraph_sync_child", where, "400"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=child_env(),
        )
        watchdog = threading.Timer(600, server.kill)  # a hang guard, not a timing assertion
        watchdog.start()
        try:
            assert server.stdout is not None and server.stdin is not None
            served = server.stdout.readline()
            assert served, server.communicate()[1][-3000:]
            with CheckpointSaver(FileStore(where)) as other:  # t0's key was let go: it takes it
                other_config: Any = {"configurable": {"thread_id": "t0"}}
                langgraph_graph(other).invoke(
                    {"messages": [HumanMessage("b0")]}, other_config, durability="sync"
                )
            server.stdin.write("go\n")
            server.stdin.flush()
            again = json.loads(server.stdout.readline())
            out, err = server.communicate()
        finally:
            watchdog.cancel()
        assert server.returncode == 0, err[-3000:]
        assert json.loads(out) == {"step": "closed"}
        assert again["t0"]["reason"] == "conflict", again
        assert again["t1"] == [*_turn("hi 1"), *_turn("again 1")]
        theirs = [*_turn("hi 0"), *_turn("b0")]
        assert again["t0_retried"] == [*theirs, *_turn("again 0")]  # from what they wrote
        expected = {0: again["t0_retried"], 1: again["t1"]}
        wrong = []
        with CheckpointSaver(FileStore(where)) as saver:
            graph = langgraph_graph(saver)
            for i in range(400):
                stored = load(FileStore(where), thread_key(f"t{i}"))
                state = graph.get_state({"configurable": {"thread_id": f"t{i}"}})
                contents = _contents(state)
                if (
                    stored is None
                    or stored.meta.live
                    or contents != expected.get(i, _turn(f"hi {i}"))
                ):
                    wrong.append((i, contents))
        assert wrong == []
