"""The agent's ``/metrics``: node facts in Prometheus text format.

Names follow dcgm-exporter where the fact is the same, so the default pack reads either exporter
(series of both are told apart by ``job``/``instance``; the rules take ``max by`` the GPU):

* ``DCGM_FI_DEV_*`` from NVML (:data:`healer.nodeagent.nvml.FACTS`), one series per GPU with
  dcgm-exporter's labels: ``gpu``, ``UUID``, ``pci_bus_id``, ``device`` (``nvidia<minor>``),
  ``modelName``, ``Hostname`` (the node name), ``DCGM_FI_DRIVER_VERSION``. Typed ``gauge``
  (dcgm-exporter types its counters ``counter`` without ``_total``, which prometheus_client
  cannot write; PromQL reads both alike).
* ``DCGM_FI_DEV_XID_ERRORS`` (the last Xid of each GPU, labels ``err_code`` = the code and
  ``err_msg`` = the rest of the kernel's line) and ``DCGM_EXP_XID_ERRORS_COUNT`` (Xids per code in
  the trailing window, ``xid`` and ``window_size_in_ms`` labels, dcgm-exporter's default 5
  minutes) from the kernel log. A GPU the log names but NVML does not list (NVML down, the GPU
  fell off the bus) has only ``pci_bus_id`` and ``Hostname``.

Agent-only facts, ``healer_agent_*``:

* ``healer_agent_infiniband_hw_counters_total{node, device, port, counter}``: each
  ``hw_counters`` file (``counter`` is its name), ``node`` the node name as the InfiniBand rules'
  node label chain reads it;
* ``healer_agent_nvlink_errors_total{..GPU labels.., link, counter}``: NVLink error counters per
  link (``replay``, ``recovery``, ``crc_flit``, ``crc_data``; NVML nvmlDeviceGetNvLinkErrorCounter);
* ``healer_agent_xid_errors_total{..GPU labels.., xid}``: Xids logged since the agent started
  reading (since boot, as far as the ring buffer reached);
* ``healer_agent_source_up{source}`` (1 read, 0 not), ``healer_agent_read_errors{source}`` (files
  or calls that failed in this scrape), ``healer_agent_kmsg_records_lost_total``.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from healer.nodeagent.facts import SOURCES, NodeFacts, Snapshot
from healer.nodeagent.nvml import FACTS, GpuReading

log = logging.getLogger(__name__)

#: dcgm-exporter's default ``--xid-count-window-size``, milliseconds (5 minutes).
XID_WINDOW_MS = 300_000
GPU_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION")
_ERR_MSG_MAX = 200


def _gpu_labels(snapshot: Snapshot) -> dict[str, list[str]]:
    """pci_bus_id → the GPU label values (:data:`GPU_LABELS` order) of every GPU NVML lists."""
    if snapshot.nvml is None:
        return {}
    driver = snapshot.nvml.driver_version
    return {g.pci_bus_id: _labels_of(g, snapshot.node, driver) for g in snapshot.nvml.gpus}


def _labels_of(g: GpuReading, node: str, driver: str) -> list[str]:
    device = f"nvidia{g.minor}" if g.minor is not None else ""
    return [str(g.index), g.uuid, g.pci_bus_id, device, g.model, node, driver]


def _unknown_gpu(pci_bus_id: str, node: str) -> list[str]:
    return ["", "", pci_bus_id, "", "", node, ""]


class FactsCollector(Collector):
    """Reads ``facts`` on each scrape and yields the families above; logs each read problem."""

    def __init__(self, facts: NodeFacts, *, xid_window_ms: int = XID_WINDOW_MS) -> None:
        self.facts = facts
        self.xid_window_ms = xid_window_ms

    def collect(self) -> Iterator[Metric]:
        snap = self.facts.read()
        for problem in snap.problems:
            log.warning("node %s: cannot read %s: %s", snap.node, problem.source, problem.message)
        yield from self._sources(snap)
        yield from self._infiniband(snap)
        gpus = _gpu_labels(snap)
        yield from self._gpu_facts(snap, gpus)
        yield from self._xids(snap, gpus)

    def _sources(self, snap: Snapshot) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "healer_agent_source_up",
            "Whether the agent read the source in this scrape (1) or not (0).",
            labels=["source"],
        )
        errors = GaugeMetricFamily(
            "healer_agent_read_errors",
            "Files or calls of the source that failed in this scrape.",
            labels=["source"],
        )
        failed = Counter(_source_of(p.source) for p in snap.problems)
        for source in SOURCES:
            up.add_metric([source], 1.0 if snap.up[source] else 0.0)
            errors.add_metric([source], float(failed.get(source, 0)))
        lost = CounterMetricFamily(
            "healer_agent_kmsg_records_lost",
            "Kernel log records overwritten in the ring buffer before the agent read them.",
        )
        lost.add_metric([], float(snap.kmsg_lost))
        yield from (up, errors, lost)

    def _infiniband(self, snap: Snapshot) -> Iterator[Metric]:
        fam = CounterMetricFamily(
            "healer_agent_infiniband_hw_counters",
            "InfiniBand port hw_counters file "
            "(sysfs class/infiniband/<device>/ports/<port>/hw_counters/<counter>).",
            labels=["node", "device", "port", "counter"],
        )
        for c in snap.hw_counters:
            fam.add_metric([snap.node, c.device, c.port, c.counter], float(c.value))
        yield fam

    def _gpu_facts(self, snap: Snapshot, gpus: dict[str, list[str]]) -> Iterator[Metric]:
        if snap.nvml is None:
            return
        for fact in FACTS:
            fam = GaugeMetricFamily(fact.metric, f"{fact.nvml} ({fact.unit}), from NVML.", labels=GPU_LABELS)
            for g in snap.nvml.gpus:
                if fact.metric in g.values:
                    fam.add_metric(gpus[g.pci_bus_id], g.values[fact.metric])
            yield fam
        nvlink = CounterMetricFamily(
            "healer_agent_nvlink_errors",
            "NVLink error counter per link (NVML nvmlDeviceGetNvLinkErrorCounter).",
            labels=[*GPU_LABELS, "link", "counter"],
        )
        for g in snap.nvml.gpus:
            for (link, counter), value in sorted(g.nvlink.items()):
                nvlink.add_metric([*gpus[g.pci_bus_id], str(link), counter], float(value))
        yield nvlink

    def _xids(self, snap: Snapshot, gpus: dict[str, list[str]]) -> Iterator[Metric]:
        last = GaugeMetricFamily(
            "DCGM_FI_DEV_XID_ERRORS",
            "Value of the last XID error encountered (kernel log).",
            labels=[*GPU_LABELS, "err_code", "err_msg"],
        )
        window = GaugeMetricFamily(
            "DCGM_EXP_XID_ERRORS_COUNT",
            "Count of XID Errors within the time window (kernel log; window_size_in_ms).",
            labels=[*GPU_LABELS, "window_size_in_ms", "xid"],
        )
        total = CounterMetricFamily(
            "healer_agent_xid_errors",
            "Xid lines in the kernel log since the agent started reading.",
            labels=[*GPU_LABELS, "xid"],
        )
        latest: dict[str, tuple[int, str]] = {}
        counts: Counter[tuple[str, int]] = Counter()
        recent: Counter[tuple[str, int]] = Counter()
        since = None if snap.uptime_usec is None else snap.uptime_usec - self.xid_window_ms * 1000
        for x in snap.xids:
            latest[x.pci_bus_id] = (x.xid, x.detail)
            counts[(x.pci_bus_id, x.xid)] += 1
            if since is not None and x.record.usec >= since:
                recent[(x.pci_bus_id, x.xid)] += 1
        for bus_id, (xid, detail) in sorted(latest.items()):
            labels = gpus.get(bus_id) or _unknown_gpu(bus_id, snap.node)
            last.add_metric([*labels, str(xid), detail[:_ERR_MSG_MAX]], float(xid))
        for (bus_id, xid), n in sorted(counts.items()):
            labels = gpus.get(bus_id) or _unknown_gpu(bus_id, snap.node)
            total.add_metric([*labels, str(xid)], float(n))
        for (bus_id, xid), n in sorted(recent.items()):
            labels = gpus.get(bus_id) or _unknown_gpu(bus_id, snap.node)
            window.add_metric([*labels, str(self.xid_window_ms), str(xid)], float(n))
        yield from (last, window, total)


def _source_of(path: str) -> str:
    if path == "nvml":
        return "nvml"
    if "infiniband" in path:
        return "infiniband"
    return "kmsg"


def registry_for(facts: NodeFacts, *, xid_window_ms: int = XID_WINDOW_MS) -> CollectorRegistry:
    """A registry holding only the facts collector (no process or platform metrics)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FactsCollector(facts, xid_window_ms=xid_window_ms))
    return registry


def render(facts: NodeFacts, *, xid_window_ms: int = XID_WINDOW_MS) -> str:
    """One scrape's text (Prometheus text format 0.0.4)."""
    return generate_latest(registry_for(facts, xid_window_ms=xid_window_ms)).decode()


def serve(
    facts: NodeFacts, *, address: str, port: int, xid_window_ms: int = XID_WINDOW_MS
) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``/metrics`` on ``address:port`` (port 0: a free one, ``server.server_port``) in a
    daemon thread; ``server.shutdown()`` stops it. Raises OSError when the port cannot be bound."""
    return start_http_server(port, addr=address, registry=registry_for(facts, xid_window_ms=xid_window_ms))
