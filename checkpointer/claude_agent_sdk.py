"""The Claude Agent SDK's ``SessionStore``, each transcript kept by a ``CheckpointWriter``.

The SDK mirrors the CLI's JSONL transcript to ``append`` and resumes from
``load``; each session key is a checkpointer key holding the entries as a
transcript.  Durability, resuming, ownership: docs/frameworks/claude-agent-sdk.md.
"""

from __future__ import annotations

import hashlib
import re
import time
from typing import TYPE_CHECKING, Any, Literal

import anyio.to_thread
import msgspec
from claude_agent_sdk import fold_session_summary
from claude_agent_sdk.types import SessionStore

from checkpointer import (
    Checkpoint,
    CheckpointFailed,
    CheckpointWriter,
    Failed,
    Meta,
    Result,
    Snapshot,
    Transcript,
    load,
)
from checkpointer._adapters import (
    check_durability,
    check_options,
    locked,
    probe_lock,
    session_registry,
)
from checkpointer.stores import KeyLocked, Store

if TYPE_CHECKING:
    from claude_agent_sdk.types import (
        SessionKey,
        SessionListSubkeysKey,
        SessionStoreEntry,
        SessionStoreListEntry,
        SessionSummaryEntry,
    )

__all__ = ["CheckpointFailed", "CheckpointSessionStore", "session_key"]

_PLAIN = re.compile(r"[A-Za-z0-9-][A-Za-z0-9_-]*")


def _part(text: str, limit: int = 64) -> str:
    # Parts are joined with ".", so a part never holds one; a digest starts with "_",
    # which no plain part does, so no text's plain part is another's digest.
    if len(text) <= limit and _PLAIN.fullmatch(text) is not None:
        return text
    return "_" + hashlib.sha256(text.encode()).hexdigest()[:32]


def session_key(key: SessionKey) -> str:
    """The checkpoint key of an SDK session key: ``project.session[.subpath parts]``.

    A part is itself if it is letters, digits, ``-`` or ``_`` (not starting
    with ``_``) and short enough (a project 120 characters, a session 40,
    each subpath part 64), else ``_`` and a digest; a subpath's ``/``
    becomes ``.`` (a subpath too long for a key is one digest).  A
    session's subkeys start with its key and ``.``.
    """
    main = f"{_part(key['project_key'], 120)}.{_part(key['session_id'], 40)}"
    subpath = key.get("subpath")
    if subpath is None:
        return main
    sub = ".".join(map(_part, subpath.split("/")))
    return f"{main}.{sub}" if len(main) + len(sub) < 200 else f"{main}.{_part(subpath)}"


class _Ident(msgspec.Struct):
    """What a listing reads of a state (the entries are skipped, not built)."""

    project_key: str
    session_id: str
    subpath: str | None = None
    summary: dict[str, Any] | None = None  # the SDK's fold of a main transcript, opaque


class _State(msgspec.Struct):
    project_key: str
    session_id: str
    subpath: str | None
    summary: dict[str, Any] | None
    messages: list[Any]


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder()


def _copy(entries: Any) -> list[Any]:
    try:
        return _DECODER.decode(_ENCODER.encode(entries))  # type: ignore[no-any-return]
    except (TypeError, msgspec.EncodeError) as exc:
        raise TypeError(f"session entries must be JSON values: {exc}") from exc


class _Session:
    """One transcript open here: its entries, their uuids, its writer."""

    def __init__(self, key: str, ident: SessionKey, checkpoint: Checkpoint[_State] | None) -> None:
        self.key = key
        self.sdk_key: SessionKey = {
            "project_key": ident["project_key"],
            "session_id": ident["session_id"],
        }
        self.ident = _Ident(ident["project_key"], ident["session_id"], ident.get("subpath"))
        self.messages: list[Any] = [] if checkpoint is None else checkpoint.state.messages
        self.uuids = {e["uuid"] for e in self.messages if isinstance(e, dict) and "uuid" in e}
        self.ident.summary = None if checkpoint is None else checkpoint.state.summary
        self.mtime = 0  # of the last append, in ms: what listings show while it is open here
        self.writer: CheckpointWriter[Snapshot] | None = None

    def source(self) -> Snapshot:
        i = self.ident
        state = _State(i.project_key, i.session_id, i.subpath, i.summary, self.messages)
        return Snapshot(self.key, state)

    def add(self, entries: list[Any]) -> None:
        """Append the entries whose ``uuid`` is new (the SDK retries a failed batch)."""
        added = []
        for entry in entries:
            uuid = entry.get("uuid") if isinstance(entry, dict) else None
            if isinstance(uuid, str):
                if uuid in self.uuids:
                    continue
                self.uuids.add(uuid)
            added.append(entry)
        self.messages += added
        self.mtime = int(time.time() * 1000)
        if self.ident.subpath is None:  # a subagent's transcript is not the session's summary
            ident = self.ident
            prev = None if ident.summary is None else _summary(ident, 0)
            ident.summary = fold_session_summary(prev, self.sdk_key, added)["data"]


