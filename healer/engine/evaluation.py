"""Evaluation: query results + the previous state + ``now`` → alert states, findings, health, changes.

Pure: no I/O, no clock. The caller queries the source (one instant query per rule at ``now``),
measures how long each took, and passes results, durations and the state the previous tick
returned. The semantics are Prometheus's alerting rules (prometheus/prometheus ``rules/alerting.go``,
``AlertingRule.Eval``), per series key (rule name + sorted label set, ``__name__`` dropped)::

    (absent) ──true──> pending ──true for `for`──> firing ──clear for `keep_firing_for`──> resolved
                          │                          ▲  │
                          └──clear──> dropped        └──┘ true again resets the recovery hold

- ``for: 0`` fires on the first true tick; pending since the first true tick of the episode.
- The recovery hold runs from the first clear tick (``Finding.clear_since``), like Prometheus's
  ``KeepFiringSince``; a true tick resets it. One clear sample is not recovery.
- A rule whose query failed (``SourceError``) or was not run (tick deadline) keeps every one of
  its series as it was: no resolve, no new firing, no ``for`` progress. It is listed in
  ``TickFindings.frozen_rules``.
- Rules of ``kind: no_data`` (exporter down, GPU gone) make the nodes of their pending or firing
  series *unknown*: not healthy, not a finding. A fault finding on an unknown node whose series
  vanished keeps its state: an exporter that stops reporting is not a recovery.
- Label values are untrusted: NUL and invalid text are replaced and an overlong node name is
  clipped (:mod:`healer.engine.labels`); such series still count and are reported per rule.
- Which node a series names: with an :class:`~healer.model.addresses.AddressBook` read from the
  cluster, a node label's value counts only when it is a Node's name, or an exporter pod's name
  (that pod's node: dcgm-exporter's ``Hostname`` is its pod's name); else the ``instance``
  address names it (a Node's InternalIP, an exporter pod's IP: node_exporter carries no node
  label). :meth:`~healer.model.addresses.AddressBook.resolve` has the order. Without a book (or
  one the cluster could not fill) a node label's value is taken as it is. Series that still name
  no node are counted and reported per rule with an example and the reason, make the rule's
  health ``degraded`` (never a silent ok), and are never findings: nothing acts on them.

- Alerts mode (``QueryResult.judged``): Prometheus evaluated the rule and judged each series
  itself; a series it reports ``firing`` has met its ``for``, a pending one has not, and one it
  no longer reports is resolved (its ``keep_firing_for`` already ran in Prometheus). Episodes,
  changes, unknown nodes and frozen rules are as above. An engine that evaluated the rule without
  ``keep_firing_for`` (``QueryResult.engine_keeps_firing`` False: vmalert before 1.94) leaves the
  recovery hold to this evaluation, as in query mode; a series it reports again while held (as a
  new, pending alert) is still firing here and its hold starts over.

Errors: none raised for bad data; a duplicate label set in one result is reported as the rule's
error (as Prometheus does) and the rule is frozen for the tick.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal
from enum import StrEnum

from healer.engine.labels import MAX_NODE_NAME, clean_labels, clean_node_name
from healer.errors import QueryError, SourceError
from healer.model.addresses import AddressBook
from healer.model.findings import Finding, TickFindings, UnresolvedSeries
from healer.model.states import FindingState, RuleHealth
from healer.ruleset.schema import Rule, RuleSet

#: Longest series key stored as is (the ``findings.series_key`` column); longer keys are hashed.
MAX_SERIES_KEY = 1000


@dataclass(frozen=True, slots=True)
class AlertState:
    """Prometheus's own judgement of one series of a rule it evaluates (alerts mode).

    ``firing``: the alert's ``for`` is met (else it is pending); ``active_at``: when it became
    active (Prometheus's ``activeAt``); ``keep_firing_since``: set while Prometheus keeps a firing
    alert whose condition is clear (``keep_firing_for``; Prometheus's ``keepFiringSince``).
    """

    firing: bool
    active_at: datetime | None = None
    keep_firing_since: datetime | None = None


@dataclass(frozen=True, slots=True)
class Sample:
    """One series of an instant-query result: its labels and its value (NaN/±Inf possible);
    ``alert`` when the source already judged it (alerts mode, :class:`AlertState`)."""

    labels: Mapping[str, str]
    value: float
    alert: AlertState | None = None


@dataclass(frozen=True)
class QueryResult:
    """A successful instant query: ``samples`` (possibly empty = nothing matched) and the source's
    ``warnings`` (partial data, e.g. a Thanos store down), kept for the rule's report.

    ``judged``: the samples are the rule's pending and firing alerts as Prometheus evaluated them
    (alerts mode): ``for`` and ``keep_firing_for`` were applied by Prometheus, each sample's
    :class:`AlertState` says pending or firing, and a series missing is resolved.
    """

    samples: list[Sample]
    warnings: list[str] = field(default_factory=list)
    judged: bool = False
    engine_keeps_firing: bool = True
    """Judged results only: the engine applied the rule's ``keep_firing_for``. False: it evaluated
    the rule without one (vmalert before 1.94); the evaluation holds firing series itself."""


@dataclass(frozen=True)
class EvaluationState:
    """Alert states carried from one tick to the next: series key → its active (pending or firing)
    episode, as a :class:`Finding`. Resolved episodes are not kept.

    Rebuild it after a restart from the database (``healer.store.evaluations.load_state``) so the
    ``for`` timers resume instead of starting over.
    """

    series: Mapping[str, Finding] = field(default_factory=dict)

    def for_rule(self, rule: str) -> list[Finding]:
        return [f for f in self.series.values() if f.rule == rule]


class ChangeKind(StrEnum):
    """How a series' episode changed in one tick (what persistence writes)."""

    PENDING = "pending"  # new episode, condition true, waiting for `for`
    FIRED = "fired"  # held for `for` (or `for: 0`: new and firing at once)
    RESOLVED = "resolved"  # was firing, clear for `keep_firing_for`
    DROPPED = "dropped"  # was pending, went clear: resolved without having fired
    UPDATED = "updated"  # still pending or firing, seen again: value and last-seen refreshed


@dataclass(frozen=True)
class FindingChange:
    kind: ChangeKind
    finding: Finding


@dataclass(frozen=True)
class RuleReport:
    """One rule's evaluation in one tick (one ``rule_evaluations`` row).

    ``health``: ok; no_data (a ``no_data`` rule reports nodes without data); degraded (evaluated,
    but ``unresolved`` series name no node); error (the rule is
    broken: bad PromQL, duplicate label sets) with ``error``; unavailable (source failed or the
    tick deadline passed) with ``error``. ``by_address`` counts the series named by their
    ``instance`` address rather than a node label, ``by_pod`` those whose node label named an
    exporter pod (the series is that pod's node's). ``cleaned`` counts the series whose label values had
    to be cleaned (:mod:`healer.engine.labels`) and are evaluated anyway. ``series`` counts the
    samples returned; ``pending`` and ``firing`` the rule's episodes after the tick;
    ``duration_seconds`` is the caller's measure of the query (wall clock, seconds).
    """

    rule: str
    group: str
    kind: str
    evaluated_at: datetime
    health: RuleHealth
    duration_seconds: float = 0.0
    error: str | None = None
    series: int = 0
    pending: int = 0
    firing: int = 0
    warnings: list[str] = field(default_factory=list)
    unresolved: UnresolvedSeries | None = None
    cleaned: int = 0
    by_address: int = 0
    by_pod: int = 0

    @property
    def frozen(self) -> bool:
        return self.health in (RuleHealth.ERROR, RuleHealth.UNAVAILABLE)


@dataclass(frozen=True)
class Evaluation:
    """What :func:`evaluate` returns: the ``state`` to pass to the next tick, the ``findings`` for
    the lifecycle, one ``report`` per rule, and the episode ``changes`` to persist."""

    state: EvaluationState
    findings: TickFindings
    reports: list[RuleReport]
    changes: list[FindingChange]


def series_key(rule: str, labels: Mapping[str, str]) -> str:
    """``Rule{a="1",b="2"}``: the rule name and the sorted label set (``__name__`` dropped).

    Keys longer than :data:`MAX_SERIES_KEY` characters become ``Rule{sha256:<hex>}``.
    """
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()) if k != "__name__")
    key = f"{rule}{{{body}}}"
    if len(key) > MAX_SERIES_KEY:
        key = f"{rule}{{sha256:{hashlib.sha256(body.encode()).hexdigest()}}}"
    return key


