"""Agent transcripts: sendable histories, repairs on a copy, fingerprints of the last message.

Two message shapes are understood, as plain dicts or as the frozen Structs
below (or any object with the same attribute names):

* chat-completions style: an assistant message's ``tool_calls[].id`` is
  answered by ``{"role": "tool", "tool_call_id": ...}`` messages that follow
  it directly;
* messages style: an assistant message's ``tool_use`` content blocks (``id``)
  are answered by ``tool_result`` blocks (``tool_use_id``) in the user
  message right after it.

A history is *sendable* when a model API would accept it: every result
answers a call that is still open (no orphan), every call is answered before
the conversation moves on (none unclosed), and no id is used twice.

The rules of the one-pass scan (``_scan``): a call opens when its assistant
message is seen.  Results close open calls.  Any message that is not a
chat-style ``tool`` message ends the *window* of the calls still open (after
its own results are taken), and those calls are unclosed; a result that
comes later is an orphan.  So for the messages style the window is the one
user message after the call, and for the chat style it is the run of
``tool`` messages after it, as the APIs require.

Repairs never mutate: ``settle_running`` and ``close_dangling_tool_calls``
return a new list in which only the messages they change are new objects,
built with ``dict`` copies or ``msgspec.structs.replace``.

The prepare step's cache
------------------------
The scan is a left fold: its state after ``k`` messages (``_State``: open
calls, ids seen, problems, turns) depends on those ``k`` messages only.
``transcript_prepare`` keeps, per key, a *prefix*: the first ``k`` message
objects of the last history it saw, and the state after them.  At the next
checkpoint, if the history starts with those objects (``_starts_with``: one
list ``==``, in C, identity first), only the messages after them are
scanned, on top of the state, and the state is put back (``mark`` /
``undo``); otherwise the prefix is dropped and the scan starts from zero.

Why the result is that of a full scan: a message enters the prefix only
when it is *settled for the scan* (``_settled``): a frozen Struct, without
a ``__dict__`` or a custom ``__getattribute__``/``__getattr__``, whose
content is a str, None or a tuple of such Structs, whose tool calls are a
tuple of such Structs, and whose role, ids and statuses (all the scan
reads, ``_VIEW``) are exact strs or None.  Nothing the scan reads from such
a message can change after it was scanned: its fields cannot be rebound,
and every object on the way to a read value is immutable.  So:

1. the prefix's state is the fold of the prefix as it is now;
2. ``_starts_with`` holds only if each position of the prefix holds the same
   object, or one equal to it (``==``), and an equal frozen Struct is of the
   same class with equal field values, so the scan reads the same values
   from it;
3. the fold of the whole history is the fold of its tail on top of the
   fold of its prefix, which is what ``_resume`` computes.

A dict message, a mutable or unfrozen Struct, a list inside a Struct, or a
message with a result still ``"running"`` (it is about to be replaced) stops
the prefix: it and everything after it are scanned at every checkpoint, so
an in-place edit of a dict is always seen.  The last message (``_KEEP``) is
never taken in either: agents replace it while it streams.  Nor is a
message that ends a window with calls still open, so the repairs (which
land at a running result or at the end of an unclosed window) always fall
after the prefix: the repaired copy starts with the same objects, and its
scan resumes from the prefix too.

What this cannot see is what breaks immutability itself (as for the
encoding cache in ``_encoding``): ``msgspec.structs.force_setattr``, ctypes,
changing a Struct class after its instances were scanned, or values whose
``==``, hash or repr lie (a str subclass overriding them, ``mock.ANY``)
replacing equal ones in the prefix.

Cost: the list comparison, about a nanosecond a message, plus the scan of
the messages after the prefix; a history changed inside its prefix is
scanned again in full, once, and more slowly (each message's settledness is
checked on the way).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any, Literal, NamedTuple, TypeAlias

import msgspec

from ._values import Failed, Prepared, Snapshot

__all__ = [
    "CLOSED_CALL_TEXT",
    "INTERRUPTED_TEXT",
    "ChatMessage",
    "ContentBlock",
    "HistoryProblem",
    "Message",
    "TextBlock",
    "ToolCall",
    "ToolFunction",
    "ToolResultBlock",
    "ToolUseBlock",
    "close_dangling_tool_calls",
    "count_turns",
    "settle_running",
    "starts_with_results",
    "transcript_fingerprint",
    "transcript_prepare",
    "validate_history",
]

CLOSED_CALL_TEXT = (
    "The tool call did not complete: the session stopped before it returned a result."
)
"""The one fixed sentence of the error result that closes a dangling call."""

INTERRUPTED_TEXT = (
    "Interrupted: the tool was still running when the session was checkpointed and did not finish."
)
"""The reason given to a running item when it is settled as an error."""


# -- chat-completions style --------------------------------------------------


class ToolFunction(msgspec.Struct, frozen=True):
    """The function of a chat-completions tool call: name and JSON arguments."""

    name: str
    arguments: str = "{}"


class ToolCall(msgspec.Struct, frozen=True):
    """One entry of an assistant message's ``tool_calls``."""

    id: str
    function: ToolFunction
    type: str = "function"


