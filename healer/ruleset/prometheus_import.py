"""Prometheus rule files as healer rules: the exact inverse of :mod:`healer.ruleset.export`.

A rule file whose rules are Prometheus's (``alert:`` or ``record:``, :func:`is_prometheus_file`)
is read as the healer rule file it stands for (:func:`healer_view`); the loader then checks that
as any other, and each problem names the key of the Prometheus file it comes from
(:meth:`PrometheusView.field`). An alerting rule is the healer rule::

    alert                               name
    expr, for, keep_firing_for          the same
    labels.severity                     severity, when critical, warning or info (default critical);
                                        another value (page, P1) stays a label, and healer's
                                        severity is annotations.healer_severity
    annotations.healer_severity         severity (then labels.severity is a label like any other)
    labels, the others                  labels
    annotations, the others             annotations
    annotations.healer_actions          actions: "quarantine, drain: {timeout: 1h}, ticket"
    annotations.healer_<key>            the other keys of export.HEALER_ANNOTATIONS

- A list or mapping annotation is a YAML flow sequence or mapping; its brackets may be left out.
- An alerting rule without ``healer_actions`` acts on nothing: its findings are recorded and shown,
  and no node is touched. healer never quarantines for a rule that does not say so.
- ``labels.healer_rule`` (export writes it) must be the alert's name; ``healer_rule_digest`` is
  dropped (:attr:`PrometheusView.digests`: the loader warns when it is not the rule's).
- A recording rule (``record``, ``expr``, ``labels``) goes to its group's ``records``
  (:class:`~healer.ruleset.schema.RecordingRule`).
- Problems: a key Prometheus's rule format does not have, a healer key written as a rule key
  (``actions:``, a healer rule's ``name:`` among Prometheus rules), a key healer does not
  support (a group's ``limit``, ``query_offset``, ``labels``), an unknown ``healer_``
  annotation, a rule with both ``alert`` and ``record``; the schema reports the rest (a rule
  without ``alert`` or ``record`` is an alerting rule missing its ``alert``).

Pure: works on ruamel round-trip trees, whose positions the view keeps.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError
from ruamel.yaml.events import (
    AliasEvent,
    CollectionEndEvent,
    CollectionStartEvent,
    NodeEvent,
)

from healer.ruleset.export import DIGEST_ANNOTATION, HEALER_ANNOTATIONS, RULE_LABEL
from healer.ruleset.yaml_errors import describe_yaml_error, key_at, value_at

#: healer's severities; a rule's ``labels.severity`` of another value is an organisation's own.
SEVERITIES = ("critical", "warning", "info")

#: A problem found while reading: 1-based line and column, the field path, the message.
Problem = tuple[int, int, str, str]

_ALERT_KEYS = ("alert", "expr", "for", "keep_firing_for", "labels", "annotations")
_RECORD_KEYS = ("record", "expr", "labels")
_GROUP_KEYS = ("name", "interval", "rules")
#: Keys of Prometheus's rule format that healer does not evaluate: refused, not silently dropped.
_UNSUPPORTED = {
    "limit": "Prometheus's limit on a group's alerts is not supported by healer: leave it out",
    "query_offset": "query_offset is not supported by healer: leave it out",
    "labels": "group labels are not supported by healer: put them on each rule",
    "pool": "a Prometheus rule group has no pool: give its rules the annotation healer_pool",
}
#: healer's own keys written as keys of a Prometheus rule.
_HINTS = {
    **{
        key: f"in a Prometheus rule file healer's {key!r} is the annotation {annotation}"
        for key, (annotation, _) in HEALER_ANNOTATIONS.items()
    },
    "name": "a Prometheus rule file names an alerting rule with 'alert:'",
    "severity": "a Prometheus rule's severity is its label (labels: {severity: critical}) or the "
    "annotation healer_severity",
}
_BY_ANNOTATION = {annotation: (key, shape) for key, (annotation, shape) in HEALER_ANNOTATIONS.items()}
#: A key of healer's rule → where it is in a Prometheus alerting rule.
_PROMETHEUS_KEY = {
    "name": "alert",
    "severity": "labels.severity",
    **{key: f"annotations.{annotation}" for key, (annotation, _) in HEALER_ANNOTATIONS.items()},
}
_VIEW_PATH = re.compile(r"^groups\[(\d+)\]\.(rules|records)(?:\[(\d+)\](?:\.(\w+))?)?(.*)$")
#: Deepest nesting of an annotation's YAML (an action's options are 3 levels).
_MAX_ANNOTATION_DEPTH = 8


def is_prometheus_rule(rule: object) -> bool:
    """Whether a rule mapping is Prometheus's (it has ``alert`` or ``record``)."""
    return isinstance(rule, dict) and ("alert" in rule or "record" in rule)


