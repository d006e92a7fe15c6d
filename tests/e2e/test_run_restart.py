"""`healer run` end to end: SIGTERM in the middle of a drain, then a restart that finishes it.

Real processes and services: `healer run` as a subprocess (its own scheduler, Lease, dashboard), a
real Prometheus scraping the fleet simulator, the Kubernetes API emulator over HTTP, a webhook
receiver on loopback, and SQLite. A PodDisruptionBudget holds the drain open until the first
controller has been stopped; the second one must finish it without repeating what was done.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from healer.store.models import Action, Node, Ticket, Transition
from healer.store.session import make_engine, make_sessionmaker
from healer_dev.k8s_emulator import KubernetesEmulator, namespace, node, pod, pod_disruption_budget
from healer_dev.provider import Receiver
from healer_dev.simulator.fleet import Fleet, FleetConfig
from healer_dev.simulator.scenario import parse_scenario
from healer_dev.simulator.server import ElapsedClock, SimulatorServer
from tests.services import free_port, prometheus_server, wait_until

pytestmark = pytest.mark.prometheus

BAD = "gpu-node-01"
RULES = """
groups:
  - name: thermal
    interval: 1s
    rules:
      - name: GpuTooHot
        expr: max by (Hostname, gpu, UUID) (DCGM_FI_DEV_GPU_TEMP) > 78
        for: 2s
        keep_firing_for: 30s
        unit: degrees C
        annotations: {summary: "GPU {{ $labels.gpu }} at {{ $value }} C"}
        actions:
          - quarantine
          - drain: {timeout: 10m, delete_emptydir_data: true}
          - ticket: {provider: default}
