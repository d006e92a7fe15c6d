"""Prometheus rule files as healer's rules, against a real Prometheus scraping the fleet simulator.

An SRE's alerting rule file in kube-prometheus / dcgm-exporter style (``alert: GPUHighTemperature``,
``DCGM_FI_DEV_GPU_TEMP > 85``, ``for: 5m``, ``severity`` label, summary and description, and
healer's ``healer_actions`` annotation) fires on the hot GPU:

- in query mode, healer sends its PromQL and judges its ``for`` (`healer evaluate --once` too);
- in alerts mode, Prometheus loads ``healer rules export``'s file of a rule set with a recording
  rule that the alerting rule reads, evaluates both, and healer reads the alert.

The files are the realistic ones with every ``for`` cut to 2 s, ``keep_firing_for`` to 3 s and the
group interval to 1 s (the PromQL unchanged), as in the other Prometheus tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from healer.detection import DetectionResult, run_detection
from healer.engine.evaluation import EvaluationState
from healer.model.findings import Finding
from healer.ruleset.loading import load_ruleset
from healer.sources.alerts import PrometheusAlertsSource
from healer.sources.prometheus import PrometheusSource
from healer_dev.simulator import Fleet, FleetConfig, ManualClock, SimulatorServer, parse_scenario
from tests.services import PrometheusServer, prometheus_server, simulator_targets, wait_until

pytestmark = pytest.mark.prometheus

HOT, WARM = "gpu-node-01", "gpu-node-02"
FAULT_AT = 60
FAULTS: list[dict[str, object]] = [
    {"at": FAULT_AT, "node": HOT, "gpu": 3, "fault": "hot_gpu", "target": 90},
    {"at": FAULT_AT, "node": WARM, "gpu": 5, "fault": "hot_gpu", "target": 81},
]

#: Query mode: alerting rules only, PromQL inline.
GPU_ALERTS = """\
groups:
  - name: dcgm-gpu.rules
    interval: 30s
    rules:
      - alert: GPUHighTemperature
        expr: max by (Hostname, gpu, UUID) (DCGM_FI_DEV_GPU_TEMP) > 85
        for: 5m
        keep_firing_for: 10m
        labels:
          severity: critical
        annotations:
          summary: GPU {{ $labels.gpu }} on {{ $labels.Hostname }} is hot
          description: "GPU {{ $labels.gpu }} has been above 85 C for 5 minutes (now {{ $value }} C)."
          healer_actions: "quarantine, drain: {timeout: 1h}, ticket: {provider: default}"
          healer_unit: degrees C
      - alert: GPUTemperatureWarning
        expr: max by (Hostname, gpu, UUID) (DCGM_FI_DEV_GPU_TEMP) > 80
        for: 5m
        labels:
          severity: warning
        annotations:
          summary: GPU {{ $labels.gpu }} on {{ $labels.Hostname }} is warm
"""

#: Alerts mode: the alerting rule reads what a recording rule records.
GPU_RECORDED = """\
groups:
  - name: dcgm-gpu.rules
    interval: 30s
    rules:
      - record: gpu:DCGM_FI_DEV_GPU_TEMP:max
        expr: max by (Hostname, gpu, UUID) (DCGM_FI_DEV_GPU_TEMP)
      - alert: GPUHighTemperature
        expr: gpu:DCGM_FI_DEV_GPU_TEMP:max > 85
        for: 5m
        keep_firing_for: 10m
        labels:
          severity: critical
        annotations:
          summary: GPU {{ $labels.gpu }} on {{ $labels.Hostname }} is hot
          healer_actions: "quarantine, drain: {timeout: 1h}, ticket: {provider: default}"
