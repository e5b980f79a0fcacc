"""Transcripts to save, and the bare ways to save them that cases compare against.

The floor is the durable atomic replace done with ``os`` calls and nothing
else (``../shared/FACTS.md``, "Durable atomic replace on Linux"): temp file,
write, fsync, close, replace, fsync of the directory.  The aiofiles recipe
is the same steps, each awaited through aiofiles as a user would write them.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from typing import Any

import anyio
import msgspec

__all__ = [
    "MESSAGE_BYTES",
    "SettledMessage",
    "aiofiles_hops",
    "message",
    "settled",
    "transcript",
    "transcript_of",
    "write_aiofiles",
    "write_floor",
    "write_one_hop",
]

_WORDS = [
    "the",
    "tool",
    "returned",
    "a",
    "list",
    "of",
    "results",
    "and",
    "the",
    "model",
    "summarised",
    "them",
    "for",
    "the",
    "user",
    "while",
    "a",
    "second",
    "call",
    "fetched",
    "the",
    "page",
    "and",
    "a",
    "third",
    "one",
    "parsed",
    "the",
    "table",
    "into",
    "rows",
]

_TEXT = " ".join(_WORDS * 8)

MESSAGE_BYTES = 1024
"""Encoded size of a ``transcript_of`` message, about (10k messages: 10 MiB)."""


def message(i: int, size: int = 100) -> dict[str, Any]:
    """The i-th message of a transcript; its JSON is about ``size`` bytes."""
    role = ("user", "assistant", "tool")[i % 3]
    want = max(8, size - 40 - len(str(i)))
    start = (i * 7) % len(_TEXT)  # each message a different cut of the same prose
    text = _TEXT[start : start + want]
    while len(text) < want:
        text += " " + _TEXT[: want - len(text) - 1]
    return {"role": role, "content": text, "n": i}


class SettledMessage(msgspec.Struct, frozen=True):
    """A ``message()`` as a frozen Struct: the same JSON bytes, but settled.

    The message cache (``Transcript``) encodes a settled message once in its
    life; a dict is encoded afresh at every checkpoint.
    """

    role: str
    content: str
    n: int


def settled(messages: list[dict[str, Any]]) -> list[SettledMessage]:
    """``messages`` (from ``message()``) as ``SettledMessage``: same bytes when encoded."""
    return [SettledMessage(m["role"], m["content"], m["n"]) for m in messages]


def transcript(n: int, size: int = 100) -> list[dict[str, Any]]:
    """``n`` messages of about ``size`` encoded bytes each."""
    return [message(i, size) for i in range(n)]


def transcript_of(nbytes: int) -> dict[str, Any]:
    """A state ``{"messages": [...]}`` whose JSON is about ``nbytes`` long."""
    if nbytes <= 2 * MESSAGE_BYTES:
        return {"messages": [message(0, max(16, nbytes - 20))]}
    return {"messages": transcript(round(nbytes / MESSAGE_BYTES), MESSAGE_BYTES)}


def write_floor(
    path: str, data: bytes, fsync: Callable[[int], None] = os.fsync, *, dir_fsync: bool = True
) -> None:
    """The floor: a durable atomic replace of ``path`` with bare ``os`` calls.

    ``fsync`` is a seam for the floor case's breakdown, which times the
    write calls alone (without the disk's flush).  ``dir_fsync=False`` leaves
    the rename not durable: the most that sharing the directory's fsync
    between writes could save (the sessions case's ceiling).
    """
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".floor.", suffix=".tmp", dir=directory)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if not dir_fsync:
        return
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fsync(dfd)
    finally:
        os.close(dfd)


async def write_one_hop(path: str, data: bytes) -> None:
    """The floor's recipe in one ``anyio.to_thread.run_sync`` hop, as checkpointer does."""
    await anyio.to_thread.run_sync(write_floor, path, data)


def aiofiles_hops() -> int:
    """Thread hops ``write_aiofiles`` makes (each awaited call is one)."""
    return 9


async def write_aiofiles(path: str, data: bytes) -> None:
    """The same durable atomic replace, step by step through aiofiles.

    aiofiles has no fsync and no directory handle, so those steps go
    through ``aiofiles.os.wrap`` like the rest of its ``os`` functions.  One
    thread hop per awaited call: open temp, write, flush, fsync, close,
    replace, open dir, fsync dir, close dir (``aiofiles_hops``).
    """
    import aiofiles
    import aiofiles.os
    import aiofiles.tempfile

    fsync = aiofiles.os.wrap(os.fsync)
    directory = os.path.dirname(path)
    async with aiofiles.tempfile.NamedTemporaryFile(
        "wb", dir=directory, prefix=".naive.", suffix=".tmp", delete=False
    ) as f:
        await f.write(data)
        await f.flush()
        await fsync(f.fileno())
        tmp = f.name
    await aiofiles.os.replace(tmp, path)
    dfd = await aiofiles.os.wrap(os.open)(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        await fsync(dfd)
    finally:
        await aiofiles.os.wrap(os.close)(dfd)


def dumps(state: Any) -> bytes:
    """What the naive peers do: ``json.dumps`` of the whole state on the loop."""
    return json.dumps(state).encode()
