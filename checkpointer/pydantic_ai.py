"""pydantic-ai's ``ConversationStore``, kept by checkpointer.

A conversation is one key, ``conversation_key(id)``, written durably at each
save by its writer in the store's ``SessionRegistry`` (held from its first save
until idle, evicted or released); ``checkpoint_run`` keeps a run in flight under
``run_key(id)`` with a ``CheckpointWriter``.  Conflicts, deletes, resuming:
docs/frameworks/pydantic-ai.md.

Past 500 lines on purpose: the store and the run checkpoint call into each
other and share a conversation's two keys, their encoding and its index.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, Literal

import anyio
import anyio.to_thread
import msgspec
import pydantic
import pydantic_core
from pydantic_ai.conversation import Conversation
from pydantic_ai.conversation_store import (
    ConversationConflict,
    ConversationEntry,
    ConversationRecord,
    ConversationStore,
)
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, repair_messages

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
    holding,
    lock_timeout,
    locked,
    raise_failed,
    session_registry,
)
from checkpointer.stores import KeyLocked, Store

__all__ = [
    "CheckpointConversationStore",
    "CheckpointFailed",
    "RunCheckpoint",
    "conversation_key",
    "run_key",
]

logger = logging.getLogger("checkpointer")


def _enc_hook(value: Any) -> Any:
    # What msgspec cannot encode (a tool's BaseModel), as pydantic-ai's own JSON has it.
    try:
        return pydantic_core.to_jsonable_python(value)
    except pydantic_core.PydanticSerializationError as exc:
        raise TypeError(f"cannot encode {type(value).__qualname__}: {exc}") from None


_ENCODER = msgspec.json.Encoder(enc_hook=_enc_hook)


def _unencodable(what: str, exc: Exception, then: str) -> Failed:
    """``Failed("encode-failed")`` for ``what``, logged."""
    failed = Failed("encode-failed", f"{what} cannot be encoded: {exc}; {then}")
    logger.warning("checkpointer: %s", failed.error)
    return failed


_RECORDS: pydantic.TypeAdapter[ConversationRecord] = pydantic.TypeAdapter(ConversationRecord)


def conversation_key(conversation_id: str) -> str:
    """The key of a conversation: ``pa-<id>``, or ``pa.<sha256 prefix>`` for other ids."""
    return framework_key(conversation_id, plain="pa-", hashed="pa.")


def run_key(conversation_id: str) -> str:
    """The key of a conversation's run in flight: ``pr-<id>`` (or ``pr.<digest>``)."""
    return framework_key(conversation_id, plain="pr-", hashed="pr.")


class _Entry(msgspec.Struct):
    id: str
    parent_id: str | None
    message: msgspec.Raw


class _State(msgspec.Struct):
    conversation_id: str
    record: msgspec.Raw
    messages: list[msgspec.Raw]


class _RunState(msgspec.Struct):
    conversation_id: str
    revision: str | None
    base: int
    messages: list[msgspec.Raw]


def _indexed(raw: msgspec.Raw) -> tuple[str, tuple[str | None, bytes, msgspec.Raw]]:
    entry = msgspec.json.decode(raw, type=_Entry)
    return entry.id, (entry.parent_id, bytes(entry.message), raw)


def _decode_messages(raws: Sequence[bytes]) -> list[ModelMessage]:
    """pydantic-ai messages from their JSON, in one call of the framework's adapter."""
    return ModelMessagesTypeAdapter.validate_json(b"[" + b",".join(raws) + b"]")


class _Conversation:
    """A conversation's stored state, as this process last read or wrote it."""

    __slots__ = ("id", "index", "key", "raws", "record", "state")

    def __init__(self, record: ConversationRecord, checkpoint: Checkpoint[_State] | None) -> None:
        self.id = record.conversation_id
        self.key = conversation_key(self.id)
        self.record = record
        # the state's "messages" (encoded entries), and id -> (parent, message JSON, raw)
        self.raws: list[msgspec.Raw] = [] if checkpoint is None else checkpoint.state.messages
        self.index = dict(map(_indexed, self.raws))
        self.state: dict[str, Any] | None = None  # what its writer writes: a save's, here

    def chain(self, head_id: str | None, limit: int | None = None) -> list[tuple[str, str | None]]:
        """``(id, parent)`` from the first entry up to ``head_id``, or its last ``limit``;
        LookupError if an entry on the way is not stored here."""
        out: list[tuple[str, str | None]] = []
        cursor = head_id
        while cursor is not None and (limit is None or len(out) < limit):
            found = self.index.get(cursor)
            if found is None:
                raise LookupError(f"entry {cursor!r} is not stored in conversation {self.id!r}")
            out.append((cursor, found[0]))
            cursor = found[0]
        out.reverse()
        return out


