"""Summary checkpoints re-saved by the real YAML libraries, in every style they write, load.

The docs promise that a summary edited by hand or re-saved by a YAML tool
still loads, with PyYAML installed (the ``yaml`` extra), and that without it
the error says so.  Each test writes a summary with ``write_summary``, loads
its front matter with PyYAML or ruamel.yaml, dumps it again in one of the
library's styles (flow mappings, quoted keys and values, literal and folded
block scalars, tags, directives, document markers, lines wrapped narrow),
and checks that ``load_summary`` gives back what was written.
"""

from __future__ import annotations

import io
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from ruamel.yaml import YAML
from ruamel.yaml.scalarstring import (
    DoubleQuotedScalarString,
    FoldedScalarString,
    LiteralScalarString,
    SingleQuotedScalarString,
)

from checkpointer import CheckpointError
from checkpointer.summaries import SummaryCheckpoint, load_summary, write_summary

WHEN = datetime(2025, 5, 1, 12, 30, 15, 123456, tzinfo=UTC)
BODY = "Body: with: colons # and hash\n- a dash\n'quotes' \"dq\"\n---\nZürich 🚀\n"
KEYS = ["session-42", "yes", "123", "k" * 200, "a-" * 100]  # YAML retypes, long lines


def front_and_body(path: Path) -> tuple[str, str]:
    front, body = path.read_text(encoding="utf-8")[4:].split("\n---\n", 1)
    return front, body


def written(tmp_path: Path, key: str) -> tuple[Path, SummaryCheckpoint]:
    checkpoint = SummaryCheckpoint(120, BODY, WHEN, 118)
    return Path(write_summary(tmp_path, key, checkpoint)), checkpoint


PYYAML_STYLES: dict[str, dict[str, Any]] = {
    "flow": {"default_flow_style": True},
    "flow-narrow": {"default_flow_style": True, "width": 20},
    "flow-inner (PyYAML<5.1)": {"default_flow_style": None},
    "double-quoted": {"default_style": '"'},
    "single-quoted": {"default_style": "'"},
    "literal": {"default_style": "|"},
    "folded": {"default_style": ">"},
    "canonical": {"canonical": True},
    "directive": {"version": (1, 1)},
    "explicit-start": {"explicit_start": True},
    "explicit-end": {"explicit_end": True},
    "wrapped-at-10": {"width": 10, "indent": 4},
    "crlf": {"line_break": "\r\n"},
}


@pytest.mark.parametrize("style", PYYAML_STYLES.values(), ids=PYYAML_STYLES.keys())
@pytest.mark.parametrize("key", KEYS)
def test_a_summary_resaved_by_pyyaml_in_any_style_loads(
    tmp_path: Path, key: str, style: dict[str, Any]
) -> None:
    """yaml.safe_load, then yaml.safe_dump in that style: load_summary reads what was written."""
    path, checkpoint = written(tmp_path, key)
    front, body = front_and_body(path)
    dumped = yaml.safe_dump(yaml.safe_load(front), **style)
    opening = "" if dumped.startswith("---") else "---\n"  # the dump may open its document
    path.write_bytes((opening + dumped + "---\n" + body).encode("utf-8"))
    assert load_summary(tmp_path, key) == checkpoint


def ruamel_round_trip(data: Any, front: str) -> Any:
    return data


def ruamel_block_scalars(data: Any, front: str) -> Any:
    data["description"] = FoldedScalarString(data["description"])
    data["name"] = LiteralScalarString(data["name"] + "\n")
    return data


def ruamel_quoted(data: Any, front: str) -> Any:
    data["name"] = SingleQuotedScalarString(data["name"])
    data["metadata"]["type"] = DoubleQuotedScalarString("checkpoint")
    return data


RUAMEL_STYLES = {
    "round-trip": ({}, ruamel_round_trip),
    "round-trip-narrow": ({"width": 12}, ruamel_round_trip),
    "flow": ({"default_flow_style": True}, ruamel_round_trip),
    "block-scalars": ({}, ruamel_block_scalars),
    "quoted": ({"indent": 4}, ruamel_quoted),
    "explicit-start-end": ({"explicit_start": True, "explicit_end": True}, ruamel_round_trip),
}


