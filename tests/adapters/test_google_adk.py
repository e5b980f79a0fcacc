"""checkpointer.google_adk: ADK's BaseSessionService over checkpointer keys.

Asyncio only: ADK runs on asyncio (its Runner, agents, tools and session
service calls), not on trio, so these tests do not take the trio backend.
The agent's model is an offline ``BaseLlm`` of ours that checks its request
as Gemini's API would (``tests/children/adk_child.py``); the process tests
run that child and kill it, or hold the session from it.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest

pytest.importorskip("google.adk")

from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events import Event, EventActions
from google.adk.sessions import BaseSessionService
from google.adk.sessions.base_session_service import GetSessionConfig
from google.genai import types

from checkpointer import FileStore, JournalStore, load
from checkpointer.google_adk import (
    CheckpointFailed,
    CheckpointSessionService,
    app_key,
    session_key,
    user_key,
)
from tests._support import MANY, MAX_OPEN, ROOT, child_env, cli
from tests.adapters.conftest import serve_many
from tests.children.adk_child import APP, SESSION, USER, gemini_problems, turn

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    """ADK is asyncio-only (see the module docstring)."""
    return "asyncio"


def _event(delta: dict[str, Any] | None = None, **fields: Any) -> Event:
    return Event(
        author="user", invocation_id="inv", actions=EventActions(state_delta=delta or {}), **fields
    )


def _stored(store: JournalStore, key: str) -> Any:
    checkpoint = load(store, key)
    assert checkpoint is not None, key
    return checkpoint.state


async def test_state_scopes_live_in_their_own_keys(tmp_path: Path) -> None:
    """``user:`` state is the user's, ``app:`` the app's, session state the session's;
    ``temp:`` is seen by the caller's session object and stored nowhere."""
    store = JournalStore(tmp_path)
    async with CheckpointSessionService(store) as service:
        assert isinstance(service, BaseSessionService)
        first = await service.create_session(
            app_name=APP, user_id="u1", session_id="s1", state={"k": 1, "user:u": 2, "app:a": 3}
        )
        await service.append_event(first, _event({"temp:t": 4, "k": 5, "user:u": 6}))
        assert first.state == {"k": 5, "user:u": 6, "app:a": 3, "temp:t": 4}
        same_user = await service.create_session(app_name=APP, user_id="u1", session_id="s2")
        other_user = await service.create_session(app_name=APP, user_id="u2", session_id="s1")
        assert same_user.state == {"user:u": 6, "app:a": 3}
        assert other_user.state == {"app:a": 3}
        assert await service.get_user_state(app_name=APP, user_id="u1") == {"u": 6}
    assert _stored(store, user_key(APP, "u1"))["state"] == {"u": 6}
    assert _stored(store, app_key(APP))["state"] == {"a": 3}
    assert _stored(store, session_key(APP, "u1", "s1"))["state"] == {"k": 5}
    assert not any(b"temp:" in path.read_bytes() for path in tmp_path.iterdir())
    async with CheckpointSessionService(JournalStore(tmp_path)) as service:
        again = await service.get_session(app_name=APP, user_id="u1", session_id="s1")
        assert again is not None and again.state == {"k": 5, "user:u": 6, "app:a": 3}


def _contents() -> list[types.Content]:
    call = types.FunctionCall(id="call-7", name="lookup", args={"q": "x", "n": [1, 2.5, None]})
    response = types.FunctionResponse(id="call-7", name="lookup", response={"result": "é\n"})
    image = types.Part.from_bytes(data=bytes(range(256)), mime_type="image/png")
    return [
        types.Content(role="user", parts=[types.Part(text="hi"), image]),
        types.Content(role="model", parts=[types.Part(function_call=call)]),
        types.Content(role="user", parts=[types.Part(function_response=response)]),
        types.Content(role="model", parts=[types.Part(text="done", thought_signature=b"\x00\xff")]),
    ]


async def test_events_round_trip_exactly(tmp_path: Path) -> None:
    """Events with function_call / function_response ids, bytes and deltas come back equal,
    from a new service; on disk each is ADK's own JSON of the event."""
    async with CheckpointSessionService(JournalStore(tmp_path)) as service:
        session = await service.create_session(app_name=APP, user_id=USER, session_id=SESSION)
        for i, content in enumerate(_contents()):
            event = _event({"n": i}, content=content, long_running_tool_ids={"call-7"})
            await service.append_event(session, event)
    async with CheckpointSessionService(JournalStore(tmp_path)) as service:
        again = await service.get_session(app_name=APP, user_id=USER, session_id=SESSION)
    assert again is not None
    assert again.events == session.events
    assert [e.content for e in again.events] == _contents()
    assert not gemini_problems(_contents())
    stored = _stored(JournalStore(tmp_path), session_key(APP, USER, SESSION))["events"]
    assert stored[1]["content"]["parts"][0]["function_call"]["id"] == "call-7"
    assert stored == [e.model_dump(mode="json", exclude_none=True) for e in session.events]


