"""The simulator's scrapes look like the real exporters' (the reference scrapes in tests/fixtures)."""

from __future__ import annotations

import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from healer_dev.simulator import Fleet, FleetConfig, LabelStyle
from tests.conftest import FIXTURES

DCGM_FIXTURE = (FIXTURES / "dcgm-exporter.prom").read_text()
IB_FIXTURE = (FIXTURES / "node-exporter-infiniband.prom").read_text()

_VALUE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{.*\})? (?P<value>\S+)$")


def families(text: str) -> dict[str, tuple[str, str, list[list[str]]]]:
    """Family name → (type, help, label names of each sample in order), from prometheus_client's parser."""
    return {
        f.name: (f.type, f.documentation, [list(s.labels) for s in f.samples])
        for f in text_string_to_metric_families(text)
    }


def value_style(text: str) -> dict[str, set[str]]:
    """Metric name → the shapes its values are printed in (int, %f with 6 decimals, other)."""
    styles: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        m = _VALUE.match(line)
        assert m, line
        v = m["value"]
        shape = "int" if re.fullmatch(r"-?\d+", v) else "%f" if re.fullmatch(r"-?\d+\.\d{6}", v) else v
        styles.setdefault(m["name"], set()).add(shape)
    return styles


@pytest.fixture(scope="module")
def fleet() -> Fleet:
    return Fleet(FleetConfig(nodes=16, seed=7, idle_fraction=0.0))


def test_dcgm_families_types_help_and_label_order_match_the_reference(fleet: Fleet) -> None:
    ours = families(fleet.render_dcgm("gpu-node-07", 42.0))
    reference = families(DCGM_FIXTURE)
    for name, (kind, help_text, labels) in reference.items():
        assert name in ours, name
        assert ours[name][0] == kind, name
        assert ours[name][1] == help_text, name
        assert ours[name][2] == labels, name  # 8 GPUs, label names in the exporter's order
    # the reference's families come in the same order (extra fields may sit in between)
    order = [n for n in ours if n in reference]
    assert order == list(reference)


def test_dcgm_values_are_printed_like_the_exporter(fleet: Fleet) -> None:
    ours = value_style(fleet.render_dcgm("gpu-node-03", 42.0))
    for name, shapes in value_style(DCGM_FIXTURE).items():
        assert ours[name] == shapes, name  # %d fields as integers, %f fields with 6 decimals


def test_dcgm_extra_fields_use_exporter_names_and_labels(fleet: Fleet) -> None:
    ours = families(fleet.render_dcgm("gpu-node-03", 42.0))
    gpu_labels = families(DCGM_FIXTURE)["DCGM_FI_DEV_GPU_TEMP"][2][0]
    for name in (
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    ):
        assert ours[name][2] == [gpu_labels] * 8, name