@pytest.mark.parametrize("style", RUAMEL_STYLES.values(), ids=RUAMEL_STYLES.keys())
@pytest.mark.parametrize("key", KEYS)
def test_a_summary_resaved_by_ruamel_yaml_in_any_style_loads(
    tmp_path: Path, key: str, style: tuple[dict[str, Any], Any]
) -> None:
    """ruamel.yaml (round trip) loads, edits the style of, and dumps it: load_summary reads it."""
    options, restyle = style
    path, checkpoint = written(tmp_path, key)
    front, body = front_and_body(path)
    y = YAML()
    y.preserve_quotes = True
    for name, value in options.items():
        if name == "indent":
            y.indent(mapping=value, sequence=value, offset=0)
        else:
            setattr(y, name, value)
    out = io.StringIO()
    y.dump(restyle(y.load(front), front), out)
    dumped = out.getvalue()
    opening = "" if dumped.startswith("---") else "---\n"
    path.write_text(opening + dumped + "---\n" + body, encoding="utf-8")
    assert load_summary(tmp_path, key) == checkpoint


def test_a_hand_edit_in_block_scalars_and_flow_reads_as_yaml_does(tmp_path: Path) -> None:
    """Literal and folded scalars with chomping, a flow mapping over lines, tags: YAML's values."""
    front = (
        "name: |+\n  kept\n\n"
        "description: >-\n  folded\n  words\n\n  new paragraph\n"
        "extra: !!str 007\n"
        "metadata: { type: checkpoint, watermark: !!int '4',\n"
        "  createdAt: 2025-05-01T12:30:15.123456+00:00,   # a comment\n"
        "  coveredMessages: 3 }\n"
    )
    from checkpointer._format.frontmatter import front_matter

    ours = front_matter(front.splitlines(), "front matter")
    theirs = yaml.safe_load(front)
    assert {k: ours[k] for k in ("name", "description", "extra")} == {
        k: theirs[k] for k in ("name", "description", "extra")
    }
    path = Path(write_summary(tmp_path, "s", SummaryCheckpoint(4, "body\n", WHEN, 3)))
    path.write_text("---\n" + front + "---\nbody\n", encoding="utf-8")
    assert load_summary(tmp_path, "s") == SummaryCheckpoint(4, "body\n", WHEN, 3)


BLOCKS = [
    "v: |\n  a\n   b\n\n  c\n",
    "v: |-\n  a\n  b\n\n\n",
    "v: |+\n  a\n\n\n",
    "v: >\n  a\n  b\n\n  c\n   d\n  e\n",
    "v: >-\n\n  a\n  b\n",
    "v: >2\n   a\n  b\n",
    "v: |\n  # not a comment\n  x\nw: 1\n",
    "v: {a: [1, two, 'x y'], b: \"q\"}\n",
    "? v\n: plain\n  over lines\n",
]


@pytest.mark.parametrize("text", BLOCKS)
def test_a_front_matter_with_block_scalars_and_flow_nodes_loads(tmp_path: Path, text: str) -> None:
    """Extra fields a person added in any YAML style (block scalars, flow nodes) still load."""
    path = Path(write_summary(tmp_path, "s", SummaryCheckpoint(4, "body\n", WHEN, 3)))
    front, body = front_and_body(path)
    path.write_text("---\n" + text + front + "\n---\n" + body, encoding="utf-8")
    assert load_summary(tmp_path, "s") == SummaryCheckpoint(4, "body\n", WHEN, 3)


def test_another_style_without_pyyaml_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No PyYAML: our own shape loads; a re-saved style is a CheckpointError naming the extra."""
    monkeypatch.setitem(sys.modules, "yaml", None)
    path, checkpoint = written(tmp_path, "s")
    assert load_summary(tmp_path, "s") == checkpoint
    front, body = front_and_body(path)
    path.write_text("---\n" + front.replace("metadata:", "metadata:  ") + "\n---\n" + body)
    with pytest.raises(CheckpointError, match=r"agent-checkpointer\[yaml\]"):
        load_summary(tmp_path, "s")
