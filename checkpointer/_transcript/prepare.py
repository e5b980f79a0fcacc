"""Agent transcripts: the writer's prepare step (settle, close, validate), incrementally.

The prepare step's cache
------------------------
The scan is a left fold: its state after ``k`` messages (``history.ScanState``: open
calls, ids seen, problems, turns) depends on those ``k`` messages only.
``transcript_prepare`` keeps, per key, a *prefix*: the first ``k`` message
objects of the last history it saw, and the state after them.  At the next
checkpoint, if the history starts with those objects (``_starts_with``: one
list ``==``, in C, identity first), only the messages after them are
scanned, on top of the state, and the state is put back (``mark`` /
``undo``); otherwise the prefix is dropped and the scan starts from zero.

Why the result is that of a full scan: a message enters the prefix only
when it is *settled for the scan* (``_settled``): a frozen Struct role
message (no field another dialect reads: ``type``, ``kind``, ``parts``,
``call_id``), without a ``__dict__`` or a custom
``__getattribute__``/``__getattr__``, whose content is a str, None or a
tuple of such Structs, whose tool calls are a tuple of such Structs, and
whose role, ids and statuses (all the scan reads, ``_VIEW``) are exact strs
or None.  Nothing the scan reads from such
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
scan resumes from the prefix too.  (A Responses call, whose answer goes
right after it, never enters a prefix: its items are dicts or objects of
other shapes, and the prefix holds role messages only.)

What this cannot see is what breaks immutability itself (as for the
encoding cache in ``_stores/encoding.py``): ``msgspec.structs.force_setattr``, ctypes,
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
import functools
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import msgspec

from .._values import Failed, Prepared, Snapshot
from .history import HistoryScan, ScanState, feed, scan_history
from .messages import INTERRUPTED_TEXT, HistoryProblem, get_field, is_sequence, replaced
from .repair import close_calls, settle_results

__all__ = ["transcript_prepare"]

logger = logging.getLogger("checkpointer")


def transcript_prepare(
    *, field: str = "messages", settle: bool = True, repair: bool = True
) -> Callable[[Snapshot], Prepared | Failed]:
    """The writer's ``prepare`` step for agent transcripts.

    On each snapshot, before it is encoded: settle running results, close
    dangling tool calls (both on a copy, never in memory), then validate.
    Calls *pending* in a paused run (a pydantic-ai deferred tool awaiting
    approval, an Agents SDK ``needs_approval`` pause) are stored open, as
    the framework persists them, so that it can still resume the run.
    A history still not sendable (an orphan result, a duplicate id) is
    ``Failed("not-sendable")`` naming the first problems' JSON paths; the
    previous file stays.  ``Written.repaired`` / ``.settled`` say what was
    repaired, and ``Meta.turns`` counts the turns written.  Messages of
    every dialect the helpers know are understood (``validate_history``);
    a message of a shape none recognises is written as it is, never a
    reason to refuse the write, and said once in the log (per prepare step).

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
        ``(Snapshot) -> Prepared | Failed``: the step ``Transcript`` gives the writer.
    """
    prefixes = _Prefixes()
    said: list[bool] = []  # the unrecognised shape is logged once per step

    def prepare(snapshot: Snapshot) -> Prepared | Failed:
        state = snapshot.state
        messages = get_field(state, field)
        if not is_sequence(messages):
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
                copy = messages  # close_calls builds a new list: no copy needed for it
                if running:
                    copy, settled = settle_results(list(messages), running, INTERRUPTED_TEXT)
                elif type(messages) is not list:
                    copy = list(messages)
                copy = close_calls(copy, unclosed)
                repaired = len(unclosed)
                # Repairs start at a running result or at the end of an
                # unclosed window, never inside the scanned prefix: the copy
                # starts with the same message objects, so it resumes too.
                after = scan(copy)
                problems = _not_pending(after.problems, after)
                state = replaced(state, **{field: copy})
                snapshot = msgspec.structs.replace(snapshot, state=state)
            else:
                problems = _not_pending(live.problems, live)
        if problems:
            problems = _refusing(problems, snapshot.key, field, said)
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


def _not_pending(problems: list[HistoryProblem], scan: HistoryScan) -> list[HistoryProblem]:
    """The problems but the calls pending in a paused run: stored open, as the framework does."""
    if not scan.pending:
        return problems
    pending = {(u.call_index, u.call_id) for u in scan.pending}
    return [p for p in problems if p.kind != "unclosed-call" or (p.index, p.call_id) not in pending]


def _refusing(
    problems: list[HistoryProblem], key: str, field: str, said: list[bool]
) -> list[HistoryProblem]:
    """The problems that refuse a write: all but unrecognised shapes, said once instead."""
    refusing = [p for p in problems if p.kind != "unrecognised"]
    if len(refusing) < len(problems) and not said:
        said.append(True)
        first = next(p for p in problems if p.kind == "unrecognised")
        count = len(problems) - len(refusing)
        logger.warning(
            "checkpointer: the history of key %r has %d message(s) of a shape the transcript "
            "helpers do not recognise, first %s; they are written as they are, without "
            "checks or repairs (said once per prepare step)",
            key,
            count,
            first.describe(f"$.state.{field}"),
        )
    return refusing


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


_OTHER_SHAPES = ("type", "kind", "parts", "call_id")
"""Attributes by which another dialect than a role message's could claim a message."""

