"""ADK's own session-service contract tests, run against ``CheckpointSessionService``.

ADK's ``tests/unittests/sessions/test_session_service.py`` holds every
``BaseSessionService`` to the tests that take its ``session_service``
fixture.  Its code is not copied here: set ``ADK_SESSION_TESTS`` to that
file in a checkout of google/adk-python and this module runs those tests
(and only those: the others test ADK's database service itself) with the
fixture below in place of ADK's, on a ``JournalStore`` and a ``FileStore``.
Without it the module is skipped.  Asyncio only, as ADK.
"""

from __future__ import annotations

import ast
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk")

from checkpointer import FileStore, JournalStore
from checkpointer.google_adk import CheckpointSessionService

SOURCE = os.environ.get("ADK_SESSION_TESTS")
if not SOURCE:
    pytest.skip(
        "ADK_SESSION_TESTS names no copy of ADK's test_session_service.py", allow_module_level=True
    )

pytestmark = pytest.mark.anyio


def _contract_tests(path: str) -> dict[str, Any]:
    """The async tests of ``path`` that take ``session_service``, with the module's imports
    (an import that fails here, such as SQLAlchemy for the database-only tests, is left out)."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"), path)
    namespace: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            try:
                exec(compile(ast.Module([node], []), path, "exec"), namespace)
            except ImportError:
                continue
    tests: list[ast.stmt] = [
        node
        for node in tree.body
        if isinstance(node, ast.AsyncFunctionDef)
        and node.name.startswith("test_")
        and any(arg.arg == "session_service" for arg in node.args.args)
    ]
    names = []
    for node in tests:
        assert isinstance(node, ast.AsyncFunctionDef)
        node.decorator_list = []  # pytest-asyncio's marks: anyio's plugin runs them here
        names.append(node.name)
    exec(compile(ast.Module(tests, []), path, "exec"), namespace)
    return {name: namespace[name] for name in names}


globals().update(_contract_tests(SOURCE))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["journal", "file"])
async def session_service(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[CheckpointSessionService]:
    """Our service on a fresh root, in place of ADK's in-memory and database ones."""
    store = JournalStore(tmp_path) if request.param == "journal" else FileStore(tmp_path)
    async with CheckpointSessionService(store) as service:
        yield service
