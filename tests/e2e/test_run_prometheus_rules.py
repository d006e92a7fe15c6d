"""`healer run` with a Prometheus alerting rule file as its rules (issue 26): the alert whose
``healer_actions`` annotation says ``quarantine`` cordons, taints and marks the node with the hot
GPU; the alert without the annotation fires on the warm node too and touches nothing there.

Real processes and services: `healer run` as the chart's ServiceAccount on the real control plane
(KWOK nodes), a real Prometheus scraping the fleet simulator, SQLite. The budget and breaker allow
both nodes out: only the missing annotation keeps the warm node in service.
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from healer.store.models import Finding, Node
from tests.e2e.harness import World, condition
from tests.services import wait_until

pytestmark = pytest.mark.prometheus

#: kube-prometheus style, as an SRE has it, with `for` cut to 2 s and the group run every second.
RULES = """\
groups:
  - name: dcgm-gpu.rules
    interval: 1s
    rules:
      - alert: GPUHighTemperature
        expr: max by (Hostname, gpu, UUID) (DCGM_FI_DEV_GPU_TEMP) > 85
        for: 2s
        labels:
          severity: critical
        annotations:
          summary: GPU {{ $labels.gpu }} on {{ $labels.Hostname }} is hot
          description: "GPU {{ $labels.gpu }} has been above 85 C (now {{ $value }} C)."
          healer_actions: quarantine
          healer_unit: degrees C
      - alert: GPUTemperatureWarning
        expr: max by (Hostname, gpu, UUID) (DCGM_FI_DEV_GPU_TEMP) > 80
        for: 2s
        labels:
          severity: warning
        annotations:
          summary: GPU {{ $labels.gpu }} on {{ $labels.Hostname }} is warm
"""


def firing(sessions: sessionmaker[Session], rule: str) -> set[str]:
    with sessions() as s:
        return set(
            s.scalars(select(Finding.node_name).where(Finding.rule == rule, Finding.state == "firing"))
        )


def test_a_prometheus_rule_with_the_action_annotation_quarantines_and_one_without_does_not(
    world: World,
) -> None:
    hot, warm, cool = world.add_nodes(3, pool="h100")
    world.rules(RULES, "gpu.rules.yml")
    db = f"sqlite:///{world.tmp_path / 'healer.db'}"
    faults = (
        f"faults: [{{at: 0s, node: {hot}, gpu: 3, fault: hot_gpu, target: 90, ramp: 1s}}, "
        f"{{at: 0s, node: {warm}, gpu: 5, fault: hot_gpu, target: 82, ramp: 1s}}]"
    )
    with world.metrics(3, faults, wait_for=f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{warm}"}} > 80') as metrics:
        config = world.config(
            db=db,
            prometheus_url=metrics.url,
            safety={
                "max_unhealthy": 3,
                "max_unhealthy_percent": 100,
                "breaker_nodes": 3,
                "breaker_percent": 100,
            },
        )
        healer = world.start(config)
        sessions = world.sessions(db, healer)

        def cordoned() -> bool:
            healer.alive()
            return bool(world.node(hot)["spec"].get("unschedulable"))

        wait_until(cordoned, timeout=90, what=f"{hot} cordoned")
        wait_until(
            lambda: firing(sessions, "GPUTemperatureWarning") == {hot, warm},
            timeout=30,
            what="the warning firing on both warm nodes",
        )
        time.sleep(3)  # ticks that would act on the warm node have run by now
        with sessions() as s:
            states = dict(
                s.execute(select(Node.name, Node.state).where(Node.name.in_([hot, warm, cool]))).all()
            )
        healer.alive()
        healer.stop()

    view = world.node(hot)
    assert any(t["key"] == f"{world.domain}/quarantined" for t in view["spec"].get("taints") or [])
    assert condition(view) == "False"
    assert states[hot] in ("quarantined", "awaiting_repair")  # no drain or ticket asked: out, waiting
    assert firing(sessions, "GPUHighTemperature") == {hot}
    for node in (warm, cool):
        untouched = world.node(node)
        assert not untouched["spec"].get("unschedulable"), node
        assert not any(t["key"].startswith(world.domain) for t in untouched["spec"].get("taints") or []), node
        assert condition(untouched) in (None, "True"), node
        assert states.get(node, "healthy") == "healthy", node
