"""The default rule pack on a real Prometheus scraping real exporter samples.

The fixtures (``tests/fixtures``) are one dcgm-exporter scrape of ``gpu-node-07``
(8 H100s; GPU 3 hot at 84 C, clock event reasons 72 = hw_slowdown|hw_thermal, tensor activity 0.18
against ~0.41 on its peers while its graphics engine is 99 % busy, last Xid 79; GPU 5 with NVLink
CRC/replay error totals) and one node_exporter InfiniBand scrape (mlx5_4 flapping: link_downed 7,
symbol errors 4187, link error recoveries 93, port receive errors 612). They are served over HTTP
on loopback and scraped every second; every default rule's ``expr`` is then run through the HTTP
API exactly as healer will run it.
"""

from __future__ import annotations

from typing import Any

import pytest

from healer.ruleset.loading import load_ruleset
from healer.ruleset.schema import Rule
from tests.conftest import FIXTURES, REPO
from tests.exposition import Pages, node_of, serve, target_of
from tests.prometheus_releases import PrometheusRelease
from tests.services import PrometheusServer, ScrapeTarget, wait_until

pytestmark = pytest.mark.prometheus

NODE = "gpu-node-07"
GPU3 = {
    "gpu": "3",
    "UUID": "GPU-36f675cc-81e7-4ef5-e8e2-5d940ed90475",
    "pci_bus_id": "00000000:5D:00.0",
    "modelName": "NVIDIA H100 80GB HBM3",
}


def findings(prom: PrometheusServer, rule: Rule) -> dict[tuple[str | None, str | None], dict[str, Any]]:
    """Run the rule's expression as an instant query: {(node, gpu or port): series}. Raises on error."""
    return {(node_of(s["metric"], rule), target_of(s["metric"], rule)): s for s in prom.query(rule.expr)}


def wait_for_counter_history(prom: PrometheusServer, samples: int = 3) -> None:
    # rate()/increase() need two samples of a series: wait for a few scrapes of both exporters so
    # the counter rules really evaluate (to zero) instead of having nothing to work on.
    for metric in ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "node_infiniband_link_downed_total"):
        wait_until(
            lambda metric=metric: prom.query(f"min(count_over_time({metric}[1m])) >= {samples}"),
            timeout=30,
            what=f"{samples} samples of {metric}",
        )


@pytest.fixture(scope="module")
def pack() -> dict[str, Rule]:
    return {r.name: r for r in load_ruleset([REPO / "rules"]).rules}


# The rules whose condition the static samples show, and what they must return: node, GPU, value.
FIRING_IN_SAMPLES = {
    "GpuTooHot": "84",  # degrees C, above 78
    "GpuThermalMarginLow": "5",  # 89 C slowdown - 84 C = 5 C of margin, under 8
    "GpuHardwareSlowdown": "72",  # 0x48 = hw_slowdown (0x8) | hw_thermal (0x40)
    "GpuSilentThrottling": "0.18",  # node median tensor activity 0.41 -> 0.18 is under half
    "GpuFatalXid": "79",  # GPU fell off the bus
}


def test_every_default_rule_runs_and_exactly_the_sampled_faults_fire(
    pack: dict[str, Rule], prometheus_release: PrometheusRelease
) -> None:
    pages = Pages(
        {
            "/dcgm/metrics": (FIXTURES / "dcgm-exporter.prom").read_text(),
            "/ib/metrics": (FIXTURES / "node-exporter-infiniband.prom").read_text(),
        }
    )
    with serve(pages) as address:
        targets = [
            # dcgm-exporter names the node itself (Hostname); node_exporter does not, so its target
            # gets the `node` label a Kubernetes relabeling would add.
            ScrapeTarget(address, "/dcgm/metrics", job="dcgm-exporter"),
            ScrapeTarget(address, "/ib/metrics", labels={"node": NODE}, job="node-exporter"),
        ]
        with prometheus_release.server(targets) as prom:
            assert len(prom.wait_for_samples("DCGM_FI_DEV_GPU_TEMP")) == 8
            assert len(prom.wait_for_samples("node_infiniband_state_id")) == 8
            wait_for_counter_history(prom)

            assert set(FIRING_IN_SAMPLES) <= set(pack)
            for name, rule in pack.items():
                found = findings(prom, rule)  # every expression executes without error
                if name in FIRING_IN_SAMPLES:
                    assert list(found) == [(NODE, "3")], name
                    labels = found[(NODE, "3")]["metric"]
                    assert labels["Hostname"] == NODE, name
                    assert {k: labels[k] for k in GPU3} == GPU3, name
                    assert found[(NODE, "3")]["value"][1] == FIRING_IN_SAMPLES[name], name
                    # Workload labels are dropped: a new pod must not restart the `for` clock.
                    assert "pod" not in labels, name
                else:
                    assert found == {}, name

            # Why the counter rules return nothing although the totals are high: the samples are
            # static, so over any window the counters did not move. A lifetime total since boot is
            # not a burst (GPU 5's 1532 CRC flit errors, mlx5_4's 7 link downs).
            moved = prom.query(
                "increase(DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL[5m]) > 0"
                " or increase(node_infiniband_link_downed_total[5m]) > 0"
            )
            assert moved == []
            (flap,) = prom.query('node_infiniband_link_downed_total{device="mlx5_4"}')
            assert flap["value"][1] == "7"
            # The IB series resolve to the node through the rule's chain (node_labels: node, ...).
            downs = prom.query(pack["InfinibandLinkDowned"].expr.replace("> 0", ">= 0"))
            assert {node_of(s["metric"], pack["InfinibandLinkDowned"]) for s in downs} == {NODE}
            assert {target_of(s["metric"], pack["InfinibandLinkDowned"]) for s in downs} == {
                f"mlx5_{i}:1" for i in range(8)
            }


