"""A YAML error as a user reads it: 1-based line and column, and a short message; where a key is.

ruamel's own text names ``<unicode string>`` and, for a duplicate key, repeats both values whole
(a rule file's ``rules`` list twice on one line); :func:`describe_yaml_error` says
``duplicate key 'rules' (first at line 3)`` at the second key instead. :func:`key_at` and
:func:`value_at` find a key of a round-trip mapping (merged keys included) in its file.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.constructor import DuplicateKeyError
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.nodes import MappingNode, Node, SequenceNode


def describe_yaml_error(exc: YAMLError, text: str) -> tuple[int | None, int | None, str]:
    """``(line, column, message)`` of a YAML error in ``text`` (line/column 1-based, or ``None``).

    The message starts with ``YAML syntax error:`` (or is ``duplicate key ...``).
    """
    if not isinstance(exc, MarkedYAMLError):
        return None, None, f"YAML syntax error: {exc}"
    mark = exc.problem_mark or exc.context_mark
    line = mark.line + 1 if mark else None
    column = mark.column + 1 if mark else None
    if isinstance(exc, DuplicateKeyError) and exc.problem_mark is not None:
        duplicate = _duplicate_key(text, exc)
        if duplicate is not None:
            key, first_line = duplicate
            return line, column, f"duplicate key {key!r} (first at line {first_line})"
    message = " ".join(s for s in (exc.context, exc.problem) if s) or str(exc)
    return line, column, f"YAML syntax error: {message}"


def _duplicate_key(text: str, exc: MarkedYAMLError) -> tuple[str, int] | None:
    """The duplicated key and the 1-based line of its first occurrence, from the composed nodes."""
    where = exc.problem_mark
    try:
        root = YAML(typ="rt").compose(text)
    except YAMLError:
        return None
    for mapping in _mappings(root):
        keys = [k for k, _ in mapping.value]
        for i, key in enumerate(keys):
            if (key.start_mark.line, key.start_mark.column) != (where.line, where.column):
                continue
            first = next((k for k in keys[:i] if k.tag == key.tag and k.value == key.value), None)
            if first is None:
                return None
            return str(key.value), first.start_mark.line + 1
    return None


def _mappings(node: Node | None) -> Iterator[MappingNode]:
    if isinstance(node, MappingNode):
        yield node
        for key, value in node.value:
            yield from _mappings(key)
            yield from _mappings(value)
    elif isinstance(node, SequenceNode):
        for item in node.value:
            yield from _mappings(item)


def key_at(node: CommentedMap, key: Any) -> tuple[int, int]:
    """0-based (line, column) of ``key`` in ``node``; a key merged in with ``<<: *anchor`` is
    found in its anchor; otherwise the mapping's own position."""
    return _lc_at(node, key, 0)


def value_at(node: CommentedMap, key: Any) -> tuple[int, int]:
    """0-based (line, column) where ``key``'s value starts (see :func:`key_at`)."""
    return _lc_at(node, key, 2)


def _lc_at(node: CommentedMap, key: Any, offset: int, depth: int = 0) -> tuple[int, int]:
    data = node.lc.data or {}
    if key in data:
        return int(data[key][offset]), int(data[key][offset + 1])
    if depth < 8:
        for entry in getattr(node, "merge", None) or ():
            # ruamel.yaml < 0.19 holds (position, mapping) pairs, newer ones the mappings.
            source = entry[1] if isinstance(entry, tuple) else entry
            if isinstance(source, CommentedMap) and key in source:
                return _lc_at(source, key, offset, depth + 1)
    return int(node.lc.line), int(node.lc.col)