def _escape(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    # NUL and lone surrogates cannot be stored; \uNNNN keeps the key one-to-one.
    return _UNSTORABLE_IN_KEY.sub(lambda m: f"\\u{ord(m.group()):04x}", escaped)


_UNSTORABLE_IN_KEY = re.compile("[\x00\ud800-\udfff]")


def node_of(labels: Mapping[str, str], node_labels: Iterable[str]) -> str | None:
    """The first present, non-empty label of ``node_labels`` (the rule's chain), or None."""
    for name in node_labels:
        value = labels.get(name)
        if value:
            return value
    return None


def needs_addresses(ruleset: RuleSet, results: Mapping[str, QueryResult | SourceError]) -> bool:
    """Whether any rule's result holds a series, whose node the cluster's address book then
    checks: only then is the book worth reading this tick (a quiet fleet's rules return none)."""
    return any(
        isinstance(outcome, QueryResult) and outcome.samples
        for rule in ruleset.rules
        if (outcome := results.get(rule.name)) is not None
    )


def evaluate(
    *,
    ruleset: RuleSet,
    results: Mapping[str, QueryResult | SourceError],
    previous: EvaluationState,
    now: datetime,
    durations: Mapping[str, float] | None = None,
    not_due: Collection[str] = (),
    addresses: AddressBook | None = None,
) -> Evaluation:
    """Advance every rule of ``ruleset`` by one tick at ``now``.

    Args:
        ruleset: the rules; group names go into the reports.
        results: rule name → its instant query at ``now``: a :class:`QueryResult`, or the
            :class:`~healer.errors.SourceError` it raised. A rule missing here was not queried
            (tick deadline passed): unavailable, frozen.
        previous: the state the previous tick returned (empty at first start).
        now: the tick's evaluation time (aware UTC), the same ``time=`` the queries used.
        durations: rule name → seconds its query took (for the reports); missing = 0.
        not_due: rules whose group is not due this tick (group ``interval``): not queried, their
            state carried over unchanged (still in the findings), no report.
        addresses: checks a series' node label against the cluster's Nodes and exporter pods and
            names the node of a series without one by its ``instance`` host
            (:meth:`~healer.model.addresses.AddressBook.resolve`); None = not looked up (a node
            label's value is taken as it is; series without one are unresolved).

    Series of rules no longer in ``ruleset`` are closed (resolved or dropped) so their rows do not
    stay open forever.
    """
    durations = durations or {}
    by_rule: dict[str, dict[str, Finding]] = {}
    for key, finding in previous.series.items():
        by_rule.setdefault(finding.rule, {})[key] = finding

    pairs = [(g.name, r) for g in ruleset.groups for r in g.rules]
    # no_data rules first: their unknown nodes decide whether a vanished fault series is a recovery.
    pairs.sort(key=lambda p: p[1].kind != "no_data")

    state: dict[str, Finding] = {}
    changes: list[FindingChange] = []
    reports: dict[str, RuleReport] = {}
    unresolved: dict[str, UnresolvedSeries] = {}
    frozen: set[str] = set()
    unknown: set[str] = set()

    for group, rule in pairs:
        prev = by_rule.pop(rule.name, {})
        if rule.name in not_due:
            state.update(prev)
            if rule.kind == "no_data":
                unknown.update(f.node for f in prev.values())
            continue
        outcome = results.get(rule.name)
        duration = float(durations.get(rule.name, 0.0))
        report = _step_rule(
            rule=rule,
            group=group,
            outcome=outcome,
            prev=prev,
            now=now,
            duration=duration,
            unknown=unknown,
            state=state,
            changes=changes,
            addresses=addresses,
        )
        reports[rule.name] = report
        if report.frozen:
            frozen.add(rule.name)
        if report.unresolved is not None:
            unresolved[rule.name] = report.unresolved
        if rule.kind == "no_data":
            unknown.update(f.node for f in state.values() if f.rule == rule.name)

    # Rules removed from the rule set: close their episodes.
    for prev in by_rule.values():
        for finding in prev.values():
            changes.append(_close(finding, now))

    firing: dict[str, list[Finding]] = {}
    pending: dict[str, list[Finding]] = {}
    kinds = {r.name: r.kind for _, r in pairs}
    for key in sorted(state):
        finding = state[key]
        if kinds.get(finding.rule) == "no_data":
            continue
        target = firing if finding.state == FindingState.FIRING else pending
        target.setdefault(finding.node, []).append(finding)

    findings = TickFindings(
        at=now,
        firing=firing,
        pending=pending,
        unknown=frozenset(unknown),
        frozen_rules=frozenset(frozen),
        unresolved=unresolved,
    )
    ordered_reports = [reports[r.name] for g in ruleset.groups for r in g.rules if r.name in reports]
    return Evaluation(
        state=EvaluationState(series=state), findings=findings, reports=ordered_reports, changes=changes
    )


def _step_rule(
    *,
    rule: Rule,
    group: str,
    outcome: QueryResult | SourceError | None,
    prev: dict[str, Finding],
    now: datetime,
    duration: float,
    unknown: set[str],
    state: dict[str, Finding],
    changes: list[FindingChange],
    addresses: AddressBook | None = None,
) -> RuleReport:
    """One rule's tick; writes into ``state`` and ``changes``; returns its report."""
    base = {"rule": rule.name, "group": group, "kind": rule.kind, "evaluated_at": now}

    def frozen_report(health: RuleHealth, error: str, **extra: object) -> RuleReport:
        state.update(prev)
        return RuleReport(
            **base,  # type: ignore[arg-type]
            health=health,
            duration_seconds=duration,
            error=error,
            pending=sum(f.state == FindingState.PENDING for f in prev.values()),
            firing=sum(f.state == FindingState.FIRING for f in prev.values()),
            **extra,  # type: ignore[arg-type]
        )

    if outcome is None:
        return frozen_report(RuleHealth.UNAVAILABLE, "not queried: the tick deadline had passed")
    if isinstance(outcome, QueryError):
        return frozen_report(RuleHealth.ERROR, str(outcome))
    if isinstance(outcome, SourceError):
        return frozen_report(RuleHealth.UNAVAILABLE, str(outcome))

    current: dict[str, tuple[dict[str, str], float, str, AlertState | None]] = {}
    no_node: list[dict[str, str]] = []
    cleaned: list[dict[str, str]] = []
    no_node_why: str | None = None
    by_address = by_pod = 0
    for sample in outcome.samples:
        raw = {k: v for k, v in sample.labels.items() if k != "__name__"}
        labels, changed = clean_labels(raw)
        if addresses is None:
            raw_node = node_of(labels, rule.node_labels)
        else:
            resolved = addresses.resolve(labels, rule.node_labels)
            raw_node = resolved.node
            by_address += resolved.by == "address"
            by_pod += resolved.by == "pod"
            if raw_node is None and not no_node:
                no_node_why = resolved.why
        if raw_node is None:
            no_node.append(labels)
            continue
        node = clean_node_name(raw_node)
        if changed or node != raw_node:
            cleaned.append(labels)
        key = series_key(rule.name, raw)  # the raw labels: cleaning must not merge two series
        if key in current:
            return frozen_report(
                RuleHealth.ERROR,
                f"vector contains metrics with the same labelset after dropping the metric name: {labels}",
                series=len(outcome.samples),
                warnings=list(outcome.warnings),
            )
        current[key] = (labels, sample.value, node, sample.alert)

    unresolved = (
        UnresolvedSeries(
            rule=rule.name,
            count=len(no_node),
            node_labels=rule.node_labels,
            example=no_node[0],
            why=no_node_why,
        )
        if no_node
        else None
    )
    summary_template = rule.summary
    for key, (labels, value, node, alert) in current.items():
        summary = render_template(summary_template, labels, value) if summary_template else ""
        gpu = labels.get(rule.gpu_label) or None
        old = prev.get(key)
        if old is None:
            fires = alert.firing if outcome.judged and alert is not None else rule.for_ <= 0
            since = alert.active_at if alert is not None and alert.active_at is not None else now
            new = Finding(
                rule=rule.name,
                series_key=key,
                node=node,
                gpu=gpu,
                state=FindingState.FIRING if fires else FindingState.PENDING,
                severity=rule.severity,
                value=value,
                unit=rule.unit,
                labels=labels,
                summary=summary,
                active_since=min(since, now),
                fired_at=now if fires else None,
                last_true_at=now,
                clear_since=alert.keep_firing_since if alert is not None else None,
            )
            kind = ChangeKind.FIRED if fires else ChangeKind.PENDING
        else:
            if outcome.judged:
                # Prometheus's word on `for`; a firing episode never goes back to pending.
                fires = old.state == FindingState.PENDING and alert is not None and alert.firing
            else:
                fires = old.state == FindingState.PENDING and _held(old.active_since or now, now, rule.for_)
            holding = alert.keep_firing_since if alert is not None else None
            new = replace(
                old,
                node=node,
                gpu=gpu,
                state=FindingState.FIRING if fires else old.state,
                severity=rule.severity,
                unit=rule.unit,
                value=value,
                labels=labels,
                summary=summary,
                fired_at=now if fires else old.fired_at,
                last_true_at=old.last_true_at if holding is not None else now,
                clear_since=holding,
            )
            kind = ChangeKind.FIRED if fires else ChangeKind.UPDATED
        state[key] = new
        if rule.kind == "fault":
            changes.append(FindingChange(kind, new))

    for key, old in prev.items():
        if key in current:
            continue
        if rule.kind == "fault" and old.node in unknown:
            # The node's exporter is silent: its absence is no evidence either way. Hold still;
            # a recovery hold in progress starts over once data returns (clear must be continuous).
            state[key] = replace(old, clear_since=None) if old.clear_since else old
            continue
        held_by_engine = outcome.judged and outcome.engine_keeps_firing
        if old.state == FindingState.FIRING and rule.keep_firing_for > 0 and not held_by_engine:
            clear_since = old.clear_since or now
            if not _held(clear_since, now, rule.keep_firing_for):
                state[key] = replace(old, clear_since=clear_since)
                continue
        if rule.kind == "fault":
            changes.append(_close(old, now))

    rule_states = [f for f in state.values() if f.rule == rule.name]
    pending = sum(f.state == FindingState.PENDING for f in rule_states)
    firing = sum(f.state == FindingState.FIRING for f in rule_states)
    health = RuleHealth.NO_DATA if rule.kind == "no_data" and rule_states else RuleHealth.OK
    if health == RuleHealth.OK and unresolved is not None:
        health = RuleHealth.DEGRADED
    warnings = list(outcome.warnings)
    if cleaned:
        warnings.append(_cleaned_warning(cleaned))
    return RuleReport(
        **base,  # type: ignore[arg-type]
        health=health,
        duration_seconds=duration,
        series=len(outcome.samples),
        pending=pending,
        firing=firing,
        warnings=warnings,
        unresolved=unresolved,
        cleaned=len(cleaned),
        by_address=by_address,
        by_pod=by_pod,
    )


def _cleaned_warning(cleaned: list[dict[str, str]]) -> str:
    example = ", ".join(f"{k}={v[:80]!r}" for k, v in sorted(cleaned[0].items()))
    return (
        f"{len(cleaned)} series cleaned (NUL or invalid text replaced, node name over "
        f"{MAX_NODE_NAME} characters clipped); still evaluated; e.g. {{{example}}}"
    )


def _held(since: datetime, now: datetime, seconds: float) -> bool:
    return (now - since).total_seconds() >= seconds


def _close(finding: Finding, now: datetime) -> FindingChange:
    kind = ChangeKind.RESOLVED if finding.state == FindingState.FIRING else ChangeKind.DROPPED
    return FindingChange(
        kind,
        replace(
            finding, state=FindingState.RESOLVED, resolved_at=now, clear_since=finding.clear_since or now
        ),
    )


# --- annotation templates ---------------------------------------------------------------------
# A tiny, safe subset of Prometheus's Go templates: nothing is evaluated, unknown actions are
# left as written. Labels are attacker-controllable text and are inserted verbatim, never parsed.

_ACTION = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}")
_LABEL = re.compile(r'^(?:\$labels|\.Labels)\.([A-Za-z_][A-Za-z0-9_]*)$|^index \$labels "([^"]*)"$')
_PRINTF = re.compile(r'^printf\s+"(%[-+ 0#]*\d{0,3}(?:\.\d{1,3})?[dfeEgGs])"$')
_PRINTF_FIRST = re.compile(r'^printf\s+"(%[-+ 0#]*\d{0,3}(?:\.\d{1,3})?[dfeEgGs])"\s+(.+)$')


