"""Rule evaluation: Prometheus alerting semantics per series, table-driven, time as a parameter."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from healer.controller import scheduled_tick_time
from healer.engine.evaluation import (
    ChangeKind,
    Evaluation,
    EvaluationState,
    QueryResult,
    Sample,
    evaluate,
    go_float,
    humanize,
    render_template,
    series_key,
)
from healer.errors import QueryError, SourceError, SourceUnavailable
from healer.model.states import FindingState, RuleHealth
from healer.ruleset.schema import Rule, RuleGroup, RuleSet

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
HOT = {"Hostname": "gpu-node-07", "gpu": "3", "UUID": "GPU-36f6", "modelName": "NVIDIA H100 80GB HBM3"}
KEY = series_key("GpuTooHot", HOT)


def rule(name: str = "GpuTooHot", *, for_: float = 0, keep: float = 0, **extra: object) -> Rule:
    return Rule.model_validate(
        {
            "name": name,
            "expr": "max by (Hostname, gpu) (DCGM_FI_DEV_GPU_TEMP) > 78",
            "for": for_,
            "keep_firing_for": keep,
            "unit": "degrees C",
            "annotations": {"summary": "GPU {{ $labels.gpu }} at {{ $value }} C"},
            **extra,
        }
    )


def ruleset(*rules: Rule) -> RuleSet:
    return RuleSet(groups=(RuleGroup(name="g", rules=list(rules)),))


def result(*samples: tuple[dict[str, str], float], warnings: Sequence[str] = ()) -> QueryResult:
    return QueryResult(samples=[Sample(labels=lab, value=v) for lab, v in samples], warnings=list(warnings))


TRUE = result((HOT, 84.0))
CLEAR = result()
FAIL = SourceUnavailable("http://prom:9090: query timed out after 10s")
BROKEN = QueryError("http://prom:9090: HTTP 400 bad_data: parse error")
NOT_QUERIED = None  # the tick deadline passed before this rule's turn


@dataclass(frozen=True)
class Tick:
    at: float  # seconds after T0
    outcome: QueryResult | SourceError | None
    state: FindingState | None  # the series' state after the tick; None = no longer tracked
    changes: tuple[ChangeKind, ...] = ()


def run(r: Rule, ticks: Sequence[Tick]) -> list[Evaluation]:
    state = EvaluationState()
    out = []
    for tick in ticks:
        results = {} if tick.outcome is None else {r.name: tick.outcome}
        ev = evaluate(
            ruleset=ruleset(r), results=results, previous=state, now=T0 + timedelta(seconds=tick.at)
        )
        state = ev.state
        out.append(ev)
    return out


P, F = FindingState.PENDING, FindingState.FIRING
C = ChangeKind

SCENARIOS: dict[str, tuple[float, float, list[Tick]]] = {
    # name: (for, keep_firing_for, ticks)
    "for 0 fires on the first true tick": (0, 0, [Tick(0, TRUE, F, (C.FIRED,))]),
    "pending until the condition held for `for`": (
        60,
        0,
        [
            Tick(0, TRUE, P, (C.PENDING,)),
            Tick(30, TRUE, P, (C.UPDATED,)),
            Tick(59, TRUE, P, (C.UPDATED,)),
            Tick(60, TRUE, F, (C.FIRED,)),
            Tick(90, TRUE, F, (C.UPDATED,)),
        ],
    ),
    "pending that goes clear is dropped, and starts over": (
        60,
        0,
        [
            Tick(0, TRUE, P, (C.PENDING,)),
            Tick(30, CLEAR, None, (C.DROPPED,)),
            Tick(60, TRUE, P, (C.PENDING,)),
            Tick(90, TRUE, P, (C.UPDATED,)),
            Tick(120, TRUE, F, (C.FIRED,)),
        ],
    ),
    "no recovery hold: the first clear tick resolves": (
        0,
        0,
        [Tick(0, TRUE, F, (C.FIRED,)), Tick(30, CLEAR, None, (C.RESOLVED,))],
    ),
    "one clear sample is not recovery; true again resets the hold": (
        0,
        120,
        [
            Tick(0, TRUE, F, (C.FIRED,)),
            Tick(30, CLEAR, F),
            Tick(60, TRUE, F, (C.UPDATED,)),
            Tick(90, CLEAR, F),
            Tick(180, CLEAR, F),
            Tick(209, CLEAR, F),
            Tick(210, CLEAR, None, (C.RESOLVED,)),
        ],
    ),
    "resolved then true again is a new episode": (
        0,
        30,
        [
            Tick(0, TRUE, F, (C.FIRED,)),
            Tick(30, CLEAR, F),
            Tick(60, CLEAR, None, (C.RESOLVED,)),
            Tick(90, TRUE, F, (C.FIRED,)),
        ],
    ),
    "keep_firing_for does not hold a pending series": (
        60,
        600,
        [Tick(0, TRUE, P, (C.PENDING,)), Tick(30, CLEAR, None, (C.DROPPED,))],
    ),
    "a failed query keeps a firing series firing (no resolve)": (
        0,
        0,
        [
            Tick(0, TRUE, F, (C.FIRED,)),
            Tick(30, FAIL, F),
            Tick(60, BROKEN, F),
            Tick(90, NOT_QUERIED, F),
            Tick(120, CLEAR, None, (C.RESOLVED,)),
        ],
    ),
    "a failed query does not let a pending series fire": (
        60,
        0,
        [
            Tick(0, TRUE, P, (C.PENDING,)),
            Tick(60, FAIL, P),
            Tick(90, NOT_QUERIED, P),
            Tick(120, TRUE, F, (C.FIRED,)),
        ],
    ),
    "a failed query does not advance or reset the recovery hold": (
        0,
        60,
        [
            Tick(0, TRUE, F, (C.FIRED,)),
            Tick(30, CLEAR, F),
            Tick(60, FAIL, F),
            Tick(90, CLEAR, None, (C.RESOLVED,)),  # hold from 30: 60 s clear by 90
        ],
    ),
    "a failed query creates nothing": (0, 0, [Tick(0, FAIL, None), Tick(30, BROKEN, None)]),
}


@pytest.mark.parametrize(("for_", "keep", "ticks"), SCENARIOS.values(), ids=SCENARIOS.keys())
def test_state_machine(for_: float, keep: float, ticks: list[Tick]) -> None:
    evaluations = run(rule(for_=for_, keep=keep), ticks)
    for tick, ev in zip(ticks, evaluations, strict=True):
        got = ev.state.series.get(KEY)
        assert (got.state if got else None) == tick.state, f"state at t={tick.at}"
        assert tuple(c.kind for c in ev.changes) == tick.changes, f"changes at t={tick.at}"


def test_episode_times() -> None:
    r = rule(for_=60, keep=60)
    ticks = [
        Tick(0, TRUE, P),
        Tick(30, TRUE, P),
        Tick(60, TRUE, F),
        Tick(90, CLEAR, F),
        Tick(150, CLEAR, None),
    ]
    evs = run(r, ticks)
    firing = evs[2].state.series[KEY]
    assert firing.active_since == T0
    assert firing.fired_at == T0 + timedelta(seconds=60)
    assert firing.last_true_at == T0 + timedelta(seconds=60)
    held = evs[3].state.series[KEY]
    assert held.clear_since == T0 + timedelta(seconds=90)
    assert held.last_true_at == T0 + timedelta(seconds=60)
    (resolved,) = evs[4].changes
    assert resolved.kind == C.RESOLVED
    assert resolved.finding.state == FindingState.RESOLVED
    assert resolved.finding.resolved_at == T0 + timedelta(seconds=150)
    assert resolved.finding.active_since == T0  # the episode's start, for the history row


class TestFindings:
    def test_finding_carries_evidence(self) -> None:
        (ev,) = run(rule(), [Tick(0, result(({**HOT, "__name__": "DCGM_FI_DEV_GPU_TEMP"}, 84.5)), F)])
        (finding,) = ev.findings.firing["gpu-node-07"]
        assert finding.rule == "GpuTooHot"
        assert finding.node == "gpu-node-07"
        assert finding.gpu == "3"
        assert finding.value == 84.5
        assert finding.unit == "degrees C"
        assert finding.severity == "critical"
        assert finding.labels == HOT  # __name__ dropped, as Prometheus does for alerts
        assert finding.series_key == KEY
        assert finding.summary == "GPU 3 at 84.5 C"
        assert ev.findings.pending == {}

    def test_pending_findings_are_reported_apart(self) -> None:
        (ev,) = run(rule(for_=60), [Tick(0, TRUE, P)])
        assert ev.findings.firing == {}
        assert [f.rule for f in ev.findings.pending["gpu-node-07"]] == ["GpuTooHot"]

    def test_value_and_summary_follow_the_latest_sample(self) -> None:
        evs = run(rule(), [Tick(0, result((HOT, 80.0)), F), Tick(30, result((HOT, 91.25)), F)])
        (change,) = evs[1].changes
        assert change.kind == C.UPDATED
        assert change.finding.value == 91.25
        assert change.finding.summary == "GPU 3 at 91.25 C"
        assert change.finding.fired_at == T0

    def test_nan_and_inf_values_are_findings_with_that_value(self) -> None:
        a = {**HOT, "gpu": "0"}
        b = {**HOT, "gpu": "1"}
        (ev,) = run(rule(), [Tick(0, result((a, math.nan), (b, math.inf)), None)])
        values = {f.gpu: f.value for f in ev.findings.firing["gpu-node-07"]}
        assert math.isnan(values["0"]) and values["1"] == math.inf
        evidence = {f.gpu: f.evidence["value"] for f in ev.findings.firing["gpu-node-07"]}
        assert evidence == {"0": "NaN", "1": "+Inf"}
        summaries = sorted(f.summary for f in ev.findings.firing["gpu-node-07"])
        assert summaries == ["GPU 0 at NaN C", "GPU 1 at +Inf C"]

    def test_gpu_label_is_configurable(self) -> None:
        r = rule(gpu_label="UUID")
        (ev,) = run(r, [Tick(0, TRUE, F)])
        assert ev.findings.firing["gpu-node-07"][0].gpu == "GPU-36f6"

    def test_series_without_a_gpu_label(self) -> None:
        (ev,) = run(rule(), [Tick(0, result(({"node": "n1", "device": "mlx5_0"}, 1.0)), None)])
        assert ev.findings.firing["n1"][0].gpu is None

    def test_previous_state_is_not_modified(self) -> None:
        r = rule(for_=60)
        first = evaluate(ruleset=ruleset(r), results={r.name: TRUE}, previous=EvaluationState(), now=T0)
        before = dict(first.state.series)
        evaluate(ruleset=ruleset(r), results={r.name: CLEAR}, previous=first.state, now=T0)
        assert dict(first.state.series) == before


NODE_CASES = {
    "Hostname": ({"Hostname": "n1", "hostname": "x"}, "n1"),
    "hostname (newer exporter)": ({"hostname": "n2"}, "n2"),
    "empty Hostname falls through to node": ({"Hostname": "", "node": "n3"}, "n3"),
    "kubernetes_node": ({"kubernetes_node": "n4", "instance": "10.0.0.4:9400"}, "n4"),
    "nodename": ({"nodename": "n5"}, "n5"),
}


@pytest.mark.parametrize(("labels", "node"), NODE_CASES.values(), ids=NODE_CASES.keys())
def test_node_from_the_label_chain(labels: dict[str, str], node: str) -> None:
    (ev,) = run(rule(), [Tick(0, result((labels, 1.0)), None)])
    assert list(ev.findings.firing) == [node]


def test_custom_node_label_chain() -> None:
    r = rule(node_labels=["exported_node", "instance"])
    (ev,) = run(r, [Tick(0, result(({"Hostname": "pod-xyz", "instance": "n9"}, 1.0)), None)])
    assert list(ev.findings.firing) == ["n9"]


def test_series_without_a_node_are_reported_not_dropped() -> None:
    orphans = [({"instance": f"10.0.0.{i}:9400", "gpu": "0"}, 90.0) for i in range(3)]
    (ev,) = run(rule(), [Tick(0, result((HOT, 84.0), *orphans), None)])
    assert list(ev.findings.firing) == ["gpu-node-07"]
    unresolved = ev.findings.unresolved["GpuTooHot"]
    assert unresolved.count == 3
    assert unresolved.example == {"instance": "10.0.0.0:9400", "gpu": "0"}
    assert "3 series without a node label (tried Hostname, hostname, node" in str(unresolved)
    (report,) = ev.reports
    assert report.unresolved == unresolved
    # Series that act on nothing are never a silent "ok" (issue 14, item 5).
    assert report.health == RuleHealth.DEGRADED
    assert report.series == 4


class TestHealth:
    def test_ok_with_counts_duration_and_warnings(self) -> None:
        r = rule()
        ev = evaluate(
            ruleset=ruleset(r),
            results={r.name: result((HOT, 84.0), warnings=["partial: store down"])},
            previous=EvaluationState(),
            now=T0,
            durations={r.name: 0.125},
        )
        (report,) = ev.reports
        assert (report.rule, report.group, report.health, report.error) == ("GpuTooHot", "g", "ok", None)
        assert (report.series, report.firing, report.pending) == (1, 1, 0)
        assert report.duration_seconds == 0.125
        assert report.warnings == ["partial: store down"]
        assert report.evaluated_at == T0

    def test_empty_result_is_ok(self) -> None:
        (ev,) = run(rule(), [Tick(0, CLEAR, None)])
        assert ev.reports[0].health == RuleHealth.OK
        assert ev.findings.frozen_rules == frozenset()

    @pytest.mark.parametrize(
        ("outcome", "health", "error"),
        [
            (BROKEN, RuleHealth.ERROR, "bad_data: parse error"),
            (FAIL, RuleHealth.UNAVAILABLE, "timed out after 10s"),
            (NOT_QUERIED, RuleHealth.UNAVAILABLE, "tick deadline"),
        ],
    )
    def test_failed_rule_is_frozen_with_its_error(
        self, outcome: SourceError | None, health: RuleHealth, error: str
    ) -> None:
        evs = run(rule(), [Tick(0, TRUE, F), Tick(30, outcome, F)])
        report = evs[1].reports[0]
        assert report.health == health
        assert error in (report.error or "")
        assert report.firing == 1
        assert evs[1].findings.frozen_rules == frozenset({"GpuTooHot"})
        # The frozen finding is still reported as firing: the lifecycle sees no recovery.
        assert [f.rule for f in evs[1].findings.firing["gpu-node-07"]] == ["GpuTooHot"]

    def test_duplicate_label_sets_are_a_rule_error(self) -> None:
        a = {**HOT, "__name__": "a"}
        b = {**HOT, "__name__": "b"}
        (ev,) = run(rule(), [Tick(0, result((a, 1.0), (b, 2.0)), None)])
        assert ev.reports[0].health == RuleHealth.ERROR
        assert "same labelset" in (ev.reports[0].error or "")
        assert ev.findings.frozen_rules == frozenset({"GpuTooHot"})

    def test_one_report_per_rule_in_rule_set_order(self) -> None:
        a, b = rule("A"), rule("B", kind="no_data")
        ev = evaluate(ruleset=ruleset(a, b), results={}, previous=EvaluationState(), now=T0)
        assert [r.rule for r in ev.reports] == ["A", "B"]


class TestNoData:
    silent = rule("ExporterSilent", for_=60, keep=120, kind="no_data", actions=["notify"])
    hot = rule("GpuTooHot", keep=60)

    def tick(self, previous: EvaluationState, at: float, silent: QueryResult, hot: QueryResult) -> Evaluation:
        return evaluate(
            ruleset=ruleset(self.hot, self.silent),
            results={"ExporterSilent": silent, "GpuTooHot": hot},
            previous=previous,
            now=T0 + timedelta(seconds=at),
        )

    def test_no_data_nodes_are_unknown_not_findings(self) -> None:
        down = result(({"Hostname": "gpu-node-09"}, 8.0))
        ev = self.tick(EvaluationState(), 0, down, CLEAR)
        assert ev.findings.unknown == frozenset({"gpu-node-09"})  # already while pending
        assert ev.findings.firing == {} and ev.findings.pending == {}
        assert ev.changes == []  # not a finding: nothing to persist
        silent_report = next(r for r in ev.reports if r.rule == "ExporterSilent")
        assert silent_report.health == RuleHealth.NO_DATA
        assert silent_report.pending == 1

    def test_exporter_down_is_not_a_recovery(self) -> None:
        down = result(({"Hostname": "gpu-node-07"}, 8.0))
        ev = self.tick(EvaluationState(), 0, CLEAR, TRUE)
        assert "gpu-node-07" in ev.findings.firing
        # The exporter stops: the hot series vanishes, the node is unknown; for far longer than
        # the recovery hold, the finding stays firing and nothing resolves.
        for at in (30, 60, 120, 600):
            ev = self.tick(ev.state, at, down, CLEAR)
            assert ev.findings.unknown == frozenset({"gpu-node-07"})
            assert [f.rule for f in ev.findings.firing["gpu-node-07"]] == ["GpuTooHot"]
            assert ev.changes == []
        # Back, and still clear: now the recovery hold runs, from the first clear tick with data.
        ev = self.tick(ev.state, 630, CLEAR, CLEAR)
        assert "gpu-node-07" in ev.findings.unknown  # the no_data rule's own recovery hold
        assert ev.state.series[KEY].clear_since is None
        ev = self.tick(ev.state, 900, CLEAR, CLEAR)
        assert ev.findings.unknown == frozenset()
        assert ev.state.series[KEY].clear_since == T0 + timedelta(seconds=900)
        ev = self.tick(ev.state, 960, CLEAR, CLEAR)
        assert [c.kind for c in ev.changes] == [C.RESOLVED]

    def test_recovery_hold_starts_over_after_a_gap_in_data(self) -> None:
        down = result(({"Hostname": "gpu-node-07"}, 8.0))
        ev = self.tick(EvaluationState(), 0, CLEAR, TRUE)
        ev = self.tick(ev.state, 30, CLEAR, CLEAR)  # clear: the 60 s hold starts at 30
        assert ev.state.series[KEY].clear_since == T0 + timedelta(seconds=30)
        ev = self.tick(ev.state, 60, down, CLEAR)  # then no data
        assert ev.state.series[KEY].clear_since is None
        ev = self.tick(ev.state, 130, down, CLEAR)
        ev = self.tick(ev.state, 200, CLEAR, CLEAR)  # the no_data rule holds the node unknown
        ev = self.tick(ev.state, 400, CLEAR, CLEAR)  # data and clear again: the hold restarts here
        assert ev.state.series[KEY].clear_since == T0 + timedelta(seconds=400)
        assert ev.changes == []

    def test_unknown_node_does_not_freeze_other_nodes(self) -> None:
        down = result(({"Hostname": "gpu-node-09"}, 8.0))
        ev = self.tick(EvaluationState(), 0, CLEAR, TRUE)
        ev = self.tick(ev.state, 30, down, CLEAR)
        ev = self.tick(ev.state, 90, down, CLEAR)
        assert [c.kind for c in ev.changes] == [C.RESOLVED]


def test_removed_rule_closes_its_episodes() -> None:
    a, b = rule("A", for_=60), rule("B")
    labels = {"Hostname": "n1"}
    first = evaluate(
        ruleset=ruleset(a, b),
        results={"A": result((labels, 1.0)), "B": result((labels, 1.0))},
        previous=EvaluationState(),
        now=T0,
    )
    ev = evaluate(ruleset=ruleset(a), results={"A": result((labels, 1.0))}, previous=first.state, now=T0)
    assert sorted((c.finding.rule, c.kind) for c in ev.changes) == [("A", C.UPDATED), ("B", C.RESOLVED)]
    assert [f.rule for f in ev.state.series.values()] == ["A"]


def test_rules_not_due_keep_their_state_and_stay_in_the_findings() -> None:
    a, b = rule("A"), rule("B")
    labels = {"Hostname": "n1"}
    first = evaluate(
        ruleset=ruleset(a, b),
        results={"A": result((labels, 1.0)), "B": result((labels, 1.0))},
        previous=EvaluationState(),
        now=T0,
    )
    # B's group is not due: it is not queried, not reported, not frozen, and still firing.
    ev = evaluate(
        ruleset=ruleset(a, b),
        results={"A": CLEAR},
        previous=first.state,
        now=T0 + timedelta(seconds=10),
        not_due={"B"},
    )
    assert [r.rule for r in ev.reports] == ["A"]
    assert ev.findings.frozen_rules == frozenset()
    assert [f.rule for f in ev.findings.firing["n1"]] == ["B"]
    assert [c.finding.rule for c in ev.changes if c.kind == C.RESOLVED] == ["A"]


class TestSeriesKey:
    def test_sorted_labels_without_metric_name(self) -> None:
        assert series_key("R", {"b": "2", "a": "1", "__name__": "m"}) == 'R{a="1",b="2"}'

    def test_escaped(self) -> None:
        assert series_key("R", {"a": 'x"y\\z\n'}) == 'R{a="x\\"y\\\\z\\n"}'

    def test_long_keys_are_hashed(self) -> None:
        key = series_key("R", {"err_msg": "x" * 2000})
        assert key.startswith("R{sha256:") and len(key) < 100


TEMPLATES = {
    "label": ("GPU {{ $labels.gpu }}", "GPU 3"),
    "dot form": ("{{ .Labels.Hostname }}/{{ .Value }}", "gpu-node-07/84.5"),
    "index form": ('{{ index $labels "gpu" }}', "3"),
    "value": ("{{ $value }} C", "84.5 C"),
    "humanize": ("{{ $value | humanize }}", "84.5"),
    "printf pipe": ('{{ $value | printf "%.0f" }}', "84"),
    "printf call": ('{{ printf "%.2f" $value }}', "84.50"),
    "missing label": ("{{ $labels.pod }}", "<no value>"),
    "unknown action stays as written": ("{{ .Evil.Call }} {{ range . }}", "{{ .Evil.Call }} {{ range . }}"),
    "no templates": ("plain", "plain"),
    "label text is not re-rendered": ("{{ $labels.err_msg }}", "{{ $value }}"),
}


@pytest.mark.parametrize(("text", "want"), TEMPLATES.values(), ids=TEMPLATES.keys())
def test_render_template(text: str, want: str) -> None:
    labels = {**HOT, "err_msg": "{{ $value }}"}
    assert render_template(text, labels, 84.5) == want


@pytest.mark.parametrize(
    ("value", "go", "human"),
    [
        (78.0, "78", "78"),
        (84.25, "84.25", "84.25"),
        (1e6, "1e+06", "1M"),
        (1234567.0, "1.234567e+06", "1.235M"),
        (0.0001, "0.0001", "100u"),
        (0.5, "0.5", "500m"),
        (-3.0, "-3", "-3"),
        (0.0, "0", "0"),
        (math.nan, "NaN", "NaN"),
        (-math.inf, "-Inf", "-Inf"),
    ],
)
def test_value_formatting_like_prometheus(value: float, go: str, human: str) -> None:
    assert (go_float(value), humanize(value)) == (go, human)


# --- `for` at the scheduled tick time ------------------------------------------------------------

EPSILON = timedelta(microseconds=300)  # the clock read of issue 19: a fraction of a millisecond


def test_for_fires_at_the_tick_scheduled_for_seconds_after_active_since() -> None:
    """Ticks at scheduled times T0, T0+15, T0+30: a `for: 30s` fires at the third, exactly held."""
    evaluations = run(
        rule(for_=30), [Tick(0, TRUE, FindingState.PENDING), Tick(15, TRUE, FindingState.PENDING)]
    )
    state = evaluations[-1].state
    fired = evaluate(
        ruleset=ruleset(rule(for_=30)),
        results={"GpuTooHot": TRUE},
        previous=state,
        now=T0 + timedelta(seconds=30),
    )
    assert fired.state.series[KEY].state == FindingState.FIRING
    assert [c.kind for c in fired.changes] == [ChangeKind.FIRED]


def test_for_judged_at_a_clock_read_just_early_waits_a_tick_the_scheduled_time_does_not() -> None:
    """The failing case of issue 19: active_since came from a clock read ε after its tick's
    schedule, the next clock read is ε' < ε after its own, so active_since + for == read + (ε - ε').
    Evaluated at the clock reads, the `for` is not yet held and firing waits a whole tick; the
    controller evaluates at the scheduled times instead (``scheduled_tick_time``), which are
    exactly ``for`` apart."""
    r = rule(for_=30)
    period = 30.0
    first_read, second_read = T0 + EPSILON, T0 + timedelta(seconds=30) + EPSILON / 3
    pending = evaluate(ruleset=ruleset(r), results={r.name: TRUE}, previous=EvaluationState(), now=first_read)
    # The bug: judged at the clock reads, active_since + for == second read + 2ε/3, not held.
    late = evaluate(ruleset=ruleset(r), results={r.name: TRUE}, previous=pending.state, now=second_read)
    assert late.state.series[KEY].state == FindingState.PENDING

    # The fix: both ticks at their scheduled times.
    at = [scheduled_tick_time(T0, period, read) for read in (first_read, second_read)]
    assert at == [T0, T0 + timedelta(seconds=30)]
    pending = evaluate(ruleset=ruleset(r), results={r.name: TRUE}, previous=EvaluationState(), now=at[0])
    assert pending.state.series[KEY].active_since == T0
    fired = evaluate(ruleset=ruleset(r), results={r.name: TRUE}, previous=pending.state, now=at[1])
    assert fired.state.series[KEY].state == FindingState.FIRING
    assert fired.state.series[KEY].fired_at == T0 + timedelta(seconds=30)
