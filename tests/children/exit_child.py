"""A child program for ``tests/reliability/test_exit_hooks.py``: a writer, a real signal.

Run as ``python exit_child.py ROOT GO [options]`` (``--help`` lists them).
The session's state is ``{"n": N}`` under key ``s1`` in ``FileStore(ROOT)``.
The program prints ``READY`` (flushed) when the parent may send its signal,
then waits for the file GO to appear, the parent's "carry on": it then says
``SURVIVED``, notifies one more change (N + 1) and ends normally.  It waits
for GO at most 30 s, then exits with status 99.

``--no-writer`` runs the same program without the writer: the control that
tells what exit status the program has without us.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

import anyio

from checkpointer import CheckpointWriter, FileStore, Limits, Snapshot, load

KEY = "s1"
GO_TIMEOUT = 30.0
NO_GO = 99
SIGNALS = {"TERM": signal.SIGTERM, "HUP": signal.SIGHUP, "INT": signal.SIGINT}


def say(*words: object) -> None:
    print(*words, flush=True)


class Session:
    """The state ``{"n": n}``; notices ``source()`` calls made after READY."""

    def __init__(self) -> None:
        self.n = 0
        self.ready = False
        # Set by a source() call after READY: nothing but a signal flush calls it then.
        self.flush_seen = threading.Event()
        self.on_call: Callable[[], None] | None = None  # one-shot, runs inside source()

    def snapshot(self) -> Snapshot:
        snap = Snapshot(KEY, {"n": self.n})
        if self.ready:
            self.flush_seen.set()
        hook, self.on_call = self.on_call, None
        if hook is not None:
            hook()
        return snap


class HoldStore(FileStore):
    """A FileStore whose next write, once ``hook`` is set, runs it first (in the writing thread)."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.entered = threading.Event()
        self.hook: Callable[[], None] | None = None

    def write(self, key: str, chunks: Sequence[bytes], **kw: Any) -> int:
        hook, self.hook = self.hook, None
        if hook is not None:
            self.entered.set()
            hook()
        return super().write(key, chunks, **kw)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("root")
    p.add_argument("go")
    p.add_argument("--backend", choices=["asyncio", "trio", "uvloop", "sync"], default="asyncio")
    p.add_argument(
        "--scenario",
        choices=["wait", "closed", "reopen", "atexit", "self-kill", "overtake", "late-write"],
        default="wait",
    )
    p.add_argument("--state", choices=["idle", "pending", "inflight"], default="pending")
    p.add_argument("--signal", choices=sorted(SIGNALS), default="TERM")
    p.add_argument("--before", choices=["keep", "default", "ignore", "exit7"], default="default")
    p.add_argument("--after", choices=["none", "chain"], default="none")
    p.add_argument("--exit-code", type=int, default=0)
    p.add_argument("--exit-timeout", type=float, default=5.0)
    p.add_argument("--no-writer", action="store_true")
    return p.parse_args(argv)


# -- signal handlers the application installs ---------------------------------


def previous_handler(signum: int, frame: FrameType | None) -> None:
    say("PREV", signal.Signals(signum).name)
    sys.exit(7)


def install_before(args: argparse.Namespace) -> None:
    signum = SIGNALS[args.signal]
    if args.before == "default":  # the parent may ignore SIGHUP or SIGINT: be explicit
        default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
        signal.signal(signum, default)
    elif args.before == "ignore":
        signal.signal(signum, signal.SIG_IGN)
    elif args.before == "exit7":
        signal.signal(signum, previous_handler)


def install_after(args: argparse.Namespace) -> None:
    """An application handler installed on top of whatever is there; it chains."""
    if args.after != "chain":
        return
    signum = SIGNALS[args.signal]
    below = signal.getsignal(signum)

    def app_handler(signum: int, frame: FrameType | None) -> None:
        say("APP", signal.Signals(signum).name)
        if callable(below):
            below(signum, frame)
        elif below != signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    signal.signal(signum, app_handler)


def handler_name(handler: Any) -> str:
    if handler is signal.SIG_DFL:
        return "default"
    if handler is signal.SIG_IGN:
        return "ignore"
    if handler is None:
        return "none"
    fn = getattr(handler, "func", handler)  # functools.partial
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def say_handlers() -> None:
    say("HANDLERS", *(handler_name(signal.getsignal(s)) for s in SIGNALS.values()))


def say_on_disk(store: FileStore) -> None:
    cp = load(store, KEY)
    say("ONDISK", "none" if cp is None else f"{cp.state['n']} {cp.meta.live}")


# -- hooks run inside a write or inside source() --------------------------------


def hold_for_signal_flush(session: Session) -> None:
    """Keep the write in flight until the signal flush has taken its snapshot."""
    if session.flush_seen.wait(10.0):
        say("OVERLAP")
        time.sleep(0.1)  # let the flush reach the writer's I/O lock


def hold_past_signal_flush(session: Session, store: FileStore) -> None:
    """Finish this (older) write only after the signal flush has written the newer state."""
    session.flush_seen.wait(10.0)
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        cp = load(store, KEY)
        if cp is not None and cp.meta.live is False:
            say("LATE")
            return
        time.sleep(0.01)


def kill_self(session: Session) -> None:
    """A newer change and a SIGTERM to ourselves, in the middle of the current step."""
    session.n = 43
    say("KILL")
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.05)  # the handler runs here, on this thread


