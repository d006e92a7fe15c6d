"""The simulator's sysfs tree, read by the real node_exporter (Debian's ``prometheus-node-exporter``),
gives the same InfiniBand series and values as the simulated node_exporter endpoint, faults included:
a port DOWN, an HCA gone, counters pinned at their sysfs width, a flapping management HCA."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from healer_dev.node_exporter import run_node_exporter
from healer_dev.simulator import Fleet, FleetConfig, parse_scenario
from healer_dev.simulator.sysfs import SysfsTree

NODE = "gpu-node-01"
FAULTS = [
    {
        "at": "10s",
        "hca": "mlx5_0",
        "fault": "ib_port_errors",
        "counter": "local_link_integrity_errors",
        "count": 40,
    },
    {"at": "10s", "hca": "mlx5_0", "fault": "ib_port_errors", "counter": "symbol_error", "count": 70000},
    {"at": "10s", "hca": "mlx5_3", "fault": "ib_port_errors", "counter": "link_downed", "count": 300},
    {"at": "10s", "hca": "mlx5_1", "fault": "ib_port_down"},
    {"at": "10s", "hca": "mlx5_2", "fault": "ib_hca_missing"},
    {"at": "10s", "hca": "mlx5_4", "fault": "ib_link_flap", "flaps": 3, "interval": "1s", "down_for": "1h"},
]

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def series(text: str) -> Series:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name.startswith("node_infiniband_")
    }


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Fleet, SysfsTree, str]]:
    scenario = parse_scenario(yaml.safe_dump({"faults": [{"node": NODE, **f} for f in FAULTS]}))
    fleet = Fleet(FleetConfig(nodes=2, hcas=4, management_hcas=1, seed=3, idle_fraction=0.0), scenario)
    tree = SysfsTree(fleet, NODE, tmp_path_factory.mktemp("sysfs") / NODE)
    tree.write(5.0)
    with run_node_exporter(tree.root) as address:
        yield fleet, tree, address


@pytest.mark.parametrize("t", [5.0, 400.0, 20.0])  # healthy, every fault on, an HCA back is not
def test_real_node_exporter_on_the_sysfs_tree_matches_the_simulated_endpoint(
    served: tuple[Fleet, SysfsTree, str], t: float
) -> None:
    fleet, tree, address = served
    tree.write(t)
    real = series(httpx.get(f"http://{address}/metrics", timeout=5).text)
    simulated = series(fleet.render_node(NODE, t))
    assert real == simulated


def test_faults_read_as_the_kernel_reports_them(served: tuple[Fleet, SysfsTree, str]) -> None:
    _, tree, address = served
    tree.write(400.0)
    real = series(httpx.get(f"http://{address}/metrics", timeout=5).text)

    def value(name: str, device: str) -> float:
        return real[(f"node_infiniband_{name}", (("device", device), ("port", "1")))]

    assert value("local_link_integrity_errors_total", "mlx5_0") == 15  # 4-bit counter pinned
    assert value("symbol_error_total", "mlx5_0") == 65535  # 16-bit
    assert value("link_downed_total", "mlx5_3") == 255  # 8-bit
    assert value("state_id", "mlx5_1") == 1  # DOWN
    assert value("physical_state_id", "mlx5_1") == 3  # Disabled
    assert not [k for k in real if ("device", "mlx5_2") in k[1]]  # the HCA is gone
    assert value("state_id", "mlx5_4") == 1 and value("link_downed_total", "mlx5_4") == 3  # management
    info = {dict(k[1])["device"]: dict(k[1])["hca_type"] for k in real if k[0] == "node_infiniband_info"}
    assert info == {"mlx5_0": "MT4129", "mlx5_1": "MT4129", "mlx5_3": "MT4129", "mlx5_4": "MT4125"}


def test_one_real_node_exporter_per_node_follows_the_clock(tmp_path_factory: pytest.TempPathFactory) -> None:
    from healer_dev.simulator import ManualClock
    from healer_dev.simulator.sysfs import real_node_exporters

    scenario = parse_scenario(yaml.safe_dump({"faults": [{"node": NODE, **f} for f in FAULTS]}))
    fleet = Fleet(FleetConfig(nodes=3, hcas=4, management_hcas=1, seed=3, idle_fraction=0.0), scenario)
    clock = ManualClock(5.0)
    with real_node_exporters(fleet, clock, tmp_path_factory.mktemp("fleet"), interval=0.2) as addresses:
        assert set(addresses) == set(fleet.node_names)
        clock.set(400.0)

        def caught_up() -> bool:
            return all(
                series(httpx.get(f"http://{a}/metrics", timeout=5).text)
                == series(fleet.render_node(n, 400.0))
                for n, a in addresses.items()
            )

        from healer_dev.prometheus import wait_until

        wait_until(caught_up, timeout=20, what="every node_exporter at t=400")
