"""Which node a series names: its node label checked against the cluster, else its scrape address.

Resolution, in order (:meth:`AddressBook.resolve`; the first that names a node wins):

1. a node label of the rule (``node_labels``, in order) whose value is a Node's name;
2. a node label whose value is the name of an exporter pod (dcgm-exporter's ``Hostname`` is its
   pod's name, e.g. ``dcgm-exporter-wwwjh``): that pod's ``spec.nodeName``;
3. the ``instance`` host: a Node's InternalIP or Hostname address or name, or an exporter pod's IP
   and that pod's node (below);
4. else the series is unresolved, with the reason (:meth:`AddressBook.resolve`'s ``why``): it
   names no node and is never acted on.

A book that could not be read from the cluster (``error``) or was built without node names
(``node_names`` None) cannot check a label: a node label's value is then taken as it is, and only
series without one go on to step 3.

node_exporter adds no node label, and neither does the node-exporter Helm chart: without a
relabeling, a series says only ``instance="10.0.0.5:9100"`` (the pod's or the host's IP and the
port). Such a series belongs to the Kubernetes node whose addresses hold that host (reference:
node_exporter's InfiniBand collector, exporters-real.md):

- a Node's ``status.addresses`` of type ``InternalIP`` or ``Hostname``, or the Node's name;
- the IP of an exporter pod (``status.podIPs``; a hostNetwork pod has its node's IP) and that
  pod's ``spec.nodeName``.

Pure: the Kubernetes adapter (:mod:`healer.actions.addresses`) lists the nodes and pods once per
tick and builds an :class:`AddressBook`; evaluation resolves each series' node in it.
An address two nodes claim (a pod IP reused while the old pod's record lingers), or a pod name
pods on two nodes carry (two namespaces), names no node: a wrong node is worse than none.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

#: The label Prometheus sets to the scrape target's ``host:port``.
INSTANCE_LABEL = "instance"


def instance_host(instance: str) -> str:
    """The host part of an ``instance`` value, IPs in their canonical text, names in lower case.

    ``"10.0.0.5:9100"`` → ``"10.0.0.5"``; ``"[fd00::0:1]:9100"`` → ``"fd00::1"``; ``"fd00::1"`` →
    ``"fd00::1"``; ``"Gpu-N3:9100"`` → ``"gpu-n3"``; ``"gpu-n3"`` → ``"gpu-n3"``.
    """
    text = instance.strip()
    try:
        return str(ipaddress.ip_address(text))  # a bare address, IPv6 without brackets included
    except ValueError:
        pass
    try:
        host = urlsplit(f"//{text}").hostname or text
    except ValueError:  # an unbalanced bracket: not an address
        host = text
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host.lower()


@dataclass(frozen=True, slots=True)
class Resolved:
    """Where :meth:`AddressBook.resolve` found a series' node.

    ``node``: the node's name, or None (unresolved, ``why`` says why); ``by``: ``"label"`` (a node
    label's value, a Node's name or taken unchecked), ``"pod"`` (a label naming an exporter pod:
    its node) or ``"address"`` (the ``instance`` host); None when unresolved.
    """

    node: str | None
    by: str | None = None
    why: str | None = None


@dataclass(frozen=True)
class AddressBook:
    """Host (as :func:`instance_host` writes it) → node name, from one read of the cluster, and the
    names that check a series' node label.

    ``ambiguous`` holds hosts more than one node claims (they name no node); ``error`` says why
    the cluster could not be read (the book is then empty). ``node_names``: every Node's name
    (lower case; None = not known: labels are not checked); ``pods``: exporter pod name (lower
    case) → its ``spec.nodeName``; ``ambiguous_pods``: pod names carried by pods on different nodes.
    """

    nodes: Mapping[str, str] = field(default_factory=dict)
    ambiguous: frozenset[str] = frozenset()
    error: str | None = None
    node_names: frozenset[str] | None = None
    pods: Mapping[str, str] = field(default_factory=dict)
    ambiguous_pods: frozenset[str] = frozenset()

    @property
    def checks_labels(self) -> bool:
        """Whether a node label's value is checked against the cluster's Nodes and exporter pods."""
        return self.error is None and self.node_names is not None

    def resolve(self, labels: Mapping[str, str], node_labels: Iterable[str]) -> Resolved:
        """The node a series with ``labels`` names, in the module's order; ``node_labels`` is the
        rule's chain. Unresolved: ``Resolved(None, why=...)``, e.g. ``"Hostname
        'dcgm-exporter-wwwjh' names no Node and no exporter pod; instance 10.0.0.9:9400 matches no
        pod or node address"``."""
        named = [(name, value) for name in node_labels if (value := labels.get(name))]
        instance = labels.get(INSTANCE_LABEL)
        if named and not self.checks_labels:
            return Resolved(named[0][1], by="label")
        names = self.node_names or frozenset()
        for _, value in named:
            if value.lower() in names:
                return Resolved(value.lower(), by="label")
        for _, value in named:
            node = self.pods.get(value.lower())
            if node is not None:
                return Resolved(node, by="pod")
        node = self.node_for(instance)
        if node is not None:
            return Resolved(node, by="address")
        if not named:
            return Resolved(None, why=self.why_not(instance))
        said = ", ".join(f"{name} {value!r}" for name, value in named)
        verb = "names" if len(named) == 1 else "name"
        pods = [value for _, value in named if value.lower() in self.ambiguous_pods]
        what = (
            f"{said} {verb} no Node, and exporter pods on more than one node are named {pods[0]!r}"
            if pods
            else f"{said} {verb} no Node and no exporter pod"
        )
        return Resolved(None, why=f"{what}; {self._instance_why(instance)}")

    def _instance_why(self, instance: str | None) -> str:
        if not instance:
            return f"the series has no {INSTANCE_LABEL} label"
        if instance_host(instance) in self.ambiguous:
            return f"{INSTANCE_LABEL} {instance} is claimed by more than one node"
        return f"{INSTANCE_LABEL} {instance} matches no pod or node address"

    def node_for(self, instance: str | None) -> str | None:
        """The node whose address is ``instance``'s host, or None (no instance, unknown, ambiguous)."""
        if not instance:
            return None
        return self.nodes.get(instance_host(instance))

    def why_not(self, instance: str | None) -> str:
        """Why ``instance`` names no node, in words for the rule's report."""
        if self.error is not None:
            return f"the cluster's addresses could not be read: {self.error}"
        if not instance:
            return f"the series has no {INSTANCE_LABEL} label"
        host = instance_host(instance)
        if host in self.ambiguous:
            return f"{host} is claimed by more than one node"
        return f"no Node address (InternalIP, Hostname) and no exporter pod IP is {host}"


