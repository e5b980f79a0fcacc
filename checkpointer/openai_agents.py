"""The OpenAI Agents SDK's ``Session``, kept by the writers of a ``SessionRegistry``.

A ``CheckpointSessions`` (one per store, or per server) holds the items of
the keys open in its registry; a ``CheckpointSession`` is a handle on one key,
whose calls each take the key's writer for their duration.  Alone,
``async with CheckpointSession(id, store)`` is a handle over a registry of
its own.  Durability, resuming, ownership: docs/frameworks/openai-agents.md.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, Literal

import anyio
import anyio.lowlevel
import anyio.to_thread
import msgspec

from checkpointer import (
    Checkpoint,
    CheckpointFailed,
    CheckpointWriter,
    Failed,
    Result,
    Snapshot,
    Transcript,
    load,
)
from checkpointer._adapters import (
    check_durability,
    check_options,
    framework_key,
    probe_lock,
    raise_failed,
    session_registry,
)
from checkpointer.messages import HistoryProblem, close_dangling_tool_calls, validate_history
from checkpointer.stores import Store

if TYPE_CHECKING:
    from agents.items import TResponseInputItem
    from agents.memory import SessionSettings

__all__ = ["CheckpointFailed", "CheckpointSession", "CheckpointSessions", "session_key"]


def session_key(session_id: str) -> str:
    """The checkpoint key of a session: its id, or ``session-<sha256 prefix>`` for other ids."""
    return framework_key(session_id, plain="", hashed="session-")


_DECODER = msgspec.json.Decoder()
_ENCODER = msgspec.json.Encoder()


_BATCH = 1024  # items decoded per call: the GIL is let go between batches


def _stored(items: Sequence[Any]) -> list[msgspec.Raw]:
    """Each item as its JSON bytes: what the session keeps.

    Bytes nobody can edit: the store's check that the stored prefix is
    unchanged is then one pointer comparison per item, never an encode.
    """
    encode = _ENCODER.encode
    try:
        return [msgspec.Raw(encode(item)) for item in items]
    except (TypeError, msgspec.EncodeError) as exc:
        raise TypeError(f"session items must be JSON values (Responses-API dicts): {exc}") from exc


def _decoded(stored: Sequence[msgspec.Raw]) -> list[Any]:
    """Fresh items (dicts) of ``stored``, a batch at a time."""
    items: list[Any] = []
    for at in range(0, len(stored), _BATCH):
        items += _DECODER.decode(b"[" + b",".join(stored[at : at + _BATCH]) + b"]")
    return items


def _latest(held: list[msgspec.Raw], limit: int | None) -> list[list[Any]]:
    """The latest ``limit`` items of ``held`` decoded (in a worker thread), in a box to empty.

    The slice is one step under the GIL: a call on the loop that changes the
    items comes wholly before it or after it.  The box: the worker thread
    keeps what it returned until its next job, and the last reference to a
    100,000-item list would then free it there, holding the GIL (some 20 ms)
    in the middle of another call; emptied on the loop, the caller frees it.
    """
    return [_decoded(held[:] if limit is None else held[-limit:])]


class _State(msgspec.Struct):
    session_id: str
    messages: list[Any]


class _Held:
    """A key's session while its writer is open: what ``resume`` loaded, and the changes since."""

    def __init__(self, session_id: str, checkpoint: Checkpoint[Any] | None, checks: bool) -> None:
        self.session_id = session_id
        self.checks = checks  # refuse items a model API would reject (a transcript= given)
        self.checkpoint = checkpoint  # None: a new session
        self.items: list[msgspec.Raw] = []  # items are never edited: added, popped, replaced
        # (type, call_id) -> the output close_dangling_tool_calls made up on load:
        # shown by get_items, never stored, dropped when the real one arrives.
        self.synthetic: dict[tuple[Any, Any], msgspec.Raw] = {}
        self.repaired = 0  # tool calls closed on load
        self.open_calls: list[Any] | None = []  # the stored calls not answered; None: not known
        if checkpoint is not None:
            loaded = checkpoint.state.messages
            stored = {id(item) for item in loaded}
            items, self.repaired = close_dangling_tool_calls(loaded)
            self.items = _stored(items)
            self.synthetic = {  # the outputs the repair made up: not among those stored
                (item["type"], item["call_id"]): kept
                for item, kept in zip(items, self.items, strict=True)
                if id(item) not in stored
            }
            if checks:
                self.open_calls = _open_calls(loaded, validate_history(loaded))

    async def check(self, items: list[Any]) -> None:
        """Raise ``CheckpointFailed("not-sendable")`` if ``items`` would make the stored history
        one a model API refuses: checked with the calls still open, not the whole history."""
        if not self.checks:
            return
        if self.open_calls is None:  # after a pop: read once from the stored items
            self.open_calls = await anyio.to_thread.run_sync(_calls_open_in, self.stored())
        window = [*self.open_calls, *items]
        problems = validate_history(window)
        start = len(self.open_calls)
        refused = [p for p in problems if p.kind in ("orphan-result", "duplicate-id")]
        if refused:
            shown = "; ".join(f"item {p.index - start}: {p.detail}" for p in refused[:3])
            error = (
                f"add_items refused: a model API would reject the history of session "
                f"{self.session_id!r} with these items: {shown}"
            )
            raise CheckpointFailed(Failed("not-sendable", error))
        self.open_calls = _open_calls(window, problems)

    def stored(self) -> list[msgspec.Raw]:
        if not self.synthetic:
            return self.items
        made_up = {id(item) for item in self.synthetic.values()}
        return [item for item in self.items if id(item) not in made_up]