class ChatMessage(msgspec.Struct, frozen=True, omit_defaults=True):
    """A chat-completions message (system, developer, user, assistant, tool).

    ``status`` is not part of the API: an agent may mark a ``tool`` message
    ``"running"`` while the tool runs; ``settle_running`` turns that into
    ``"error"``.  Fields left at None are not written.
    """

    role: str
    content: str | list[dict[str, Any]] | None = None
    tool_calls: tuple[ToolCall, ...] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    id: str | None = None
    status: str | None = None


# -- messages style ----------------------------------------------------------


class TextBlock(msgspec.Struct, frozen=True, tag_field="type", tag="text"):
    """A text content block."""

    text: str


class ToolUseBlock(msgspec.Struct, frozen=True, tag_field="type", tag="tool_use"):
    """A tool call in an assistant message (messages style)."""

    id: str
    name: str
    input: dict[str, Any] = {}


class ToolResultBlock(
    msgspec.Struct, frozen=True, omit_defaults=True, tag_field="type", tag="tool_result"
):
    """A tool result in a user message (messages style).

    ``status`` is not part of the API (see ``ChatMessage.status``).
    """

    tool_use_id: str
    content: str | list[dict[str, Any]] = ""
    is_error: bool = False
    status: str | None = None


ContentBlock: TypeAlias = TextBlock | ToolUseBlock | ToolResultBlock


class Message(msgspec.Struct, frozen=True, omit_defaults=True):
    """A messages-style message: a role and a string or content blocks.

    For block types beyond text, tool use and tool result (images,
    thinking, ...) keep plain dicts: every function here takes those too.
    """

    role: str
    content: str | tuple[ContentBlock, ...]
    id: str | None = None


# -- problems ----------------------------------------------------------------

ProblemKind: TypeAlias = Literal["orphan-result", "unclosed-call", "duplicate-id"]


class HistoryProblem(msgspec.Struct, frozen=True, kw_only=True):
    """Why a history would be refused by a model API.

    Attributes:
        kind: ``"orphan-result"`` (a result answers no open call),
            ``"unclosed-call"`` (a call is never answered in time) or
            ``"duplicate-id"`` (a call id used twice, or a call answered twice).
        index: the message where it is (the call's message for an unclosed
            call, the result's message otherwise).
        call_id: the tool call id concerned (None if the result has none).
        detail: one sentence saying what is wrong.
    """

    kind: ProblemKind
    index: int
    call_id: str | None
    detail: str

    def describe(self, path: str = "$") -> str:
        """The problem with its JSON path, e.g. ``$.messages[3]: ...``."""
        return f"{path}[{self.index}]: {self.detail}"


# -- field access on dicts, Structs and plain objects ------------------------


def _get(obj: Any, name: str) -> Any:
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


def _block_type(block: Any) -> Any:
    if isinstance(block, dict):
        return block.get("type")
    if isinstance(block, msgspec.Struct):
        return block.__struct_config__.tag
    return getattr(block, "type", None)