"""


def shortened(text: str) -> str:
    return (
        text.replace("interval: 30s", "interval: 1s")
        .replace("keep_firing_for: 10m", "keep_firing_for: 3s")
        .replace("for: 5m", "for: 2s")
    )


@dataclass
class Setup:
    prometheus: PrometheusServer
    alerts_file: Path
    recorded_file: Path


def export(path: Path, target: Path) -> None:
    """``healer rules export PATH > target`` as a user runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEALER_")}
    done = subprocess.run(
        [sys.executable, "-m", "healer", "rules", "export", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    target.write_text(done.stdout)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("prometheus-rules")
    alerts_file, recorded_file = tmp / "gpu-alerts.yml", tmp / "gpu-recorded.yml"
    alerts_file.write_text(shortened(GPU_ALERTS))
    recorded_file.write_text(shortened(GPU_RECORDED))
    exported = tmp / "healer.rules.yml"
    export(recorded_file, exported)

    clock = ManualClock(0)
    scenario = parse_scenario(yaml.safe_dump({"name": "prometheus-rules", "faults": FAULTS}))
    fleet = Fleet(FleetConfig(nodes=4, hcas=0, seed=0), scenario)
    with SimulatorServer(fleet, clock=clock) as sim:
        targets = simulator_targets(fleet.targets(sim.address), sim.address)
        with prometheus_server(targets, scrape_interval="1s", rule_files=[exported]) as prom:
            prom.wait_for_targets_up(len(targets))
            clock.set(FAULT_AT + 30)
            prom.wait_for_samples(f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{HOT}"}} > 85', timeout=30)
            yield Setup(prom, alerts_file, recorded_file)


def findings(result: DetectionResult, state: str) -> list[Finding]:
    by_node = result.findings.firing if state == "firing" else result.findings.pending
    return [f for fs in by_node.values() for f in fs]


def test_query_mode_fires_the_prometheus_rule_after_its_for(setup: Setup) -> None:
    ruleset = load_ruleset([setup.alerts_file])
    seen: list[DetectionResult] = []

    def fired() -> Finding | None:
        state = seen[-1].state if seen else EvaluationState()
        with PrometheusSource(setup.prometheus.url, timeout_seconds=5, tick_deadline_seconds=15) as source:
            result = run_detection(
                ruleset=ruleset, source=source, session_factory=None, state=state, now=datetime.now(UTC)
            )
        seen.append(result)
        hot = [f for f in findings(result, "firing") if f.rule == "GPUHighTemperature"]
        return hot[0] if hot else None

    hot = wait_until(fired, timeout=30, interval=0.5, what="GPUHighTemperature firing")
    assert (hot.node, hot.gpu, hot.severity, hot.unit) == (HOT, "3", "critical", "degrees C")
    assert hot.summary == f"GPU 3 on {HOT} is hot"
    assert hot.value is not None and hot.value > 85
    # It was pending first: `for` held by healer, not skipped.
    assert any(f.rule == "GPUHighTemperature" for r in seen[:-1] for f in findings(r, "pending"))
    # The warning rule (no healer_actions) finds both warm GPUs; the critical one only the hot GPU.
    last = seen[-1]
    warm = {
        f.node
        for f in findings(last, "firing") + findings(last, "pending")
        if f.rule == "GPUTemperatureWarning"
    }
    assert warm == {HOT, WARM}
    assert {f.node for f in findings(last, "firing") if f.rule == "GPUHighTemperature"} == {HOT}


def test_evaluate_once_reads_the_prometheus_rule_file(setup: Setup, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEALER_")}
    env |= {
        "HEALER_PROMETHEUS__URL": setup.prometheus.url,
        "HEALER_RULES_PATHS": json.dumps([str(setup.alerts_file)]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "healer", "evaluate", "--once", "--no-store", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    seen = {(f["rule"], f["node"]) for f in body["findings"]}
    assert ("GPUHighTemperature", HOT) in seen and ("GPUTemperatureWarning", WARM) in seen
    assert ("GPUHighTemperature", WARM) not in seen


def test_alerts_mode_reads_the_alert_on_a_recorded_series(setup: Setup) -> None:
    ruleset = load_ruleset([setup.recorded_file], recording_rules=True)
    assert [r.record for r in ruleset.records] == ["gpu:DCGM_FI_DEV_GPU_TEMP:max"]

    def fired() -> Finding | None:
        with PrometheusAlertsSource(
            setup.prometheus.url, timeout_seconds=5, tick_deadline_seconds=15
        ) as source:
            result = run_detection(
                ruleset=ruleset,
                source=source,
                session_factory=None,
                state=EvaluationState(),
                now=datetime.now(UTC),
            )
        assert {r.rule: r.health.value for r in result.reports} == {"GPUHighTemperature": "ok"}
        hot = [f for f in findings(result, "firing") if f.rule == "GPUHighTemperature"]
        return hot[0] if hot else None

    hot = wait_until(fired, timeout=30, interval=0.5, what="GPUHighTemperature firing in Prometheus")
    assert (hot.node, hot.gpu, hot.severity) == (HOT, "3", "critical")
    assert hot.summary == f"GPU 3 on {HOT} is hot"
    # Prometheus recorded the series the alert reads.
    assert setup.prometheus.query(f'gpu:DCGM_FI_DEV_GPU_TEMP:max{{Hostname="{HOT}",gpu="3"}}')