def _summary(ident: _Ident, mtime: int) -> SessionSummaryEntry:
    return {"session_id": ident.session_id, "mtime": mtime, "data": ident.summary or {}}


class CheckpointSessionStore(SessionStore):
    """A Claude Agent SDK ``SessionStore`` whose transcripts are checkpointer keys.

    Each session's writer is the store's ``SessionRegistry``'s: the first
    ``append`` of a session not open here loads it (fenced on what ``load``
    returned before, if it did), refuses it while another process holds it
    (``CheckpointFailed("locked")``), and its first write takes the key; the
    writer holds it until ``idle_timeout`` passes without an append, more
    than ``max_open`` are open, ``release`` or ``aclose``.  A session let go
    is read afresh at its next append.  With ``durability="async"`` an
    append is durable once the writer has written it (within ``max_wait``,
    5 s; at once on release, exit or SIGTERM); with ``"sync"`` when
    ``append`` returns.  The CLI's own transcript is never fsynced.

    Args:
        store: where the transcripts go; a ``JournalStore(root)`` makes each
            write an append of the new entries.
        durability: ``"async"`` (default): an append is a ``notify()``;
            ``"sync"``: it waits for its durable write.
        idle_timeout: seconds a session's key stays held with no append.
        max_open: most sessions held at once (a descriptor each on a file store); None:
            512, or a quarter of the process's ``ulimit -n`` if less.
        **writer_options: for each session's ``CheckpointWriter``; ``transcript``
            defaults to ``Transcript("messages", repair=False)``: the entries as
            the CLI wrote them (it closes a dangling call itself on resume).

    Use it as ``async with``, or call ``aclose()``.
    """

    def __init__(
        self,
        store: Store,
        *,
        durability: Literal["async", "sync"] = "async",
        idle_timeout: float = 300.0,
        max_open: int | None = None,
        **writer_options: Any,
    ) -> None:
        self.store = store
        self._durability = check_durability(durability)
        options = check_options("CheckpointSessionStore", writer_options)
        options.setdefault("transcript", Transcript("messages", repair=False))
        self._options = options
        self._open: dict[str, _Session] = {}  # the sessions whose writer is open
        self._resumed: dict[str, Checkpoint[_State] | None] = {}  # read, its session not made
        self._loaded: dict[str, Meta | None] = {}  # what load() saw: the fence of a first append
        self._failed: list[Failed] = []  # final writes that failed, for aclose
        self._registry = session_registry(  # the first append's write takes the key
            self,
            store,
            options,
            idle_timeout=idle_timeout,
            max_open=max_open,
            first_write_takes_key=True,
        )

    def __repr__(self) -> str:
        return f"<CheckpointSessionStore store={self.store!r} open={len(self._open)}>"

    async def __aenter__(self) -> CheckpointSessionStore:
        return self

    async def __aexit__(self, _type: object, exc: object, _tb: object) -> None:
        failed = await self.aclose()
        if exc is None and failed:
            raise CheckpointFailed(failed[0])

    async def aclose(self) -> list[Failed]:
        """Write each open session a final time and let its key go; the final writes that
        failed (those of sessions let go before too)."""
        await self._registry.aclose()
        failed, self._failed = self._failed, []
        return failed

    async def release(self, key: SessionKey) -> Failed | None:
        """Write the session a final time and let its key go (another process may take it)."""
        result = await self._registry.release(session_key(key))
        if isinstance(result, Failed):
            self._failed.remove(result)
            return result
        return None

    def _resume(self, key: str) -> Meta | None:
        """The registry opens a session (blocking): read it; refuse it if another holds it."""
        checkpoint = load(self.store, key, _State)
        way_out = "or mirror the session to another store"
        probe_lock(self.store, key, self._options, way_out)
        self._resumed[key] = checkpoint
        return self._loaded.pop(key, None if checkpoint is None else checkpoint.meta)

    def _snapshot(self, key: str) -> Snapshot | None:
        session = self._open.get(key)
        return None if session is None else session.source()

    def _closed(self, key: str, result: Result) -> None:
        self._open.pop(key, None)
        self._resumed.pop(key, None)
        if isinstance(result, Failed):
            self._failed.append(result)

    # -- the SessionStore protocol ----------------------------------------------

    async def append(self, key: SessionKey, entries: list[SessionStoreEntry]) -> None:
        """Append copies of the entries (an entry whose ``uuid`` is stored already is skipped).

        Raises ``CheckpointFailed``: ``"locked"`` while another process holds
        the session; ``"conflict"`` once it was written or deleted by another
        since this process loaded it; with ``"sync"``, any failed write.  The
        SDK logs it, retries, then reports a ``MirrorErrorMessage``.
        """
        if not entries:
            return
        copied = _copy(entries)
        name = session_key(key)
        async with self._registry.session(name) as writer:
            session = self._open.get(name)
            first = session is None  # its write takes the key, as the session opens
            if session is None:
                session = self._open[name] = _Session(name, key, self._resumed.pop(name))
            session.add(copied)
            result: Result | None
            if self._durability == "sync" or first:
                result = await writer.write_now()
            else:
                result = writer.statistics().last_result
                writer.notify()
        if isinstance(result, Failed):
            if result.reason in ("locked", "conflict"):  # another's: read it afresh next time
                self._open.pop(name, None)  # so its final write writes nothing
                await self._registry.release(name)
            if self._durability == "sync" or result.reason in ("locked", "conflict"):
                raise CheckpointFailed(result)

    async def load(self, key: SessionKey) -> list[SessionStoreEntry] | None:
        """Copies of the session's entries (this process's own while it holds it), or None."""
        name = session_key(key)
        session = self._open.get(name)
        if session is not None:
            return _copy(session.messages)
        checkpoint = await anyio.to_thread.run_sync(load, self.store, name, _State)
        self._loaded[name] = None if checkpoint is None else checkpoint.meta
        return None if checkpoint is None else checkpoint.state.messages

    async def _idents(self, prefix: str) -> list[tuple[_Ident, int]]:
        """The transcripts under keys starting with ``prefix``, with their mtimes (ms):
        this process's own while open here, else as stored."""
        held = {name: (s.ident, s.mtime) for name, s in self._open.items()}

        def read() -> list[tuple[_Ident, int]]:
            found = []
            for name in self.store.keys():  # noqa: SIM118 -- a Store, not a mapping
                if name.startswith(prefix):
                    checkpoint = None if name in held else load(self.store, name, _Ident)
                    if checkpoint is not None:
                        stamp = int(checkpoint.meta.updated_at.timestamp() * 1000)
                        found.append((checkpoint.state, stamp))
            return found

        own = [found for name, found in held.items() if name.startswith(prefix)]
        return own + await anyio.to_thread.run_sync(read)

    async def _mains(self, project_key: str) -> list[tuple[_Ident, int]]:
        found = await self._idents(_part(project_key, 120) + ".")
        return [
            (ident, mtime)
            for ident, mtime in found
            if ident.project_key == project_key and ident.subpath is None
        ]

    async def list_sessions(self, project_key: str) -> list[SessionStoreListEntry]:
        """The project's sessions (not their subagents') with their last write times."""
        return [
            {"session_id": i.session_id, "mtime": mtime}
            for i, mtime in await self._mains(project_key)
        ]

    async def list_session_summaries(self, project_key: str) -> list[SessionSummaryEntry]:
        """The project's sessions' summaries (the SDK's ``fold_session_summary``, kept in
        each session's state), stamped as ``list_sessions`` stamps them."""
        return [_summary(i, mtime) for i, mtime in await self._mains(project_key) if i.summary]

    async def list_subkeys(self, key: SessionListSubkeysKey) -> list[str]:
        """The subpaths stored under the session (its subagents' transcripts)."""
        main: SessionKey = {"project_key": key["project_key"], "session_id": key["session_id"]}
        found = await self._idents(session_key(main) + ".")
        return [
            ident.subpath
            for ident, _ in found
            if ident.subpath is not None
            and (ident.project_key, ident.session_id) == (key["project_key"], key["session_id"])
        ]

    async def delete(self, key: SessionKey) -> None:
        """Delete the session's key (and, for a main transcript, its subkeys).

        A session open here is written a final time and let go first.
        ``CheckpointFailed("locked")`` while another process holds one of
        the keys (those before it are deleted).
        """
        name = session_key(key)
        names = [name]
        if key.get("subpath") is None:
            names += [
                n
                for n in await anyio.to_thread.run_sync(self.store.keys)
                if n.startswith(name + ".")
            ]
        for each in names:
            await self._registry.release(each)
            self._loaded.pop(each, None)
            try:
                await anyio.to_thread.run_sync(self.store.delete, each)
            except KeyLocked as exc:
                raise locked(exc, f"session {key['session_id']!r} not deleted") from None
