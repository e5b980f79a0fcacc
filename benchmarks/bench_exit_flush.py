"""Case 4, exit flush: ``flush_sync()`` for the floor's sizes against the floor.

``flush_sync`` is what atexit and the SIGTERM/SIGHUP handlers call: no event
loop, no thread hop; snapshot, encode, digest, join and the durable write on
the calling thread.  Same bytes, same floor, same bar as case 3.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .bench_floor import measure


def main(quick: bool) -> dict[str, Any]:
    report = measure(quick, "flush_sync")
    report.title = "Exit flush: flush_sync() vs the bare recipe"
    return msgspec.to_builtins(report)  # type: ignore[no-any-return]
