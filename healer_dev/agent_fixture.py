"""A node as the agent reads it, generated on disk: sysfs ``hw_counters``, a kernel log, a recorded GPU.

The directory :meth:`healer.nodeagent.facts.HostFacts.fixture` reads::

    <root>/sys/class/infiniband/<dev>/ports/1/hw_counters/<name>   (Linux sysfs layout)
    <root>/kmsg                                                   (/dev/kmsg records, one a line)
    <root>/proc/uptime                                            (seconds since boot)
    <root>/nvml.json                                              (a recorded NVML device)

The recorded device answers as :class:`healer.nodeagent.nvml.RecordingNvml` writes a real GPU's
answers; its values are the simulator's healthy HGX H100 (``healer_dev.simulator.catalog``: model,
driver, PCI bus ids) so that the agent and the simulator describe the same node. A GPU's NVLinks
(18 on H100) answer per link; everything else a real H100 has but the rules do not read is left out.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from healer.nodeagent.nvml import (
    NVLINK_COUNTERS,
    NVML_CLOCK_SM,
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
    NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
    NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
    NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
    NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
    NVML_TEMPERATURE_GPU,
    NVML_VOLATILE_ECC,
    call_key,
)
from healer_dev.simulator import catalog as c

#: hw_counters of a ConnectX-7 port the fixture writes (names from Linux mlx5 ``counters.c``).
HW_COUNTERS = (
    "duplicate_request",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
    "out_of_sequence",
    "packet_seq_err",
    "rnr_nak_retry_err",
    "roce_adp_retrans",
)
#: NVLinks of an H100 SXM.
H100_NVLINKS = 18
#: NVML_DEVICE_UUID form: GPU-<8-4-4-4-12 hex>.
_UUID = "GPU-{:08x}-0000-4000-8000-{:012x}"


def gpu_uuid(index: int) -> str:
    return _UUID.format(0x5EA1E400 + index, index)


def _field_answer(field_id: int, value: int) -> list[dict[str, Any]]:
    # nvmlFieldValue_t as RecordingNvml writes it (valueType 3: unsigned long long).
    return [
        {
            "fieldId": field_id,
            "scopeId": 0,
            "timestamp": 0,
            "latencyUsec": 0,
            "valueType": 3,
            "nvmlReturn": 0,
            "value": value,
        }
    ]


def recorded_h100(gpus: int = 8) -> dict[str, Any]:
    """A recorded HGX H100 node: ``gpus`` GPUs, healthy, under load (the simulator's healthy values)."""
    calls: dict[str, dict[str, Any]] = {}

    def answer(
        function: str, gpu: int | None, *args: Any, value: Any = None, error: int | None = None
    ) -> None:
        key = call_key(function, gpu, tuple(args))
        calls[key] = {"error": error, "text": "Not Supported"} if error is not None else {"value": value}

    answer("nvmlSystemGetDriverVersion", None, value=c.DRIVER_VERSION)
    answer("nvmlDeviceGetCount", None, value=gpus)
    for g in range(gpus):
        bus = c.PCI_BUS_IDS[g % len(c.PCI_BUS_IDS)]
        answer("nvmlDeviceGetPciInfo", g, value={"busId": bus, "domain": 0, "bus": int(bus[9:11], 16)})
        answer("nvmlDeviceGetMinorNumber", g, value=g)
        answer("nvmlDeviceGetUUID", g, value=gpu_uuid(g))
        answer("nvmlDeviceGetName", g, value=c.GPU_MODEL)
        answer("nvmlDeviceGetTemperature", g, NVML_TEMPERATURE_GPU, value=63 + g % 4)
        answer("nvmlDeviceGetMarginTemperature", g, value=24 - g % 4)
        answer("nvmlDeviceGetPowerUsage", g, value=645_123 + g)  # milliwatts
        answer("nvmlDeviceGetClockInfo", g, NVML_CLOCK_SM, value=c.SM_CLOCK_MAX_MHZ)
        answer("nvmlDeviceGetUtilizationRates", g, value={"gpu": 100, "memory": 62})
        answer("nvmlDeviceGetCurrentClocksEventReasons", g, value=0)
        answer("nvmlDeviceGetPcieReplayCounter", g, value=0)
        answer(
            "nvmlDeviceGetTotalEccErrors", g, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC, value=0
        )
        answer("nvmlDeviceGetRemappedRows", g, value=[0, 0, 0, 0])
        for field_id in (
            NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
            NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
            NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
            NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
            NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
        ):
            answer("nvmlDeviceGetFieldValues", g, [field_id], value=_field_answer(field_id, 0))
        for link in range(H100_NVLINKS):
            answer("nvmlDeviceGetNvLinkState", g, link, value=1)
            for counter in NVLINK_COUNTERS.values():
                answer("nvmlDeviceGetNvLinkErrorCounter", g, link, counter, value=0)
    return {"calls": calls}


@dataclass
class AgentFixture:
    """A generated node under ``root`` (see the module docstring); methods change it as a fault would."""

    root: Path
    _next_seq: int | None = field(default=None, repr=False)

    @property
    def kmsg(self) -> Path:
        return self.root / "kmsg"

    def _port(self, device: str, port: int) -> Path:
        return self.root / "sys" / "class" / "infiniband" / device / "ports" / str(port)

    def add_hca(self, device: str, *, ports: int = 1) -> None:
        """An HCA whose ports have :data:`HW_COUNTERS`, all 0 (plus the ``lifespan`` setting)."""
        for port in range(1, ports + 1):
            hw = self._port(device, port) / "hw_counters"
            hw.mkdir(parents=True, exist_ok=True)
            (hw / "lifespan").write_text("10\n")
            for name in HW_COUNTERS:
                (hw / name).write_text("0\n")

    def set_hw_counter(self, device: str, name: str, value: int, *, port: int = 1) -> None:
        path = self._port(device, port) / "hw_counters" / name
        tmp = path.with_suffix(".tmp")
        tmp.write_text(f"{value}\n")
        os.replace(tmp, path)

    def set_uptime(self, seconds: float) -> None:
        (self.root / "proc").mkdir(parents=True, exist_ok=True)
        (self.root / "proc" / "uptime").write_text(f"{seconds:.2f} {seconds * 100:.2f}\n")

    def log(self, message: str, *, usec: int, level: int = 4, facility: int = 0) -> None:
        """Append a kernel log record (``/dev/kmsg`` format) at ``usec`` since boot."""
        if self._next_seq is None:
            self._next_seq = len(self.kmsg.read_text().splitlines()) if self.kmsg.exists() else 0
        with self.kmsg.open("a") as f:
            f.write(f"{facility * 8 + level},{self._next_seq},{usec},-;{message}\n")
        self._next_seq += 1

    def log_xid(self, gpu: int, xid: int, detail: str, *, usec: int) -> None:
        """Append the driver's Xid line for GPU ``gpu`` (its PCI address as the kernel writes it)."""
        bus = c.PCI_BUS_IDS[gpu % len(c.PCI_BUS_IDS)]
        domain, bus_no, dev = bus[4:8].lower(), bus[9:11].lower(), bus[12:14].lower()
        self.log(f"NVRM: Xid (PCI:{domain}:{bus_no}:{dev}): {xid}, {detail}", usec=usec, level=3)


def write_fixture(
    root: Path, *, gpus: int = 8, hcas: int = 4, uptime_seconds: float = 3600.0
) -> AgentFixture:
    """A healthy node: ``hcas`` HCAs ``mlx5_0``.., ``gpus`` recorded H100s, a kernel log with boot lines."""
    root.mkdir(parents=True, exist_ok=True)
    fixture = AgentFixture(root)
    (root / "sys" / "class" / "infiniband").mkdir(parents=True, exist_ok=True)
    for h in range(hcas):
        fixture.add_hca(f"mlx5_{h}")
    fixture.kmsg.write_text("")
    fixture.log("Linux version 6.8.0-healer (fixture)", usec=0, level=5)
    fixture.log(
        f"NVRM: loading NVIDIA UNIX x86_64 Kernel Module  {c.DRIVER_VERSION}", usec=4_100_000, level=6
    )
    fixture.set_uptime(uptime_seconds)
    (root / "nvml.json").write_text(json.dumps(recorded_h100(gpus), indent=1, sort_keys=True))
    return fixture
