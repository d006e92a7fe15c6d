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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from healer.store import migrate
from healer.store.models import Action, Node, Transition
from healer.store.session import make_engine, make_sessionmaker
from healer_dev.k8s_emulator import KubernetesEmulator, namespace, node, pod
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
def engine() -> Iterator[Callable[[str], Engine]]:
    """Engines on the test's database, disposed at the end (no connection left to the collector)."""
    made: list[Engine] = []

    def make(url: str) -> Engine:
        made.append(make_engine(url))
        return made[-1]

    yield make
    for e in made:
        e.dispose()


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
    tmp_path: Path, cluster: KubernetesEmulator, engine: Callable[[str], Engine]
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
    sessions = make_sessionmaker(engine(db))
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
    tmp_path: Path, cluster: KubernetesEmulator, pg_url: str, engine: Callable[[str], Engine]
) -> None:
    """The leader is frozen (SIGSTOP) in the middle of a step: its cordon patch is applied and its
    answer is on the way. The standby takes over and carries the node on; resumed (SIGCONT), the
    old leader gets its answer and must not go on with the step (condition, Event, record)."""
    scenario = f"faults: [{{at: 0s, node: {BAD}, gpu: 3, fault: hot_gpu, target: 90, ramp: 1s}}]"
    fleet = Fleet(FleetConfig(nodes=3), parse_scenario(scenario))
    cluster.add(
        pod("serve-0", node_name=BAD, namespace="ml", owner=("ReplicaSet", "serve"), labels={"app": "serve"})
    )
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "thermal.yaml").write_text(rules_yaml("[quarantine, {drain: {timeout: 10m}}]"))
    sessions = make_sessionmaker(engine(pg_url))
    logs = {"healer-a": tmp_path / "a.log", "healer-b": tmp_path / "b.log"}
    # The first cordon patch is applied at once; its answer is held 15 s.
    cluster.inject_delay("PATCH", rf"/api/v1/nodes/{BAD}$", 15, after_write=True)
    with SimulatorServer(fleet, clock=ElapsedClock()) as simulator:
        sd = simulator.write_file_sd(tmp_path / "targets.json")
        with prometheus_server([], file_sd=[sd], scrape_interval="1s") as prometheus:
            prometheus.wait_for_samples(f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{BAD}"}} > 78', timeout=60)
            config = write_config(tmp_path, db=pg_url, prometheus=prometheus.url, cluster=cluster, lease=5)
            procs = {name: start(config, log, identity=name, port=free_port()) for name, log in logs.items()}
            try:

                def cordoned() -> bool:
                    for name, p in procs.items():
                        alive(p, logs[name])
                    view = cluster.get("Node", BAD)
                    return bool(view and view["spec"].get("unschedulable"))

                wait_until(cordoned, timeout=90, what=f"{BAD} cordoned")
                leader = holder(cluster)
                assert leader in procs
                procs[leader].send_signal(signal.SIGSTOP)  # frozen waiting for its patch's answer
                standby = next(n for n in procs if n != leader)
                wait_until(lambda: holder(cluster) == standby, timeout=60, what="the standby takes over")
                wait_until(
                    lambda: state(sessions) == "awaiting_repair", timeout=90, what="the standby drains"
                )
                with sessions() as s:
                    before = [
                        (t.id, t.to_state, t.holder)
                        for t in s.scalars(select(Transition).order_by(Transition.id))
                    ]
                events_before = events_by(cluster, leader)
                procs[leader].send_signal(signal.SIGCONT)
                wait_until(
                    lambda: (
                        "lost leadership" in logs[leader].read_text()
                        or "nothing more written" in logs[leader].read_text()
                    ),
                    timeout=30,
                    what="the old leader notices",
                )
                time.sleep(12)  # its patch's answer arrives; its scheduler runs what it missed
                for name, p in procs.items():
                    alive(p, logs[name])
                with sessions() as s:
                    after = list(s.scalars(select(Transition).order_by(Transition.id)))
                    node_state = s.scalar(select(Node.state).where(Node.name == BAD))
                events_after = events_by(cluster, leader)
                view = cluster.get("Node", BAD)
            finally:
                for p in procs.values():
                    if p.poll() is None:
                        p.send_signal(signal.SIGCONT)
                        p.send_signal(signal.SIGTERM)
                for p in procs.values():
                    try:
                        p.wait(timeout=60)
                    except subprocess.TimeoutExpired:
                        p.kill()

    assert [(t.id, t.to_state, t.holder) for t in after] == before, "the old leader recorded nothing"
    assert node_state == "awaiting_repair", "the record did not go backwards"
    assert events_after == events_before, "no Events from the old leader after the takeover"
    assert view is not None and view["spec"].get("unschedulable") is True
    assert condition(view) == "False"
    assert [t.to_state for t in after if t.holder == standby][-1] == "awaiting_repair"
    assert all(t.holder in (leader, standby) for t in after)
    tokens = {t.holder: t.fencing_token for t in after}
    assert tokens[standby] is not None
    assert tokens.get(leader) is None or int(tokens[standby]) > int(tokens[leader] or 0)
