"""The physics of one simulated node: metric values as a pure function of (seed, faults, elapsed seconds).

Nothing here reads a clock or keeps state between calls: :meth:`NodeModel.gpu_values` and
:meth:`NodeModel.ib_values` at the same ``t`` always return the same numbers, so tests can ask for
"the scrape at t = 95 s" and a replay gives the same run.

Healthy behaviour (an 8 x H100 node running a training job):

* GPU temperature 58..70 C (a per-GPU base 61..67 C, a slow +-2 C swing over 15 min, +-0.8 C noise);
  memory temperature 6..10 C above it; power 590..700 W; SM clock 1980 MHz; GPU util 100 %;
  graphics engine ~0.975, tensor pipe ~0.41 (+-0.015); framebuffer ~75 GiB used; error counters 0.
* An idle node (``idle=True``): ~34 C, ~70 W, SM clock 345 MHz, util 0, clock event bit 0x1
  (gpu_idle, which is not throttling), activity 0, no workload labels.
* InfiniBand ports Active (4) / LinkUp (5) at 50 GB/s, data counters growing ~8-12 GB/s, error
  counters 0.

Noise comes from one table of pseudo-random numbers in [-1, 1] drawn from the seed; each series reads
it at its own offset plus the whole second, so a value changes once per second.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from healer_dev.simulator import catalog as c
from healer_dev.simulator.scenario import (
    IB_COUNTER_BITS,
    EccDbe,
    ExporterDown,
    ExporterRestart,
    Fault,
    GpuMissing,
    GpuSharing,
    HotGpu,
    IbHcaMissing,
    IbLinkFlap,
    IbPortDown,
    IbPortErrors,
    IbSymbolErrors,
    Mig,
    Nvlink5Errors,
    NvlinkErrors,
    PcieReplays,
    RowRemapFailure,
    RowRemapPending,
    SilentThrottle,
    ThermalSlowdown,
    Xid,
)

_TABLE_BITS = 12
_MASK = (1 << _TABLE_BITS) - 1
_TWO_PI = 2 * math.pi
#: Period of the slow temperature swing, seconds.
_SWING_PERIOD = 900.0

_SM = "DCGM_FI_DEV_SM_CLOCK"
_MEM_CLOCK = "DCGM_FI_DEV_MEM_CLOCK"
_TEMP = "DCGM_FI_DEV_GPU_TEMP"
_MTEMP = "DCGM_FI_DEV_MEMORY_TEMP"
_POWER = "DCGM_FI_DEV_POWER_USAGE"
_ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
_UTIL = "DCGM_FI_DEV_GPU_UTIL"
_FB_FREE = "DCGM_FI_DEV_FB_FREE"
_FB_USED = "DCGM_FI_DEV_FB_USED"
_GR = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
_TENSOR = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
_REASONS = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
_PCIE = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"
_FLIT = "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"
_DATA = "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"
_REPLAY = "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"
_RECOVERY = "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"
_NV5 = "DCGM_FI_DEV_NVLINK_COUNT_"
#: Nvlink5Errors field → the NVLink5 counter it adds to (the recovery events are added separately).
_NV5_FIELDS = {
    "rx_errors": _NV5 + "RX_ERRORS",
    "rx_malformed_packet": _NV5 + "RX_MALFORMED_PACKET_ERRORS",
    "rx_buffer_overrun": _NV5 + "RX_BUFFER_OVERRUN_ERRORS",
    "rx_remote": _NV5 + "RX_REMOTE_ERRORS",
    "rx_general": _NV5 + "RX_GENERAL_ERRORS",
    "local_link_integrity": _NV5 + "LOCAL_LINK_INTEGRITY_ERRORS",
    "effective_errors": _NV5 + "EFFECTIVE_ERRORS",
    "symbol_errors": _NV5 + "RX_SYMBOL_ERRORS",
    "link_recovery": _NV5 + "LINK_RECOVERY_SUCCESSFUL_EVENTS",
    "link_recovery_failed": _NV5 + "LINK_RECOVERY_FAILED_EVENTS",
}
_NV5_RECOVERY = _NV5 + "LINK_RECOVERY_EVENTS"
_REMAP_FAIL = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
_UNCORR = "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"
_REMAP_PENDING = "DCGM_FI_DEV_ROW_REMAP_PENDING"
_CORR = "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"
_DBE = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"

_IB = "node_infiniband_"
_IB_STATE = _IB + "state_id"
_IB_PHYS = _IB + "physical_state_id"
_IB_RATE = _IB + "rate_bytes_per_second"
_IB_SYMBOL = _IB + "symbol_error_total"
_IB_DOWNED = _IB + "link_downed_total"
_IB_RECOVERY = _IB + "link_error_recovery_total"
_IB_RCV_ERR = _IB + "port_errors_received_total"
_IB_WAIT = _IB + "port_transmit_wait_total"
_IB_RX = _IB + "port_data_received_bytes_total"
_IB_TX = _IB + "port_data_transmitted_bytes_total"
_IB_RX_PKT = _IB + "port_packets_received_total"
_IB_TX_PKT = _IB + "port_packets_transmitted_total"
_IB_INTEGRITY = _IB + "local_link_integrity_errors_total"
_IB_OVERRUN = _IB + "excessive_buffer_overrun_errors_total"

#: node_exporter family of each sysfs error counter (``collector/infiniband_linux.go``).
IB_COUNTER_FAMILIES: dict[str, str] = {
    "symbol_error": _IB_SYMBOL,
    "port_rcv_errors": _IB_RCV_ERR,
    "link_downed": _IB_DOWNED,
    "link_error_recovery": _IB_RECOVERY,
    "local_link_integrity_errors": _IB_INTEGRITY,
    "excessive_buffer_overrun_errors": _IB_OVERRUN,
}


def noise_table(seed: int) -> tuple[float, ...]:
    """4096 pseudo-random numbers in [-1, 1] (clipped normal, sigma 0.45) drawn from ``seed``."""
    rng = random.Random(f"healer-simulator-noise:{seed}")
    return tuple(max(-1.0, min(1.0, rng.gauss(0.0, 0.45))) for _ in range(_MASK + 1))


def _ramp(elapsed: float, ramp: float) -> float:
    """Fraction 0..1 of a linear ramp ``elapsed`` seconds into a ``ramp``-second climb."""
    if ramp <= 0 or elapsed >= ramp:
        return 1.0
    return max(0.0, elapsed / ramp)


def _active(fault: Fault, t: float) -> bool:
    duration = getattr(fault, "duration", None)
    return fault.at <= t and (duration is None or t < fault.at + duration)


@dataclass
class GpuSample:
    """The dcgm-exporter view of one node at one time.

    ``present`` lists the GPU indices the exporter reports; ``values`` maps a DCGM field name to one
    value per GPU index (ints for ``%d`` fields, floats for ``%f`` fields; absent GPUs included);
    ``xid[g]`` is the Xid the sticky gauge shows (0 = "No Error"); ``xid_counts`` maps (GPU, Xid) to the
    number of those Xids in the exporter's trailing window (``DCGM_EXP_XID_ERRORS_COUNT``).
    ``pods[g]`` is how many pods share GPU ``g`` (only GPUs under a ``gpu_sharing`` fault);
    ``mig[g]`` is (instances, profile) of a GPU in MIG mode.
    """

    present: tuple[int, ...]
    values: dict[str, list[int] | list[float]]
    xid: list[int]
    xid_counts: dict[tuple[int, int], int] = field(default_factory=dict)
    pods: dict[int, int] = field(default_factory=dict)
    mig: dict[int, tuple[int, str]] = field(default_factory=dict)


@dataclass
class NodeModel:
    """Metric values of one node, a pure function of the elapsed time ``t`` (seconds since the run began).

    Build with :meth:`build`; ``faults`` are this node's faults, already checked against the fleet.
    """

    index: int
    gpus: int
    hcas: int
    idle: bool
    table: Sequence[float]
    faults: Sequence[Fault] = ()
    temp_base: list[float] = field(default_factory=list)
    mem_delta: list[float] = field(default_factory=list)
    power_base: list[float] = field(default_factory=list)
    fb_used_base: list[int] = field(default_factory=list)
    phase: list[float] = field(default_factory=list)
    offset: list[int] = field(default_factory=list)
    energy0: list[int] = field(default_factory=list)
    ib_rate: list[float] = field(default_factory=list)
    ib_rx0: list[int] = field(default_factory=list)
    ib_tx0: list[int] = field(default_factory=list)
    ib_wait0: list[int] = field(default_factory=list)
    ib_wait_rate: list[float] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        *,
        seed: int,
        index: int,
        gpus: int,
        hcas: int,
        idle: bool,
        table: Sequence[float],
        faults: Sequence[Fault] = (),
    ) -> NodeModel:
        """The model of node ``index``: per-GPU and per-HCA baselines drawn from (seed, index)."""
        rng = random.Random(f"healer-simulator-node:{seed}:{index}")
        m = cls(index=index, gpus=gpus, hcas=hcas, idle=idle, table=table, faults=tuple(faults))
        for _ in range(gpus):
            m.temp_base.append(rng.uniform(32.0, 36.0) if idle else rng.uniform(61.0, 67.0))
            m.mem_delta.append(rng.uniform(6.0, 10.0))
            m.power_base.append(rng.uniform(66.0, 74.0) if idle else rng.uniform(615.0, 670.0))
            m.fb_used_base.append(0 if idle else rng.randint(73_500, 76_500))
            m.phase.append(rng.uniform(0.0, _TWO_PI))
            m.offset.append(rng.randrange(_MASK + 1))
            m.energy0.append(rng.randint(10**11, 9 * 10**11))
        for _ in range(hcas):
            m.ib_rate.append(0.0 if idle else rng.uniform(8e9, 12e9))
            m.ib_rx0.append(4 * rng.randint(10**12, 2 * 10**13))
            m.ib_tx0.append(4 * rng.randint(10**12, 2 * 10**13))
            m.ib_wait0.append(rng.randint(10**5, 5 * 10**6))
            m.ib_wait_rate.append(0.0 if idle else rng.uniform(50.0, 400.0))
        return m

    # --- exporter availability ----------------------------------------------------------------

    def failure(self, exporter: str, t: float) -> str | None:
        """How the ``exporter`` (``dcgm`` or ``node``) endpoint fails at ``t``: ``http_503``,
        ``connection_close``, or None when it answers."""
        for f in self.faults:
            if isinstance(f, ExporterDown) and f.exporter in (exporter, "all") and _active(f, t):
                return f.mode
            if (
                isinstance(f, ExporterRestart)
                and f.exporter in (exporter, "all")
                and f.at <= t < f.at + f.duration
            ):
                return "http_503"
        return None

    def _last_restart(self, exporter: str, t: float) -> float | None:
        starts = [
            f.at
            for f in self.faults
            if isinstance(f, ExporterRestart) and f.exporter in (exporter, "all") and f.at <= t
        ]
        return max(starts) if starts else None

    # --- dcgm-exporter ------------------------------------------------------------------------

    def gpu_values(self, t: float) -> GpuSample:
        """What dcgm-exporter reports at ``t`` (see :class:`GpuSample`)."""
        gauges = self._gauges(t)
        counters = self._gpu_counters(t)
        restart = self._last_restart("dcgm", t)
        if restart is not None:
            before = self._gpu_counters(restart)
            for name, values in counters.items():
                counters[name] = [v - b for v, b in zip(values, before[name], strict=True)]
        gauges.update(counters)
        xid = [0] * self.gpus
        latest = [-1.0] * self.gpus
        counts: dict[tuple[int, int], int] = {}
        window = c.XID_COUNT_WINDOW_MS / 1000
        missing: set[int] = set()
        pods: dict[int, int] = {}
        mig: dict[int, tuple[int, str]] = {}
        for f in self.faults:
            # a restarted exporter has seen no Xid yet
            if (
                isinstance(f, Xid)
                and f.at <= t
                and f.gpu < self.gpus
                and (restart is None or f.at >= restart)
            ):
                if f.at >= latest[f.gpu]:
                    xid[f.gpu], latest[f.gpu] = f.code, f.at
                if t - f.at < window:
                    counts[(f.gpu, f.code)] = counts.get((f.gpu, f.code), 0) + 1
            elif isinstance(f, GpuMissing) and _active(f, t):
                missing.add(f.gpu)
            elif isinstance(f, GpuSharing) and f.at <= t and f.gpu < self.gpus:
                pods[f.gpu] = f.pods if _active(f, t) else 1
            elif isinstance(f, Mig) and f.at <= t and f.gpu < self.gpus:
                mig[f.gpu] = (f.instances, f.profile)
        present = tuple(g for g in range(self.gpus) if g not in missing)
        return GpuSample(present=present, values=gauges, xid=xid, xid_counts=counts, pods=pods, mig=mig)

    def _gauges(self, t: float) -> dict[str, list[int] | list[float]]:
        n = self.gpus
        table, tick = self.table, int(t)
        temp: list[int] = []
        mtemp: list[int] = []
        power: list[float] = []
        gr: list[float] = []
        tensor: list[float] = []
        fb_used: list[int] = []
        for g in range(n):
            o = self.offset[g] + tick
            if self.idle:
                slow = 0.0
                gr.append(0.0)
                tensor.append(0.0)
                fb_used.append(0)
            else:
                slow = 2.0 * math.sin(_TWO_PI * t / _SWING_PERIOD + self.phase[g])
                gr.append(min(1.0, 0.975 + 0.008 * table[(o + 307) & _MASK]))
                tensor.append(0.41 + 0.015 * table[(o + 401) & _MASK])
                fb_used.append(self.fb_used_base[g] + int(60 * table[(o + 503) & _MASK]))
            tc = self.temp_base[g] + slow + 0.8 * table[o & _MASK]
            temp.append(round(tc))
            mtemp.append(round(tc + self.mem_delta[g] + 0.5 * table[(o + 101) & _MASK]))
            power.append(self.power_base[g] + 4.0 * slow + 18.0 * table[(o + 211) & _MASK])
        if self.idle:
            sm = [c.SM_CLOCK_IDLE_MHZ] * n
            util = [0] * n
            reasons = [c.CLOCK_EVENT_GPU_IDLE] * n
        else:
            sm = [c.SM_CLOCK_MAX_MHZ] * n
            util = [100] * n
            reasons = [c.CLOCK_EVENT_SW_POWER_CAP] * n
        remap = [0] * n
        pending = [0] * n
        for f in self.faults:
            if f.at > t or getattr(f, "gpu", n) >= n:
                continue
            if isinstance(f, HotGpu) and _active(f, t):
                g = f.gpu
                frac = _ramp(t - f.at, f.ramp)
                hot = f.target + 0.8 * table[(self.offset[g] + tick) & _MASK]
                new = (temp[g] + (hot - temp[g]) * frac) if frac < 1.0 else hot
                temp[g], mtemp[g] = round(new), round(mtemp[g] + new - temp[g])
            elif isinstance(f, ThermalSlowdown) and _active(f, t):
                g = f.gpu
                reasons[g] |= f.reasons
                share = min(1.0, f.sm_clock / sm[g]) if sm[g] else 1.0
                sm[g] = f.sm_clock
                tensor[g] *= share
                power[g] *= 0.5 + 0.5 * share
            elif isinstance(f, SilentThrottle) and _active(f, t):
                g = f.gpu
                frac = _ramp(t - f.at, f.ramp)
                low = f.tensor_active + 0.01 * table[(self.offset[g] + tick + 409) & _MASK]
                tensor[g] = max(0.0, tensor[g] + (low - tensor[g]) * frac)
            elif isinstance(f, RowRemapFailure) and _active(f, t):
                remap[f.gpu] = 1
            elif isinstance(f, RowRemapPending) and _active(f, t):
                pending[f.gpu] = 1
        fb_total = c.FB_TOTAL_MIB - c.FB_RESERVED_MIB
        return {
            _SM: sm,
            _MEM_CLOCK: [c.MEM_CLOCK_MHZ] * n,
            _TEMP: temp,
            _MTEMP: mtemp,
            _POWER: power,
            _UTIL: util,
            _FB_FREE: [fb_total - u for u in fb_used],
            _FB_USED: fb_used,
            _GR: gr,
            _TENSOR: tensor,
            _REASONS: reasons,
            _REMAP_FAIL: remap,
            _REMAP_PENDING: pending,
        }

    def _gpu_counters(self, t: float) -> dict[str, list[int]]:
        """Counters before any exporter restart is applied (monotonic in ``t``)."""
        n = self.gpus
        counters = {name: [0] * n for name in (_PCIE, _FLIT, _DATA, _REPLAY, _RECOVERY, _UNCORR, _CORR, _DBE)}
        counters.update({fam.name: [0] * n for fam in c.NVLINK5_FAMILIES})
        counters[_ENERGY] = [self.energy0[g] + int(self.power_base[g] * t * 1000) for g in range(n)]
        for f in self.faults:
            if f.at > t or getattr(f, "gpu", n) >= n:
                continue
            if isinstance(f, NvlinkErrors):
                frac = _ramp(t - f.at, f.duration)
                g = f.gpu
                counters[_FLIT][g] += int(f.crc_flit * frac)
                counters[_DATA][g] += int(f.crc_data * frac)
                counters[_REPLAY][g] += int(f.replay * frac)
                counters[_RECOVERY][g] += int(f.recovery * frac)
            elif isinstance(f, Nvlink5Errors):
                frac = _ramp(t - f.at, f.duration)
                for name, metric in _NV5_FIELDS.items():
                    counters[metric][f.gpu] += int(getattr(f, name) * frac)
                counters[_NV5_RECOVERY][f.gpu] += int((f.link_recovery + f.link_recovery_failed) * frac)
            elif isinstance(f, PcieReplays):
                counters[_PCIE][f.gpu] += int(f.count * _ramp(t - f.at, f.duration))
            elif isinstance(f, RowRemapFailure):
                counters[_UNCORR][f.gpu] += f.uncorrectable_rows
            elif isinstance(f, RowRemapPending):
                counters[_CORR][f.gpu] += f.correctable_rows
            elif isinstance(f, EccDbe):
                counters[_DBE][f.gpu] += int(f.count * _ramp(t - f.at, f.duration))
        return counters

    # --- node_exporter InfiniBand -------------------------------------------------------------

    def ib_present(self, t: float) -> tuple[int, ...]:
        """The HCAs listed at ``t`` (an ``ib_hca_missing`` fault removes one)."""
        gone = {int(f.hca[5:]) for f in self.faults if isinstance(f, IbHcaMissing) and _active(f, t)}
        return tuple(h for h in range(self.hcas) if h not in gone)

    def ib_values(self, t: float) -> dict[str, list[int] | list[float]]:
        """node_exporter's InfiniBand values at ``t``: metric name → one value per HCA (``mlx5_<i>``),
        listed or not (see :meth:`ib_present`). Error counters stop at their sysfs width."""
        values: dict[str, list[int] | list[float]] = {}
        counters = self._ib_counters(t)
        restart = self._last_restart("node", t)
        if restart is not None:
            before = self._ib_counters(restart)
            for name, vals in counters.items():
                counters[name] = [v - b for v, b in zip(vals, before[name], strict=True)]
        state = [c.IB_STATE_ACTIVE] * self.hcas
        phys = [c.IB_PHYS_LINK_UP] * self.hcas
        for f in self.faults:
            if isinstance(f, IbLinkFlap) and f.at <= t:
                h = int(f.hca[5:])
                if h >= self.hcas:
                    continue
                started = min(f.flaps, int((t - f.at) // f.interval) + 1)
                if t - (f.at + (started - 1) * f.interval) < f.down_for:
                    state[h], phys[h] = c.IB_STATE_DOWN, c.IB_PHYS_POLLING
            elif isinstance(f, IbPortDown) and _active(f, t) and int(f.hca[5:]) < self.hcas:
                state[int(f.hca[5:])], phys[int(f.hca[5:])] = c.IB_STATE_DOWN, c.IB_PHYS_DISABLED
        values[_IB_STATE] = state
        values[_IB_PHYS] = phys
        values[_IB_RATE] = [c.IB_RATE_BYTES_PER_SECOND] * self.hcas
        values.update(counters)
        return values

    def _ib_counters(self, t: float) -> dict[str, list[int]]:
        n = self.hcas
        counters = {f.name: [0] * n for f in c.IB_FAMILIES if f.type == "counter"}
        for h in range(n):
            # sysfs counts 4-byte words; node_exporter multiplies by 4
            rx = self.ib_rx0[h] + 4 * int(self.ib_rate[h] * t / 4)
            tx = self.ib_tx0[h] + 4 * int(self.ib_rate[h] * 0.98 * t / 4)
            counters[_IB_RX][h] = rx
            counters[_IB_TX][h] = tx
            counters[_IB_RX_PKT][h] = rx // 4096
            counters[_IB_TX_PKT][h] = tx // 4096
            counters[_IB_WAIT][h] = self.ib_wait0[h] + int(self.ib_wait_rate[h] * t)
        for f in self.faults:
            if f.at > t or not isinstance(f, IbLinkFlap | IbSymbolErrors | IbPortErrors):
                continue
            h = int(f.hca[5:])
            if h >= n:
                continue
            if isinstance(f, IbPortErrors):
                counters[IB_COUNTER_FAMILIES[f.counter]][h] += int(f.count * _ramp(t - f.at, f.duration))
            elif isinstance(f, IbLinkFlap):
                started = min(f.flaps, int((t - f.at) // f.interval) + 1)
                counters[_IB_DOWNED][h] += started
                counters[_IB_SYMBOL][h] += started * f.symbol_errors
            else:
                frac = _ramp(t - f.at, f.duration)
                counters[_IB_SYMBOL][h] += int(f.count * frac)
                counters[_IB_RCV_ERR][h] += int(f.port_rcv_errors * frac)
                counters[_IB_RECOVERY][h] += int(f.link_error_recovery * frac)
        # sysfs counters saturate at their width instead of wrapping
        for counter, bits in IB_COUNTER_BITS.items():
            top = (1 << bits) - 1
            values = counters[IB_COUNTER_FAMILIES[counter]]
            counters[IB_COUNTER_FAMILIES[counter]] = [min(v, top) for v in values]
        return counters