async def test_get_session_config_selects_events(tmp_path: Path) -> None:
    """``num_recent_events`` and ``after_timestamp`` (inclusive) select as ADK's services do."""
    async with CheckpointSessionService(FileStore(tmp_path)) as service:
        session = await service.create_session(app_name=APP, user_id=USER, session_id=SESSION)
        for stamp in (1.0, 2.0, 3.0, 4.0, 5.0):
            await service.append_event(session, _event(timestamp=stamp))

        async def stamps(**config: Any) -> list[float]:
            got = await service.get_session(
                app_name=APP, user_id=USER, session_id=SESSION, config=GetSessionConfig(**config)
            )
            assert got is not None
            return [event.timestamp for event in got.events]

        assert await stamps() == [1.0, 2.0, 3.0, 4.0, 5.0]
        assert await stamps(num_recent_events=0) == []
        assert await stamps(num_recent_events=2) == [4.0, 5.0]
        assert await stamps(after_timestamp=4.0) == [4.0, 5.0]
        assert await stamps(after_timestamp=50.0) == []
        assert await stamps(after_timestamp=2.0, num_recent_events=2) == [4.0, 5.0]


async def test_list_sessions(tmp_path: Path) -> None:
    """Oldest update first, without events, merged state; the user filter; other keys ignored."""
    store = JournalStore(tmp_path)
    from checkpointer import KeyCommitter

    with KeyCommitter(store, "adk.foreign") as other:  # a key of ours by name, not by shape
        other.commit({"messages": []})
    async with CheckpointSessionService(store) as service:
        for user, sid, stamp in (("u1", "b", 30.0), ("u2", "c", 10.0), ("u1", "a", 20.0)):
            s = await service.create_session(app_name=APP, user_id=user, session_id=sid)
            await service.append_event(s, _event({"user:who": user, "app:n": sid}, timestamp=stamp))
        await service.create_session(app_name="other", user_id="u1", session_id="z")
        listed = (await service.list_sessions(app_name=APP)).sessions
        assert [(s.user_id, s.id) for s in listed] == [("u2", "c"), ("u1", "a"), ("u1", "b")]
        assert all(not s.events for s in listed)
        assert listed[0].state == {"user:who": "u2", "app:n": "a"}
        mine = (await service.list_sessions(app_name=APP, user_id="u1")).sessions
        assert [s.id for s in mine] == ["a", "b"]


async def test_create_is_refused_for_a_taken_id(tmp_path: Path) -> None:
    """A second create of an id raises AlreadyExistsError, from this service or a new one."""
    async with CheckpointSessionService(JournalStore(tmp_path)) as service:
        await service.create_session(app_name=APP, user_id=USER, session_id=" s ")
        with pytest.raises(AlreadyExistsError):
            await service.create_session(app_name=APP, user_id=USER, session_id="s")
    async with CheckpointSessionService(JournalStore(tmp_path)) as service:
        with pytest.raises(AlreadyExistsError):
            await service.create_session(app_name=APP, user_id=USER, session_id="s")


async def test_a_stale_copy_is_refused(tmp_path: Path) -> None:
    """Two copies of a session appended at once, eight times: one wins, the other raises
    StaleSessionError; the stored session has exactly the winners."""
    async with CheckpointSessionService(JournalStore(tmp_path)) as service:
        await service.create_session(app_name=APP, user_id=USER, session_id=SESSION)
        for i in range(8):
            latest = await service.get_session(app_name=APP, user_id=USER, session_id=SESSION)
            assert latest is not None
            copies = [latest.model_copy(deep=True) for _ in range(2)]
            results = await asyncio.gather(
                *(service.append_event(c, _event({f"k{i}": n})) for n, c in enumerate(copies)),
                return_exceptions=True,
            )
            assert sum(isinstance(r, StaleSessionError) for r in results) == 1
            assert "modified in storage" in str(
                next(r for r in results if isinstance(r, Exception))
            )
        final = await service.get_session(app_name=APP, user_id=USER, session_id=SESSION)
    assert final is not None and len(final.events) == 8
    assert all((f"k{i}" in final.state) for i in range(8))


