"""A simulated node's InfiniBand HCAs as the sysfs tree the real node_exporter reads.

Layout (Linux ``drivers/infiniband/core/sysfs.c``; node_exporter ``--path.sysfs=<root>``)::

    <root>/class/infiniband/<dev>/{board_id,fw_ver,hca_type}
    <root>/class/infiniband/<dev>/ports/1/{state,phys_state,rate}
    <root>/class/infiniband/<dev>/ports/1/counters/<name>

Values are the simulator's (:meth:`~healer_dev.simulator.model.NodeModel.ib_values`), so a scenario
drives the real exporter: a port DOWN is ``1: DOWN`` in ``state``, an HCA gone is a directory gone,
and error counters stop at their width as the kernel's do. Data counters are written in 4-byte
words (node_exporter multiplies ``port_rcv_data``/``port_xmit_data`` by 4).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from healer_dev.node_exporter import run_node_exporters
from healer_dev.simulator import catalog as c
from healer_dev.simulator.fleet import Fleet

_IB = "node_infiniband_"

#: node_exporter family → (sysfs counter file, divisor): what the exporter reads to make each family.
SYSFS_COUNTERS: dict[str, tuple[str, int]] = {
    _IB + "excessive_buffer_overrun_errors_total": ("excessive_buffer_overrun_errors", 1),
    _IB + "link_downed_total": ("link_downed", 1),
    _IB + "link_error_recovery_total": ("link_error_recovery", 1),
    _IB + "local_link_integrity_errors_total": ("local_link_integrity_errors", 1),
    _IB + "port_constraint_errors_received_total": ("port_rcv_constraint_errors", 1),
    _IB + "port_constraint_errors_transmitted_total": ("port_xmit_constraint_errors", 1),
    _IB + "port_data_received_bytes_total": ("port_rcv_data", 4),
    _IB + "port_data_transmitted_bytes_total": ("port_xmit_data", 4),
    _IB + "port_discards_received_total": ("port_rcv_discards", 1),
    _IB + "port_discards_transmitted_total": ("port_xmit_discards", 1),
    _IB + "port_errors_received_total": ("port_rcv_errors", 1),
    _IB + "port_packets_received_total": ("port_rcv_packets", 1),
    _IB + "port_packets_transmitted_total": ("port_xmit_packets", 1),
    _IB + "port_receive_remote_physical_errors_total": ("port_rcv_remote_physical_errors", 1),
    _IB + "port_receive_switch_relay_errors_total": ("port_rcv_switch_relay_errors", 1),
    _IB + "port_transmit_wait_total": ("port_xmit_wait", 1),
    _IB + "symbol_error_total": ("symbol_error", 1),
    _IB + "vl15_dropped_total": ("VL15_dropped", 1),
}

#: Counters that move on a healthy busy port every second (traffic, not errors): a feeder may
#: refresh them less often than the rest (:class:`SysfsFeeder` ``traffic_every``).
TRAFFIC_COUNTERS = frozenset(
    {"port_rcv_data", "port_xmit_data", "port_rcv_packets", "port_xmit_packets", "port_xmit_wait"}
)

#: ``state`` and ``phys_state`` texts by id (Linux ``drivers/infiniband/core/sysfs.c``).
PORT_STATES = {0: "0: NOP", 1: "1: DOWN", 2: "2: INIT", 3: "3: ARMED", 4: "4: ACTIVE", 5: "5: ACTIVE_DEFER"}
PHYS_STATES = {
    1: "1: Sleep",
    2: "2: Polling",
    3: "3: Disabled",
    4: "4: PortConfigurationTraining",
    5: "5: LinkUp",
    6: "6: LinkErrorRecovery",
    7: "7: Phy Test",
}


class SysfsTree:
    """The sysfs tree of one simulated node under ``root``; :meth:`write` brings it to time ``t``.

    Only files whose text changed are rewritten, each atomically (written under ``root/.tmp``, then
    renamed into place), so node_exporter never reads half a file. Not thread-safe: one writer per
    tree. Paths are plain strings and I/O is ``os``-level: a 64-node fleet rewrites ~2500 traffic
    counters every tick.
    """

    def __init__(self, fleet: Fleet, node: str, root: Path) -> None:
        self.fleet = fleet
        self.node = node
        self.root = Path(root)
        self._written: dict[str, str] = {}
        self._tmp = str(self.root / ".tmp" / "file")
        (self.root / "class" / "infiniband").mkdir(parents=True, exist_ok=True)
        (self.root / ".tmp").mkdir(exist_ok=True)
        self._made: set[str] = set()

    def _put(self, path: str, text: str) -> None:
        if self._written.get(path) == text:
            return
        folder = os.path.dirname(path)
        if folder not in self._made:
            os.makedirs(folder, exist_ok=True)
            self._made.add(folder)
        fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, text.encode("ascii"))
        finally:
            os.close(fd)
        os.replace(self._tmp, path)
        self._written[path] = text

    def device_dir(self, h: int) -> Path:
        """``class/infiniband/<dev>`` of HCA ``h``."""
        return self.root / "class" / "infiniband" / self.fleet.hca_name(h)

    def write(self, t: float, *, traffic: bool = True) -> None:
        """Write every listed HCA's files as the simulator has them at ``t``; remove HCAs gone.
        ``traffic`` False leaves the :data:`TRAFFIC_COUNTERS` as they are (once written)."""
        model = self.fleet.model(self.node)
        values = model.ib_values(t)
        present = set(model.ib_present(t))
        state, phys = values[_IB + "state_id"], values[_IB + "physical_state_id"]
        for h in range(model.hcas):
            base = str(self.device_dir(h))
            if h not in present:
                if os.path.isdir(base):
                    shutil.rmtree(base)
                    self._written = {p: v for p, v in self._written.items() if not p.startswith(base + "/")}
                    self._made = {d for d in self._made if not (d + "/").startswith(base + "/")}
                continue
            mgmt = self.fleet.is_management_hca(h)
            self._put(f"{base}/board_id", f"{c.HCA_BOARD_ID}\n")
            self._put(f"{base}/fw_ver", f"{c.HCA_FIRMWARE}\n")
            self._put(f"{base}/hca_type", f"{c.MGMT_HCA_TYPE if mgmt else c.HCA_TYPE}\n")
            port = f"{base}/ports/1"
            self._put(f"{port}/state", PORT_STATES[int(state[h])] + "\n")
            self._put(f"{port}/phys_state", PHYS_STATES[int(phys[h])] + "\n")
            self._put(f"{port}/rate", (c.MGMT_RATE_TEXT if mgmt else c.IB_RATE_TEXT) + "\n")
            for family, (name, divisor) in SYSFS_COUNTERS.items():
                path = f"{port}/counters/{name}"
                if traffic or name not in TRAFFIC_COUNTERS or path not in self._written:
                    self._put(path, f"{int(values[family][h]) // divisor}\n")


class SysfsFeeder:
    """Keeps several nodes' :class:`SysfsTree` at the clock's time, rewriting them every ``interval``
    seconds in a daemon thread (start with :meth:`start`, stop with :meth:`stop`)."""

    def __init__(
        self,
        trees: list[SysfsTree],
        clock: Callable[[], float],
        *,
        interval: float = 1.0,
        traffic_every: int = 1,
    ) -> None:
        self.trees = trees
        self.clock = clock
        self.interval = interval
        self.traffic_every = traffic_every
        self._ticks = 0
        self._lock = threading.Lock()  # the feeder thread and a caller's write_all never interleave
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def write_all(self) -> None:
        """Bring every tree to the clock's time now (traffic counters every ``traffic_every`` calls:
        they are most of the writes, and no rule reads them)."""
        with self._lock:
            t = self.clock()
            traffic = self._ticks % self.traffic_every == 0
            self._ticks += 1
            for tree in self.trees:
                tree.write(t, traffic=traffic)

    def start(self) -> SysfsFeeder:
        """Write once, then keep writing in a daemon thread; returns self."""
        self.write_all()
        self._thread = threading.Thread(target=self._run, name="sysfs-feeder", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.write_all()

    def stop(self) -> None:
        """Stop the writer thread (the trees stay as last written)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None


@contextlib.contextmanager
def real_node_exporters(
    fleet: Fleet, clock: Callable[[], float], root: Path, *, interval: float = 2.0, traffic_every: int = 1
) -> Iterator[dict[str, str]]:
    """One real node_exporter per node of ``fleet``, each reading that node's sysfs tree under
    ``root/<node>``, kept at the clock's time every ``interval`` seconds (traffic counters every
    ``traffic_every`` intervals); yields ``{node: host:port}``.

    Faults of the simulated endpoint itself (``exporter_down``, ``exporter_restart`` of ``node``) do
    not apply: these are real exporters.

    Raises:
        BinaryNotFound: node_exporter is not installed.
    """
    trees = [SysfsTree(fleet, name, root / name) for name in fleet.node_names]
    feeder = SysfsFeeder(trees, clock, interval=interval, traffic_every=traffic_every)
    feeder.write_all()
    try:
        with run_node_exporters([tree.root for tree in trees]) as addresses:
            feeder.start()
            yield {tree.node: address for tree, address in zip(trees, addresses, strict=True)}
    finally:
        feeder.stop()