def is_prometheus_file(tree: object) -> bool:
    """Whether a parsed rule file is a Prometheus rule file: any rule of it is Prometheus's."""
    return any(is_prometheus_rule(rule) for _, _, rule in _rules(tree))


@dataclass
class PrometheusView:
    """A Prometheus rule file read as healer's format.

    ``tree``: the healer rule file, each key at the place of what it was read from. ``problems``:
    found while reading. ``records``: where each recording rule is (line, column, field of its
    ``record`` key). ``digests``: (group index, index among the group's alerting rules,
    ``healer_rule_digest``, line, column) of each rule that has one.
    """

    tree: CommentedMap
    problems: list[Problem] = field(default_factory=list)
    records: list[tuple[int, int, str]] = field(default_factory=list)
    digests: list[tuple[int, int, str, int, int]] = field(default_factory=list)
    #: (group, "rules" or "records", index in the view) → the rule's index in the file.
    index: dict[tuple[int, str, int], int] = field(default_factory=dict)

    def field(self, path: str) -> str:
        """A field path of the view (``groups[0].rules[1].actions[2]``) as the file has it
        (``groups[0].rules[3].annotations.healer_actions[2]``)."""
        match = _VIEW_PATH.match(path)
        if match is None:
            return path
        group, which, item, key, rest = match.groups()
        if item is None:
            return f"groups[{group}].rules{rest}"
        rule = f"groups[{group}].rules[{self.index.get((int(group), which, int(item)), item)}]"
        if key is None:
            return rule + rest
        return f"{rule}.{_PROMETHEUS_KEY.get(key, key) if which == 'rules' else key}{rest}"


def healer_view(tree: CommentedMap) -> PrometheusView:
    """The healer rule file that the Prometheus rule file ``tree`` stands for (module docstring)."""
    view = PrometheusView(tree=_like(tree))
    reader = _Reader(view)
    for key in tree:
        value = tree[key]
        if key == "groups" and isinstance(value, CommentedSeq):
            value = reader.groups(value)
        _put(view.tree, key, value, tree, key)  # other keys: the schema reports them
    return view


def annotation_value(shape: Literal["list", "mapping", "text"], text: str) -> Any:
    """The value of a healer annotation: ``text`` as it is; a ``list`` or ``mapping`` as the YAML
    flow collection it writes (brackets optional), as round-trip nodes.

    Raises:
        ValueError: not such a collection, or one with anchors, aliases or deeper than 8 levels.
    """
    if shape == "text":
        return text
    body = text.strip()
    opening, closing = ("[", "]") if shape == "list" else ("{", "}")
    if not body.startswith(opening):
        body = f"{opening}{body}{closing}"
    what = f"a YAML flow {'list' if shape == 'list' else 'mapping'}"
    yaml = YAML(typ="rt")
    try:
        depth = 0
        for event in yaml.parse(body):
            if isinstance(event, AliasEvent) or (isinstance(event, NodeEvent) and event.anchor):
                raise ValueError(f"{what} without anchors or aliases")
            depth += isinstance(event, CollectionStartEvent) - isinstance(event, CollectionEndEvent)
            if depth > _MAX_ANNOTATION_DEPTH:
                raise ValueError(f"{what} nested at most {_MAX_ANNOTATION_DEPTH} levels")
        try:
            value = yaml.load(body)
        except (ValueError, TypeError, OverflowError) as exc:  # a constructor on a tagged value (`!!int x`)
            raise ValueError(f"not {what}: {type(exc).__name__}: {exc}") from exc
    except YAMLError as exc:
        _, column, message = describe_yaml_error(exc, body)
        raise ValueError(f"not {what}: {message} (column {column} of {body!r})") from exc
    if not isinstance(value, CommentedSeq if shape == "list" else CommentedMap):
        raise ValueError(f"not {what}: {body!r}")
    return value


