"""Google ADK's ``BaseSessionService``, kept by checkpointer.

A session is one key, ``session_key(app, user, id)``: its state and its
events, committed durably by the session's ``KeyCommitter`` before
``append_event`` returns (on a ``JournalStore``, an append of the event).
``user:`` and ``app:`` state live in keys of their own, read and rewritten
under the key's lock at each change; ``temp:`` state is never stored.
Ownership, resuming, what a kill loses: docs/frameworks/google-adk.md.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from typing import Any

import anyio
import anyio.to_thread
import msgspec
import pydantic_core
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session
from google.adk.sessions.state import State

from checkpointer import (
    Checkpoint,
    CheckpointError,
    CheckpointFailed,
    Failed,
    KeyCommitter,
    Skipped,
    Transcript,
    load,
)
from checkpointer._adapters import (
    HELD,
    check_committer_options,
    framework_key,
    holding,
    lock_timeout,
    locked,
    probe_lock,
)
from checkpointer.stores import KeyLocked, Store

__all__ = [
    "CheckpointFailed",
    "CheckpointSessionService",
    "app_key",
    "session_key",
    "user_key",
]

logger = logging.getLogger("checkpointer")

_PART = re.compile(r"[A-Za-z0-9_-]+")
_TRIES = 8  # read-modify-write rounds of a user or app key lost to other processes


def _ident(*parts: str) -> str:
    # Dotted when no part has a dot (so no two tuples share one); else JSON, which no key spells.
    return ".".join(parts) if all(_PART.fullmatch(part) for part in parts) else json.dumps(parts)


def session_key(app_name: str, user_id: str, session_id: str) -> str:
    """The key of a session: ``adk-<app>.<user>.<id>``, or ``adk.<sha256 prefix>``."""
    return framework_key(_ident(app_name, user_id, session_id), plain="adk-", hashed="adk.")


def user_key(app_name: str, user_id: str) -> str:
    """The key of a user's ``user:`` state: ``adku-<app>.<user>``, or ``adku.<digest>``."""
    return framework_key(_ident(app_name, user_id), plain="adku-", hashed="adku.")


def app_key(app_name: str) -> str:
    """The key of an app's ``app:`` state: ``adka-<app>``, or ``adka.<digest>``."""
    return framework_key(_ident(app_name), plain="adka-", hashed="adka.")


class _Head(msgspec.Struct):
    """A stored session without its events (what ``list_sessions`` reads)."""

    app_name: str
    user_id: str
    id: str
    created: str  # a nonce of this session's creation: a re-created one is another
    last_update_time: float
    state: dict[str, Any]


class _Stored(_Head):
    events: list[msgspec.Raw]  # each event as ADK's JSON (snake_case, no None)


class _Scoped(msgspec.Struct):
    app_name: str
    user_id: str | None  # None: the app's key
    state: dict[str, Any]


class _Stamp(msgspec.Struct):
    id: str
    timestamp: float


