"""The CLI on a store directory written through a store of the user's own that changes the
bytes (compressed here): ``FileStore`` puts its revision line before them.  Such a file is
healthy, only not the CLI's to read: no command calls it damaged, and prune never removes it
(it cannot know its pin or its age)."""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from checkpointer import CheckpointWriter, FileStore, Snapshot, load
from checkpointer._cli import main

WHY = "written through a store of your own"


class Compressed:
    """A wrapper over ``FileStore`` that compresses what it stores."""

    def __init__(self, root: Path) -> None:
        self.inner = FileStore(root)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def write(
        self, key: str, chunks: Sequence[bytes], *, revision: str, expected: str | None
    ) -> int:
        data = zlib.compress(b"".join(chunks))
        return self.inner.write(key, [data], revision=revision, expected=expected)

    def read(self, key: str) -> bytes | None:
        data = self.inner.read(key)
        return None if data is None else zlib.decompress(data)


def run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str]:
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out + err


def test_a_pinned_wrapped_checkpoint_is_said_so_and_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ls and show say why they cannot read it; verify does not call it bad; prune keeps it."""
    store = Compressed(tmp_path)

    async def pinned() -> None:
        async with CheckpointWriter(lambda: Snapshot("k", {}), store, exit_hooks=False) as writer:
            await writer.write_now(pin=True)

    anyio.run(pinned)
    cp = load(store, "k")
    assert cp is not None and cp.meta.pinned and cp.meta.revision == store.revision("k")
    path = tmp_path / "k.json"
    assert path.read_bytes().startswith(b"\x00checkpointer-revision ")
    then = time.time() - 30 * 86400  # a month old by its file's time: only its meta knows
    os.utime(path, (then, then))
    status, said = run(capsys, "ls", tmp_path)
    assert (status, WHY in said, "corrupt" in said) == (0, True, False), said
    status, said = run(capsys, "show", tmp_path, "k")
    assert (status, WHY in said, "corrupt" in said) == (1, True, False), said
    status, said = run(capsys, "verify", tmp_path)
    assert (status, "BAD" in said) == (0, False), said
    assert said.endswith("1 checkpoint(s): 0 ok, 0 bad, 1 not checked (" + WHY + ")\n"), said
    status, said = run(capsys, "prune", tmp_path, "--older-than", "7d")
    assert (status, f"kept {path}: {WHY}" in said, path.exists()) == (0, True, True), said
