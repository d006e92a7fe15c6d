"""The rule test file: promtool's unit-test format with healer's expectations.

::

    rule_files: [../gpu-thermal.yaml]      # relative to this file
    evaluation_interval: 30s               # default 1m, as promtool
    safety: {max_unhealthy: 1}             # optional SafetyLimits fields (default: no budget, no breaker)
    recovery_hold: 5m                      # optional, default 5m
    tests:
      - name: a hot GPU is quarantined, drained and ticketed
        interval: 1m                       # default: evaluation_interval
        input_series:
          - series: 'DCGM_FI_DEV_GPU_TEMP{Hostname="n1", gpu="0"}'
            values: '70 85x20'
        exp_findings:                      # firing findings of `rule` at `eval_time` (exact set)
          - eval_time: 8m
            rule: GpuTooHot
            findings:
              - {node: n1, labels: {gpu: "0"}}   # labels: these must match, others may exist
        exp_steps:                         # every quarantine/drain/ticket by the test's end (exact set)
          - {node: n1, step: quarantine, at: 7m}   # at or before `at`

A test ends at its latest ``eval_time``/``at`` (or its longest series). ``exp_steps`` omitted: steps
are not checked; ``exp_steps: []``: no step may happen. Every rule is evaluated every
``evaluation_interval`` (group ``interval`` values are not used), from the test's time 0 as promtool
does. A test may also hold promtool's ``promql_expr_test`` (run by promtool over the test's input
series: :mod:`healer.ruletest.promtool`). ``alert_rule_test`` needs Prometheus rule files, and a file
of those is promtool's own test file (run by promtool whole): with healer's rule files it is refused.
``stale`` is refused in a test that healer's engine checks (``exp_findings``, ``exp_steps``): the
engine's Prometheus is loaded from OpenMetrics, which has no staleness marker, so the value would
linger 5 minutes where promtool sees none.

Errors: :class:`SpecError` with ``file:line`` for a malformed file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError

from healer.model.limits import SafetyLimits
from healer.ruleset.durations import parse_duration
from healer.ruleset.yaml_errors import describe_yaml_error
from healer.ruletest.series import Series, SeriesError, parse_series

STEPS = ("quarantine", "drain", "ticket")

#: Limits of a rule test unless its file says otherwise: the rule is under test, not the budget.
UNLIMITED = SafetyLimits(
    max_unhealthy=1_000_000, max_unhealthy_percent=100.0, breaker_nodes=1_000_000, breaker_percent=100.0
)


class SpecError(ValueError):
    """A malformed test file; the message starts with ``file:line:``."""


@dataclass(frozen=True)
class ExpFinding:
    node: str
    labels: dict[str, str]


@dataclass(frozen=True)
class ExpFindings:
    line: int
    eval_time: float
    rule: str
    findings: list[ExpFinding]
    rule_line: int = 0  #: line of the ``rule:`` key (0: unknown)


@dataclass(frozen=True)
class ExpStep:
    line: int
    node: str
    step: str
    at: float


@dataclass(frozen=True)
class TestCase:
    """One test: its name, where it is, the series (interval seconds) and the expectations."""

    file: str
    line: int
    name: str
    interval: float
    series: list[Series]
    exp_findings: list[ExpFindings]
    exp_steps: list[ExpStep] | None
    node: CommentedMap | None = None  #: the test as written (its promql_expr_test goes to promtool)

    @property
    def checked_by_engine(self) -> bool:
        """Whether healer's engine has something to check (else only promtool's part runs)."""
        return bool(self.exp_findings) or self.exp_steps is not None

    @property
    def end(self) -> float:
        """Seconds from the test's start to its last evaluation."""
        times = [e.eval_time for e in self.exp_findings] + [s.at for s in self.exp_steps or []]
        if times:
            return max(times)
        longest = max((len(s.values) for s in self.series), default=1)
        return (longest - 1) * self.interval


@dataclass(frozen=True)
class TestFile:
    path: str
    rule_files: list[Path]
    evaluation_interval: float
    limits: SafetyLimits
    recovery_hold: float
    tests: list[TestCase] = field(default_factory=list)


_FILE_KEYS = {"rule_files", "evaluation_interval", "tests", "safety", "recovery_hold"}
_TEST_KEYS = {"name", "interval", "input_series", "exp_findings", "exp_steps", "promql_expr_test"}
#: Keys of promtool's format that need Prometheus rule files: why each is refused with healer's.
_NEEDS_PROMETHEUS_RULES = {
    "alert_rule_test": "its alerts come from Prometheus rule files (alert:); "
    "expect a healer rule's findings with exp_findings",
    "group_eval_order": "it orders Prometheus rule groups; healer evaluates every rule at each tick",
}


def _line(node: Any) -> int:
    lc = getattr(node, "lc", None)
    return int(lc.line) + 1 if lc is not None and lc.line is not None else 0


def _key_line(node: Any, key: str) -> int:
    """1-based line of ``key`` in the mapping ``node`` (0 when unknown)."""
    try:
        return int(node.lc.key(key)[0]) + 1
    except (AttributeError, KeyError, TypeError):
        return 0