def render_template(text: str, labels: Mapping[str, str], value: float) -> str:
    """Render ``{{ $labels.x }}``, ``{{ .Labels.x }}``, ``{{ index $labels "x" }}``, ``{{ $value }}``,
    ``{{ .Value }}``, optionally piped through ``humanize`` or ``printf "%.1f"`` (also
    ``{{ printf "%.1f" $value }}``). A missing label renders ``<no value>`` as in Go; anything
    else is left as written."""

    def action(match: re.Match[str]) -> str:
        expr = match.group(1)
        first = _PRINTF_FIRST.match(expr)
        if first:
            expr = f'{first.group(2)} | printf "{first.group(1)}"'
        head, *pipes = [p.strip() for p in expr.split("|")]
        operand: str | float
        lab = _LABEL.match(head)
        if lab:
            operand = labels.get(lab.group(1) or lab.group(2), "<no value>")
        elif head in ("$value", ".Value"):
            operand = value
        else:
            return match.group(0)
        for pipe in pipes:
            rendered = _pipe(pipe, operand)
            if rendered is None:
                return match.group(0)
            operand = rendered
        return operand if isinstance(operand, str) else go_float(operand)

    return _ACTION.sub(action, text)


def _pipe(pipe: str, operand: str | float) -> str | None:
    number: float | None
    if isinstance(operand, float):
        number = operand
    else:
        try:
            number = float(operand)
        except ValueError:
            number = None
    if pipe == "humanize":
        return humanize(number) if number is not None else operand  # type: ignore[return-value]
    fmt = _PRINTF.match(pipe)
    if fmt:
        spec = fmt.group(1)
        if spec.endswith("s"):
            return spec % (operand if isinstance(operand, str) else go_float(operand))
        if number is None:
            return None
        if spec.endswith("d"):
            return spec % int(number) if math.isfinite(number) else go_float(number)
        return spec % number
    return None


