"""`healer run` under faults an SRE would inject: a kill -9 between the cordon and its record, and a
leader frozen (SIGSTOP) for longer than its Lease.

Real processes and services: `healer run` subprocesses, a real Prometheus scraping the fleet
simulator, the Kubernetes API emulator over HTTP, SQLite or a real PostgreSQL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from healer.store import migrate
from healer.store.models import Action, Node, Transition
from healer.store.session import make_engine, make_sessionmaker
from healer_dev.k8s_emulator import KubernetesEmulator, namespace, node, pod, pod_disruption_budget
from healer_dev.simulator.fleet import Fleet, FleetConfig
from healer_dev.simulator.scenario import parse_scenario
from healer_dev.simulator.server import ElapsedClock, SimulatorServer
from tests.services import PostgresServer, free_port, prometheus_server, wait_until

pytestmark = pytest.mark.prometheus

BAD = "gpu-node-01"
DOMAIN = "healer.dev"


def rules_yaml(actions: str) -> str:
    return f"""
groups:
  - name: thermal
    interval: 1s
    rules:
      - name: GpuTooHot
        expr: max by (Hostname, gpu, UUID) (DCGM_FI_DEV_GPU_TEMP) > 78
        for: 2s
        unit: degrees C
        annotations: {{summary: "GPU {{{{ $labels.gpu }}}} at {{{{ $value }}}} C"}}
        actions: {actions}
