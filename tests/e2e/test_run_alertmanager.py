"""`healer run` in alerts mode with Alertmanager: fault -> cordon within ``for`` + one scrape + one
rule evaluation + 1 s, five times (issue 27).

Real parts: a Prometheus scraping the fleet simulator every ``SCRAPE`` s and evaluating the
exported rule every ``EVAL`` s, sending its alerts to the session's Alertmanager, which delivers
them (each alert its own group, ``group_wait: 0s``, the bearer token from a ``credentials_file``)
to the receiver of a `healer run` process acting as the chart's ServiceAccount on the real
control plane. healer's own poll (its rule group's interval) is ``POLL`` s, longer than the whole
test: after its first tick no scheduled tick runs, so only the webhook can explain a cordon.

Measured per node, to the cordon as the API server applied it (its audit log):

* from the alert's ``activeAt`` as Prometheus reports it (the first evaluation that saw the fault):
  at least ``FOR`` (Prometheus held it), at most the bound;
* from the fault (the simulator starts exposing it; its clock converted to wall time through one
  paired reading): at most ``FOR`` + ``SCRAPE`` + ``EVAL`` + 1 s, the bound. The scrape and the
  evaluation are the waits before Prometheus sees the fault; the second covers Prometheus, Alertmanager
  and healer's early tick.

Before the faults, against the same process: a request without the token is refused (401), and a
payload naming a node that does not exist costs one early tick and nothing else.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from healer.ruleset.export import prometheus_rule_file
from healer.ruleset.loading import load_ruleset
from healer.sources.alerts import api_time
from healer.store import nodes as repo
from healer.store.models import Node
from healer_dev.simulator.scenario import HotGpu
from tests.e2e.harness import Healer, Metrics, World
from tests.integration.test_alertmanager_receiver import hot
from tests.services import AlertmanagerServer, wait_until
from tests.unit.test_alertmanager_payload import notification

pytestmark = [pytest.mark.prometheus, pytest.mark.alertmanager]

PATH = "/api/v1/alertmanager/webhook"
TOKEN = "alertmanager-e2e-token-0123456789"
POLL = 300.0  # healer's own poll, seconds: longer than the test
SCRAPE = 1.0  # Prometheus's scrape interval, seconds
EVAL = 1.0  # Prometheus's rule evaluation interval, seconds
FOR = 5.0
BOUND = FOR + SCRAPE + EVAL + 1.0
FAULTS = 5
CYCLE = 6.0  # seconds between two faults: each is its own alert, notification and early tick
GPU = 3
THRESHOLD = 85  # degrees C; healthy GPUs run 58..70 C, the fault's plateau is 95 +- 0.8 C

RULES = f"""
groups:
  - name: thermal
    interval: {POLL:g}s
    rules:
      - name: GpuTooHot
        expr: max by (Hostname, gpu) (DCGM_FI_DEV_GPU_TEMP) > {THRESHOLD}
        for: {FOR:g}s
        unit: degrees C
        actions: [quarantine]
