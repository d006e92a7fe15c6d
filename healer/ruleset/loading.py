"""Loading rule files: YAML → :class:`~healer.ruleset.schema.RuleSet`, every problem with its place.

Entry points::

    load_ruleset(paths) -> RuleSet            raises RuleError carrying every RuleProblem
    validate_rules(paths) -> Validation       never raises for rule problems (CLI, dashboards)
    reload_ruleset(paths, previous) -> Reload the controller's reload: a bad file keeps ``previous``
    to_prometheus_rules(ruleset) -> dict      the same rules as a Prometheus alerting rule file

A file is healer's rule format, or a Prometheus rule file (``alert:``/``record:`` rules, healer's
keys as annotations) read as the healer rules it stands for
(:mod:`healer.ruleset.prometheus_import`); its recording rules are refused unless the caller
allows them (``recording_rules=True``: alerts mode, where Prometheus evaluates them).

A problem names the file, the 1-based line and column, and the field path, e.g.
``rules/gpu.yaml:14:9: groups[0].rules[2].for: not a Prometheus duration: '5 minutes'``; in a
Prometheus rule file the path is that file's (``groups[0].rules[1].annotations.healer_actions``).
Checks, all reported at once: size (:data:`MAX_RULE_FILE_BYTES`), nesting and alias expansion
(:data:`MAX_YAML_DEPTH`, :data:`MAX_YAML_NODES`, checked on the YAML events before anything is
built), YAML syntax, the schema (unknown keys, bad durations, unknown
actions, empty expressions, wrong types, missing keys, empty node label chains), rule and group
names duplicated anywhere in the set, and the PromQL and templates as Prometheus itself parses them
(``promtool check rules``; without promtool a warning says PromQL was not checked). The settings'
InfiniBand device filter is written into every ``node_infiniband_*`` selector
(:mod:`healer.ruleset.device_filter`); a rule that sets ``device`` there otherwise is a problem at
its place.

Loading is pure apart from reading the files and running promtool: it holds no state, so the
caller decides what to keep when a reload fails (see :func:`reload_ruleset`).
"""

from __future__ import annotations

import difflib
import logging
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError
from ruamel.yaml.events import (
    AliasEvent,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
)
from ruamel.yaml.scalarstring import (
    DoubleQuotedScalarString,
    LiteralScalarString,
    SingleQuotedScalarString,
)

from healer.errors import RuleError
from healer.ruleset.capacity import CAPACITY_MODELS, CapacityRule
from healer.ruleset.device_filter import ALL_DEVICES, DeviceFilter, DeviceMatcherConflict, apply_device_filter
from healer.ruleset.export import DIGEST_ANNOTATION, prometheus_rule_file, rule_digest
from healer.ruleset.output_labels import NodeBlind, node_blind
from healer.ruleset.prometheus_import import PrometheusView, healer_view, is_prometheus_file
from healer.ruleset.schema import (
    ACTION_KINDS,
    DEFAULT_NODE_LABELS,
    DrainAction,
    NotifyAction,
    QuarantineAction,
    RecordingRule,
    Rule,
    RuleFile,
    RuleGroup,
    RuleSet,
    TaintAction,
    TicketAction,
)
from healer.ruleset.yaml_errors import describe_yaml_error, key_at, value_at

log = logging.getLogger(__name__)

#: File name endings loaded from a directory (not recursive; hidden files are skipped).
RULE_FILE_SUFFIXES = (".yaml", ".yml")

#: Largest rule file read, bytes (the default pack's files are about 6 KB each; parsing is ~8 s/MB).
MAX_RULE_FILE_BYTES = 512 * 1024
#: Deepest YAML nesting accepted (a rule file needs about 10 levels).
MAX_YAML_DEPTH = 32
#: Most YAML values (scalars and collections) a file may hold once aliases are expanded.
MAX_YAML_NODES = 100_000

#: Seconds promtool may take to check the whole set before the check is skipped with a warning.
PROMTOOL_TIMEOUT_SECONDS = 60.0

#: Why a recording rule is refused where healer evaluates the rules itself (query mode, backtest).
RECORDING_RULE_REFUSED = (
    "a recording rule: healer evaluates alerting rules only and records nothing, so no rule here "
    "would see its series. Use alerts mode (detection.mode: alerts: Prometheus evaluates `healer "
    "rules export`'s file, recording rules included), keep it in your Prometheus's own rule files, "
    "or write its expression into the alerting rules that read it"
)


