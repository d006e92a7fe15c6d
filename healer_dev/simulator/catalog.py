"""What the simulated exporters publish: metric families, help texts, hardware constants, Xid texts.

Sources: dcgm-exporter's counters CSVs (``default-counters.csv``, ``dcp-metrics-included.csv``) for
the DCGM names, types and help texts; node_exporter's ``collector/infiniband_linux.go`` for the
InfiniBand ones; the sample scrapes in ``tests/fixtures/`` (each file says how it differs from a
real scrape) for label order and value formats.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# --- the simulated hardware (an HGX H100 node) ---------------------------------------------------

#: ``modelName`` label of every simulated GPU.
GPU_MODEL = "NVIDIA H100 80GB HBM3"
#: ``DCGM_FI_DRIVER_VERSION`` label.
DRIVER_VERSION = "570.133.20"
#: PCI bus ids of the 8 GPUs of an HGX H100 board, in ``gpu`` index order.
PCI_BUS_IDS = (
    "00000000:18:00.0",
    "00000000:2A:00.0",
    "00000000:3A:00.0",
    "00000000:5D:00.0",
    "00000000:9A:00.0",
    "00000000:AB:00.0",
    "00000000:BA:00.0",
    "00000000:DB:00.0",
)
#: Framebuffer size of an H100 80GB, MiB (``FB_USED + FB_FREE + reserved``).
FB_TOTAL_MIB = 81559
#: Framebuffer the driver reserves, MiB (neither used nor free).
FB_RESERVED_MIB = 547
#: Maximum (boost) SM clock of an H100 SXM, MHz.
SM_CLOCK_MAX_MHZ = 1980
#: SM clock of an idle H100, MHz.
SM_CLOCK_IDLE_MHZ = 345
#: HBM3 memory clock, MHz.
MEM_CLOCK_MHZ = 2619

#: ``node_infiniband_info`` labels of the simulated ConnectX-7 (NDR) HCAs.
HCA_BOARD_ID = "MT_0000000970"
HCA_FIRMWARE = "28.42.1000"
HCA_TYPE = "MT4129"
#: ``hca_type`` of a management HCA (ConnectX-6 Dx, Ethernet/RoCE) and its ``rate`` text in sysfs.
MGMT_HCA_TYPE = "MT4125"
MGMT_RATE_TEXT = "100 Gb/sec (4X EDR)"
#: That rate as node_exporter reports it, bytes per second.
MGMT_RATE_BYTES_PER_SECOND = 12_500_000_000
#: ``ports/<n>/rate`` text of a compute HCA (node_exporter turns it into 50e9 bytes per second).
IB_RATE_TEXT = "400 Gb/sec (4X NDR)"
#: NDR 400 Gb/s port rate as node_exporter reports it, bytes per second.
IB_RATE_BYTES_PER_SECOND = 50_000_000_000

# --- clock event reason bits (DCGM_FI_DEV_CLOCKS_EVENT_REASONS) ---------------------------------

CLOCK_EVENT_GPU_IDLE = 0x1
#: SW power cap: what a healthy GPU at full load reports (a real H200 at 670 TFLOP/s of bf16, about
#: 690 W of its 700 W limit, read 0x4; docs/device-checks/2026-12-04-NVIDIA-H200-bf16-load.txt).
CLOCK_EVENT_SW_POWER_CAP = 0x4
CLOCK_EVENT_HW_SLOWDOWN = 0x8
CLOCK_EVENT_SW_THERMAL = 0x20
CLOCK_EVENT_HW_THERMAL = 0x40

# --- InfiniBand port states -------------------------------------------------------------------

IB_STATE_DOWN = 1
IB_STATE_ACTIVE = 4
IB_PHYS_POLLING = 2
IB_PHYS_DISABLED = 3
IB_PHYS_LINK_UP = 5

# --- Xid texts (err_msg label of DCGM_FI_DEV_XID_ERRORS) ---------------------------------------

#: ``err_msg`` per Xid code; the exporter prints ``No Error`` for 0. Codes not listed print
#: :data:`UNKNOWN_XID_MESSAGE`.
XID_MESSAGES: dict[int, str] = {
    0: "No Error",
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors",
    46: "GPU stopped processing",
    48: "Double Bit ECC Error",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    74: "NVLINK Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    109: "Context Switch Timeout Error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
}
UNKNOWN_XID_MESSAGE = "Unknown Error"


def xid_message(code: int) -> str:
    """The ``err_msg`` label the exporter prints for Xid ``code``."""
    return XID_MESSAGES.get(code, UNKNOWN_XID_MESSAGE)


# --- metric families --------------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    """One metric family: ``fmt`` is the value style (``d`` Go ``%d``, ``f`` Go ``%f``, ``g`` Go shortest)."""

    name: str
    help: str
    type: Literal["gauge", "counter"]
    fmt: Literal["d", "f", "g"]


XID_FAMILY = "DCGM_FI_DEV_XID_ERRORS"

#: Field 112 under its 4.x name (the only one exporters 4.4.2+ accept) and its 3.x name (the only one
#: 3.x exporters know), with the 3.x help text (NVIDIA/dcgm-exporter 3.x default-counters.csv).
CLOCK_EVENTS_FAMILY = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
CLOCK_THROTTLE_FAMILY_3X = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
CLOCK_THROTTLE_HELP_3X = "Current clock throttle reasons."

#: dcgm-exporter families in output order: the order of the reference scrape
#: (``fixtures/dcgm-exporter.prom``), with the fields it lacks inserted where the CSV lists them.
DCGM_FAMILIES: tuple[Family, ...] = (
    Family("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "gauge", "d"),
    Family("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", "gauge", "d"),
    Family("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "gauge", "d"),
    Family("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", "gauge", "d"),
    Family("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "gauge", "f"),
    Family(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "Total energy consumption since boot (in mJ).",
        "counter",
        "d",
    ),
    Family("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "gauge", "d"),
    Family("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", "gauge", "d"),
    Family("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "gauge", "d"),
    Family("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.", "gauge", "f"),
    Family(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        "gauge",
        "f",
    ),
    Family("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "Current clock event reasons (bitmask).", "gauge", "d"),
    Family("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.", "counter", "d"),
    Family(
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "Total number of NVLink flow-control CRC errors.",
        "counter",
        "d",
    ),
    Family(
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "Total number of NVLink data CRC errors.",
        "counter",
        "d",
    ),
    Family("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "Total number of NVLink retries.", "counter", "d"),
    Family(
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "Total number of NVLink recovery errors.",
        "counter",
        "d",
    ),
    Family(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors.", "counter", "d"
    ),
    Family("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed", "gauge", "d"),
    Family("DCGM_FI_DEV_ROW_REMAP_PENDING", "Whether remapping of rows is pending", "gauge", "d"),
    Family(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for uncorrectable errors",
        "counter",
        "d",
    ),
    Family(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for correctable errors",
        "counter",
        "d",
    ),
    Family(XID_FAMILY, "Value of the last XID error encountered.", "gauge", "d"),
)

#: dcgm-exporter's own Xid counter (``DCGM_EXP_XID_ERRORS_COUNT``): one series per (GPU, Xid) seen in the
#: trailing window, labels ``window_size_in_ms`` and ``xid`` after the GPU labels. Not sticky: a later
#: Xid 45 does not hide an earlier 79.
#: The NVLink5 link counters (DCGM fields 1204-1214, 1219) deploy/dcgm-exporter/counters-4.x.csv
#: enables, with its help texts: a Blackwell GPU reports them (``FleetConfig.nvlink5``), earlier
#: GPUs none. The CSV's BER gauges (1216, 1218) are not simulated.
NVLINK5_FAMILIES: tuple[Family, ...] = tuple(
    Family(f"DCGM_FI_DEV_NVLINK_COUNT_{name}", help_text, "counter", "d")
    for name, help_text in (
        ("RX_MALFORMED_PACKET_ERRORS", "Number of packets Rx on a link where packets are malformed."),
        ("RX_BUFFER_OVERRUN_ERRORS", "Number of packets that were discarded on Rx due to buffer overrun."),
        ("RX_ERRORS", "Total number of packets with errors Rx on a link."),
        ("RX_REMOTE_ERRORS", "Total number of packets Rx - stomp/EBP marker."),
        ("RX_GENERAL_ERRORS", "Total number of packets Rx with header mismatch."),
        (
            "LOCAL_LINK_INTEGRITY_ERRORS",
            "Total number of times that the count of local errors exceeded a threshold.",
        ),
        ("TX_DISCARDS", "Total number of tx error packets that were discarded."),
        (
            "LINK_RECOVERY_SUCCESSFUL_EVENTS",
            "Number of times link went from Up to recovery that succeeded (link back up).",
        ),
        (
            "LINK_RECOVERY_FAILED_EVENTS",
            "Number of times link went from Up to recovery that failed (link declared down).",
        ),
        (
            "LINK_RECOVERY_EVENTS",
            "Number of times link went from Up to recovery (whatever the result).",
        ),
        ("EFFECTIVE_ERRORS", "Sum of the number of errors in each NVLink packet."),
        ("RX_SYMBOL_ERRORS", "Number of errors in rx symbols."),
    )
)

XID_COUNT_FAMILY = Family(
    "DCGM_EXP_XID_ERRORS_COUNT",
    "Count of XID Errors within user-specified time window (see xid-count-window-size param).",
    "gauge",
    "d",
)
#: The exporter's default ``--xid-count-window-size``, milliseconds (5 minutes).
XID_COUNT_WINDOW_MS = 300_000

#: DCGM counters: reset to 0 by an ``exporter_restart`` fault.
DCGM_COUNTERS = tuple(f.name for f in DCGM_FAMILIES if f.type == "counter")

INFO_FAMILY = "node_infiniband_info"

_IB = "node_infiniband_"

#: (name suffix, type, help) of the node_infiniband_* families.
_IB_SPECS: tuple[tuple[str, str, str], ...] = (
    (
        "excessive_buffer_overrun_errors_total",
        "counter",
        "Number of times that OverrunErrors consecutive flow control update "
        "periods occurred, each having at least one overrun error.",
    ),
    (
        "link_downed_total",
        "counter",
        "Number of times the link failed to recover from an error state and went down",
    ),
    (
        "link_error_recovery_total",
        "counter",
        "Number of times the link successfully recovered from an error state",
    ),
    (
        "local_link_integrity_errors_total",
        "counter",
        "Number of times that the count of local physical errors exceeded the "
        "threshold specified by LocalPhyErrors.",
    ),
    (
        "physical_state_id",
        "gauge",
        "Physical state of the InfiniBand port (0: no change, 1: sleep, 2: "
        "polling, 3: disable, 4: shift, 5: link up, 6: link error recover, 7: "
        "phytest)",
    ),
    (
        "port_constraint_errors_received_total",
        "counter",
        "Number of packets received on the switch physical port that are discarded",
    ),
    (
        "port_constraint_errors_transmitted_total",
        "counter",
        "Number of packets not transmitted from the switch physical port",
    ),
    (
        "port_data_received_bytes_total",
        "counter",
        "Number of data octets received on all links",
    ),
    (
        "port_data_transmitted_bytes_total",
        "counter",
        "Number of data octets transmitted on all links",
    ),
    (
        "port_discards_received_total",
        "counter",
        "Number of inbound packets discarded by the port because the port is down or congested",
    ),
    (
        "port_discards_transmitted_total",
        "counter",
        "Number of outbound packets discarded by the port because the port is down or congested",
    ),
    (
        "port_errors_received_total",
        "counter",
        "Number of packets containing an error that were received on this port",
    ),
    (
        "port_packets_received_total",
        "counter",
        "Number of packets received on all VLs by this port (including errors)",
    ),
    (
        "port_packets_transmitted_total",
        "counter",
        "Number of packets transmitted on all VLs from this port (including errors)",
    ),
    (
        "port_receive_remote_physical_errors_total",
        "counter",
        "Number of packets marked with the EBP (End of Bad Packet) delimiter received on the port.",
    ),
    (
        "port_receive_switch_relay_errors_total",
        "counter",
        "Number of packets that could not be forwarded by the switch.",
    ),
    (
        "port_transmit_wait_total",
        "counter",
        "Number of ticks during which the port had data to transmit but no data "
        "was sent during the entire tick",
    ),
    (
        "rate_bytes_per_second",
        "gauge",
        "Maximum signal transfer rate",
    ),
    (
        "state_id",
        "gauge",
        "State of the InfiniBand port (0: no change, 1: down, 2: init, 3: armed, 4: active, 5: act defer)",
    ),
    (
        "symbol_error_total",
        "counter",
        "Number of minor link errors detected on one or more physical lanes.",
    ),
    (
        "vl15_dropped_total",
        "counter",
        "Number of incoming VL15 packets dropped due to resource limitations.",
    ),
)

#: node_infiniband_* families (without the info family), sorted by name like client_golang prints them.
IB_FAMILIES: tuple[Family, ...] = tuple(
    sorted((Family(_IB + n, h, t, "g") for n, t, h in _IB_SPECS), key=lambda f: f.name)  # type: ignore[arg-type]
)

INFO_HELP = "Non-numeric data from /sys/class/infiniband/<device>, value is always 1."

#: IB counters: reset to 0 by an ``exporter_restart`` fault.
IB_COUNTERS = tuple(f.name for f in IB_FAMILIES if f.type == "counter")