# --- reading --------------------------------------------------------------------------------------


class _Reader:
    def __init__(self, view: PrometheusView) -> None:
        self.view = view

    def problem(self, node: CommentedMap, key: Any, where: str, message: str, *, value: bool = False) -> None:
        line, column = (value_at if value else key_at)(node, key)
        self.view.problems.append((line + 1, column + 1, where, message))

    def groups(self, groups: CommentedSeq) -> CommentedSeq:
        out: CommentedSeq = _like(groups)
        for i, group in enumerate(groups):
            out.append(self.group(i, group) if isinstance(group, CommentedMap) else group)
            _place_item(out, i, groups, i)
        return out

    def group(self, i: int, group: CommentedMap) -> CommentedMap:
        out: CommentedMap = _like(group)
        for key in group:
            if key in ("name", "interval") or (key == "rules" and not isinstance(group[key], CommentedSeq)):
                _put(out, key, group[key], group, key)
            elif key == "rules":
                alerts, records = self.rules(i, group[key])
                if records:
                    _put(out, "records", records, group, key)
                _put(out, "rules", alerts, group, key)
            else:
                self.problem(group, key, f"groups[{i}].{key}", _unknown(key, _GROUP_KEYS, _UNSUPPORTED))
        return out

    def rules(self, i: int, rules: CommentedSeq) -> tuple[CommentedSeq, CommentedSeq]:
        """The group's alerting rules and recording rules: a rule with ``record`` (and no ``alert``)
        is a recording rule, every other mapping an alerting rule (a rule missing ``alert``, a
        healer rule's keys: each reported by the schema or :meth:`rule`)."""
        alerts, records = _like(rules), _like(rules)
        for j, rule in enumerate(rules):
            where = f"groups[{i}].rules[{j}]"
            if not isinstance(rule, CommentedMap):  # the schema reports it ("expected a mapping")
                target, item = alerts, rule
            elif "record" in rule and "alert" not in rule:
                target, item = records, self.rule(rule, where, _RECORD_KEYS)
                line, column = key_at(rule, "record")
                self.view.records.append((line + 1, column + 1, f"{where}.record"))
            else:
                if "record" in rule:
                    self.problem(
                        rule, "record", f"{where}.record", "a rule has 'alert' or 'record', not both"
                    )
                target, item = alerts, self.rule(rule, where, _ALERT_KEYS, index=(i, len(alerts)))
            which = "rules" if target is alerts else "records"
            self.view.index[(i, which, len(target))] = j
            target.append(item)
            _place_item(target, len(target) - 1, rules, j)
        return alerts, records

    def rule(
        self, rule: CommentedMap, where: str, allowed: tuple[str, ...], index: tuple[int, int] | None = None
    ) -> CommentedMap:
        """The rule as healer's (an alerting rule: ``index`` is its group and place among them)."""
        out: CommentedMap = _like(rule)
        recording = index is None
        for key in rule:
            if key == "record" and not recording:
                continue  # reported by rules(): a rule with both
            if key not in allowed:
                hint = (
                    f"a recording rule has no {key!r} (Prometheus refuses it)"
                    if recording and key in _ALERT_KEYS
                    else None
                )
                self.problem(rule, key, f"{where}.{key}", hint or _unknown(key, allowed, _HINTS))
            elif key == "alert":
                _put(out, "name", rule[key], rule, key)
            elif key == "labels" and not recording and isinstance(rule[key], CommentedMap):
                self.labels(out, rule, where)
            elif key == "annotations" and index is not None and isinstance(rule[key], CommentedMap):
                self.annotations(out, rule, where, index)
            else:
                _put(out, key, rule[key], rule, key)
        return out

    def labels(self, out: CommentedMap, rule: CommentedMap, where: str) -> None:
        labels = rule["labels"]
        rest = _like(labels)
        own = "healer_severity" in (rule.get("annotations") or {})
        for key in labels:
            if key == "severity" and not own and labels[key] in SEVERITIES:
                _put(out, "severity", labels[key], labels, key)
            elif key == RULE_LABEL:
                if labels[key] != rule.get("alert"):
                    self.problem(
                        labels,
                        key,
                        f"{where}.labels.{key}",
                        f"must be the alert's name {rule.get('alert')!r} (healer rules export writes it), "
                        f"not {labels[key]!r}",
                    )
            else:
                _put(rest, key, labels[key], labels, key)
        _put(out, "labels", rest, rule, "labels")

    def annotations(self, out: CommentedMap, rule: CommentedMap, where: str, index: tuple[int, int]) -> None:
        annotations = rule["annotations"]
        rest = _like(annotations)
        for key in annotations:
            value = annotations[key]
            here = f"{where}.annotations.{key}"
            if key == DIGEST_ANNOTATION:
                if isinstance(value, str):
                    line, column = key_at(annotations, key)
                    self.view.digests.append((*index, value, line + 1, column + 1))
            elif not (isinstance(key, str) and key.startswith("healer_")):
                _put(rest, key, value, annotations, key)
            elif key not in _BY_ANNOTATION:
                known = [*_BY_ANNOTATION, DIGEST_ANNOTATION]
                close = difflib.get_close_matches(key, known, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(known)}"
                self.problem(annotations, key, here, f"unknown healer annotation {key!r} ({hint})")
            elif not isinstance(value, str):
                self.problem(
                    annotations,
                    key,
                    here,
                    "an annotation is text (Prometheus): quote it, e.g. "
                    '"quarantine, drain: {timeout: 1h}, ticket: {provider: default}"',
                )
            else:
                name, shape = _BY_ANNOTATION[key]
                try:
                    parsed = annotation_value(shape, value)
                except ValueError as exc:
                    self.problem(annotations, key, here, str(exc), value=True)
                    continue
                line, column = value_at(annotations, key)
                _place_all(parsed, line, column)
                _put(out, name, parsed, annotations, key)
        _put(out, "annotations", rest, rule, "annotations")


