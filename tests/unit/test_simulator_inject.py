"""A fault injected into a running fleet starts at its ``at`` on the scrapes' clock, like a scenario's."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from healer_dev.simulator.fleet import Fleet, FleetConfig
from healer_dev.simulator.scenario import HotGpu, ScenarioError


def _temps(fleet: Fleet, node: str, t: float) -> dict[str, float]:
    body = fleet.scrape(node, "dcgm", t).body
    return {
        s.labels["gpu"]: s.value
        for fam in text_string_to_metric_families(body)
        for s in fam.samples
        if s.name == "DCGM_FI_DEV_GPU_TEMP"
    }


def test_injected_fault_starts_at_its_time_on_that_node_only() -> None:
    fleet = Fleet(FleetConfig(nodes=2))
    before = _temps(fleet, "gpu-node-01", 99.9)
    fleet.inject(HotGpu(at=100.0, node="gpu-node-01", gpu=3, fault="hot_gpu", target=95))

    assert _temps(fleet, "gpu-node-01", 99.9) == before, "nothing changes before its time"
    assert _temps(fleet, "gpu-node-01", 100.0)["3"] >= 94
    assert all(v < 78 for g, v in _temps(fleet, "gpu-node-01", 100.0).items() if g != "3")
    assert all(v < 78 for v in _temps(fleet, "gpu-node-00", 100.0).values())
    # It is the node's fault like any other: a repair ends it.
    assert fleet.repair("gpu-node-01", 120.0) == 1
    assert _temps(fleet, "gpu-node-01", 121.0)["3"] < 78


def test_injecting_onto_a_missing_node_or_gpu_is_refused() -> None:
    fleet = Fleet(FleetConfig(nodes=2, gpus=4))
    with pytest.raises(ScenarioError, match="not in the fleet"):
        fleet.inject(HotGpu(at=0.0, node="gpu-node-07", gpu=0, fault="hot_gpu"))
    with pytest.raises(ScenarioError, match=r"GPUs 0\.\.3"):
        fleet.inject(HotGpu(at=0.0, node="gpu-node-01", gpu=5, fault="hot_gpu"))