def _open_calls(window: Sequence[Any], problems: Sequence[HistoryProblem]) -> list[Any]:
    """The items of ``window`` holding calls no later item answers."""
    return [window[at] for at in sorted({p.index for p in problems if p.kind == "unclosed-call"})]


def _calls_open_in(stored: Sequence[msgspec.Raw]) -> list[Any]:
    items = _decoded(stored)
    return _open_calls(items, validate_history(items))


# The session id of the call that opens a key: ``resume(key)`` runs in that call's task.
_OPENING: contextvars.ContextVar[str] = contextvars.ContextVar("checkpointer_openai_session")


class CheckpointSessions:
    """The Agents SDK sessions of a server: one ``SessionRegistry`` over ``store``.

    ``CheckpointSession(session_id, sessions)`` is a session used without
    ``async with``: each call holds the key's writer for its duration; the
    registry opens the key at its first use (loading it afresh), closes it
    after ``idle_timeout`` unused or past ``max_open``, and flushes them all
    at exit.  ``sessions.registry`` gives ``statistics()`` and ``release(key)``.

    Args:
        store: where the sessions go.
        idle_timeout: seconds a session's key stays open with no call.
        max_open: most keys open at once (one descriptor each on a ``FileStore``); None:
            512, or a quarter of the process's ``ulimit -n`` if less.
        **writer_options: for each ``CheckpointWriter``; a ``transcript=``
            (with ``repair``) makes ``add_items`` refuse items a model API
            would reject (checked on the new items and the calls still open).
    """

    def __init__(
        self,
        store: Store,
        *,
        idle_timeout: float = 300.0,
        max_open: int | None = None,
        **writer_options: Any,
    ) -> None:
        self.store = store
        self.options = check_options("CheckpointSessions", writer_options)
        transcript: Transcript | None = self.options.pop("transcript", None)
        self._checks = transcript is not None and transcript.repair
        self._held: dict[str, _Held] = {}
        self.registry = session_registry(
            self, store, self.options, idle_timeout=idle_timeout, max_open=max_open
        )

    async def __aenter__(self) -> CheckpointSessions:
        await self.registry.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every open session (its final write, then its lock)."""
        await self.registry.aclose()

    def _resume(self, key: str) -> Checkpoint[Any] | None:
        checkpoint = load(self.store, key, _State)
        self._held[key] = _Held(_OPENING.get(), checkpoint, self._checks)
        return checkpoint

    def _snapshot(self, key: str) -> Snapshot | None:
        held = self._held.get(key)
        if held is None:
            return None
        return Snapshot(key, {"session_id": held.session_id, "messages": held.stored()})

    def _closed(self, key: str, _result: Result) -> None:
        self._held.pop(key, None)

    @contextlib.asynccontextmanager
    async def _use(
        self, key: str, session_id: str
    ) -> AsyncIterator[tuple[_Held, CheckpointWriter[Snapshot]]]:
        token = _OPENING.set(session_id)
        try:
            async with self.registry.session(key) as writer:
                yield self._held[key], writer
        finally:
            _OPENING.reset(token)


class CheckpointSession:
    """An Agents SDK ``Session`` whose items are checkpointed by a ``CheckpointWriter``.

    Args:
        session_id: the SDK's session id; the key is ``session_key(session_id)``
            unless ``key`` is given.
        store: where the checkpoint goes (use the session as ``async with``),
            or a server's ``CheckpointSessions`` (no ``async with``).
        session_settings: the SDK's ``SessionSettings``, or None.
        durability: ``"async"`` (default): a change is a ``notify()``,
            written per the writer's timing rules; ``"sync"``: each change
            waits for its durable write.
        key: the checkpoint key, instead of one derived from the id.
        **writer_options: passed to ``CheckpointWriter`` (with a ``Store``).
    """

    def __init__(
        self,
        session_id: str,
        store: Store | CheckpointSessions,
        *,
        session_settings: SessionSettings | None = None,
        durability: Literal["async", "sync"] = "async",
        key: str | None = None,
        **writer_options: Any,
    ) -> None:
        self._durability = check_durability(durability)
        self.session_id = session_id
        self.session_settings = session_settings
        self.key = session_key(session_id) if key is None else key
        self._options = check_options("CheckpointSession", writer_options)
        # A store: a registry of the session's own, made at 'async with'.
        self._sessions = store if isinstance(store, CheckpointSessions) else None
        self._own = self._sessions is None
        self._store: Store = store.store if isinstance(store, CheckpointSessions) else store
        if not self._own and writer_options:
            raise TypeError("the writer options of a CheckpointSessions' session go to it")
        self._store.validate_key(self.key)
        self._writer: CheckpointWriter[Snapshot] | None = None  # its own registry's, if open
        self.repaired = 0  # tool calls closed on load
        self.resumed_from: Checkpoint[Any] | None = None  # None: a new session

    def __repr__(self) -> str:
        return f"<CheckpointSession {self.session_id!r} key={self.key!r}>"

    @property
    def writer(self) -> CheckpointWriter[Snapshot]:
        """The session's writer while it is open (for ``statistics()`` or ``write_now()``)."""
        if self._writer is None:
            raise RuntimeError(
                f"CheckpointSession {self.session_id!r} has no writer open: use 'async with' "
                "first (a CheckpointSessions' session: its registry's session(key) block)"
            )
        return self._writer

    async def __aenter__(self) -> CheckpointSession:
        if self._sessions is not None:
            what = "open already" if self._own else "a CheckpointSessions' session"
            raise RuntimeError(f"CheckpointSession {self.session_id!r} is {what}: no 'async with'")
        way_out = f"or open session {self.session_id!r} under another key (key=)"
        await anyio.to_thread.run_sync(probe_lock, self._store, self.key, self._options, way_out)
        # One key, never idle: its writer stays open (session.writer) until aclose.
        sessions = CheckpointSessions(
            self._store, idle_timeout=math.inf, max_open=1, **self._options
        )
        try:
            async with self._use(sessions) as (_held, writer):
                self._writer = writer
        except BaseException:
            await sessions.aclose()
            raise
        self._sessions = sessions
        return self

    async def __aexit__(self, _type: object, exc: object, _tb: object) -> None:
        result = await self.aclose()
        if exc is None:
            raise_failed(result)

    async def aclose(self) -> Result | None:
        """Write a final time and close the key's writer; its result (None if not open)."""
        sessions = self._sessions
        if sessions is None:
            return None
        if self._own:
            self._sessions = self._writer = None
        result = await sessions.registry.release(self.key)
        if self._own:
            await sessions.aclose()
        return result

    @contextlib.asynccontextmanager
    async def _use(
        self, sessions: CheckpointSessions | None = None
    ) -> AsyncIterator[tuple[_Held, CheckpointWriter[Snapshot]]]:
        """The key's items and writer for one call; never kept past it."""
        sessions = sessions or self._sessions
        if sessions is None:
            raise RuntimeError(
                f"CheckpointSession {self.session_id!r} is not open: use 'async with' first"
            )
        async with sessions._use(self.key, self.session_id) as (held, writer):
            self.repaired, self.resumed_from = held.repaired, held.checkpoint
            yield held, writer

    async def _changed(self, writer: CheckpointWriter[Snapshot]) -> None:
        if self._durability == "async":
            last = writer.statistics().last_result
            if isinstance(last, Failed) and last.reason == "conflict":
                raise CheckpointFailed(last)  # refused for good: no later change is stored either
            writer.notify()
            # Let the loop in, as a session that writes in a thread does: the SDK's work
            # before this call and after it are two stalls, not one.
            await anyio.lowlevel.checkpoint()
            return
        raise_failed(await writer.write_now())

    # -- the Session protocol ---------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """Copies of the latest ``limit`` items (or ``session_settings.limit``), oldest first.

        Copied and decoded in a worker thread: a long history does not hold the event loop.
        """
        async with self._use() as (held, writer):
            if writer.statistics().writes == 0:  # the key is not held yet: is it as loaded?
                await anyio.to_thread.run_sync(self._check_as_loaded, held)
            if limit is None and self.session_settings is not None:
                limit = self.session_settings.limit
            if limit is not None and limit <= 0:
                return []
            items = held.items
        box = await anyio.to_thread.run_sync(_latest, items, limit)
        return box.pop()

    def _check_as_loaded(self, held: _Held) -> None:
        """Raise if another writer wrote (or deleted) the key since this session loaded it:
        its writes would be refused, better said before the agent runs on stale items."""
        store = self._store
        loaded = None if held.checkpoint is None else held.checkpoint.meta.revision
        stored = store.revision(self.key)
        if stored != loaded:
            what = "deleted" if stored is None else "written by another writer"
            error = (
                f"session {self.session_id!r} (key {self.key!r}, {store.location(self.key)}) "
                f"was {what} since this session loaded it; it cannot be written from here: "
                "open the session again"
            )
            raise CheckpointFailed(Failed("conflict", error))

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append copies of the items (TypeError if one is not a JSON value), then checkpoint."""
        async with self._use() as (held, writer):
            if not items:
                return
            stored = _stored(items)
            new = _decoded(stored) if held.synthetic or held.checks else []
            await held.check(new)
            for item in new if held.synthetic else ():  # a real output replaces a made-up one
                if isinstance(item, dict):
                    made_up = held.synthetic.pop((item.get("type"), item.get("call_id")), None)
                    if made_up is not None:
                        held.items = [old for old in held.items if old is not made_up]
            held.items.extend(stored)
            await self._changed(writer)

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the latest item, or None when the session is empty."""
        async with self._use() as (held, writer):
            if not held.items:
                return None
            item = held.items.pop()
            if held.synthetic:
                held.synthetic = {k: v for k, v in held.synthetic.items() if v is not item}
            held.open_calls = None  # its call may be open again: read at the next add
            await self._changed(writer)
        return _DECODER.decode(item)  # type: ignore[no-any-return]

    async def clear_session(self) -> None:
        """Remove every item; the checkpoint keeps the key with an empty history."""
        async with self._use() as (held, writer):
            held.items, held.synthetic, held.open_calls = [], {}, []
            await self._changed(writer)