@dataclass(frozen=True)
class RuleProblem:
    """One thing wrong in a rule file.

    ``line`` and ``column`` are 1-based (``None`` when the problem concerns the whole file);
    ``field`` is the path inside the file (``groups[0].rules[2].for``; ``""`` for the file itself).
    """

    file: str
    line: int | None
    column: int | None
    field: str
    message: str

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        return f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe form: ``{file, line, column, field, message}``."""
        return {
            "file": self.file,
            "line": self.line,
            "column": self.column,
            "field": self.field,
            "message": self.message,
        }


@dataclass(frozen=True)
class RuleOrigin:
    """Where a rule is defined: file and 1-based line of its ``name``."""

    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


@dataclass(frozen=True)
class Validation:
    """The outcome of checking a set of rule files.

    ``ruleset`` is set only when there is no problem at all (a file that fails is rejected whole,
    and so is the set). ``warnings`` do not make the set invalid (e.g. promtool absent, a rule
    without a ``summary`` annotation). ``origins`` maps rule name → where it is defined.
    """

    files: tuple[str, ...]
    problems: tuple[RuleProblem, ...]
    warnings: tuple[str, ...] = ()
    ruleset: RuleSet | None = None
    origins: dict[str, RuleOrigin] = field(default_factory=dict)
    promql_checked: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class Reload:
    """What a reload gives the controller (``healer.rules_holder``): the set to run now and, if the
    files were bad, why.

    ``ruleset`` is the new set when the files are valid, else the ``previous`` one unchanged.
    """

    ruleset: RuleSet
    error: RuleError | None
    warnings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None


def load_ruleset(
    paths: Sequence[Path | str],
    *,
    promtool: str | bool = True,
    device_filter: DeviceFilter = ALL_DEVICES,
    recording_rules: bool = False,
) -> RuleSet:
    """Load and validate rule files and directories into one :class:`RuleSet`.

    Args:
        paths: YAML files, or directories whose ``*.yaml``/``*.yml`` files are loaded (sorted by
            name, not recursive). Problems name the files as given here.
        promtool: ``True`` = find ``promtool`` on PATH and check PromQL with it (a warning is
            logged when it is absent); ``False`` = do not check PromQL; a string = that binary.
        device_filter: the settings' InfiniBand device filter (``settings.infiniband``), written
            into every ``node_infiniband_*`` selector; default every device.
        recording_rules: accept the recording rules of Prometheus rule files (kept for export;
            alerts mode). False: each is a problem (:data:`RECORDING_RULE_REFUSED`).

    Raises:
        RuleError: with every :class:`RuleProblem` found in the whole set (``.problems``).
    """
    result = validate_rules(
        paths, promtool=promtool, device_filter=device_filter, recording_rules=recording_rules
    )
    for warning in result.warnings:
        log.warning("rules: %s", warning)
    if result.ruleset is None:
        raise RuleError(list(result.problems))
    return result.ruleset


def reload_ruleset(
    paths: Sequence[Path | str],
    previous: RuleSet,
    *,
    promtool: str | bool = True,
    device_filter: DeviceFilter = ALL_DEVICES,
    recording_rules: bool = False,
) -> Reload:
    """Reload for a running controller: a bad file never loses the rules that are running.

    Returns the new set, or ``previous`` with the :class:`RuleError` when any file is invalid.
    """
    result = validate_rules(
        paths, promtool=promtool, device_filter=device_filter, recording_rules=recording_rules
    )
    if result.ruleset is None:
        return Reload(ruleset=previous, error=RuleError(list(result.problems)), warnings=result.warnings)
    return Reload(ruleset=result.ruleset, error=None, warnings=result.warnings)


def validate_rules(
    paths: Sequence[Path | str],
    *,
    promtool: str | bool = True,
    device_filter: DeviceFilter = ALL_DEVICES,
    recording_rules: bool = False,
) -> Validation:
    """Check rule files and directories; never raises for a problem in them.

    See :func:`load_ruleset` for the arguments. Problems are sorted by file (in load order),
    line and column.
    """
    problems: list[RuleProblem] = []
    warnings: list[str] = []
    files = list(_expand(paths, problems))
    parsed = [_parse_file(f, problems) for f in files]
    parsed_ok = [p for p in parsed if p is not None]
    for p in parsed_ok:
        if p.prometheus is not None:
            if not recording_rules:
                problems.extend(
                    RuleProblem(p.path, line, column, where, RECORDING_RULE_REFUSED)
                    for line, column, where in p.prometheus.records
                )
            warnings.extend(_stale_digests(p, p.prometheus))

    origins = _check_duplicates(parsed_ok, problems)
    _check_capacity_names(parsed_ok, problems)
    _check_pool_names(parsed_ok, problems)
    unfiltered: list[RuleProblem] = []
    for p in parsed_ok:
        _apply_device_filter(p, device_filter, problems, unfiltered)
    promql_checked = False
    binary = _promtool_binary(promtool)
    if binary is not None:
        promql_checked = _check_promql(parsed_ok, binary, problems, warnings)
    elif promtool is not False:  # False: the caller asked for no PromQL check, so no warning
        warnings.append(
            "promtool not found: PromQL syntax NOT checked (install Debian package 'prometheus' "
            "or put promtool on PATH)"
        )
    # A rule the filter could not be written into never loads unfiltered; when promtool already
    # reported its expression (a syntax error), that problem says it all.
    reported = {(x.file, x.field) for x in problems}
    problems.extend(x for x in unfiltered if (x.file, x.field) not in reported)

    for p in parsed_ok:
        for rule, where in _raw_rules(p):
            summary = rule.get("annotations", {}) if isinstance(rule.get("annotations"), dict) else {}
            name = rule.get("name")
            if isinstance(name, str) and not str(summary.get("summary", "")).strip():
                warnings.append(f"{p.path}:{where}: rule {name!r} has no 'summary' annotation")
            blind = _node_blind(rule)
            if isinstance(name, str) and blind is not None:
                line, col = key_at(rule, "expr")
                warnings.append(f"{p.path}:{line + 1}:{col + 1}: rule {name!r}: {blind}")

    order = {name: i for i, name in enumerate(files)}
    problems.sort(key=lambda x: (order.get(x.file, -1), x.line or 0, x.column or 0))
    ruleset = None
    if not problems:
        groups = tuple(g for p in parsed_ok if p.model is not None for g in p.model.groups)
        capacity = tuple(c for p in parsed_ok if p.model is not None for c in p.model.capacity)
        ruleset = RuleSet(groups=groups, sources=tuple(files), capacity=capacity)
    return Validation(
        files=tuple(files),
        problems=tuple(problems),
        warnings=tuple(warnings),
        ruleset=ruleset,
        origins=origins,
        promql_checked=promql_checked,
    )


def _stale_digests(parsed: _Parsed, view: PrometheusView) -> Iterator[str]:
    """A ``healer_rule_digest`` that is not its rule's: the file was edited after it was exported,
    and alerts mode will refuse the rule until Prometheus loads a new export."""
    if parsed.model is None:
        return
    for group, index, digest, line, column in view.digests:
        rule = parsed.model.groups[group].rules[index]
        if digest != rule_digest(rule):
            yield (
                f"{parsed.path}:{line}:{column}: rule {rule.name!r}: {DIGEST_ANNOTATION} {digest} is not "
                f"the rule's ({rule_digest(rule)}): its expr, for or keep_firing_for changed after "
                "`healer rules export`; alerts mode refuses the rule until Prometheus loads a new export"
            )


def _node_blind(rule: CommentedMap) -> NodeBlind | None:
    """The rule's expression certainly names no node (see :mod:`healer.ruleset.output_labels`)."""
    expr = rule.get("expr")
    labels = rule.get("node_labels", DEFAULT_NODE_LABELS)
    if not isinstance(expr, str) or not isinstance(labels, list | tuple) or not labels:
        return None
    return node_blind(expr, [str(x) for x in labels])