"""
SCENARIO = f"faults: [{{at: 0s, node: {BAD}, gpu: 3, fault: hot_gpu, target: 90, ramp: 1s}}]"


@pytest.fixture
def cluster() -> Iterator[KubernetesEmulator]:
    with KubernetesEmulator() as emu:
        emu.load([namespace("healer-system"), namespace("ml")])
        for i in range(3):
            name = f"gpu-node-{i:02d}"
            emu.add(node(name, labels={"node.kubernetes.io/instance-type": "h100"}))
            emu.add(pod(f"dcgm-{name}", node_name=name, namespace="ml", owner=("DaemonSet", "dcgm")))
        emu.add(pod("trainer-0", node_name=BAD, namespace="ml", owner=("Job", "train"), empty_dir=True))
        emu.add(
            pod(
                "serve-0",
                node_name=BAD,
                namespace="ml",
                owner=("ReplicaSet", "serve"),
                labels={"app": "serve"},
            )
        )
        # Only one replica and minAvailable 1: every eviction of serve-0 answers 429 for now.
        emu.add(
            pod_disruption_budget("serve", namespace="ml", match_labels={"app": "serve"}, min_available=1)
        )
        yield emu


def _start(config: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HEALER_TEST_PROVIDER_SECRET": "provider-secret-for-tests", "POD_NAME": "healer-e2e"}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "healer", "--config", str(config), "run", "--upgrade-db"],
            stdout=out,
            stderr=out,
            env=env,
        )


def _state(sessions: sessionmaker[Session]) -> str | None:
    with sessions() as s:
        return s.scalar(select(Node.state).where(Node.name == BAD))


def test_sigterm_mid_drain_then_restart_finishes_without_duplicates(
    tmp_path: Path, cluster: KubernetesEmulator
) -> None:
    fleet = Fleet(FleetConfig(nodes=3), parse_scenario(SCENARIO))
    receiver = Receiver(secret=b"provider-secret-for-tests").start()
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "thermal.yaml").write_text(RULES)
    db = f"sqlite:///{tmp_path / 'healer.db'}"
    port = free_port()
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
                        "prometheus": {"url": prometheus.url, "tick_deadline_seconds": 5},
                        "kubernetes": {
                            "kubeconfig": str(cluster.write_kubeconfig(tmp_path / "kubeconfig")),
                            "lease_duration_seconds": 10,
                            "renew_interval_seconds": 1,
                        },
                        "scheduler": {"drain_interval_seconds": 1, "outbox_interval_seconds": 1},
                        "safety": {
                            "dry_run": False,
                            "max_unhealthy": 1,
                            "max_unhealthy_percent": 50,
                            "breaker_nodes": 2,
                            "breaker_percent": 100,
                        },
                        "tickets": {
                            "providers": [
                                {
                                    "name": "default",
                                    "url": receiver.url,
                                    "secret_env": "HEALER_TEST_PROVIDER_SECRET",
                                }
                            ]
                        },
                        "api": {"port": port},
                    }
                )
            )
            log = tmp_path / "healer.log"
            first = _start(config, log)
            try:
                sessions = _wait_for_db(db, first, log)
                wait_until(lambda: _state(sessions) == "draining", timeout=90, what=f"{BAD} draining")
                wait_until(
                    lambda: cluster.eviction_count("ml/trainer-0") == 1, timeout=30, what="trainer evicted"
                )
                # serve-0 is held by its PodDisruptionBudget while we stop the controller: the
                # step that evicted trainer-0 read the budget (0 disruptions allowed) and sent no
                # eviction for it to refuse (issue 19; before, each step's POST answered 429).
                assert [e.code for e in cluster.evictions if e.pod == "ml/serve-0"] == []
                first.send_signal(signal.SIGTERM)
                assert first.wait(timeout=60) == 0, log.read_text()[-3000:]
            finally:
                if first.poll() is None:
                    first.kill()
            lease = cluster.get("Lease", "healer-leader", "healer-system", "coordination.k8s.io/v1")
            assert lease is not None and not lease["spec"].get("holderIdentity"), "the Lease was handed back"
            assert _state(sessions) == "draining"
            assert cluster.get("Pod", "serve-0", "ml") is not None

            # The budget now allows one disruption; a fresh controller resumes the drain.
            cluster.add(
                pod_disruption_budget(
                    "serve", namespace="ml", match_labels={"app": "serve"}, max_unavailable=1
                )
            )
            second = _start(config, log)
            try:
                wait_until(lambda: _state(sessions) == "awaiting_repair", timeout=90, what="drain finished")
                wait_until(lambda: len(receiver.requests) >= 1, timeout=30, what="ticket delivered")
                answer = httpx.get(f"http://127.0.0.1:{port}/api/v1/nodes/{BAD}", timeout=5).json()
                metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
                # A broken rule file and SIGHUP: rejected and shown, the old rules keep running.
                (rules / "thermal.yaml").write_text(RULES.replace("for: 2s", "for: soon"))
                second.send_signal(signal.SIGHUP)
                shown = wait_until(
                    lambda: httpx.get(f"http://127.0.0.1:{port}/api/v1/rules", timeout=5).json()["rejected"],
                    timeout=30,
                    what="the rejected reload on the dashboard",
                )
                rules_now = httpx.get(f"http://127.0.0.1:{port}/api/v1/rules", timeout=5).json()
            finally:
                second.send_signal(signal.SIGTERM)
                second.wait(timeout=60)
    receiver.stop()

    view = cluster.get("Node", BAD)
    assert view is not None and view["spec"]["unschedulable"] is True
    assert cluster.eviction_count("ml/trainer-0") == 1
    assert cluster.eviction_count("ml/serve-0") == 1
    assert cluster.get("Pod", f"dcgm-{BAD}", "ml") is not None, "DaemonSet pods stay"
    assert "thermal.yaml:" in shown[0]["error"] and "for" in shown[0]["error"]
    assert [r["name"] for r in rules_now["rules"]] == ["GpuTooHot"]
    assert answer["node"]["state"] == "awaiting_repair"
    assert 'healer_actions_total{kind="drained",result="succeeded"} 1.0' in metrics
    assert answer["node"]["ticket"] is not None
    assert len(receiver.requests) == 1
    with sessions() as s:
        cordons = s.scalar(select(func.count()).select_from(Action).where(Action.kind == "cordon"))
        tickets = s.scalar(select(func.count()).select_from(Ticket))
        drains = s.scalar(
            select(func.count()).select_from(Transition).where(Transition.to_state == "draining")
        )
    assert (cordons, tickets, drains) == (1, 1, 1)


def _wait_for_db(url: str, process: subprocess.Popen[bytes], log: Path) -> sessionmaker[Session]:
    def ready() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"healer run exited {process.returncode}:\n{log.read_text()[-3000:]}")
        return Path(url.removeprefix("sqlite:///")).exists()

    wait_until(ready, timeout=30, what="healer's database")
    return make_sessionmaker(make_engine(url))