def _replace(obj: Any, **changes: Any) -> Any:
    """A copy of ``obj`` with ``changes``; fields a Struct lacks are left out."""
    if isinstance(obj, dict):
        return {**obj, **changes}
    if isinstance(obj, msgspec.Struct):
        fields = obj.__struct_fields__
        return msgspec.structs.replace(obj, **{k: v for k, v in changes.items() if k in fields})
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        names = {f.name for f in dataclasses.fields(obj)}
        return dataclasses.replace(obj, **{k: v for k, v in changes.items() if k in names})
    raise TypeError(f"cannot copy a {type(obj).__name__} message; use dicts or msgspec Structs")


def _is_sequence(value: Any) -> bool:
    return isinstance(value, (list, tuple))


# -- the one-pass scan -------------------------------------------------------


class _Unclosed(msgspec.Struct, frozen=True):
    call_index: int  # the assistant message with the call
    window_end: int  # the message that closed its window (len(messages) at the end)
    call_id: str
    chat: bool  # chat-completions style (else messages style)


class _Scan(msgspec.Struct):
    problems: list[HistoryProblem]
    unclosed: list[_Unclosed]
    running: list[int]  # indices of messages holding running results
    turns: int  # assistant messages


class _Mark(NamedTuple):
    """Where a ``_State`` was, to go back there (``_State.undo``)."""

    fed: int
    problems: int
    unclosed: int
    running: int
    called: int
    answered: int
    turns: int
    open_calls: dict[str, tuple[int, bool]]


class _State:
    """The scan after its first ``count`` messages.

    A left fold: it depends on those messages only, so it can be kept and
    fed more messages later.  ``called_log`` and ``answered_log`` list the
    ids added to ``called`` and ``answered`` since ``forget()``, so that a
    feed can be undone exactly (``mark`` / ``undo``): a call id is added to
    ``called`` only when it is not there, and to ``answered`` only when its
    open call is answered, which happens once.
    """

    __slots__ = (
        "answered",
        "answered_log",
        "called",
        "called_log",
        "count",
        "open_calls",
        "problems",
        "running",
        "turns",
        "unclosed",
    )

    def __init__(self) -> None:
        self.count = 0
        self.problems: list[HistoryProblem] = []  # found in the loop, in message order
        self.unclosed: list[_Unclosed] = []  # windows closed without an answer
        self.running: list[int] = []
        self.open_calls: dict[str, tuple[int, bool]] = {}  # id -> (call index, chat style)
        self.called: set[str] = set()
        self.answered: set[str] = set()
        self.called_log: list[str] = []
        self.answered_log: list[str] = []
        self.turns = 0

    def mark(self) -> _Mark:
        return _Mark(
            self.count,
            len(self.problems),
            len(self.unclosed),
            len(self.running),
            len(self.called_log),
            len(self.answered_log),
            self.turns,
            dict(self.open_calls),  # the calls of one window: a few
        )

    def undo(self, mark: _Mark) -> None:
        """Back to ``mark``, taken since the last ``forget()``."""
        self.called.difference_update(self.called_log[mark.called :])
        del self.called_log[mark.called :]
        self.answered.difference_update(self.answered_log[mark.answered :])
        del self.answered_log[mark.answered :]
        del self.problems[mark.problems :]
        del self.unclosed[mark.unclosed :]
        del self.running[mark.running :]
        self.open_calls.clear()
        self.open_calls.update(mark.open_calls)
        self.turns = mark.turns
        self.count = mark.fed

    def forget(self) -> None:
        """Keep what was fed: earlier marks can no longer be undone to."""
        self.called_log.clear()
        self.answered_log.clear()

    def result(self) -> _Scan:
        """The scan of the ``count`` messages fed, as if they were the whole history."""
        end = self.count
        unclosed = self.unclosed + [
            _Unclosed(at, end, call_id, chat) for call_id, (at, chat) in self.open_calls.items()
        ]
        problems = self.problems + [
            HistoryProblem(
                kind="unclosed-call",
                index=u.call_index,
                call_id=u.call_id,
                detail=f"tool call {u.call_id!r} has no result before the conversation goes on",
            )
            for u in unclosed
        ]
        problems.sort(key=lambda p: p.index)  # stable: per message, in the order found
        return _Scan(problems, unclosed, list(self.running), self.turns)


def _scan(messages: Sequence[Any]) -> _Scan:
    state = _State()
    _feed(state, messages)
    return state.result()