"""


def exported_rules(world: World) -> Path:
    """What `healer rules export` writes for the test's rules, with each group evaluated every
    ``EVAL`` s by Prometheus (healer polls every ``POLL`` s: the interval is not in the digest)."""
    doc = prometheus_rule_file(load_ruleset([world.rules_dir]), default_interval_seconds=None)
    for group in doc["groups"]:
        group["interval"] = f"{EVAL:g}s"
    path = world.tmp_path / "healer.rules.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


def last_tick(sessions: sessionmaker[Session], healer: Healer) -> str | None:
    healer.alive()
    with sessions() as s:
        at = repo.get_switch(s, repo.SWITCH_LAST_TICK).get("at")
    return str(at) if at else None


def active_since(metrics: Metrics, node: str) -> float | None:
    """``activeAt`` of the node's GpuTooHot alert as Prometheus reports it (unix seconds)."""
    alerts = httpx.get(f"{metrics.url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
    for alert in alerts:
        if alert["labels"].get("Hostname") == node and alert["labels"].get("healer_rule") == "GpuTooHot":
            at = api_time(alert["activeAt"])
            return at.timestamp() if at else None
    return None


def test_alertmanager_wakes_healer_fault_to_cordon_within_for_plus_scrape_plus_evaluation(
    world: World, alertmanager: AlertmanagerServer
) -> None:
    world.add_nodes(FAULTS + 1, pool="h100")
    faulted = [world.node_name(i) for i in range(FAULTS)]
    healthy = world.node_name(FAULTS)
    world.rules(RULES)
    rule_file = exported_rules(world)
    token = world.tmp_path / "alertmanager-token"
    token.write_text(TOKEN + "\n")
    db = f"sqlite:///{world.tmp_path / 'healer.db'}"
    with world.metrics(
        FAULTS + 1,
        "faults: []",
        scrape_interval=f"{SCRAPE:g}s",
        wait_for=f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{faulted[0]}"}}',
        rule_files=[rule_file],
        alertmanagers=[alertmanager.address],
    ) as metrics:
        config = world.config(
            db=db,
            prometheus_url=metrics.url,
            detection={"mode": "alerts", "alertmanager_token_file": str(token)},
            safety={
                "max_unhealthy": 10,
                "max_unhealthy_percent": 100,
                "breaker_nodes": 10,
                "breaker_percent": 100,
            },
        )
        healer = world.start(config)
        sessions = world.sessions(db, healer)
        url = f"{healer.url}{PATH}"
        alertmanager.deliver_to(url, token)
        first = wait_until(lambda: last_tick(sessions, healer), timeout=60, what="healer's first tick")
        started = time.time()

        # The same process refuses a request without the token ...
        ghost = f"{world.prefix}-no-such-node"
        refused = httpx.post(url, json=notification(hot(ghost)), timeout=10)
        assert refused.status_code == 401, refused.text
        # ... and a payload naming a node that does not exist is one early tick, nothing more.
        r = httpx.post(url, json=notification(hot(ghost)), headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200 and r.json()["woken"] is True, r.text
        wait_until(lambda: last_tick(sessions, healer) != first, timeout=30, what="the early tick")

        sim_now, wall_now = metrics.clock(), time.time()  # one paired reading: wall = sim + offset
        fault = {node: wall_now + 2 + k * CYCLE for k, node in enumerate(faulted)}
        for node, at in fault.items():
            metrics.fleet.inject(
                HotGpu(at=sim_now + at - wall_now, node=node, gpu=GPU, fault="hot_gpu", target=95)
            )

        def all_cordoned() -> bool:
            healer.alive()
            return set(faulted) <= set(world.kube.cordons())

        wait_until(all_cordoned, timeout=2 + FAULTS * CYCLE + BOUND + 60, interval=0.2, what="every cordon")
        cordoned = world.kube.cordons()
        active = {node: active_since(metrics, node) for node in faulted}
        with sessions() as s:
            ghost_row = s.scalar(select(Node.name).where(Node.name == ghost))

    assert all(active.values()), f"Prometheus lost an alert: {active}"
    latencies = {node: cordoned[node] - (active[node] or 0) for node in faulted}
    from_fault = {node: cordoned[node] - fault[node] for node in faulted}
    print(
        f"bound: for {FOR:g} + scrape {SCRAPE:g} + evaluation {EVAL:g} + 1 = {BOUND:g} s\n"
        "activeAt -> cordon: " + ", ".join(f"{v:.3f}" for v in latencies.values()) + " s\n"
        "fault -> cordon:    " + ", ".join(f"{v:.3f}" for v in from_fault.values()) + " s"
    )
    assert all(FOR <= v <= BOUND for v in latencies.values()), latencies
    assert all(v <= BOUND for v in from_fault.values()), from_fault
    # No scheduled tick after the first one: each cordon came from an early tick Alertmanager asked for.
    assert max(cordoned[n] for n in faulted) - started < POLL
    log = healer.log.read_text(errors="replace")
    assert all(f"naming {node}: early tick" in log for node in faulted), healer.tail()
    assert ghost_row is None and ghost not in cordoned
    assert healthy not in cordoned
