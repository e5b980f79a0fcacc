"""What staging one appended message costs a journal, counted, not timed.

The work that could grow with the history is a message compared by value
(its ``__eq__``) or encoded.  Staging one appended message must do neither
for the messages already written, however many there are: the check that
they are unchanged compares pointers (a C list ``==``, identity first) or,
for messages whose equals may encode otherwise, identities.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from checkpointer import CheckpointWriter, JournalStore, Snapshot, Written, load

EQ_CALLS = [0]


class Text(msgspec.Struct, frozen=True):
    """A settled message of strings that counts its value comparisons."""

    role: str
    content: str

    def __eq__(self, other: object) -> bool:
        EQ_CALLS[0] += 1
        return isinstance(other, Text) and (self.role, self.content) == (other.role, other.content)

    __hash__ = None  # type: ignore[assignment]


class Numbered(msgspec.Struct, frozen=True):
    """A settled message with an int: an equal one (n=2.0) may encode otherwise."""

    role: str
    n: int


def _message(kind: str, i: int) -> Any:
    return Text("user", f"message {i}") if kind == "text" else Numbered("user", i)


async def _append_and_count(
    writer: CheckpointWriter[Snapshot], store: JournalStore, messages: list[Any], kind: str
) -> tuple[int, int]:
    """Append one message and write it: (value comparisons, messages encoded)."""
    messages.append(_message(kind, len(messages)))
    EQ_CALLS[0] = 0
    misses = store._transcript.misses
    assert isinstance(await writer.write_now(), Written)
    return EQ_CALLS[0], store._transcript.misses - misses


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["text", "numbers"])
@pytest.mark.parametrize("n", [100, 20_000])
async def test_staging_one_appended_message_touches_only_it(
    tmp_path: Path, kind: str, n: int
) -> None:
    """Whatever the history's length, an append compares no message by value and
    encodes one: the new one; the journal grows by an append, not a compaction."""
    messages = [_message(kind, i) for i in range(n)]
    store = JournalStore(tmp_path)
    source = lambda: Snapshot("k", {"messages": messages})  # noqa: E731
    async with CheckpointWriter(source, store, exit_hooks=False) as writer:
        before = store.statistics("k")
        for _ in range(3):
            assert await _append_and_count(writer, store, messages, kind) == (0, 1)
        after = store.statistics("k")
    assert (after.appends - before.appends, after.compactions, after.rewrites) == (
        3,
        before.compactions,
        before.rewrites,
    )


@pytest.mark.anyio
async def test_a_session_reopened_on_the_same_store_is_checked_by_identity_again(
    tmp_path: Path,
) -> None:
    """A session loaded again (equal objects, not the ones written) and reopened on the
    same store: its first append checks the history by its bytes and adopts the new
    objects; from the next one on, no message is compared by value."""
    n = 5_000
    store = JournalStore(tmp_path)
    first = [_message("text", i) for i in range(n)]
    async with CheckpointWriter(
        lambda: Snapshot("k", {"messages": first}), store, exit_hooks=False
    ):
        pass  # written on start
    checkpoint = load(store, "k")
    assert checkpoint is not None
    again = [Text(**m) for m in checkpoint.state["messages"]]  # equal, other objects
    source = lambda: Snapshot("k", {"messages": again})  # noqa: E731
    async with CheckpointWriter(source, store, resume_from=checkpoint, exit_hooks=False) as writer:
        await _append_and_count(writer, store, again, "text")  # checks the bytes once
        for _ in range(3):
            assert await _append_and_count(writer, store, again, "text") == (0, 1)
    stored = load(store, "k")
    assert stored is not None
    assert stored.state["messages"] == msgspec.to_builtins(again)