def go_float(value: float) -> str:
    """A float as Go's ``%v`` prints it (Prometheus's ``{{ $value }}``): shortest digits, exponent
    form from 1e+06 or below 1e-04 (``78``, ``78.5``, ``1.5e+06``, ``NaN``, ``+Inf``)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "0"
    sign, digit_tuple, exponent = Decimal(repr(value)).normalize().as_tuple()
    assert isinstance(exponent, int)
    digits = "".join(map(str, digit_tuple))
    point = len(digits) + exponent  # the decimal point sits after `point` digits
    exp = point - 1
    prefix = "-" if sign else ""
    if exp < -4 or exp >= 6:  # strconv 'g' with the shortest precision decides at 6 digits
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{prefix}{mantissa}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if point <= 0:
        return f"{prefix}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return f"{prefix}{digits}{'0' * (point - len(digits))}"
    return f"{prefix}{digits[:point]}.{digits[point:]}"


_BIG = ("k", "M", "G", "T", "P", "E", "Z", "Y")
_SMALL = ("m", "u", "n", "p", "f", "a", "z", "y")


def humanize(value: float) -> str:
    """Prometheus's ``humanize``: SI prefixes, 4 significant digits (``1.235k``, ``12m``, ``78``)."""
    if value == 0 or not math.isfinite(value):
        return go_float(value)
    prefix = ""
    if abs(value) >= 1:
        for p in _BIG:
            if abs(value) < 1000:
                break
            prefix, value = p, value / 1000
    else:
        for p in _SMALL:
            if abs(value) >= 1:
                break
            prefix, value = p, value * 1000
    return f"{value:.4g}{prefix}"