def to_prometheus_rules(ruleset: RuleSet) -> dict[str, Any]:
    """The rule set as a Prometheus alerting rule file (``groups: [{name, interval, rules}]``), as
    ``healer rules export`` writes it (:mod:`healer.ruleset.export`), except that a group without an
    ``interval`` keeps none (Prometheus's ``evaluation_interval`` applies). Used to let Prometheus
    evaluate the same expressions (benchmarks, cross-checks).
    """
    return prometheus_rule_file(ruleset, default_interval_seconds=None)


# --- files ------------------------------------------------------------------------------------


@dataclass
class _Parsed:
    """One file: ``tree`` in healer's format (a Prometheus rule file's view, ``prometheus``)."""

    path: str
    tree: CommentedMap
    lines: list[str]
    model: RuleFile | None
    prometheus: PrometheusView | None = None

    def field(self, field_path: str) -> str:
        """A field path of ``tree`` as the file names it."""
        return field_path if self.prometheus is None else self.prometheus.field(field_path)

    def problem(self, line: int, column: int, field_path: str, message: str) -> RuleProblem:
        """A problem at a field path of ``tree``, named as the file has it."""
        return RuleProblem(self.path, line, column, self.field(field_path), message)


def _expand(paths: Sequence[Path | str], problems: list[RuleProblem]) -> Iterator[str]:
    if not paths:
        problems.append(RuleProblem("(no path)", None, None, "", "no rule file or directory given"))
    seen: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(
                p
                for p in path.iterdir()
                if p.is_file() and p.suffix in RULE_FILE_SUFFIXES and not p.name.startswith(".")
            )
            if not found:
                problems.append(
                    RuleProblem(str(path), None, None, "", "directory holds no *.yaml or *.yml rule file")
                )
            candidates = found
        elif path.is_file():
            candidates = [path]
        else:
            problems.append(RuleProblem(str(path), None, None, "", "no such file or directory"))
            continue
        for candidate in candidates:
            key = candidate.resolve()
            if key not in seen:  # `rules/ rules/gpu.yaml` loads gpu.yaml once
                seen.add(key)
                yield str(candidate)


