"""checkpointer.langgraph: LangGraph's BaseCheckpointSaver over CheckpointWriters.

Asyncio only: LangGraph's async API (``ainvoke``, the ``a*`` saver methods)
runs on asyncio, not on trio, so these tests do not take the trio backend;
the sync API is tested with ``with`` and ``invoke``.  The conformance suite
(``langgraph-checkpoint-conformance``) is the spec; the crash tests kill a
real agent process inside a tool (``tests/children/adapter_child.py``).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypedDict

import anyio
import anyio.to_thread
import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from checkpointer import FileStore, JournalStore, Written, load
from checkpointer.langgraph import CheckpointFailed, CheckpointSaver, thread_key
from checkpointer.langgraph._log import Blob, Log, Put, Tail
from tests._support import ROOT, child_env
from tests.children.adapter_child import (
    CONFIG,
    crash_in_tool,
    langchain_problems,
    langgraph_graph,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    """LangGraph is asyncio-only (see the module docstring)."""
    return "asyncio"


def _rows(root: Path, thread_id: str = "chat") -> list[dict[str, Any]]:
    checkpoint = load(JournalStore(root), thread_key(thread_id))
    assert checkpoint is not None
    rows: list[dict[str, Any]] = checkpoint.state["messages"]
    return rows


async def _run_conformance(make: Any) -> None:
    registered = checkpointer_test(name="CheckpointSaver")(make)
    report = await validate(registered)
    results = report.results
    assert {r for r, v in results.items() if v.detected} == {c.value for c in ALL_CAPABILITIES}
    failures = {cap: r.failures for cap, r in results.items() if not r.passed}
    assert not failures
    passed = sum(r.tests_passed for r in results.values())
    assert passed == 81
    assert sum(r.tests_failed for r in results.values()) == 0


async def test_conformance_async_journal(tmp_path: Path) -> None:
    """Every capability is detected and all 81 conformance tests pass (async, JournalStore)."""
    count = iter(range(100))

    async def make() -> Any:
        async with CheckpointSaver(JournalStore(tmp_path / str(next(count)))) as saver:
            yield saver

    await _run_conformance(make)


async def test_conformance_sync_filestore(tmp_path: Path) -> None:
    """The same 81 pass on a saver entered with ``with`` (every put written on return)."""
    count = iter(range(100))

    async def make() -> Any:
        with CheckpointSaver(FileStore(tmp_path / str(next(count)))) as saver:
            yield saver

    await _run_conformance(make)


async def _turns(saver: CheckpointSaver, turns: list[str], durability: Any = "sync") -> Any:
    graph = langgraph_graph(saver)
    for turn in turns:
        await graph.ainvoke({"messages": [HumanMessage(turn)]}, CONFIG, durability=durability)
    return graph


async def test_history_reloads_from_disk(tmp_path: Path) -> None:
    """A fresh saver on the same root lists the same checkpoints, values and writes."""
    async with CheckpointSaver(JournalStore(tmp_path)) as saver:
        await _turns(saver, ["a", "b", "c"])
        before = [t async for t in saver.alist(CONFIG)]
    async with CheckpointSaver(JournalStore(tmp_path)) as fresh:
        after = [t async for t in fresh.alist(CONFIG)]
    assert len(after) == len(before) > 10
    for old, new in zip(before, after, strict=True):
        assert new.checkpoint == old.checkpoint
        assert new.metadata == old.metadata
        assert new.pending_writes == old.pending_writes
        assert new.parent_config == old.parent_config


async def test_messages_channel_stored_as_tails(tmp_path: Path) -> None:
    """A step that adds a message stores it, not the whole messages channel again."""
    async with CheckpointSaver(JournalStore(tmp_path)) as saver:
        graph = await _turns(saver, ["a", "b", "c", "d"])
        state = await graph.aget_state(CONFIG)
    rows = _rows(tmp_path)
    messages = [r for r in rows if r["row"] in ("blob", "tail") and r["channel"] == "messages"]
    assert [r["row"] for r in messages].count("blob") == 1  # the first version only
    assert len([r for r in messages if r["row"] == "tail"]) == len(messages) - 1
    async with CheckpointSaver(JournalStore(tmp_path)) as fresh:
        reloaded = await langgraph_graph(fresh).aget_state(CONFIG)
    assert reloaded.values["messages"] == state.values["messages"]
    assert len(state.values["messages"]) == 16


async def test_replaced_message_is_stored_whole(tmp_path: Path) -> None:
    """A message replaced by id (an edit of an earlier one) is a full value, and reloads."""
    async with CheckpointSaver(JournalStore(tmp_path)) as saver:
        graph = await _turns(saver, ["a", "b"])
        first = (await graph.aget_state(CONFIG)).values["messages"][0]
        await graph.aupdate_state(CONFIG, {"messages": [HumanMessage("edited", id=first.id)]})
        edited = (await graph.aget_state(CONFIG)).values["messages"]
    assert edited[0].content == "edited"
    async with CheckpointSaver(JournalStore(tmp_path)) as fresh:
        reloaded = (await langgraph_graph(fresh).aget_state(CONFIG)).values["messages"]
    assert reloaded == edited
    assert _rows(tmp_path)[-3:][0]["row"] in ("blob", "checkpoint", "write")


async def test_durability_sync_is_on_disk_when_invoke_returns(tmp_path: Path) -> None:
    """durability="sync" waits for the durable write, even with a long debounce."""
    async with CheckpointSaver(JournalStore(tmp_path), debounce=1000, max_wait=1000) as saver:
        graph = await _turns(saver, ["a"], durability="sync")
        latest = (await graph.aget_state(CONFIG)).config["configurable"]["checkpoint_id"]
        assert latest in {r.get("id") for r in _rows(tmp_path)}


async def test_durability_async_is_debounced(tmp_path: Path) -> None:
    """durability="async" is a notify: on disk at the writer's timing (here: the close).

    The thread's writer opens (and writes what was put so far) after the first
    put, in the saver's task; a turn after that open waits for the writer's timing.
    """
    async with CheckpointSaver(JournalStore(tmp_path), debounce=1000, max_wait=1000) as saver:
        graph = await _turns(saver, ["a"], durability="async")
        for _ in range(6000):  # up to a minute, a hang guard: the open's first write lands
            if load(JournalStore(tmp_path), thread_key("chat")) is not None:
                break
            await anyio.sleep(0.01)
        await graph.ainvoke({"messages": [HumanMessage("b")]}, CONFIG, durability="async")
        latest = (await graph.aget_state(CONFIG)).config["configurable"]["checkpoint_id"]
        on_disk = load(JournalStore(tmp_path), thread_key("chat"))
        assert on_disk is not None
        assert latest not in {r.get("id") for r in on_disk.state["messages"]}
    assert latest in {r.get("id") for r in _rows(tmp_path)}


async def test_prune_keeps_the_latest_value_whole(tmp_path: Path) -> None:
    """After prune(keep_latest) the latest state reloads, its tail chain joined into one value."""
    async with CheckpointSaver(JournalStore(tmp_path)) as saver:
        graph = await _turns(saver, ["a", "b", "c"])
        state = (await graph.aget_state(CONFIG)).values
        await saver.aprune(["chat"], strategy="keep_latest")
    async with CheckpointSaver(JournalStore(tmp_path)) as fresh:
        assert len([t async for t in fresh.alist(CONFIG)]) == 1
        assert (await langgraph_graph(fresh).aget_state(CONFIG)).values == state


async def test_a_pruned_log_keeps_a_tail_whose_base_it_keeps() -> None:
    """A kept list value stays a tail over a kept base, else is stored whole; each reads back."""
    serde = JsonPlusSerializer()
    log = Log()
    for version, items in enumerate([["a"], ["a", "b"], ["a", "b", "c"]], 1):
        rows, last = log.value_rows("", {"m": serde.dumps_typed(items)}, {"m": version})
        checkpoint = {**empty_checkpoint(), "id": f"c{version}", "channel_versions": {"m": version}}
        kind, data = serde.dumps_typed(checkpoint)
        rows.append(Put("", f"c{version}", None, kind, data, *serde.dumps_typed({})))
        log.extend(rows, last)
    for kept, kinds in [({"c2", "c3"}, [Blob, Tail]), ({"c3"}, [Blob])]:
        pruned = Log()
        pruned.reset(log.kept({("", c) for c in kept}, serde.loads_typed) or [])
        assert [type(row) for row in pruned.rows if not isinstance(row, Put)] == kinds
        for version in (2, 3) if "c2" in kept else (3,):
            assert pruned.blob_bytes("", "m", version) == log.blob_bytes("", "m", version)


async def test_delete_thread_removes_its_key(tmp_path: Path) -> None:
    """delete_thread removes the thread's journal; the thread starts afresh after."""
    async with CheckpointSaver(JournalStore(tmp_path)) as saver:
        await _turns(saver, ["a"])
        await saver.adelete_thread("chat")
        assert not (tmp_path / f"{thread_key('chat')}.jsonl").exists()
        assert await saver.aget_tuple(CONFIG) is None
        await _turns(saver, ["b"])
    assert len([r for r in _rows(tmp_path) if r["row"] == "checkpoint"]) > 0