def _feed(state: _State, items: Sequence[Any]) -> None:
    """Scan ``items``, the messages after the first ``state.count``, on top of ``state``."""
    # The hot loop of every transcript write: dicts are read inline, and a
    # message costs a few dict lookups unless it carries calls or results.
    start = state.count
    problems = state.problems
    unclosed = state.unclosed
    running = state.running
    open_calls = state.open_calls
    called = state.called
    answered = state.answered
    called_log = state.called_log
    answered_log = state.answered_log
    turns = state.turns
    for i, message in enumerate(items, start):
        fields = message if type(message) is dict else None
        role = fields.get("role") if fields is not None else getattr(message, "role", None)
        if role == "tool":  # chat style: answers, and keeps the window open
            if fields is not None:
                call_id, status = fields.get("tool_call_id"), fields.get("status")
            else:
                call_id, status = _get(message, "tool_call_id"), _get(message, "status")
            if isinstance(call_id, str) and call_id in open_calls:  # a list id answers nothing
                del open_calls[call_id]
                answered.add(call_id)
                answered_log.append(call_id)
            else:
                _stray(call_id, i, answered, problems)
            if status == "running":
                running.append(i)
            continue
        content = fields.get("content") if fields is not None else getattr(message, "content", None)
        blocks = content if isinstance(content, (list, tuple)) else ()
        if role != "assistant" and blocks:
            is_running = False
            for block in blocks:
                if _block_type(block) == "tool_result":
                    call_id = _get(block, "tool_use_id")
                    if isinstance(call_id, str) and call_id in open_calls:
                        del open_calls[call_id]
                        answered.add(call_id)
                        answered_log.append(call_id)
                    else:
                        _stray(call_id, i, answered, problems)
                    is_running = is_running or _get(block, "status") == "running"
            if is_running:
                running.append(i)
        # Any message but a chat "tool" message ends the window of open calls.
        if open_calls:
            for call_id, (at, chat) in open_calls.items():
                unclosed.append(_Unclosed(at, i, call_id, chat))
            open_calls.clear()
        if role == "assistant":
            turns += 1
            calls = fields.get("tool_calls") if fields is not None else _get(message, "tool_calls")
            if calls and isinstance(calls, (list, tuple)):
                for call in calls:
                    call_id = call.get("id") if type(call) is dict else _get(call, "id")
                    if type(call_id) is str and call_id not in called:
                        called.add(call_id)
                        called_log.append(call_id)
                        open_calls[call_id] = (i, True)
                    else:
                        _call(call_id, i, True, state)
            for block in blocks:
                if _block_type(block) == "tool_use":
                    _call(_get(block, "id"), i, False, state)
    state.turns = turns
    state.count = start + len(items)


def _call(call_id: Any, index: int, chat: bool, state: _State) -> None:
    if not isinstance(call_id, str):
        return  # an id-less call cannot be answered or checked
    if call_id in state.called:
        state.problems.append(
            HistoryProblem(
                kind="duplicate-id",
                index=index,
                call_id=call_id,
                detail=f"tool call id {call_id!r} is used by an earlier call too",
            )
        )
        return
    state.called.add(call_id)
    state.called_log.append(call_id)
    state.open_calls[call_id] = (index, chat)


def _stray(call_id: Any, index: int, answered: set[str], problems: list[HistoryProblem]) -> None:
    """A result that answers no open call: a second answer, or an orphan."""
    if isinstance(call_id, str) and call_id in answered:
        kind: ProblemKind = "duplicate-id"
        detail = f"tool call {call_id!r} is answered a second time"
    else:
        kind = "orphan-result"
        detail = f"tool result for {call_id!r} answers no open tool call (orphan result)"
    problems.append(
        HistoryProblem(
            kind=kind,
            index=index,
            call_id=call_id if isinstance(call_id, str) else None,
            detail=detail,
        )
    )


# -- public functions ----------------------------------------------------------


def validate_history(messages: Sequence[Any]) -> list[HistoryProblem]:
    """Every reason a model API would refuse ``messages``, in one pass.

    Args:
        messages: chat-completions or messages-style messages, as dicts or
            Structs.

    Returns:
        The problems in message order; empty when the history is sendable
        (an empty history is).
    """
    return _scan(messages).problems


