"""The OpenAI Agents SDK's ``Session``, kept by a ``CheckpointWriter``.

Entering loads the stored items and opens the writer; leaving writes a final
time.  Durability, resuming, ownership: docs/frameworks/openai-agents.md.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    load,
)
from checkpointer._adapters import (
    check_durability,
    check_options,
    framework_key,
    probe_lock,
    raise_failed,
)
from checkpointer.messages import close_dangling_tool_calls
from checkpointer.stores import Store

if TYPE_CHECKING:
    from agents.items import TResponseInputItem
    from agents.memory import SessionSettings

__all__ = ["CheckpointFailed", "CheckpointSession", "session_key"]


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


class _State(msgspec.Struct):
    session_id: str
    messages: list[Any]


class CheckpointSession:
    """An Agents SDK ``Session`` whose items are checkpointed by a ``CheckpointWriter``.

    Args:
        session_id: the SDK's session id; the key is ``session_key(session_id)``
            unless ``key`` is given.
        store: where the checkpoint goes.
        session_settings: the SDK's ``SessionSettings``, or None.
        durability: ``"async"`` (default): a change is a ``notify()``,
            written per the writer's timing rules; ``"sync"``: each change
            waits for its durable write.
        key: the checkpoint key, instead of one derived from the id.
        **writer_options: passed to ``CheckpointWriter``.
    """

    def __init__(
        self,
        session_id: str,
        store: Store,
        *,
        session_settings: SessionSettings | None = None,
        durability: Literal["async", "sync"] = "async",
        key: str | None = None,
        **writer_options: Any,
    ) -> None:
        self._durability = check_durability(durability)
        self._options = check_options("CheckpointSession", writer_options)
        self.session_id = session_id
        self.session_settings = session_settings
        self.key = session_key(session_id) if key is None else key
        self._store = store
        store.validate_key(self.key)
        self._items: list[msgspec.Raw] = []  # never edited in place: added to, popped, replaced
        # (type, call_id) -> the output close_dangling_tool_calls made up on load:
        # shown by get_items, never stored, dropped when the real one arrives.
        self._synthetic: dict[tuple[Any, Any], Any] = {}
        self._writer: CheckpointWriter[Snapshot] | None = None
        self.repaired = 0  # tool calls closed on load
        self.resumed_from: Checkpoint[Any] | None = None  # None: a new session

    def __repr__(self) -> str:
        return f"<CheckpointSession {self.session_id!r} key={self.key!r} items={len(self._items)}>"

    def _source(self) -> Snapshot:
        items = self._items
        if self._synthetic:
            made_up = {id(item) for item in self._synthetic.values()}
            items = [item for item in items if id(item) not in made_up]
        return Snapshot(self.key, {"session_id": self.session_id, "messages": items})

    @property
    def writer(self) -> CheckpointWriter[Snapshot]:
        """The session's writer (for ``statistics()`` or ``write_now()``)."""
        if self._writer is None:
            raise RuntimeError(
                f"CheckpointSession {self.session_id!r} is not open: use 'async with' first"
            )
        return self._writer

    async def __aenter__(self) -> CheckpointSession:
        if self._writer is not None:
            raise RuntimeError(f"CheckpointSession {self.session_id!r} is open already")
        checkpoint = await anyio.to_thread.run_sync(self._load)
        way_out = f"or open session {self.session_id!r} under another key (key=)"
        await anyio.to_thread.run_sync(probe_lock, self._store, self.key, self._options, way_out)
        writer = CheckpointWriter(
            self._source, self._store, resume_from=checkpoint, **self._options
        )
        self._writer = await writer.aopen()
        return self

    def _load(self) -> Checkpoint[Any] | None:
        checkpoint = self.resumed_from = load(self._store, self.key, _State)
        if checkpoint is not None:
            loaded = checkpoint.state.messages
            stored = {id(item) for item in loaded}
            items, self.repaired = close_dangling_tool_calls(loaded)
            self._items = _stored(items)
            self._synthetic = {  # the outputs the repair made up: not among those stored
                (item["type"], item["call_id"]): kept
                for item, kept in zip(items, self._items, strict=True)
                if id(item) not in stored
            }
        return checkpoint

    async def __aexit__(self, _type: object, exc: object, _tb: object) -> None:
        result = await self.aclose()
        if exc is None:
            raise_failed(result)

    async def aclose(self) -> Result | None:
        """Write a final time and close the writer; its result (None if not open)."""
        writer, self._writer = self._writer, None
        if writer is None:
            return None
        return await writer.aclose()

    async def _changed(self) -> None:
        writer = self.writer
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

        Decoded in a worker thread: a long history does not hold the event loop.
        """
        if self.writer.statistics().writes == 0:  # the key is not held yet: is it as loaded?
            await anyio.to_thread.run_sync(self._check_as_loaded)
        if limit is None and self.session_settings is not None:
            limit = self.session_settings.limit
        if limit is not None and limit <= 0:
            return []
        items = self._items[:] if limit is None else self._items[-limit:]
        return await anyio.to_thread.run_sync(_decoded, items)

    def _check_as_loaded(self) -> None:
        """Raise if another writer wrote (or deleted) the key since this session loaded it:
        its writes would be refused, better said before the agent runs on stale items."""
        loaded = None if self.resumed_from is None else self.resumed_from.meta.revision
        stored = self._store.revision(self.key)
        if stored != loaded:
            what = "deleted" if stored is None else "written by another writer"
            error = (
                f"session {self.session_id!r} (key {self.key!r}, {self._store.location(self.key)}) "
                f"was {what} since this session loaded it; it cannot be written from here: "
                "open the session again"
            )
            raise CheckpointFailed(Failed("conflict", error))

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append copies of the items (TypeError if one is not a JSON value), then checkpoint."""
        self.writer  # noqa: B018
        if not items:
            return
        stored = _stored(items)
        for item in _decoded(stored) if self._synthetic else ():  # a real output replaces
            if isinstance(item, dict):  # a made-up one
                made_up = self._synthetic.pop((item.get("type"), item.get("call_id")), None)
                if made_up is not None:
                    self._items = [old for old in self._items if old is not made_up]
        self._items.extend(stored)
        await self._changed()

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the latest item, or None when the session is empty."""
        self.writer  # noqa: B018
        if not self._items:
            return None
        item = self._items.pop()
        if self._synthetic:
            self._synthetic = {k: v for k, v in self._synthetic.items() if v is not item}
        await self._changed()
        return _DECODER.decode(item)  # type: ignore[no-any-return]

    async def clear_session(self) -> None:
        """Remove every item; the checkpoint keeps the key with an empty history."""
        self.writer  # noqa: B018
        self._items = []
        self._synthetic = {}
        await self._changed()
