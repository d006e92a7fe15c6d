"""The circuit breaker and the budget per pool: the right denominator, and the floor for tiny pools."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from healer.engine.safety import breaker, breaker_trips_at
from healer.model.limits import SafetyLimits
from healer.model.node import NO_GPU_POOL, pool_of

NOW = datetime(2025, 3, 4, 12, 0, tzinfo=UTC)
LIMITS = SafetyLimits(max_unhealthy=2, max_unhealthy_percent=10, breaker_nodes=50, breaker_percent=50)


def cluster(gpu: int, cpu: int) -> dict[str, str]:
    return {**{f"gpu-{i}": "h100" for i in range(gpu)}, **{f"cpu-{i}": NO_GPU_POOL for i in range(cpu)}}


def bad(*names: str) -> dict[str, datetime]:
    return {n: NOW - timedelta(seconds=30) for n in names}


def test_cpu_nodes_do_not_dilute_a_gpu_pool() -> None:
    """15 of 20 GPU nodes bad in a 100-node cluster is 75 % of the pool, not 15 % of the cluster."""
    verdict = breaker(
        turned_bad=bad(*(f"gpu-{i}" for i in range(15))),
        fleet_size=100,
        settings=LIMITS,
        now=NOW,
        pools=cluster(20, 80),
    )
    assert verdict.trip
    assert (verdict.pool, verdict.count, verdict.fleet_size) == ("h100", 15, 20)
    assert verdict.reason.startswith("15 node(s) (75% of 20) turned bad within 300 s, 15 of pool h100's 20")


def test_the_same_cluster_judged_as_one_fleet_does_not_trip() -> None:
    """What the breaker did before pools: 15 % of 100 (kept for callers without a fleet map)."""
    bad_nodes = bad(*(f"gpu-{i}" for i in range(15)))
    assert not breaker(turned_bad=bad_nodes, fleet_size=100, settings=LIMITS, now=NOW).trip


def test_one_bad_node_in_a_four_node_pool_never_trips() -> None:
    limits = SafetyLimits(breaker_nodes=5, breaker_percent=20)
    pools = {f"n{i}": "default" for i in range(4)}
    assert not breaker(turned_bad=bad("n0"), fleet_size=4, settings=limits, now=NOW, pools=pools).trip
    assert not breaker(turned_bad=bad("n0", "n1"), fleet_size=4, settings=limits, now=NOW, pools=pools).trip
    three = breaker(turned_bad=bad("n0", "n1", "n2"), fleet_size=4, settings=limits, now=NOW, pools=pools)
    assert three.trip and three.fleet_size == 4


def test_pools_are_judged_apart() -> None:
    """Each pool's share is judged against its own size: 3 of 10 A100s trips, 5 of 100 H100s does not."""
    limits = SafetyLimits(breaker_nodes=10, breaker_percent=20)
    pools = {**{f"a{i}": "a100" for i in range(10)}, **{f"h{i}": "h100" for i in range(100)}}
    # 2 in a100 (20 %, not over) and 5 in h100 (5 %): no pool is over, 7 nodes is under 10.
    calm = breaker(
        turned_bad=bad("a0", "a1", *(f"h{i}" for i in range(5))),
        fleet_size=110,
        settings=limits,
        now=NOW,
        pools=pools,
    )
    assert not calm.trip
    over = breaker(turned_bad=bad("a0", "a1", "a2"), fleet_size=110, settings=limits, now=NOW, pools=pools)
    assert over.trip and over.pool == "a100" and over.fleet_size == 10


@pytest.mark.parametrize(
    ("size", "expected"),
    [(4, 3), (10, 3), (20, 5), (100, 6), (1000, 6)],
)
def test_breaker_trips_at(size: int, expected: int) -> None:
    """The number shown per pool on the dashboard: 20 % of the pool, at least 3, at most 5 + 1."""
    assert breaker_trips_at(size, SafetyLimits(breaker_nodes=5, breaker_percent=20)) == expected


def test_breaker_trips_at_agrees_with_breaker() -> None:
    limits = SafetyLimits(breaker_nodes=5, breaker_percent=20)
    for size in (1, 3, 4, 9, 10, 17, 30, 64):
        pools = {f"n{i}": "p" for i in range(size)}
        at = breaker_trips_at(size, limits)
        names = [f"n{i}" for i in range(size)]
        if at <= size:
            assert breaker(
                turned_bad=bad(*names[:at]), fleet_size=size, settings=limits, now=NOW, pools=pools
            ).trip
        before = breaker(
            turned_bad=bad(*names[: at - 1]), fleet_size=size, settings=limits, now=NOW, pools=pools
        )
        assert not before.trip, size


@pytest.mark.parametrize(
    ("labels", "gpus", "pool"),
    [
        ({"node.kubernetes.io/instance-type": "p5.48xlarge"}, 8, "p5.48xlarge"),
        ({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, 8, "NVIDIA-H100-80GB-HBM3"),
        ({}, 8, "default"),
        ({}, None, "default"),
        ({}, 0, NO_GPU_POOL),
    ],
)
def test_pool_of(labels: dict[str, str], gpus: int | None, pool: str) -> None:
    """Pool label, then GPU feature discovery's product, then GPU nodes vs nodes without GPUs."""
    pool_labels = ("node.kubernetes.io/instance-type", "nvidia.com/gpu.product")
    assert pool_of(labels, gpus, pool_labels=pool_labels) == pool
