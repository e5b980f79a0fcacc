"""``collapse``: a long session summarized (on the event loop) and written (in a thread).

The cut: ``_transcript/summary.py``; the file: ``_stores/summaries.py``.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import anyio

from .._format.summary import not_text
from .._stores.base import check_key
from .._stores.summaries import Root, summary_path, write_summary
from .._text import describe_error
from .._transcript.summary import safe_watermark
from .._values import SummaryCheckpoint, SummaryFailed

__all__ = ["collapse"]


async def collapse(
    summarize: Callable[[list[Any]], Awaitable[str] | str],
    root: Root,
    key: str,
    messages: Sequence[Any],
    *,
    keep_last: int = 20,
) -> SummaryCheckpoint | SummaryFailed | None:
    """Summarize all but the last messages and write the summary checkpoint.

    The watermark is ``len(messages) - keep_last``, moved earlier while it
    would split a tool call from its results (so the tail starts where a
    model API accepts it).  ``summarize`` gets ``messages[:watermark]`` as a
    new list and returns the summary (often a model call; sync or async).

    Args:
        summarize: the caller's function that writes the summary.
        root: the directory (or ``FileStore``) of the session.
        key: the session key.
        messages: the whole transcript.
        keep_last: how many recent messages stay verbatim (at least).

    Returns:
        The ``SummaryCheckpoint`` written; ``SummaryFailed`` (nothing written,
        the exception in it) when ``summarize`` raised or returned no str of
        Unicode text, or the write failed or was refused (sealed checkpoints); None
        when there is nothing to collapse.  Cancellation propagates, nothing written.

    Raises:
        ValueError: a bad key or a negative ``keep_last``.
    """
    check_key(key)
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 0:
        raise ValueError(f"keep_last must be an int >= 0, got {keep_last!r}")
    watermark = safe_watermark(messages, keep_last)
    if watermark == 0:
        return None
    try:
        summary = summarize(list(messages[:watermark]))
        if inspect.isawaitable(summary):
            summary = await summary
    except Exception as exc:
        return _refused(f"summarize() raised {describe_error(exc, width=None)}", exc)
    if not isinstance(summary, str):
        error = f"summarize() returned {type(summary).__name__}, expected str"
        return _refused(error, TypeError(error))
    problem = not_text(summary)
    if problem is not None:
        error = f"summarize() returned a str that cannot be stored: {problem}"
        return _refused(error, ValueError(error))
    checkpoint = SummaryCheckpoint(watermark, summary, datetime.now(UTC), watermark)
    try:
        await anyio.to_thread.run_sync(write_summary, root, key, checkpoint)
    except (OSError, ValueError) as exc:  # ValueError: an encrypted root's, refused
        return SummaryFailed(
            reason="write-failed",
            error=f"cannot write {summary_path(root, key)}: {describe_error(exc, width=None)}",
            exception=exc,
        )
    return checkpoint


def _refused(error: str, exc: BaseException) -> SummaryFailed:
    return SummaryFailed(reason="summarize-failed", error=error, exception=exc)