"""


@pytest.fixture
def cluster() -> Iterator[KubernetesEmulator]:
    with KubernetesEmulator() as emu:
        emu.load([namespace("healer-system"), namespace("ml")])
        for i in range(3):
            name = f"gpu-node-{i:02d}"
            emu.add(node(name, labels={"node.kubernetes.io/instance-type": "h100"}))
        yield emu


def write_config(
    tmp_path: Path, *, db: str, prometheus: str, cluster: KubernetesEmulator, lease: int
) -> Path:
    config = tmp_path / "healer.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "rules_paths": [str(tmp_path / "rules")],
                "database": {"url": db},
                "prometheus": {"url": prometheus, "tick_deadline_seconds": 5},
                "kubernetes": {
                    "domain": DOMAIN,
                    "kubeconfig": str(cluster.write_kubeconfig(tmp_path / "kubeconfig")),
                    "lease_duration_seconds": lease,
                    "renew_interval_seconds": 1,
                    "request_timeout_seconds": 60,
                },
                "scheduler": {"drain_interval_seconds": 1, "outbox_interval_seconds": 1},
                "safety": {
                    "dry_run": False,
                    "max_unhealthy": 1,
                    "max_unhealthy_percent": 50,
                    "breaker_nodes": 2,
                    "breaker_percent": 100,
                },
            }
        )
    )
    return config


def start(config: Path, log: Path, *, identity: str, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "POD_NAME": identity, "HEALER_API__PORT": str(port)}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "healer", "--config", str(config), "run", "--upgrade-db"],
            stdout=out,
            stderr=out,
            env=env,
        )


def state(sessions: sessionmaker[Session]) -> str | None:
    with sessions() as s:
        return s.scalar(select(Node.state).where(Node.name == BAD))


def alive(process: subprocess.Popen[bytes], log: Path) -> None:
    if process.poll() is not None:
        raise AssertionError(f"healer run exited {process.returncode}:\n{log.read_text()[-3000:]}")


def condition(view: dict[str, Any]) -> str | None:
    found = [c for c in view.get("status", {}).get("conditions", []) if c["type"] == "GpuHealthy"]
    return found[0]["status"] if found else None


def test_kill_9_between_cordon_and_record_then_restart_releases_the_node(
    tmp_path: Path, cluster: KubernetesEmulator
) -> None:
    # The GPU is hot for 45 s of simulated time, then back to normal.
    scenario = (
        f"faults: [{{at: 0s, node: {BAD}, gpu: 3, fault: hot_gpu, target: 90, ramp: 1s, duration: 45s}}]"
    )
    fleet = Fleet(FleetConfig(nodes=3), parse_scenario(scenario))
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "thermal.yaml").write_text(rules_yaml("[quarantine]"))
    db = f"sqlite:///{tmp_path / 'healer.db'}"
    migrate.upgrade(db)
    sessions = make_sessionmaker(make_engine(db))
    log = tmp_path / "healer.log"
    # The cordon patch is applied by the API server, but its answer is held for a minute: healer
    # has cordoned and not yet recorded it when it is killed.
    cluster.inject_delay("PATCH", rf"/api/v1/nodes/{BAD}$", 60, after_write=True)
    with SimulatorServer(fleet, clock=ElapsedClock()) as simulator:
        sd = simulator.write_file_sd(tmp_path / "targets.json")
        with prometheus_server([], file_sd=[sd], scrape_interval="1s") as prometheus:
            prometheus.wait_for_samples(f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{BAD}"}} > 78', timeout=60)
            config = write_config(tmp_path, db=db, prometheus=prometheus.url, cluster=cluster, lease=10)
            first = start(config, log, identity="healer-a", port=free_port())
            try:

                def cordoned() -> bool:
                    alive(first, log)
                    view = cluster.get("Node", BAD)
                    return bool(view and view["spec"].get("unschedulable"))

                wait_until(cordoned, timeout=60, what=f"{BAD} cordoned")
            finally:
                first.kill()  # SIGKILL: no shutdown, no Lease release
                first.wait(timeout=30)
            view = cluster.get("Node", BAD)
            assert view is not None
            assert view["metadata"]["annotations"][f"{DOMAIN}/cordoned-by"] == "healer"
            assert state(sessions) in ("healthy", "suspect"), "the cordon was never recorded"
            with sessions() as s:
                intent = s.scalar(select(Node.intent).where(Node.name == BAD))
            assert intent is not None and intent["to"] == "quarantined", "the intent was recorded first"

            # The finding goes away while healer is down.
            prometheus.wait_for_samples(f'max(DCGM_FI_DEV_GPU_TEMP{{Hostname="{BAD}"}}) < 78', timeout=90)
            second = start(config, log, identity="healer-a", port=free_port())
            try:

                def released() -> bool:
                    alive(second, log)
                    view = cluster.get("Node", BAD)
                    return bool(view and not view["spec"].get("unschedulable"))

                wait_until(released, timeout=60, what=f"{BAD} released by the restarted healer")
            finally:
                second.send_signal(signal.SIGTERM)
                second.wait(timeout=60)

    view = cluster.get("Node", BAD)
    assert view is not None
    assert not view["spec"].get("unschedulable")
    assert all(t["key"] != f"{DOMAIN}/quarantined" for t in view["spec"].get("taints") or [])
    assert not any(k.startswith(f"{DOMAIN}/") for k in view["metadata"].get("annotations") or {})
    assert condition(view) in (None, "True")
    assert state(sessions) == "healthy"
    with sessions() as s:
        releases = s.scalars(select(Action).where(Action.kind == "release")).all()
        left = s.scalar(select(Node.intent).where(Node.name == BAD))
    assert len(releases) == 1 and releases[0].detail is not None
    assert releases[0].detail["interrupted"]["to"] == "quarantined"
    assert left is None


@pytest.fixture
def pg_url(postgres: PostgresServer) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    url = postgres.create_database(name)
    yield url
    postgres.drop_database(name)


def events_by(cluster: KubernetesEmulator, instance: str) -> list[str]:
    return [
        str(e.get("metadata", {}).get("name"))
        for e in cluster.list("Event", api_version="events.k8s.io/v1")
        if e.get("reportingInstance") == instance
    ]


def holder(cluster: KubernetesEmulator) -> str | None:
    lease = cluster.get("Lease", "healer-leader", "healer-system", "coordination.k8s.io/v1")
    return lease["spec"].get("holderIdentity") if lease else None


@pytest.mark.postgres
def test_a_frozen_leader_resumed_after_a_takeover_writes_nothing(
    tmp_path: Path, cluster: KubernetesEmulator, pg_url: str
) -> None:
    scenario = f"faults: [{{at: 0s, node: {BAD}, gpu: 3, fault: hot_gpu, target: 90, ramp: 1s}}]"
    fleet = Fleet(FleetConfig(nodes=3), parse_scenario(scenario))
    cluster.add(
        pod("serve-0", node_name=BAD, namespace="ml", owner=("ReplicaSet", "serve"), labels={"app": "serve"})
    )
    # One replica, minAvailable 1: the drain is held open (429s) while the leader is frozen.
    cluster.add(
        pod_disruption_budget("serve", namespace="ml", match_labels={"app": "serve"}, min_available=1)
    )
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "thermal.yaml").write_text(rules_yaml("[quarantine, {drain: {timeout: 10m}}]"))
    sessions = make_sessionmaker(make_engine(pg_url))
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    with SimulatorServer(fleet, clock=ElapsedClock()) as simulator:
        sd = simulator.write_file_sd(tmp_path / "targets.json")
        with prometheus_server([], file_sd=[sd], scrape_interval="1s") as prometheus:
            prometheus.wait_for_samples(f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{BAD}"}} > 78', timeout=60)
            config = write_config(tmp_path, db=pg_url, prometheus=prometheus.url, cluster=cluster, lease=5)
            a = start(config, log_a, identity="healer-a", port=free_port())
            b: subprocess.Popen[bytes] | None = None
            try:
                wait_until(lambda: holder(cluster) == "healer-a", timeout=60, what="a leads")
                b = start(config, log_b, identity="healer-b", port=free_port())

                def draining() -> bool:
                    alive(a, log_a)
                    return state(sessions) == "draining"

                wait_until(draining, timeout=90, what=f"{BAD} draining under a")
                time.sleep(3)  # b is up and standing by; a is mid drain rounds
                alive(b, log_b)
                a.send_signal(signal.SIGSTOP)
                wait_until(lambda: holder(cluster) == "healer-b", timeout=60, what="b takes over")
                # b goes on: the budget now allows the eviction, b finishes the drain.
                cluster.add(
                    pod_disruption_budget(
                        "serve", namespace="ml", match_labels={"app": "serve"}, max_unavailable=1
                    )
                )
                wait_until(
                    lambda: state(sessions) == "awaiting_repair", timeout=60, what="b finishes the drain"
                )
                with sessions() as s:
                    before = s.scalars(select(Transition).order_by(Transition.id)).all()
                events_a = events_by(cluster, "healer-a")
                evictions = len(cluster.evictions)
                a.send_signal(signal.SIGCONT)
                wait_until(
                    lambda: "lost leadership" in log_a.read_text() or "stopped mid" in log_a.read_text(),
                    timeout=30,
                    what="a notices it lost the Lease",
                )
                time.sleep(5)  # a's scheduler runs its missed jobs now, if it were to write anything
                alive(a, log_a)
                alive(b, log_b)
                with sessions() as s:
                    after = s.scalars(select(Transition).order_by(Transition.id)).all()
                    node_state = s.scalar(select(Node.state).where(Node.name == BAD))
                events_a_after = events_by(cluster, "healer-a")
            finally:
                for p in (a, b):
                    if p is None:
                        continue
                    if p.poll() is None:
                        p.send_signal(signal.SIGCONT)
                        p.send_signal(signal.SIGTERM)
                    try:
                        p.wait(timeout=60)
                    except subprocess.TimeoutExpired:
                        p.kill()

    assert [(t.id, t.to_state) for t in after] == [(t.id, t.to_state) for t in before], "a wrote nothing"
    assert node_state == "awaiting_repair", "the record did not go backwards"
    assert events_a_after == events_a, "no repeated Events from the old leader"
    assert len(cluster.evictions) >= evictions
    tokens = {t.holder: t.fencing_token for t in after}
    assert set(tokens) <= {"healer-a", "healer-b"} and "healer-b" in tokens
    b_first = min(t.id for t in after if t.holder == "healer-b")
    assert all(t.holder == "healer-b" for t in after if t.id >= b_first), "after the takeover only b records"
    assert tokens["healer-b"] is not None and tokens.get("healer-a", -1) is not None
    assert int(tokens["healer-b"]) > int(tokens.get("healer-a") or -1)
