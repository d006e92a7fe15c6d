"""A repaired node's faults are gone from the repair on; what was scraped before stays as it was."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from healer_dev.simulator.fleet import Fleet, FleetConfig
from healer_dev.simulator.scenario import parse_scenario

SCENARIO = """
faults:
  - {at: 10s, node: gpu-node-01, gpu: 3, fault: hot_gpu, target: 88, ramp: 10s}
  - {at: 20s, node: gpu-node-01, gpu: 2, fault: xid, code: 79}
  - {at: 200s, node: gpu-node-01, gpu: 3, fault: thermal_slowdown, reasons: 0x48}
  - {at: 500s, node: gpu-node-01, gpu: 1, fault: hot_gpu, target: 90, ramp: 10s}
"""


def _gpu_values(fleet: Fleet, metric: str, t: float) -> dict[str, float]:
    body = fleet.scrape("gpu-node-01", "dcgm", t).body
    return {
        s.labels["gpu"]: s.value
        for fam in text_string_to_metric_families(body)
        for s in fam.samples
        if s.name == metric
    }


def test_repair_clears_started_faults_and_keeps_later_ones() -> None:
    fleet = Fleet(FleetConfig(nodes=3), parse_scenario(SCENARIO))
    assert _gpu_values(fleet, "DCGM_FI_DEV_GPU_TEMP", 60)["3"] >= 85
    assert _gpu_values(fleet, "DCGM_FI_DEV_XID_ERRORS", 60)["2"] == 79

    assert _gpu_values(fleet, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 300)["3"] == 0x48 | 0x4

    assert fleet.repair("gpu-node-01", 100) == 3

    assert _gpu_values(fleet, "DCGM_FI_DEV_GPU_TEMP", 120)["3"] < 78
    assert _gpu_values(fleet, "DCGM_FI_DEV_XID_ERRORS", 120)["2"] == 0
    # The replaced GPU's later fault is gone with it; another GPU's later fault still happens.
    assert _gpu_values(fleet, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 300)["3"] != 0x48
    assert _gpu_values(fleet, "DCGM_FI_DEV_GPU_TEMP", 600)["1"] >= 85
    # Other nodes are untouched, and repairing twice removes nothing more.
    assert fleet.repair("gpu-node-01", 100) == 0
    assert fleet.repair("gpu-node-02", 100) == 0
