"""NVLink5 on a real Prometheus scraping the simulated dcgm-exporter (4.x shape): Blackwell nodes
whose exporter reports the NVLink5 link counters (counters-4.x.csv, DCGM fields 1204-1219) and a
Hopper node whose exporter has none of them.

Where the counters exist they judge the GPU (Nvlink5LinkErrors); an NVLink5 Xid on a GPU whose
counters moved is not judged a second time by GpuNvlink5XidCorroborated; where they do not move,
or do not exist, the repeated NVLink5 Xid still is (the fallback). Nothing else fires.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from healer_dev.simulator import Fleet, FleetConfig, ManualClock, SimulatorServer, parse_scenario
from tests.exposition import all_findings, load_pack
from tests.services import PrometheusServer, ScrapeTarget, prometheus_server, wait_until

pytestmark = pytest.mark.prometheus

AT = 1000
BEFORE, AFTER = 10.0, AT + 5.0


def _f(node: str, gpu: int, at: float = AT, **fault: Any) -> dict[str, Any]:
    return {"node": node, "gpu": gpu, "at": f"{at}s", **fault}


BLACKWELL_FAULTS = [
    # b-00 GPU 1: an NVLink5 Xid (repeated: enough for the Xid rule alone) and its link retraining,
    # with effective errors
    _f("b-00", 1, fault="xid", code=145),
    _f("b-00", 1, AT + 1, fault="xid", code=145),
    _f("b-00", 1, fault="nvlink5_errors", link_recovery=1, effective_errors=20, duration="1s"),
    # b-01 GPU 2: the Xid repeats, the link counters stay clean
    _f("b-01", 2, fault="xid", code=149),
    _f("b-01", 2, AT + 1, fault="xid", code=149),
    # b-02 GPU 3: received packet errors, no Xid
    _f("b-02", 3, fault="nvlink5_errors", link_recovery=0, rx_errors=5, duration="1s"),
]
HOPPER_FAULTS = [
    # h-00 GPU 0: no NVLink5 counters at all; the repeated Xid is all there is
    _f("h-00", 0, fault="xid", code=145),
    _f("h-00", 0, AT + 1, fault="xid", code=145),
]

EXPECTED = {
    "Nvlink5LinkErrors": {("b-00", "1"): "20", ("b-02", "3"): "5"},
    "GpuNvlink5XidCorroborated": {("b-01", "2"): "149", ("h-00", "0"): "145"},
}


def _fleet(prefix: str, nvlink5: bool, faults: list[dict[str, Any]], seed: int) -> Fleet:
    config = FleetConfig(
        nodes=3 if nvlink5 else 1,
        gpus=4,
        hcas=1,
        seed=seed,
        idle_fraction=0.0,
        node_prefix=prefix,
        exporter_version="4.x",
        nvlink5=nvlink5,
    )
    return Fleet(config, parse_scenario(yaml.safe_dump({"faults": faults}), source=f"nvlink5-{prefix}"))


@pytest.fixture(scope="module")
def prom() -> Iterator[PrometheusServer]:
    clock = ManualClock(BEFORE)
    blackwell = _fleet("b-", True, BLACKWELL_FAULTS, seed=25)
    hopper = _fleet("h-", False, HOPPER_FAULTS, seed=26)
    with SimulatorServer(blackwell, clock=clock) as sim_b, SimulatorServer(hopper, clock=clock) as sim_h:
        targets = []
        for k, sim in enumerate((sim_b, sim_h)):
            for name in sim.fleet.node_names:
                labels = sim.fleet.target_labels(name, "dcgm")
                job = labels.pop("job")
                labels["instance"] = labels["instance"].replace("10.244.", f"10.{k}.")
                targets.append(ScrapeTarget(sim.address, sim.fleet.metrics_path(name, "dcgm"), labels, job))
        with prometheus_server(targets) as server:
            server.wait_for_targets_up(len(targets), timeout=60)
            metric = "DCGM_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS"
            wait_until(
                lambda: server.query(f"min(count_over_time({metric}[1m])) >= 3"), timeout=60, what=metric
            )
            clock.set(AFTER)
            for expr in (
                'DCGM_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS{Hostname="b-00",gpu="1"} == 20',
                'DCGM_FI_DEV_NVLINK_COUNT_RX_ERRORS{Hostname="b-02",gpu="3"} == 5',
                'DCGM_EXP_XID_ERRORS_COUNT{Hostname="h-00",gpu="0",xid="145"} == 2',
                'DCGM_EXP_XID_ERRORS_COUNT{Hostname="b-00",gpu="1",xid="145"} == 2',
                'DCGM_EXP_XID_ERRORS_COUNT{Hostname="b-01",gpu="2",xid="149"} == 2',
            ):
                server.wait_for_samples(expr)
            yield server


def test_the_hopper_node_exports_no_nvlink5_counter(prom: PrometheusServer) -> None:
    assert prom.query('{__name__=~"DCGM_FI_DEV_NVLINK_COUNT_.+", Hostname="h-00"}') == []
    assert len(prom.query('DCGM_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS{Hostname=~"b-.+"}')) == 12


def test_one_fault_is_one_finding_and_the_xid_is_the_fallback(prom: PrometheusServer) -> None:
    found = all_findings(prom, load_pack())
    assert found == EXPECTED
