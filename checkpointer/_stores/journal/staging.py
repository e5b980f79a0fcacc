"""What the journals know of a key (``Known``, ``Track``) and what they stage (``Full``
to commit as a compaction, ``Delta`` as an append); ``core.JournalCore`` uses them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..._values import Meta
from ..encoding import new_epoch, state_pieces

__all__ = ["Delta", "Full", "Known", "Track", "absent"]


@dataclass(slots=True, eq=False)
class Known:
    """What a store knows of one transcript layout (an *epoch*) it wrote.

    Shared by the tracks of the epoch and only ever extended.  ``chunks[i]``
    is the ``i``-th message's bytes; ``witnesses[i]`` the object staged
    there: at a settled position that very object (``is``) means the same
    bytes.  ``unsettled`` positions prove nothing by identity: ``joined``
    (their chunks, comma-joined) is compared with a fresh encoding.
    ``loose``: a witness is ``LOOSE``, so the check is by identity, not
    ``==``; ``dead``: the key was written behind the epoch's back.
    """

    epoch: int
    witnesses: list[Any]
    chunks: list[bytes]
    unsettled: list[int]
    loose: bool = field(kw_only=True)
    joined: bytearray = field(init=False)
    dead: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.joined = bytearray(b",".join([self.chunks[at] for at in self.unsettled]))


class Track(NamedTuple):
    """What the store knows about one key's journal.  Replaced on every commit."""

    meta: Meta | None  # of the last committed row; None: no file
    size: int
    ino: int
    live: int
    broken: bool  # an append failed: rewrite from memory, never fsync this file again
    known: Known | None  # None: transcript unknown, the next stage is a compaction
    n: int  # messages in the transcript on disk: known's first n positions
    u: int  # ... of which unsettled: known.unsettled[:u]
    jlen: int  # ... whose joined chunks are known.joined[:jlen]
    head: bytes
    tail: bytes
    name: str | None
    first: bytes = b""  # the file's first line (a file journal's): with ino, which file it is


def absent() -> Track:
    return Track(None, 0, 0, 0, False, None, 0, 0, 0, b"", b"", None)


@dataclass(slots=True, kw_only=True, eq=False)
class Full:
    """A whole state to commit as a compaction row (or a fresh file): ``messages`` are the
    witnesses to be; its first ``count`` chunks are the state's, whatever the list becomes."""

    whole: bytes | None = None
    name: str | None = None
    head: bytes = b""
    tail: bytes = b""
    chunks: list[bytes] = field(default_factory=list)
    messages: list[Any] = field(default_factory=list)
    unsettled: list[int] = field(default_factory=list)
    loose: bool = False
    epoch: int = field(default_factory=new_epoch, init=False)
    count: int = field(init=False)

    def __post_init__(self) -> None:
        self.count = len(self.chunks)

    def content(self) -> object:
        if self.whole is not None:
            return ("whole", self.whole)
        return (self.epoch, self.count, self.head, self.tail)

    def state_pieces(self) -> list[bytes]:
        if self.whole is not None:
            return [self.whole]
        return state_pieces(self.head, self.chunks[: self.count], self.tail)

    def track(self, meta: Meta, *, size: int, ino: int, live: int) -> Track:
        """The track of a key once this state is committed (built in the worker)."""
        if self.whole is not None:
            return absent()._replace(
                meta=meta, size=size, ino=ino, live=live, head=self.head, tail=self.tail
            )
        count = self.count
        lists = (self.messages[:count], self.chunks[:count], list(self.unsettled))  # not shared
        known = Known(self.epoch, *lists, loose=self.loose)
        u, jlen = len(known.unsettled), len(known.joined)
        return Track(
            meta, size, ino, live, False, known, count, u, jlen, self.head, self.tail, self.name
        )


@dataclass(slots=True, eq=False)
class Delta:
    """New messages (and the rest of the state) on top of a track's prefix."""

    base: Track
    messages: list[Any]
    chunks: list[bytes]
    unsettled: list[int]
    head: bytes
    tail: bytes
    loose: bool = field(kw_only=True)
    _full: Full | None = field(default=None, init=False)

    def content(self) -> object:
        # (epoch, n) stands for the first n positions of the epoch, whose bytes
        # never change once a commit has taken them.  Ours, past the base, may
        # have been taken since we were staged (a commit in flight when a
        # flush_sync staged us): with other bytes, we are another state, to be
        # written as a compaction.
        base = self.base
        known = base.known
        assert known is not None
        count = len(self.chunks)
        taken = known.chunks[base.n : base.n + count]
        if known.dead or (taken and taken != self.chunks[: len(taken)]):
            return self.as_full().content()
        return (known.epoch, base.n + count, self.head, self.tail)

    def as_full(self) -> Full:
        """The same state as a compaction (the track moved on since staging)."""
        if self._full is None:
            base = self.base
            known = base.known
            assert known is not None
            count = base.n
            self._full = Full(
                name=base.name,
                head=self.head,
                tail=self.tail,
                chunks=known.chunks[:count] + self.chunks,
                messages=known.witnesses[:count] + self.messages,
                unsettled=known.unsettled[: base.u] + [count + at for at in self.unsettled],
                loose=known.loose or self.loose,
            )
        return self._full

    def rebased(self, track: Track | None) -> Delta | None:
        """This state on top of ``track``, if ``track`` is our base plus some of our messages
        (a commit of the key in flight at our staging has since landed)."""
        base = self.base
        known = base.known
        if (
            track is None
            or track.known is not known
            or known is None
            or known.dead
            or track.broken
            or not base.n <= track.n <= base.n + len(self.chunks)
            or len(known.chunks) != track.n  # not the newest track of the epoch
        ):
            return None
        skip = track.n - base.n
        if known.chunks[base.n : track.n] != self.chunks[:skip]:
            return None
        return Delta(
            track,
            self.messages[skip:],
            self.chunks[skip:],
            [at - skip for at in self.unsettled if at >= skip],
            self.head,
            self.tail,
            loose=self.loose,
        )
