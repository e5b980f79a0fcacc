"""The package's layering rules, read from the source with ``ast``: who imports whom, who prints.

The rules are data (the tables below), so the architecture does not depend
on anyone's memory.  A *part* is a module or a subpackage right under
``checkpointer/`` (``_stores`` is every module below ``checkpointer/_stores/``).
Every import is counted: at the top, inside a function, under
``TYPE_CHECKING``.  Each failure names the file, the line, the import and
the rule it breaks.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests._support import ROOT

PACKAGE = ROOT / "checkpointer"

ANY = frozenset({"*"})

MAY_IMPORT: dict[str, frozenset[str]] = {
    # the ground: nothing of ours
    "_version": frozenset(),
    "_text": frozenset(),
    "_values": frozenset(),
    "_schedule": frozenset(),
    "_exit": frozenset(),
    # bytes <-> values, and pure functions over messages
    "_format": frozenset({"_values", "_version"}),
    "_transcript": frozenset({"_values", "_text"}),
    # where checkpoints live: synchronous, never the writer
    "_stores": frozenset({"_values", "_format", "_text", "_exit"}),
    "_load": frozenset({"_values", "_format", "_stores"}),
    # the anyio shell
    "_writer": frozenset(
        {"_values", "_format", "_stores", "_transcript", "_schedule", "_exit", "_text", "_version"}
    ),
    # the per-key committer: the writer's commit core without its schedule
    "_committer": frozenset({"_values", "_stores", "_writer"}),
    # many sessions' writers, opened and closed as they are used, one exit hook
    "_registry": frozenset({"_values", "_stores", "_writer", "_exit", "_text"}),
    # what the framework adapters share: over the public face, as they are
    "_adapters": frozenset({"__init__", "stores", "messages", "summaries", "clock"}),
    # the face and the edge
    "__init__": ANY,
    "stores": ANY,
    "messages": ANY,
    "summaries": ANY,
    "clock": ANY,
    "__main__": ANY,
    "_cli": ANY,
}
"""Each part, and the other parts it may import."""

FACES = frozenset({"__init__", "stores", "messages", "summaries", "clock"})
"""The public face: the package and its public submodules, which re-export private parts."""

ADAPTER_MAY_IMPORT = FACES | {"_adapters"}
"""A framework adapter (any other module without an underscore) imports the public face only,
and ``_adapters`` (what the adapters share), which no other part imports."""

ONLY_FROM_OUTSIDE: dict[str, frozenset[str]] = {
    # the pure timing policy: no clock, no anyio, no I/O
    "_schedule": frozenset({"__future__", "enum", "math", "typing"}),
    # the values: msgspec only
    "_values": frozenset({"__future__", "datetime", "math", "typing", "msgspec"}),
}
"""Parts that may import only these modules from outside the package."""

NEVER_FROM_OUTSIDE: dict[str, frozenset[str]] = {
    "_format": frozenset({"anyio", "trio", "asyncio", "os", "io", "socket", "tempfile", "fcntl"}),
    "_transcript": frozenset(
        {"anyio", "trio", "asyncio", "os", "io", "socket", "tempfile", "fcntl", "time"}
    ),
    "_stores": frozenset({"anyio", "trio", "asyncio"}),  # the Store protocol is synchronous
    "_load": frozenset({"anyio", "trio", "asyncio"}),
}
"""Modules from outside the package that a part never imports."""

PRINTS = frozenset({"_cli", "__main__"})
"""The parts that may print (``print``, ``sys.stdout``, ``sys.stderr``): the CLI and the demo."""

FORWARD: dict[str, tuple[str, ...]] = {
    "_format": ("envelope", "versions", "journal", "summary"),
    "_transcript": (
        "messages",
        "dialects.base",
        "dialects.converse",
        "dialects.chat",
        "dialects.responses",
        "dialects.pydantic_ai",
        "dialects.langchain",
        "dialects.gemini",
        "dialects.claude_code",
        "dialects.detect",
        "dialects",
        "history",
        "repair",
        "fingerprint",
        "prepare",
        "summary",
    ),
    "_stores": (
        "encoding",
        "base",
        "atomic",
        "safefs",
        "flock",
        "envelopes",
        "files",
        "summaries",
        "journal.staging",
        "journal.core",
        "journal.file",
        "postgres.errors",
        "postgres.schema",
        "postgres.connection",
        "postgres.locks",
        "postgres.store",
        "postgres.journal",
        "s3.client",
        "s3.store",
        "s3.journal",
    ),
    "_writer": (
        "clock",
        "keystate",
        "record",
        "commit",
        "timer",
        "lifecycle",
        "service",
        "collapse",
    ),
    "langgraph": ("_log", "_threads", "_saver"),
}
"""Inside a subpackage, a module imports only modules listed before it: the data path
notify -> due -> snapshot -> prepare -> encode -> store goes forward only."""

KNOWN_CYCLES: dict[frozenset[str], str] = {}
"""Import cycles between parts that are known and on their way out (with why)."""

LONG = 500
"""A module longer than this, adapters included, says why at its top (its docstring mentions
"500 lines")."""

EDGE = PRINTS | {"_cli"}
"""Parts the length rule leaves to their own engineer (the CLI is being rewritten)."""


@dataclass(frozen=True)
class Module:
    """A module of the package: its dotted name, its file, its part and its tree."""

    name: str
    path: Path
    part: str
    tree: ast.Module
    lines: int


@functools.cache
def _parse(text: str, filename: str) -> ast.Module:
    return ast.parse(text, filename)


def modules(package: Path, planted: Mapping[str, str] | None = None) -> dict[str, Module]:
    """Every module under ``package`` (a ``checkpointer/`` directory), by dotted name.

    ``planted``: lines added to the end of some files (by path below
    ``package``), to show that a break is reported.
    """
    found: dict[str, Module] = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        name = ".".join(parts)
        part = parts[1] if len(parts) > 1 else "__init__"
        text = path.read_text() + (planted or {}).get(path.relative_to(package).as_posix(), "")
        found[name] = Module(name, path, part, _parse(text, str(path)), len(text.splitlines()))
    return found


def _imports(module: Module, known: dict[str, Module]) -> Iterator[tuple[int, str]]:
    """(line, the module imported) for every import in ``module``, relative ones resolved."""
    is_package = module.path.name == "__init__.py"
    here = module.name if is_package else module.name.rpartition(".")[0]
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                base = ".".join([*base_parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield node.lineno, sub if sub in known else base


def _part_of(name: str) -> str | None:
    """The part a dotted name of the package belongs to; None outside the package."""
    if name != "checkpointer" and not name.startswith("checkpointer."):
        return None
    rest = name.split(".")
    return rest[1] if len(rest) > 1 else "__init__"


def _where(module: Module, package: Path) -> str:
    return f"checkpointer/{module.path.relative_to(package).as_posix()}"


def _prints(tree: ast.Module) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "print":
                yield node.lineno, "print()"
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
            and node.attr in ("stdout", "stderr", "__stdout__", "__stderr__")
        ):
            yield node.lineno, f"sys.{node.attr}"


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def violations(package: Path, planted: Mapping[str, str] | None = None) -> list[str]:
    """Every break of the rules above in ``package`` (a ``checkpointer/`` directory)."""
    known = modules(package, planted)
    broken: list[str] = []
    parts_edges: dict[str, set[str]] = {}
    module_edges: dict[str, set[str]] = {}
    for module in known.values():
        where = _where(module, package)
        part = module.part
        adapter = not part.startswith("_") and part not in FACES
        if not adapter and part not in MAY_IMPORT:
            broken.append(f"{where}: the part {part!r} has no rule: add it to MAY_IMPORT")
            continue
        allowed = ADAPTER_MAY_IMPORT if adapter else MAY_IMPORT[part]
        if adapter:
            rule = "an adapter imports only the public face `checkpointer`"
        else:
            names = ", ".join(sorted(allowed))
            rule = f"{part} may import only {names}" if names else f"{part} imports nothing of ours"
        for line, target in _imports(module, known):
            target_part = _part_of(target)
            if target_part is None:
                top = target.split(".")[0]
                only = ONLY_FROM_OUTSIDE.get(part)
                if only is not None and top not in only:
                    broken.append(
                        f"{where}:{line} imports {target}: {part} may import from outside "
                        f"only {', '.join(sorted(only))}"
                    )
                if top in NEVER_FROM_OUTSIDE.get(part, ()):
                    broken.append(f"{where}:{line} imports {target}: {part} never imports {top}")
                continue
            if target in known and target != module.name:
                module_edges.setdefault(module.name, set()).add(target)
            if target_part == part:
                order = FORWARD.get(part)
                if order is not None:
                    broken.extend(_backward(module, target, order, where, line))
                continue
            parts_edges.setdefault(part, set()).add(target_part)
            if not target_part.startswith("_") and target_part not in FACES and not adapter:
                broken.append(f"{where}:{line} imports {target}: the core never imports an adapter")
            elif target_part == "_adapters" and not adapter:
                broken.append(f"{where}:{line} imports {target}: only an adapter imports _adapters")
            elif allowed is not ANY and target_part not in allowed:
                broken.append(f"{where}:{line} imports {target}: {rule}")
        if part not in PRINTS:
            for line, what in _prints(module.tree):
                broken.append(
                    f"{where}:{line} uses {what}: only {', '.join(sorted(PRINTS))} print "
                    "(a library reports through values and logging)"
                )
        length = module.lines
        docstring = ast.get_docstring(module.tree) or ""
        if part not in EDGE and length > LONG and f"{LONG} lines" not in docstring:
            broken.append(
                f"{where}: {length} lines, over {LONG} without a reason at its top "
                f"(say in the module docstring why it is past {LONG} lines, or split it)"
            )
    for cycle in _cycles(parts_edges):
        if frozenset(cycle) not in KNOWN_CYCLES:
            broken.append(f"the parts {', '.join(cycle)} import each other (a cycle)")
    for cycle in _cycles(module_edges):
        if frozenset(_part_of(name) for name in cycle) not in KNOWN_CYCLES:
            broken.append(f"the modules {', '.join(cycle)} import each other (a cycle)")
    return broken


def _backward(
    module: Module, target: str, order: tuple[str, ...], where: str, line: int
) -> Iterator[str]:
    """A break of ``FORWARD`` by ``module`` importing ``target`` of its own subpackage."""
    prefix = f"checkpointer.{module.part}."
    mine, theirs = module.name.removeprefix(prefix), target.removeprefix(prefix)
    if module.name == f"checkpointer.{module.part}" or target.endswith(".__init__"):
        return
    if theirs in ("journal", "postgres") or mine in ("journal", "postgres"):
        return  # a subpackage's face: docstring only
    if mine not in order:
        yield f"{where}: {module.name} has no place in FORWARD[{module.part!r}]: add it"
        return
    if theirs not in order:
        return  # reported for that module itself
    if order.index(theirs) >= order.index(mine):
        yield (
            f"{where}:{line} imports {target}: inside {module.part} a module imports only "
            f"the ones before it ({' -> '.join(order)}): the data path goes forward only"
        )


def test_the_package_keeps_its_layers() -> None:
    """No part imports what its rule forbids, nothing but the CLI prints, no cycles."""
    broken = violations(PACKAGE)
    assert not broken, "\n".join(broken)


PLANTED = [
    ("_schedule.py", "import anyio\n", "_schedule.py:", "may import from outside only"),
    ("_schedule.py", "import time\n", "imports time:", "may import from outside only"),
    ("_stores/files.py", "from .._writer import service\n", "imports checkpointer._writer", ""),
    ("_transcript/history.py", "from .._stores import base\n", "_transcript may import only", ""),
    ("_transcript/repair.py", "import anyio\n", "_transcript never imports anyio", ""),
    ("_stores/base.py", "import anyio\n", "_stores never imports anyio", ""),
    ("_values.py", "print('x')\n", "uses print()", "only"),
    ("_stores/journal/core.py", "import sys\nsys.stderr.write('x')\n", "uses sys.stderr", ""),
    ("_writer/commit.py", "from . import service\n", "the data path goes forward only", "cycle"),
    ("_format/envelope.py", "from .. import _load\n", "_format may import only", "cycle"),
    ("_exit.py", "from ._writer import service\n", "_exit imports nothing of ours", "cycle"),
    ("openai_agents.py", "from ._writer import service\n", "imports only the public face", ""),
    ("_adapters.py", "from ._writer import commit\n", "_adapters may import only", ""),
    ("_writer/commit.py", "from .. import _adapters\n", "only an adapter imports", ""),
    ("stores.py", "from . import _adapters\n", "only an adapter imports", ""),
]


@pytest.mark.parametrize(("file", "line", "said", "also"), PLANTED)
def test_a_planted_break_is_reported(file: str, line: str, said: str, also: str) -> None:
    """Each rule is enforced: the package with one break planted is refused, naming it."""
    broken = "\n".join(violations(PACKAGE, {file: "\n" + line}))
    assert f"checkpointer/{file}" in broken, broken
    assert said in broken, broken
    assert also in broken, broken


@pytest.mark.parametrize("file", ["_text.py", "openai_agents.py"])
def test_a_long_module_needs_a_reason(file: str) -> None:
    """A module past 500 lines without a reason at its top is refused, an adapter too."""
    broken = violations(PACKAGE, {file: "\n" * LONG})
    assert any(f"checkpointer/{file}" in b and "without a reason" in b for b in broken)
