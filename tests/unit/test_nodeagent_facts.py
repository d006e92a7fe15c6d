"""The node agent's readers (issue 32): kernel log records and Xid lines, sysfs hw_counters, NVML
(recorded), and what a scrape shows when a source is bad or missing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from healer.nodeagent.exposition import render
from healer.nodeagent.facts import HostFacts
from healer.nodeagent.infiniband import HwCounter, read_hw_counters
from healer.nodeagent.kmsg import KmsgFile, parse_record, parse_xid
from healer.nodeagent.nvml import (
    NvmlUnavailable,
    PynvmlCalls,
    RecordedNvml,
    RecordingNvml,
    call_key,
    read_nvml,
)
from healer_dev.agent_fixture import AgentFixture, gpu_uuid, write_fixture
from tests.healer_cli import run_healer

NODE = "gpu-node-7"


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """{sample name: [(labels, value)]} of an exposition text (prometheus_client's own parser), empty
    labels left out as Prometheus leaves them out."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append(({k: v for k, v in s.labels.items() if v}, s.value))
    return out


@pytest.fixture
def node(tmp_path: Path) -> AgentFixture:
    return write_fixture(tmp_path / "node", gpus=2, hcas=2)


@pytest.mark.parametrize(
    ("line", "bus_id", "xid", "detail"),
    [
        (
            "3,1021,3590000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, "
            "GPU has fallen off the bus.",
            "00000000:3B:00.0",
            79,
            "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        ),
        (  # older drivers: no pid/name
            "4,88,12000,-;NVRM: Xid (PCI:0000:04:00): 48, "
            "An uncorrectable double bit error (DBE) has been detected",
            "00000000:04:00.0",
            48,
            "An uncorrectable double bit error (DBE) has been detected",
        ),
        (  # a function number and extra header fields (caller id) after the flags
            "3,5,77,c,caller=T123;NVRM: Xid (PCI:0001:b1:00.0): 119, pid=991, name=python3, Timeout",
            "00000001:B1:00.0",
            119,
            "pid=991, name=python3, Timeout",
        ),
    ],
)
def test_an_xid_line_names_the_gpu_as_nvml_and_dcgm_exporter_do(
    line: str, bus_id: str, xid: int, detail: str
) -> None:
    record = parse_record(line)
    assert record is not None
    found = parse_xid(record)
    assert found is not None
    assert (found.pci_bus_id, found.xid, found.detail) == (bus_id, xid, detail)


def test_records_that_are_not_xids_or_not_records_are_told_apart() -> None:
    loading = parse_record("6,2,4100000,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  570.133.20")
    assert loading is not None and (loading.level, loading.sequence, loading.usec) == (6, 2, 4_100_000)
    assert parse_xid(loading) is None
    assert parse_record(" SUBSYSTEM=pci") is None  # a continuation line of the record before
    assert parse_record("Xid 79 somewhere") is None
    assert loading.line() == "[    4.100000] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  570.133.20"


def test_the_kmsg_file_returns_each_record_once_and_waits_for_a_line_being_written(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_text("6,0,0,-;Linux version 6.8\n SUBSYSTEM=x\nnot a record\n3,1,5,-;NVRM: Xid (PCI:0000:18")
    kmsg = KmsgFile(path)
    assert [r.sequence for r in kmsg.read_new()] == [0]
    assert kmsg.malformed == 1
    with path.open("a") as f:
        f.write(":00): 79, GPU has fallen off the bus.\n")
    (record,) = kmsg.read_new()
    assert parse_xid(record) is not None
    assert kmsg.read_new() == []
    assert [r.sequence for r in kmsg.read_all()] == [0, 1]


def test_hw_counters_are_read_per_port_and_a_bad_file_is_named_while_the_rest_is_read(
    node: AgentFixture,
) -> None:
    node.set_hw_counter("mlx5_1", "out_of_sequence", 12)
    hw = node.root / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "hw_counters"
    (hw / "rnr_nak_retry_err").write_text("N/A (no PMA)\n")
    (hw / "packet_seq_err").unlink()
    (hw / "packet_seq_err").mkdir()  # unreadable as a file, even as root
    counters, problems = read_hw_counters(node.root / "sys")
    assert HwCounter("mlx5_1", "1", "out_of_sequence", 12) in counters
    assert not any(c.counter == "lifespan" for c in counters)  # a setting, not a counter
    assert len(counters) == 2 * 7 - 2
    assert sorted((Path(p.source).name, p.message) for p in problems) == [
        ("packet_seq_err", "Is a directory"),
        ("rnr_nak_retry_err", "not a number: 'N/A (no PMA)'"),
    ]

    scrape = samples(render(HostFacts.fixture(NODE, node.root)))
    assert ({"source": "infiniband"}, 2.0) in scrape["healer_agent_read_errors"]
    assert ({"source": "infiniband"}, 0.0) in scrape["healer_agent_source_up"]
    assert len(scrape["healer_agent_infiniband_hw_counters_total"]) == 12


def test_a_node_without_infiniband_or_kernel_log_serves_what_it_has(tmp_path: Path) -> None:
    node = write_fixture(tmp_path / "node", gpus=1, hcas=0)
    node.kmsg.unlink()
    scrape = samples(render(HostFacts.fixture(NODE, node.root)))
    assert "healer_agent_infiniband_hw_counters_total" not in scrape
    assert ({"source": "kmsg"}, 0.0) in scrape["healer_agent_source_up"]
    assert len(scrape["DCGM_FI_DEV_GPU_TEMP"]) == 1


def test_without_nvml_the_agent_says_so_and_still_maps_nothing_it_cannot(node: AgentFixture) -> None:
    (node.root / "nvml.json").unlink()
    node.log_xid(1, 79, "GPU has fallen off the bus.", usec=3_599_000_000)
    facts = HostFacts.fixture(NODE, node.root)
    snapshot = facts.read()
    assert [p.message for p in snapshot.problems] == [
        f"NVML not available: no recorded device at {node.root / 'nvml.json'}"
    ]
    scrape = samples(render(facts))
    assert "DCGM_FI_DEV_GPU_TEMP" not in scrape
    # The Xid read before still counts, and one read afresh too; the GPU is known by its address only.
    assert scrape["DCGM_FI_DEV_XID_ERRORS"] == [
        (
            {
                "Hostname": NODE,
                "pci_bus_id": "00000000:2A:00.0",
                "err_code": "79",
                "err_msg": "GPU has fallen off the bus.",
            },
            79.0,
        )
    ]
    assert len(scrape["healer_agent_infiniband_hw_counters_total"]) == 14


def test_without_the_bindings_nvml_is_unavailable_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(NvmlUnavailable, match=r"^NVML not available: .*the agent extra \(pip install -e"):
        PynvmlCalls()


def test_without_the_driver_nvml_is_unavailable_not_a_crash() -> None:
    pytest.importorskip("pynvml")
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(NvmlUnavailable, match=r"^NVML not available: nvmlInit failed: "):
        PynvmlCalls()


def test_a_recorded_device_that_is_not_one_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "nvml.json"
    bad.write_text('{"calls": [')
    with pytest.raises(NvmlUnavailable, match=r"recorded device .*nvml\.json: Expecting value"):
        RecordedNvml.load(bad)
    bad.write_text("[]")
    with pytest.raises(NvmlUnavailable, match="no 'calls' object"):
        RecordedNvml.load(bad)


def test_a_fact_nvml_does_not_support_is_absent_not_zero(node: AgentFixture) -> None:
    recording = json.loads((node.root / "nvml.json").read_text())
    recording["calls"][call_key("nvmlDeviceGetMarginTemperature", 1, ())] = {
        "error": 3,
        "text": "Not Supported",
    }
    del recording["calls"][call_key("nvmlDeviceGetCurrentClocksEventReasons", 0, ())]  # an older driver
    recording["calls"][call_key("nvmlDeviceGetCurrentClocksThrottleReasons", 0, ())] = {"value": 0x48}
    (node.root / "nvml.json").write_text(json.dumps(recording))
    reading = read_nvml(RecordedNvml.load(node.root / "nvml.json"))
    assert "DCGM_FI_DEV_GPU_TEMP_LIMIT" not in reading.gpus[1].values
    assert reading.gpus[1].missing["DCGM_FI_DEV_GPU_TEMP_LIMIT"] == (
        "nvmlDeviceGetMarginTemperature: Not Supported (NVML error 3)"
    )
    assert reading.gpus[0].values["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] == 0x48
    scrape = samples(render(HostFacts.fixture(NODE, node.root)))
    assert [labels["gpu"] for labels, _ in scrape["DCGM_FI_DEV_GPU_TEMP_LIMIT"]] == ["0"]
    assert len(scrape["DCGM_FI_DEV_GPU_TEMP"]) == 2


def test_gpus_nvml_cannot_list_make_nvml_down_and_leave_the_rest(node: AgentFixture) -> None:
    recording = json.loads((node.root / "nvml.json").read_text())
    recording["calls"][call_key("nvmlDeviceGetPciInfo", 1, ())] = {"error": 15, "text": "GPU is lost"}
    (node.root / "nvml.json").write_text(json.dumps(recording))
    scrape = samples(render(HostFacts.fixture(NODE, node.root)))
    assert ({"source": "nvml"}, 0.0) in scrape["healer_agent_source_up"]
    assert "DCGM_FI_DEV_GPU_TEMP" not in scrape
    assert len(scrape["healer_agent_infiniband_hw_counters_total"]) == 14


def test_a_recording_reads_back_as_the_device_it_recorded(node: AgentFixture) -> None:
    recording = RecordingNvml(RecordedNvml.load(node.root / "nvml.json"))
    first = read_nvml(recording)
    again = read_nvml(RecordedNvml(calls=recording.dump()["calls"]))
    assert again == first
    assert [g.uuid for g in first.gpus] == [gpu_uuid(0), gpu_uuid(1)]
    assert first.gpus[0].values["DCGM_FI_DEV_POWER_USAGE"] == pytest.approx(645.123)  # mW read, W written
    assert len(first.gpus[0].nvlink) == 18 * 4


def test_nvlink_errors_per_link_carry_the_gpu_and_link(node: AgentFixture) -> None:
    recording = json.loads((node.root / "nvml.json").read_text())
    recording["calls"][call_key("nvmlDeviceGetNvLinkErrorCounter", 1, (7, 2))] = {"value": 31}
    (node.root / "nvml.json").write_text(json.dumps(recording))
    scrape = samples(render(HostFacts.fixture(NODE, node.root)))
    moved = [(labels, v) for labels, v in scrape["healer_agent_nvlink_errors_total"] if v]
    assert [(labels["UUID"], labels["link"], labels["counter"], v) for labels, v in moved] == [
        (gpu_uuid(1), "7", "crc_flit", 31.0)
    ]


def test_a_kernel_log_that_becomes_unreadable_keeps_the_xids_already_read(node: AgentFixture) -> None:
    node.log_xid(0, 94, "Contained: SM (0x1). RST: No, D-RST: No", usec=3_599_000_000)
    facts = HostFacts.fixture(NODE, node.root)
    assert [x.xid for x in facts.read().xids] == [94]
    node.kmsg.unlink()
    node.kmsg.mkdir()  # unreadable as a file, even as root
    snapshot = facts.read()
    assert [x.xid for x in snapshot.xids] == [94]
    assert not snapshot.up["kmsg"]
    assert [(p.source, p.message) for p in snapshot.problems] == [(str(node.kmsg), "Is a directory")]


def test_the_agent_command_prints_one_scrape_of_a_fixture_without_kubernetes(node: AgentFixture) -> None:
    node.set_hw_counter("mlx5_0", "local_ack_timeout_err", 5)
    done = run_healer(
        "agent", "--node", NODE, "--print-metrics", "--facts-fixture", str(node.root),
        env={"PATH": "/usr/bin:/bin", "HOME": str(node.root)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    scrape = samples(done.stdout)
    assert (
        {"node": NODE, "device": "mlx5_0", "port": "1", "counter": "local_ack_timeout_err"},
        5.0,
    ) in scrape["healer_agent_infiniband_hw_counters_total"]
    assert len(scrape["DCGM_FI_DEV_GPU_TEMP"]) == 2
