"""Case 4, exit flush: ``flush_sync()`` for the floor's sizes against the floor.

``flush_sync`` is what atexit and the SIGTERM/SIGHUP handlers call: no event
loop, no thread hop; snapshot, encode and the durable write (the pieces
handed to ``os.writev``, never joined) on the calling thread.  An unchanged
state is compared byte for byte (a SHA-256 digest only above 64 MiB, which
none of the sizes reaches), so the writer adds neither a digest nor a join
to the floor's work.  Same bytes, same floor, same bar as case 3.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .bench_floor import measure


def main(quick: bool) -> dict[str, Any]:
    report = measure(quick, "flush_sync")
    report.title = "Exit flush: flush_sync() vs the bare recipe"
    return msgspec.to_builtins(report)  # type: ignore[no-any-return]