async def test_an_event_delivered_again_is_stored_once(tmp_path: Path) -> None:
    """The same event appended twice (a retried call) is stored and applied once."""
    async with CheckpointSessionService(JournalStore(tmp_path)) as service:
        session = await service.create_session(app_name=APP, user_id=USER, session_id=SESSION)
        event = _event({"k": 1})
        await service.append_event(session, event)
        await service.append_event(session, event)
        got = await service.get_session(app_name=APP, user_id=USER, session_id=SESSION)
    assert got is not None and len(got.events) == 1


async def test_each_append_writes_only_the_event(tmp_path: Path) -> None:
    """On a JournalStore an append costs the event's bytes, whatever the history's length."""
    store = JournalStore(tmp_path)
    key = session_key(APP, USER, SESSION)
    async with CheckpointSessionService(store) as service:
        session = await service.create_session(app_name=APP, user_id=USER, session_id=SESSION)
        costs = []
        for i in range(200):
            before = store.statistics().bytes_written
            text = types.Content(role="user", parts=[types.Part(text=f"{i:04d}" + "x" * 500)])
            await service.append_event(session, _event(content=text))
            costs.append(store.statistics().bytes_written - before)
    size = store.statistics(key).size
    assert size is not None and size > 200 * 500
    assert max(costs[150:]) < 1.2 * max(costs[10:20]) < 3_000


async def test_delete_session(tmp_path: Path) -> None:
    """The key goes with its events; user and app state stay; an old copy gets not-found."""
    store = JournalStore(tmp_path)
    async with CheckpointSessionService(store) as service:
        session = await service.create_session(
            app_name=APP, user_id=USER, session_id=SESSION, state={"user:u": 1, "app:a": 2}
        )
        await service.delete_session(app_name=APP, user_id=USER, session_id=SESSION)
        assert await service.get_session(app_name=APP, user_id=USER, session_id=SESSION) is None
        with pytest.raises(SessionNotFoundError):
            await service.append_event(session, _event())
        await service.delete_session(app_name=APP, user_id=USER, session_id="never")
    assert store.keys() == sorted([user_key(APP, USER), app_key(APP)])


def test_keys_of_any_ids() -> None:
    """Plain keys for plain ids; a digest for others, never the same for two id tuples."""
    assert session_key("app", "u-1", "s_2") == "adk-app.u-1.s_2"
    assert session_key("a.b", "c", "d") != session_key("a", "b.c", "d")
    assert session_key("a.b", "c", "d").startswith("adk.")
    assert user_key("app", "u") == "adku-app.u" and app_key("app") == "adka-app"
    with pytest.raises(TypeError, match="debounce"):
        CheckpointSessionService(FileStore("unused"), debounce=1.0)


# -- other processes: a kill inside a tool, a second holder, a delete ----------------


def _child(command: str, root: Path, *n: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.children.adk_child", command, str(root), *n],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=child_env(),
    )


def _told(command: str, root: Path) -> str:
    out, _ = _child(command, root).communicate(timeout=120)
    return out.strip()


async def test_resume_after_sigkill_inside_a_tool(tmp_path: Path) -> None:
    """Killed inside the second turn's tool: a new process gets the first turn, the second's
    message and call, the user and app state, and runs on; temp state is nowhere."""
    with _child("crash", tmp_path) as child:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("in-tool ")
        os.kill(int(line.split()[1]), signal.SIGKILL)
    assert child.returncode == -signal.SIGKILL
    async with CheckpointSessionService(JournalStore(tmp_path)) as service:
        session = await service.get_session(app_name=APP, user_id=USER, session_id=SESSION)
        assert session is not None
        parts = [e.content.parts[0] for e in session.events if e.content and e.content.parts]
        named = [p.function_call or p.function_response for p in parts]
        assert [p.text or (n and n.name) for p, n in zip(parts, named, strict=True)] == [
            "first", "lookup", "lookup", "done: answer:first", "second", "lookup",
        ]  # fmt: skip
        assert parts[5].function_call is not None and parts[5].function_call.id == "call-5"
        assert session.state == {
            "turn_query": "first",
            "user:lookups": 1,
            "app:last_query": "first",
        }
        # ADK drops the call left without its response from the next request: the model takes it.
        events = await turn(service, "third")
        assert events[-1].content is not None and events[-1].content.parts is not None
        assert events[-1].content.parts[0].text == "done: answer:third"
    assert not any(b"temp:" in path.read_bytes() for path in tmp_path.iterdir())


