"""GPU facts from NVML, under the dcgm-exporter names the default rules read.

Every call goes through :class:`NvmlCalls`, one narrow interface: ``call(function, gpu, *args)``
names an NVML function of NVIDIA's Python bindings (``nvidia-ml-py``, module ``pynvml``; the
``agent`` extra installs it) and returns plain values (numbers, text, lists, dicts). Three
implementations:

* :class:`PynvmlCalls`: the real library (imported lazily: without it, or without the driver's
  ``libnvidia-ml.so.1``, :func:`open_nvml` raises :class:`NvmlUnavailable`, "NVML not available:
  ...", and the agent serves everything else);
* :class:`RecordedNvml`: a recorded device (JSON: each call and its answer or NVML error), the
  fixture tests read;
* :class:`RecordingNvml`: wraps another and records what it answers (``scripts/device-check.sh``
  records a real GPU that way, so a recording is a fixture taken from real hardware).

What is read, each fact beside the DCGM field of the same meaning (NVML API reference, ``nvml.h``
of the driver; DCGM ``dcgm_fields.h``), see :data:`FACTS`. A call NVML answers with an error
(``Not Supported`` on a GPU without the feature, ``GPU is lost`` after Xid 79) leaves that fact
out for that GPU and says why in :attr:`GpuReading.missing`: an absent series, as dcgm-exporter
does for an unsupported field, never a 0.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from healer.errors import HealerError

# NVML constants (nvml.h; the same values in pynvml). Written here so that a recorded device is
# read without the bindings installed.
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
#: nvmlNvLinkErrorCounter_t
NVML_NVLINK_ERROR_DL_REPLAY = 0
NVML_NVLINK_ERROR_DL_RECOVERY = 1
NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
NVML_NVLINK_ERROR_DL_CRC_DATA = 3
#: NVML_NVLINK_MAX_LINKS of nvml.h 13.x (18 before Blackwell's drivers).
NVML_NVLINK_MAX_LINKS = 36
#: Field ids (nvmlDeviceGetFieldValues): NVLink error totals over all links, GPU recovery action.
NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL = 38
NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL = 45
NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL = 52
NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL = 59
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
#: nvmlValueType_t → the member of nvmlValue_t that holds the value.
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3

#: The NVLink error counters per link: label value → nvmlNvLinkErrorCounter_t.
NVLINK_COUNTERS: dict[str, int] = {
    "replay": NVML_NVLINK_ERROR_DL_REPLAY,
    "recovery": NVML_NVLINK_ERROR_DL_RECOVERY,
    "crc_flit": NVML_NVLINK_ERROR_DL_CRC_FLIT,
    "crc_data": NVML_NVLINK_ERROR_DL_CRC_DATA,
}


class NvmlUnavailable(HealerError):
    """NVML cannot be used on this node: the bindings, the library or the driver is missing."""


class NvmlCallError(Exception):
    """NVML answered ``function`` with error ``code`` (nvmlReturn_t) and its text."""

    def __init__(self, function: str, code: int, text: str) -> None:
        super().__init__(f"{function}: {text} (NVML error {code})")
        self.function = function
        self.code = code
        self.text = text


class NvmlCalls(Protocol):
    """NVML, one function at a time."""

    def call(self, function: str, gpu: int | None, *args: int | list[int]) -> Any:
        """``function(handle of GPU gpu, *args)`` (``gpu`` None: a system function, no handle),
        its answer as plain values. Raises :class:`NvmlCallError`."""
        ...


def _plain(value: Any) -> Any:
    """A pynvml answer as JSON-able values: bytes decoded, ctypes structures as dicts, arrays of
    field values as lists with each value read from the member its ``valueType`` names."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    fields = getattr(value, "_fields_", None)
    if fields is not None:
        out: dict[str, Any] = {}
        for name, _ctype in fields:
            member = getattr(value, name)
            if name == "value" and hasattr(value, "valueType"):
                member = getattr(member, _VALUE_MEMBERS.get(int(value.valueType), "ullVal"))
            out[name] = _plain(member)
        return out
    if hasattr(value, "__len__") and hasattr(value, "__getitem__"):  # a ctypes array
        return [_plain(value[i]) for i in range(len(value))]
    return value


