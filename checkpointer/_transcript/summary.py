"""Where a summary checkpoint cuts a history, and the context to resume from it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .._values import SummaryCheckpoint
from .dialects import holds_results

__all__ = ["SUMMARY_PREFIX", "resume_context", "safe_watermark"]

SUMMARY_PREFIX = "Summary of the earlier part of this conversation:"
"""How the default summary message of ``resume_context`` starts."""


def resume_context(
    messages: Sequence[Any],
    checkpoint: SummaryCheckpoint | None,
    *,
    make_message: Callable[[str], Any] | None = None,
) -> list[Any]:
    """The context to send on resume: the summary as one message, then the tail.

    Args:
        messages: the whole transcript (as loaded).
        checkpoint: the summary checkpoint, or None (then a copy of
            ``messages`` is returned).
        make_message: builds the summary message from its text; by default
            ``{"role": "user", "content": SUMMARY_PREFIX + "\\n\\n" + summary}``,
            which both message styles accept.

    Raises:
        ValueError: the watermark lies past the end of ``messages`` (the
            transcript is older than the summary: resume from it in full).
    """
    if checkpoint is None:
        return list(messages)
    if checkpoint.watermark > len(messages):
        raise ValueError(
            f"the summary covers messages up to {checkpoint.watermark}, but the transcript "
            f"has {len(messages)}: the transcript is older than the summary; resume from "
            "the full transcript instead"
        )
    text = f"{SUMMARY_PREFIX}\n\n{checkpoint.summary}"
    first = make_message(text) if make_message is not None else {"role": "user", "content": text}
    return [first, *messages[checkpoint.watermark :]]


def safe_watermark(messages: Sequence[Any], keep_last: int) -> int:
    watermark = max(0, len(messages) - keep_last)
    # With keep_last=0 the tail is empty: there is nothing it could start with.
    while 0 < watermark < len(messages) and holds_results(messages[watermark]):
        watermark -= 1
    return watermark
