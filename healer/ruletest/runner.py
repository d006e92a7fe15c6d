"""``healer rules test``: run rule test files (:mod:`healer.ruletest.spec`) on Prometheus and the engine.

Every test's ``input_series`` is expanded with promtool's semantics and laid out on its own day
(:data:`SLOT_SECONDS` apart, so range selectors of one test never see another's samples); all of
it becomes TSDB blocks (``promtool tsdb create-blocks-from openmetrics``) served by one throwaway
``prometheus`` (:mod:`healer.sources.scratch`). Each rule's ``expr`` is then evaluated by that
Prometheus as a range query with the file's ``evaluation_interval`` as step (the same values the
controller's instant queries would get), and the ticks go through the same pure evaluation,
lifecycle and safety code as the controller (:class:`healer.engine.replay.Replay`).

A failure names the file and line of the expectation, the test, and shows expected against got
(``-`` expected but missing, ``+`` got but not expected, two spaces: as expected).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from healer.engine.replay import STEP_KINDS, Replay, ReplaySettings
from healer.errors import SourceError
from healer.model.findings import Finding, TickFindings
from healer.ruleset.loading import validate_rules
from healer.ruleset.schema import DEFAULT_NODE_LABELS, RuleSet
from healer.ruletest.series import openmetrics
from healer.ruletest.spec import ExpFindings, SpecError, TestCase, TestFile, load
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


def run(paths: Sequence[str | Path]) -> Outcome:
    """Run every test of the files ``paths``; never raises for a failing or broken test file."""
    outcome = Outcome()
    loaded: list[tuple[TestFile, RuleSet]] = []
    for path in paths:
        try:
            spec = load(path)
        except SpecError as exc:
            outcome.errors.append(str(exc))
            outcome.files_not_run += 1
            continue
        # The checks of `healer rules validate`, PromQL included, before any test runs.
        checked = validate_rules(spec.rule_files)
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
                outcome.failures.extend(_run_test(source, spec, ruleset, test, start))
    except SourceError as exc:
        outcome.errors.append(f"cannot run the tests: {exc}")
    return outcome


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