def failed_book(error: str) -> AddressBook:
    """An empty book that says why the cluster could not be read."""
    return AddressBook(error=error)


def build_address_book(
    *,
    nodes: Iterable[tuple[str, Iterable[str]]],
    pods: Iterable[tuple[str, Iterable[str]]],
    pod_names: Iterable[tuple[str, str]] = (),
) -> AddressBook:
    """The book from ``nodes`` (name, its InternalIP/Hostname addresses), ``pods`` (the node a
    pod runs on, its IPs) and ``pod_names`` (an exporter pod's name, its node). A node's name is
    one of its addresses; hosts claimed by two different nodes are left out and listed as
    ambiguous, and so are pod names carried by pods on two different nodes."""
    nodes = list(nodes)
    on: dict[str, set[str]] = {}
    for pod, node in pod_names:
        if pod and node:
            on.setdefault(pod.lower(), set()).add(node)
    claims: dict[str, set[str]] = {}
    for node, addresses in nodes:
        for address in (node, *addresses):
            if address:
                claims.setdefault(instance_host(address), set()).add(node)
    for node, addresses in pods:
        for address in addresses:
            if address and node:
                claims.setdefault(instance_host(address), set()).add(node)
    found = {host: next(iter(names)) for host, names in claims.items() if len(names) == 1}
    return AddressBook(
        nodes=found,
        ambiguous=frozenset(h for h, n in claims.items() if len(n) > 1),
        node_names=frozenset(name.lower() for name, _ in nodes if name),
        pods={pod: next(iter(names)) for pod, names in on.items() if len(names) == 1},
        ambiguous_pods=frozenset(pod for pod, names in on.items() if len(names) > 1),
    )