def _parse_file(path: str, problems: list[RuleProblem]) -> _Parsed | None:
    try:
        with Path(path).open("rb") as f:
            data = f.read(MAX_RULE_FILE_BYTES + 1)
    except OSError as exc:
        problems.append(RuleProblem(path, None, None, "", f"cannot read: {exc.strerror or exc}"))
        return None
    if len(data) > MAX_RULE_FILE_BYTES:
        problems.append(
            RuleProblem(path, None, None, "", f"file larger than {MAX_RULE_FILE_BYTES} bytes: not loaded")
        )
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        problems.append(RuleProblem(path, None, None, "", f"not UTF-8 text (byte {exc.start})"))
        return None
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True  # to know where a quoted expr's text starts
    try:
        shape = _shape_problem(yaml, text)
        if shape is not None:
            line, column, message = shape
            problems.append(RuleProblem(path, line, column, "", message))
            return None
        tree = yaml.load(text)
    except YAMLError as exc:
        at_line, at_column, message = describe_yaml_error(exc, text)
        problems.append(RuleProblem(path, at_line, at_column, "", message))
        return None
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        # ruamel's constructors raise plain errors for explicit tags on bad values (`!!int abc`).
        tag_line = _line_of_tag(text)
        problems.append(
            RuleProblem(
                path, tag_line, 1 if tag_line else None, "", f"YAML value error: {type(exc).__name__}: {exc}"
            )
        )
        return None
    if tree is None:
        problems.append(RuleProblem(path, None, None, "", "empty file: expected a mapping with 'groups'"))
        return None
    if not isinstance(tree, CommentedMap):
        problems.append(
            RuleProblem(path, 1, 1, "", f"expected a mapping with 'groups', got {_kind_of(tree)}")
        )
        return None
    view = healer_view(tree) if is_prometheus_file(tree) else None
    if view is not None:
        problems.extend(RuleProblem(path, *problem) for problem in view.problems)
        tree = view.tree
    parsed = _Parsed(path=path, tree=tree, lines=text.splitlines(), model=None, prometheus=view)
    try:
        context = {"format": "healer" if view is None else "prometheus"}
        parsed.model = RuleFile.model_validate(_plain(tree), context=context)
    except ValidationError as exc:
        for err in exc.errors():
            problems.append(_problem_from_pydantic(parsed, err))
    return parsed


def _shape_problem(yaml: YAML, text: str) -> tuple[int, int, str] | None:
    """Scan the YAML events before building anything: nesting deeper than :data:`MAX_YAML_DEPTH`
    or more than :data:`MAX_YAML_NODES` nodes once aliases are expanded (an alias "bomb" is a few
    lines that expand to billions of nodes) is a problem at the offending event's line:column."""
    frames: list[list[Any]] = []  # [anchor, expanded nodes so far] per open collection
    sizes: dict[str, int] = {}
    total = 0
    for event in yaml.parse(text):
        added = 0
        if isinstance(event, MappingStartEvent | SequenceStartEvent):
            if len(frames) >= MAX_YAML_DEPTH:
                return _mark(event, f"nested deeper than {MAX_YAML_DEPTH} levels: not loaded")
            frames.append([event.anchor, 1])
            total += 1
        elif isinstance(event, MappingEndEvent | SequenceEndEvent):
            anchor, size = frames.pop()
            if anchor:
                sizes[anchor] = size
            added = size
        elif isinstance(event, ScalarEvent):
            if event.anchor:
                sizes[event.anchor] = 1
            added = 1
            total += 1
        elif isinstance(event, AliasEvent):
            added = sizes.get(event.anchor, 1)
            total += added
        if added and frames:
            frames[-1][1] += added
        if total > MAX_YAML_NODES:
            return _mark(event, f"more than {MAX_YAML_NODES} values once aliases are expanded: not loaded")
    return None


def _line_of_tag(text: str) -> int | None:
    """The first line with an explicit ``!!`` tag (where a constructor error most likely is)."""
    return next((n for n, line in enumerate(text.splitlines(), 1) if "!!" in line), None)


def _mark(event: Any, message: str) -> tuple[int, int, str]:
    mark = event.start_mark
    return (mark.line + 1, mark.column + 1, message) if mark else (1, 1, message)


