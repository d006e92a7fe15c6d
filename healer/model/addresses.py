"""Naming a node from a series' scrape address, for series that carry no node label.

node_exporter adds no node label, and neither does the node-exporter Helm chart: without a
relabeling, a series says only ``instance="10.0.0.5:9100"`` (the pod's or the host's IP and the
port). Such a series belongs to the Kubernetes node whose addresses hold that host (reference:
node_exporter's InfiniBand collector, exporters-real.md):

- a Node's ``status.addresses`` of type ``InternalIP`` or ``Hostname``, or the Node's name;
- the IP of an exporter pod (``status.podIPs``; a hostNetwork pod has its node's IP) and that
  pod's ``spec.nodeName``.

Pure: the Kubernetes adapter (:mod:`healer.actions.addresses`) lists the nodes and pods once per
tick and builds an :class:`AddressBook`; evaluation looks a series' ``instance`` host up in it.
An address two nodes claim (a pod IP reused while the old pod's record lingers) names no node:
a wrong node is worse than none.
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


@dataclass(frozen=True)
class AddressBook:
    """Host (as :func:`instance_host` writes it) → node name, from one read of the cluster.

    ``ambiguous`` holds hosts more than one node claims (they name no node); ``error`` says why
    the cluster could not be read (the book is then empty).
    """

    nodes: Mapping[str, str] = field(default_factory=dict)
    ambiguous: frozenset[str] = frozenset()
    error: str | None = None

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
    *, nodes: Iterable[tuple[str, Iterable[str]]], pods: Iterable[tuple[str, Iterable[str]]]
) -> AddressBook:
    """The book from ``nodes`` (name, its InternalIP/Hostname addresses) and ``pods`` (the node a
    pod runs on, its IPs). A node's name is one of its addresses; hosts claimed by two different
    nodes are left out and listed as ambiguous."""
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
    return AddressBook(nodes=found, ambiguous=frozenset(h for h, n in claims.items() if len(n) > 1))