class CheckpointConversationStore(ConversationStore):
    """A pydantic-ai ``ConversationStore`` whose conversations are checkpointer keys.

    Args:
        store: where the conversations go; a ``JournalStore(root)`` makes a
            save that only adds messages an append.
        idle_timeout: seconds a saved conversation's key stays held with no
            save (``SessionRegistry``); then, or when past ``max_open``, it is
            let go and read afresh at its next use.
        max_open: most conversation keys held at once; None: 512, or a quarter
            of the process's ``ulimit -n`` if less.
        **writer_options: for each ``CheckpointWriter`` (the saves' and
            ``checkpoint_run``'s).

    Use it as ``async with``, or call ``aclose()``: closing lets the keys go.
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
        self._options = check_options("CheckpointConversationStore", writer_options)
        for reserved in ("exit_hooks", "write_on_start"):  # a save's first write takes the key
            if reserved in writer_options:
                raise TypeError(f"CheckpointConversationStore sets {reserved!r} itself")
        self._lock = threading.RLock()
        # conversation key -> its write_record/delete_record/release lock and their number now
        self._writing: dict[str, tuple[anyio.Lock, int]] = {}
        # conversation key -> the conversation as its writer holds it (None: absent when read)
        self._open: dict[str, _Conversation | None] = {}
        self._where: dict[str, str] = {}  # entry id -> a conversation id that stores it
        self._saving: dict[str, dict[str, Any] | None] = {}  # key -> its save being written
        self._registry = session_registry(  # the first save takes the key
            self,
            store,
            self._options,
            idle_timeout=idle_timeout,
            max_open=max_open,
            first_write_takes_key=True,
        )

    def __repr__(self) -> str:
        return f"<CheckpointConversationStore store={self.store!r} open={len(self._open)}>"

    def _resume(self, key: str) -> Checkpoint[_State] | None:
        """The registry opens a conversation's key (at a save): read it afresh (blocking)."""
        checkpoint = load(self.store, key, _State)
        conversation = None
        if checkpoint is not None:
            record = _RECORDS.validate_json(bytes(checkpoint.state.record))
            conversation = _Conversation(record, checkpoint)
            self._remember(conversation)
        with self._lock:
            self._open[key] = conversation
        return checkpoint

    def _snapshot(self, key: str) -> Snapshot | None:
        if key in self._saving:
            return Snapshot(key, self._saving[key])
        with self._lock:
            conversation = self._open.get(key)
        state = None if conversation is None else conversation.state
        return None if state is None else Snapshot(key, state)

    def _closed(self, key: str, _result: Result) -> None:
        with self._lock:
            conversation = self._open.pop(key, None)
            if conversation is None:
                return
            for entry_id in conversation.index:  # a conversation let go is read afresh
                if self._where.get(entry_id) == conversation.id:
                    del self._where[entry_id]

    async def __aenter__(self) -> CheckpointConversationStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Let go of every conversation this store saved (after the saves running now)."""
        await self._registry.aclose()

    async def release(self, conversation_id: str) -> None:
        """Let go of the conversation's key (marked not live), so another process may save it."""
        async with self._serial(conversation_id):  # after a save of it running now
            await self._registry.release(conversation_key(conversation_id))

    @contextlib.asynccontextmanager
    async def _serial(self, conversation_id: str) -> AsyncIterator[None]:
        """One save, delete or release of the conversation at a time; other conversations'
        alongside.  Its lock is kept while it has callers only."""
        key = conversation_key(conversation_id)
        lock, callers = self._writing.get(key, (anyio.Lock(), 0))
        self._writing[key] = (lock, callers + 1)
        try:
            async with lock:
                yield
        finally:
            lock, callers = self._writing.pop(key)
            if callers > 1:
                self._writing[key] = (lock, callers - 1)

    # -- reading a conversation -----------------------------------------------

    def _fetch(
        self, conversation_id: str, checkpoint: Checkpoint[_State] | None = None
    ) -> _Conversation | None:
        """The conversation: this process's own while it holds the key, else ``checkpoint``
        (loaded already) or what the store holds."""
        key = conversation_key(conversation_id)
        with self._lock:
            if key in self._open:
                return self._open[key]
        if checkpoint is None:
            checkpoint = load(self.store, conversation_key(conversation_id), _State)
        if checkpoint is None:
            return None
        record = _RECORDS.validate_json(bytes(checkpoint.state.record))
        conversation = _Conversation(record, checkpoint)
        self._remember(conversation)
        return conversation

    def _remember(self, conversation: _Conversation) -> None:
        with self._lock:
            for entry_id in conversation.index:
                self._where[entry_id] = conversation.id

    async def read_record(self, conversation_id: str) -> ConversationRecord | None:
        """The conversation's record (a copy), or None."""
        conversation = await anyio.to_thread.run_sync(self._fetch, conversation_id)
        if conversation is None:
            return None
        return dataclasses.replace(conversation.record, branches=list(conversation.record.branches))

    def _checkpoints(self) -> Iterator[Checkpoint[_State]]:
        """Every conversation as the store holds it."""
        for key in self.store.keys():  # noqa: SIM118 -- a Store, not a mapping
            checkpoint = load(self.store, key, _State) if key.startswith(("pa-", "pa.")) else None
            if checkpoint is not None:
                yield checkpoint

    def _records(self) -> list[ConversationRecord]:
        records: list[ConversationRecord] = []
        for checkpoint in self._checkpoints():
            with self._lock:
                held = self._open.get(conversation_key(checkpoint.state.conversation_id))
            raw = bytes(checkpoint.state.record)
            records.append(_RECORDS.validate_json(raw) if held is None else held.record)
        return records

    async def read_records(
        self, *, scope: str | None = None, limit: int | None = None
    ) -> Sequence[ConversationRecord]:
        """The records, or those of ``scope``, newest ``updated_at`` first, at most ``limit``."""
        records = await anyio.to_thread.run_sync(self._records)
        records = [r for r in records if scope is None or r.scope == scope]
        records.sort(key=lambda record: record.updated_at, reverse=True)
        return [dataclasses.replace(r, branches=list(r.branches)) for r in records[:limit]]

    def _holder(self, entry_id: str) -> _Conversation | None:
        """A conversation that stores ``entry_id``: remembered, else found by reading them all."""
        with self._lock:
            conversation_id = self._where.get(entry_id)
        if conversation_id is not None:
            conversation = self._fetch(conversation_id)
            if conversation is not None and entry_id in conversation.index:
                return conversation
        for checkpoint in self._checkpoints():
            conversation = self._fetch(checkpoint.state.conversation_id, checkpoint)
            if conversation is not None and entry_id in conversation.index:
                return conversation
        return None

    def _history(self, head_id: str | None, limit: int | None) -> list[ConversationEntry]:
        if head_id is None:
            return []
        conversation = self._holder(head_id)
        if conversation is None:
            raise LookupError(f"no stored conversation has entry {head_id!r}")
        chain = conversation.chain(head_id, limit)
        messages = _decode_messages([conversation.index[entry_id][1] for entry_id, _ in chain])
        return [
            ConversationEntry(id=entry_id, parent_id=parent, message=message)
            for (entry_id, parent), message in zip(chain, messages, strict=True)
        ]

    async def read_history(
        self, head_id: str | None, *, limit: int | None = None
    ) -> list[ConversationEntry]:
        """The entries up to ``head_id`` (or its last ``limit``), decoded in one call."""
        return await anyio.to_thread.run_sync(self._history, head_id, limit)

    async def read_entry(self, entry_id: str) -> ConversationEntry:
        """The entry with this id; KeyError if no stored conversation has it."""
        try:
            entries = await anyio.to_thread.run_sync(self._history, entry_id, 1)
        except LookupError:
            raise KeyError(entry_id) from None
        return entries[0]

    # -- writing a conversation -------------------------------------------------

    def _write(
        self,
        record: ConversationRecord,
        new_entries: list[ConversationEntry],
        expected_revision: str | None,
    ) -> _Conversation:
        """The conversation as the save makes it, not yet written (blocking)."""
        conversation_id = record.conversation_id
        current = self._fetch(conversation_id)
        if (None if current is None else current.record.revision) != expected_revision:
            raise ConversationConflict(conversation_id)
        saved = _Conversation(record, None)
        saved.raws, saved.index, record_raw = self._entries(current or saved, record, new_entries)
        saved.state = {
            "conversation_id": conversation_id,
            "record": record_raw,
            "messages": saved.raws,
        }
        return saved

    def _entries(
        self,
        current: _Conversation,
        record: ConversationRecord,
        new_entries: list[ConversationEntry],
    ) -> tuple[list[msgspec.Raw], dict[str, tuple[str | None, bytes, msgspec.Raw]], msgspec.Raw]:
        """The entries and index with ``new_entries`` (and a fork's history), the record encoded."""
        conversation_id = record.conversation_id
        raws = list(current.raws)
        index = dict(current.index)
        new_ids = {entry.id for entry in new_entries}
        for tip in [record.head_id, *record.branches]:
            if tip is None or tip in index or tip in new_ids:
                continue
            # A fork's history (or a branch) in another conversation: copy what it reaches.
            holder = self._holder(tip)
            if holder is None:
                raise ConversationConflict(conversation_id)
            for entry_id, _ in holder.chain(tip):
                if entry_id not in index:
                    index[entry_id] = holder.index[entry_id]
                    raws.append(index[entry_id][2])
        try:
            for entry in new_entries:
                raw = msgspec.Raw(_ENCODER.encode(entry))
                raws.append(raw)
                index[entry.id] = (entry.parent_id, bytes(_ENCODER.encode(entry.message)), raw)
            record_raw = msgspec.Raw(_ENCODER.encode(record))
        except (TypeError, msgspec.EncodeError) as exc:
            then = "pydantic-ai cannot serialise it either (ModelMessagesTypeAdapter.dump_json)"
            failed = _unencodable(f"conversation {conversation_id!r}", exc, then)
            raise CheckpointFailed(failed) from None
        return raws, index, record_raw

    async def _save(
        self,
        record: ConversationRecord,
        new_entries: list[ConversationEntry],
        expected_revision: str | None,
    ) -> None:
        """Write the save durably through the key's writer, which holds the key from then on."""
        key = conversation_key(record.conversation_id)
        async with self._registry.session(key) as writer:
            saved = await anyio.to_thread.run_sync(
                self._write, record, new_entries, expected_revision
            )
            self._saving[key] = saved.state  # readers see it once it is durable
            try:
                result = await writer.write_now()
            finally:
                del self._saving[key]
            if not isinstance(result, Failed):
                with self._lock:
                    self._open[key] = saved
                self._remember(saved)
                return
            with self._lock:
                held = self._open.get(key)
        lost = result.reason in ("conflict", "locked")  # another writer has the key
        if lost or held is None or held.state is None:
            await self._registry.release(key)  # read it afresh next time
        if lost:
            raise ConversationConflict(record.conversation_id) from CheckpointFailed(result)
        raise CheckpointFailed(result)

    async def write_record(
        self,
        record: ConversationRecord,
        *,
        new_entries: Sequence[ConversationEntry] = (),
        expected_revision: str | None,
    ) -> None:
        """Store the record and its new entries durably, if ``expected_revision`` is stored.

        ``ConversationConflict`` too if the record names an entry no
        conversation stores or another writer holds or changed the key.
        """
        async with self._serial(record.conversation_id):
            await self._save(record, list(new_entries), expected_revision)

    def _delete(self, conversation_id: str, expected_revision: str | None) -> None:
        """Delete the conversation's key and its run's, if its record is ``expected_revision``.

        Both keys are locked, so no save or run lands between the check and the deletes.
        """
        keys = (conversation_key(conversation_id), run_key(conversation_id))
        try:
            with holding(self.store, *keys, timeout=lock_timeout(self._options)):
                current = self._fetch(conversation_id)
                if (None if current is None else current.record.revision) != expected_revision:
                    raise ConversationConflict(conversation_id)
                for key in keys:
                    self.store.delete(key)
        except KeyLocked as exc:
            raise locked(exc, f"conversation {conversation_id!r} not deleted") from None
        if current is None:
            return
        with self._lock:
            for entry_id in current.index:
                if self._where.get(entry_id) == conversation_id:
                    del self._where[entry_id]

    async def delete_record(self, conversation_id: str, *, expected_revision: str) -> None:
        """Delete the conversation's key and its run's (every entry it stored goes with it);
        ``CheckpointFailed("locked")`` while another writer holds either."""
        async with self._serial(conversation_id):
            await self._registry.release(conversation_key(conversation_id))
            await anyio.to_thread.run_sync(self._delete, conversation_id, expected_revision)

    async def delete(self, conversation_id: str, *, scope: str | None = None) -> None:
        """The framework's ``delete``; without ``scope``, the run of a conversation never
        saved goes too.  ``CheckpointFailed("locked")`` while another writer holds it."""
        await super().delete(conversation_id, scope=scope)
        if scope is None:
            with contextlib.suppress(ConversationConflict):  # saved again since: not ours
                async with self._serial(conversation_id):
                    await self._registry.release(conversation_key(conversation_id))
                    await anyio.to_thread.run_sync(self._delete, conversation_id, None)

    # -- runs in flight -----------------------------------------------------------

    def checkpoint_run(
        self,
        conversation: Conversation,
        *,
        durability: Literal["async", "sync"] = "async",
    ) -> RunCheckpoint:
        """Checkpoint an ``agent.iter`` run of ``conversation`` under ``run_key``, after each node.

        The run key is written on entry and locked until exit (a second run
        raises ``CheckpointFailed`` on entry); deleted on exit once the
        conversation is saved past the revision the run started from.
        """
        return RunCheckpoint(self, conversation, durability=durability)

    def _run_start(self, conversation: Conversation) -> tuple[int, Checkpoint[Any] | None]:
        """Where a run of ``conversation`` starts (its messages the store has), and its run key now.

        A resumed conversation's messages past that point (a killed run's)
        are the new run's too, so a run killed again keeps both.
        """
        base, revision = conversation.new_message_index, conversation.revision
        if base is None and revision is not None:
            # Not known (serialized since it was loaded): count what its revision stores.
            current = self._fetch(conversation.conversation_id)
            if current is not None and current.record.revision == revision:
                base = len(current.chain(current.record.head_id))
            else:
                base = len(conversation.messages)  # moved on: resume() will not take this run
        run = load(self.store, run_key(conversation.conversation_id), _RunState)
        return base or 0, run

    def _drop_run(self, conversation_id: str, revision: str | None) -> None:
        """Delete the conversation's run key if it holds a run that did not start from ``revision``.

        Such a run is history (``resume`` never takes it).  Under the key's
        lock: a run holding it now is left alone.
        """
        key = run_key(conversation_id)
        with contextlib.suppress(KeyLocked), holding(self.store, key, timeout=0.0):
            run = load(self.store, key, _RunState)
            if run is not None and run.state.revision != revision:
                self.store.delete(key)

    async def resume(
        self, conversation_id: str, *, scope: str | None = None
    ) -> Conversation | None:
        """``load``, plus the messages (repaired) of a run from its revision that never saved."""
        conversation = await self.load(conversation_id, scope=scope)
        run = await anyio.to_thread.run_sync(load, self.store, run_key(conversation_id), _RunState)
        if run is None:
            return conversation
        state: _RunState = run.state
        revision = None if conversation is None else conversation.revision
        stored = [] if conversation is None else conversation.messages
        if state.revision != revision or state.base != len(stored):
            return conversation  # the conversation moved on since: that run is history
        extra = _decode_messages([bytes(raw) for raw in state.messages])
        if conversation is None:
            conversation = Conversation(conversation_id=conversation_id, new_message_index=0)
        conversation.messages[:] = repair_messages([*conversation.messages, *extra])
        return conversation


