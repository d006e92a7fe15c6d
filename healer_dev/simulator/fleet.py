"""A simulated GPU fleet: N nodes x 8 GPUs x 8 HCAs, rendered as dcgm-exporter and node_exporter scrapes.

:class:`Fleet` owns the node identities (names ``gpu-node-00``, GPU UUIDs, PCI bus ids, the training
pod on each node), one :class:`~healer_dev.simulator.model.NodeModel` per node for the values, and the
text templates. Rendering a scrape is one ``str.format`` call on a per-node template in which every
label string was written once, at the node's first scrape; only the values are formatted per scrape.

Label styles (:class:`LabelStyle`), the variants a rule's node-label chain must survive
(``reference/metrics.md``):

* ``Hostname``: dcgm series carry ``Hostname="<node>"`` (exporter with ``NODE_NAME``; current releases).
* ``hostname``: the same under ``hostname`` (the newest exporter source).
* ``node``: ``Hostname`` holds the exporter's POD name (older setups); the node name reaches the series
  only through the target label ``node`` (a relabeling of ``__meta_kubernetes_pod_node_name``).
* ``exported``: a ServiceMonitor setup with ``honor_labels: false``: the targets carry the exporter's
  own ``pod``/``namespace``/``container``/``service``/``endpoint``, so Prometheus renames the
  workload's labels in the scrape to ``exported_pod``/``exported_namespace``/``exported_container``.
  The exposition itself is unchanged: the exporter never writes ``exported_*``.

InfiniBand series have no node label of their own: node_exporter targets always carry ``node=<name>``.
Every target sets ``instance`` like Kubernetes would (``podIP:9400`` for dcgm-exporter, ``nodeIP:9100``
for node_exporter), and ``job`` (``dcgm-exporter``, ``node-exporter``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import tempfile
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from healer_dev.simulator import catalog as c
from healer_dev.simulator.exposition import escape_label_value, family_header, go_float, label_pairs
from healer_dev.simulator.model import GpuSample, NodeModel, noise_table
from healer_dev.simulator.scenario import Fault, Scenario, ScenarioError

ExporterName = Literal["dcgm", "node"]
EXPORTERS: tuple[ExporterName, ...] = ("dcgm", "node")
ExporterVersion = Literal["reference", "3.x", "4.x"]
EXPORTER_VERSIONS: tuple[str, ...] = ("reference", "3.x", "4.x")

_IB_RATE = "node_infiniband_rate_bytes_per_second"

#: Alphabet of Kubernetes' random name suffixes (no vowels, no look-alikes).
_K8S_SUFFIX = "bcdfghjklmnpqrstvwxz2456789"


class LabelStyle(StrEnum):
    """How the node name reaches a series (see the module docstring)."""

    HOSTNAME = "Hostname"
    HOSTNAME_LOWER = "hostname"
    NODE = "node"
    EXPORTED = "exported"


@dataclass(frozen=True)
class FleetConfig:
    """Shape of the simulated fleet.

    ``nodes`` nodes named ``<node_prefix><index:02d>`` (``gpu-node-00`` ...), each with ``gpus`` GPUs
    (1..8, an HGX board) and ``hcas`` InfiniBand HCAs (``mlx5_0``...), then ``management_hcas``
    management HCAs (``mlx5_<hcas>``..., ConnectX-6 Dx, not compute fabric: a rule pack excludes them
    by name). ``idle_fraction`` of the nodes (drawn from ``seed``) run no workload. ``seed`` fixes
    identities, baselines and noise.

    ``exporter_version`` is the dcgm-exporter line whose output shape is served:

    * ``3.x``: field 112 named ``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS``; labels in the 3.x output
      template's order (``gpu, UUID, pci_bus_id, device, modelName[, GPU_I_PROFILE, GPU_I_ID],
      Hostname, DCGM_FI_DRIVER_VERSION, ...``); a ``DCGM_FI_DEV_XID_ERRORS`` series on every GPU from
      the start (``err_code="0"``, value 0).
    * ``4.x``: ``DCGM_FI_DEV_CLOCKS_EVENT_REASONS``; every series' labels sorted by name; no Xid series
      until the GPU's first Xid (4.4.1+).
    * ``reference`` (default): the sample scrape ``tests/fixtures/dcgm-exporter.prom``: 4.x field names
      with the 3.x label order and zero Xid series.

    ``nvlink5``: the GPUs have NVLink5 (Blackwell): the exporter also reports the NVLink5 link
    counters of counters-4.x.csv (``catalog.NVLINK5_FAMILIES``, DCGM fields 1204-1219), 0 until an
    ``nvlink5_errors`` fault. Not with ``3.x``: healer's 3.x CSV does not enable them.

    (NVIDIA/dcgm-exporter: its counters CSVs and output template; ``reference/exporters-real.md``.)

    Raises (on construction):
        ValueError: a count out of range.
    """

    nodes: int = 64
    gpus: int = 8
    hcas: int = 8
    seed: int = 0
    label_style: LabelStyle = LabelStyle.HOSTNAME
    idle_fraction: float = 0.05
    node_prefix: str = "gpu-node-"
    exporter_version: ExporterVersion = "reference"
    management_hcas: int = 0
    nvlink5: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.nodes <= 100_000:
            raise ValueError(f"nodes must be 1..100000, got {self.nodes}")
        if not 1 <= self.gpus <= len(c.PCI_BUS_IDS):
            raise ValueError(f"gpus must be 1..{len(c.PCI_BUS_IDS)}, got {self.gpus}")
        if not 0 <= self.hcas <= 32:
            raise ValueError(f"hcas must be 0..32, got {self.hcas}")
        if not 0 <= self.management_hcas <= 4:
            raise ValueError(f"management_hcas must be 0..4, got {self.management_hcas}")
        if self.nvlink5 and self.exporter_version == "3.x":
            raise ValueError("nvlink5 needs a 4.x exporter: the 3.x counters CSV enables no NVLink5 field")
        if self.exporter_version not in EXPORTER_VERSIONS:
            raise ValueError(
                f"exporter_version must be one of {', '.join(EXPORTER_VERSIONS)}, "
                f"got {self.exporter_version!r}"
            )
        if not 0.0 <= self.idle_fraction <= 1.0:
            raise ValueError(f"idle_fraction must be 0..1, got {self.idle_fraction}")
        object.__setattr__(self, "label_style", LabelStyle(self.label_style))

    def node_name(self, index: int) -> str:
        """Name of node ``index`` (``gpu-node-07``)."""
        return f"{self.node_prefix}{index:02d}"


@dataclass(frozen=True)
class Scrape:
    """One answer of a simulated endpoint: ``failure`` is None (``body`` is the exposition text),
    ``http_503`` or ``connection_close``."""

    body: str
    failure: Literal["http_503", "connection_close"] | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None


def _suffix(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(_K8S_SUFFIX) for _ in range(n))


_XID_COUNT_HEADER = family_header(c.XID_COUNT_FAMILY.name, c.XID_COUNT_FAMILY.help, c.XID_COUNT_FAMILY.type)


def _gpu_uuid(rng: random.Random) -> str:
    a, b, c_, d, e = (rng.getrandbits(bits) for bits in (32, 16, 16, 16, 48))
    return f"GPU-{a:08x}-{b:04x}-{c_:04x}-{d:04x}-{e:012x}"


def _brace_escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


@dataclass
class _Node:
    index: int
    name: str
    model: NodeModel
    pod: str | None
    dcgm_pod: str
    node_exporter_pod: str
    uuids: tuple[str, ...]
    templates: dict[Any, str]
    labels: dict[tuple[int, _View], list[tuple[str, str]]]


@dataclass(frozen=True)
class _View:
    """One series of a GPU: a MIG instance (``instance`` > 0) and/or a pod (``pod`` index, -1 none)."""

    instance: int = 0
    profile: str = ""
    pod: int = 0


#: Stand-in for a label value filled per scrape (``err_code``/``err_msg`` of the Xid gauge).
_SLOT = "\x00slot"


class Fleet:
    """The simulated fleet: identities, values over time, and the rendered scrapes.

    Thread-safe for concurrent :meth:`scrape` calls (state is immutable; the template cache only grows).

    Args:
        config: shape, seed and label style.
        scenario: the faults to inject; checked against the fleet.

    Raises:
        ScenarioError: a fault names a node, GPU or HCA the fleet does not have (every one listed).
    """

    def __init__(self, config: FleetConfig | None = None, scenario: Scenario | None = None) -> None:
        self.config = config or FleetConfig()
        self.scenario = scenario or Scenario()
        cfg = self.config
        names = [cfg.node_name(i) for i in range(cfg.nodes)]
        self._by_name: dict[str, int] = {n: i for i, n in enumerate(names)}
        per_node = self._bind(self.scenario)
        table = noise_table(cfg.seed)
        rng = random.Random(f"healer-simulator-fleet:{cfg.seed}")
        idle = {i for i in range(cfg.nodes) if rng.random() < cfg.idle_fraction}
        self._nodes: list[_Node] = []
        for i, name in enumerate(names):
            node_rng = random.Random(f"healer-simulator-identity:{cfg.seed}:{i}")
            uuids = tuple(_gpu_uuid(node_rng) for _ in range(cfg.gpus))
            model = NodeModel.build(
                seed=cfg.seed,
                index=i,
                gpus=cfg.gpus,
                hcas=cfg.hcas + cfg.management_hcas,
                idle=i in idle,
                table=table,
                faults=per_node.get(i, ()),
            )
            self._nodes.append(
                _Node(
                    index=i,
                    name=name,
                    model=model,
                    pod=None if i in idle else f"llm-train-{i // 8}-worker-{i % 8}",
                    dcgm_pod=f"nvidia-dcgm-exporter-{_suffix(node_rng, 5)}",
                    node_exporter_pod=f"node-exporter-{_suffix(node_rng, 5)}",
                    uuids=uuids,
                    templates={},
                    labels={},
                )
            )
        self._ib_templates: dict[tuple[int, ...], str] = {}

    def repair(self, node: str, t: float) -> int:
        """The provider replaced the faulty part of ``node`` at ``t`` seconds: every fault of that
        node that started by ``t`` is gone from then on, and so are later faults of the same GPU or
        HCA (the part is new); other later faults still come. Values rendered from ``t`` on are
        healthy; counters the fault raised start again from their baseline, as a replaced GPU's or
        HCA's do. Returns how many faults were removed.

        Raises:
            KeyError: no such node.
        """
        index = self._by_name[node]
        old = self._nodes[index]
        started = [f for f in old.model.faults if f.at <= t]
        parts = {(getattr(f, "gpu", None), getattr(f, "hca", None)) for f in started} - {(None, None)}
        keep = tuple(
            f
            for f in old.model.faults
            if f.at > t and (getattr(f, "gpu", None), getattr(f, "hca", None)) not in parts
        )
        removed = len(old.model.faults) - len(keep)
        if removed:
            model = dataclasses.replace(old.model, faults=keep)
            # A new _Node (fresh template cache) swapped in whole, so concurrent scrapes see either.
            self._nodes[index] = dataclasses.replace(old, model=model, templates={}, labels={})
        return removed

    def inject(self, fault: Fault) -> None:
        """Add ``fault`` to the running fleet (not to :attr:`scenario`): it starts at ``fault.at``
        seconds on the clock the scrapes are rendered at (at once when that is past), as a
        scenario's fault would. Lets a test start a fault at a wall time it picks while the fleet
        is being scraped.

        Raises:
            ScenarioError: the fault names a node, GPU or HCA the fleet does not have.
        """
        [(index, _)] = self._bind(Scenario(faults=[fault])).items()
        old = self._nodes[index]
        model = dataclasses.replace(old.model, faults=(*old.model.faults, fault))
        # A new _Node (fresh template cache) swapped in whole, so concurrent scrapes see either.
        self._nodes[index] = dataclasses.replace(old, model=model, templates={}, labels={})

    def _bind(self, scenario: Scenario) -> dict[int, list[Fault]]:
        cfg = self.config
        problems: list[str] = []
        per_node: dict[int, list[Fault]] = {}
        span = f"{cfg.node_name(0)}..{cfg.node_name(cfg.nodes - 1)}"
        for i, fault in enumerate(scenario.faults):
            where = scenario.where(i)
            index = self._by_name.get(fault.node)
            if index is None:
                problems.append(
                    f"{where}: faults[{i}].node: {fault.node!r} is not in the fleet "
                    f"of {cfg.nodes} nodes ({span})"
                )
                continue
            gpu = getattr(fault, "gpu", None)
            if gpu is not None and gpu >= cfg.gpus:
                problems.append(f"{where}: faults[{i}].gpu: {gpu} but nodes have GPUs 0..{cfg.gpus - 1}")
                continue
            hca = getattr(fault, "hca", None)
            all_hcas = cfg.hcas + cfg.management_hcas
            if hca is not None and int(hca[5:]) >= all_hcas:
                problems.append(f"{where}: faults[{i}].hca: {hca} but nodes have mlx5_0..mlx5_{all_hcas - 1}")
                continue
            per_node.setdefault(index, []).append(fault)
        if problems:
            raise ScenarioError(problems)
        return per_node

    # --- identities -----------------------------------------------------------------------------

    @property
    def node_names(self) -> list[str]:
        """Every node name, in index order."""
        return [n.name for n in self._nodes]

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, node: object) -> bool:
        return node in self._by_name

    def is_idle(self, node: str) -> bool:
        """True when ``node`` runs no workload (idle GPUs: clock event bit 0x1, no pod labels)."""
        return self._node(node).model.idle

    def workload_pod(self, node: str) -> str | None:
        """The pod holding ``node``'s GPUs (``pod`` label), None on an idle node."""
        return self._node(node).pod

    def gpu_uuid(self, node: str, gpu: int) -> str:
        """The ``UUID`` label of GPU ``gpu`` on ``node``."""
        return self._node(node).uuids[gpu]

    def exporter_pod(self, node: str, exporter: ExporterName) -> str:
        """Name of the exporter pod serving ``node`` (``nvidia-dcgm-exporter-x7k2p``)."""
        n = self._node(node)
        return n.dcgm_pod if exporter == "dcgm" else n.node_exporter_pod

    def _node(self, node: str) -> _Node:
        try:
            return self._nodes[self._by_name[node]]
        except KeyError:
            raise KeyError(f"no node {node!r} in the simulated fleet") from None

    # --- values ---------------------------------------------------------------------------------

    def model(self, node: str) -> NodeModel:
        """The value model of ``node`` (pure functions of the elapsed time)."""
        return self._node(node).model

    def scrape(self, node: str, exporter: ExporterName, t: float) -> Scrape:
        """What ``exporter`` on ``node`` answers at ``t`` seconds into the run.

        Raises:
            KeyError: no such node.
        """
        n = self._node(node)
        failure = n.model.failure(exporter, t)
        if failure is not None:
            return Scrape(body="", failure=failure)  # type: ignore[arg-type]
        return Scrape(body=self.render_dcgm(node, t) if exporter == "dcgm" else self.render_node(node, t))

    def render_dcgm(self, node: str, t: float) -> str:
        """dcgm-exporter's exposition text for ``node`` at ``t`` (ignores exporter faults)."""
        n = self._node(node)
        sample = n.model.gpu_values(t)
        layout = tuple((g, self._views(n, g, sample)) for g in sample.present)
        with_xid = tuple(g for g in sample.present if sample.xid[g] or self._zero_xid_series)
        key = (layout, with_xid)
        template = n.templates.get(key)
        if template is None:
            template = n.templates[key] = self._build_dcgm_template(n, layout, with_xid)
        values = sample.values
        args: list[object] = []
        simple = all(len(views) == 1 for _, views in layout)
        full = simple and len(layout) == self.config.gpus
        for fam in self._dcgm_families:
            if fam.name == c.XID_FAMILY:
                for g, views in layout:
                    if g in with_xid:
                        code = sample.xid[g]
                        args += (code, escape_label_value(c.xid_message(code)), code) * len(views)
            elif full:
                args += values[fam.name]
            else:
                vals = values[fam.name]
                for g, views in layout:
                    args += [vals[g]] * len(views)
        text = template.format(*args)
        # Series of the windowed Xid counter come and go with the events, so they are not templated.
        fam = c.XID_COUNT_FAMILY
        lines = [_XID_COUNT_HEADER]
        views_of = dict(layout)
        for (g, code), count in sorted(sample.xid_counts.items()):
            for view in views_of.get(g, ()):
                extra = [("window_size_in_ms", str(c.XID_COUNT_WINDOW_MS)), ("xid", str(code))]
                pairs = label_pairs(self._with_extra(self._labels(n, g, view), extra))
                lines.append(f"{fam.name}{{{pairs}}} {count}\n")
        return text + "".join(lines)

    def render_node(self, node: str, t: float) -> str:
        """node_exporter's InfiniBand exposition text for ``node`` at ``t`` (ignores exporter faults)."""
        model = self._node(node).model
        values = model.ib_values(t)
        present = model.ib_present(t)
        template = self._ib_templates.get(present)
        if template is None:
            template = self._ib_templates[present] = self._build_ib_template(present)
        args: list[str] = []
        for fam in c.IB_FAMILIES:
            vals = values[fam.name]
            if fam.name == _IB_RATE:
                vals = [
                    c.MGMT_RATE_BYTES_PER_SECOND if self.is_management_hca(h) else v
                    for h, v in enumerate(vals)
                ]
            args += [go_float(vals[h]) for h in present]
        return template.format(*args)

    def hca_name(self, h: int) -> str:
        """Device name of HCA ``h`` (``mlx5_<h>``)."""
        return f"mlx5_{h}"

    def is_management_hca(self, h: int) -> bool:
        """True for the management HCAs that follow the compute ones."""
        return h >= self.config.hcas

    # --- templates ------------------------------------------------------------------------------

    @property
    def _dcgm_families(self) -> tuple[c.Family, ...]:
        """The families this fleet's dcgm-exporter writes, in order (NVLink5 ones last)."""
        return c.DCGM_FAMILIES + (c.NVLINK5_FAMILIES if self.config.nvlink5 else ())

    @property
    def _zero_xid_series(self) -> bool:
        # 4.4.1+ emits no Xid series until a GPU's first Xid; older ones show err_code="0".
        return self.config.exporter_version != "4.x"

    def _views(self, n: _Node, g: int, sample: GpuSample) -> tuple[_View, ...]:
        """The series GPU ``g`` has: one per MIG instance times one per sharing pod."""
        instances = sample.mig.get(g)
        pods = sample.pods.get(g, 1 if n.pod is not None else 0)
        pod_indices = range(pods) if pods else (-1,)
        if instances is None:
            return tuple(_View(pod=p) for p in pod_indices)
        count, profile = instances
        return tuple(
            _View(instance=i, profile=profile, pod=p) for i in range(1, count + 1) for p in pod_indices
        )

    def _labels(self, n: _Node, g: int, view: _View) -> list[tuple[str, str]]:
        """Label pairs of one series of GPU ``g``, in the 3.x output template's order."""
        cached = n.labels.get((g, view))
        if cached is None:
            cached = n.labels[(g, view)] = self._make_labels(n, g, view)
        return cached

    def _make_labels(self, n: _Node, g: int, view: _View) -> list[tuple[str, str]]:
        style = self.config.label_style
        host_key = "hostname" if style is LabelStyle.HOSTNAME_LOWER else "Hostname"
        host_value = n.dcgm_pod if style is LabelStyle.NODE else n.name
        pairs = [
            ("gpu", str(g)),
            ("UUID", n.uuids[g]),
            ("pci_bus_id", c.PCI_BUS_IDS[g]),
            ("device", f"nvidia{g}"),
            ("modelName", c.GPU_MODEL),
        ]
        if view.instance:
            pairs += [("GPU_I_PROFILE", view.profile), ("GPU_I_ID", str(view.instance))]
        pairs += [(host_key, host_value), ("DCGM_FI_DRIVER_VERSION", c.DRIVER_VERSION)]
        if view.pod == 0 and n.pod is not None:
            pairs += [("container", "trainer"), ("namespace", "ml"), ("pod", n.pod)]
        elif view.pod >= 0:
            pod = f"inference-{n.index}-{g}-{view.pod}"
            pairs += [("container", "server"), ("namespace", "serving"), ("pod", pod)]
        return pairs

    def _with_extra(
        self, pairs: list[tuple[str, str]], extra: list[tuple[str, str]]
    ) -> list[tuple[str, str]]:
        """``pairs`` with ``extra`` labels: after the driver version (3.x), or all sorted (4.x)."""
        if self.config.exporter_version == "4.x":
            return sorted([*pairs, *extra])
        at = next(i for i, (k, _) in enumerate(pairs) if k == "DCGM_FI_DRIVER_VERSION") + 1
        return [*pairs[:at], *extra, *pairs[at:]]

    def _family(self, fam: c.Family) -> tuple[str, str]:
        """(name, help) of ``fam`` as this exporter line names it."""
        if fam.name == c.CLOCK_EVENTS_FAMILY and self.config.exporter_version == "3.x":
            return c.CLOCK_THROTTLE_FAMILY_3X, c.CLOCK_THROTTLE_HELP_3X
        return fam.name, fam.help

    @staticmethod
    def _template_labels(pairs: list[tuple[str, str]]) -> str:
        return ",".join(
            f'{k}="{{}}"' if v == _SLOT else _brace_escape(label_pairs([(k, v)])) for k, v in pairs
        )

    def _build_dcgm_template(
        self, n: _Node, layout: tuple[tuple[int, tuple[_View, ...]], ...], with_xid: tuple[int, ...]
    ) -> str:
        plain: dict[tuple[int, _View], str] = {}
        xid: dict[tuple[int, _View], str] = {}
        for g, views in layout:
            for view in views:
                pairs = self._labels(n, g, view)
                if self.config.exporter_version == "4.x":
                    plain[(g, view)] = self._template_labels(sorted(pairs))
                else:
                    plain[(g, view)] = self._template_labels(pairs)
                if g in with_xid:
                    extra = [("err_code", _SLOT), ("err_msg", _SLOT)]
                    xid[(g, view)] = self._template_labels(self._with_extra(pairs, extra))
        parts: list[str] = []
        for fam in self._dcgm_families:
            name, help_text = self._family(fam)
            parts.append(_brace_escape(family_header(name, help_text, fam.type)))
            spec = "{:" + fam.fmt + "}"
            for g, views in layout:
                for view in views:
                    if fam.name == c.XID_FAMILY:
                        if g in with_xid:
                            parts.append(f"{name}{{{{{xid[(g, view)]}}}}} {{:d}}\n")
                    else:
                        parts.append(f"{name}{{{{{plain[(g, view)]}}}}} {spec}\n")
        return "".join(parts)

    def _build_ib_template(self, present: tuple[int, ...]) -> str:
        hcas = [self.hca_name(h) for h in present]
        blocks: list[tuple[str, str]] = []
        for fam in c.IB_FAMILIES:
            lines = "".join(
                f"{fam.name}{{{{{_brace_escape(label_pairs([('device', d), ('port', '1')]))}}}}} {{}}\n"
                for d in hcas
            )
            blocks.append((fam.name, _brace_escape(family_header(fam.name, fam.help, fam.type)) + lines))
        info_lines = "".join(
            "{}{{{}}} 1\n".format(
                c.INFO_FAMILY,
                label_pairs(
                    [
                        ("board_id", c.HCA_BOARD_ID),
                        ("device", self.hca_name(h)),
                        ("firmware_version", c.HCA_FIRMWARE),
                        ("hca_type", c.MGMT_HCA_TYPE if self.is_management_hca(h) else c.HCA_TYPE),
                    ]
                ),
            )
            for h in present
        )
        info = family_header(c.INFO_FAMILY, c.INFO_HELP, "gauge") + info_lines
        blocks.append((c.INFO_FAMILY, _brace_escape(info)))
        # client_golang prints families sorted by name; the info family has no placeholders.
        return "".join(text for _, text in sorted(blocks))

    # --- service discovery ----------------------------------------------------------------------

    def target_labels(self, node: str, exporter: ExporterName) -> dict[str, str]:
        """Target labels of ``node``'s ``exporter`` as service discovery and relabeling would set them
        (``job``, ``instance``, and per label style ``node`` or the ServiceMonitor's ``pod``...)."""
        n = self._node(node)
        i = n.index
        style = self.config.label_style
        if exporter == "dcgm":
            labels = {"job": "dcgm-exporter", "instance": f"10.244.{i // 256}.{i % 256}:9400"}
            if style is LabelStyle.NODE:
                labels["node"] = n.name
            if style is LabelStyle.EXPORTED:
                labels.update(
                    namespace="gpu-operator",
                    pod=n.dcgm_pod,
                    container="nvidia-dcgm-exporter",
                    service="nvidia-dcgm-exporter",
                    endpoint="gpu-metrics",
                )
            return labels
        labels = {"job": "node-exporter", "instance": f"10.0.{i // 256}.{i % 256}:9100", "node": n.name}
        if style is LabelStyle.EXPORTED:
            labels.update(
                namespace="monitoring",
                pod=n.node_exporter_pod,
                container="node-exporter",
                service="node-exporter",
                endpoint="metrics",
            )
        return labels

    @staticmethod
    def metrics_path(node: str, exporter: ExporterName) -> str:
        """URL path of ``node``'s ``exporter`` on the simulator server."""
        return f"/nodes/{node}/{exporter}/metrics"

    def targets(
        self,
        address: str,
        nodes: list[str] | None = None,
        *,
        node_exporters: dict[str, str] | None = None,
    ) -> list[dict[str, Any]]:
        """Prometheus ``http_sd_config`` / ``file_sd_config`` target groups, one per node and exporter.

        ``address`` is the simulator's ``host:port``; each group sets ``__metrics_path__`` and the
        :meth:`target_labels`. ``node_exporters`` (``{node: host:port}``, e.g. real node_exporters on
        the simulator's sysfs trees) replaces the simulated node_exporter endpoint of those nodes.
        Shape: ``[{"targets": ["host:port"], "labels": {...}}, ...]``.
        """
        groups = []
        for name in nodes if nodes is not None else self.node_names:
            for exporter in EXPORTERS:
                where, path = address, self.metrics_path(name, exporter)
                if exporter == "node" and node_exporters and name in node_exporters:
                    where, path = node_exporters[name], "/metrics"
                labels = {"__metrics_path__": path}
                labels.update(self.target_labels(name, exporter))
                groups.append({"targets": [where], "labels": labels})
        return groups

    def write_file_sd(
        self,
        path: Path | str,
        *,
        address: str,
        node_exporters: dict[str, str] | None = None,
        nodes: list[str] | None = None,
    ) -> Path:
        """Write :meth:`targets` (of ``nodes``, default every node) as a ``file_sd_configs`` JSON
        file, atomically (Prometheus watches it).

        Returns the path written. Raises OSError when the directory is not writable.
        """
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".sd-", suffix=".json", dir=target.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(self.targets(address, nodes, node_exporters=node_exporters), fh, indent=1)
        os.replace(tmp, target)
        return target