def bump(text: str, series: str, by: float) -> str:
    """The exposition ``text`` with the sample of the series starting with ``series`` raised by ``by``."""
    out = []
    for line in text.splitlines():
        if line.startswith(series):
            head, value = line.rsplit(" ", 1)
            line = f"{head} {float(value) + by:g}"
        out.append(line)
    return "\n".join(out) + "\n"


def test_counter_bursts_and_a_silent_exporter(
    pack: dict[str, Rule], prometheus_release: PrometheusRelease
) -> None:
    dcgm = (FIXTURES / "dcgm-exporter.prom").read_text()
    ib = (FIXTURES / "node-exporter-infiniband.prom").read_text()
    pages = Pages({"/dcgm/metrics": dcgm, "/ib/metrics": ib})
    with serve(pages) as address:
        # Both targets relabeled with `node`, as a ServiceMonitor with a node relabeling does.
        targets = [
            ScrapeTarget(address, "/dcgm/metrics", labels={"node": NODE}, job="dcgm-exporter"),
            ScrapeTarget(address, "/ib/metrics", labels={"node": NODE}, job="node-exporter"),
        ]
        with prometheus_release.server(targets) as prom:
            prom.wait_for_samples("DCGM_FI_DEV_GPU_TEMP")
            wait_for_counter_history(prom)

            # The counters move: GPU 5's NVLink CRC flit errors +500 and replays +50; mlx5_4 goes
            # down once more and takes 200 symbol errors.
            gpu5 = 'DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{gpu="5"'
            dcgm = bump(dcgm, gpu5, 500)
            dcgm = bump(dcgm, 'DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL{gpu="5"', 50)
            ib = bump(ib, 'node_infiniband_link_downed_total{device="mlx5_4"', 1)
            ib = bump(ib, 'node_infiniband_symbol_error_total{device="mlx5_4"', 200)
            pages.set("/dcgm/metrics", dcgm)
            pages.set("/ib/metrics", ib)
            prom.wait_for_samples('node_infiniband_link_downed_total{device="mlx5_4"} == 8')
            prom.wait_for_samples(gpu5 + "} == 2032")

            assert list(findings(prom, pack["NvlinkErrorBurst"])) == [(NODE, "5")]
            assert list(findings(prom, pack["InfinibandLinkDowned"])) == [(NODE, "mlx5_4:1")]
            # 200 symbol errors in the hour is over NVSentinel's 120/h, but well under 10/s.
            assert list(findings(prom, pack["InfinibandSymbolErrorsFatal"])) == [(NODE, "mlx5_4:1")]
            assert findings(prom, pack["InfinibandSymbolErrorRate"]) == {}
            assert findings(prom, pack["NvlinkRecoveryErrors"]) == {}  # that counter did not move
            # Xid 79 alone is sticky and GPU 3 is still hot: those keep firing on GPU 3 only.
            assert list(findings(prom, pack["GpuFatalXid"])) == [(NODE, "3")]

            # dcgm-exporter stops answering: its series go stale at once. That is missing data,
            # reported by the no_data rules for the node, and no fault rule sees anything.
            pages.set("/dcgm/metrics", None)
            wait_until(lambda: not prom.query("DCGM_FI_DEV_GPU_TEMP"), timeout=30, what="stale GPU series")
            silent = findings(prom, pack["DcgmExporterSilent"])
            assert list(silent) == [(NODE, None)]
            assert silent[(NODE, None)]["value"][1] == "8"  # GPUs last seen
            down = findings(prom, pack["ExporterTargetDown"])
            assert list(down) == [(NODE, None)]
            assert down[(NODE, None)]["metric"]["job"] == "dcgm-exporter"
            for name in ("GpuTooHot", "GpuHardwareSlowdown", "GpuFatalXid", "GpuMissing"):
                assert findings(prom, pack[name]) == {}, name
            assert findings(prom, pack["InfinibandExporterSilent"]) == {}
