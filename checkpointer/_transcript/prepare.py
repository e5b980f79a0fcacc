"""The writer's prepare step for transcripts: settle, close and validate on a copy, scanning
only what follows the settled prefix it keeps per key (the result is a full scan's)."""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import msgspec

from .._values import Failed, Prepared, Snapshot, transcript_messages
from .history import HistoryScan, ScanState, feed, scan_history
from .messages import (
    INTERRUPTED_TEXT,
    ChatMessage,
    HistoryProblem,
    Message,
    TextBlock,
    ToolCall,
    ToolResultBlock,
    ToolUseBlock,
    replaced,
)
from .repair import close_calls, settle_results

__all__ = ["transcript_prepare"]

logger = logging.getLogger("checkpointer")


def transcript_prepare(
    *, field: str = "messages", settle: bool = True, repair: bool = True
) -> Callable[[Snapshot], Prepared | Failed]:
    """The writer's ``prepare`` step for agent transcripts (``Transcript`` gives it).

    On each snapshot, before it is encoded: settle running results, close
    dangling tool calls (both on a copy, never in memory), then validate.
    Calls *pending* in a paused run (a pydantic-ai deferred tool, an Agents
    SDK approval) are stored open, as the framework persists them.  A
    history still not sendable (an orphan result, a duplicate id) is
    ``Failed("not-sendable")`` naming the first problems' JSON paths.  A
    message of a shape no dialect recognises is written as it is and said
    once in the log.

    Args:
        field: the dict key or Struct attribute holding the messages; a
            state without them (``transcript_messages``) passes as it is.
        settle: settle ``status: "running"`` results as errors.
        repair: close dangling tool calls.
    """
    prefixes = _Prefixes()
    said: list[bool] = []  # the unrecognised shape is logged once per step

    def prepare(snapshot: Snapshot) -> Prepared | Failed:
        messages = transcript_messages(snapshot.state, field)
        if messages is None:  # a state without messages is written whole
            return Prepared(snapshot=snapshot)
        with prefixes.scanner(snapshot.key, messages) as scan:
            live = scan(messages)
            copy, settled, repaired, problems = _repaired(messages, live, scan, settle, repair)
        problems = _refusing(problems, snapshot.key, field, said)
        if problems:
            return _not_sendable(problems, snapshot.key, field)
        if copy is not messages:
            state = replaced(snapshot.state, **{field: copy})
            snapshot = msgspec.structs.replace(snapshot, state=state)
        # Repairs add results, never assistant messages: the turns stay.
        return Prepared(snapshot=snapshot, repaired=repaired, settled=settled, turns=live.turns)

    return prepare


def _repaired(
    messages: Sequence[Any],
    live: HistoryScan,
    scan: Callable[[Sequence[Any]], HistoryScan],
    settle: bool,
    repair: bool,
) -> tuple[Sequence[Any], int, int, list[HistoryProblem]]:
    """The history to write (``messages`` itself if nothing needs a repair), the results
    settled, the calls closed, and the problems the written history still has."""
    running = live.running if settle else []
    unclosed = live.unclosed if repair else []
    if not running and not unclosed:
        return messages, 0, 0, _not_pending(live)
    if running:
        copy, settled = settle_results(list(messages), running, INTERRUPTED_TEXT)
    else:  # close_calls builds a new list
        copy, settled = (messages if type(messages) is list else list(messages)), 0
    copy = close_calls(copy, unclosed)
    # Repairs land at a running result or at the end of an unclosed window, after
    # the kept prefix: the copy starts with the same objects, so its scan resumes too.
    return copy, settled, len(unclosed), _not_pending(scan(copy))


def _not_pending(scan: HistoryScan) -> list[HistoryProblem]:
    """The problems but the calls pending in a paused run: stored open, as the framework does."""
    if not scan.pending:
        return scan.problems
    pending = {(u.call_index, u.call_id) for u in scan.pending}
    return [
        p for p in scan.problems if p.kind != "unclosed-call" or (p.index, p.call_id) not in pending
    ]


def _not_sendable(problems: list[HistoryProblem], key: str, field: str) -> Failed:
    shown = "; ".join(p.describe(f"$.state.{field}") for p in problems[:3])
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return Failed(
        "not-sendable",
        f"the history of key {key!r} would be refused by a model API: {shown}{more}",
    )


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


# -- the cache: the scan of a settled prefix ------------------------------------
# Only our own frozen Structs with exact str fields, reached through tuples,
# enter the prefix (``_settled``): the scan's view of them cannot change in
# place, so an edit is always a new object, which ``_starts_with`` sees.

_KEEP = 1  # the last message is never cached: an agent replaces it while streaming
_KEYS = 4  # keys one prepare step keeps (a writer usually has one)


def _settled(message: Any) -> bool:
    """Whether the scan's view of ``message`` can never change, and it holds no running result."""
    cls = type(message)
    if cls is ChatMessage:
        calls = message.tool_calls
        return (
            _exact(message.role)
            and _exact(message.tool_call_id)
            and _done(message.status)
            and (message.content is None or type(message.content) is str)
            and (calls is None or (type(calls) is tuple and all(map(_settled_call, calls))))
        )
    if cls is Message:
        content = message.content
        return _exact(message.role) and (
            type(content) is str or (type(content) is tuple and all(map(_settled_block, content)))
        )
    return False


def _settled_call(call: Any) -> bool:
    return type(call) is ToolCall and _exact(call.id)


def _settled_block(block: Any) -> bool:
    cls = type(block)
    if cls is ToolResultBlock:
        return _exact(block.tool_use_id) and _done(block.status)
    return cls is TextBlock or (cls is ToolUseBlock and _exact(block.id))


def _exact(value: object) -> bool:
    """An exact str or None: a str subclass could lie in ``==``."""
    return value is None or type(value) is str


def _done(status: object) -> bool:
    return status is None or (type(status) is str and status != "running")


class _Prefix:
    """The first messages of one key's history, as objects, and their scan."""

    __slots__ = ("messages", "state")

    def __init__(self) -> None:
        self.messages: list[Any] = []
        self.state = ScanState()


def _starts_with(messages: Sequence[Any], prefix: list[Any]) -> bool:
    """Whether ``messages`` starts with ``prefix``: one list ``==`` (in C, identity first),
    ``prefix`` extended with the rest of ``messages`` and trimmed back."""
    count = len(prefix)
    if count == 0 or len(messages) < count:
        return count == 0
    whole = messages if type(messages) is list else list(messages)
    prefix.extend(whole[count:])
    try:
        return whole == prefix
    except Exception:  # a message whose == raises is not the same message
        return False
    finally:
        del prefix[count:]


def _advance(prefix: _Prefix, messages: Sequence[Any]) -> None:
    """Take the settled messages after the prefix into it, up to the last ``_KEEP``, and
    stop where a window ends with calls open: every repair lands after the prefix."""
    state = prefix.state
    start = state.count
    taken = list(messages[start : len(messages) - _KEEP])
    for count, message in enumerate(taken):
        if not _settled(message):
            del taken[count:]
            break
    if taken:
        mark = state.mark()
        feed(state, taken)
        if state.unclosed:  # none before: the first one is in what was just fed
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
        is scanning), it is the plain full scan.  An exception drops the key's
        prefix, which may be half fed.
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
