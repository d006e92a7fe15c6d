"""The rule's node pool through the controller's steps: a real Prometheus scraping dcgm- and
node_exporter-style series (detection and coverage), the real Kubernetes adapter over HTTP to the
API emulator, SQLite and PostgreSQL, and the dashboard's JSON API and page.

An InfiniBand rule counts over the nodes exporting ``node_infiniband_*`` (5 of 20 GPU nodes), not
over the whole GPU pool; and a pool of 4 nodes may always take one node out (the floor for tiny
pools), never two.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from healer.controller import remediate
from healer.coverage import coverage_query, observe_coverage
from healer.detection import initial_state, run_detection
from healer.model.addresses import build_address_book
from healer.ruleset.schema import Rule, RuleGroup, RuleSet
from healer.sources.prometheus import PrometheusSource
from healer_dev.k8s_emulator import node
from healer_dev.prometheus import PrometheusServer, ScrapeTarget, prometheus_server
from healer_dev.remediation_harness import POOL_LABEL, T0, Harness, fleet_nodes, hot, tick
from tests.integration.test_api_support import build_app, http_client
from tests.integration.test_remediation import harness
from tests.integration.test_ways_out import run, with_safety
from tests.k8s_emulator import emulator, k8s_api, k8s_settings
from tests.services import text_exporter

__all__ = ["emulator", "harness", "k8s_api", "k8s_settings"]

GPU_NODES = [f"gpu-{i:02d}" for i in range(20)]
IB_NODES = GPU_NODES[:5]  # only these have InfiniBand
EXPORTER_POD = "dcgm-exporter-wwwjh"
BOOK = build_address_book(
    nodes=[(n, []) for n in GPU_NODES], pods=[], pod_names=[(EXPORTER_POD, GPU_NODES[0])]
)
IB_DOWN = IB_NODES[:4]  # 4 of the 5 ports are down: 80 % of the IB pool, 20 % of the GPU pool

RULES = RuleSet(
    groups=(
        RuleGroup(
            name="fabric",
            rules=[
                Rule(
                    name="GpuTooHot",
                    expr="max by (Hostname, gpu) (DCGM_FI_DEV_GPU_TEMP) > 78",
                    actions=["quarantine"],
                ),
                Rule(
                    name="IbPortDown",
                    expr="max by (Hostname, device, port) (node_infiniband_state_id) != 4",
                    actions=["quarantine"],
                ),
            ],
        ),
    )
)


def exposition() -> str:
    lines = ["# TYPE DCGM_FI_DEV_GPU_TEMP gauge", "# TYPE node_infiniband_state_id gauge"]
    lines += [f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{n}",gpu="0"}} 45' for n in GPU_NODES]
    # An exporter whose Hostname is its pod's name (a pod on gpu-00), and one naming no Node.
    lines += [f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{pod}",gpu="1"}} 45' for pod in (EXPORTER_POD, "ghost")]
    lines += [
        f'node_infiniband_state_id{{Hostname="{n}",device="mlx5_0",port="1"}} {1 if n in IB_DOWN else 4}'
        for n in IB_NODES
    ]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def prometheus() -> Iterator[PrometheusServer]:
    with text_exporter(exposition) as address, prometheus_server([ScrapeTarget(address)]) as prom:
        prom.wait_for_samples('node_infiniband_state_id{Hostname="gpu-04"}')
        prom.wait_for_samples('DCGM_FI_DEV_GPU_TEMP{Hostname="gpu-19"}')
        yield prom


def test_coverage_is_the_nodes_exporting_a_rules_metrics(prometheus: PrometheusServer) -> None:
    source = PrometheusSource(prometheus.url)
    coverage = observe_coverage(ruleset=RULES, source=source, now=datetime.now(UTC), book=BOOK)
    # The pod's series counts for its node; the one naming no Node counts for none.
    assert coverage == {"GpuTooHot": frozenset(GPU_NODES), "IbPortDown": frozenset(IB_NODES)}
    assert (
        coverage_query(["b", "a"], ["Hostname", "node"])
        == 'group by (__name__, Hostname, node, instance) ({__name__=~"a|b"})'
    )
    # Without the cluster's names, node labels are taken as they are.
    unchecked = observe_coverage(ruleset=RULES, source=source, now=datetime.now(UTC))
    assert unchecked["GpuTooHot"] == frozenset([*GPU_NODES, EXPORTER_POD, "ghost"])


def test_an_unreachable_prometheus_leaves_coverage_unknown(caplog: pytest.LogCaptureFixture) -> None:
    """No data is not a pool of none: the rules are left out and the labelled pools stand in."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    source = PrometheusSource(f"http://127.0.0.1:{port}", timeout_seconds=2)
    assert observe_coverage(ruleset=RULES, source=source, now=datetime.now(UTC)) == {}
    assert "rule coverage not observed (labelled pools stand in)" in caplog.text