_message_views: dict[type, frozenset[str] | None] = {}


def _message_view(cls: type) -> frozenset[str] | None:
    """``_view`` for a message class: a role message's fields, nothing another dialect reads."""
    view = _view(cls)
    if view is None or "role" not in view or any(hasattr(cls, n) for n in _OTHER_SHAPES):
        view = None
    _message_views[cls] = view
    return view


def _settled(message: Any) -> bool:
    """Whether the scan's view of ``message`` can never change, and it holds no running result.

    Everything ``feed`` reads from it is reached through immutable objects
    only: the message, its content blocks and its tool calls are frozen
    Structs (``_view``), the message a role message's (its dialect is chat,
    Anthropic, or none: a role it does not know; ``_message_view``), the
    content is a tuple, a str or None, the tool calls a tuple or None, and
    the values read (role, ids, statuses) are exact strs or None.  Narrower
    than ``_stores/encoding.is_settled`` on purpose: that one also requires
    what the scan never reads to be immutable (a ``ToolUseBlock``'s
    ``input`` is a dict) and walks all of it.
    """
    cls = type(message)
    view = _message_views[cls] if cls in _message_views else _message_view(cls)
    if view is None:
        return False
    role = message.role
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
        self.state = ScanState()


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
        feed(state, taken)
        if state.unclosed:  # empty before: the first one is in what was just fed
            del taken[state.unclosed[0].window_end - start :]
            state.undo(mark)
            feed(state, taken)
        prefix.messages += taken
    state.forget()


def _resume(state: ScanState, messages: Sequence[Any]) -> HistoryScan:
    """The scan of ``messages``, which start with the state's prefix, then back."""
    mark = state.mark()
    try:
        feed(state, messages[state.count :])
        return state.result()
    finally:
        state.undo(mark)


class _Prefixes:
    """The prefixes one prepare step keeps, per key, and the lock over them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[str, _Prefix] = {}

    @contextlib.contextmanager
    def scanner(self, key: str, messages: Sequence[Any]) -> Iterator[Callable[..., HistoryScan]]:
        """A scan function for ``messages`` and for copies that share its prefix.

        Without the lock (another thread, or a signal handler on this one,
        is scanning), it is the plain full scan.  Any exception drops the
        key's prefix, which may be half fed.
        """
        if not self._lock.acquire(blocking=False):
            yield scan_history
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