def _unknown(key: Any, allowed: tuple[str, ...], hints: dict[str, str]) -> str:
    if key in hints:
        return f"unknown key {key!r}: {hints[key]}"
    close = difflib.get_close_matches(str(key), allowed, n=1)
    return f"unknown key {key!r} " + (
        f"(did you mean {close[0]!r}?)" if close else f"(allowed: {', '.join(allowed)})"
    )


def _rules(tree: object) -> Iterator[tuple[int, int, object]]:
    groups = tree.get("groups") if isinstance(tree, dict) else None
    for i, group in enumerate(groups if isinstance(groups, list) else []):
        rules = group.get("rules") if isinstance(group, dict) else None
        for j, rule in enumerate(rules if isinstance(rules, list) else []):
            yield i, j, rule


# --- positions --------------------------------------------------------------------------------------


def _like(node: CommentedMap | CommentedSeq) -> Any:
    """An empty mapping or sequence at ``node``'s place."""
    out = CommentedMap() if isinstance(node, CommentedMap) else CommentedSeq()
    out.lc.line, out.lc.col = node.lc.line, node.lc.col
    return out


def _put(out: CommentedMap, key: Any, value: Any, source: CommentedMap, source_key: Any) -> None:
    """``out[key] = value``, at the place of ``source[source_key]`` (key and value)."""
    out[key] = value
    out.lc.add_kv_line_col(key, [*key_at(source, source_key), *value_at(source, source_key)])


def _place_item(out: CommentedSeq, index: int, source: CommentedSeq, source_index: int) -> None:
    out.lc.add_idx_line_col(index, list(source.lc.item(source_index) or (source.lc.line, source.lc.col)))


def _place_all(node: Any, line: int, column: int) -> None:
    """Put every key and item inside ``node`` (read from an annotation) at the annotation's value."""
    if isinstance(node, CommentedMap):
        node.lc.line, node.lc.col = line, column
        for key, value in node.items():
            node.lc.add_kv_line_col(key, [line, column, line, column])
            _place_all(value, line, column)
    elif isinstance(node, CommentedSeq):
        node.lc.line, node.lc.col = line, column
        for i, value in enumerate(node):
            node.lc.add_idx_line_col(i, [line, column])
            _place_all(value, line, column)
