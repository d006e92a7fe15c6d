"""``healer rules test``: run rule test files (:mod:`healer.ruletest.spec`) on Prometheus and the engine.

Every test's ``input_series`` is expanded with promtool's semantics and laid out on its own day
(:data:`SLOT_SECONDS` apart, so range selectors of one test never see another's samples); all of
it becomes TSDB blocks (``promtool tsdb create-blocks-from openmetrics``) served by one throwaway
``prometheus`` (:mod:`healer.sources.scratch`). Each rule's ``expr`` is then evaluated by that
Prometheus as a range query with the file's ``evaluation_interval`` as step (the same values the
controller's instant queries would get), and the ticks go through the same pure evaluation,
lifecycle and safety code as the controller (:class:`healer.engine.replay.Replay`).

A file whose rule files are Prometheus rule files (``alert:``/``record:``) is promtool's own test
file: promtool runs it as written and gives its verdict per test case (:mod:`healer.ruletest.promtool`).
A healer test's ``promql_expr_test`` goes to promtool too, over the test's input series.

A failure names the file and line of the expectation, the test, and shows expected against got
(``-`` expected but missing, ``+`` got but not expected, two spaces: as expected).
"""

from __future__ import annotations

import difflib
import glob
import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from ruamel.yaml.comments import CommentedMap, CommentedSeq

from healer.engine.replay import STEP_KINDS, Replay, ReplaySettings
from healer.errors import SourceError
from healer.model.findings import Finding, TickFindings
from healer.ruleset.device_filter import ALL_DEVICES, DeviceFilter
from healer.ruleset.loading import validate_rules
from healer.ruleset.schema import DEFAULT_NODE_LABELS, RuleSet
from healer.ruletest.promtool import (
    HEALER_FILE_KEYS,
    HEALER_TEST_KEYS,
    Case,
    Verdict,
    resolve_rule_files,
    rule_file_kind,
    run_cases,
)
from healer.ruletest.series import openmetrics
from healer.ruletest.spec import ExpFindings, SpecError, TestCase, TestFile, load, read_document
from healer.sources.history import history_ticks
from healer.sources.prometheus_range import PrometheusRange
from healer.sources.scratch import scratch_prometheus

#: Seconds between the starts of two tests' data (whole days, at least this much apart).
SLOT_SECONDS = 86400.0
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Failure:
    """One failed expectation (or a test that could not run): ``where`` is ``file:line``."""

    where: str
    test: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: test {self.test!r}: {self.message}"


@dataclass
class Outcome:
    """What a run found: tests run, failures, files that could not be run at all (``errors`` says
    why, ``files_not_run`` how many), and the rule files' warnings (as ``healer rules validate``)."""

    tests: int = 0
    failures: list[Failure] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    files_not_run: int = 0

    @property
    def ok(self) -> bool:
        return not self.failures and not self.errors


def fmt_seconds(seconds: float) -> str:
    """Seconds as a Prometheus duration (``90`` → ``1m30s``, ``0`` → ``0s``)."""
    rest = round(seconds)
    if rest == 0:
        return "0s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size:
            parts.append(f"{rest // size}{unit}")
            rest %= size
    return "".join(parts)


def run(paths: Sequence[str | Path], *, device_filter: DeviceFilter = ALL_DEVICES) -> Outcome:
    """Run every test of the files ``paths``; never raises for a failing or broken test file.

    ``device_filter``: the settings' InfiniBand device filter, written into the rules under test.
    """
    outcome = Outcome()
    loaded: list[tuple[TestFile, RuleSet]] = []
    for path in paths:
        try:
            doc = read_document(path)
            if _is_promtool_file(Path(path), doc):
                _run_promtool_file(Path(path), doc, outcome)
                continue
            spec = load(path, doc)
        except SpecError as exc:
            outcome.errors.append(str(exc))
            outcome.files_not_run += 1
            continue
        # The checks of `healer rules validate`, PromQL included, before any test runs.
        checked = validate_rules(spec.rule_files, device_filter=device_filter)
        outcome.warnings.extend(w for w in checked.warnings if w not in outcome.warnings)
        problems = [str(p) for p in checked.problems]
        if checked.ruleset is not None:
            problems = unknown_rules(spec, checked.ruleset)
        if problems or checked.ruleset is None:
            outcome.errors.extend(problems)
            outcome.files_not_run += 1
            continue
        loaded.append((spec, checked.ruleset))
    if not loaded:
        return outcome
    slots: list[tuple[TestFile, RuleSet, TestCase, float]] = []
    offset = 0.0
    for spec, ruleset in loaded:
        for test in spec.tests:
            slots.append((spec, ruleset, test, offset))
            span = max(test.end, max((len(s.values) for s in test.series), default=0) * test.interval)
            offset += math.ceil((span + SLOT_SECONDS) / SLOT_SECONDS) * SLOT_SECONDS
    text = openmetrics((s, start, test.interval) for _, _, test, start in slots for s in test.series)
    try:
        with scratch_prometheus(text) as url:
            source = PrometheusRange(url, timeout_seconds=30.0)
            for spec, ruleset, test, start in slots:
                outcome.tests += 1
                if test.checked_by_engine:
                    outcome.failures.extend(_run_test(source, spec, ruleset, test, start))
    except SourceError as exc:
        outcome.errors.append(f"cannot run the tests: {exc}")
    for spec, _ in loaded:
        _run_promql_parts(spec, outcome)
    return outcome