async def test_a_second_process_is_refused(tmp_path: Path) -> None:
    """While one process holds the session, another's append and delete are refused
    ("locked", naming the holder) and store nothing; once it let go, the delete goes."""
    holder = _child("hold", tmp_path)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        appended = _told("append", tmp_path)
        assert appended.startswith("CheckpointFailed") and f"pid {holder.pid}" in appended
        deleted = _told("delete", tmp_path)
        assert deleted.startswith("CheckpointFailed") and "not deleted" in deleted
        async with CheckpointSessionService(JournalStore(tmp_path)) as service:
            read = await service.get_session(app_name=APP, user_id=USER, session_id=SESSION)
            assert read is not None and read.events == []  # reading is fine
            with pytest.raises(CheckpointFailed) as raised:
                await service.append_event(read, _event({"k": 1}))
            assert raised.value.result.reason == "locked"
        assert _stored(JournalStore(tmp_path), session_key(APP, USER, SESSION))["events"] == []
        assert load(JournalStore(tmp_path), user_key(APP, USER)) is None  # nor the user's state
    finally:
        holder.communicate("\n", timeout=120)
    assert _told("delete", tmp_path) == "ok"
    assert JournalStore(tmp_path).keys() == []


async def test_a_create_that_loses_the_race_is_told_the_id_is_taken(tmp_path: Path) -> None:
    """Another writer creates the session (and holds it) between this create's look and its
    commit: AlreadyExistsError, not a lock error, and the other's session stays."""
    from checkpointer import KeyCommitter

    key = session_key(APP, USER, SESSION)
    other = KeyCommitter(JournalStore(tmp_path), key, resume_from=None)

    class Late(JournalStore):
        def read_checkpoint(self, key: str) -> Any:
            found = super().read_checkpoint(key)
            if found is None:  # looked: absent; now the other writer creates it
                other.commit({"app_name": APP, "user_id": USER, "id": SESSION, "events": []})
            return found

    try:
        async with CheckpointSessionService(Late(tmp_path)) as service:
            with pytest.raises(AlreadyExistsError):
                await service.create_session(app_name=APP, user_id=USER, session_id=SESSION)
    finally:
        other.close()
    assert _stored(JournalStore(tmp_path), key)["events"] == []


async def test_a_session_written_by_another_process_is_stale(tmp_path: Path) -> None:
    """Read here, appended to by another process, then appended to here: StaleSessionError,
    and the other process's event stays; deleted by another: SessionNotFoundError."""
    async with CheckpointSessionService(JournalStore(tmp_path)) as service:
        await service.create_session(app_name=APP, user_id=USER, session_id=SESSION)
    async with CheckpointSessionService(JournalStore(tmp_path)) as service:
        read = await service.get_session(app_name=APP, user_id=USER, session_id=SESSION)
        assert read is not None
        assert _told("append", tmp_path) == "ok"
        with pytest.raises(StaleSessionError):
            await service.append_event(read, _event({"mine": 1}))
        again = await service.get_session(app_name=APP, user_id=USER, session_id=SESSION)
        assert again is not None and again.state == {"x": 1, "user:x": 1}
        assert _told("delete", tmp_path) == "ok"
        with pytest.raises(SessionNotFoundError):
            await service.append_event(again, _event({"mine": 1}))
    assert JournalStore(tmp_path).keys() == [user_key(APP, USER)]


async def test_a_resumed_session_runs_on(tmp_path: Path) -> None:
    """Two turns, the service closed; a new service runs a third turn on the stored events."""
    async with CheckpointSessionService(JournalStore(tmp_path)) as service:
        await service.create_session(app_name=APP, user_id=USER, session_id=SESSION)
        for text in ("one", "two"):
            await turn(service, text)
    async with CheckpointSessionService(JournalStore(tmp_path)) as service:
        events = await turn(service, "three")
        assert events[-1].content is not None and events[-1].content.parts is not None
        assert events[-1].content.parts[0].text == "done: answer:three"
        session = await service.get_session(app_name=APP, user_id=USER, session_id=SESSION)
    assert session is not None and len(session.events) == 12
    assert session.state["user:lookups"] == 3