class PynvmlCalls:
    """The real NVML through ``pynvml`` (``nvidia-ml-py``), initialised once; GPU handles by index."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise NvmlUnavailable(
                f"NVML not available: the Python bindings are not installed ({exc}); "
                "install healer with the agent extra (pip install -e '.[agent]' in its source tree)"
            ) from None
        self._nvml: Any = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(
                f"NVML not available: nvmlInit failed: {exc} (is the NVIDIA driver loaded and "
                "libnvidia-ml.so.1 on the library path?)"
            ) from None
        self._handles: dict[int, Any] = {}

    def _handle(self, gpu: int) -> Any:
        if gpu not in self._handles:
            self._handles[gpu] = self._nvml.nvmlDeviceGetHandleByIndex(gpu)
        return self._handles[gpu]

    def call(self, function: str, gpu: int | None, *args: int | list[int]) -> Any:
        fn: Callable[..., Any] | None = getattr(self._nvml, function, None)
        if fn is None:  # bindings older than the function: as NVML answers for a missing symbol
            raise NvmlCallError(function, 13, "Function Not Found in the installed nvidia-ml-py")
        try:
            answer = fn(*args) if gpu is None else fn(self._handle(gpu), *args)
        except self._nvml.NVMLError as exc:
            raise NvmlCallError(function, int(exc.value), str(exc)) from None
        return _plain(answer)

    def close(self) -> None:
        self._nvml.nvmlShutdown()


def call_key(function: str, gpu: int | None, args: tuple[int | list[int], ...]) -> str:
    """How a recording names one call: ``nvmlDeviceGetTemperature [0, 0]`` (GPU, then the args)."""
    return f"{function} {json.dumps([gpu, *args])}"


@dataclass
class RecordedNvml:
    """A recorded NVML device: ``calls`` maps :func:`call_key` to ``{"value": ...}`` or
    ``{"error": code, "text": ...}``. A call the recording lacks answers NVML's "Function Not
    Found" (13), as an older driver would."""

    calls: dict[str, dict[str, Any]]
    source: str = "recording"

    @classmethod
    def load(cls, path: Path) -> RecordedNvml:
        """Read a recording. Raises NvmlUnavailable naming the file when it cannot be read or is not one."""
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise NvmlUnavailable(f"NVML not available: recorded device {path}: {exc}") from None
        calls = data.get("calls") if isinstance(data, dict) else None
        if not isinstance(calls, dict):
            raise NvmlUnavailable(f"NVML not available: recorded device {path}: no 'calls' object")
        return cls(calls=calls, source=str(path))

    def call(self, function: str, gpu: int | None, *args: int | list[int]) -> Any:
        answer = self.calls.get(call_key(function, gpu, args))
        if answer is None:
            raise NvmlCallError(function, 13, "Function Not Found (not in the recording)")
        if "error" in answer:
            raise NvmlCallError(function, int(answer["error"]), str(answer.get("text", "")))
        return answer.get("value")


@dataclass
class RecordingNvml:
    """Passes calls to ``inner`` and records each answer (or error) as :class:`RecordedNvml` reads it."""

    inner: NvmlCalls
    calls: dict[str, dict[str, Any]] = field(default_factory=dict)

    def call(self, function: str, gpu: int | None, *args: int | list[int]) -> Any:
        key = call_key(function, gpu, args)
        try:
            value = self.inner.call(function, gpu, *args)
        except NvmlCallError as exc:
            self.calls[key] = {"error": exc.code, "text": exc.text}
            raise
        self.calls[key] = {"value": value}
        return value

    def dump(self) -> dict[str, Any]:
        return {"calls": dict(sorted(self.calls.items()))}


