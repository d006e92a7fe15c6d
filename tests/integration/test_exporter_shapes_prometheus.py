"""The default rule pack against exporters as they really are, on a real Prometheus.

Three dcgm-exporters in the shapes upstream dcgm-exporter gives (sources in rules/README.md):

- ``gpu-n3``, a 3.x exporter: field 112 named ``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS``, a Xid series
  on every GPU from the start (``err_code="0"``, value 0), model names with blanks, no thermal
  margin, GPU 0 shared by two pods (one series per pod, as time-slicing/MPS/DRA give);
- ``gpu-n4``, a 4.4+ exporter: ``DCGM_FI_DEV_CLOCKS_EVENT_REASONS``, labels sorted, no Xid series
  until a GPU's first Xid, ``--replace-blanks-in-model-name``, the thermal margin (field 153) and
  the recovery action (field 1523, where the operator enabled it) exported, GPU 3 in MIG mode (one
  series per GPU instance);
- ``gpu-n4b``, a 4.x exporter without field 153 whose node label is ``hostname``;

and the real node_exporter (Debian's ``prometheus-node-exporter``) reading a fake sysfs tree for
``gpu-n3``'s HCAs (mlx5_0..3 compute fabric, mlx5_9 a management HCA), its node given by a target
label as a Kubernetes relabeling would. Every default rule's ``expr`` runs through the HTTP API as
healer runs it; each fault must show on its node and GPU/port, and nothing else anywhere.

These exporters are typed by the team and change under the test (a pod ending, a GPU lost); the
shapes people published, served as they are, are in ``tests/fixtures/exposition-corpus/``
(test_exposition_corpus_prometheus.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.exposition import Pages, all_findings, findings, load_pack, serve
from tests.node_exporter import NodeExporter, node_exporter
from tests.services import PrometheusServer, ScrapeTarget, prometheus_server, wait_until

pytestmark = pytest.mark.prometheus

N3, N4, N4B = "gpu-n3", "gpu-n4", "gpu-n4b"
MODEL = "NVIDIA H100 80GB HBM3"


@dataclass
class Gpu:
    """What one GPU reports. ``xid`` None: no Xid since the exporter started."""

    index: int
    temp: float = 45.0
    margin: float = 40.0  # degrees C below slowdown (field 153), where the exporter has it
    reasons: int = 0
    xid: int | None = None
    xid_counts: dict[int, int] = field(default_factory=dict)
    recovery: int = 0
    pods: list[str] = field(default_factory=lambda: ["train-0"])
    mig: list[int] = field(default_factory=list)  # GPU instance ids
    nvlink_recovery: int = 0  # DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL


@dataclass
class DcgmExporter:
    """One node's dcgm-exporter in the 3.x or 4.x shape; ``render`` is its /metrics text."""

    node: str
    shape: str  # "3.x" or "4.x"
    gpus: list[Gpu]
    node_label: str = "Hostname"
    replace_blanks: bool = False
    margin: bool = False  # exports DCGM_FI_DEV_GPU_TEMP_LIMIT (and the recovery action)

    def uuid(self, g: int) -> str:
        return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{self.node}.gpu{g}')}"

    def _series(self, gpu: Gpu, extra: dict[str, str] | None = None) -> Iterator[str]:
        base = {
            "gpu": str(gpu.index),
            "UUID": self.uuid(gpu.index),
            "pci_bus_id": f"00000000:{0x18 + 16 * gpu.index:02X}:00.0",
            "device": f"nvidia{gpu.index}",
            "modelName": MODEL.replace(" ", "-") if self.replace_blanks else MODEL,
            self.node_label: self.node,
            "DCGM_FI_DRIVER_VERSION": "570.133.20",
            **(extra or {}),
        }
        for instance in gpu.mig or [None]:
            mig = {} if instance is None else {"GPU_I_PROFILE": "3g.40gb", "GPU_I_ID": str(instance)}
            for pod in gpu.pods or [None]:
                work = {} if pod is None else {"container": "trainer", "namespace": "ml", "pod": pod}
                labels = {**base, **mig, **work}
                if self.shape == "4.x":  # 4.x sorts labels; 3.x keeps the order above
                    labels = dict(sorted(labels.items()))
                yield "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"

    def render(self) -> str:
        clock = (
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
            if self.shape == "4.x"
            else "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
        )
        families: list[tuple[str, str, Any]] = [
            ("DCGM_FI_DEV_GPU_TEMP", "gauge", lambda g: g.temp),
            (clock, "gauge", lambda g: g.reasons),
            ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", lambda g: 0),
            ("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", lambda g: 0),
            ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", lambda g: 0),
            ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter", lambda g: 0),
            ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter", lambda g: g.nvlink_recovery),
            ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", lambda g: 0.97),
            ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", lambda g: 0.41),
        ]
        if self.margin:
            families.append(("DCGM_FI_DEV_GPU_TEMP_LIMIT", "gauge", lambda g: g.margin))
            families.append(("DCGM_FI_DEV_GPU_RECOVERY_ACTION", "gauge", lambda g: g.recovery))
        out: list[str] = []
        for name, kind, value in families:
            out.append(f"# TYPE {name} {kind}")
            out.extend(f"{name}{s} {value(g):f}" for g in self.gpus for s in self._series(g))
        out.append("# TYPE DCGM_FI_DEV_XID_ERRORS gauge")
        for g in self.gpus:
            if g.xid is None and self.shape == "4.x":
                continue  # 4.4.1+: no series until the GPU's first Xid
            code = g.xid or 0
            msg = "No Error" if code == 0 else "Xid"
            out.extend(
                f"DCGM_FI_DEV_XID_ERRORS{s} {code:f}"
                for s in self._series(g, {"err_code": str(code), "err_msg": msg})
            )
        out.append("# TYPE DCGM_EXP_XID_ERRORS_COUNT gauge")
        for g in self.gpus:
            for xid, count in g.xid_counts.items():
                extra = {"xid": str(xid), "window_size_in_ms": "300000"}
                out.extend(f"DCGM_EXP_XID_ERRORS_COUNT{s} {count:f}" for s in self._series(g, extra))
        return "\n".join(out) + "\n"


