"""The command line's layering, read from the source (``ast``), not from memory.

``checkpointer/_cli/`` is the one package that prints (the library outside
it never does), and inside it only ``report.py`` writes to stdout or stderr;
only ``roots.py`` and ``directory.py`` import the library's private modules;
its modules import each other without a cycle; and nothing outside it
imports it but ``__main__``.  The built distribution holds every subpackage.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from tests._support import ROOT

PACKAGE = ROOT / "checkpointer"
CLI = PACKAGE / "_cli"


def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def imported(path: Path) -> set[str]:
    """The absolute names of the modules ``path`` imports (relative ones resolved)."""
    package = list(path.relative_to(ROOT).parts[:-1])  # an __init__.py's is its own
    names: set[str] = set()
    for node in ast.walk(tree(path)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names.add(module)
            if node.module is None or node.level:  # `from . import ls`: submodules
                names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def test_only_report_writes_to_stdout_or_stderr() -> None:
    """Inside _cli/, print() and sys.stdout / sys.stderr appear in report.py only."""
    for path in sorted(CLI.glob("*.py")):
        if path.name == "report.py":
            continue
        for node in ast.walk(tree(path)):
            if isinstance(node, ast.Name):
                assert node.id != "print", f"{path.name}:{node.lineno}: print"
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                name = f"{node.value.id}.{node.attr}"
                assert name not in ("sys.stdout", "sys.stderr"), f"{path.name}:{node.lineno}"


_LEFT_TO_DELETE: set[tuple[str, str]] = set()  # (file, function) allowed to print for now


def test_the_library_outside_the_cli_never_prints() -> None:
    """No module of checkpointer/ outside _cli/ calls print() or writes to sys.stdout/stderr."""
    for path in sorted(PACKAGE.rglob("*.py")):
        if CLI in path.parents:
            continue
        module = tree(path)
        skipped = {
            id(inner)
            for node in ast.walk(module)
            if isinstance(node, ast.FunctionDef) and (path.name, node.name) in _LEFT_TO_DELETE
            for inner in ast.walk(node)
        }
        for node in ast.walk(module):
            if id(node) in skipped:
                continue
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}"
            assert not (isinstance(node, ast.Name) and node.id == "print"), where
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                assert f"{node.value.id}.{node.attr}" not in ("sys.stdout", "sys.stderr"), where


# roots.py, the seam (the stores, the dialects); directory.py, a store directory's
# files, lock files and side files, reached through safefs.
SEAMS = ("roots.py", "directory.py")


def test_only_roots_imports_private_library_modules() -> None:
    """_cli/ uses the public API (``checkpointer``), but in roots.py and directory.py."""
    for path in sorted(CLI.glob("*.py")):
        private = {
            name
            for name in imported(path)
            if name.startswith("checkpointer._")
            and not name.startswith(("checkpointer._cli", "checkpointer.__"))  # __version__
        }
        if path.name in SEAMS:
            assert private, f"{path.name} is where the private modules are imported"
        else:
            assert not private, f"{path.name} imports {sorted(private)}"


def test_cli_modules_import_each_other_without_a_cycle() -> None:
    """The modules of _cli/ form no import cycle (as _cli and _pgcli once did)."""
    modules = {f"checkpointer._cli.{p.stem}": p for p in CLI.glob("*.py") if p.stem != "__init__"}
    graph = {name: imported(path) & modules.keys() for name, path in modules.items()}
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, " -> ".join([*path, name])
        if name not in done:
            for other in sorted(graph[name]):
                visit(other, (*path, name))
            done.add(name)

    for name in sorted(graph):
        visit(name, ())


def test_nothing_outside_the_cli_imports_it() -> None:
    """Only __main__ imports checkpointer._cli: the library never reaches into its CLI."""
    for path in sorted(PACKAGE.rglob("*.py")):
        if CLI in path.parents or path.name == "__main__.py":
            continue
        names = imported(path)
        assert not any(n.startswith("checkpointer._cli") for n in names), path


def test_the_distribution_holds_every_subpackage() -> None:
    """pyproject's wheel takes in checkpointer/ whole: each directory with an __init__.py.

    (tests/docs/test_install.py checks the wheel's file list itself.)
    """
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    packages = config["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    for init in sorted(PACKAGE.rglob("__init__.py")):
        name = init.parent.relative_to(ROOT).as_posix()
        assert any(name == p or name.startswith(p + "/") for p in packages), f"{name} not packaged"