@asynccontextmanager
async def _worker_threads_busy() -> AsyncIterator[None]:
    """No worker thread starts meanwhile (the loop's default limiter, held), as under load."""
    limiter = anyio.to_thread.current_default_thread_limiter()
    total, holder = limiter.total_tokens, object()
    limiter.total_tokens = 1
    await limiter.acquire_on_behalf_of(holder)
    try:
        yield
    finally:
        limiter.release_on_behalf_of(holder)
        limiter.total_tokens = total


def _async_put(
    saver: CheckpointSaver, checkpoint: Any, new_versions: Any, failed: list[Any]
) -> Any:
    """``saver.aput`` as LangGraph's ``"async"`` durability calls it, its error kept."""
    config: RunnableConfig = {
        "configurable": {"thread_id": "chat", "checkpoint_ns": "", "__pregel_durability": "async"}
    }

    async def put() -> None:
        try:
            await saver.aput(config, checkpoint, {"source": "loop", "step": 5}, new_versions)
        except Exception as exc:
            failed.append(exc)

    return put


def _flush(saver: CheckpointSaver) -> Any:
    """What the SIGTERM handler does to the thread's writer (open in the saver's registry)."""
    writer = saver._threads.registry._entries[thread_key("chat")].writer
    assert writer is not None
    return writer.flush_sync()


