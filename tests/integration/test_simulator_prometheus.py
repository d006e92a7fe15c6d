"""A real Prometheus discovers the simulated fleet through file_sd and scrapes it every second.

The simulator runs on a :class:`ManualClock`, so the test moves scenario time forward when it wants a
fault to start, then polls Prometheus until the effect is visible (never a blind sleep).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from healer_dev.simulator import Fleet, FleetConfig, LabelStyle, ManualClock, SimulatorServer, parse_scenario
from tests.service_skips import require_binary
from tests.services import PrometheusServer, free_port, prometheus_server, wait_until

pytestmark = pytest.mark.prometheus

SCENARIO = """
faults:
  - {at: 100s, node: gpu-node-02, gpu: 5, fault: hot_gpu, target: 88}
  - {at: 100s, node: gpu-node-03, fault: exporter_down}
"""


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(0.0)


@pytest.fixture
def fleet_and_prometheus(
    clock: ManualClock, tmp_path: Path
) -> Iterator[tuple[Fleet, SimulatorServer, PrometheusServer]]:
    fleet = Fleet(FleetConfig(nodes=4, seed=1, idle_fraction=0.0), parse_scenario(SCENARIO))
    with SimulatorServer(fleet, clock=clock) as sim:
        sd = sim.write_file_sd(tmp_path / "targets.json")
        with prometheus_server([], file_sd=[sd]) as prom:
            prom.wait_for_targets_up(8)
            yield fleet, sim, prom


def _hostnames(result: list[dict[str, object]]) -> set[str]:
    return {r["metric"]["Hostname"] for r in result}  # type: ignore[index]


def test_prometheus_sees_the_hot_gpu_on_the_right_node_and_gpu(
    fleet_and_prometheus: tuple[Fleet, SimulatorServer, PrometheusServer], clock: ManualClock
) -> None:
    fleet, _, prom = fleet_and_prometheus
    assert prom.query("DCGM_FI_DEV_GPU_TEMP > 80") == []
    assert len(prom.query("DCGM_FI_DEV_GPU_TEMP")) == 32

    clock.set(120.0)
    hot = wait_until(lambda: prom.query("DCGM_FI_DEV_GPU_TEMP > 80"), timeout=30, what="a hot GPU")
    assert len(hot) == 1
    labels = hot[0]["metric"]
    assert (labels["Hostname"], labels["gpu"]) == ("gpu-node-02", "5")
    assert labels["UUID"] == fleet.gpu_uuid("gpu-node-02", 5)
    assert labels["pod"] == fleet.workload_pod("gpu-node-02")
    assert labels["job"] == "dcgm-exporter"
    assert 87 <= float(hot[0]["value"][1]) <= 89


def test_a_down_exporters_series_vanish_and_its_targets_are_down(
    fleet_and_prometheus: tuple[Fleet, SimulatorServer, PrometheusServer], clock: ManualClock
) -> None:
    _, _, prom = fleet_and_prometheus
    assert "gpu-node-03" in _hostnames(prom.query("DCGM_FI_DEV_GPU_TEMP"))
    assert len(prom.query('node_infiniband_state_id{node="gpu-node-03"}')) == 8

    clock.set(120.0)

    def gone() -> bool:
        return not prom.query('DCGM_FI_DEV_GPU_TEMP{Hostname="gpu-node-03"}') and not prom.query(
            'node_infiniband_state_id{node="gpu-node-03"}'
        )

    wait_until(gone, timeout=30, what="gpu-node-03's series to vanish")
    down = wait_until(lambda: prom.query("up == 0"), timeout=30, what="targets down")
    assert {(r["metric"]["job"], r["metric"].get("node", "")) for r in down} >= {
        ("node-exporter", "gpu-node-03")
    }
    assert len(down) == 2  # gpu-node-03's two exporters, nothing else
    assert _hostnames(prom.query("DCGM_FI_DEV_GPU_TEMP")) == {"gpu-node-00", "gpu-node-01", "gpu-node-02"}
    assert len(prom.query("node_infiniband_state_id")) == 24


@pytest.mark.parametrize("style", [LabelStyle.HOSTNAME_LOWER, LabelStyle.NODE, LabelStyle.EXPORTED])
def test_label_styles_as_prometheus_stores_them(style: LabelStyle, tmp_path: Path) -> None:
    fleet = Fleet(FleetConfig(nodes=2, seed=2, label_style=style, idle_fraction=0.0))
    with SimulatorServer(fleet, clock=ManualClock(10.0)) as sim:
        sd = sim.write_file_sd(tmp_path / "targets.json")
        with prometheus_server([], file_sd=[sd]) as prom:
            prom.wait_for_targets_up(4)
            temps = prom.wait_for_samples('DCGM_FI_DEV_GPU_TEMP{gpu="0"}')
            ib = prom.query('node_infiniband_state_id{device="mlx5_0"}')
    by_node: dict[str, dict[str, str]] = {}
    for r in temps:
        m = r["metric"]
        key = {
            LabelStyle.HOSTNAME_LOWER: "hostname",
            LabelStyle.NODE: "node",
            LabelStyle.EXPORTED: "Hostname",
        }[style]
        by_node[m[key]] = m
    assert set(by_node) == {"gpu-node-00", "gpu-node-01"}
    m = by_node["gpu-node-01"]
    if style is LabelStyle.NODE:
        assert m["Hostname"] == fleet.exporter_pod("gpu-node-01", "dcgm")  # the exporter pod, not the node
    if style is LabelStyle.EXPORTED:
        # honor_labels: false renames the workload's labels; pod/namespace name the exporter
        assert m["exported_pod"] == fleet.workload_pod("gpu-node-01")
        assert m["exported_namespace"] == "ml"
        assert m["exported_container"] == "trainer"
        assert m["pod"] == fleet.exporter_pod("gpu-node-01", "dcgm")
        assert m["namespace"] == "gpu-operator"
    else:
        assert m["pod"] == fleet.workload_pod("gpu-node-01")
    assert {r["metric"]["node"] for r in ib} == {"gpu-node-00", "gpu-node-01"}


def test_healer_simulate_serves_the_demo_and_writes_file_sd_that_promtool_accepts(tmp_path: Path) -> None:
    port = free_port()
    sd = tmp_path / "sd" / "targets.json"
    cmd = [sys.executable, "-c", "from healer.cli import app; app()", "simulate"]
    cmd += ["--nodes", "64", "--port", str(port), "--scenario", "demo", "--file-sd", str(sd)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        # Start-up only (imports, 64 nodes' templates); a loaded machine running tests in parallel
        # has been seen to need over 30 s.
        wait_until(
            lambda: httpx.get(f"{url}/healthz", timeout=1).status_code == 200,
            timeout=90,
            what="healer simulate",
        )
        text = httpx.get(f"{url}/nodes/gpu-node-07/dcgm/metrics", timeout=5).text
        assert text.count("DCGM_FI_DEV_GPU_TEMP{") == 8
        assert httpx.get(f"{url}/status", timeout=5).json()["scenario"] == "demo"
        groups = httpx.get(f"{url}/targets", timeout=5).json()
        assert len(groups) == 128
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=10)
    assert proc.returncode in (0, -15), err
    assert "simulating 64 nodes" in out.decode()

    promtool = require_binary("promtool", package="prometheus")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump({"scrape_configs": [{"job_name": "fleet", "file_sd_configs": [{"files": [str(sd)]}]}]})
    )
    check = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS" in check.stdout + check.stderr