def _plain(node: Any) -> Any:
    """ruamel's round-trip nodes → plain dict/list/str/int/float/bool for pydantic."""
    if isinstance(node, dict):
        return {_plain(k): _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    if isinstance(node, bool):
        return bool(node)
    if isinstance(node, str):
        return str(node)
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    return node


def _kind_of(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing (null)"
    return f"{type(value).__name__} {_short(value)}"


def _short(value: Any, limit: int = 60) -> str:
    text = repr(_plain(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- positions --------------------------------------------------------------------------------


def _locate(tree: CommentedMap, loc: Sequence[int | str]) -> tuple[str, int, int]:
    """(field path, 0-based line, 0-based column) of a pydantic error location in the YAML tree.

    Follows keys and list items as far as they exist; a missing key points at the mapping that
    should hold it. Pydantic's discriminator tag (``drain`` in ``actions[0].drain.timeout``) is
    kept when the YAML has it as a key (``{drain: {timeout: 1h}}``) and skipped otherwise.
    """
    node: Any = tree
    line, col = tree.lc.line, tree.lc.col
    parts: list[int | str] = []
    items = list(loc)
    i = 0
    while i < len(items):
        item = items[i]
        if item == "[key]":  # pydantic's marker for a mapping key (not its value) being wrong
            break
        if isinstance(node, CommentedMap) and item in node:
            line, col = key_at(node, item)
            parts.append(str(item))  # a key, even when YAML made it a number
            node = node[item]
        elif isinstance(node, CommentedSeq) and isinstance(item, int) and 0 <= item < len(node):
            # A tagged sequence (``!!python/...``) may carry no item positions: keep the parent's.
            line, col = node.lc.item(item) or (line, col)
            parts.append(item)
            node = node[item]
        elif isinstance(node, CommentedMap) and item in ACTION_KINDS and i + 1 < len(items):
            pass  # a discriminator tag with no YAML key of its own
        else:
            parts.extend(x for x in items[i:] if x not in ACTION_KINDS or x is items[-1])
            break
        i += 1
    return _field_path(parts), line, col


def _field_path(parts: Iterable[int | str]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_ACTION_MODELS: dict[str, type[BaseModel]] = {
    "quarantine": QuarantineAction,
    "taint": TaintAction,
    "drain": DrainAction,
    "ticket": TicketAction,
    "notify": NotifyAction,
}


def _model_at(loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The schema model that owns the mapping at ``loc`` (to list its allowed keys)."""
    names = [x for x in loc if isinstance(x, str)]
    if names == []:
        return RuleFile
    if names == ["groups"]:
        return RuleGroup
    if names == ["groups", "rules"]:
        return Rule
    if names == ["groups", "records"]:
        return RecordingRule
    if len(names) == 4 and names[:3] == ["groups", "rules", "actions"]:
        return _ACTION_MODELS.get(names[3])
    if names == ["capacity"]:
        return CapacityRule
    if len(names) == 2 and names[0] == "capacity":
        return CAPACITY_MODELS.get(names[1])
    return None


def _allowed_keys(model: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


def _problem_from_pydantic(parsed: _Parsed, err: Any) -> RuleProblem:
    loc: tuple[int | str, ...] = tuple(err["loc"])
    at_field = (err.get("ctx") or {}).get("at_field")
    if at_field and loc:
        loc = (*loc[:-1], str(at_field))  # a check of one key whose fix is in another
    field_path, line, col = _locate(parsed.tree, loc)
    kind = err["type"]
    msg = str(err["msg"])
    value = err.get("input")
    if at_field:
        message = msg
    elif kind in ("value_error", "assertion_error"):
        message = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    elif kind == "extra_forbidden":
        key = str(loc[-1])
        message = f"unknown key {key!r}"
        model = _model_at(loc[:-1])
        if model is not None:
            allowed = _allowed_keys(model)
            close = difflib.get_close_matches(key, allowed, n=1)
            message += f" (did you mean {close[0]!r}?)" if close else f" (allowed: {', '.join(allowed)})"
    elif kind == "missing":
        # The key as the file names it (a Prometheus rule's `name` is its `alert`).
        message = f"missing required key {parsed.field(field_path).rsplit('.', 1)[-1]!r}"
    elif kind == "union_tag_invalid":
        tag = (err.get("ctx") or {}).get("tag", "?")
        message = f"unknown action {tag!r} (allowed: {', '.join(ACTION_KINDS)})"
    elif kind == "union_tag_not_found":
        message = (
            "an action is a name (quarantine) or a one-key mapping with options "
            f"({{drain: {{timeout: 1h}}}}); got {_short(value)}"
        )
    elif kind in ("too_short",) and (err.get("ctx") or {}).get("min_length") == 1:
        message = "must not be empty"
        if loc and loc[-1] == "node_labels":
            message = "must list at least one label that carries the node name (e.g. Hostname)"
    elif kind in ("model_type", "model_attributes_type", "dict_type"):
        message = f"expected a mapping, got {_kind_of(value)}"
    elif kind in ("list_type", "tuple_type"):
        message = f"expected a list, got {_kind_of(value)}"
    elif kind == "literal_error":
        message = f"{msg.replace('Input should be', 'must be')}, not {_short(value)}"
    else:
        message = f"{msg} (got {_kind_of(value)})"
    if loc and loc[-1] == "[key]":
        message = f"key must be a string, got {_kind_of(value)} (quote it)"
    return RuleProblem(parsed.path, line + 1, col + 1, parsed.field(field_path), message)


# --- whole-set checks -------------------------------------------------------------------------


def _raw_groups(parsed: _Parsed) -> Iterator[tuple[int, CommentedMap]]:
    groups = parsed.tree.get("groups")
    if isinstance(groups, CommentedSeq):
        for i, group in enumerate(groups):
            if isinstance(group, CommentedMap):
                yield i, group


def _raw_rules(parsed: _Parsed) -> Iterator[tuple[CommentedMap, str]]:
    """Every rule mapping in the raw tree with its ``line:column`` (1-based)."""
    for _, group in _raw_groups(parsed):
        rules = group.get("rules")
        if isinstance(rules, CommentedSeq):
            for j, rule in enumerate(rules):
                if isinstance(rule, CommentedMap):
                    line, col = rules.lc.item(j)
                    yield rule, f"{line + 1}:{col + 1}"


def _check_capacity_names(parsed: Sequence[_Parsed], problems: list[RuleProblem]) -> None:
    """Capacity rule names are unique across the set (each names its burst taint's value and its
    recorded transitions)."""
    seen: dict[str, RuleOrigin] = {}
    for p in parsed:
        rules = p.tree.get("capacity")
        if not isinstance(rules, CommentedSeq):
            continue
        for i, rule in enumerate(rules):
            name = rule.get("name") if isinstance(rule, CommentedMap) else None
            if not isinstance(name, str):
                continue
            line, col = key_at(rule, "name")
            here = RuleOrigin(p.path, line + 1, col + 1)
            if name in seen:
                problems.append(
                    p.problem(
                        here.line,
                        here.column,
                        f"capacity[{i}].name",
                        f"duplicate capacity rule name {name!r}: also defined at {seen[name]}",
                    )
                )
            else:
                seen[name] = here


def _check_duplicates(parsed: Sequence[_Parsed], problems: list[RuleProblem]) -> dict[str, RuleOrigin]:
    """Rule names and group names must be unique across the whole set; returns rule origins."""
    rules: dict[str, RuleOrigin] = {}
    groups: dict[str, RuleOrigin] = {}
    for p in parsed:
        for i, group in _raw_groups(p):
            name = group.get("name")
            if isinstance(name, str):
                line, col = key_at(group, "name")
                here = RuleOrigin(p.path, line + 1, col + 1)
                if name in groups:
                    problems.append(
                        p.problem(
                            here.line,
                            here.column,
                            f"groups[{i}].name",
                            f"duplicate group name {name!r}: also defined at {groups[name]}",
                        )
                    )
                else:
                    groups[name] = here
            raw_rules = group.get("rules")
            if not isinstance(raw_rules, CommentedSeq):
                continue
            for j, rule in enumerate(raw_rules):
                if not isinstance(rule, CommentedMap) or not isinstance(rule.get("name"), str):
                    continue
                name = rule["name"]
                line, col = key_at(rule, "name")
                here = RuleOrigin(p.path, line + 1, col + 1)
                if name in rules:
                    problems.append(
                        p.problem(
                            here.line,
                            here.column,
                            f"groups[{i}].rules[{j}].name",
                            f"duplicate rule name {name!r}: also defined at {rules[name]}",
                        )
                    )
                else:
                    rules[name] = here
    return rules


def _check_pool_names(parsed: Sequence[_Parsed], problems: list[RuleProblem]) -> None:
    """Pools named the same (``pool.name``, default the rule's name) must select the same nodes."""
    seen: dict[str, tuple[dict[str, str], RuleOrigin]] = {}
    for p in parsed:
        for i, group in _raw_groups(p):
            places: list[tuple[str, CommentedMap, str | None]] = [(f"groups[{i}].pool", group, None)]
            raw_rules = group.get("rules")
            if isinstance(raw_rules, CommentedSeq):
                places += [
                    (
                        f"groups[{i}].rules[{j}].pool",
                        r,
                        r.get("name") if isinstance(r.get("name"), str) else None,
                    )
                    for j, r in enumerate(raw_rules)
                    if isinstance(r, CommentedMap)
                ]
            for field_path, owner, rule_name in places:
                pool = owner.get("pool")
                if not isinstance(pool, CommentedMap) or not isinstance(
                    pool.get("node_selector"), CommentedMap
                ):
                    continue
                name = pool.get("name") if isinstance(pool.get("name"), str) else rule_name
                if name is None:
                    continue  # a group's pool without a name: each rule's pool is named after it
                selector = {str(k): str(v) for k, v in pool["node_selector"].items()}
                line, col = key_at(pool, "name" if "name" in pool else "node_selector")
                here = RuleOrigin(p.path, line + 1, col + 1)
                if name in seen and seen[name][0] != selector:
                    problems.append(
                        p.problem(
                            here.line,
                            here.column,
                            f"{field_path}.name",
                            f"pool {name!r} selects other nodes than at {seen[name][1]}: "
                            "one name, one selector",
                        )
                    )
                seen.setdefault(name, (selector, here))


def _apply_device_filter(
    parsed: _Parsed,
    device_filter: DeviceFilter,
    problems: list[RuleProblem],
    unfiltered: list[RuleProblem],
) -> None:
    """Write the InfiniBand device filter into the file's rules (``parsed.model``); a selector that
    sets ``device`` otherwise is a problem at its place. An expression naming an InfiniBand metric
    that promql-parser cannot read, or the filter cannot be written into, goes to ``unfiltered``
    (a problem unless promtool reports the expression itself)."""
    rewritten: dict[tuple[int, int], str] = {}
    for i, group in _raw_groups(parsed):
        raw_rules = group.get("rules")
        if not isinstance(raw_rules, CommentedSeq):
            continue
        for j, rule in enumerate(raw_rules):
            expr = rule.get("expr") if isinstance(rule, CommentedMap) else None
            if not isinstance(expr, str):
                continue
            field_path = f"groups[{i}].rules[{j}]"
            try:
                new = apply_device_filter(str(expr), device_filter)
            except DeviceMatcherConflict as exc:
                line, col = _position_of_offset(_ExprRef(parsed, rule, field_path), str(expr), exc.offset)
                problems.append(RuleProblem(parsed.path, line + 1, col + 1, f"{field_path}.expr", str(exc)))
                continue
            except ValueError as exc:
                line, col = key_at(rule, "expr")
                message = f"the InfiniBand device filter could not be written into this expression: {exc}"
                unfiltered.append(RuleProblem(parsed.path, line + 1, col + 1, f"{field_path}.expr", message))
                continue
            if new != expr:
                rewritten[(i, j)] = new
    if not rewritten or parsed.model is None:
        return
    groups = list(parsed.model.groups)
    for (i, j), new in rewritten.items():
        rules = list(groups[i].rules)
        rules[j] = rules[j].model_copy(update={"expr": new.strip()})  # as the schema keeps it
        groups[i] = groups[i].model_copy(update={"rules": rules})
    parsed.model = parsed.model.model_copy(update={"groups": groups})


def _position_of_offset(ref: _ExprRef, expr: str, offset: int) -> tuple[int, int]:
    """0-based file (line, column) of a 0-based character offset in the rule's ``expr`` text."""
    before = expr[:offset]
    expr_line = before.count("\n") + 1
    expr_col = offset - (before.rfind("\n") + 1) + 1
    inner = _position_in_expr(ref, expr_line, expr_col)
    return inner if inner is not None else key_at(ref.rule, "expr")


def _promtool_binary(promtool: str | bool) -> str | None:
    if promtool is False:
        return None
    if promtool is True:
        return shutil.which("promtool")
    return shutil.which(promtool)


@dataclass
class _ExprRef:
    parsed: _Parsed
    rule: CommentedMap
    field: str  # groups[i].rules[j]


_PROMTOOL_LINE = re.compile(r'group "r(?P<index>\d+)", rule \d+, "[^"]*": (?P<message>.+)$')
_PARSE_POSITION = re.compile(r"^could not parse expression: (?P<line>\d+):(?P<col>\d+): (?P<rest>.+)$")
_TEMPLATE_FIELD = re.compile(r'^(?P<what>annotation|label) "(?P<key>[^"]+)": (?P<rest>.+)$')
_GO_TEMPLATE = re.compile(r"^template: __alert_healer_rule:\d+: ")


def _check_promql(
    parsed: Sequence[_Parsed], binary: str, problems: list[RuleProblem], warnings: list[str]
) -> bool:
    """Let Prometheus parse every expression and template (``promtool check rules``).

    Each rule becomes one alerting rule (a recording rule: one recording rule) in its own group
    ``r<k>`` of a temporary file, so that promtool's ``group "r<k>"`` names the rule back; its
    positions inside the expression are mapped to the rule file. Rules whose other fields are
    broken are still checked, so one pass reports everything. Returns whether the check ran.
    """
    refs: list[_ExprRef] = []
    groups: list[dict[str, Any]] = []
    for p in parsed:
        for i, group in _raw_groups(p):
            for section in ("records", "rules"):
                raw_rules = group.get(section)
                if not isinstance(raw_rules, CommentedSeq):
                    continue
                for j, rule in enumerate(raw_rules):
                    if not isinstance(rule, CommentedMap):
                        continue
                    expr = rule.get("expr")
                    if not isinstance(expr, str) or not expr.strip():
                        continue
                    item = _promtool_rule(rule, str(expr), recording=section == "records")
                    groups.append({"name": f"r{len(refs)}", "rules": [item]})
                    refs.append(_ExprRef(p, rule, f"groups[{i}].{section}[{j}]"))
    if not refs:
        return True
    with tempfile.TemporaryDirectory(prefix="healer-promtool-") as tmp:
        target = Path(tmp) / "rules.yml"
        dumper = YAML(typ="safe", pure=True)
        dumper.default_flow_style = False
        with target.open("w", encoding="utf-8") as fh:
            dumper.dump({"groups": groups}, fh)
        try:
            done = subprocess.run(
                [binary, "check", "rules", "--lint=none", str(target)],
                capture_output=True,
                text=True,
                timeout=PROMTOOL_TIMEOUT_SECONDS,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            warnings.append(f"PromQL syntax NOT checked: {binary} failed to run: {exc}")
            return False
    if done.returncode == 0:
        return True
    output = done.stdout + "\n" + done.stderr
    mapped = 0
    for text in output.splitlines():
        match = _PROMTOOL_LINE.search(text)
        if not match:
            continue
        index = int(match["index"])
        if index >= len(refs):
            continue
        problems.append(_promtool_problem(refs[index], match["message"]))
        mapped += 1
    if not mapped:
        warnings.append(f"PromQL syntax NOT checked: promtool exited {done.returncode}: {output.strip()}")
        return False
    return True


def _promtool_rule(rule: CommentedMap, expr: str, *, recording: bool) -> dict[str, Any]:
    """The rule as promtool checks it: its expression, labels and annotations (templates)."""
    item: dict[str, Any] = {"record": "healer_record"} if recording else {"alert": "healer_rule"}
    item["expr"] = expr
    for key in ("labels",) if recording else ("labels", "annotations"):
        value = rule.get(key)
        # Only well-typed mappings: the schema already reports the others.
        if isinstance(value, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            item[key] = {str(k): str(v) for k, v in value.items()}
    return item


#: Prometheus's parser names tokens as ``<op:>>``, ``<aggr:sum>``, ``<by>`` (``Item.String`` in
#: promql/parser/lex.go); :func:`readable_promql_error` spells them out.
_PROMQL_TOKEN = re.compile(r"<(?:(?P<kind>op|aggr):)?(?P<val>[^\s<>]+?|[<>=!~]+?)>(?=$|[\s,;:)])")


def readable_promql_error(message: str) -> str:
    """A Prometheus parse error with its token notation spelled out: ``unexpected <op:>>`` →
    ``unexpected operator '>'``, ``<aggr:sum>`` → ``aggregation 'sum'``, ``<by>`` → ``keyword 'by'``."""

    def spell(match: re.Match[str]) -> str:
        what = {"op": "operator", "aggr": "aggregation"}.get(match["kind"] or "", "keyword")
        return f"{what} '{match['val']}'"

    return _PROMQL_TOKEN.sub(spell, message)


def _promtool_problem(ref: _ExprRef, message: str) -> RuleProblem:
    message = readable_promql_error(message)
    rule = ref.rule
    template = _TEMPLATE_FIELD.match(message)
    if template:
        section = "annotations" if template["what"] == "annotation" else "labels"
        key = template["key"]
        mapping = rule.get(section)
        if isinstance(mapping, CommentedMap) and key in mapping:
            line, col = key_at(mapping, key)
        else:
            line, col = key_at(rule, section)
        rest = _GO_TEMPLATE.sub("", template["rest"])
        return ref.parsed.problem(line + 1, col + 1, f"{ref.field}.{section}.{key}", f"template: {rest}")
    if message.startswith("invalid label name"):
        line, col = key_at(rule, "labels") if "labels" in rule else key_at(rule, "expr")
        return ref.parsed.problem(line + 1, col + 1, f"{ref.field}.labels", message)
    position = _PARSE_POSITION.match(message)
    line, col = key_at(rule, "expr")
    if position:
        inner = _position_in_expr(ref, int(position["line"]), int(position["col"]))
        message = f"PromQL {position['rest']}"
        if inner is not None:
            line, col = inner
        else:
            message += f" (at {position['line']}:{position['col']} of the expression)"
    else:
        message = f"PromQL: {message}"
    return ref.parsed.problem(line + 1, col + 1, f"{ref.field}.expr", message)


def _position_in_expr(ref: _ExprRef, expr_line: int, expr_col: int) -> tuple[int, int] | None:
    """0-based file (line, column) of a 1-based position inside the rule's ``expr`` text.

    Exact for literal blocks (``expr: |``) and one-line scalars; ``None`` (use the key) for folded
    or multi-line plain scalars, whose text no longer matches the file line for line.
    """
    value = ref.rule["expr"]
    value_line, value_col = value_at(ref.rule, "expr")
    text_lines = str(value).rstrip("\n").split("\n")
    if expr_line > len(text_lines):  # "unclosed (" is reported just past the end of the text
        expr_line, expr_col = len(text_lines), len(text_lines[-1]) + 1
    if isinstance(value, LiteralScalarString):
        first = value_line + 1
        lines = ref.parsed.lines
        # Content indentation: the first non-blank line of the block.
        k = first
        while k < len(lines) and not lines[k].strip():
            k += 1
        if k >= len(lines):
            return None
        indent = len(lines[k]) - len(lines[k].lstrip(" "))
        return first + expr_line - 1, indent + expr_col - 1
    if "\n" in str(value) or expr_line != 1:
        return None
    quoted = isinstance(value, DoubleQuotedScalarString | SingleQuotedScalarString)
    return value_line, value_col + (1 if quoted else 0) + expr_col - 1
