"""The package's size figures: lines, public names, parameters, long functions and modules.

Run from a checkout's root: ``python -m benchmarks.size``.  The adapters are
the framework modules and the helper only they import; the object-storage
stores are counted apart from the rest of the core.
"""

from __future__ import annotations

import ast
import inspect
import pathlib

ADAPTERS = ("openai_agents.py", "pydantic_ai.py", "google_adk.py", "_adapters.py", "langgraph")
OBJECT_STORAGE = ("_stores/s3/",)


def part(path: pathlib.Path) -> str:
    name = path.relative_to("checkpointer").as_posix()
    if name.startswith(ADAPTERS):
        return "adapters"
    return "object storage" if name.startswith(OBJECT_STORAGE) else "core"


def main() -> None:
    lines = {"core": 0, "object storage": 0, "adapters": 0}
    long_functions: list[str] = []
    long_modules: list[str] = []
    for path in sorted(pathlib.Path("checkpointer").rglob("*.py")):
        text = path.read_text()
        count = text.count("\n")
        lines[part(path)] += count
        if count > 500:
            long_modules.append(f"{path} {count}")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > 60:
                    long_functions.append(f"{path}:{node.name} {length}")
    import checkpointer

    params = list(inspect.signature(checkpointer.CheckpointWriter).parameters)
    tests = list(pathlib.Path("tests").rglob("test_*.py"))
    parts = ", ".join(f"{k} {v}" for k, v in lines.items())
    print(f"lines: {parts}, total {sum(lines.values())}")
    print(f"names in checkpointer.__all__: {len(checkpointer.__all__)}")
    print(f"CheckpointWriter parameters: {len(params)} ({', '.join(params)})")
    print(f"functions over 60 lines: {len(long_functions)}: " + "; ".join(long_functions))
    print(f"modules over 500 lines: {len(long_modules)}: " + "; ".join(long_modules))
    print(f"test files: {len(tests)}")


if __name__ == "__main__":
    main()
