"""Blind spots on a real Prometheus scraping dcgm-exporter expositions and the real node_exporter
reading a generated sysfs: a node missing an input its peers export is shown as blind, never as
healthy (``healer doctor exporters --node`` and :func:`healer.blind_spots.observe_blind_spots`).

The fleet:

- ``gpu-a``: a 4.x dcgm-exporter with the fields the pack reads, two GPUs; scraped twice (two
  exporters on one node) and with per-pod series on GPU 1 (a GPU shared by two pods): copies,
  never a blind spot;
- ``gpu-vgpu``: a vGPU guest: the same fields but no ``DCGM_FI_DEV_GPU_TEMP`` (the hypervisor
  keeps the sensor);
- ``gpu-renamed``: exports the temperature at first, then its exporter changes the name (a new
  exporter line with another field name): blind from then on;
- ``ib-node``: node_exporter with two HCAs; one counter file of ``mlx5_0`` cannot be read (a
  directory where the file should be), which node_exporter drops without an error (checked here).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from healer.blind_spots import observe_blind_spots
from healer.model.addresses import build_address_book
from healer.model.blind_spots import BlindReport
from healer.ruleset.device_filter import DeviceFilter
from healer.ruleset.loading import load_ruleset
from healer.sources.prometheus import PrometheusSource
from healer_dev.prometheus import wait_until
from tests.integration.test_exporter_inputs_prometheus import doctor
from tests.node_exporter import node_exporter
from tests.services import PrometheusServer, ScrapeTarget, prometheus_server, text_exporter

pytestmark = pytest.mark.prometheus

REPO = Path(__file__).resolve().parents[2]
PACK = load_ruleset([REPO / "rules"])
FIELDS = (
    ("DCGM_FI_DEV_GPU_TEMP", 45),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", 0),
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", 0),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 0),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 0),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.9),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.4),
)
renamed = {"done": False}


def dcgm(host: str, *, without: tuple[str, ...] = (), pods: bool = False) -> str:
    """A 4.x dcgm-exporter exposition of two GPUs (labels as exporter 4.x writes them)."""
    labels = (
        'DCGM_FI_DRIVER_VERSION="570.133.20",Hostname="{host}",UUID="GPU-{host}-{i}",device="nvidia{i}",'
        'gpu="{i}",modelName="NVIDIA H100 80GB HBM3",pci_bus_id="00000000:1{i}:00.0"'
    )
    out = []
    for name, value in FIELDS:
        if name in without:
            continue
        if name == "DCGM_FI_DEV_GPU_TEMP" and host == "gpu-renamed" and renamed["done"]:
            name = "DCGM_FI_DEV_GPU_TEMPERATURE"
        out.append(f"# TYPE {name} gauge")
        for i in range(2):
            base = labels.format(host=host, i=i)
            if pods and i == 1:  # a GPU shared by two pods: one series per pod
                out += [f'{name}{{{base},namespace="ml",pod="train-{p}"}} {value}' for p in "ab"]
            else:
                out.append(f"{name}{{{base}}} {value}")
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def prom() -> Iterator[PrometheusServer]:
    with (
        text_exporter(lambda: dcgm("gpu-a", pods=True)) as a1,
        text_exporter(lambda: dcgm("gpu-a")) as a2,
        text_exporter(lambda: dcgm("gpu-vgpu", without=("DCGM_FI_DEV_GPU_TEMP",))) as vgpu,
        text_exporter(lambda: dcgm("gpu-renamed")) as ren,
        node_exporter() as ib,
    ):
        ib.sysfs.add_hca("mlx5_0")
        ib.sysfs.add_hca("mlx5_1")
        counter = ib.sysfs.root / "class/infiniband/mlx5_0/ports/1/counters/link_downed"
        counter.unlink()
        counter.mkdir()  # read(2) fails with EISDIR: node_exporter cannot read the counter
        targets = [
            ScrapeTarget(a1, job="dcgm-exporter"),
            ScrapeTarget(a2, job="dcgm-exporter-2"),
            ScrapeTarget(vgpu, job="dcgm-exporter"),
            ScrapeTarget(ren, job="dcgm-exporter"),
            ScrapeTarget(ib.address, labels={"node": "ib-node"}, job="node-exporter"),
        ]
        with prometheus_server(targets) as server:
            server.wait_for_samples('node_infiniband_link_downed_total{device="mlx5_1"}')
            server.wait_for_samples('DCGM_FI_DEV_GPU_TEMP{Hostname="gpu-renamed"}')
            server.wait_for_samples('DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{Hostname="gpu-vgpu"}')
            yield server


def observe(prom: PrometheusServer) -> BlindReport:
    book = build_address_book(
        nodes=[(n, []) for n in ("gpu-a", "gpu-vgpu", "gpu-renamed", "ib-node")], pods=[]
    )
    return observe_blind_spots(
        ruleset=PACK, source=PrometheusSource(prom.url), now=datetime.now(UTC), book=book
    )


def test_node_exporter_drops_an_unreadable_counter_without_an_error(prom: PrometheusServer) -> None:
    ports = {s["metric"]["device"] for s in prom.query("node_infiniband_link_downed_total")}
    assert ports == {"mlx5_1"}
    assert {s["metric"]["device"] for s in prom.query("node_infiniband_symbol_error_total")} == {
        "mlx5_0",
        "mlx5_1",
    }
    (success,) = prom.query('node_scrape_collector_success{collector="infiniband"}')
    assert success["value"][1] == "1"


def test_each_missing_input_is_a_blind_spot_of_the_rules_that_need_it(prom: PrometheusServer) -> None:
    report = observe(prom)
    assert report.errors == ()
    by_node = {node: {(s.rule, s.scope) for s in spots} for node, spots in report.by_node().items()}
    # Copies (two exporters, per-pod series) are no gap; the vGPU guest is blind on both GPUs.
    assert set(by_node) == {"gpu-vgpu", "ib-node"}
    assert {("GpuTooHot", "gpu 0"), ("GpuTooHot", "gpu 1"), ("GpuMissing", "gpu 0")} <= by_node["gpu-vgpu"]
    assert not any(rule.startswith("Infiniband") for rule, _ in by_node["gpu-vgpu"])
    # Only the rule reading the unreadable counter, only on its port.
    assert by_node["ib-node"] == {("InfinibandLinkDowned", "mlx5_0 port 1")}
    (spot,) = report.for_node("ib-node")
    assert spot.missing == ("node_infiniband_link_downed_total",)

    renamed["done"] = True  # the exporter on gpu-renamed now writes another name
    prom.wait_for_samples('DCGM_FI_DEV_GPU_TEMPERATURE{Hostname="gpu-renamed"}')
    wait_until(
        lambda: not prom.query('DCGM_FI_DEV_GPU_TEMP{Hostname="gpu-renamed"}'), timeout=30, what="stale"
    )
    after = observe(prom)
    assert ("GpuTooHot", "gpu 0") in {(s.rule, s.scope) for s in after.for_node("gpu-renamed")}


def test_doctor_reports_per_node(prom: PrometheusServer) -> None:
    done = doctor(prom, "--node", "gpu-vgpu", "-o", "json")
    assert done.returncode == 3, done.stderr
    out = json.loads(done.stdout)
    assert out["node"] == "gpu-vgpu"
    spots = {(s["rule"], s["scope"]) for s in out["blind_spots"]}
    assert ("GpuTooHot", "gpu 1") in spots
    assert {s["node"] for s in out["blind_spots"]} == {"gpu-vgpu"}

    table = doctor(prom, "--node", "gpu-vgpu")
    line = next(x for x in table.stdout.splitlines() if x.startswith("gpu-vgpu") and "GpuTooHot" in x)
    assert line.split()[1:5] == ["GpuTooHot", "gpu", "0", "DCGM_FI_DEV_GPU_TEMP"]
    assert "blind spot(s) on 1 node(s)" in table.stdout

    clear = doctor(prom, "--node", "gpu-a")
    assert "no blind spot on gpu-a" in clear.stdout
    # Without a cluster the node names are the labels' (said once, on stderr).
    assert "not checked against the cluster" in clear.stderr


def test_ports_the_device_filter_leaves_out_are_not_judged(prom: PrometheusServer) -> None:
    """With mlx5_0 excluded by the InfiniBand device filter (a management HCA), its unreadable
    counter is nobody's blind spot: the rules do not read that port."""
    filtered = load_ruleset([REPO / "rules"], device_filter=DeviceFilter(exclude="mlx5_0"))
    book = build_address_book(nodes=[("ib-node", [])], pods=[])
    report = observe_blind_spots(
        ruleset=filtered, source=PrometheusSource(prom.url), now=datetime.now(UTC), book=book
    )
    assert report.for_node("ib-node") == []
    assert observe(prom).for_node("ib-node")  # unfiltered, the port is blind (the test above)