def _json_safe(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` as JSON values, as ADK's database service stores it (lossy, with a warning)."""
    try:
        return pydantic_core.to_jsonable_python(state)  # type: ignore[no-any-return]
    except pydantic_core.PydanticSerializationError:
        logger.warning("checkpointer: ADK state values not JSON-serialisable are stored as repr()")
        return pydantic_core.to_jsonable_python(state, fallback=repr)  # type: ignore[no-any-return]


def _split(state: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The (app, user, session) parts of a state or delta, prefixes removed, ``temp:`` dropped."""
    parts: dict[str, dict[str, Any]] = {State.APP_PREFIX: {}, State.USER_PREFIX: {}, "": {}}
    for name, value in _json_safe(state or {}).items():
        if not name.startswith(State.TEMP_PREFIX):
            prefix = next((p for p in parts if name.startswith(p)), "")
            parts[prefix][name.removeprefix(prefix)] = value
    return parts[State.APP_PREFIX], parts[State.USER_PREFIX], parts[""]


def _merged(own: dict[str, Any], app: dict[str, Any], user: dict[str, Any]) -> dict[str, Any]:
    """A copy of a session's own state with the app's and the user's, prefixed."""
    state: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(own))
    state.update({State.APP_PREFIX + name: value for name, value in app.items()})
    state.update({State.USER_PREFIX + name: value for name, value in user.items()})
    return state


class _Held:
    """A session as this process last read or wrote it."""

    __slots__ = ("checkpoint", "committer", "key", "lock", "stamps", "stored")

    def __init__(self, key: str, stored: _Stored, checkpoint: Checkpoint[_Stored] | None) -> None:
        self.key = key
        self.stored = stored
        self.checkpoint = checkpoint  # what its first commit expects stored (None: absent)
        self.stamps = [msgspec.json.decode(raw, type=_Stamp) for raw in stored.events]
        self.committer: KeyCommitter | None = None  # holds the key from its first commit
        self.lock = anyio.Lock()  # one append at a time: parallel agents share a session

    @property
    def marker(self) -> str:
        """What a ``Session`` read now carries; an older copy's differs (stale)."""
        last = self.stamps[-1].id if self.stamps else ""
        return f"{self.stored.created}:{len(self.stamps)}:{last}"

    def session(
        self, config: GetSessionConfig | None, app: dict[str, Any], user: dict[str, Any]
    ) -> Session:
        """A ``Session`` of copies, with the events ``config`` selects and the scoped state."""
        first = 0
        count = len(self.stamps)
        if config is not None and config.num_recent_events is not None:
            first = max(count - config.num_recent_events, 0)
        if config is not None and config.after_timestamp is not None:
            # After the last event older than the timestamp, as ADK's in-memory service.
            older = [
                i for i in range(first, count) if self.stamps[i].timestamp < config.after_timestamp
            ]
            first = older[-1] + 1 if older else first
        stored = self.stored
        session = Session(
            app_name=stored.app_name,
            user_id=stored.user_id,
            id=stored.id,
            state=_merged(stored.state, app, user),
            events=[Event.model_validate_json(bytes(raw)) for raw in stored.events[first:]],
            last_update_time=stored.last_update_time,
        )
        session._storage_update_marker = self.marker
        return session


class CheckpointSessionService(BaseSessionService):
    """An ADK ``BaseSessionService`` whose sessions, user and app state are checkpointer keys.

    Args:
        store: where the sessions go; a ``JournalStore(root)`` makes each
            ``append_event`` an append of that event.
        **writer_options: ``transcript`` (default ``Transcript("events",
            repair=False)``), ``state_version`` and ``limits`` (its
            ``lock_timeout``: how long a commit waits for another process's
            hold on a key) of the keys' ``KeyCommitter``s.

    A session's key is held by this process from its first ``append_event``
    (or ``create_session``) until ``release``, ``delete_session`` or
    ``aclose``: use the service as ``async with``, or call ``aclose()``.
    asyncio only, as ADK.
    """

    def __init__(self, store: Store, **writer_options: Any) -> None:
        why = "it commits each event durably when ADK appends it"
        check_committer_options("CheckpointSessionService", writer_options, why)
        self.store = store
        self._template: Transcript = writer_options.get(
            "transcript", Transcript("events", repair=False)
        )
        self._scoped_options = {k: v for k, v in writer_options.items() if k != "transcript"}
        self._held: dict[str, _Held] = {}  # sessions read or written here, by key

    def __repr__(self) -> str:
        holding_ = sum(held.committer is not None for held in self._held.values())
        return f"<CheckpointSessionService store={self.store!r} holding={holding_}>"

    async def __aenter__(self) -> CheckpointSessionService:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Let go of every session this service holds (``release``)."""
        for held in list(self._held.values()):
            await self._release(held.key)

    async def release(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Let go of the session's key (marked not live), so another process may write it."""
        await self._release(session_key(app_name, user_id, session_id.strip()))

    async def _release(self, key: str) -> None:
        held = self._held.pop(key, None)
        if held is not None and held.committer is not None:
            async with held.lock:  # after an append running now
                await held.committer.aclose()
                HELD.forget(held.committer)

    # -- reading ------------------------------------------------------------------

    def _scoped(self, key: str) -> dict[str, Any]:
        checkpoint = load(self.store, key, _Scoped)
        return {} if checkpoint is None else checkpoint.state.state

    def _load(self, key: str, held: _Held | None) -> _Held | None:
        """``held`` if this process holds the key or the store has what it read; else read it."""
        if held is not None and (
            held.committer is not None
            or self.store.revision(key) == (held.checkpoint and held.checkpoint.meta.revision)
        ):
            return held
        checkpoint = load(self.store, key, _Stored)
        return None if checkpoint is None else _Held(key, checkpoint.state, checkpoint)

    async def _fetch(self, key: str) -> _Held | None:
        held = self._held.get(key)
        fresh = await anyio.to_thread.run_sync(self._load, key, held)
        if fresh is not held:
            if held is not None:
                self._held.pop(key, None)
            if fresh is not None:
                self._held[key] = fresh
        return fresh

    async def _view(self, held: _Held, config: GetSessionConfig | None = None) -> Session:
        stored = held.stored
        app = await anyio.to_thread.run_sync(self._scoped, app_key(stored.app_name))
        user = await anyio.to_thread.run_sync(
            self._scoped, user_key(stored.app_name, stored.user_id)
        )
        return held.session(config, app, user)

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        """A copy of the session with the events ``config`` selects, or None."""
        held = await self._fetch(session_key(app_name, user_id, session_id.strip()))
        return None if held is None else await self._view(held, config)

    def _heads(self, app_name: str, user_id: str | None) -> list[_Head]:
        prefix = "adk-" + _ident(app_name) + "." if _PART.fullmatch(app_name) else "adk-\0"
        heads: list[_Head] = []
        for key in self.store.keys():  # noqa: SIM118 -- a Store, not a mapping
            if not key.startswith((prefix, "adk.")):
                continue
            held = self._held.get(key)
            head: _Head | None = None if held is None else held.stored
            if head is None:
                try:
                    checkpoint = load(self.store, key, _Head)
                except CheckpointError as exc:  # another adapter's key, or damaged: not listed
                    logger.warning("checkpointer: %s is not an ADK session: %s", key, exc)
                    continue
                head = None if checkpoint is None else checkpoint.state
            if head is not None and head.app_name == app_name and user_id in (None, head.user_id):
                heads.append(head)
        return heads

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        """The app's sessions (or the user's), without events, oldest update first."""
        heads = await anyio.to_thread.run_sync(self._heads, app_name, user_id)
        app = await anyio.to_thread.run_sync(self._scoped, app_key(app_name))
        users: dict[str, dict[str, Any]] = {}
        sessions = []
        for head in sorted(heads, key=lambda h: (h.last_update_time, h.user_id, h.id)):
            if head.user_id not in users:
                key = user_key(app_name, head.user_id)
                users[head.user_id] = await anyio.to_thread.run_sync(self._scoped, key)
            state = _merged(head.state, app, users[head.user_id])
            sessions.append(
                Session(
                    app_name=app_name,
                    user_id=head.user_id,
                    id=head.id,
                    state=state,
                    last_update_time=head.last_update_time,
                )
            )
        return ListSessionsResponse(sessions=sessions)

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """The user's ``user:`` state, prefixes removed (a copy; empty if none)."""
        return await anyio.to_thread.run_sync(self._scoped, user_key(app_name, user_id))

    # -- writing ------------------------------------------------------------------

    def _update_scoped(self, app_name: str, user_id: str | None, delta: dict[str, Any]) -> None:
        """Merge ``delta`` into the user's (or, ``user_id=None``, the app's) key: read, then
        a commit fenced on what was read, again if another process wrote in between."""
        key = app_key(app_name) if user_id is None else user_key(app_name, user_id)
        for _ in range(_TRIES):
            checkpoint = load(self.store, key, _Scoped)
            state = {} if checkpoint is None else checkpoint.state.state
            merged = _Scoped(app_name, user_id, {**state, **delta})
            with KeyCommitter(self.store, key, resume_from=checkpoint, **self._scoped_options) as c:
                result = c.commit(merged, live=False)  # not live: the key is let go at once
            if not (isinstance(result, Failed) and result.reason == "conflict"):
                break
        if isinstance(result, Failed):
            raise CheckpointFailed(result)

    async def _scope(
        self, app_name: str, user_id: str, app: dict[str, Any], user: dict[str, Any]
    ) -> None:
        if app:
            await anyio.to_thread.run_sync(self._update_scoped, app_name, None, app)
        if user:
            await anyio.to_thread.run_sync(self._update_scoped, app_name, user_id, user)

    def _commit(self, held: _Held) -> None:
        """Commit ``held.stored`` durably; its committer holds the key from then on."""
        opened = held.committer is None
        if held.committer is None:
            t = self._template  # a transcript of its own per session: it keeps a cache
            transcript = Transcript(t.field, repair=t.repair, fingerprint=t.fingerprint)
            held.committer = KeyCommitter(
                self.store,
                held.key,
                resume_from=held.checkpoint,
                transcript=transcript,
                **self._scoped_options,
            )
        result = held.committer.commit(held.stored)
        HELD.used(held.committer)  # past the process's bound, the least recently used lets go
        if isinstance(result, Skipped) and result.reason == "closed":
            raise RuntimeError(
                f"session {held.stored.id!r} is held by the process that forked this one: "
                "open a CheckpointSessionService in the child"
            )
        if not isinstance(result, Failed):
            return
        if opened or result.reason in ("conflict", "locked"):  # read it afresh next time
            held.committer.close()
            HELD.forget(held.committer)
            held.committer = None
            self._held.pop(held.key, None)
        if result.reason != "conflict":
            raise CheckpointFailed(result)
        if self.store.revision(held.key) is None:
            raise SessionNotFoundError(f"session {held.stored.id!r} was deleted by another process")
        raise StaleSessionError(
            f"session {held.stored.id!r} has been modified in storage by another process since "
            f"it was loaded ({result.error}); get the session again"
        ) from CheckpointFailed(result)

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        """Store a new session durably (its ``app:`` and ``user:`` state in their keys);
        ``AlreadyExistsError`` if the id is taken."""
        session_id = (session_id or "").strip() or str(uuid.uuid4())
        key = session_key(app_name, user_id, session_id)
        if await self._fetch(key) is not None:
            raise AlreadyExistsError(f"Session with id {session_id} already exists.")
        app, user, own = _split(state)
        await self._scope(app_name, user_id, app, user)
        stored = _Stored(app_name, user_id, session_id, uuid.uuid4().hex, time.time(), own, [])
        held = self._held[key] = _Held(key, stored, None)
        try:
            async with held.lock:
                await anyio.to_thread.run_sync(self._commit, held)
        except (StaleSessionError, CheckpointFailed) as exc:
            if isinstance(exc, CheckpointFailed) and exc.result.reason != "locked":
                raise
            # Another process created it in between, or holds it while it does.
            raise AlreadyExistsError(f"Session with id {session_id} already exists.") from exc
        return await self._view(held)

    async def append_event(self, session: Session, event: Event) -> Event:
        """Store the event durably, its state delta applied (``temp:`` kept in ``session`` only).

        ``StaleSessionError`` if ``session`` is an older copy than the one
        stored (get it again); ``CheckpointFailed`` (``"locked"``) while
        another process holds the session.
        """
        if event.partial:
            return event
        held = await self._fetch(session_key(session.app_name, session.user_id, session.id))
        if held is None:
            raise SessionNotFoundError(f"Session {session.id} not found.")
        async with held.lock:
            self._check_current(session, held)
            self._apply_temp_state(session, event)
            event = self._trim_temp_delta_state(event)
            raw = msgspec.Raw(event.model_dump_json(exclude_none=True).encode())
            stamp = _Stamp(event.id, event.timestamp)
            if any(s.id == stamp.id for s in held.stamps) and raw in held.stored.events:
                return event  # delivered again: stored once, applied once
            if held.committer is None:  # refused before the user's or app's state is written
                way_out = "get the session again once that process has let go of it"
                await anyio.to_thread.run_sync(
                    probe_lock, self.store, held.key, self._scoped_options, way_out
                )
            app, user, own = _split(event.actions.state_delta if event.actions else None)
            await self._scope(session.app_name, session.user_id, app, user)
            stored = held.stored
            before = (stored.state, stored.last_update_time)
            stored.state = {**stored.state, **own}
            stored.last_update_time = event.timestamp
            stored.events.append(raw)
            held.stamps.append(stamp)
            try:
                await anyio.to_thread.run_sync(self._commit, held)
            except BaseException:
                stored.state, stored.last_update_time = before
                del stored.events[-1], held.stamps[-1]
                raise
            session.last_update_time = event.timestamp
            session._storage_update_marker = held.marker
        return self._commit_event_to_session(session, event)

    @staticmethod
    def _check_current(session: Session, held: _Held) -> None:
        """Raise ``StaleSessionError`` if ``session`` is older than what is stored."""
        marker = session._storage_update_marker
        if marker is None:  # a Session made by hand: its last event must be the last stored
            last = session.events[-1].id if session.events else ""
            current = last == (held.stamps[-1].id if held.stamps else "")
        else:
            current = marker == held.marker
        if not current:
            raise StaleSessionError(
                f"session {session.id!r} has been modified in storage since this copy was "
                "loaded: get the session again before appending"
            )

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Delete the session's key (its events with it); ``CheckpointFailed("locked")`` while
        another process holds it.  The user's and app's state stay."""
        key = session_key(app_name, user_id, session_id.strip())
        await self._release(key)

        def delete() -> None:
            try:
                with holding(self.store, key, timeout=lock_timeout(self._scoped_options)):
                    self.store.delete(key)
            except KeyLocked as exc:
                raise locked(exc, f"session {session_id!r} not deleted") from None

        await anyio.to_thread.run_sync(delete)