@dataclass(frozen=True)
class Fact:
    """One GPU fact the default rules read, as the agent reads it from NVML.

    ``metric`` is the dcgm-exporter name (the DCGM field of the same meaning), ``kind`` its
    Prometheus type, ``unit`` the unit of the exported value, ``nvml`` the NVML call it comes from.
    """

    metric: str
    kind: str
    unit: str
    nvml: str
    read: Callable[[NvmlCalls, int], float]


def _field(field_id: int) -> Callable[[NvmlCalls, int], float]:
    def read(nvml: NvmlCalls, gpu: int) -> float:
        values = nvml.call("nvmlDeviceGetFieldValues", gpu, [field_id])
        value = values[0]
        if int(value["nvmlReturn"]) != NVML_SUCCESS:
            raise NvmlCallError("nvmlDeviceGetFieldValues", int(value["nvmlReturn"]), f"field {field_id}")
        return float(value["value"])

    return read


def _clock_events(nvml: NvmlCalls, gpu: int) -> float:
    try:
        return float(nvml.call("nvmlDeviceGetCurrentClocksEventReasons", gpu))
    except NvmlCallError as exc:
        if exc.code != 13:  # older drivers know only the "throttle reasons" name, same bits
            raise
        return float(nvml.call("nvmlDeviceGetCurrentClocksThrottleReasons", gpu))


#: The facts read per GPU. Units: NVML's nvmlDeviceGetPowerUsage is milliwatts, DCGM's
#: POWER_USAGE watts (divided here); temperatures and margins degrees C; the clock event bitmask
#: has the same bits in NVML (nvmlClocksEventReasons) and DCGM (field 112); row and ECC counts
#: are counts since the driver loaded (volatile) or the GPU's life (remapped rows).
FACTS: tuple[Fact, ...] = (
    Fact(
        "DCGM_FI_DEV_GPU_TEMP",
        "gauge",
        "degrees C",
        "nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)",
        lambda n, g: float(n.call("nvmlDeviceGetTemperature", g, NVML_TEMPERATURE_GPU)),
    ),
    Fact(
        "DCGM_FI_DEV_GPU_TEMP_LIMIT",
        "gauge",
        "degrees C below the slowdown point",
        "nvmlDeviceGetMarginTemperature",
        lambda n, g: float(n.call("nvmlDeviceGetMarginTemperature", g)),
    ),
    Fact(
        "DCGM_FI_DEV_POWER_USAGE",
        "gauge",
        "W",
        "nvmlDeviceGetPowerUsage (mW) / 1000",
        lambda n, g: float(n.call("nvmlDeviceGetPowerUsage", g)) / 1000.0,
    ),
    Fact(
        "DCGM_FI_DEV_SM_CLOCK",
        "gauge",
        "MHz",
        "nvmlDeviceGetClockInfo(NVML_CLOCK_SM)",
        lambda n, g: float(n.call("nvmlDeviceGetClockInfo", g, NVML_CLOCK_SM)),
    ),
    Fact(
        "DCGM_FI_DEV_GPU_UTIL",
        "gauge",
        "%",
        "nvmlDeviceGetUtilizationRates().gpu",
        lambda n, g: float(n.call("nvmlDeviceGetUtilizationRates", g)["gpu"]),
    ),
    Fact(
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "gauge",
        "bitmask",
        "nvmlDeviceGetCurrentClocksEventReasons",
        _clock_events,
    ),
    Fact(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "counter",
        "count",
        "nvmlDeviceGetPcieReplayCounter",
        lambda n, g: float(n.call("nvmlDeviceGetPcieReplayCounter", g)),
    ),
    Fact(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "counter",
        "count",
        "nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE_ECC)",
        lambda n, g: float(
            n.call("nvmlDeviceGetTotalEccErrors", g, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC)
        ),
    ),
    Fact(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "rows",
        "nvmlDeviceGetRemappedRows()[0]",
        lambda n, g: float(n.call("nvmlDeviceGetRemappedRows", g)[0]),
    ),
    Fact(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "rows",
        "nvmlDeviceGetRemappedRows()[1]",
        lambda n, g: float(n.call("nvmlDeviceGetRemappedRows", g)[1]),
    ),
    Fact(
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "gauge",
        "0 or 1",
        "nvmlDeviceGetRemappedRows()[2]",
        lambda n, g: float(n.call("nvmlDeviceGetRemappedRows", g)[2]),
    ),
    Fact(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "gauge",
        "0 or 1",
        "nvmlDeviceGetRemappedRows()[3]",
        lambda n, g: float(n.call("nvmlDeviceGetRemappedRows", g)[3]),
    ),
    Fact(
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "counter",
        "count",
        "field NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL (38)",
        _field(NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL),
    ),
    Fact(
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "counter",
        "count",
        "field NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL (45)",
        _field(NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL),
    ),
    Fact(
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "counter",
        "count",
        "field NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL (52)",
        _field(NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL),
    ),
    Fact(
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "counter",
        "count",
        "field NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL (59)",
        _field(NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL),
    ),
    Fact(
        "DCGM_FI_DEV_GPU_RECOVERY_ACTION",
        "gauge",
        "0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset",
        "field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (230)",
        _field(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION),
    ),
)


