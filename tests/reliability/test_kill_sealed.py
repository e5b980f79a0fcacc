"""The kill torture with encryption on: sealed files and sealed journal rows lose nothing.

(The power-cut smoke test runs ``--store all``, the sealed stores among them.)
"""

from __future__ import annotations

import pytest

from tests import torture


@pytest.mark.parametrize("store", ["file-sealed", "journal-sealed"])
def test_ten_kills_of_an_encrypted_store_lose_nothing(store: str) -> None:
    """Kills in sealed writes, appends and rewrites: every state loads through the key."""
    summary = torture.run(10, store=store, max_bytes=1 << 20)
    assert summary.losses == 0, "\n".join(summary.lines())
    assert summary.kills == 10 and summary.writes >= 10