async def test_put_waiting_for_its_worker_thread_is_in_a_flush(tmp_path: Path) -> None:
    """A checkpoint handed to aput is in a flush (SIGTERM's) before a worker thread encodes it."""
    async with CheckpointSaver(JournalStore(tmp_path), debounce=1000, max_wait=1000) as saver:
        await _turns(saver, ["a"])  # durable: the thread's writer is open
        checkpoint = empty_checkpoint()
        failed: list[Any] = []
        async with anyio.create_task_group() as tasks, _worker_threads_busy():
            tasks.start_soon(_async_put(saver, checkpoint, {}, failed))
            await anyio.wait_all_tasks_blocked()
            assert isinstance(_flush(saver), Written)
            assert checkpoint["id"] in {r.get("id") for r in _rows(tmp_path)}
        assert not failed
        stored = await saver.aget_tuple(CONFIG)
        assert stored is not None and stored.checkpoint["id"] == checkpoint["id"]
    assert [r.get("id") for r in _rows(tmp_path)].count(checkpoint["id"]) == 1


class _Unencodable:
    """A channel value the serializer below refuses."""


class _Refusing(JsonPlusSerializer):
    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        if isinstance(obj, _Unencodable):
            raise TypeError("unencodable channel value")
        return super().dumps_typed(obj)


async def test_put_a_flush_cannot_encode_raises_from_aput(tmp_path: Path) -> None:
    """A put that fails to encode in a flush leaves the flush to the rest; aput still raises."""
    store = JournalStore(tmp_path)
    async with CheckpointSaver(store, serde=_Refusing(), debounce=1000, max_wait=1000) as saver:
        await _turns(saver, ["a"])
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"x": _Unencodable()}
        failed: list[Any] = []
        async with anyio.create_task_group() as tasks, _worker_threads_busy():
            tasks.start_soon(_async_put(saver, checkpoint, {"x": 1}, failed))
            await anyio.wait_all_tasks_blocked()
            assert not isinstance(_flush(saver), Written)  # nothing new to write
        assert [str(e) for e in failed] == ["unencodable channel value"]
    assert checkpoint["id"] not in {r.get("id") for r in _rows(tmp_path)}


