"""A plain synchronous script whose only checkpoint is the one written at exit.

No event loop, no ``notify()``, no ``close()``: ``writer.open()`` registers an
exit flush, and whenever the script ends (normally, by an exception, Ctrl-C,
SIGTERM or SIGHUP) the writer asks the source for the state and writes it,
durably, marked ``live=False``.  Run it again and it resumes where the file
says.

    python examples/atexit_script.py --items 50      # Ctrl-C or `kill` it, run it again

The price of writing only at exit: ``kill -9`` (or a power cut) skips the
exit flush, so the file keeps what it held when the script started (open()
writes once).  Call ``writer.flush_sync()`` now and then if that is too much
to lose, or use the async writer, whose timer writes as you go.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from checkpointer import CheckpointWriter, FileStore, Snapshot, load


def work(item: int, delay: float) -> dict[str, Any]:
    """Stands for the real work: a request, a file to parse, a model call."""
    time.sleep(delay)
    return {"item": item, "square": item * item}


def main() -> None:
    parser = argparse.ArgumentParser(description="A synchronous script saved at exit.")
    parser.add_argument("--root", default=".checkpoints", help="store directory (%(default)s)")
    parser.add_argument("--key", default="atexit-script", help="key (%(default)s)")
    parser.add_argument("--items", type=int, default=20, help="items in all (%(default)s)")
    parser.add_argument("--delay", type=float, default=0.2, help="seconds per item")
    args = parser.parse_args()

    store = FileStore(args.root)
    previous = load(store, args.key)
    done: list[dict[str, Any]] = previous.state["done"] if previous else []
    if previous is not None:
        print(f"resumed {args.key!r} at item {len(done)} from {store.location(args.key)}")

    writer = CheckpointWriter(
        lambda: Snapshot(args.key, {"done": done}),
        store,
        resume_from=previous,  # what load() found (None: a new session): never replace a newer one
    )
    writer.open()  # never closed: the exit flush writes the last state

    for item in range(len(done), args.items):
        done.append(work(item, args.delay))
        print(f"item {item} done", flush=True)
    print(f"all {args.items} items done; the exit flush writes {store.location(args.key)}")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # exit quietly; atexit still runs and writes
        raise SystemExit(130) from None
