"""The documentation: the site builds with --strict, and every Python block in it runs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import checkpointer
from checkpointer import langgraph, openai_agents, pydantic_ai
from tests.docblocks import ROOT, pages, python_blocks, run_twice

DOC_PAGES = [p for p in pages() if p.name != "README.md"]


def test_site_builds_strict(tmp_path: Path) -> None:
    """`mkdocs build --strict` succeeds: no broken link, anchor or API reference."""
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or "mkdocs"
    proc = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    site = tmp_path / "site"
    assert (site / "reference" / "api" / "index.html").is_file()
    # The timing page's picture is served beside the page and shown by it; its script is not.
    picture = ROOT / "docs" / "concepts" / "timing.svg"
    assert (site / "concepts" / "timing.svg").read_bytes() == picture.read_bytes()
    assert 'src="../timing.svg"' in (site / "concepts" / "timing" / "index.html").read_text("utf-8")
    assert not (site / "pictures").exists()


@pytest.mark.parametrize("page", DOC_PAGES, ids=lambda p: str(p.relative_to(ROOT / "docs")))
def test_page_python_blocks_run(page: Path, tmp_path: Path) -> None:
    """A docs page's Python blocks run in order in one directory, each twice in a row.

    The second run finds the first one's checkpoints (issue 22: each framework
    page's example asserted a fresh session's length and failed when run again).
    """
    for block in python_blocks(page):
        if block.mode == "run":
            run_twice(block, tmp_path)


def test_few_blocks_are_not_run() -> None:
    """A block that does not run says why, and they are few (the PostgreSQL ones run elsewhere)."""
    blocks = [b for p in pages() for b in python_blocks(p)]
    assert len(blocks) >= 15
    skipped = [b for b in blocks if b.mode == "skip"]
    assert len(skipped) <= 3, [b.where for b in skipped]
    assert all(b.reason for b in skipped)


def _documented_names(page: Path) -> set[str]:
    text = page.read_text(encoding="utf-8")
    return {line.split()[1] for line in text.splitlines() if line.startswith("::: ")}


def test_api_reference_covers_the_public_api() -> None:
    """Every name in checkpointer.__all__ has an entry in the API reference, and every adapter."""
    listed = _documented_names(ROOT / "docs" / "reference" / "api.md")
    assert {f"checkpointer.{n}" for n in checkpointer.__all__} <= listed
    adapters = _documented_names(ROOT / "docs" / "reference" / "adapters.md")
    assert {m.__name__ for m in (openai_agents, pydantic_ai, langgraph)} <= adapters


def test_site_output_is_ignored() -> None:
    """The built site (site/) is not committed: .gitignore names it."""
    ignored = (ROOT / ".gitignore").read_text(encoding="utf-8").split()
    assert "site/" in ignored


def test_readme_links_resolve() -> None:
    """Every relative link of the README names a file of the repository (its anchors, one on it)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    anchors = {_slug(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if "://" in target:
            continue
        path, _, anchor = target.partition("#")
        if path:
            assert (ROOT / path).exists(), f"README links to {target}: no such file"
        else:
            assert anchor in anchors, f"README links to {target}: no such heading"


def _slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_messages_page_says_which_structs_write_their_defaults() -> None:
    """messages.md names the Structs that leave defaults out and those that write them, truly."""
    import msgspec

    from checkpointer.messages import (
        ChatMessage,
        Message,
        ToolCall,
        ToolFunction,
        ToolResultBlock,
        ToolUseBlock,
    )

    text = (ROOT / "docs" / "guides" / "messages.md").read_text(encoding="utf-8")
    assert "`ToolCall`, `ToolFunction` and `ToolUseBlock` write every field" in text
    assert "`ChatMessage`, `Message` and `ToolResultBlock` leave out fields" in text
    enc = msgspec.json.decode
    assert enc(msgspec.json.encode(ToolCall("c", ToolFunction("f")))) == {
        "id": "c",
        "function": {"name": "f", "arguments": "{}"},
        "type": "function",
    }
    assert enc(msgspec.json.encode(ToolUseBlock("u", "n"))) == {
        "type": "tool_use",
        "id": "u",
        "name": "n",
        "input": {},
    }
    assert enc(msgspec.json.encode(ChatMessage("user"))) == {"role": "user"}
    assert enc(msgspec.json.encode(Message("user", "hi"))) == {"role": "user", "content": "hi"}
    assert enc(msgspec.json.encode(ToolResultBlock("u"))) == {
        "type": "tool_result",
        "tool_use_id": "u",
    }


def test_cli_page_names_every_command_and_option() -> None:
    """docs/cli.md names every command and each of its long options (--dsn, --schema, ...)."""
    from checkpointer._cli import _build_parser

    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    _, commands = _build_parser()
    assert "## PostgreSQL roots" in text
    for name, parser in commands.choices.items():
        assert f"`{name}" in text, name
        for option in parser._option_string_actions:
            if option.startswith("--") and option != "--help":
                assert option in text, f"{name} {option}"


def test_journal_files_are_named_jsonl_in_the_docs() -> None:
    """A journal file is `KEY.jsonl` everywhere (never `KEY.journal`)."""
    for page in pages():
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"(KEY|<key>|\{key\})\.journal\b", text), page


def test_readme_ls_columns_are_the_real_ones(tmp_path: Path) -> None:
    """The README's `ls` comment lists the columns `checkpointer ls` prints, in order."""
    from checkpointer import CheckpointWriter, FileStore, Snapshot

    with CheckpointWriter(lambda: Snapshot("k", {"messages": []}), FileStore(tmp_path)):
        pass
    proc = subprocess.run(
        [sys.executable, "-m", "checkpointer", "ls", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    header = proc.stdout.splitlines()[0].replace("UPDATED (UTC)", "UPDATED")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    said = re.search(r"checkpointer ls \S+ +# one row per checkpoint: (.*)", readme)
    assert said is not None
    assert [c.strip() for c in said[1].split(",")] == header.lower().split()


def test_no_store_takes_a_transcript_in_the_docs_or_benchmarks() -> None:
    """The stores lost ``transcript=`` (the writer's applies): no page or benchmark prints it."""
    said = re.compile(r"(File|Journal|Postgres\w*|S3\w*)Store\([^)]*transcript=")
    places = [*pages(), *sorted((ROOT / "benchmarks").glob("*.py"))]
    hits = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in places
        if path.name != "changelog.md"
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if said.search(line)
    ]
    assert not hits


def test_the_changelog_counts_and_lists_the_top_level_names() -> None:
    """The CHANGELOG's "exports N names: ..." is the package's ``__all__``, count and list."""
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    found = re.search(r"`checkpointer` exports (\d+) names: (.*?)\. The rest", text, re.S)
    assert found is not None
    listed = set(re.findall(r"`(\w+)`", found.group(2)))
    assert int(found.group(1)) == len(checkpointer.__all__)
    assert listed == set(checkpointer.__all__)