@dataclass(frozen=True)
class GpuReading:
    """One GPU as NVML answered: identity, the :data:`FACTS` read (metric → value), NVLink error
    counters per link (``(link, counter)`` → count), and each fact left out with NVML's reason."""

    index: int
    uuid: str
    model: str
    pci_bus_id: str
    minor: int | None
    values: Mapping[str, float]
    nvlink: Mapping[tuple[int, str], int]
    missing: Mapping[str, str]


@dataclass(frozen=True)
class NvmlReading:
    """Every GPU NVML lists, and the driver version (``DCGM_FI_DRIVER_VERSION``)."""

    driver_version: str
    gpus: tuple[GpuReading, ...]


def _nvlink(nvml: NvmlCalls, gpu: int) -> dict[tuple[int, str], int]:
    out: dict[tuple[int, str], int] = {}
    for link in range(NVML_NVLINK_MAX_LINKS):
        try:
            nvml.call("nvmlDeviceGetNvLinkState", gpu, link)
        except NvmlCallError:
            continue  # no such link on this GPU (Not Supported / Invalid Argument)
        for name, counter in NVLINK_COUNTERS.items():
            try:
                out[(link, name)] = int(nvml.call("nvmlDeviceGetNvLinkErrorCounter", gpu, link, counter))
            except NvmlCallError:
                continue
    return out


def read_nvml(nvml: NvmlCalls) -> NvmlReading:
    """Read every GPU. Raises NvmlCallError only when the GPUs cannot be listed (count, identity);
    a fact NVML refuses is left out of that GPU's values (:attr:`GpuReading.missing`)."""
    driver = str(nvml.call("nvmlSystemGetDriverVersion", None))
    gpus: list[GpuReading] = []
    for index in range(int(nvml.call("nvmlDeviceGetCount", None))):
        pci = nvml.call("nvmlDeviceGetPciInfo", index)
        try:
            minor: int | None = int(nvml.call("nvmlDeviceGetMinorNumber", index))
        except NvmlCallError:
            minor = None
        values: dict[str, float] = {}
        missing: dict[str, str] = {}
        for fact in FACTS:
            try:
                values[fact.metric] = fact.read(nvml, index)
            except NvmlCallError as exc:
                missing[fact.metric] = str(exc)
        gpus.append(
            GpuReading(
                index=index,
                uuid=str(nvml.call("nvmlDeviceGetUUID", index)),
                model=str(nvml.call("nvmlDeviceGetName", index)),
                pci_bus_id=str(pci["busId"]).upper(),
                minor=minor,
                values=values,
                nvlink=_nvlink(nvml, index),
                missing=missing,
            )
        )
    return NvmlReading(driver_version=driver, gpus=tuple(gpus))


def open_nvml(recorded: Path | None = None) -> NvmlCalls:
    """The recorded device at ``recorded``, else the real NVML. Raises NvmlUnavailable ("NVML not
    available: ...") when neither can be used."""
    if recorded is not None:
        return RecordedNvml.load(recorded)
    return PynvmlCalls()