async def test_a_forked_child_does_not_write_its_parents_session(tmp_path: Path) -> None:
    """A child forked while this process holds a session is refused its commit (RuntimeError),
    not told it was stored."""
    async with CheckpointSessionService(JournalStore(tmp_path)) as service:
        await service.create_session(app_name=APP, user_id=USER, session_id=SESSION)
        held = service._held[session_key(APP, USER, SESSION)]
        pid = os.fork()
        if pid == 0:  # the child: no event loop of its own, the commit step itself
            try:
                service._commit(held)
            except RuntimeError as exc:
                os._exit(0 if "forked" in str(exc) else 2)
            os._exit(1)
        _, status = await anyio.to_thread.run_sync(os.waitpid, pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


async def test_verify_and_show_read_the_killed_session_as_gemini(tmp_path: Path) -> None:
    """``verify`` and ``show`` on the store an agent killed inside its tool left: the model's
    turns counted from the events (the gemini dialect), the call the kill left open said as a
    warning (ADK drops it from the next request), no problem."""
    with _child("crash", tmp_path) as child:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("in-tool ")
        os.kill(int(line.split()[1]), signal.SIGKILL)
    verified = cli("verify", tmp_path)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "1 tool call(s) open at the end" in verified.stdout
    assert "unrecognised" not in verified.stdout and "0 bad" in verified.stdout
    shown = cli("show", tmp_path, session_key(APP, USER, SESSION))
    assert shown.returncode == 0, shown.stderr
    events = _stored(JournalStore(tmp_path), session_key(APP, USER, SESSION))["events"]
    turns = sum(e.get("content", {}).get("role") == "model" for e in events)
    assert turns == 3  # two calls and an answer
    assert f"turns            {turns} (assistant messages)" in shown.stdout, shown.stdout
    assert "-> 1 tool call(s): lookup" in shown.stdout.splitlines()[-1]  # stored open


async def test_bytes_per_turn_follow_the_change_across_tool_calls(tmp_path: Path) -> None:
    """A Runner's turns (a prompt, a call, its response, an answer) each append about the
    same bytes at turn 20 as at turn 2 on a ``JournalStore``: no commit rewrites history."""
    path = tmp_path / f"{session_key(APP, USER, SESSION)}.jsonl"
    async with CheckpointSessionService(JournalStore(tmp_path)) as service:
        await service.create_session(app_name=APP, user_id=USER, session_id=SESSION)
        sizes = []
        for n in range(20):
            await turn(service, f"q{n:02d}")
            sizes.append(path.stat().st_size)
    grown = [after - before for before, after in itertools.pairwise(sizes)]
    assert max(grown) < 1.2 * grown[0], grown


# -- a server's many sessions: descriptors, a lock let go ------------------------------


def test_a_server_holds_more_sessions_than_descriptors(shm_root: Path) -> None:
    """``MANY`` sessions created and each given a message by one service in a process limited
    to ``DESCRIPTORS`` (fewer): every session's event is stored."""
    store = serve_many("adk_child", shm_root)
    wrong = []
    for i in range(MANY):
        checkpoint = load(store, session_key(APP, USER, f"s{i}"))
        events = [] if checkpoint is None else checkpoint.state["events"]
        texts = [e["content"]["parts"][0]["text"] for e in events]
        if checkpoint is None or checkpoint.meta.live or texts != [f"q{i}"]:
            wrong.append(i)
    assert wrong == []


def test_a_session_let_go_then_written_elsewhere_is_stale_then_read_afresh(
    tmp_path: Path,
) -> None:
    """Past the process's bound a session's lock is let go; another process appends to it;
    the first one's next turn is refused (``StaleSessionError``), never stored over it, and
    the turn after builds on what the other wrote."""
    server = _child("let-go", tmp_path, str(MAX_OPEN + 8))
    try:
        assert server.stdout is not None and server.stdin is not None
        assert server.stdout.readline() == "let-go\n"
        assert _told("append", tmp_path) == "ok"
        key = session_key(APP, USER, SESSION)
        theirs = JournalStore(tmp_path).revision(key)
        server.stdin.write("go\n")
        server.stdin.flush()
        assert server.stdout.readline() == "StaleSessionError\n"
        assert JournalStore(tmp_path).revision(key) == theirs
        assert server.stdout.readline() == "saved\n"
        server.communicate(timeout=120)
    finally:
        server.kill()
    assert server.returncode == 0
    events = _stored(JournalStore(tmp_path), key)["events"]
    said = [e.get("content", {}).get("parts", [{}])[0].get("text") for e in events]
    assert said[:4] == ["first", None, None, "done: answer:first"]
    assert "actions" in events[4] and said[5:] == ["third", None, None, "done: answer:third"]
