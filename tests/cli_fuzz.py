"""Fuzz the command line over hand-edited files: ``ls``, ``show``, ``verify``, ``prune``.

A root of real checkpoint files (written by ``CheckpointWriter`` into a
``FileStore`` and a ``JournalStore``) and real lock files is copied, one
file is damaged the way a person or a tool might damage it (a JSON value
replaced by one of another type or range, a key dropped, a lone surrogate,
the bytes cut or flipped), and every command runs over the copy in this
process.  The rule: no command ever lets an exception out (a traceback for
the user); each ends with a status of 0, 1 or 2.

The smoke run is ``tests/cli/test_fuzz.py``; a long run::

    python -m tests.cli_fuzz --examples 5000
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkpointer import CheckpointWriter, FileStore, JournalStore, Snapshot, _cli
from checkpointer._cli import main

SURROGATE = "@@lone-surrogate@@"  # written to the file as the JSON escape \ud800
HOST = socket.gethostname()


def _chat(turns: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    for n in range(turns):
        call = {"id": f"c{n}", "type": "function", "function": {"name": "grep", "arguments": "{}"}}
        out += [
            {"role": "user", "content": f"task {n}"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{n}", "content": "found"},
            {"role": "assistant", "content": [{"type": "text", "text": f"answer {n}"}]},
        ]
    return out


def _blocks(turns: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for n in range(turns):
        use = {"type": "tool_use", "id": f"t{n}", "name": "grep", "input": {"q": n}}
        result = {"type": "tool_result", "tool_use_id": f"t{n}", "content": "ok"}
        out += [
            {"role": "user", "content": f"task {n}"},
            {"role": "assistant", "content": [{"type": "text", "text": "looking"}, use]},
            {"role": "user", "content": [result]},
            {"role": "assistant", "content": [{"type": "text", "text": f"done {n}"}]},
        ]
    return out


def _write(store: Any, key: str, states: list[Any]) -> None:
    current = [states[0]]
    writer = CheckpointWriter(lambda: Snapshot(key, current[0]), store, exit_hooks=False)
    with writer:
        for state in states[1:]:
            current[0] = state
            writer.flush_sync()


def make_root(root: Path) -> None:
    """The files every example starts from: snapshots, a journal, lock files."""
    _write(FileStore(root), "chat", [{"messages": _chat(2)}])
    _write(FileStore(root), "blocks", [{"messages": _blocks(2)}])
    _write(FileStore(root), "plain", [{"n": 1, "name": "bench"}])
    chat = _chat(3)
    _write(JournalStore(root), "journal", [{"messages": chat[:3]}, {"messages": chat}])
    started = "2026-01-01T00:00:00Z"
    # Stale locks: a pid that is gone on this host; one on another host.
    holder = {"pid": 2**22 + 12345, "host": HOST, "started_at": started}
    (root / "chat.lock").write_bytes(msgspec.json.encode(holder))
    (root / "journal.lock").write_bytes(
        msgspec.json.encode({"pid": 7, "host": "elsewhere", "started_at": started})
    )
    (root / "orphan.lock").write_bytes(b"")


_BASE: dict[str, bytes] = {}


def base() -> dict[str, bytes]:
    """The name and bytes of every file of ``make_root``, made once."""
    if not _BASE:
        with tempfile.TemporaryDirectory() as tmp:
            make_root(Path(tmp))
            for name in sorted(os.listdir(tmp)):
                _BASE[name] = (Path(tmp) / name).read_bytes()
    return _BASE


# -- damage ---------------------------------------------------------------------

LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([0, -1, 2**31, 2**63 - 1, 2**63, 2**64, 10**30])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([1e308, -0.0, 1e-320])
    | st.text(max_size=6)
    | st.sampled_from(
        [
            SURROGATE,
            "",
            "2026-01-01T00:00:00",  # a timestamp without a zone
            "2026-01-01T00:00:00+14:00",
            "0001-01-01T00:00:00Z",
            "9999-12-31T23:59:59Z",
            "0001-01-01T00:00:00+01:00",
            "9999-12-31T23:59:59-01:00",
            "assistant",
            "tool",
            "user",
            "function",
            "tool_use",
            "tool_result",
            "text",
            "running",
        ]
    )
)
VALUES = st.recursive(
    LEAVES,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


def _paths(value: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield at
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*at, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*at, index))


def _replace(value: Any, path: tuple[Any, ...], new: Any, delete: bool) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    copy = dict(value) if isinstance(value, dict) else list(value)
    if delete and not rest:
        del copy[head]
    else:
        copy[head] = _replace(value[head], rest, new, delete)
    return copy


def _encode(value: Any) -> bytes:
    return msgspec.json.encode(value).replace(SURROGATE.encode(), b"\\ud800")


@st.composite
def damaged(draw: st.DrawFn) -> tuple[str, bytes]:
    """One file of the base root, damaged: (its name, its new bytes)."""
    files = base()
    name = draw(st.sampled_from(sorted(files)))
    data = files[name]
    how = draw(st.sampled_from(["value", "value", "value", "delete", "cut", "flip"]))
    if how == "cut":
        return name, data[: draw(st.integers(0, max(len(data) - 1, 0)))]
    if how == "flip":
        if not data:
            return name, b"\xff"
        at = draw(st.integers(0, len(data) - 1))
        return name, data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1 :]
    lines = data.split(b"\n") if name.endswith(".jsonl") else [data]
    which = draw(st.integers(0, len(lines) - 1))
    try:
        doc = msgspec.json.decode(lines[which])
    except msgspec.DecodeError:  # an empty lock file, the journal's last newline
        return name, _encode(draw(VALUES))
    path = draw(st.sampled_from(list(_paths(doc))))
    delete = how == "delete" and bool(path)
    lines[which] = _encode(_replace(doc, path, draw(VALUES), delete))
    return name, b"\n".join(lines)


# -- running the commands ---------------------------------------------------------

COMMANDS: list[list[str]] = [
    ["ls"],
    ["ls", "--json"],
    ["ls", "--sort", "updated"],
    ["ls", "--sort", "turns"],
    ["ls", "--sort", "title"],
    ["verify"],
    ["prune", "--older-than", "0s", "--dry-run"],
]
SHOWS = [[], ["--last", "0"], ["--last", "100"], ["--raw"]]


class Crash(AssertionError):
    """A command let an exception out, or ended with an unknown status."""


def _run(argv: list[str]) -> int:
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")  # strict, as a terminal
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(argv)
            except SystemExit as exc:  # argparse's usage errors
                status = exc.code if isinstance(exc.code, int) else 2
            out.flush()
            err.flush()
    except Exception as exc:
        raise Crash(f"checkpointer {' '.join(argv)}: {type(exc).__name__}: {exc}") from exc
    if status not in (0, 1, 2):
        raise Crash(f"checkpointer {' '.join(argv)}: exit status {status}")
    return status


@contextlib.contextmanager
def _one_parser() -> Iterator[None]:
    """``main`` builds its parser once, not at every command (half the time otherwise)."""
    build = _cli._build_parser
    parser = build()
    _cli._build_parser = lambda: parser
    try:
        yield
    finally:
        _cli._build_parser = build


def run_all(root: Path, *, shows: list[list[str]] = SHOWS) -> None:
    """Every command over ``root``, prune (which removes files) last."""
    with _one_parser():
        _run_all(root, shows)


def _run_all(root: Path, shows: list[list[str]]) -> None:
    for command in COMMANDS:
        _run([*command, str(root)])
    keys = sorted({name.rpartition(".")[0] for name in os.listdir(root)})
    for key in keys:
        for extra in shows:
            _run(["show", str(root), key, *extra])
    _run(["prune", str(root), "--older-than", "0s"])
    _run(["ls", str(root)])


def _renamed(name: str, data: bytes, key: str) -> tuple[str, bytes]:
    """The file ``name`` as key ``key``'s: its name, and the key in its meta."""
    old, _, suffix = name.partition(".")
    return f"{key}.{suffix}", data.replace(
        b'"key":"%s"' % old.encode(), b'"key":"%s"' % key.encode()
    )


