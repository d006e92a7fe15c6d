"""Each fault kind changes exactly the series it should, from the time it should, and nothing else.

Method: render the same fleet (same seed) with and without the fault and diff the parsed scrapes.
"""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from healer_dev.simulator import Fleet, FleetConfig, parse_scenario

NODE = "gpu-node-02"
SEED = 4

Key = tuple[str, tuple[tuple[str, str], ...]]


def scrape(fleet: Fleet, exporter: str, t: float, node: str = NODE) -> dict[Key, float]:
    """(family, labels) → value of one scrape; raises if the endpoint fails."""
    result = fleet.scrape(node, exporter, t)  # type: ignore[arg-type]
    assert result.ok, f"{exporter} on {node} failed at t={t}: {result.failure}"
    return {
        (f.name, tuple(s.labels.items())): s.value
        for f in text_string_to_metric_families(result.body)
        for s in f.samples
    }


def with_faults(*faults: dict[str, Any]) -> Fleet:
    import yaml

    scenario = parse_scenario(yaml.safe_dump({"faults": [{"node": NODE, **f} for f in faults]}))
    return Fleet(FleetConfig(nodes=4, seed=SEED, idle_fraction=0.0), scenario)


HEALTHY = Fleet(FleetConfig(nodes=4, seed=SEED, idle_fraction=0.0))


def diff(fleet: Fleet, exporter: str, t: float) -> dict[Key, tuple[float | None, float | None]]:
    """Series whose value differs from the healthy fleet's at ``t``: key → (healthy, faulty)."""
    healthy, faulty = scrape(HEALTHY, exporter, t), scrape(fleet, exporter, t)
    return {
        k: (healthy.get(k), faulty.get(k))
        for k in healthy.keys() | faulty.keys()
        if healthy.get(k) != faulty.get(k)
    }


def changed(d: dict[Key, Any]) -> set[tuple[str, str]]:
    """(family, gpu or device) of each differing series."""
    return {(name, dict(labels).get("gpu") or dict(labels).get("device", "")) for name, labels in d}


def value(fleet: Fleet, exporter: str, t: float, family: str, **labels: str) -> float:
    found = [
        v
        for (name, lbls), v in scrape(fleet, exporter, t).items()
        if name == family and labels.items() <= dict(lbls).items()
    ]
    assert len(found) == 1, (family, labels, found)
    return found[0]


def test_hot_gpu_ramps_the_temperature_to_the_target_then_clears() -> None:
    fleet = with_faults(
        {"at": "100s", "gpu": 3, "fault": "hot_gpu", "target": 85, "ramp": "1m", "duration": "5m"}
    )
    assert diff(fleet, "dcgm", 99.0) == {}
    halfway = value(fleet, "dcgm", 130.0, "DCGM_FI_DEV_GPU_TEMP", gpu="3")
    assert 70 <= halfway <= 80
    for t in (160.0, 200.0, 399.0):
        assert 84 <= value(fleet, "dcgm", t, "DCGM_FI_DEV_GPU_TEMP", gpu="3") <= 86
        assert changed(diff(fleet, "dcgm", t)) == {
            ("DCGM_FI_DEV_GPU_TEMP", "3"),
            ("DCGM_FI_DEV_MEMORY_TEMP", "3"),
        }
    assert value(fleet, "dcgm", 200.0, "DCGM_FI_DEV_MEMORY_TEMP", gpu="3") > 88
    assert diff(fleet, "dcgm", 400.0) == {}
    assert diff(fleet, "node", 200.0) == {}