def _plain(node: Any) -> Any:
    if isinstance(node, CommentedMap):
        return {str(k): _plain(v) for k, v in node.items()}
    if isinstance(node, CommentedSeq):
        return [_plain(v) for v in node]
    return node


def read_document(path: str | Path) -> CommentedMap:
    """The test file's YAML (round-trip: lines and scalars as written). Raises :class:`SpecError`."""
    name = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SpecError(f"{name}: cannot read: {exc.strerror or exc}") from exc
    try:
        doc = YAML(typ="rt").load(text)
    except YAMLError as exc:
        line, column, message = describe_yaml_error(exc, text)
        where = f"{name}:{line}:{column}" if line is not None else name
        raise SpecError(f"{where}: {message}") from exc
    if not isinstance(doc, CommentedMap):
        raise SpecError(f"{name}:1: a test file is a mapping with rule_files and tests")
    return doc


def _unknown_keys(name: str, node: CommentedMap, allowed: set[str]) -> SpecError | None:
    """``file:line: unsupported key 'k' (...)`` at the first unknown key's own line."""
    unknown = [str(k) for k in node if str(k) not in allowed]
    if not unknown:
        return None
    first = unknown[0]
    line = _key_line(node, first) or _line(node) or 1
    reason = _NEEDS_PROMETHEUS_RULES.get(first)
    if reason:
        return SpecError(f"{name}:{line}: unsupported key {first!r} with healer rule files: {reason}")
    return SpecError(
        f"{name}:{line}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}"
    )


def load(path: str | Path, doc: CommentedMap | None = None) -> TestFile:
    """Read one test file (``doc``: its :func:`read_document`, when already read). Raises
    :class:`SpecError`."""
    name = str(path)
    if doc is None:
        doc = read_document(path)

    def fail(node: Any, message: str) -> SpecError:
        return SpecError(f"{name}:{_line(node) or 1}: {message}")

    unknown = _unknown_keys(name, doc, _FILE_KEYS)
    if unknown:
        raise unknown
    base = Path(path).parent
    rule_files = [base / str(p) for p in doc.get("rule_files") or []]
    if not rule_files:
        raise fail(doc, "rule_files: at least one rule file")
    try:
        interval = parse_duration(doc.get("evaluation_interval", "1m"))
        hold = parse_duration(doc.get("recovery_hold", "5m"))
        limits = UNLIMITED
        if doc.get("safety"):
            limits = SafetyLimits(**{**UNLIMITED.__dict__, **_plain(doc["safety"])})
    except (TypeError, ValueError) as exc:
        raise fail(doc, str(exc)) from exc
    tests = [_test(name, t, interval, fail) for t in doc.get("tests") or []]
    if not tests:
        raise fail(doc, "tests: at least one test")
    return TestFile(name, rule_files, interval, limits, hold, tests)


def _test(file: str, node: Any, default_interval: float, fail: Any) -> TestCase:
    if not isinstance(node, CommentedMap):
        raise fail(node, "a test is a mapping")
    unknown = _unknown_keys(file, node, _TEST_KEYS)
    if unknown:
        raise unknown
    try:
        interval = parse_duration(node.get("interval", default_interval))
        series = [parse_series(str(s["series"]), str(s["values"])) for s in node.get("input_series") or []]
        exp_findings = [
            ExpFindings(
                line=_line(e),
                eval_time=parse_duration(e["eval_time"]),
                rule=str(e["rule"]),
                rule_line=_key_line(e, "rule"),
                findings=[
                    ExpFinding(
                        node=str(f["node"]),
                        labels={str(k): str(v) for k, v in (f.get("labels") or {}).items()},
                    )
                    for f in e.get("findings") or []
                ],
            )
            for e in node.get("exp_findings") or []
        ]
        raw_steps = node.get("exp_steps")
        exp_steps = None
        if raw_steps is not None:
            exp_steps = [
                ExpStep(line=_line(s), node=str(s["node"]), step=str(s["step"]), at=parse_duration(s["at"]))
                for s in raw_steps
            ]
    except KeyError as exc:
        raise fail(node, f"missing key {exc}") from exc
    except (SeriesError, TypeError, ValueError) as exc:
        raise fail(node, str(exc)) from exc
    if exp_findings or exp_steps is not None:
        for raw in node.get("input_series") or []:
            if "stale" in str(raw["values"]).split():
                raise SpecError(
                    f"{file}:{_key_line(raw, 'values') or _line(raw) or _line(node)}: values: 'stale' "
                    "is not supported in a test with exp_findings or exp_steps: healer's engine reads "
                    "OpenMetrics, which has no staleness marker, so the value would linger 5 minutes "
                    "(promtool drops it at once); end the series with '_' values, or check it with "
                    "promql_expr_test"
                )
    for step in exp_steps or []:
        if step.step not in STEPS:
            raise SpecError(
                f"{file}:{step.line or _line(node) or 1}: exp_steps: step {step.step!r} "
                f"is not one of {', '.join(STEPS)}"
            )
    return TestCase(
        file=file,
        line=_line(node),
        name=str(node.get("name", f"test at line {_line(node)}")),
        interval=interval,
        series=series,
        exp_findings=exp_findings,
        exp_steps=exp_steps,
        node=node,
    )
