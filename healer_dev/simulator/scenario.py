"""Fault scenarios: what goes wrong, where and when, read from YAML and validated with pydantic.

A scenario file::

    name: demo
    description: a hot GPU and a flapping IB link
    faults:
      - {at: 30s, node: gpu-node-07, gpu: 3, fault: hot_gpu, target: 85, ramp: 2m, duration: 5m}
      - {at: 1m, node: gpu-node-12, hca: mlx5_4, fault: ib_link_flap, flaps: 3, interval: 20s}

Every fault has ``at`` (when it starts, a Prometheus duration from the start of the run), ``node`` and
``fault`` (its kind). GPU faults need ``gpu`` (index), HCA faults ``hca`` (``mlx5_N``). ``duration``,
where a kind accepts it, is how long the condition lasts (absent: until the run ends); ``ramp`` is the
time a gradual fault takes to reach its target. Unknown keys are errors, so a typo never silently
means "default". The kinds and their parameters are the classes below; what each does to the series
is described in :mod:`healer_dev.simulator.fleet`.

Errors: :class:`ScenarioError` lists every problem with the file, line and field
(``demo.yaml:7: faults[1].target: Input should be greater than 0 (fault hot_gpu)``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, ValidationError

from healer.errors import HealerError
from healer.ruleset.durations import parse_duration

#: Scenarios shipped inside the package (``healer simulate --scenario demo``).
SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"

Seconds = Annotated[float, BeforeValidator(parse_duration)]
"""A Prometheus duration string (``30s``, ``5m``) or a number of seconds, held as seconds."""

NodeName = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")]
GpuIndex = Annotated[int, Field(ge=0, le=63, description="GPU index (the `gpu` label).")]
HcaName = Annotated[str, Field(pattern=r"^mlx5_\d+$", description="HCA device (the IB `device` label).")]
#: sysfs error counters of ``ports/<n>/counters/`` and their width in bits: the kernel reports a
#: counter at its maximum once it saturates (Linux InfiniBand port counters, IBA PortCounters).
IB_COUNTER_BITS: dict[str, int] = {
    "symbol_error": 16,
    "port_rcv_errors": 16,
    "link_downed": 8,
    "link_error_recovery": 8,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
}
IbCounter = Literal[
    "symbol_error",
    "port_rcv_errors",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
]
Exporter = Literal["dcgm", "node", "all"]


class ScenarioError(HealerError):
    """A scenario file is invalid; ``problems`` holds one line per problem (file:line: field: message)."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


