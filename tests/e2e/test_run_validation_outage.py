"""`healer run` end to end: a quarantine-only node returns to service, and a 40 s Prometheus outage
during its validation does not count as clear time.

Real processes: `healer run` (scheduler, Lease, dashboard), a real Prometheus scraping the fleet
simulator, the Kubernetes API emulator over HTTP, SQLite. The outage is the Prometheus process
stopped (SIGSTOP) for 40 s: every query times out, every rule is frozen.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from healer.store.models import Node, Transition
from healer.store.session import make_engine, make_sessionmaker
from healer_dev.k8s_emulator import KubernetesEmulator, namespace, node
from healer_dev.simulator.fleet import Fleet, FleetConfig
from healer_dev.simulator.scenario import parse_scenario
from healer_dev.simulator.server import ElapsedClock, SimulatorServer
from tests.services import free_port, prometheus_server, wait_until

pytestmark = pytest.mark.prometheus

BAD = "gpu-node-01"
HOLD = 30
OUTAGE = 40
RULES = """
groups:
  - name: thermal
    interval: 1s
    rules:
      - name: GpuTooHot
        expr: max by (Hostname, gpu, UUID) (DCGM_FI_DEV_GPU_TEMP) > 78
        for: 2s
        keep_firing_for: 2s
        unit: degrees C
        actions: [quarantine]      # no drain, no ticket: the node's only way out is staying clear
"""
SCENARIO = f"faults: [{{at: 0s, node: {BAD}, gpu: 3, fault: hot_gpu, target: 90, ramp: 1s, duration: 20s}}]"


@pytest.fixture
def cluster() -> Iterator[KubernetesEmulator]:
    with KubernetesEmulator() as emu:
        emu.load([namespace("healer-system")])
        for i in range(3):
            emu.add(node(f"gpu-node-{i:02d}", labels={"node.kubernetes.io/instance-type": "h100"}))
        yield emu


def _state(sessions: sessionmaker[Session]) -> str | None:
    with sessions() as s:
        return s.scalar(select(Node.state).where(Node.name == BAD))


def _entered(sessions: sessionmaker[Session], state: str) -> datetime | None:
    with sessions() as s:
        return s.scalar(
            select(Transition.at)
            .join(Node, Node.id == Transition.node_id)
            .where(Node.name == BAD, Transition.to_state == state)
            .order_by(Transition.id.desc())
            .limit(1)
        )


def test_prometheus_outage_during_validation_restarts_the_hold(
    tmp_path: Path, cluster: KubernetesEmulator
) -> None:
    fleet = Fleet(FleetConfig(nodes=3), parse_scenario(SCENARIO))
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "thermal.yaml").write_text(RULES)
    db = f"sqlite:///{tmp_path / 'healer.db'}"
    with SimulatorServer(fleet, clock=ElapsedClock()) as simulator:
        sd = simulator.write_file_sd(tmp_path / "targets.json")
        with prometheus_server([], file_sd=[sd], scrape_interval="1s") as prometheus:
            prometheus.wait_for_samples(f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{BAD}"}} > 78', timeout=60)
            config = tmp_path / "healer.yaml"
            config.write_text(
                yaml.safe_dump(
                    {
                        "rules_paths": [str(rules)],
                        "database": {"url": db},
                        "prometheus": {
                            "url": prometheus.url,
                            "tick_deadline_seconds": 3,
                            "timeout_seconds": 2,
                        },
                        "kubernetes": {
                            "kubeconfig": str(cluster.write_kubeconfig(tmp_path / "kubeconfig")),
                            "lease_duration_seconds": 10,
                            "renew_interval_seconds": 1,
                        },
                        "safety": {
                            "dry_run": False,
                            "max_unhealthy": 1,
                            "max_unhealthy_percent": 50,
                            "recovery_hold_seconds": HOLD,
                        },
                        "api": {"port": free_port()},
                    }
                )
            )
            log = tmp_path / "healer.log"
            env = {**os.environ, "POD_NAME": "healer-e2e"}
            with log.open("ab") as out:
                process = subprocess.Popen(
                    [sys.executable, "-m", "healer", "--config", str(config), "run", "--upgrade-db"],
                    stdout=out,
                    stderr=out,
                    env=env,
                )
            try:
                wait_until(lambda: Path(db.removeprefix("sqlite:///")).exists(), timeout=30, what="database")
                sessions = make_sessionmaker(make_engine(db))
                wait_until(lambda: _state(sessions) == "awaiting_repair", timeout=90, what="quarantined")
                assert cluster.get("Node", BAD)["spec"]["unschedulable"] is True  # type: ignore[index]
                # The GPU cools (20 s fault): the quarantine-only node goes to validation.
                wait_until(lambda: _state(sessions) == "validating", timeout=90, what="validating")
                time.sleep(3)

                prometheus.process.send_signal(signal.SIGSTOP)
                try:
                    time.sleep(OUTAGE)
                finally:
                    prometheus.process.send_signal(signal.SIGCONT)
                back = datetime.now(UTC)

                time.sleep(5)
                assert _state(sessions) == "validating", "returned to service on time not observed"
                wait_until(lambda: _state(sessions) == "healthy", timeout=120, what="returned to service")
            finally:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    process.kill()

    healthy_at = _entered(sessions, "healthy")
    assert healthy_at is not None
    # A whole recovery hold of observed data after the outage (a tick of slack either side).
    assert (healthy_at - back).total_seconds() >= HOLD - 2, log.read_text()[-3000:]
    view = cluster.get("Node", BAD)
    assert view is not None and not view["spec"].get("unschedulable")
    assert not any(t["key"].startswith("healer.dev/") for t in view["spec"].get("taints") or [])
