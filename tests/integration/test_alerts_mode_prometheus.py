"""Alerts mode end to end: a real Prometheus loaded with the file `healer rules export` writes,
scraping the fleet simulator with faults; healer reads the alerts of its rules.

- alerts mode yields the same findings (rule, series, node, GPU, state) and unknown nodes as query
  mode on the same data, from its first tick (Prometheus already judged `for`);
- a rule whose evaluation fails in Prometheus is not judged: health error with Prometheus's
  error, frozen (a firing finding neither resolves nor changes);
- a rule evaluation that stopped (lastEvaluation too old), a rule Prometheus does not have or
  holds in another version: unavailable, frozen;
- `healer evaluate --once` in alerts mode prints the same findings with one request.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from healer.detection import DetectionResult, run_detection
from healer.engine.evaluation import ChangeKind, EvaluationState
from healer.model.findings import Finding
from healer.model.states import FindingState, RuleHealth
from healer.ruleset.export import prometheus_rule_file
from healer.ruleset.loading import load_ruleset
from healer.ruleset.schema import Rule, RuleGroup, RuleSet
from healer.sources.alerts import PrometheusAlertsSource
from healer.sources.prometheus import PrometheusSource
from healer_dev.simulator import Fleet, FleetConfig, ManualClock, SimulatorServer, parse_scenario
from tests.prometheus_releases import PrometheusRelease
from tests.services import (
    PrometheusServer,
    simulator_targets,
    wait_until,
)

pytestmark = pytest.mark.prometheus

REPO = Path(__file__).resolve().parents[2]
FOR, HOLD = "2s", "3s"
FAULT_AT = 60
HOT, SLOW, XID79, REMAP, THROTTLE, DOWN = (
    "gpu-node-01",
    "gpu-node-02",
    "gpu-node-04",
    "gpu-node-06",
    "gpu-node-11",
    "gpu-node-13",
)
# Faults that last: both modes must see the same thing whenever they look.
FAULTS: list[dict[str, object]] = [
    {"at": FAULT_AT, "node": HOT, "gpu": 3, "fault": "hot_gpu", "target": 86},
    {"at": FAULT_AT, "node": SLOW, "gpu": 1, "fault": "thermal_slowdown", "reasons": 0x48},
    {"at": FAULT_AT, "node": XID79, "gpu": 5, "fault": "xid", "code": 79},
    {"at": FAULT_AT, "node": REMAP, "gpu": 4, "fault": "row_remap_failure"},
    {"at": FAULT_AT, "node": THROTTLE, "gpu": 6, "fault": "silent_throttle", "tensor_active": 0.1},
    {"at": FAULT_AT, "node": DOWN, "fault": "exporter_down"},
]
EXPECTED_FIRING = {
    ("GpuTooHot", HOT),
    ("GpuThermalMarginLow", HOT),
    ("GpuHardwareSlowdown", SLOW),
    ("GpuFatalXid", XID79),
    ("GpuRowRemapFailure", REMAP),
    ("GpuSilentThrottling", THROTTLE),
}
#: Fails in Prometheus at every evaluation (8 GPUs per Hostname on each side: many-to-many), while
#: `promtool check rules` accepts it.
BROKEN = "GpuBrokenJoin"
STALE = 20.0  # intervals of 1 s
BROKEN_EXPR = "DCGM_FI_DEV_GPU_TEMP * on (Hostname) DCGM_FI_DEV_GPU_TEMP > 0"


def shortened_rules(into: Path) -> Path:
    """The default pack's files with every `for` cut to FOR, `keep_firing_for` to HOLD, and every
    group's interval to 1s (PromQL unchanged), written as healer rule files into ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    for path in sorted((REPO / "rules").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        for group in doc["groups"]:
            group["interval"] = "1s"
            for rule in group["rules"]:
                if rule.get("for") not in (None, "0s", 0):
                    rule["for"] = FOR
                if rule.get("keep_firing_for") not in (None, "0s", 0):
                    rule["keep_firing_for"] = HOLD
        (into / path.name).write_text(yaml.safe_dump(doc, sort_keys=False))
    return into


def with_broken_rule(ruleset: RuleSet) -> RuleSet:
    broken = Rule.model_validate({"name": BROKEN, "expr": BROKEN_EXPR, "actions": ["quarantine"]})
    return RuleSet(groups=(*ruleset.groups, RuleGroup(name="broken", interval=1, rules=[broken])))


