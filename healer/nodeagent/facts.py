"""What the node agent reads on its node, through one interface: :class:`NodeFacts`.

Three sources, each read on every :meth:`NodeFacts.read` (a scrape):

* InfiniBand ``hw_counters`` from sysfs (:mod:`healer.nodeagent.infiniband`);
* the kernel log (:mod:`healer.nodeagent.kmsg`): Xid lines, kept since the agent started
  reading (a fresh ``/dev/kmsg`` descriptor starts at the oldest record the ring buffer holds, so
  after an agent restart the Xids since boot come back as far as the buffer reaches);
* NVML (:mod:`healer.nodeagent.nvml`): GPU identity (index, UUID, PCI bus id, model), the facts
  the default rules read, NVLink error counters per link.

:class:`HostFacts` is the one implementation; what differs between a node and a fixture is
where it reads: :meth:`HostFacts.real` reads ``/sys``, ``/dev/kmsg``, ``/proc/uptime`` and the
NVIDIA driver; :meth:`HostFacts.fixture` reads a directory holding ``sys/`` (a generated sysfs
tree), ``kmsg`` (records, one a line), ``proc/uptime`` and ``nvml.json`` (a recorded device).

Nothing that fails to read stops the rest: each failure is a :class:`ReadProblem` in the
snapshot (logged by the exporter, counted in ``healer_agent_read_errors``), the Xids already read
are kept, and a source that cannot be read at all reads ``healer_agent_source_up 0``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from healer.nodeagent.infiniband import HwCounter, ReadProblem, read_hw_counters
from healer.nodeagent.kmsg import DevKmsg, KmsgFile, KmsgSource, XidLine, parse_xid
from healer.nodeagent.nvml import NvmlCallError, NvmlCalls, NvmlReading, NvmlUnavailable, open_nvml, read_nvml

log = logging.getLogger(__name__)

#: Xid lines kept in memory (the newest): far more than a node logs between two reboots.
XID_MEMORY = 10_000
SOURCES = ("infiniband", "kmsg", "nvml")


@dataclass(frozen=True)
class Snapshot:
    """One reading of the node: ``up`` per source (``infiniband``, ``kmsg``, ``nvml``), every Xid
    read so far (oldest first), ``uptime_usec`` (microseconds since boot, the kernel log's clock),
    and what could not be read."""

    node: str
    hw_counters: tuple[HwCounter, ...]
    xids: tuple[XidLine, ...]
    nvml: NvmlReading | None
    up: dict[str, bool]
    uptime_usec: int | None
    kmsg_lost: int
    problems: tuple[ReadProblem, ...]


class NodeFacts(Protocol):
    """The facts of one node."""

    def read(self) -> Snapshot:
        """Read every source now. Never raises for a source that cannot be read (see Snapshot.problems)."""
        ...


def read_uptime_usec(path: Path) -> int:
    """The first number of ``/proc/uptime`` (seconds since boot, two decimals) in microseconds.
    Raises OSError or ValueError."""
    return int(float(path.read_text().split()[0]) * 1_000_000)


@dataclass
class HostFacts:
    """The node's facts from ``sysfs`` (a directory), ``kmsg`` (a source), ``uptime`` (a
    ``/proc/uptime`` file) and ``nvml`` (None with ``nvml_error`` saying why it is unavailable)."""

    node: str
    sysfs: Path
    kmsg: KmsgSource | None
    uptime: Path
    nvml: NvmlCalls | None
    nvml_error: str = ""
    _xids: list[XidLine] = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def real(cls, node: str, *, open_nvml_fn: Callable[[], NvmlCalls] = open_nvml) -> HostFacts:
        """This host: ``/sys``, ``/dev/kmsg``, ``/proc/uptime``, the NVIDIA driver's NVML."""
        nvml, error = _try_nvml(open_nvml_fn)
        return cls(node, Path("/sys"), DevKmsg(), Path("/proc/uptime"), nvml, error)

    @classmethod
    def fixture(cls, node: str, root: Path) -> HostFacts:
        """A fixture directory: ``sys/``, ``kmsg``, ``proc/uptime``, ``nvml.json`` (each optional:
        a missing one reads as a node without it)."""
        recorded = root / "nvml.json"
        if recorded.exists():
            nvml, error = _try_nvml(lambda: open_nvml(recorded))
        else:
            nvml, error = None, f"NVML not available: no recorded device at {recorded}"
        kmsg = KmsgFile(root / "kmsg") if (root / "kmsg").exists() else None
        return cls(node, root / "sys", kmsg, root / "proc" / "uptime", nvml, error)

    def read(self) -> Snapshot:
        with self._lock:  # two scrapes at once must not read the kernel log's new records twice
            return self._read()

    def _read(self) -> Snapshot:
        problems: list[ReadProblem] = []
        up = dict.fromkeys(SOURCES, True)

        counters, ib_problems = read_hw_counters(self.sysfs)
        problems += ib_problems
        up["infiniband"] = not ib_problems

        if self.kmsg is None:
            up["kmsg"] = False
        else:
            try:
                records = self.kmsg.read_new()
            except OSError as exc:
                up["kmsg"] = False
                problems.append(ReadProblem(self.kmsg.name, exc.strerror or str(exc)))
            else:
                self._xids += [x for r in records if (x := parse_xid(r)) is not None]
                del self._xids[:-XID_MEMORY]

        reading: NvmlReading | None = None
        if self.nvml is None:
            up["nvml"] = False
            if self.nvml_error:
                problems.append(ReadProblem("nvml", self.nvml_error))
        else:
            try:
                reading = read_nvml(self.nvml)
            except NvmlCallError as exc:
                up["nvml"] = False
                problems.append(ReadProblem("nvml", str(exc)))

        try:
            uptime: int | None = read_uptime_usec(self.uptime)
        except (OSError, ValueError, IndexError) as exc:
            uptime = None
            problems.append(ReadProblem(str(self.uptime), str(exc)))

        return Snapshot(
            node=self.node,
            hw_counters=tuple(counters),
            xids=tuple(self._xids),
            nvml=reading,
            up=up,
            uptime_usec=uptime,
            kmsg_lost=self.kmsg.lost if self.kmsg is not None else 0,
            problems=tuple(problems),
        )


def _try_nvml(opener: Callable[[], NvmlCalls]) -> tuple[NvmlCalls | None, str]:
    try:
        return opener(), ""
    except NvmlUnavailable as exc:
        log.warning("%s; serving InfiniBand and kernel log facts without GPU facts", exc)
        return None, str(exc)