@dataclass
class Fleet:
    prom: PrometheusServer
    pages: Pages
    exporters: dict[str, DcgmExporter]
    ib: NodeExporter

    def publish(self) -> None:
        for node, exporter in self.exporters.items():
            self.pages.set(f"/{node}/metrics", exporter.render())


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    exporters = {
        N3: DcgmExporter(N3, "3.x", [Gpu(0, pods=["train-a", "train-b"]), Gpu(1), Gpu(2), Gpu(3)]),
        N4: DcgmExporter(
            N4,
            "4.x",
            [Gpu(0), Gpu(1), Gpu(2), Gpu(3, pods=[], mig=[1, 2]), Gpu(4), Gpu(5)],
            replace_blanks=True,
            margin=True,
        ),
        N4B: DcgmExporter(N4B, "4.x", [Gpu(0), Gpu(1)], node_label="hostname", replace_blanks=True),
    }
    pages = Pages({f"/{node}/metrics": e.render() for node, e in exporters.items()})
    with serve(pages) as address, node_exporter() as ib:
        for hca in ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_9"):
            ib.sysfs.add_hca(hca)
        # A counter pinned at its 16-bit maximum since before healer looked: it cannot increase.
        ib.sysfs.set_counter("mlx5_2", "symbol_error", 65535)
        # One fake server for the three exporters: `instance` set apart as the pods' podIP:9400 would be.
        targets = [
            ScrapeTarget(
                address, f"/{node}/metrics", labels={"instance": f"10.0.0.{i}:9400"}, job="dcgm-exporter"
            )
            for i, node in enumerate(exporters, start=1)
        ]
        targets.append(ScrapeTarget(ib.address, labels={"node": N3}, job="node-exporter"))
        with prometheus_server(targets) as prom:
            wait_for_history(prom)
            yield Fleet(prom, pages, exporters, ib)


def wait_for_history(prom: PrometheusServer) -> None:
    prom.wait_for_targets_up(4)
    # rate()/increase() need samples before the fault to see it move.
    for metric in ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "node_infiniband_link_downed_total"):
        wait_until(
            lambda m=metric: prom.query(f"min(count_over_time({m}[1m])) >= 3"), timeout=30, what=metric
        )
    # GPU sharing: gpu-n3 has 5 GPU series for 4 GPUs. Wait until GpuMissing's hour of history
    # (minute steps) holds that: counting series there, the pod ending later would look like a GPU lost.
    wait_until(
        lambda: prom.query(f'max_over_time(count(DCGM_FI_DEV_GPU_TEMP{{Hostname="{N3}"}})[1h:1m]) == 5'),
        timeout=75,
        what="a minute step with the shared GPU's two series",
    )


def test_healthy_fleet_fires_nothing_but_the_pinned_counter(fleet: Fleet) -> None:
    prom = fleet.prom
    assert len(prom.query("DCGM_FI_DEV_XID_ERRORS")) == 5  # 3.x: one per GPU series; 4.x: none yet
    assert all_findings(prom, load_pack()) == {
        "InfinibandCounterSaturated": {(N3, "mlx5_2:1"): "65535"},
    }
    # ...and the rate rules cannot see it: a pinned counter does not move.
    assert findings(prom, load_pack()["InfinibandSymbolErrorsFatal"]) == {}


