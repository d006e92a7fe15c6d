"""The simulator's HTTP server: URL layout, content type, failures as a scraper sees them, the clock."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from healer_dev.simulator import Fleet, FleetConfig, ManualClock, SimulatorServer, parse_scenario

SCENARIO = """
faults:
  - {at: 100s, node: gpu-node-01, gpu: 2, fault: hot_gpu, target: 90}
  - {at: 100s, node: gpu-node-02, fault: exporter_down, exporter: dcgm}
  - {at: 100s, node: gpu-node-03, fault: exporter_down, mode: connection_close}
"""


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(0.0)


@pytest.fixture
def server(clock: ManualClock) -> Iterator[SimulatorServer]:
    fleet = Fleet(FleetConfig(nodes=4, seed=3), parse_scenario(SCENARIO))
    with SimulatorServer(fleet, clock=clock) as srv:
        yield srv


def test_serves_each_node_exporter_on_its_path(server: SimulatorServer) -> None:
    with httpx.Client(base_url=server.url, timeout=5) as client:
        dcgm = client.get("/nodes/gpu-node-01/dcgm/metrics")
        node = client.get("/nodes/gpu-node-01/node/metrics")
    assert dcgm.status_code == 200 and node.status_code == 200
    assert dcgm.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert 'Hostname="gpu-node-01"' in dcgm.text
    assert "node_infiniband_state_id" in node.text and "DCGM" not in node.text
    assert dcgm.text == server.fleet.render_dcgm("gpu-node-01", 0.0)


def test_the_injected_clock_decides_what_is_served(server: SimulatorServer, clock: ManualClock) -> None:
    with httpx.Client(base_url=server.url, timeout=5) as client:
        before = client.get("/nodes/gpu-node-01/dcgm/metrics").text
        clock.set(150.0)
        after = client.get("/nodes/gpu-node-01/dcgm/metrics").text
        status = client.get("/status").json()
    hot = [line for line in after.splitlines() if line.startswith('DCGM_FI_DEV_GPU_TEMP{gpu="2"')]
    assert hot[0].rsplit(" ", 1)[1] in {"89", "90", "91"}
    assert before != after
    assert status["elapsed_seconds"] == 150.0
    assert {(f["node"], f["fault"]) for f in status["active_faults"]} == {
        ("gpu-node-01", "hot_gpu"),
        ("gpu-node-02", "exporter_down"),
        ("gpu-node-03", "exporter_down"),
    }


def test_a_down_exporter_answers_503_or_drops_the_connection(
    server: SimulatorServer, clock: ManualClock
) -> None:
    clock.set(100.0)
    with httpx.Client(base_url=server.url, timeout=5) as client:
        assert client.get("/nodes/gpu-node-02/dcgm/metrics").status_code == 503
        assert client.get("/nodes/gpu-node-02/node/metrics").status_code == 200
    with httpx.Client(base_url=server.url, timeout=5) as client, pytest.raises(httpx.RemoteProtocolError):
        client.get("/nodes/gpu-node-03/node/metrics")


def test_unknown_nodes_and_paths_are_404(server: SimulatorServer) -> None:
    with httpx.Client(base_url=server.url, timeout=5) as client:
        assert client.get("/nodes/gpu-node-99/dcgm/metrics").status_code == 404
        assert client.get("/nodes/gpu-node-01/gpu/metrics").status_code == 404
        assert client.get("/metrics").status_code == 404
        assert client.get("/healthz").text == "ok\n"


def test_targets_is_http_sd_json_pointing_at_this_server(server: SimulatorServer, tmp_path: Path) -> None:
    body = httpx.get(f"{server.url}/targets", timeout=5).json()
    assert body == server.fleet.targets(server.address)
    assert {tuple(g["targets"]) for g in body} == {(f"127.0.0.1:{server.port}",)}
    path = server.write_file_sd(tmp_path / "sd" / "targets.json")
    assert json.loads(path.read_text()) == body


def test_many_keep_alive_scrapes_on_one_connection(server: SimulatorServer) -> None:
    with httpx.Client(base_url=server.url, timeout=5) as client:
        for _ in range(3):
            for node in server.fleet.node_names:
                for exporter in ("dcgm", "node"):
                    client.get(f"/nodes/{node}/{exporter}/metrics").raise_for_status()


def test_max_connections_bounds_serving_threads_and_queues_the_rest(clock: ManualClock) -> None:
    """``max_connections``: at most that many connections are served at once; the others wait in the
    listen queue and are answered when a slot frees (every scrape of 16 concurrent clients succeeds)."""
    from concurrent.futures import ThreadPoolExecutor

    fleet = Fleet(FleetConfig(nodes=4, seed=3))
    # Count scrapes being rendered at once, inside the handler: a thread that has answered and
    # released its slot may still be alive for a moment, so counting threads over-counts.
    lock = threading.Lock()
    serving = busiest = 0
    scrape_fleet = fleet.scrape

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal serving, busiest
        with lock:
            serving += 1
            busiest = max(busiest, serving)
        try:
            time.sleep(0.005)  # long enough for the others to pile up if nothing held them back
            return scrape_fleet(*args, **kwargs)
        finally:
            with lock:
                serving -= 1

    fleet.scrape = counted  # type: ignore[method-assign]
    with SimulatorServer(fleet, clock=clock, max_connections=2) as srv:

        def scrape(i: int) -> int:
            node = fleet.node_names[i % len(fleet.node_names)]
            # One connection per scrape, as VictoriaMetrics with disable_keepalive.
            r = httpx.get(f"{srv.url}/nodes/{node}/dcgm/metrics", headers={"Connection": "close"}, timeout=10)
            return r.status_code

        with ThreadPoolExecutor(max_workers=16) as pool:
            codes = list(pool.map(scrape, range(64)))
    assert codes == [200] * 64
    assert busiest == 2  # two at once (the limit), never more