@dataclass
class Setup:
    prometheus: PrometheusServer
    rules_dir: Path
    ruleset: RuleSet


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, prometheus_release: PrometheusRelease) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("alerts")
    rules_dir = shortened_rules(tmp / "rules")
    ruleset = load_ruleset([rules_dir])
    exported = tmp / "healer.rules.yml"
    # What Prometheus loads: the export of healer's rules, plus one rule that fails there.
    exported.write_text(
        yaml.safe_dump(prometheus_rule_file(with_broken_rule(ruleset), default_interval_seconds=30))
    )
    check = subprocess.run(
        [prometheus_release.promtool, "check", "rules", str(exported)], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr

    clock = ManualClock(0)
    scenario = parse_scenario(yaml.safe_dump({"name": "alerts-mode", "faults": FAULTS}))
    fleet = Fleet(FleetConfig(nodes=16, hcas=2, seed=0, idle_fraction=0.2), scenario)
    with SimulatorServer(fleet, clock=clock) as sim:
        targets = simulator_targets(fleet.targets(sim.address), sim.address)
        with prometheus_release.server(targets, scrape_interval="1s", rule_files=[exported]) as prom:
            prom.wait_for_targets_up(len(targets))
            wait_until(
                lambda: len(prom.query("count_over_time(up[1m]) >= 2")) == len(targets),
                timeout=20,
                what="two scrapes of every target",
            )
            clock.set(FAULT_AT + 30)
            line = Setup(prometheus=prom, rules_dir=rules_dir, ruleset=ruleset)

            def all_firing() -> bool:
                return firing_where(alerts_tick(line)) >= EXPECTED_FIRING

            wait_until(all_firing, timeout=60, interval=0.5, what="every expected alert firing")
            yield line


def alerts_tick(
    setup: Setup,
    *,
    ruleset: RuleSet | None = None,
    state: EvaluationState | None = None,
    now: datetime | None = None,
) -> DetectionResult:
    # Groups run every second here: allow a loaded test machine's Prometheus 20 s of lag.
    with PrometheusAlertsSource(
        setup.prometheus.url, timeout_seconds=5, tick_deadline_seconds=15, stale_after_intervals=STALE
    ) as source:
        result = run_detection(
            ruleset=ruleset or setup.ruleset,
            source=source,
            session_factory=None,
            state=state or EvaluationState(),
            now=now or datetime.now(UTC),
        )
        assert source.queries_sent == result.queries == 1
    return result


def query_ticks(setup: Setup, seconds: float) -> list[DetectionResult]:
    """Query mode from an empty state, ticking every 0.5 s until a tick is ``seconds`` after the
    first (past every `for`, however long each tick takes on a loaded machine)."""
    out: list[DetectionResult] = []
    state = EvaluationState()
    with PrometheusSource(setup.prometheus.url, timeout_seconds=5, tick_deadline_seconds=15) as source:
        while not out or (out[-1].findings.at - out[0].findings.at).total_seconds() < seconds:
            result = run_detection(
                ruleset=setup.ruleset, source=source, session_factory=None, state=state, now=datetime.now(UTC)
            )
            state = result.state
            out.append(result)
            time.sleep(0.5)
    return out


def identity(result: DetectionResult) -> set[tuple[str, str, str, str | None, str]]:
    """Every pending or firing finding as (rule, series key, node, GPU, state)."""
    found: list[Finding] = [f for fs in result.findings.firing.values() for f in fs]
    found += [f for fs in result.findings.pending.values() for f in fs]
    return {(f.rule, f.series_key, f.node, f.gpu, str(f.state)) for f in found}


def firing_where(result: DetectionResult) -> set[tuple[str, str]]:
    return {(f.rule, f.node) for fs in result.findings.firing.values() for f in fs}


def test_alerts_mode_finds_what_query_mode_finds(setup: Setup) -> None:
    attempts = []
    for _ in range(3):  # a scrape landing between the looks may differ: look again
        before = query_ticks(setup, 3.0)[-1]
        alerts = alerts_tick(setup)
        after = query_ticks(setup, 3.0)[-1]
        attempts.append((identity(before), identity(alerts), identity(after)))
        if identity(alerts) in (identity(before), identity(after)):
            break
    b, a, c = attempts[-1]
    assert a in (b, c), f"alerts only: {a - b}; query only: {b - a}"
    assert firing_where(alerts) >= EXPECTED_FIRING
    assert alerts.findings.unknown == before.findings.unknown == frozenset({DOWN})
    assert {r.health for r in alerts.reports} == {RuleHealth.OK, RuleHealth.NO_DATA}
    assert not alerts.findings.frozen_rules
    (hot,) = [f for f in alerts.findings.firing[HOT] if f.rule == "GpuTooHot"]
    assert hot.gpu == "3" and hot.value is not None and 84 <= hot.value <= 88
    assert hot.summary.startswith("GPU 3 at 8")
    assert "healer_rule" not in hot.labels and "alertname" not in hot.labels
    assert hot.active_since is not None and hot.active_since < alerts.findings.at


def test_a_rule_failing_in_prometheus_is_refused(setup: Setup) -> None:
    ruleset = with_broken_rule(setup.ruleset)
    now = datetime.now(UTC)
    held = Finding(
        rule=BROKEN,
        series_key=f'{BROKEN}{{Hostname="{HOT}"}}',
        node=HOT,
        gpu=None,
        state=FindingState.FIRING,
        severity="critical",
        value=1.0,
        unit=None,
        labels={"Hostname": HOT},
        active_since=now - timedelta(minutes=5),
        fired_at=now - timedelta(minutes=4),
        last_true_at=now - timedelta(minutes=1),
    )
    result = alerts_tick(
        setup, ruleset=ruleset, state=EvaluationState(series={held.series_key: held}), now=now
    )
    (report,) = [r for r in result.reports if r.rule == BROKEN]
    assert report.health == RuleHealth.ERROR
    assert report.error is not None and "many-to-many" in report.error
    assert BROKEN in result.findings.frozen_rules
    # Refused: the finding it had stays as it was; nothing resolved, nothing new.
    assert result.state.series[held.series_key] == held
    assert not [c for c in result.changes if c.finding.rule == BROKEN]
    # The other rules are judged as usual.
    assert firing_where(result) >= EXPECTED_FIRING


def test_stopped_rule_evaluation_is_refused(setup: Setup) -> None:
    first = alerts_tick(setup)
    later = first.findings.at + timedelta(seconds=60)  # Prometheus's last evaluation is 60 s old then
    result = alerts_tick(setup, state=first.state, now=later)
    assert result.source_unavailable
    assert {r.health for r in result.reports} == {RuleHealth.UNAVAILABLE}
    assert all("rule evaluation is stopped or lagging" in (r.error or "") for r in result.reports)
    assert result.state == first.state  # every episode frozen as it was
    assert not [c for c in result.changes if c.kind in (ChangeKind.RESOLVED, ChangeKind.DROPPED)]


def test_a_rule_prometheus_lacks_or_holds_in_another_version_is_refused(setup: Setup) -> None:
    hot = setup.ruleset.rule("GpuTooHot")
    changed = hot.model_copy(update={"expr": hot.expr.replace("> 78", "> 77")})
    extra = RuleGroup(name="extra", interval=1, rules=[hot.model_copy(update={"name": "NotExported"})])
    groups = (*(replace_rule(g, "GpuTooHot", changed) for g in setup.ruleset.groups), extra)
    result = alerts_tick(setup, ruleset=RuleSet(groups=groups))
    reports = {r.rule: r for r in result.reports}
    assert reports["GpuTooHot"].health == RuleHealth.UNAVAILABLE
    assert "another version of GpuTooHot" in (reports["GpuTooHot"].error or "")
    assert reports["NotExported"].health == RuleHealth.UNAVAILABLE
    assert "healer_rule='NotExported'" in (reports["NotExported"].error or "")
    assert reports["GpuFatalXid"].health == RuleHealth.OK


def replace_rule(group: RuleGroup, name: str, rule: Rule) -> RuleGroup:
    return group.model_copy(update={"rules": [rule if r.name == name else r for r in group.rules]})


def evaluate_once(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "healer", "evaluate", "--once", "--no-store", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=cwd,
    )


def test_evaluate_once_in_alerts_mode(setup: Setup, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEALER_")}
    env |= {
        "HEALER_DETECTION__MODE": "alerts",
        "HEALER_PROMETHEUS__URL": setup.prometheus.url,
        "HEALER_RULES_PATHS": json.dumps([str(setup.rules_dir)]),
        "HEALER_DETECTION__STALE_AFTER_INTERVALS": str(STALE),
    }
    done = evaluate_once(env, tmp_path)
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert body["queries"] == 1
    firing = {(f["rule"], f["node"]) for f in body["findings"] if f["state"] == "firing"}
    assert firing >= EXPECTED_FIRING
    assert body["unknown"] == [DOWN]

    # A rule healer loads that Prometheus does not evaluate: not judged, exit 1, said why.
    extra = tmp_path / "extra-rules"
    extra.mkdir()
    (extra / "extra.yaml").write_text(
        yaml.safe_dump(
            {"groups": [{"name": "extra", "rules": [{"name": "NotExported", "expr": "vector(1)"}]}]}
        )
    )
    env["HEALER_RULES_PATHS"] = json.dumps([str(setup.rules_dir), str(extra)])
    refused = evaluate_once(env, tmp_path)
    assert refused.returncode == 1, refused.stderr
    rules = {r["rule"]: r for r in json.loads(refused.stdout)["rules"]}
    assert rules["NotExported"]["health"] == "unavailable"
    assert "healer rules export" in rules["NotExported"]["error"]
    assert rules["GpuTooHot"]["health"] == "ok"
