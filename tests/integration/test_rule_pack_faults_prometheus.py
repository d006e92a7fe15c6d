"""Done-when of issue 14: the whole default rule pack, on a real Prometheus, against the simulated
dcgm-exporter in both output shapes (3.x and 4.x, ``FleetConfig.exporter_version``) and the real
node_exporter (Debian's ``prometheus-node-exporter``) reading the sysfs tree the simulator writes.

Every fault of :data:`GPU_CASES` runs on its own node of a 3.x fleet and again of a 4.x fleet; every
fault of :data:`IB_CASES` on its own node whose HCAs the real node_exporter reads. The clean fleet
(GPU sharing and MIG already on, a pod on a shared GPU still running) fires nothing; then the faults
start and each must fire exactly its rules on its node and GPU or HCA port, and nothing anywhere
else. The pack is the operator's: every HCA compute fabric except the management HCA ``mlx5_2``
(the settings' ``infiniband.device_exclude: mlx5_2``), so that HCA flapping is no finding.

Counter rules (``increase``) need samples before the fault, and the rules that compare with the last
hour (GpuMissing, InfinibandPortMissing) need a minute step of that hour that saw the healthy count
(and the sharing pod's series): the fixture waits for both before the faults start.

Node names: ``d3-NN`` (3.x fleet), ``d4-NN`` (4.x fleet); case ``i`` runs on node ``NN = i``.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from healer_dev.node_exporter import run_node_exporter
from healer_dev.simulator import Fleet, FleetConfig, ManualClock, SimulatorServer, parse_scenario
from healer_dev.simulator.sysfs import SysfsFeeder, SysfsTree
from tests.exposition import all_findings, load_pack
from tests.services import PrometheusServer, ScrapeTarget, prometheus_server, wait_until

pytestmark = pytest.mark.prometheus

#: When the faults start (simulated seconds) and where the clock stands before and after.
AT = 1000
BEFORE, AFTER = 10.0, AT + 5.0
MANAGEMENT_HCA = "mlx5_2"  # FleetConfig(hcas=2, management_hcas=1): mlx5_0, mlx5_1 compute

Where = dict[str, dict[str | None, str | None]]  # rule -> {GPU index or device:port or None: value}


@dataclass(frozen=True)
class Case:
    """A named fault (scenario entries without ``node``) and what it must fire: rule → {target: value}
    (value None: only where matters, e.g. an extrapolated increase)."""

    name: str
    faults: tuple[dict[str, Any], ...]
    fires: Where


def _f(**fault: Any) -> dict[str, Any]:
    return {"at": f"{AT}s", **fault}


GPU_CASES: tuple[Case, ...] = (
    Case(
        "hot GPU",
        (_f(gpu=1, fault="hot_gpu", target=86),),
        {"GpuTooHot": {"1": None}, "GpuThermalMarginLow": {"1": None}},  # 89 C slowdown - ~86 C
    ),
    Case(
        "hardware slowdown",
        (_f(gpu=1, fault="thermal_slowdown", reasons=0x48),),
        {"GpuHardwareSlowdown": {"1": "76"}},  # 0x48 | the busy GPU's SW power cap 0x4
    ),
    Case(
        "power brake",
        (_f(gpu=1, fault="thermal_slowdown", reasons=0x80, sm_clock=1980),),
        {"GpuPowerBrake": {"1": "132"}},  # 0x80 | 0x4
    ),
    Case(
        "silent throttling",
        (_f(gpu=1, fault="silent_throttle", tensor_active=0.12),),
        {"GpuSilentThrottling": {"1": None}},
    ),
    Case(
        "Xid 79",
        (_f(gpu=1, fault="xid", code=79),),
        {"GpuFatalXid": {"1": "79"}, "GpuFatalXidRecent": {"1": "1"}},
    ),
    Case("Xid not in the catalog", (_f(gpu=1, fault="xid", code=201),), {"GpuUnknownXid": {"1": "201"}}),
    Case(
        "NVLink5 Xid repeated",
        (_f(gpu=1, fault="xid", code=150), {**_f(gpu=1, fault="xid", code=150), "at": f"{AT + 1}s"}),
        {"GpuNvlink5XidCorroborated": {"1": "150"}},
    ),
    Case("row remap failure", (_f(gpu=1, fault="row_remap_failure"),), {"GpuRowRemapFailure": {"1": "1"}}),
    Case("row remap pending", (_f(gpu=1, fault="row_remap_pending"),), {"GpuRowRemapPending": {"1": "1"}}),
    Case("double-bit ECC", (_f(gpu=1, fault="ecc_dbe", count=2),), {"GpuDoubleBitEccErrors": {"1": None}}),
    Case(
        "NVLink CRC burst",
        (_f(gpu=1, fault="nvlink_errors", crc_flit=2400, replay=320, duration="1s"),),
        {"NvlinkErrorBurst": {"1": None}},
    ),
    Case(
        "NVLink recovery errors",
        (_f(gpu=1, fault="nvlink_errors", crc_flit=0, crc_data=0, replay=0, recovery=3, duration="1s"),),
        {"NvlinkRecoveryErrors": {"1": None}},
    ),
    Case("GPU off the bus", (_f(gpu=1, fault="gpu_missing"),), {"GpuMissing": {None: "3"}}),
    Case(
        # time-slicing: 3 pods on GPU 1 from the start; 2 end (their series go, the GPU stays)
        "a sharing pod ends",
        ({"at": "0s", "gpu": 1, "fault": "gpu_sharing", "pods": 3, "duration": f"{AT}s"},),
        {},
    ),
    Case(
        "hot shared GPU",
        ({"at": "0s", "gpu": 1, "fault": "gpu_sharing", "pods": 2}, _f(gpu=1, fault="hot_gpu", target=86)),
        {"GpuTooHot": {"1": None}, "GpuThermalMarginLow": {"1": None}},  # once per GPU, not per pod
    ),
    Case(
        "Xid 79 on a MIG GPU",
        ({"at": "0s", "gpu": 1, "fault": "mig", "instances": 3}, _f(gpu=1, fault="xid", code=79)),
        {"GpuFatalXid": {"1": "79"}, "GpuFatalXidRecent": {"1": "1"}},  # once per GPU, not per instance
    ),
    Case(
        "clean, with MIG and sharing",
        (
            {"at": "0s", "gpu": 0, "fault": "mig", "instances": 2},
            {"at": "0s", "gpu": 2, "fault": "gpu_sharing", "pods": 2},
        ),
        {},
    ),
)

IB_CASES: tuple[Case, ...] = (
    Case(
        "link integrity counter saturated",
        (_f(hca="mlx5_0", fault="ib_port_errors", counter="local_link_integrity_errors", count=40),),
        {
            "InfinibandLinkIntegrityErrors": {"mlx5_0:1": None},
            "InfinibandCounterSaturated": {"mlx5_0:1": "15"},
        },
    ),
    Case(
        "buffer overrun counter saturated",
        (_f(hca="mlx5_1", fault="ib_port_errors", counter="excessive_buffer_overrun_errors", count=40),),
        {"InfinibandBufferOverrun": {"mlx5_1:1": None}, "InfinibandCounterSaturated": {"mlx5_1:1": "15"}},
    ),
    Case(
        "link downed counter saturated",
        (_f(hca="mlx5_0", fault="ib_port_errors", counter="link_downed", count=300),),
        {"InfinibandLinkDowned": {"mlx5_0:1": None}, "InfinibandCounterSaturated": {"mlx5_0:1": "255"}},
    ),
    Case(
        "port DOWN", (_f(hca="mlx5_1", fault="ib_port_down"),), {"InfinibandPortNotActive": {"mlx5_1:1": "1"}}
    ),
    Case("HCA gone", (_f(hca="mlx5_1", fault="ib_hca_missing"),), {"InfinibandPortMissing": {None: "1"}}),
    Case(
        "link flap", (_f(hca="mlx5_0", fault="ib_link_flap"),), {"InfinibandLinkDowned": {"mlx5_0:1": None}}
    ),
    Case(
        "management HCA flapping (excluded)",
        (_f(hca=MANAGEMENT_HCA, fault="ib_link_flap", flaps=3, interval="1s", down_for="10s"),),
        {},
    ),
)

SHAPES = ("3.x", "4.x")
#: GPU cases on nodes 0..len(GPU_CASES)-1 of both fleets, IB cases on the next nodes of the 4.x fleet.
IB_FIRST = len(GPU_CASES)
NODES = IB_FIRST + len(IB_CASES)


def node(shape: str, index: int) -> str:
    return f"d{shape[0]}-{index:02d}"


def scenario(shape: str) -> str:
    faults = [{"node": node(shape, i), **f} for i, case in enumerate(GPU_CASES) for f in case.faults]
    faults += [
        {"node": node(shape, IB_FIRST + i), **f} for i, case in enumerate(IB_CASES) for f in case.faults
    ]
    return yaml.safe_dump({"name": f"issue-14-{shape}", "faults": faults})


Findings = dict[str, dict[tuple[str | None, str | None], str]]


@dataclass
class Run:
    """What the pack found on the clean fleet and once the faults started."""

    clean: Findings
    faulty: Findings
    faulty_unexcluded: Findings


def _fleet(shape: str) -> Fleet:
    config = FleetConfig(
        nodes=NODES,
        gpus=4,
        hcas=2,
        management_hcas=1,
        seed=14,
        idle_fraction=0.0,
        node_prefix=f"d{shape[0]}-",
        exporter_version=shape,  # type: ignore[arg-type]
    )
    return Fleet(config, parse_scenario(scenario(shape), source=f"issue-14-{shape}"))


def _wait_for_history(prom: PrometheusServer, fleets: dict[str, Fleet]) -> None:
    for metric in ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "node_infiniband_link_downed_total"):
        wait_until(
            lambda m=metric: prom.query(f"min(count_over_time({m}[1m])) >= 3"), timeout=60, what=metric
        )
    sharing = node("4.x", 13)
    # A minute step of the last hour that saw every GPU, every port and the sharing pods' series.
    checks = {
        f'max_over_time(count(DCGM_FI_DEV_GPU_TEMP{{Hostname="{sharing}"}})[1h:1m]) == 6': "sharing pods",
        "min(max_over_time(count by (Hostname) (DCGM_FI_DEV_GPU_TEMP)[1h:1m])) >= 4": "every GPU",
        "min(max_over_time(count by (node) (node_infiniband_state_id)[1h:1m])) == 3": "every port",
    }
    for expr, what in checks.items():
        wait_until(lambda e=expr: prom.query(e), timeout=100, interval=1.0, what=what)


@pytest.fixture(scope="module")
def run() -> Iterator[Run]:
    clock = ManualClock(BEFORE)
    fleets = {shape: _fleet(shape) for shape in SHAPES}
    ib_nodes = [node("4.x", i) for i in range(IB_FIRST, NODES)]
    root = Path(tempfile.mkdtemp(prefix="healer-sysfs-fleet-"))
    trees = [SysfsTree(fleets["4.x"], name, root / name) for name in ib_nodes]
    feeder = SysfsFeeder(trees, clock, interval=0.5).start()
    try:
        with (
            SimulatorServer(fleets["3.x"], clock=clock) as sim3,
            SimulatorServer(fleets["4.x"], clock=clock) as sim4,
            contextlib.ExitStack() as stack,
        ):
            targets: list[ScrapeTarget] = []
            for sim in (sim3, sim4):
                for name in sim.fleet.node_names:
                    labels = sim.fleet.target_labels(name, "dcgm")
                    job = labels.pop("job")
                    # the two fleets' pods are apart: podIP per fleet (10.3.x.y / 10.4.x.y)
                    labels["instance"] = labels["instance"].replace("10.244.", f"10.{name[1]}.")
                    targets.append(
                        ScrapeTarget(sim.address, sim.fleet.metrics_path(name, "dcgm"), labels, job)
                    )
            for tree in trees:
                address = stack.enter_context(run_node_exporter(tree.root))
                # node_exporter has no node label: the target gets one, as a Kubernetes relabeling does
                targets.append(ScrapeTarget(address, labels={"node": tree.node}, job="node-exporter"))
            with prometheus_server(targets) as prom:
                prom.wait_for_targets_up(len(targets), timeout=60)
                _wait_for_history(prom, fleets)
                clean = all_findings(prom, load_pack(exclude=MANAGEMENT_HCA))

                clock.set(AFTER)
                feeder.write_all()
                _wait_for_faults(prom)
                yield Run(
                    clean=clean,
                    faulty=all_findings(prom, load_pack(exclude=MANAGEMENT_HCA)),
                    faulty_unexcluded=all_findings(prom, load_pack()),
                )
    finally:
        feeder.stop()
        shutil.rmtree(root, ignore_errors=True)


def _wait_for_faults(prom: PrometheusServer) -> None:
    """Until the last scrape of every target shows the faults (and the ended pods' series went stale)."""
    gone, mgmt = node("4.x", IB_FIRST + 4), node("4.x", IB_FIRST + 6)
    checks = (
        f'count(node_infiniband_state_id{{node="{gone}"}}) == 2',
        f'node_infiniband_link_downed_total{{node="{mgmt}",device="{MANAGEMENT_HCA}"}} == 3',
        "count(DCGM_FI_DEV_ROW_REMAP_PENDING == 1) == 2",
        f'count(DCGM_FI_DEV_GPU_TEMP{{Hostname="{node("4.x", 13)}"}}) == 4',
        f'count(DCGM_FI_DEV_GPU_TEMP{{Hostname="{node("3.x", 13)}"}}) == 4',
    )
    for expr in checks:
        wait_until(lambda e=expr: prom.query(e), timeout=30, what=expr)
    # two more scrapes of every target, so increase() has a sample after each jump
    wait_until(lambda: prom.query("min(count_over_time(up[3s])) >= 3"), timeout=10, what="scrapes")
    time.sleep(2.5)


def expected(case: Case, where: str) -> Findings:
    return {
        rule: {(where, target): value for target, value in targets.items()}
        for rule, targets in case.fires.items()
    }


def on_node(found: Findings, where: str) -> Findings:
    """The findings of ``found`` on node ``where``, by rule."""
    out: Findings = {}
    for rule, hits in found.items():
        mine = {k: v for k, v in hits.items() if k[0] == where}
        if mine:
            out[rule] = mine
    return out


def assert_fires(found: Findings, case: Case, where: str) -> None:
    want = expected(case, where)
    got = on_node(found, where)
    assert {r: set(h) for r, h in got.items()} == {r: set(h) for r, h in want.items()}, (case.name, got)
    for rule, hits in want.items():
        for key, value in hits.items():
            if value is not None:
                assert got[rule][key] == value, (case.name, rule, key)


def test_the_clean_fleet_fires_nothing(run: Run) -> None:
    assert run.clean == {}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("index", range(len(GPU_CASES)), ids=[c.name for c in GPU_CASES])
def test_each_gpu_fault_fires_its_rules_on_its_node_and_gpu_only(run: Run, shape: str, index: int) -> None:
    assert_fires(run.faulty, GPU_CASES[index], node(shape, index))


@pytest.mark.parametrize("index", range(len(IB_CASES)), ids=[c.name for c in IB_CASES])
def test_each_infiniband_fault_fires_its_rules_on_its_node_and_port_only(run: Run, index: int) -> None:
    assert_fires(run.faulty, IB_CASES[index], node("4.x", IB_FIRST + index))


def test_nothing_fires_anywhere_else(run: Run) -> None:
    case_nodes = {node(s, i) for s in SHAPES for i in range(len(GPU_CASES))}
    case_nodes |= {node("4.x", IB_FIRST + i) for i in range(len(IB_CASES))}
    stray = {
        rule: {k for k in hits if k[0] not in case_nodes}
        for rule, hits in run.faulty.items()
        if any(k[0] not in case_nodes for k in hits)
    }
    assert stray == {}
    # the 3.x fleet's IB-case nodes ran no fault: nothing there either
    assert all(not on_node(run.faulty, node("3.x", IB_FIRST + i)) for i in range(len(IB_CASES)))


def test_the_management_hca_flap_is_a_finding_only_when_not_excluded(run: Run) -> None:
    mgmt = node("4.x", IB_FIRST + 6)
    assert on_node(run.faulty, mgmt) == {}
    unexcluded = on_node(run.faulty_unexcluded, mgmt)
    assert set(unexcluded.get("InfinibandLinkDowned", {})) == {(mgmt, f"{MANAGEMENT_HCA}:1")}