def check(cases: list[tuple[str, bytes]], *, shows: list[list[str]] = SHOWS) -> None:
    """Put each damaged file in a fresh copy of the base root and run every command over it.

    All the cases go in one root, each under a key of its own (``case-N``);
    on a crash, each case is run alone to name the one that crashes.
    """
    try:
        _check_root(cases, shows)
    except Crash as exc:
        if len(cases) == 1:
            name, data = cases[0]
            raise Crash(f"{exc}\n  damaged {name}: {data[:2000]!r}") from exc
        for case in cases:
            check([case], shows=shows)
        raise


def _check_root(cases: list[tuple[str, bytes]], shows: list[list[str]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        for name, content in base().items():
            (root / name).write_bytes(content)
        for n, (name, data) in enumerate(cases):
            key = f"case-{n}"
            renamed, content = _renamed(name, data, key)
            (root / renamed).write_bytes(content)
            if renamed.endswith(".lock"):  # a lock is looked at for its key's checkpoint
                (root / f"{key}.json").write_bytes(
                    _renamed("chat.json", base()["chat.json"], key)[1]
                )
        run_all(root, shows=shows)


SWEEP_VALUES: list[Any] = [
    None,
    True,
    0,
    -1,
    2**31,
    2**63,
    2**64,
    10**30,
    1.5,
    1e308,
    "",
    "x",
    SURROGATE,
    "2026-01-01T00:00:00",
    "0001-01-01T00:00:00+01:00",
    "9999-12-31T23:59:59-01:00",
    [],
    [None],
    {},
    {"x": None},
]


def sweep(
    values: list[Any] = SWEEP_VALUES, files: list[str] | None = None
) -> Iterator[tuple[str, bytes]]:
    """Every JSON value of every base file replaced by each of ``values``, and deleted."""
    for name, data in base().items():
        if files is not None and name not in files:
            continue
        lines = data.split(b"\n") if name.endswith(".jsonl") else [data]
        for which, line in enumerate(lines):
            try:
                doc = msgspec.json.decode(line)
            except msgspec.DecodeError:
                continue
            for path in _paths(doc):
                for value in [*values, _DELETE] if path else values:
                    changed = list(lines)
                    changed[which] = _encode(_replace(doc, path, value, value is _DELETE))
                    yield name, b"\n".join(changed)


_DELETE = object()


def run_sweep(values: list[Any] = SWEEP_VALUES, *, batch: int = 200, **kw: Any) -> int:
    """``sweep`` in batches of ``batch`` files a root; returns the number of cases."""
    cases = list(sweep(values, **kw))
    for start in range(0, len(cases), batch):
        check(cases[start : start + batch], shows=[[]])
    return len(cases)


def fuzz(examples: int) -> None:
    """Run ``examples`` damaged roots; raises ``Crash`` (shrunk) on the first crash."""

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.lists(damaged(), min_size=1, max_size=20))
    def some(cases: list[tuple[str, bytes]]) -> None:
        check(cases)

    some()


def main_(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cli_fuzz", description=__doc__)
    parser.add_argument("--examples", type=int, default=500, help="random roots (%(default)s)")
    args = parser.parse_args(argv)
    swept = run_sweep()
    print(f"sweep: {swept} damaged files, every value replaced or deleted: no command crashed")
    fuzz(args.examples)
    print(f"random: {args.examples} roots of up to 20 damaged files: no command crashed")
    return 0


if __name__ == "__main__":
    sys.exit(main_())
