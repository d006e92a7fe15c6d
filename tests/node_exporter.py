"""The real node_exporter (Debian package ``prometheus-node-exporter``) reading a fake sysfs tree.

Tests write ``class/infiniband/<device>/...`` as the Linux kernel lays it out; node_exporter reads
the tree on every scrape, so a test changes a port's state or counters by rewriting a file.
``.ci/run`` installs the package.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from healer_dev.node_exporter import run_node_exporter
from healer_dev.simulator.sysfs import PHYS_STATES, PORT_STATES

#: The error counters of ``ports/<n>/counters/`` the default rules read, all 0 on a healthy port.
ERROR_COUNTERS = (
    "symbol_error",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "port_rcv_errors",
)


@dataclass
class FakeSysfs:
    """A sysfs root holding InfiniBand HCAs, one port each unless told otherwise."""

    root: Path

    def _port(self, device: str, port: int) -> Path:
        return self.root / "class" / "infiniband" / device / "ports" / str(port)

    def add_hca(self, device: str, *, ports: int = 1, hca_type: str = "MT4129") -> None:
        """An ACTIVE/LinkUp 400 Gb/s HCA with zeroed counters (``hca_type`` MT4129 = ConnectX-7)."""
        base = self.root / "class" / "infiniband" / device
        base.mkdir(parents=True, exist_ok=True)
        (base / "board_id").write_text("MT_0000000838\n")
        (base / "fw_ver").write_text("28.39.1002\n")
        (base / "hca_type").write_text(f"{hca_type}\n")
        for port in range(1, ports + 1):
            counters = self._port(device, port) / "counters"
            counters.mkdir(parents=True, exist_ok=True)
            self.set_state(device, 4, port=port)
            (self._port(device, port) / "rate").write_text("400 Gb/sec (4X NDR)\n")
            for name in (*ERROR_COUNTERS, "port_rcv_data", "port_xmit_data"):
                (counters / name).write_text("0\n")

    def set_state(self, device: str, state: int, *, port: int = 1, phys: int | None = None) -> None:
        """Port state (4 ACTIVE, 1 DOWN, ...) and physical state (5 LinkUp, 2 Polling, 3 Disabled ...;
        by default LinkUp when ACTIVE, else Polling: an InfiniBand port without a link)."""
        (self._port(device, port) / "state").write_text(PORT_STATES[state] + "\n")
        phys = (5 if state == 4 else 2) if phys is None else phys
        (self._port(device, port) / "phys_state").write_text(PHYS_STATES[phys] + "\n")

    def set_counter(self, device: str, name: str, value: int, *, port: int = 1) -> None:
        (self._port(device, port) / "counters" / name).write_text(f"{value}\n")

    def remove_hca(self, device: str) -> None:
        shutil.rmtree(self.root / "class" / "infiniband" / device)


@dataclass
class NodeExporter:
    """A running node_exporter: ``address`` is host:port, ``sysfs`` its fake tree."""

    address: str
    sysfs: FakeSysfs


@contextlib.contextmanager
def node_exporter() -> Iterator[NodeExporter]:
    """Start node_exporter with only its InfiniBand collector, on an empty fake sysfs; stop it on exit."""
    root = Path(tempfile.mkdtemp(prefix="healer-sysfs-"))
    (root / "class" / "infiniband").mkdir(parents=True)
    try:
        with run_node_exporter(root) as address:
            yield NodeExporter(address=address, sysfs=FakeSysfs(root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
