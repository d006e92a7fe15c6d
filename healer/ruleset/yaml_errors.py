"""A YAML error as a user reads it: 1-based line and column, and a short message.

ruamel's own text names ``<unicode string>`` and, for a duplicate key, repeats both values whole
(a rule file's ``rules`` list twice on one line); :func:`describe_yaml_error` says
``duplicate key 'rules' (first at line 3)`` at the second key instead.
"""

from __future__ import annotations

from collections.abc import Iterator

from ruamel.yaml import YAML
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