def test_sync_graph_writes_every_put(tmp_path: Path) -> None:
    """With ``with`` and ``invoke``, each checkpoint is on disk when put returns."""
    from langchain_core.messages import HumanMessage as Human

    with CheckpointSaver(JournalStore(tmp_path), debounce=1000, max_wait=1000) as saver:
        graph = langgraph_graph(saver)
        graph.invoke({"messages": [Human("a")]}, CONFIG)
        latest = graph.get_state(CONFIG).config["configurable"]["checkpoint_id"]
        assert latest in {r.get("id") for r in _rows(tmp_path)}


def _race_put_and_writes(saver: CheckpointSaver, thread_id: str, tasks: int) -> None:
    """A put of checkpoint "2" and ``tasks`` put_writes for "1", from threads started at once."""
    configurable = {"thread_id": thread_id, "checkpoint_ns": ""}
    start = threading.Barrier(1 + tasks)

    def put() -> None:
        start.wait()
        saver.put({"configurable": configurable}, {**empty_checkpoint(), "id": "2"}, {}, {})

    def put_writes(task: str) -> None:
        start.wait()
        at: Any = {"configurable": {**configurable, "checkpoint_id": "1"}}
        saver.put_writes(at, [("channel", task)], task)

    workers = [threading.Thread(target=put)]
    workers += [threading.Thread(target=put_writes, args=(f"task{n}",)) for n in range(tasks)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def test_sync_puts_from_many_threads_never_write_an_older_state_last(tmp_path: Path) -> None:
    """A put and put_writes racing in LangGraph's worker threads: the thread's last commit
    holds every row of them, never a state taken before another's change (100 races)."""
    with CheckpointSaver(JournalStore(tmp_path)) as saver:
        for trial in range(100):
            config: Any = {"configurable": {"thread_id": f"t{trial}", "checkpoint_ns": ""}}
            saver.put(config, {**empty_checkpoint(), "id": "1"}, {}, {})
            _race_put_and_writes(saver, f"t{trial}", tasks=8)
            assert len(_rows(tmp_path, f"t{trial}")) == 10  # 2 checkpoints, 8 writes


def test_thread_keys() -> None:
    """A thread id that no key can spell maps to a digest key, distinct from plain ones."""
    assert thread_key("t-1") == "lg-t-1"
    assert thread_key("a/b").startswith("lg.")
    assert thread_key("a/b") != thread_key("a/c")


def test_unopened_saver_says_how_to_use_it(tmp_path: Path) -> None:
    """A saver used outside ``with``/``async with`` raises naming both."""
    with pytest.raises(RuntimeError, match="async with"):
        CheckpointSaver(JournalStore(tmp_path)).get_tuple(CONFIG)


# -- killed inside a tool ------------------------------------------------------------


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("langgraph-crash")
    codes = crash_in_tool("langgraph", str(base))
    assert codes == {"KILL": -9, "TERM": -15, "UNPUT": -15}
    return base


def _kinds(messages: list[Any]) -> list[str]:
    return [type(m).__name__ for m in messages]


async def test_resume_after_sigkill_inside_a_tool(crashed: Path) -> None:
    """SIGKILL mid-tool: the two durable turns resume; the graph accepts them and goes on."""
    async with CheckpointSaver(JournalStore(crashed / "KILL")) as saver:
        graph = langgraph_graph(saver)
        state = await graph.aget_state(CONFIG)
        assert len(state.values["messages"]) == 8
        assert state.next == ()
        result = await graph.ainvoke({"messages": [HumanMessage("fourth")]}, CONFIG)
    assert not langchain_problems(result["messages"])
    assert result["messages"][-1].content == "done: answer:fourth"


async def test_resume_after_sigterm_inside_a_tool(crashed: Path) -> None:
    """SIGTERM mid-tool: every checkpoint put, the last one not yet encoded, was flushed."""
    async with CheckpointSaver(JournalStore(crashed / "TERM")) as saver:
        graph = langgraph_graph(saver)
        state = await graph.aget_state(CONFIG)
        messages = state.values["messages"]
        assert len(messages) == 10
        assert isinstance(messages[-1], AIMessage) and messages[-1].tool_calls
        assert state.next == ("tools",)
        result = await graph.ainvoke(None, CONFIG)  # LangGraph's own resume
        assert isinstance(result["messages"][-2], ToolMessage)
        result = await graph.ainvoke({"messages": [HumanMessage("fourth")]}, CONFIG)
    assert not langchain_problems(result["messages"])
    assert len(result["messages"]) == 16
    assert os.path.exists(crashed / "TERM" / f"{thread_key('chat')}.jsonl")


async def test_resume_after_sigterm_before_langgraph_put_the_step(crashed: Path) -> None:
    """SIGTERM before the tool's checkpoint is put: the one before, with the model's writes."""
    async with CheckpointSaver(JournalStore(crashed / "UNPUT")) as saver:
        calls: list[str] = []
        graph = langgraph_graph(saver, calls)
        state = await graph.aget_state(CONFIG)
        messages = state.values["messages"]
        assert len(messages) == 10
        assert isinstance(messages[-1], AIMessage) and messages[-1].tool_calls
        assert state.next == ()  # the model task is done: its writes are pending ones
        result = await graph.ainvoke(None, CONFIG)
    assert _kinds(result["messages"][8:]) == [
        "HumanMessage",
        "AIMessage",
        "ToolMessage",
        "AIMessage",
    ]
    assert calls == ["answer:third"]  # the model is not asked for the tool call again
    assert not langchain_problems(result["messages"])


# -- nodes that change state in place; a second process on the thread -----------------


class _Data(TypedDict, total=False):
    data: dict[str, Any]
    n: int


def _fill(state: _Data) -> _Data:
    return {"data": {f"k{i}": HumanMessage(content=f"m{i}", id=f"id{i}") for i in range(300)}}


async def _churn(state: _Data) -> _Data:
    data = state["data"]
    for i in range(300):
        data[f"churn{i}"] = HumanMessage(content="x")
        data.pop(f"k{i}", None)
        if i % 20 == 0:
            await asyncio.sleep(0)
    return {"n": len(data)}


async def test_a_node_changing_state_in_place_does_not_change_the_last_checkpoint(
    tmp_path: Path,
) -> None:
    """durability="async": the checkpoint after "fill" is what fill returned, on disk too."""
    from langgraph.graph import END, START, StateGraph

    builder = StateGraph(_Data)
    builder.add_node("fill", _fill)
    builder.add_node("churn", _churn)
    builder.add_edge(START, "fill")
    builder.add_edge("fill", "churn")
    builder.add_edge("churn", END)
    config: Any = {"configurable": {"thread_id": "t"}}
    async with CheckpointSaver(JournalStore(tmp_path)) as saver:
        await builder.compile(checkpointer=saver).ainvoke({"n": 0}, config, durability="async")
    async with CheckpointSaver(JournalStore(tmp_path)) as fresh:
        step1 = [t async for t in fresh.alist(config) if t.metadata.get("step") == 1]
    data = step1[0].checkpoint["channel_values"]["data"]
    assert sorted(data) == sorted(f"k{i}" for i in range(300))


_LG_HOLDER = """
import anyio, sys
from checkpointer import JournalStore
from checkpointer.langgraph import CheckpointSaver
from tests.children.adapter_child import CONFIG, langgraph_graph
from langchain_core.messages import HumanMessage
async def main():
    async with CheckpointSaver(JournalStore(sys.argv[1])) as saver:
        await langgraph_graph(saver).ainvoke(
            {"messages": [HumanMessage("holder")]}, CONFIG, durability="sync"
        )
        print("open", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
anyio.run(main)
"""


def _lg_holder(root: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _LG_HOLDER, str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=child_env(),
    )


@pytest.mark.parametrize("durability", ["sync", "async"])
async def test_a_thread_another_process_holds_raises(tmp_path: Path, durability: Any) -> None:
    """Another process holds the thread: the run or the saver's close raises CheckpointFailed."""
    holder = _lg_holder(tmp_path)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "open\n"
        with pytest.raises(CheckpointFailed) as raised:
            async with CheckpointSaver(JournalStore(tmp_path)) as saver:
                await langgraph_graph(saver).ainvoke(
                    {"messages": [HumanMessage("second")]}, CONFIG, durability=durability
                )
        assert raised.value.result.reason == "locked"
        message = str(raised.value)
        assert repr(thread_key(CONFIG["configurable"]["thread_id"])) in message
        assert f"pid {holder.pid}" in message and "lock_timeout=" in message
    finally:
        holder.communicate("\n", timeout=120)
    assert holder.returncode == 0