def _line_of(node: object, key: str | int) -> int:
    """1-based line of a mapping's ``key`` or a sequence's item ``key`` (1 when unknown)."""
    lc = getattr(node, "lc", None)
    try:
        return int((lc.key(key) if isinstance(key, str) else lc.item(key))[0]) + 1  # type: ignore[union-attr]
    except (AttributeError, KeyError, IndexError, TypeError):
        return 1


def _is_promtool_file(path: Path, doc: CommentedMap) -> bool:
    """Whether ``doc`` is promtool's own test file: its rule files are Prometheus rule files, or
    (none readable) it uses none of healer's keys. Raises SpecError for a mix of both formats."""
    raw = doc.get("rule_files")
    entries = [str(e) for e in raw] if isinstance(raw, list) else []  # promtool reports other shapes
    files = [Path(f) for pattern in resolve_rule_files(path, entries) for f in sorted(glob.glob(pattern))]
    kinds = {k for k in map(rule_file_kind, files) if k}
    if len(kinds) > 1:
        raise SpecError(
            f"{path}:{_line_of(doc, 'rule_files')}: rule_files: mixes Prometheus rule files (alert:, "
            "record:) and healer rule files (name:): a test file tests one kind"
        )
    healer_keys = [str(k) for k in doc if k in HEALER_FILE_KEYS]
    tests = doc.get("tests")
    for test in tests if isinstance(tests, list) else []:
        if isinstance(test, dict):
            healer_keys.extend(str(k) for k in test if k in HEALER_TEST_KEYS)
    if kinds == {"prometheus"} and healer_keys:
        key = healer_keys[0]
        node = doc if key in doc else next(t for t in tests if isinstance(t, dict) and key in t)
        raise SpecError(
            f"{path}:{_line_of(node, key)}: unsupported key {key!r} with Prometheus rule files "
            f"({', '.join(map(str, files))}): healer's expectations need healer rule files; "
            "check these rules' alerts with alert_rule_test"
        )
    return kinds == {"prometheus"} or (not kinds and not healer_keys)


def _cases(path: Path, doc: CommentedMap) -> list[Case]:
    tests = doc.get("tests")
    out = []
    for i, test in enumerate(tests if isinstance(tests, CommentedSeq) else []):
        if isinstance(test, CommentedMap):
            line = _line_of(tests, i)
            out.append(Case(line, str(test.get("name") or f"test at line {line}"), test))
    return out


def _record(path: Path, verdict: Verdict, cases: int, outcome: Outcome) -> None:
    if verdict.error is not None:
        outcome.errors.append(verdict.error.message)
        outcome.files_not_run += 1
        return
    outcome.tests += cases
    for failure in verdict.failures:
        outcome.failures.append(
            Failure(
                f"{path}:{failure.case.line}",
                failure.case.name,
                "promtool test rules:\n" + textwrap.indent(textwrap.dedent(failure.message), "    "),
            )
        )


def _run_promtool_file(path: Path, doc: CommentedMap, outcome: Outcome) -> None:
    """promtool's own test file, run by promtool as written; a verdict per test case."""
    cases = _cases(path, doc)
    _record(path, run_cases(path, doc, cases, unchanged=True), len(cases), outcome)


def _run_promql_parts(spec: TestFile, outcome: Outcome) -> None:
    """The ``promql_expr_test`` of a healer test file's tests, run by promtool over each test's input
    series (no rule files: healer's are not Prometheus's). A test without ``interval`` gets healer's
    default, the file's ``evaluation_interval``, so both parts read the same samples."""
    cases = []
    for test in spec.tests:
        if test.node is None or "promql_expr_test" not in test.node:
            continue
        part = CommentedMap()
        part["name"] = test.name
        part["interval"] = fmt_seconds(test.interval)
        for key in ("input_series", "promql_expr_test"):
            if key in test.node:
                part[key] = test.node[key]
        cases.append(Case(test.line, test.name, part))
    if not cases:
        return
    doc = CommentedMap()
    doc["evaluation_interval"] = fmt_seconds(spec.evaluation_interval)
    verdict = run_cases(Path(spec.path), doc, cases, unchanged=False, rule_files=[])
    _record(Path(spec.path), verdict, 0, outcome)