class RunCheckpoint:
    """Checkpoints the messages of one ``agent.iter`` run; see ``checkpoint_run``."""

    def __init__(
        self,
        conversations: CheckpointConversationStore,
        conversation: Conversation,
        *,
        durability: Literal["async", "sync"],
    ) -> None:
        self._conversations = conversations
        self._conversation = conversation
        self._durability = check_durability(durability)
        self._id = conversation.conversation_id
        self._key = run_key(self._id)
        self._revision = conversation.revision
        self._base = 0  # the conversation's messages the store has: set on entry
        self._messages: list[msgspec.Raw] = []
        self._writer: CheckpointWriter[Snapshot] | None = None
        self._refused = False

    def _source(self) -> Snapshot | None:
        if self._refused:
            return None  # the store refused the run's key: nothing to write at close
        state = _RunState(self._id, self._revision, self._base, self._messages)
        return Snapshot(self._key, state)

    async def __aenter__(self) -> RunCheckpoint:
        """Write the run's key once, which takes its lock for the run; ``CheckpointFailed`` if
        another run holds it (``"locked"``) or wrote it since it was read (``"conflict"``)."""
        conversations = self._conversations
        self._base, stored = await anyio.to_thread.run_sync(
            conversations._run_start, self._conversation
        )
        self.update(self._conversation.messages)  # a resumed run's messages: kept
        writer: CheckpointWriter[Snapshot] = CheckpointWriter(
            self._source, conversations.store, resume_from=stored, **conversations._options
        )
        # Its first write takes the run key's lock (cancelled, it closes as aclose() does).
        await writer.aopen()
        result = writer.statistics().last_result
        # Another run holds its key, or wrote it since it was read: refused for good.
        if isinstance(result, Failed) and result.reason in ("locked", "conflict", "newer-version"):
            self._refused = True  # nothing to write at close
            await writer.aclose()
            raise CheckpointFailed(result)
        self._writer = writer
        return self

    async def __aexit__(self, _type: object, exc: object, _tb: object) -> None:
        """Write a final time; drop the run's key if the conversation was saved since.  A failed
        final write of an unsaved run raises ``CheckpointFailed``, unless the block raised."""
        writer, self._writer = self._writer, None
        if writer is None:
            return
        result = await writer.aclose()
        record = await self._conversations.read_record(self._id)
        revision = None if record is None else record.revision
        if revision != self._revision:
            # Saved (or deleted) since the run began: its messages are history.
            await anyio.to_thread.run_sync(self._conversations._drop_run, self._id, revision)
        elif exc is None:
            raise_failed(result)

    def update(self, run: Any) -> Failed | None:
        """Take the run's messages now (``run.all_messages()``, or a list of messages).

        Returns ``Failed("encode-failed")`` (logged) if a message cannot be
        encoded: the run goes on, its checkpoint keeps the messages taken before.
        """
        messages = run if isinstance(run, list) else run.all_messages()
        try:
            self._messages = [msgspec.Raw(_ENCODER.encode(m)) for m in messages[self._base :]]
        except (TypeError, msgspec.EncodeError) as exc:
            then = f"{self._key!r} keeps the messages checkpointed before"
            return _unencodable(f"the run of conversation {self._id!r}", exc, then)
        if self._writer is not None and self._durability == "async":
            self._writer.notify()
        return None

    async def checkpoint(self, run: Any) -> Failed | None:
        """``update``, then (``durability="sync"``) wait for the durable write.

        Returns ``update``'s ``Failed``, if any; raises ``CheckpointFailed`` if
        a durable write failed.
        """
        failed = self.update(run)
        if failed is not None:
            return failed
        if self._durability == "sync" and self._writer is not None:
            raise_failed(await self._writer.write_now())
        return None

    async def nodes(self, run: Any) -> AsyncIterator[Any]:
        """Iterate ``run``'s nodes, checkpointing its messages after each one."""
        async for node in run:
            await self.checkpoint(run)
            yield node
        await self.checkpoint(run)