# -- the program, async -------------------------------------------------------


def new_writer(
    args: argparse.Namespace, session: Session, store: FileStore
) -> CheckpointWriter[Any]:
    # Long timers: nothing is written unless the program or an exit path asks.
    return CheckpointWriter(
        session.snapshot,
        store,
        debounce=60.0,
        min_interval=60.0,
        max_wait=120.0,
        limits=Limits(exit_timeout=args.exit_timeout),
    )


async def wait_go_async(go: str) -> bool:
    deadline = time.monotonic() + GO_TIMEOUT
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            return False
        await anyio.sleep(0.01)
    return True


def ready(session: Session) -> None:
    say_handlers()
    session.ready = True
    say("READY")


async def run_async(args: argparse.Namespace) -> int:
    session = Session()
    store = HoldStore(args.root)
    writer = None if args.no_writer else new_writer(args, session, store)
    if args.scenario == "closed":
        if writer is not None:
            async with writer:
                install_after(args)
                session.n = 42
                writer.notify()
            session.n = 43
            writer.notify()  # after close: recorded nowhere
        else:
            install_after(args)
        ready(session)
        return 0 if await wait_go_async(args.go) else NO_GO
    if args.scenario == "reopen":  # a first writer, the app's handler on top, then close
        if writer is not None:
            async with new_writer(args, session, store):
                install_after(args)
        else:
            install_after(args)
    async with contextlib.AsyncExitStack() as stack:
        # The same program with and without the writer (a task group only where needed).
        if writer is not None:
            await stack.enter_async_context(writer)
        if args.scenario != "reopen":
            install_after(args)
        session.n = 42
        if writer is not None:
            writer.notify()
            if args.scenario == "overtake":
                session.on_call = lambda: kill_self(session)
                say("RESULT", await writer.write_now())
                say_on_disk(store)
                return 0
            if args.state == "idle":
                await writer.write_now()
        if args.scenario == "late-write" or args.state == "inflight":
            tg = await stack.enter_async_context(anyio.create_task_group())
            done = anyio.Event()
            if writer is not None:
                if args.scenario == "late-write":
                    store.hook = lambda: hold_past_signal_flush(session, store)
                else:
                    store.hook = lambda: hold_for_signal_flush(session)

                async def write() -> None:
                    await writer.write_now()
                    done.set()

                tg.start_soon(write)
                await anyio.to_thread.run_sync(store.entered.wait, 10.0)
                session.n = 43
                writer.notify()
            if args.scenario == "late-write":
                ready(session)
                if writer is not None:
                    with anyio.fail_after(20.0):
                        await done.wait()
                    say_on_disk(store)
                return 0
        ready(session)
        return await carry_on_async(session, writer, args.go)
    raise AssertionError("unreachable")  # mypy: AsyncExitStack may swallow exceptions


async def carry_on_async(session: Session, writer: CheckpointWriter[Any] | None, go: str) -> int:
    if not await wait_go_async(go):
        return NO_GO
    say("SURVIVED")
    session.n += 1
    if writer is not None:
        writer.notify()
    return 0


# -- the program, sync ----------------------------------------------------------


def wait_go_sync(go: str) -> bool:
    deadline = time.monotonic() + GO_TIMEOUT
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def run_sync(args: argparse.Namespace) -> int:
    """The sync writer: ``open()``, then atexit and the signal handlers do the rest."""
    session = Session()
    store = HoldStore(args.root)
    if args.scenario == "reopen" and not args.no_writer:
        first = new_writer(args, session, store).open()
        install_after(args)  # over the first writer's handler; then that writer closes
        first.close()
    writer = None if args.no_writer else new_writer(args, session, store).open()
    if args.scenario != "reopen" or args.no_writer:
        install_after(args)
    session.n = 42
    if writer is not None:
        writer.notify()
    if args.scenario == "atexit":
        if args.exit_code:
            sys.exit(args.exit_code)
        return 0
    if args.scenario == "self-kill":
        if writer is not None:
            store.hook = lambda: kill_self(session)
            writer.flush_sync()
        say("ALIVE")
        return 0
    if args.scenario == "closed":
        if writer is not None:
            writer.close()
        session.n = 43
        if writer is not None:
            writer.notify()
    elif args.state == "idle" and writer is not None:
        writer.flush_sync()
    elif args.state == "inflight":
        if writer is not None:
            store.hook = lambda: hold_for_signal_flush(session)
            threading.Thread(target=writer.flush_sync, daemon=True).start()
            store.entered.wait(10.0)
        session.n = 43
        if writer is not None:
            writer.notify()
    ready(session)
    if not wait_go_sync(args.go):
        return NO_GO
    if args.scenario == "wait":
        say("SURVIVED")
        session.n += 1
        if writer is not None:
            writer.notify()
    return 0  # no close(): atexit writes the last state


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    install_before(args)
    if args.backend == "sync":
        return run_sync(args)
    backend = "trio" if args.backend == "trio" else "asyncio"
    options = {"use_uvloop": True} if args.backend == "uvloop" else {}
    return anyio.run(run_async, args, backend=backend, backend_options=options)


if __name__ == "__main__":
    code = main()
    if code:
        sys.exit(code)