def unknown_rules(spec: TestFile, ruleset: RuleSet) -> list[str]:
    """``file:line: exp_findings: unknown rule 'X' (did you mean 'Y'?)`` for each expectation
    naming a rule that the test file's rule files do not define."""
    names = [r.name for r in ruleset.rules]
    out: list[str] = []
    for test in spec.tests:
        for exp in test.exp_findings:
            if exp.rule in names:
                continue
            close = difflib.get_close_matches(exp.rule, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (rules: {', '.join(names)})"
            where = f"{spec.path}:{exp.rule_line or exp.line}"
            out.append(f"{where}: exp_findings: unknown rule {exp.rule!r}{hint}")
    return out


def _run_test(
    source: PrometheusRange, spec: TestFile, ruleset: RuleSet, test: TestCase, start_s: float
) -> list[Failure]:
    start = _EPOCH + timedelta(seconds=start_s)
    nodes = {n for s in test.series for n in [_node(s.label_map())] if n}
    replay = Replay(
        ruleset,
        ReplaySettings(
            limits=spec.limits, recovery_hold_seconds=spec.recovery_hold, fleet_size=len(nodes) or None
        ),
    )
    step = spec.evaluation_interval
    wanted = {_tick_index(e.eval_time, step) for e in test.exp_findings}
    at_tick: dict[int, TickFindings] = {}
    failures: list[Failure] = []
    queries = {r.name: r.expr for r in ruleset.rules}
    broken: set[str] = set()
    for i, (at, results) in enumerate(
        history_ticks(
            source, queries, start=start, end=start + timedelta(seconds=test.end), step_seconds=step
        )
    ):
        for rule, result in results.items():
            if isinstance(result, SourceError) and rule not in broken:
                broken.add(rule)
                failures.append(Failure(f"{test.file}:{test.line}", test.name, f"rule {rule}: {result}"))
        findings = replay.tick(at, results)
        if i in wanted:
            at_tick[i] = findings
    for exp in test.exp_findings:
        got = at_tick.get(_tick_index(exp.eval_time, step))
        firing = [f for fs in got.firing.values() for f in fs if f.rule == exp.rule] if got else []
        failure = _compare_findings(test, exp, firing)
        if failure:
            failures.append(failure)
    if test.exp_steps is not None:
        failures.extend(_compare_steps(test, replay, start))
    return failures


def _node(labels: dict[str, str]) -> str | None:
    for name in DEFAULT_NODE_LABELS:
        if labels.get(name):
            return labels[name]
    return None


def _tick_index(seconds: float, step: float) -> int:
    """The last tick at or before ``seconds`` (promtool's alert state at ``eval_time``)."""
    return math.floor(seconds / step + 1e-9)


def _labels_text(labels: dict[str, str]) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def _compare_findings(test: TestCase, exp: ExpFindings, firing: list[Finding]) -> Failure | None:
    keys = {k for e in exp.findings for k in e.labels}
    remaining = list(firing)
    lines: list[str] = []
    ok = True
    for e in exp.findings:
        match = next(
            (
                f
                for f in remaining
                if f.node == e.node and all(f.labels.get(k) == v for k, v in e.labels.items())
            ),
            None,
        )
        text = f"{e.node} {_labels_text(e.labels)}"
        if match is None:
            ok = False
            lines.append(f"- {text}")
        else:
            remaining.remove(match)
            lines.append(f"  {text}")
    for f in sorted(remaining, key=lambda f: (f.node, f.series_key)):
        ok = False
        shown = {k: v for k, v in f.labels.items() if k in keys} if keys else {}
        lines.append(f"+ {f.node} {_labels_text(shown)}  ({f.series_key})")
    if ok:
        return None
    return Failure(
        f"{test.file}:{exp.line}",
        test.name,
        f"firing findings of {exp.rule} at {fmt_seconds(exp.eval_time)}: expected (-) vs got (+):\n"
        + "\n".join(f"    {line}" for line in lines),
    )


def _compare_steps(test: TestCase, replay: Replay, start: datetime) -> list[Failure]:
    assert test.exp_steps is not None
    got: dict[tuple[str, str], float] = {}
    for event in replay.result().events:
        if event.kind in STEP_KINDS:
            key = (event.node, str(event.kind))
            got.setdefault(key, (event.at - start).total_seconds())
    lines: list[str] = []
    ok = True
    bad_lines: list[int] = []
    expected = {(s.node, s.step): s for s in test.exp_steps}
    for (node, step), exp in expected.items():
        at = got.get((node, step))
        if at is None:
            ok = False
            bad_lines.append(exp.line)
            lines.append(f"- {node} {step} by {fmt_seconds(exp.at)}")
        elif at > exp.at + 1e-6:
            ok = False
            bad_lines.append(exp.line)
            lines.append(f"- {node} {step} by {fmt_seconds(exp.at)}")
            lines.append(f"+ {node} {step} at {fmt_seconds(at)}")
        else:
            lines.append(f"  {node} {step} by {fmt_seconds(exp.at)} (at {fmt_seconds(at)})")
    for (node, step), at in sorted(got.items(), key=lambda kv: (kv[1], kv[0])):
        if (node, step) not in expected:
            ok = False
            lines.append(f"+ {node} {step} at {fmt_seconds(at)}")
    if ok:
        return []
    line = min(bad_lines or [s.line for s in test.exp_steps] or [test.line]) or test.line
    return [
        Failure(
            f"{test.file}:{line}",
            test.name,
            f"steps by {fmt_seconds(test.end)}: expected (-) vs got (+):\n"
            + "\n".join(f"    {x}" for x in lines),
        )
    ]