def test_an_infiniband_rule_trips_the_breaker_over_the_nodes_with_infiniband(
    prometheus: PrometheusServer, harness: Harness
) -> None:
    """4 of the 5 InfiniBand nodes failing trips a 50 % breaker (80 % of 5), though they are 20 %
    of the 20 GPU nodes and 13 % of the cluster; the API and the page show the pool of 5."""
    harness.emu.load([*fleet_nodes(20), *(node(f"cpu-{i:02d}", gpus=0) for i in range(10))])
    with_safety(harness, breaker_nodes=50, breaker_percent=50, max_unhealthy=20, max_unhealthy_percent=100)
    source = PrometheusSource(prometheus.url)
    now = datetime.now(UTC)
    detection = run_detection(
        ruleset=RULES,
        source=source,
        session_factory=harness.sessions,
        state=initial_state(harness.sessions),
        now=now,
    )
    assert sorted(detection.findings.firing) == IB_DOWN

    result = remediate(
        findings=detection.findings,
        rules=RULES,
        actions=harness.actions,
        session_factory=harness.sessions,
        settings=harness.settings,
        now=now,
        fleet=harness.actions.node_pools(),
        coverage=observe_coverage(ruleset=RULES, source=source, now=now, book=BOOK),
    )

    assert result.breaker_tripped and result.breaker is not None
    assert (result.breaker.pool, result.breaker.count, result.breaker.fleet_size) == (
        "a100/node_infiniband_state_id",
        4,
        5,
    )
    assert harness.cordoned() == []
    with http_client(build_app(harness.sessions, settings=harness.settings)) as client:
        status = client.get("/api/v1/status").json()
        page = client.get("/").text
    scope = status["breaker_scope"]
    assert (scope["pool"], scope["pool_nodes"], scope["bad_nodes"]) == ("a100/node_infiniband_state_id", 5, 4)
    budgets = {b["pool"]: b for b in status["budgets"]}
    ib = budgets["a100/node_infiniband_state_id"]
    assert (ib["nodes"], ib["kind"], ib["rules"], ib["breaker_trips_at"]) == (
        5,
        "coverage",
        ["IbPortDown"],
        3,
    )
    assert (budgets["a100"]["nodes"], budgets["a100"]["kind"]) == (20, "labels")
    assert "a100/node_infiniband_state_id" in page and "IbPortDown (nodes exporting its metrics)" in page


def test_without_coverage_the_same_faults_count_over_the_gpu_pool(
    prometheus: PrometheusServer, harness: Harness
) -> None:
    """What the breaker did before rule pools: 4 of 20 is 20 %, no trip, and the budget takes them."""
    harness.emu.load([*fleet_nodes(20), *(node(f"cpu-{i:02d}", gpus=0) for i in range(10))])
    with_safety(harness, breaker_nodes=50, breaker_percent=50, max_unhealthy=20, max_unhealthy_percent=100)
    result = run(harness, tick(T0, *(hot(n, rule="GpuTooHot") for n in IB_DOWN)))
    assert not result.breaker_tripped
    assert harness.cordoned() == IB_DOWN


def test_a_pool_of_four_always_takes_one_node_out_never_two(harness: Harness) -> None:
    """The floor for tiny pools: 10 % of 4 rounds down to 0, yet one node is remediated; the second
    is blocked by the budget (the breaker, needing 3 bad nodes, does not trip)."""
    harness.emu.load([node(f"small-{i}", labels={POOL_LABEL: "l40s"}) for i in range(4)])
    assert harness.settings.safety.max_unhealthy_percent == 10
    result = run(harness, tick(T0, hot("small-0"), hot("small-1", fired_at=T0 + timedelta(seconds=1))))
    assert not result.breaker_tripped
    assert harness.cordoned() == ["small-0"]
    assert result.refused() == {"small-1": "budget"}
    with http_client(build_app(harness.sessions, settings=harness.settings)) as client:
        budgets = {b["pool"]: b for b in client.get("/api/v1/status").json()["budgets"]}
    assert (budgets["l40s"]["nodes"], budgets["l40s"]["out_of_service"], budgets["l40s"]["limit"]) == (
        4,
        1,
        1,
    )