def test_thermal_slowdown_sets_the_clock_event_bits_and_slows_the_clock() -> None:
    fleet = with_faults({"at": "10s", "gpu": 1, "fault": "thermal_slowdown", "duration": "1m"})
    assert diff(fleet, "dcgm", 9.0) == {}
    d = diff(fleet, "dcgm", 30.0)
    assert changed(d) == {
        ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "1"),
        ("DCGM_FI_DEV_SM_CLOCK", "1"),
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "1"),
        ("DCGM_FI_DEV_POWER_USAGE", "1"),
    }
    # hw_slowdown | hw_thermal on top of the SW power cap every busy GPU reports.
    assert value(fleet, "dcgm", 30.0, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", gpu="1") == 0x48 | 0x4
    assert value(fleet, "dcgm", 30.0, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", gpu="0") == 0x4
    assert value(fleet, "dcgm", 30.0, "DCGM_FI_DEV_SM_CLOCK", gpu="1") == 1155
    assert value(fleet, "dcgm", 30.0, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", gpu="1") < 0.3
    assert diff(fleet, "dcgm", 70.0) == {}


def test_silent_throttle_drops_tensor_activity_only() -> None:
    fleet = with_faults(
        {"at": "1m", "gpu": 6, "fault": "silent_throttle", "tensor_active": 0.12, "ramp": "30s"}
    )
    assert diff(fleet, "dcgm", 59.0) == {}
    for t in (95.0, 500.0):
        assert changed(diff(fleet, "dcgm", t)) == {("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "6")}
        assert 0.1 <= value(fleet, "dcgm", t, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", gpu="6") <= 0.14
        assert value(fleet, "dcgm", t, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", gpu="6") > 0.95
        # No clock event beyond the SW power cap of every busy GPU.
        assert value(fleet, "dcgm", t, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", gpu="6") == 0x4
    midway = value(fleet, "dcgm", 75.0, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", gpu="6")
    assert 0.2 < midway < 0.33


def test_xid_gauge_is_sticky_and_shows_the_last_xid() -> None:
    fleet = with_faults(
        {"at": "100s", "gpu": 5, "fault": "xid", "code": 79},
        {"at": "150s", "gpu": 5, "fault": "xid", "code": 45},
    )
    assert diff(fleet, "dcgm", 99.0) == {}
    d = diff(fleet, "dcgm", 100.0)
    assert changed(d) == {("DCGM_FI_DEV_XID_ERRORS", "5"), ("DCGM_EXP_XID_ERRORS_COUNT", "5")}
    after = {dict(k[1])["err_code"]: v for k, v in d.items() if k[0] == "DCGM_FI_DEV_XID_ERRORS"}
    assert after == {"0": (0.0, None), "79": (None, 79.0)}  # one series replaced by another
    assert (
        value(fleet, "dcgm", 149.0, "DCGM_FI_DEV_XID_ERRORS", gpu="5", err_msg="GPU has fallen off the bus")
        == 79
    )
    # a later Xid 45 overwrites the gauge: the 79 is no longer visible in this metric
    for t in (150.0, 10_000.0):
        assert "79" not in {dict(k[1]).get("err_code") for k in scrape(fleet, "dcgm", t)}
        assert value(fleet, "dcgm", t, "DCGM_FI_DEV_XID_ERRORS", gpu="5") == 45
        assert value(fleet, "dcgm", t, "DCGM_FI_DEV_XID_ERRORS", gpu="5", err_code="45") == 45


def test_row_remap_failure_sets_the_flag_and_counts_rows() -> None:
    fleet = with_faults({"at": "20s", "gpu": 0, "fault": "row_remap_failure", "uncorrectable_rows": 8})
    assert diff(fleet, "dcgm", 19.0) == {}
    assert changed(diff(fleet, "dcgm", 20.0)) == {
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "0"),
        ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "0"),
    }
    assert value(fleet, "dcgm", 500.0, "DCGM_FI_DEV_ROW_REMAP_FAILURE", gpu="0") == 1
    assert value(fleet, "dcgm", 500.0, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", gpu="0") == 8


def test_nvlink_burst_raises_the_error_counters_over_the_burst() -> None:
    fleet = with_faults(
        {
            "at": "1m",
            "gpu": 2,
            "fault": "nvlink_errors",
            "crc_flit": 1000,
            "crc_data": 100,
            "replay": 50,
            "duration": "20s",
        }
    )
    flit = "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"
    assert diff(fleet, "dcgm", 60.0) == {}
    assert value(fleet, "dcgm", 70.0, flit, gpu="2") == 500
    seen = [value(fleet, "dcgm", float(t), flit, gpu="2") for t in range(55, 100)]
    assert seen == sorted(seen)  # a counter never goes down
    assert changed(diff(fleet, "dcgm", 300.0)) == {
        (flit, "2"),
        ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "2"),
        ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "2"),
    }
    assert value(fleet, "dcgm", 300.0, flit, gpu="2") == 1000
    assert value(fleet, "dcgm", 300.0, "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", gpu="2") == 50


def test_nvlink5_errors_move_the_blackwell_counters_which_only_an_nvlink5_fleet_reports() -> None:
    import yaml

    fault = {"node": NODE, "at": "1m", "gpu": 1, "fault": "nvlink5_errors", "duration": "20s"}
    fault |= {"link_recovery": 2, "link_recovery_failed": 1, "effective_errors": 40, "symbol_errors": 900}
    config = FleetConfig(nodes=4, seed=SEED, idle_fraction=0.0, exporter_version="4.x", nvlink5=True)
    fleet = Fleet(config, parse_scenario(yaml.safe_dump({"faults": [fault]})))
    quiet = Fleet(config)
    nv5 = "DCGM_FI_DEV_NVLINK_COUNT_"
    before, after = scrape(fleet, "dcgm", 59.0), scrape(fleet, "dcgm", 300.0)
    assert before == scrape(quiet, "dcgm", 59.0)
    assert {k: v for k, v in after.items() if v != scrape(quiet, "dcgm", 300.0).get(k)} == {
        (name, labels): value
        for (name, labels), value in after.items()
        if dict(labels)["gpu"] == "1"
        and name
        in {
            nv5 + "LINK_RECOVERY_SUCCESSFUL_EVENTS",
            nv5 + "LINK_RECOVERY_FAILED_EVENTS",
            nv5 + "LINK_RECOVERY_EVENTS",
            nv5 + "EFFECTIVE_ERRORS",
            nv5 + "RX_SYMBOL_ERRORS",
        }
    }
    assert value(fleet, "dcgm", 300.0, nv5 + "LINK_RECOVERY_EVENTS", gpu="1") == 3  # both kinds
    assert value(fleet, "dcgm", 300.0, nv5 + "EFFECTIVE_ERRORS", gpu="1") == 40
    assert value(fleet, "dcgm", 300.0, nv5 + "RX_ERRORS", gpu="1") == 0
    # A fleet without NVLink5 (Hopper) reports none of them, fault or not.
    hopper = Fleet(FleetConfig(nodes=4, seed=SEED, idle_fraction=0.0, exporter_version="4.x"))
    assert not any(name.startswith(nv5) for name, _ in scrape(hopper, "dcgm", 300.0))
    with pytest.raises(ValueError, match=r"needs a 4\.x exporter"):
        FleetConfig(exporter_version="3.x", nvlink5=True)


def test_ib_link_flap_counts_link_downs_and_flips_the_port_state() -> None:
    fleet = with_faults(
        {
            "at": "100s",
            "hca": "mlx5_4",
            "fault": "ib_link_flap",
            "flaps": 2,
            "interval": "30s",
            "down_for": "5s",
        }
    )
    downed, state, phys = (
        "node_infiniband_link_downed",
        "node_infiniband_state_id",
        "node_infiniband_physical_state_id",
    )
    assert diff(fleet, "node", 99.0) == {}
    expected = [  # t, link_downed_total, state, physical state
        (101.0, 1, 1, 2),
        (106.0, 1, 4, 5),
        (131.0, 2, 1, 2),
        (136.0, 2, 4, 5),
        (500.0, 2, 4, 5),
    ]
    for t, downs, st, ph in expected:
        assert value(fleet, "node", t, downed, device="mlx5_4") == downs, t
        assert value(fleet, "node", t, state, device="mlx5_4") == st, t
        assert value(fleet, "node", t, phys, device="mlx5_4") == ph, t
        assert {dev for _, dev in changed(diff(fleet, "node", t))} == {"mlx5_4"}
    assert changed(diff(fleet, "node", 101.0)) == {
        (downed, "mlx5_4"),
        (state, "mlx5_4"),
        (phys, "mlx5_4"),
        ("node_infiniband_symbol_error", "mlx5_4"),
    }
    assert diff(fleet, "dcgm", 101.0) == {}


def test_ib_symbol_error_burst() -> None:
    fleet = with_faults(
        {"at": "10s", "hca": "mlx5_1", "fault": "ib_symbol_errors", "count": 6000, "duration": "1m"}
    )
    assert diff(fleet, "node", 10.0) == {}
    assert value(fleet, "node", 40.0, "node_infiniband_symbol_error", device="mlx5_1") == 3000
    assert value(fleet, "node", 100.0, "node_infiniband_symbol_error", device="mlx5_1") == 6000
    assert changed(diff(fleet, "node", 100.0)) == {("node_infiniband_symbol_error", "mlx5_1")}


def test_gpu_missing_removes_every_series_of_that_gpu_for_the_duration() -> None:
    fleet = with_faults({"at": "30s", "gpu": 3, "fault": "gpu_missing", "duration": "1m"})
    assert diff(fleet, "dcgm", 29.0) == {}
    d = diff(fleet, "dcgm", 30.0)
    assert {dict(labels)["gpu"] for _, labels in d} == {"3"}
    assert all(faulty is None for _, faulty in d.values())
    assert len(d) == len([k for k in scrape(HEALTHY, "dcgm", 30.0) if dict(k[1])["gpu"] == "3"])
    assert diff(fleet, "dcgm", 90.0) == {}


@pytest.mark.parametrize(
    ("fault", "dcgm_failure", "node_failure"),
    [
        ({}, "http_503", "http_503"),
        ({"exporter": "dcgm"}, "http_503", None),
        ({"exporter": "node", "mode": "connection_close"}, None, "connection_close"),
    ],
)
def test_exporter_down_fails_its_endpoints(
    fault: dict[str, str], dcgm_failure: str, node_failure: str
) -> None:
    fleet = with_faults({"at": "1m", "fault": "exporter_down", "duration": "2m", **fault})
    assert fleet.scrape(NODE, "dcgm", 59.0).ok and fleet.scrape(NODE, "node", 59.0).ok
    assert fleet.scrape(NODE, "dcgm", 60.0).failure == dcgm_failure
    assert fleet.scrape(NODE, "node", 179.0).failure == node_failure
    assert fleet.scrape(NODE, "dcgm", 180.0).ok and fleet.scrape(NODE, "node", 180.0).ok
    assert fleet.scrape("gpu-node-01", "dcgm", 100.0).ok


def test_exporter_restart_resets_counters_and_the_sticky_xid() -> None:
    fleet = with_faults(
        {"at": "50s", "gpu": 4, "fault": "xid", "code": 79},
        {"at": "1m", "gpu": 4, "fault": "nvlink_errors", "crc_flit": 100, "duration": "1s"},
        {"at": "100s", "fault": "exporter_restart", "duration": "10s"},
    )
    flit = "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"
    energy = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
    assert value(fleet, "dcgm", 99.0, flit, gpu="4") == 100
    assert fleet.scrape(NODE, "dcgm", 105.0).failure == "http_503"
    assert fleet.scrape(NODE, "node", 105.0).failure == "http_503"
    after = scrape(fleet, "dcgm", 110.0)
    assert value(fleet, "dcgm", 110.0, flit, gpu="4") == 0
    assert value(fleet, "dcgm", 110.0, "DCGM_FI_DEV_XID_ERRORS", gpu="4", err_code="0") == 0
    # energy counts again from 0: ~10 s at ~650 W = ~6.5e6 mJ
    assert 5e6 < value(fleet, "dcgm", 110.0, energy, gpu="0") < 8e6
    assert value(fleet, "dcgm", 99.0, energy, gpu="0") > 1e11
    # gauges are untouched
    healthy = scrape(HEALTHY, "dcgm", 110.0)
    temps = [k for k in healthy if k[0] == "DCGM_FI_DEV_GPU_TEMP"]
    assert all(after[k] == healthy[k] for k in temps)
    rx = "node_infiniband_port_data_received_bytes"
    assert value(fleet, "node", 110.0, rx, device="mlx5_0") < value(
        HEALTHY, "node", 110.0, rx, device="mlx5_0"
    )


def test_faults_on_one_node_leave_the_others_alone() -> None:
    fleet = with_faults(
        {"at": "0s", "gpu": 3, "fault": "hot_gpu"},
        {"at": "0s", "gpu": 3, "fault": "gpu_missing"},
        {"at": "0s", "hca": "mlx5_0", "fault": "ib_link_flap"},
    )
    for node in ("gpu-node-00", "gpu-node-01", "gpu-node-03"):
        assert fleet.render_dcgm(node, 10.0) == HEALTHY.render_dcgm(node, 10.0)
        assert fleet.render_node(node, 10.0) == HEALTHY.render_node(node, 10.0)


def test_xid_count_sees_a_fatal_xid_that_a_later_xid_45_hides_from_the_gauge() -> None:
    fleet = with_faults(
        {"at": "100s", "gpu": 5, "fault": "xid", "code": 79},
        {"at": "150s", "gpu": 5, "fault": "xid", "code": 45},
        {"at": "160s", "gpu": 5, "fault": "xid", "code": 45},
    )
    count = "DCGM_EXP_XID_ERRORS_COUNT"
    assert not [k for k in scrape(fleet, "dcgm", 99.0) if k[0] == count]
    series = {dict(k[1])["xid"]: v for k, v in scrape(fleet, "dcgm", 200.0).items() if k[0] == count}
    assert series == {"79": 1, "45": 2}
    labels = next(k[1] for k in scrape(fleet, "dcgm", 200.0) if k[0] == count)
    names = [name for name, _ in labels]
    assert names[6:] == [
        "DCGM_FI_DRIVER_VERSION",
        "window_size_in_ms",
        "xid",
        "container",
        "namespace",
        "pod",
    ]
    assert dict(labels)["window_size_in_ms"] == "300000"
    # the trailing window is 5 minutes: the 79 leaves it first
    assert {dict(k[1])["xid"] for k in scrape(fleet, "dcgm", 400.0) if k[0] == count} == {"45"}
    assert not [k for k in scrape(fleet, "dcgm", 460.0) if k[0] == count]


def test_row_remap_pending_sets_the_flag_until_its_duration_ends() -> None:
    fleet = with_faults({"at": "20s", "gpu": 1, "fault": "row_remap_pending", "duration": "1m"})
    assert diff(fleet, "dcgm", 19.0) == {}
    assert changed(diff(fleet, "dcgm", 20.0)) == {
        ("DCGM_FI_DEV_ROW_REMAP_PENDING", "1"),
        ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "1"),
    }
    assert value(fleet, "dcgm", 79.0, "DCGM_FI_DEV_ROW_REMAP_PENDING", gpu="1") == 1
    assert value(fleet, "dcgm", 80.0, "DCGM_FI_DEV_ROW_REMAP_PENDING", gpu="1") == 0
    assert value(fleet, "dcgm", 80.0, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", gpu="1") == 1  # counted


def test_double_bit_ecc_errors_grow_the_volatile_total() -> None:
    fleet = with_faults({"at": "20s", "gpu": 6, "fault": "ecc_dbe", "count": 4, "duration": "4s"})
    assert diff(fleet, "dcgm", 19.0) == {}
    assert changed(diff(fleet, "dcgm", 100.0)) == {("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "6")}
    assert value(fleet, "dcgm", 22.0, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu="6") == 2
    assert value(fleet, "dcgm", 100.0, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu="6") == 4


def test_gpu_sharing_gives_one_series_per_pod_and_a_pod_ending_removes_only_its_series() -> None:
    fleet = with_faults({"at": "10s", "gpu": 2, "fault": "gpu_sharing", "pods": 3, "duration": "50s"})
    temps = {k: v for k, v in scrape(fleet, "dcgm", 30.0).items() if k[0] == "DCGM_FI_DEV_GPU_TEMP"}
    gpu2 = [dict(labels) for _, labels in temps if dict(labels)["gpu"] == "2"]
    assert len(temps) == 10  # 8 GPUs, GPU 2 three times
    assert {labels["UUID"] for labels in gpu2} == {fleet.gpu_uuid(NODE, 2)}
    assert len({labels["pod"] for labels in gpu2}) == 3
    # after 50 s two pods end: their series go, GPU 2 stays with the first pod
    after = [k for k in scrape(fleet, "dcgm", 60.0) if k[0] == "DCGM_FI_DEV_GPU_TEMP"]
    assert len(after) == 8
    assert scrape(fleet, "dcgm", 60.0) == scrape(HEALTHY, "dcgm", 60.0)


def test_mig_gives_one_series_per_gpu_instance_with_the_gpus_uuid() -> None:
    fleet = with_faults({"at": "0s", "gpu": 4, "fault": "mig", "instances": 3, "profile": "2g.20gb"})
    gpu4 = [dict(k[1]) for k in scrape(fleet, "dcgm", 5.0) if k[0] == "DCGM_FI_DEV_GPU_TEMP"]
    gpu4 = [labels for labels in gpu4 if labels["gpu"] == "4"]
    assert [(g["GPU_I_ID"], g["GPU_I_PROFILE"]) for g in gpu4] == [
        ("1", "2g.20gb"),
        ("2", "2g.20gb"),
        ("3", "2g.20gb"),
    ]
    assert {g["UUID"] for g in gpu4} == {fleet.gpu_uuid(NODE, 4)}


@pytest.mark.parametrize(
    ("counter", "family", "top"),
    [
        ("local_link_integrity_errors", "node_infiniband_local_link_integrity_errors", 15),
        ("excessive_buffer_overrun_errors", "node_infiniband_excessive_buffer_overrun_errors", 15),
        ("link_downed", "node_infiniband_link_downed", 255),
        ("symbol_error", "node_infiniband_symbol_error", 65535),
    ],
)
def test_ib_error_counters_stop_at_their_sysfs_width(counter: str, family: str, top: int) -> None:
    fleet = with_faults(
        {
            "at": "10s",
            "hca": "mlx5_3",
            "fault": "ib_port_errors",
            "counter": counter,
            "count": top * 3,
            "duration": "6s",
        }
    )
    assert value(fleet, "node", 9.0, family, device="mlx5_3") == 0
    assert value(fleet, "node", 11.0, family, device="mlx5_3") == top // 2  # climbing
    assert value(fleet, "node", 12.0, family, device="mlx5_3") == top  # pinned, not wrapped
    assert value(fleet, "node", 500.0, family, device="mlx5_3") == top
    assert changed(diff(fleet, "node", 500.0)) == {(family, "mlx5_3")}


def test_ib_port_down_and_hca_gone() -> None:
    fleet = with_faults(
        {"at": "10s", "hca": "mlx5_1", "fault": "ib_port_down", "duration": "20s"},
        {"at": "10s", "hca": "mlx5_5", "fault": "ib_hca_missing"},
    )
    assert value(fleet, "node", 15.0, "node_infiniband_state_id", device="mlx5_1") == 1
    assert value(fleet, "node", 15.0, "node_infiniband_physical_state_id", device="mlx5_1") == 3
    assert value(fleet, "node", 30.0, "node_infiniband_state_id", device="mlx5_1") == 4
    assert not [k for k in scrape(fleet, "node", 15.0) if dict(k[1]).get("device") == "mlx5_5"]
    assert [k for k in scrape(fleet, "node", 9.0) if dict(k[1]).get("device") == "mlx5_5"]


def test_a_management_hca_follows_the_compute_ones_and_takes_faults() -> None:
    import yaml

    scenario = parse_scenario(
        yaml.safe_dump({"faults": [{"node": NODE, "at": "10s", "hca": "mlx5_8", "fault": "ib_link_flap"}]})
    )
    fleet = Fleet(FleetConfig(nodes=4, seed=SEED, idle_fraction=0.0, management_hcas=1), scenario)
    info = {
        dict(k[1])["device"]: dict(k[1])["hca_type"]
        for k in scrape(fleet, "node", 10.0)
        if k[0] == "node_infiniband_info"
    }
    assert info["mlx5_8"] == "MT4125" and info["mlx5_7"] == "MT4129" and len(info) == 9
    assert value(fleet, "node", 10.0, "node_infiniband_link_downed", device="mlx5_8") == 1