class _Fault(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    at: Seconds = Field(..., ge=0, description="Start, seconds after the run starts.")
    node: NodeName
    noise: bool = Field(
        False, description="Not a fault of the node: healer must leave it in service (Xid 45, a restart)."
    )


class _GpuFault(_Fault):
    gpu: GpuIndex


class _HcaFault(_Fault):
    hca: HcaName


class HotGpu(_GpuFault):
    """GPU temperature climbs linearly over ``ramp`` to ``target`` (±1 C noise) and stays there.

    Memory temperature rises by the same amount. After ``duration`` the GPU is back to normal at once.
    """

    fault: Literal["hot_gpu"]
    target: float = Field(85.0, gt=0, lt=150, description="Plateau GPU temperature, degrees C.")
    ramp: Seconds = Field(0.0, ge=0, description="Seconds to climb from normal to target.")
    duration: Seconds | None = Field(None, gt=0)


class ThermalSlowdown(_GpuFault):
    """Clock event ``reasons`` bits are set; the SM clock drops to ``sm_clock`` and tensor activity and
    power fall in proportion. Default bits 0x48 = hw_slowdown | hw_thermal."""

    fault: Literal["thermal_slowdown"]
    reasons: int = Field(0x48, ge=1, le=0x1FF, description="Bitmask OR-ed into CLOCKS_EVENT_REASONS.")
    sm_clock: int = Field(1155, ge=1, le=3000, description="SM clock while slowed down, MHz.")
    duration: Seconds | None = Field(None, gt=0)


class SilentThrottle(_GpuFault):
    """Tensor-pipe activity falls to ``tensor_active`` over ``ramp`` while the graphics engine stays busy
    (~0.97), the SM clock stays at max and no clock event bit is set: throttling nobody reports."""

    fault: Literal["silent_throttle"]
    tensor_active: float = Field(0.15, ge=0, le=1, description="Tensor activity ratio while throttled.")
    ramp: Seconds = Field(0.0, ge=0)
    duration: Seconds | None = Field(None, gt=0)


class Xid(_GpuFault):
    """The GPU reports Xid ``code`` at ``at``. ``DCGM_FI_DEV_XID_ERRORS`` is a sticky gauge: it shows the
    LAST Xid (value and ``err_code``/``err_msg`` labels) until the exporter restarts, so a later Xid 45
    overwrites an earlier 79. ``DCGM_EXP_XID_ERRORS_COUNT{xid="<code>"}`` counts it for the exporter's
    5-minute window, then its series disappears. Use ``code: 45`` for the usual follow-up noise."""

    fault: Literal["xid"]
    code: int = Field(..., ge=1, le=999, description="Xid number.")


class RowRemapFailure(_GpuFault):
    """``DCGM_FI_DEV_ROW_REMAP_FAILURE`` turns 1 (for ``duration``, i.e. until a repair) and
    ``DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS`` grows by ``uncorrectable_rows`` (and stays)."""

    fault: Literal["row_remap_failure"]
    uncorrectable_rows: int = Field(8, ge=0, description="Rows added to the uncorrectable counter.")
    duration: Seconds | None = Field(None, gt=0)


class RowRemapPending(_GpuFault):
    """``DCGM_FI_DEV_ROW_REMAP_PENDING`` turns 1 for ``duration`` (a remap waits for the next GPU
    reset) and ``DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS`` grows by ``correctable_rows``."""

    fault: Literal["row_remap_pending"]
    correctable_rows: int = Field(1, ge=0, description="Rows added to the correctable counter.")
    duration: Seconds | None = Field(None, gt=0)


class EccDbe(_GpuFault):
    """Double-bit (uncorrectable) ECC errors: ``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`` (field 311) grows by
    ``count`` over ``duration``."""

    fault: Literal["ecc_dbe"]
    count: int = Field(2, ge=1, description="Double-bit errors added to the volatile total.")
    duration: Seconds = Field(1.0, gt=0, description="Seconds over which they come.")


class GpuSharing(_GpuFault):
    """The GPU is shared (time-slicing, MPS, DRA): ``pods`` pods hold it, and dcgm-exporter emits every
    series of the GPU once per pod (same ``UUID``, its own ``pod``/``namespace``/``container``). After
    ``duration`` every pod but the first ends and its series go, while the GPU stays."""

    fault: Literal["gpu_sharing"]
    pods: int = Field(2, ge=2, le=16, description="Pods sharing the GPU.")
    duration: Seconds | None = Field(None, gt=0, description="Seconds until the extra pods end.")


class Mig(_GpuFault):
    """The GPU runs in MIG mode: one series per GPU instance, labelled ``GPU_I_ID`` (1..``instances``)
    and ``GPU_I_PROFILE``, all with the GPU's ``UUID``."""

    fault: Literal["mig"]
    instances: int = Field(2, ge=1, le=7, description="GPU instances.")
    profile: str = Field("3g.40gb", pattern=r"^\d+g\.\d+gb$", description="MIG profile name.")


class NvlinkErrors(_GpuFault):
    """The NVLink error counters grow by the given counts, spread evenly over ``duration`` (the burst)."""

    fault: Literal["nvlink_errors"]
    crc_flit: int = Field(1500, ge=0, description="Added to ..._CRC_FLIT_ERROR_COUNT_TOTAL.")
    crc_data: int = Field(300, ge=0, description="Added to ..._CRC_DATA_ERROR_COUNT_TOTAL.")
    replay: int = Field(200, ge=0, description="Added to ..._REPLAY_ERROR_COUNT_TOTAL.")
    recovery: int = Field(0, ge=0, description="Added to ..._RECOVERY_ERROR_COUNT_TOTAL.")
    duration: Seconds = Field(30.0, gt=0, description="Length of the burst, seconds.")


class Nvlink5Errors(_GpuFault):
    """A Blackwell GPU's NVLink5 link error counters (DCGM fields 1204-1219) grow by the given counts
    over ``duration``; the fleet must have ``FleetConfig(nvlink5=True)`` for the exporter to show them.
    ``link_recovery`` counts recoveries that brought the link back, ``link_recovery_failed`` those
    that declared it down; both add to the link recovery events (1213)."""

    fault: Literal["nvlink5_errors"]
    link_recovery: int = Field(1, ge=0, description="Added to ..._LINK_RECOVERY_SUCCESSFUL_EVENTS.")
    link_recovery_failed: int = Field(0, ge=0, description="Added to ..._LINK_RECOVERY_FAILED_EVENTS.")
    rx_errors: int = Field(0, ge=0, description="Added to ..._RX_ERRORS.")
    rx_malformed_packet: int = Field(0, ge=0, description="Added to ..._RX_MALFORMED_PACKET_ERRORS.")
    rx_buffer_overrun: int = Field(0, ge=0, description="Added to ..._RX_BUFFER_OVERRUN_ERRORS.")
    rx_remote: int = Field(0, ge=0, description="Added to ..._RX_REMOTE_ERRORS.")
    rx_general: int = Field(0, ge=0, description="Added to ..._RX_GENERAL_ERRORS.")
    local_link_integrity: int = Field(0, ge=0, description="Added to ..._LOCAL_LINK_INTEGRITY_ERRORS.")
    effective_errors: int = Field(0, ge=0, description="Added to ..._EFFECTIVE_ERRORS (after FEC).")
    symbol_errors: int = Field(0, ge=0, description="Added to ..._RX_SYMBOL_ERRORS (before FEC).")
    duration: Seconds = Field(30.0, gt=0, description="Length of the burst, seconds.")


class PcieReplays(_GpuFault):
    """The GPU's PCIe replay counter (``DCGM_FI_DEV_PCIE_REPLAY_COUNTER``) grows by ``count`` over
    ``duration``: a marginal riser or slot retrying transfers. The default rule pack reads no PCIe
    counter; the demo catches this with a team's own Prometheus alert file."""

    fault: Literal["pcie_replays"]
    count: int = Field(2000, ge=0, description="Added to DCGM_FI_DEV_PCIE_REPLAY_COUNTER.")
    duration: Seconds = Field(30.0, gt=0, description="Length of the burst, seconds.")


class IbLinkFlap(_HcaFault):
    """The port goes down ``flaps`` times, ``interval`` apart: each time ``link_downed_total`` += 1,
    ``symbol_error_total`` += ``symbol_errors``, and for ``down_for`` the port reads state 1 (Down),
    physical state 2 (Polling) before returning to 4 (Active) / 5 (LinkUp)."""

    fault: Literal["ib_link_flap"]
    flaps: int = Field(1, ge=1, le=10_000)
    interval: Seconds = Field(30.0, gt=0, description="Seconds between flap starts.")
    down_for: Seconds = Field(5.0, gt=0, description="Seconds the port stays down per flap.")
    symbol_errors: int = Field(20, ge=0, description="Symbol errors counted per flap.")


class IbSymbolErrors(_HcaFault):
    """``symbol_error_total`` grows by ``count`` (and ``port_errors_received_total`` by
    ``port_rcv_errors``, ``link_error_recovery_total`` by ``link_error_recovery``) over ``duration``."""

    fault: Literal["ib_symbol_errors"]
    count: int = Field(5000, ge=0)
    port_rcv_errors: int = Field(0, ge=0)
    link_error_recovery: int = Field(0, ge=0)
    duration: Seconds = Field(60.0, gt=0, description="Length of the burst, seconds.")


class IbPortErrors(_HcaFault):
    """The port's sysfs ``counter`` grows by ``count`` over ``duration``, pinned at its maximum once it
    saturates (:data:`IB_COUNTER_BITS`: ``local_link_integrity_errors`` and
    ``excessive_buffer_overrun_errors`` stop at 15, ``link_downed`` at 255, ``symbol_error`` at
    65535), as the kernel reports it."""

    fault: Literal["ib_port_errors"]
    counter: IbCounter
    count: int = Field(..., ge=1)
    duration: Seconds = Field(1.0, gt=0, description="Seconds over which the errors come.")


class IbPortDown(_HcaFault):
    """The port reads state 1 (DOWN) and physical state 3 (Disabled) for ``duration``."""

    fault: Literal["ib_port_down"]
    duration: Seconds | None = Field(None, gt=0)


class IbHcaMissing(_HcaFault):
    """The HCA disappears (fell off the PCIe bus, driver lost it): node_exporter lists none of its
    series for ``duration``; in a sysfs tree its directory is gone."""

    fault: Literal["ib_hca_missing"]
    duration: Seconds | None = Field(None, gt=0)


class GpuMissing(_GpuFault):
    """Every series of the GPU disappears from the dcgm-exporter scrape (fell off the bus) for
    ``duration``."""

    fault: Literal["gpu_missing"]
    duration: Seconds | None = Field(None, gt=0)


class ExporterDown(_Fault):
    """The node's ``exporter`` endpoints fail for ``duration``: HTTP 503, or the connection is closed
    without an answer (``mode: connection_close``). Prometheus marks the target down; series vanish."""

    fault: Literal["exporter_down"]
    exporter: Exporter = "all"
    mode: Literal["http_503", "connection_close"] = "http_503"
    duration: Seconds | None = Field(None, gt=0)


class ExporterRestart(_Fault):
    """The node's ``exporter`` restarts at ``at``: endpoints fail (503) for ``duration`` seconds (0 = not
    noticeably), then every counter starts again from 0 and the sticky Xid gauge reads "No Error"."""

    fault: Literal["exporter_restart"]
    exporter: Exporter = "all"
    duration: Seconds = Field(0.0, ge=0, description="Seconds the endpoints answer 503.")


Fault = Annotated[
    HotGpu
    | ThermalSlowdown
    | SilentThrottle
    | Xid
    | RowRemapFailure
    | RowRemapPending
    | EccDbe
    | GpuSharing
    | Mig
    | NvlinkErrors
    | Nvlink5Errors
    | PcieReplays
    | IbLinkFlap
    | IbSymbolErrors
    | IbPortErrors
    | IbPortDown
    | IbHcaMissing
    | GpuMissing
    | ExporterDown
    | ExporterRestart,
    Field(discriminator="fault"),
]

#: Every fault kind, as written in the ``fault:`` key.
FAULT_KINDS: tuple[str, ...] = (
    "hot_gpu",
    "thermal_slowdown",
    "silent_throttle",
    "xid",
    "row_remap_failure",
    "row_remap_pending",
    "ecc_dbe",
    "gpu_sharing",
    "mig",
    "nvlink_errors",
    "nvlink5_errors",
    "pcie_replays",
    "ib_link_flap",
    "ib_symbol_errors",
    "ib_port_errors",
    "ib_port_down",
    "ib_hca_missing",
    "gpu_missing",
    "exporter_down",
    "exporter_restart",
)


class Scenario(BaseModel):
    """A list of faults. Build from YAML with :func:`load_scenario` / :func:`parse_scenario`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = ""
    description: str = ""
    faults: list[Fault] = Field(default_factory=list)

    _source: str = PrivateAttr("scenario")
    _lines: dict[int, int] = PrivateAttr(default_factory=dict)

    def faulted_nodes(self) -> frozenset[str]:
        """The nodes a fault other than ``noise`` strikes: those healer should take out and return."""
        return frozenset(f.node for f in self.faults if not f.noise)

    def where(self, index: int) -> str:
        """``file:line`` of fault ``index`` (or just the source name when lines are unknown)."""
        line = self._lines.get(index)
        return f"{self._source}:{line}" if line else self._source


def _node_lines(node: yaml.Node, path: tuple[Any, ...], out: dict[tuple[Any, ...], int]) -> None:
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                out[(*path, key.value)] = key.start_mark.line + 1
                _node_lines(value, (*path, key.value), out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _node_lines(item, (*path, i), out)


def _field_path(loc: tuple[Any, ...], error_type: str) -> tuple[str, tuple[Any, ...], str]:
    """(dotted field, yaml path, fault kind) of a pydantic error location."""
    parts: list[str] = []
    yaml_path: list[Any] = []
    kind = ""
    for i, item in enumerate(loc):
        if isinstance(item, int):
            parts.append(f"[{item}]")
            yaml_path.append(item)
        elif i >= 2 and loc[0] == "faults" and i == 2 and item in FAULT_KINDS:
            kind = str(item)  # the discriminated union's tag, not a key in the file
        else:
            parts.append(("." if parts else "") + str(item))
            yaml_path.append(item)
    if error_type in ("union_tag_invalid", "union_tag_not_found"):
        parts.append(".fault")
        yaml_path.append("fault")
    return "".join(parts) or "(root)", tuple(yaml_path), kind


def parse_scenario(text: str, *, source: str = "scenario") -> Scenario:
    """A :class:`Scenario` from YAML text; ``source`` names it in error messages.

    Raises:
        ScenarioError: not YAML, not a mapping, or any field invalid (every problem, with line).
    """
    try:
        data = yaml.safe_load(text)
        root = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ScenarioError([f"{source}{line}: not valid YAML: {exc}"]) from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ScenarioError([f"{source}: a scenario is a mapping with a 'faults' list"])
    lines: dict[tuple[Any, ...], int] = {}
    if root is not None:
        _node_lines(root, (), lines)
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            field, path, kind = _field_path(tuple(err["loc"]), err["type"])
            lineno = next((lines[path[:n]] for n in range(len(path), 0, -1) if path[:n] in lines), None)
            where = f"{source}:{lineno}" if lineno else source
            suffix = f" (fault {kind})" if kind else ""
            problems.append(f"{where}: {field}: {err['msg']}{suffix}")
        raise ScenarioError(problems) from exc
    scenario._source = source
    scenario._lines = {i: lines[("faults", i)] for i in range(len(scenario.faults)) if ("faults", i) in lines}
    return scenario


def load_scenario(path: Path | str) -> Scenario:
    """Read a scenario file; a bare name without suffix (``demo``) means a scenario shipped in the package.

    Raises:
        ScenarioError: the file is missing or invalid.
    """
    candidate = Path(path)
    if not candidate.exists() and candidate.suffix == "" and len(candidate.parts) == 1:
        candidate = SCENARIO_DIR / f"{candidate.name}.yaml"
    try:
        text = candidate.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError([f"{path}: cannot read the scenario file: {exc.strerror or exc}"]) from exc
    return parse_scenario(text, source=str(candidate))
