"""Strands' ``SessionManager``, kept by a ``KeyCommitter``: one key per session.

An Agent's messages, state, conversation-manager state, interrupt and model
state (Strands' own ``take_snapshot(preset="session")``) are the key's state;
each message the agent adds and each invocation's end is a durable commit.
Durability, resuming, ownership: docs/frameworks/strands.md.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

from strands.hooks import (
    AfterInvocationEvent,
    AgentInitializedEvent,
    MessageAddedEvent,
    MultiAgentInitializedEvent,
)
from strands.session import SessionManager
from strands.types._snapshot import SNAPSHOT_SCHEMA_VERSION, Snapshot
from strands.types.exceptions import SessionException
from strands.types.session import decode_bytes_values, encode_bytes_values

from checkpointer import (
    Checkpoint,
    CheckpointFailed,
    KeyCommitter,
    Result,
    Skipped,
    Transcript,
    load,
)
from checkpointer._adapters import (
    HELD,
    check_committer_options,
    framework_key,
    locked,
    probe_lock,
    raise_failed,
)
from checkpointer.stores import KeyLocked, Store

if TYPE_CHECKING:
    from strands.hooks import HookRegistry
    from strands.types.agent import LocalAgent
    from strands.types.content import Message

__all__ = ["CheckpointFailed", "CheckpointSessionManager", "session_key"]


def session_key(session_id: str) -> str:
    """The checkpoint key of a session: its id, or ``session-<sha256 prefix>`` for other ids."""
    return framework_key(session_id, plain="", hashed="session-")


class CheckpointSessionManager(SessionManager):
    """A Strands ``SessionManager`` whose session is one checkpointer key.

    Constructing it loads nothing: the Agent it is given to restores itself
    from the key when it is built (``initialize``), checks that no other
    process holds the key, and commits at once, which takes the key's lock
    until ``close()``.  One Agent per manager.

    Args:
        session_id: Strands' session id; the key is ``session_key(session_id)``
            unless ``key`` is given.
        store: where the checkpoint goes; a ``JournalStore`` appends new messages.
        key: the checkpoint key, instead of one derived from the id.
        **writer_options: ``transcript`` (default ``Transcript("messages", repair=False)``:
            stored as Strands wrote it, which closes a dangling call itself on resume),
            ``state_version`` and ``limits`` (its ``lock_timeout``), as a
            ``KeyCommitter`` takes them: Strands says when to save.
    """

    def __init__(
        self, session_id: str, store: Store, *, key: str | None = None, **writer_options: Any
    ) -> None:
        why = "Strands says when to save (each message, each invocation)"
        options = check_committer_options("CheckpointSessionManager", writer_options, why)
        options.setdefault("transcript", Transcript("messages", repair=False))
        self.session_id = session_id
        self.key = session_key(session_id) if key is None else key
        store.validate_key(self.key)
        self._store = store
        self._options = options
        self._lock = threading.Lock()  # one agent per manager: initialize once
        self._agent_id: str | None = None
        self._committer: KeyCommitter | None = None
        self._closed = False
        self._pid = os.getpid()
        self.resumed_from: Checkpoint[Any] | None = None  # None: a new session

    def __repr__(self) -> str:
        agent = self._agent_id
        return f"<CheckpointSessionManager {self.session_id!r} key={self.key!r} agent={agent!r}>"

    def __enter__(self) -> CheckpointSessionManager:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Mark the checkpoint not live and let the key go; later saves raise ``RuntimeError``."""
        with self._lock:
            self._closed = True
            committer, self._committer = self._committer, None
        if committer is not None:
            committer.close()
            HELD.forget(committer)

    def delete(self) -> None:
        """Let the key go and delete the session's checkpoint (fenced).

        Raises:
            CheckpointFailed: ``"locked"``, naming the holder, while another
                writer (another process, another manager) holds the key.
        """
        self.close()
        try:
            self._store.delete(self.key)
        except KeyLocked as exc:
            raise locked(exc, "close the session there first") from None

    # -- the SessionManager protocol --------------------------------------------

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        """Restore at the agent's initialization; save after each message and each invocation.

        A Graph or Swarm built with it raises Strands' ``NotImplementedError``: not kept.
        """
        registry.add_callback(AgentInitializedEvent, lambda event: self.initialize(event.agent))
        registry.add_callback(MessageAddedEvent, self._on_change)
        registry.add_callback(AfterInvocationEvent, self._on_change)
        registry.add_callback(
            MultiAgentInitializedEvent, lambda event: self.initialize_multi_agent(event.source)
        )

    async def _on_change(self, event: MessageAddedEvent | AfterInvocationEvent) -> None:
        # Captured on the agent's loop (copies), committed in a worker thread.
        committer, state = self._capture(event.agent)
        self._check(committer, await committer.acommit(state))

    def initialize(self, agent: LocalAgent, **kwargs: Any) -> None:
        """Restore ``agent`` from the key (if stored) and take the key for this process.

        Raises:
            SessionException: a second agent, or an agent whose ``agent_id`` is
                not the one stored.
            CheckpointFailed: ``"locked"`` (another process holds the key) or
                the first commit's ``Failed`` (``"conflict"``: written or
                deleted by another writer since it was loaded).
        """
        with self._lock:
            if self._closed:
                raise SessionException(
                    f"CheckpointSessionManager {self.session_id!r} is closed (or was refused): "
                    "give the agent a new manager"
                )
            if self._agent_id is not None:
                raise SessionException(
                    f"CheckpointSessionManager {self.session_id!r} keeps one agent "
                    f"({self._agent_id!r}): give agent {agent.agent_id!r} a manager of its own"
                )
            self._agent_id = agent.agent_id
        try:
            checkpoint = self.resumed_from = load(self._store, self.key)
            way_out = f"or open session {self.session_id!r} under another key (key=)"
            probe_lock(self._store, self.key, self._options, way_out)
            if checkpoint is not None:
                self._restore(agent, checkpoint.state)
            self._committer = KeyCommitter(
                self._store, self.key, resume_from=checkpoint, **self._options
            )
            self._pid = os.getpid()
            self.sync_agent(agent)
        except BaseException:
            self.close()  # refused: nothing held, and the manager takes no other agent
            raise

    def _restore(self, agent: LocalAgent, state: Any) -> None:
        stored = state.get("agent_id") if isinstance(state, dict) else None
        if stored != agent.agent_id:
            raise SessionException(
                f"session {self.session_id!r} (key {self.key!r}) holds agent {stored!r}, "
                f"not {agent.agent_id!r}: give the agent that id, or use another session"
            )
        data = decode_bytes_values({k: v for k, v in state.items() if k != "agent_id"})
        agent.load_snapshot(Snapshot("agent", SNAPSHOT_SCHEMA_VERSION, data, {}))
        model = getattr(agent, "model", None)
        if getattr(model, "stateful", False):  # the server keeps the history: as Strands does
            agent.messages = []

    def _capture(self, agent: LocalAgent) -> tuple[KeyCommitter, dict[str, Any]]:
        with self._lock:
            committer = self._committer
        if committer is None:
            raise RuntimeError(
                f"CheckpointSessionManager {self.session_id!r} is "
                f"{'closed' if self._closed else 'not initialized'}: this change is not saved"
            )
        data = agent.take_snapshot(preset="session").data
        return committer, {"agent_id": agent.agent_id, **encode_bytes_values(data)}

    def sync_agent(self, agent: LocalAgent, **kwargs: Any) -> None:
        """Commit the agent now (blocking): Strands calls it after trimming to fit the context."""
        committer, state = self._capture(agent)
        self._check(committer, committer.commit(state))

    def _check(self, committer: KeyCommitter, result: Result) -> None:
        """Raise for a ``Failed``, and for a commit skipped as closed: a forked child's copy
        of the manager (its parent holds the key) stores nothing."""
        HELD.used(committer)  # past the process's bound, the least recently used lets go
        raise_failed(result)
        if isinstance(result, Skipped) and result.reason == "closed":
            raise RuntimeError(
                f"CheckpointSessionManager {self.session_id!r} belongs to process "
                f"{self._pid} (this is a forked child, or it was closed): this change is not saved"
            )

    def append_message(self, message: Message, agent: LocalAgent, **kwargs: Any) -> None:
        """Nothing: the ``MessageAddedEvent`` hook commits the whole agent."""

    def redact_latest_message(
        self, redact_message: Message, agent: LocalAgent, **kwargs: Any
    ) -> None:
        """Commit now: the agent has redacted its latest message in place already."""
        self.sync_agent(agent)