def test_no_xid_reads_zero_no_error(fleet: Fleet) -> None:
    text = fleet.render_dcgm("gpu-node-01", 10.0)
    xid = [line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_XID_ERRORS{")]
    assert len(xid) == 8
    assert all('err_code="0",err_msg="No Error",container="trainer"' in line for line in xid)
    assert all(line.endswith("} 0") for line in xid)


def test_infiniband_families_types_help_and_labels_match_the_reference(fleet: Fleet) -> None:
    text = fleet.render_node("gpu-node-05", 42.0)
    ours = families(text)
    for name, (kind, help_text, labels) in families(IB_FIXTURE).items():
        assert name in ours, name
        assert ours[name][:2] == (kind, help_text), name
        assert ours[name][2] == labels, name
    # node_exporter (client_golang) prints families sorted by name
    names = [line.split()[2] for line in text.splitlines() if line.startswith("# HELP")]
    assert names == sorted(names)
    assert all("Hostname" not in line and "node=" not in line for line in text.splitlines())


def test_infiniband_values_are_printed_like_go() -> None:
    text = Fleet(FleetConfig(nodes=1, seed=3, idle_fraction=0.0)).render_node("gpu-node-00", 100.0)
    values = {m["name"] + "|" + line: m["value"] for line in text.splitlines() if (m := _VALUE.match(line))}
    rate = [v for k, v in values.items() if k.startswith("node_infiniband_rate_bytes_per_second|")]
    assert set(rate) == {"5e+10"}
    data = [v for k, v in values.items() if k.startswith("node_infiniband_port_data_received_bytes_total|")]
    assert all(re.fullmatch(r"\d\.\d+e\+1\d", v) for v in data), data  # Go's shortest %g form
    assert {v for k, v in values.items() if k.startswith("node_infiniband_state_id|")} == {"4"}


def test_healthy_busy_gpus_read_realistic_values() -> None:
    fleet = Fleet(FleetConfig(nodes=8, seed=11, idle_fraction=0.0))
    temps: list[float] = []
    tensor: list[float] = []
    gr: list[float] = []
    power: list[float] = []
    for node in fleet.node_names:
        for t in (0.0, 61.0, 333.0, 900.0, 1799.0):
            for fam in text_string_to_metric_families(fleet.render_dcgm(node, t)):
                vals = [s.value for s in fam.samples]
                {
                    "DCGM_FI_DEV_GPU_TEMP": temps,
                    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": tensor,
                    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": gr,
                    "DCGM_FI_DEV_POWER_USAGE": power,
                }.get(fam.name, []).extend(vals)
    assert 56 <= min(temps) <= max(temps) <= 72
    assert max(temps) - min(temps) >= 5  # not a flat line
    assert 0.36 <= min(tensor) <= max(tensor) <= 0.46
    assert 0.96 <= min(gr) <= max(gr) <= 1.0
    assert 580 <= min(power) <= max(power) <= 710


def test_idle_node_has_no_workload_labels_and_only_the_idle_clock_bit() -> None:
    fleet = Fleet(FleetConfig(nodes=4, seed=1, idle_fraction=1.0))
    fams = {f.name: f for f in text_string_to_metric_families(fleet.render_dcgm("gpu-node-02", 50.0))}
    assert fleet.workload_pod("gpu-node-02") is None
    assert all("pod" not in s.labels for f in fams.values() for s in f.samples)
    assert {s.value for s in fams["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"].samples} == {1.0}
    assert max(s.value for s in fams["DCGM_FI_DEV_GPU_TEMP"].samples) < 40


def test_same_seed_and_time_render_the_same_text_whatever_came_before() -> None:
    a = Fleet(FleetConfig(nodes=4, seed=5))
    b = Fleet(FleetConfig(nodes=4, seed=5))
    b.render_dcgm("gpu-node-01", 999.0)
    assert a.render_dcgm("gpu-node-01", 12.5) == b.render_dcgm("gpu-node-01", 12.5)
    assert a.render_node("gpu-node-01", 12.5) == b.render_node("gpu-node-01", 12.5)
    assert a.render_dcgm("gpu-node-01", 12.5) != a.render_dcgm("gpu-node-01", 13.5)
    assert a.render_dcgm("gpu-node-01", 12.5) != Fleet(FleetConfig(nodes=4, seed=6)).render_dcgm(
        "gpu-node-01", 12.5
    )


@pytest.mark.parametrize(
    ("style", "host_key", "host_is_node", "dcgm_target_extra"),
    [
        (LabelStyle.HOSTNAME, "Hostname", True, set()),
        (LabelStyle.HOSTNAME_LOWER, "hostname", True, set()),
        (LabelStyle.NODE, "Hostname", False, {"node"}),
        (LabelStyle.EXPORTED, "Hostname", True, {"pod", "namespace", "container", "service", "endpoint"}),
    ],
)
def test_label_styles(
    style: LabelStyle, host_key: str, host_is_node: bool, dcgm_target_extra: set[str]
) -> None:
    fleet = Fleet(FleetConfig(nodes=3, seed=2, label_style=style, idle_fraction=0.0))
    fam = next(
        f
        for f in text_string_to_metric_families(fleet.render_dcgm("gpu-node-02", 5.0))
        if f.name == "DCGM_FI_DEV_GPU_TEMP"
    )
    labels = fam.samples[0].labels
    assert list(labels)[5] == host_key
    expected_host = "gpu-node-02" if host_is_node else fleet.exporter_pod("gpu-node-02", "dcgm")
    assert labels[host_key] == expected_host
    assert labels["pod"] == fleet.workload_pod("gpu-node-02")  # the exporter writes the workload's pod
    dcgm_target = fleet.target_labels("gpu-node-02", "dcgm")
    assert set(dcgm_target) == {"job", "instance"} | dcgm_target_extra
    if style is LabelStyle.NODE:
        assert dcgm_target["node"] == "gpu-node-02"
    if style is LabelStyle.EXPORTED:
        assert dcgm_target["pod"] == fleet.exporter_pod("gpu-node-02", "dcgm")
    assert fleet.target_labels("gpu-node-02", "node")["node"] == "gpu-node-02"


def test_targets_list_every_node_and_exporter_with_its_path() -> None:
    fleet = Fleet(FleetConfig(nodes=5))
    groups = fleet.targets("sim.example:9400")
    assert len(groups) == 10
    paths = {g["labels"]["__metrics_path__"] for g in groups}
    assert "/nodes/gpu-node-04/dcgm/metrics" in paths
    assert "/nodes/gpu-node-04/node/metrics" in paths
    assert all(g["targets"] == ["sim.example:9400"] for g in groups)
    # instance must differ per target, or Prometheus would merge every target's `up` series
    assert len({(g["labels"]["job"], g["labels"]["instance"]) for g in groups}) == 10


def _series_labels(text: str, family: str) -> list[list[str]]:
    """Label names of each ``family`` line, in printed order (raw text, not a parser's dict)."""
    out = []
    for line in text.splitlines():
        if line.startswith(family + "{"):
            body = line[len(family) + 1 : line.rindex("}")]
            out.append(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="', body))
    return out


def test_4x_shape_sorts_labels_names_field_112_the_4x_way_and_has_no_xid_series_until_the_first() -> None:
    import yaml

    from healer_dev.simulator import parse_scenario

    scenario = parse_scenario(
        yaml.safe_dump(
            {"faults": [{"at": "10s", "node": "gpu-node-01", "gpu": 2, "fault": "xid", "code": 79}]}
        )
    )
    fleet = Fleet(FleetConfig(nodes=2, seed=7, idle_fraction=0.0, exporter_version="4.x"), scenario)
    before, after = fleet.render_dcgm("gpu-node-01", 5.0), fleet.render_dcgm("gpu-node-01", 20.0)
    for text in (before, after):
        names = families(text)
        assert "DCGM_FI_DEV_CLOCKS_EVENT_REASONS" in names
        assert "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS" not in names
        for family in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS", "DCGM_EXP_XID_ERRORS_COUNT"):
            for labels in _series_labels(text, family):
                assert labels == sorted(labels), (family, labels)
    assert _series_labels(before, "DCGM_FI_DEV_XID_ERRORS") == []  # no Xid yet: no series at all
    xid = _series_labels(after, "DCGM_FI_DEV_XID_ERRORS")
    assert len(xid) == 1 and "err_code" in xid[0]


def test_3x_shape_names_field_112_the_3x_way_and_shows_a_zero_xid_series_per_gpu() -> None:
    fleet = Fleet(FleetConfig(nodes=2, seed=7, idle_fraction=0.0, exporter_version="3.x"))
    text = fleet.render_dcgm("gpu-node-01", 5.0)
    names = families(text)
    assert names["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"][1] == "Current clock throttle reasons."
    assert "DCGM_FI_DEV_CLOCKS_EVENT_REASONS" not in names
    assert len(_series_labels(text, "DCGM_FI_DEV_XID_ERRORS")) == 8
    # the 3.x output template's order, as in the reference scrape
    reference = families(DCGM_FIXTURE)["DCGM_FI_DEV_GPU_TEMP"][2]
    assert names["DCGM_FI_DEV_GPU_TEMP"][2] == reference