def settle_running(
    messages: Sequence[Any], *, reason: str = INTERRUPTED_TEXT
) -> tuple[list[Any], int]:
    """Settle results still marked ``status: "running"`` as errors, on a copy.

    A chat ``tool`` message, or a ``tool_result`` block, whose ``status`` is
    ``"running"`` gets ``status: "error"`` and ``reason`` as its content
    (blocks also ``is_error: True``).  Meant for a snapshot taken while a
    tool ran: whoever resumes it will never see that tool finish.

    Returns:
        ``(copy, count)``: a new list (only the changed messages are new
        objects; ``messages`` and its messages are never mutated) and the
        number of items settled.
    """
    return _settle(list(messages), _scan(messages).running, reason)


def close_dangling_tool_calls(messages: Sequence[Any]) -> tuple[list[Any], int]:
    """Answer every unclosed tool call with an error result, on a copy.

    Each call that gets no result before the conversation goes on is given
    one, saying ``CLOSED_CALL_TEXT``, where the API expects it: chat style,
    a ``tool`` message after the call's other results; messages style, a
    ``tool_result`` block at the start of the next user message (a new user
    message if the next one is not).  Orphan results and duplicate ids are
    not touched (``validate_history`` still reports them).

    Returns:
        ``(copy, count)``: a new list (only changed or added messages are new
        objects; ``messages`` and its messages are never mutated) and the
        number of calls closed.
    """
    unclosed = _scan(messages).unclosed
    return _close(list(messages), unclosed), len(unclosed)


def starts_with_results(message: Any) -> bool:
    """Whether ``message`` answers tool calls (so a transcript cannot start with it)."""
    if _get(message, "role") == "tool":
        return True
    content = _get(message, "content")
    return _is_sequence(content) and any(_block_type(b) == "tool_result" for b in content)


def count_turns(messages: Sequence[Any]) -> int:
    """The number of assistant messages in ``messages``."""
    return _scan(messages).turns


def _settle(copy: list[Any], running: list[int], reason: str) -> tuple[list[Any], int]:
    count = 0
    for i in running:
        message = copy[i]
        if _get(message, "role") == "tool":
            copy[i] = _replace(message, status="error", content=reason)
            count += 1
            continue
        content = _get(message, "content")
        blocks = []
        for block in content:
            if _block_type(block) == "tool_result" and _get(block, "status") == "running":
                block = _replace(block, status="error", is_error=True, content=reason)
                count += 1
            blocks.append(block)
        copy[i] = _replace(message, content=type(content)(blocks))
    return copy, count


def _close(copy: list[Any], unclosed: list[_Unclosed]) -> list[Any]:
    if not unclosed:
        return copy
    by_end: dict[int, list[_Unclosed]] = {}
    for u in unclosed:
        by_end.setdefault(u.window_end, []).append(u)
    start = min(by_end)
    out = copy[:start]  # one copy of the history, not a slice copied again
    for end in sorted(by_end):
        out.extend(copy[start:end])
        group = by_end[end]
        follower = copy[end] if end < len(copy) else None
        out.extend(_tool_message(copy[u.call_index], u.call_id) for u in group if u.chat)
        blocks = [_result_block(copy[u.call_index], u.call_id) for u in group if not u.chat]
        start = end
        if blocks:
            if follower is not None and _get(follower, "role") == "user":
                out.append(_prepend_blocks(follower, blocks))
                start = end + 1
            else:
                out.append(_user_message(copy[group[0].call_index], blocks))
    out.extend(copy[start:])
    return out


def _tool_message(call_message: Any, call_id: str) -> Any:
    if isinstance(call_message, ChatMessage):
        return ChatMessage(role="tool", tool_call_id=call_id, content=CLOSED_CALL_TEXT)
    return {"role": "tool", "tool_call_id": call_id, "content": CLOSED_CALL_TEXT}


def _result_block(call_message: Any, call_id: str) -> Any:
    if isinstance(call_message, Message):
        return ToolResultBlock(tool_use_id=call_id, content=CLOSED_CALL_TEXT, is_error=True)
    return {
        "type": "tool_result",
        "tool_use_id": call_id,
        "content": CLOSED_CALL_TEXT,
        "is_error": True,
    }