def test_each_fault_fires_on_its_node_and_gpu_or_port_only(fleet: Fleet) -> None:
    prom, ib = fleet.prom, fleet.ib.sysfs
    n3, n4, n4b = (fleet.exporters[n].gpus for n in (N3, N4, N4B))
    n3[0].pods = ["train-a"]  # a sharing pod ends: its series go, the GPU stays
    n3[1].temp = 85.0
    n3[2].reasons = 0x48  # hw_slowdown | hw_thermal
    n3[3].xid = 79
    n4[0].xid, n4[0].xid_counts = 150, {150: 3}  # NVLink5 Xid, repeated: corroborated
    n4[1].temp, n4[1].margin = 85.0, 3.0  # hot, and its own margin says so
    n4[2].reasons = 0x80  # hw_power_brake
    n4[3].xid, n4[3].xid_counts = 145, {145: 1}  # NVLink5 Xid once, counters quiet: not acted on
    n4[4].xid = 201  # not in the catalog
    n4[5].recovery = 2  # the driver wants a node reboot
    n4b[0].temp = 85.0  # no margin field: the fixed threshold and the model's slowdown point
    fleet.publish()
    ib.set_counter("mlx5_0", "local_link_integrity_errors", 15)  # 4-bit counter at its maximum
    ib.set_state("mlx5_1", 1)  # port DOWN
    ib.set_counter("mlx5_9", "link_downed", 3)  # the management HCA flaps and stays down
    ib.set_state("mlx5_9", 1)

    prom.wait_for_samples('node_infiniband_local_link_integrity_errors_total{device="mlx5_0"} == 15')
    prom.wait_for_samples('node_infiniband_link_downed_total{device="mlx5_9"} == 3')
    prom.wait_for_samples('DCGM_FI_DEV_GPU_RECOVERY_ACTION{gpu="5"} == 2')
    wait_until(
        lambda: prom.query(f'count(DCGM_FI_DEV_GPU_TEMP{{Hostname="{N3}"}}) == 4'), what="pod's series stale"
    )

    expected = {
        "GpuTooHot": {(N3, "1"): "85", (N4B, "0"): "85"},  # gpu-n4 reports its margin: that decides
        "GpuThermalMarginLow": {(N3, "1"): "4", (N4, "1"): "3", (N4B, "0"): "4"},
        "GpuHardwareSlowdown": {(N3, "2"): "72"},
        "GpuPowerBrake": {(N4, "2"): "128"},
        "GpuFatalXid": {(N3, "3"): "79"},
        "GpuNvlink5XidCorroborated": {(N4, "0"): "150"},
        "GpuUnknownXid": {(N4, "4"): "201"},
        "GpuRecoveryActionRequired": {(N4, "5"): "2"},
        "InfinibandLinkIntegrityErrors": {(N3, "mlx5_0:1"): None},
        "InfinibandCounterSaturated": {(N3, "mlx5_0:1"): "15", (N3, "mlx5_2:1"): "65535"},
        "InfinibandPortNotActive": {(N3, "mlx5_1:1"): "1", (N3, "mlx5_9:1"): "1"},
        "InfinibandLinkDowned": {(N3, "mlx5_9:1"): None},
    }
    found = all_findings(prom, load_pack())
    assert set(found) == set(expected), sorted(set(found) ^ set(expected))
    for rule, where in expected.items():
        assert set(found[rule]) == set(where), rule
        for key, value in where.items():
            if value is not None:  # counter increases are extrapolated: only where matters
                assert found[rule][key] == value, (rule, key)

    # The management HCA excluded (compute fabric only): its flap and its DOWN port are no finding;
    # the compute ports still are.
    excluded = all_findings(prom, load_pack(exclude="mlx5_9"))
    assert "InfinibandLinkDowned" not in excluded
    assert set(excluded["InfinibandPortNotActive"]) == {(N3, "mlx5_1:1")}
    assert set(excluded["InfinibandCounterSaturated"]) == {(N3, "mlx5_0:1"), (N3, "mlx5_2:1")}


def test_nvlink_counters_corroborate_and_a_lost_gpu_is_still_seen(fleet: Fleet) -> None:
    prom = fleet.prom
    n4, n4b = fleet.exporters[N4].gpus, fleet.exporters[N4B].gpus
    # gpu-n4's MIG GPU 3 had Xid 145 once: now its NVLink links retrain (recovery errors move).
    n4[3].xid, n4[3].xid_counts, n4[3].nvlink_recovery = 145, {145: 1}, 2
    # gpu-n4b loses GPU 1 off the bus: its series are gone, not just one pod's.
    del n4b[1:]
    fleet.publish()
    fleet.ib.sysfs.remove_hca("mlx5_3")  # an HCA gone from gpu-n3
    prom.wait_for_samples(f'DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL{{Hostname="{N4}",gpu="3"}} == 2')
    wait_until(
        lambda: not prom.query(f'DCGM_FI_DEV_GPU_TEMP{{hostname="{N4B}",gpu="1"}}'), what="GPU 1 stale"
    )

    pack = load_pack()
    # One fault, one finding: the recovery counter judges the GPU, the NVLink5 Xid rule stays quiet.
    assert set(findings(prom, pack["NvlinkRecoveryErrors"])) == {(N4, "3")}
    assert (N4, "3") not in findings(prom, pack["GpuNvlink5XidCorroborated"])
    # GPUs counted by UUID: the lost GPU shows (1 GPU now, 2 in the last hour); MIG instances and
    # shared GPUs elsewhere do not.
    assert findings(prom, pack["GpuMissing"]) == {(N4B, None): "1"}
    wait_until(lambda: not prom.query('node_infiniband_state_id{device="mlx5_3"}'), what="mlx5_3 gone")
    assert findings(prom, pack["InfinibandPortMissing"]) == {(N3, None): "4"}  # 5 ports in the last hour
