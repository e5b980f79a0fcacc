"""A summary checkpoint's front matter: the shape ``summary.py`` writes, read here; any
other YAML style by PyYAML when installed (the ``yaml`` extra), else refused."""

from __future__ import annotations

import json
import re
from typing import Any

from .._values import CheckpointError

__all__ = ["front_matter"]

_LINE = re.compile(r"( {2})?([A-Za-z][A-Za-z0-9_]*):(?: (.+))?")
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
_INT = re.compile(r"-?[0-9]+")


def front_matter(lines: list[str], path: str) -> Any:
    """The value of the front matter's lines: a dict in the shape we write, or PyYAML's.

    Raises:
        CheckpointError: another shape and no PyYAML, or not YAML at all.
    """
    ours = _ours(lines)
    if ours is not None:
        return ours
    try:
        import yaml
    except ImportError:
        raise CheckpointError(
            path,
            "the front matter is not in the shape this library writes (re-saved by a YAML "
            "tool?); install PyYAML (pip install 'agent-checkpointer[yaml]') to read it",
        ) from None
    try:
        return yaml.safe_load("".join(line + "\n" for line in lines))
    except yaml.YAMLError as exc:
        raise CheckpointError(path, f"the front matter is not YAML: {exc}") from None
    except (ValueError, RecursionError) as exc:  # a date 2024-13-45, a 5000-digit int, nesting
        why = f"{type(exc).__name__}: {exc}"
        raise CheckpointError(path, f"the front matter's YAML cannot be read: {why}") from None


def _ours(lines: list[str]) -> dict[str, Any] | None:
    """The front matter as ``summary.py`` writes it; None if it is another shape."""
    top: dict[str, Any] = {}
    nested: dict[str, Any] | None = None
    for line in lines:
        match = _LINE.fullmatch(line)
        if match is None:
            return None
        indent, key, raw = match.groups()
        if raw is None:  # "metadata:": a mapping of the lines indented below
            if indent:
                return None
            nested = top[key] = {}
            continue
        if _INT.fullmatch(raw):
            try:
                value: object = int(raw)
            except ValueError:  # past Python's digit limit: no count of ours, PyYAML decides
                return None
        elif _WORD.fullmatch(raw) and raw.lower() not in _YAML_WORDS:
            value = raw
        elif raw.startswith('"'):
            try:
                value = json.loads(raw)  # a JSON string is a YAML double-quoted scalar
            except ValueError:
                return None
            if not isinstance(value, str):
                return None
        else:
            return None
        if indent:
            if nested is None:
                return None
            nested[key] = value
        else:
            nested = None
            top[key] = value
    return top


# Plain words YAML reads as something other than a string: leave those to PyYAML.
_YAML_WORDS = frozenset({"true", "false", "yes", "no", "on", "off", "null", "y", "n"})