def _user_message(call_message: Any, blocks: list[Any]) -> Any:
    if isinstance(call_message, Message):
        return Message(role="user", content=tuple(blocks))
    return {"role": "user", "content": blocks}


def _prepend_blocks(message: Any, blocks: list[Any]) -> Any:
    content = _get(message, "content")
    if isinstance(content, str):
        text: Any = TextBlock(content) if isinstance(message, Message) else _text_dict(content)
        existing: list[Any] = [text] if content else []
    else:
        existing = list(content or ())
    merged = blocks + existing
    as_tuple = isinstance(content, tuple) or isinstance(message, Message)
    return _replace(message, content=tuple(merged) if as_tuple else merged)


def _text_dict(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


# -- the writer's hooks ------------------------------------------------------


def transcript_fingerprint(
    *, field: str = "messages", pin: str = "pinned", extra: Sequence[str] = ()
) -> Callable[[Snapshot], Hashable]:
    """A structural fingerprint of a transcript, for ``CheckpointWriter(fingerprint=)``.

    It is made of the key, the parent, the message count, the whole last
    message (its JSON, as the writer would encode it), the state's pin flag,
    and the state fields named in ``extra``.  So any change of the last
    message is seen (a streamed tool-call ``arguments``, a ``tool_use``
    block's ``input``, an earlier block, a same-length text, ``2`` to
    ``2.0``), at a cost bounded by that message's size: it costs the same
    at 10 and at 100,000 messages, because it never iterates, hashes or
    encodes the rest of the history.  The price: an edit of an earlier
    message that leaves the count and the last message as they were is not
    seen; name a revision counter in ``extra``, or use
    ``write_now(force=True)``, after such edits.

    The last message may be of any shape: a dict, a Struct, a dataclass,
    anything msgspec encodes; an object it cannot encode is taken as its
    class name and attributes (``__dict__`` and ``__slots__``), else its
    ``repr``.

    Args:
        field: the state's field (dict key or attribute) holding the messages.
        pin: the state's field holding a pin flag (absent counts as None).
        extra: more state fields to include; their values must be hashable.
    """
    names = tuple(extra)

    def fingerprint(snapshot: Snapshot) -> Hashable:
        state = snapshot.state
        messages = _get(state, field)
        if messages is None:
            raise TypeError(f"the state has no {field!r} field")
        count = len(messages)
        return (
            snapshot.key,
            snapshot.parent,
            count,
            _whole(messages[-1]) if count else None,
            _get(state, pin),
            tuple(_get(state, name) for name in names),
        )

    return fingerprint


def _attributes(obj: Any) -> Any:
    """What the fingerprint encodes of an object msgspec cannot: class and attributes."""
    names: dict[str, Any] = dict(getattr(obj, "__dict__", None) or {})
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in names and name not in ("__dict__", "__weakref__"):
                with contextlib.suppress(AttributeError):  # an unset slot
                    names[name] = getattr(obj, name)
    if not names:
        return repr(obj)
    return [type(obj).__module__, type(obj).__qualname__, names]


_WHOLE = msgspec.json.Encoder(enc_hook=_attributes)


def _whole(message: Any) -> Hashable:
    """The last message as JSON: any change of it changes the bytes (``2`` vs ``2.0``)."""
    try:
        return _WHOLE.encode(message)
    except Exception:  # unencodable even so (a cycle, a key of an odd type)
        return ("repr", type(message).__qualname__, repr(message))


def transcript_prepare(
    *, field: str = "messages", settle: bool = True, repair: bool = True
) -> Callable[[Snapshot], Prepared | Failed]:
    """The writer's ``prepare`` step for agent transcripts.

    On each snapshot, before it is encoded: settle running results, close
    dangling tool calls (both on a copy, never in memory), then validate.
    A history still not sendable (an orphan result, a duplicate id) is
    ``Failed("not-sendable")`` naming the first problems' JSON paths; the
    previous file stays.  ``Written.repaired`` / ``.settled`` say what was
    repaired, and ``Meta.turns`` counts the assistant messages written.

    Each step keeps, per key (the last four keys), the scan of the
    history's settled prefix: a checkpoint that adds messages scans only
    those, after one C-speed list comparison of the prefix (about a
    nanosecond a message).  The result is always that of a full scan; see
    "The prepare step's cache" in the module docstring for why.

    Args:
        field: the state's field (dict key, Struct or dataclass attribute)
            holding the messages.
        settle: settle ``status: "running"`` results as errors.
        repair: close dangling tool calls.

    Returns:
        ``(Snapshot) -> Prepared | Failed``, for ``CheckpointWriter(prepare=)``.
    """
    prefixes = _Prefixes()

    def prepare(snapshot: Snapshot) -> Prepared | Failed:
        state = snapshot.state
        messages = _get(state, field)
        if not _is_sequence(messages):
            return Failed(
                "snapshot-failed",
                f"the state of key {snapshot.key!r} has no list at $.state.{field}",
            )
        settled = repaired = 0
        with prefixes.scanner(snapshot.key, messages) as scan:
            live = scan(messages)
            running = live.running if settle else []
            unclosed = live.unclosed if repair else []
            if running or unclosed:
                copy = messages  # _close builds a new list: no copy needed for it
                if running:
                    copy, settled = _settle(list(messages), running, INTERRUPTED_TEXT)
                elif type(messages) is not list:
                    copy = list(messages)
                copy = _close(copy, unclosed)
                repaired = len(unclosed)
                # Repairs start at a running result or at the end of an
                # unclosed window, never inside the scanned prefix: the copy
                # starts with the same message objects, so it resumes too.
                problems = scan(copy).problems
                state = _replace(state, **{field: copy})
                snapshot = msgspec.structs.replace(snapshot, state=state)
            else:
                problems = live.problems
        if problems:
            shown = "; ".join(p.describe(f"$.state.{field}") for p in problems[:3])
            more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            return Failed(
                "not-sendable",
                f"the history of key {snapshot.key!r} would be refused by a model API: "
                f"{shown}{more}",
            )
        # Repairs add results, never assistant messages: the turns stay.
        return Prepared(snapshot=snapshot, repaired=repaired, settled=settled, turns=live.turns)

    return prepare


# -- the prepare step's cache --------------------------------------------------

_KEEP = 1
"""The last message is never cached: it is the one an agent replaces (streaming)."""

_KEYS = 4
"""Keys whose prefix one prepare step keeps (a writer usually has one)."""

_VIEW = ("role", "content", "tool_calls", "tool_call_id", "status", "tool_use_id", "id")
"""Every attribute the scan reads from a message, a block or a call."""

# Per class: the names of _VIEW that are fields of its instances, when they
# are frozen Structs without a __dict__, whose other _VIEW names are absent
# (so read as None) and whose attributes are read by plain slot access; None
# for any other class.
_views: dict[type, frozenset[str] | None] = {}


def _view(cls: type) -> frozenset[str] | None:
    try:
        return _views[cls]
    except KeyError:
        pass
    view = None
    if (
        issubclass(cls, msgspec.Struct)
        and cls.__struct_config__.frozen
        and not cls.__struct_config__.dict
        and cls.__getattribute__ is object.__getattribute__
        and not hasattr(cls, "__getattr__")
    ):
        fields = cls.__struct_fields__
        if all(name in fields or not hasattr(cls, name) for name in _VIEW):
            view = frozenset(name for name in _VIEW if name in fields)
    _views[cls] = view
    return view


def _settled(message: Any) -> bool:
    """Whether the scan's view of ``message`` can never change, and it holds no running result.

    Everything ``_feed`` reads from it is reached through immutable objects
    only: the message, its content blocks and its tool calls are frozen
    Structs (``_view``), the content is a tuple, a str or None, the tool
    calls a tuple or None, and the values read (role, ids, statuses) are
    exact strs or None.  Narrower than ``_encoding.is_settled`` on purpose:
    that one also requires what the scan never reads to be immutable (a
    ``ToolUseBlock``'s ``input`` is a dict) and walks all of it.
    """
    cls = type(message)
    view = _views[cls] if cls in _views else _view(cls)
    if view is None:
        return False
    role = message.role if "role" in view else None
    if role is not None and type(role) is not str:
        return False
    if role == "tool":
        if "tool_call_id" in view and not _str_or_none(message.tool_call_id):
            return False
        return "status" not in view or _str_but_running(message.status)
    content = message.content if "content" in view else None
    if type(content) is tuple:
        for block in content:
            cls = type(block)
            view = _views[cls] if cls in _views else _view(cls)
            if view is None:
                return False
            if "status" in view and not _str_but_running(block.status):
                return False
            if "tool_use_id" in view and not _str_or_none(block.tool_use_id):
                return False
            if "id" in view and not _str_or_none(block.id):
                return False
    elif content is not None and type(content) is not str:
        return False
    if role == "assistant" and "tool_calls" in view:
        calls = message.tool_calls
        if type(calls) is tuple:
            for call in calls:
                cls = type(call)
                view = _views[cls] if cls in _views else _view(cls)
                if view is None or ("id" in view and not _str_or_none(call.id)):
                    return False
        elif calls is not None:
            return False
    return True


def _str_or_none(value: object) -> bool:
    return value is None or type(value) is str


def _str_but_running(status: object) -> bool:
    return status is None or (type(status) is str and status != "running")


class _Prefix:
    """The first messages of one key's history, as objects, and their scan."""

    __slots__ = ("messages", "state")

    def __init__(self) -> None:
        self.messages: list[Any] = []
        self.state = _State()


def _starts_with(messages: Sequence[Any], prefix: list[Any]) -> bool:
    """Whether ``messages`` starts with ``prefix``: one list ``==``, in C.

    The comparison is by identity first, so an unchanged prefix costs a
    pointer comparison a message; no copy of the prefix is made: the prefix
    list is extended with the rest of ``messages`` for the comparison and
    trimmed back.
    """
    count = len(prefix)
    if count == 0:
        return True
    if len(messages) < count:
        return False
    whole = messages if type(messages) is list else list(messages)
    prefix.extend(whole[count:])
    try:
        return whole == prefix
    except Exception:  # a message whose == raises is not the same message
        return False
    finally:
        del prefix[count:]


def _advance(prefix: _Prefix, messages: Sequence[Any]) -> None:
    """Take the settled messages after the prefix into it, up to the last ``_KEEP``.

    It stops at the first message that is not ``_settled`` (that covers
    running results) and before any message that ends a window with calls
    still open, so the prefix's scan never holds a running result nor an
    unclosed call: every repair lands after the prefix.
    """
    state = prefix.state
    start = state.count
    window = messages[start : len(messages) - _KEEP]  # what may be taken in: one copy
    count = 0
    for message in window:
        if not _settled(message):
            break
        count += 1
    if count:
        taken = window if type(window) is list else list(window)
        del taken[count:]
        mark = state.mark()
        _feed(state, taken)
        if state.unclosed:  # empty before: the first one is in what was just fed
            del taken[state.unclosed[0].window_end - start :]
            state.undo(mark)
            _feed(state, taken)
        prefix.messages += taken
    state.forget()


def _resume(state: _State, messages: Sequence[Any]) -> _Scan:
    """The scan of ``messages``, which start with the state's prefix, then back."""
    mark = state.mark()
    try:
        _feed(state, messages[state.count :])
        return state.result()
    finally:
        state.undo(mark)


class _Prefixes:
    """The prefixes one prepare step keeps, per key, and the lock over them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[str, _Prefix] = {}

    @contextlib.contextmanager
    def scanner(self, key: str, messages: Sequence[Any]) -> Iterator[Callable[..., _Scan]]:
        """A scan function for ``messages`` and for copies that share its prefix.

        Without the lock (another thread, or a signal handler on this one,
        is scanning), it is the plain full scan.  Any exception drops the
        key's prefix, which may be half fed.
        """
        if not self._lock.acquire(blocking=False):
            yield _scan
            return
        try:
            prefix = self._by_key.pop(key, None)
            if prefix is None or not _starts_with(messages, prefix.messages):
                prefix = _Prefix()
            self._by_key[key] = prefix
            while len(self._by_key) > _KEYS:
                del self._by_key[next(iter(self._by_key))]
            try:
                _advance(prefix, messages)
                yield functools.partial(_resume, prefix.state)
            except BaseException:
                self._by_key.pop(key, None)
                raise
        finally:
            self._lock.release()
