"""Which node a series names: the cluster's Nodes and exporter pods, their names and addresses.

A narrow read for detection (:mod:`healer.model.addresses` does the resolution): one list of Nodes
(their names, ``InternalIP`` and ``Hostname`` addresses) and one list of the exporter pods matching
``kubernetes.exporter_pod_selector`` in all namespaces (their names, ``status.podIPs`` and
``spec.nodeName``: dcgm-exporter's ``Hostname`` label is its pod's name). Pods that finished
(``Succeeded``, ``Failed``) are left out: their IP may already belong to another pod. The
ClusterRole's ``list`` on nodes and pods covers both.

Errors: :class:`healer.errors.KubernetesError` (via :func:`~healer.actions.apierrors.api_call`).
"""

from __future__ import annotations

from kubernetes import client as k8s

from healer.actions.apierrors import api_call
from healer.actions.node_watch import NodeWatch
from healer.config import KubernetesSettings
from healer.model.addresses import AddressBook, build_address_book

#: Node address types that name the node itself (NodeAddress.type; ExternalIP may be shared NAT).
NODE_ADDRESS_TYPES = frozenset({"InternalIP", "Hostname"})
#: Pod phases whose IP no longer belongs to the pod.
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


class KubernetesAddresses:
    """Reads the :class:`AddressBook` from the cluster: two list calls per :meth:`address_book`
    (one when ``exporter_pod_selector`` is empty; one fewer when the nodes come from a fresh
    ``node_watch``).

    Args:
        api_client: an official-client ``ApiClient``; not closed here.
        settings: ``exporter_pod_selector`` ('' = nodes only), ``request_timeout_seconds``.
    """

    def __init__(
        self, api_client: k8s.ApiClient, settings: KubernetesSettings, *, node_watch: NodeWatch | None = None
    ) -> None:
        self.core = k8s.CoreV1Api(api_client)
        self.selector = settings.exporter_pod_selector.strip()
        self._timeout = settings.request_timeout_seconds
        #: The watched store of Nodes (:mod:`.node_watch`): the nodes come from it while it is fresh.
        self.node_watch = node_watch

    def _nodes(self) -> list[tuple[str, list[str]]]:
        watched = self.node_watch.nodes() if self.node_watch is not None else None
        if watched is not None:
            return [
                (
                    str(n["metadata"]["name"]),
                    [
                        a["address"]
                        for a in (n.get("status") or {}).get("addresses") or []
                        if a.get("type") in NODE_ADDRESS_TYPES and a.get("address")
                    ],
                )
                for n in watched
            ]
        with api_call("list nodes"):
            node_list = self.core.list_node(_request_timeout=self._timeout)
        nodes = []
        for node in node_list.items:
            name = node.metadata.name if node.metadata else None
            if not name:
                continue
            found = (node.status.addresses if node.status else None) or []
            nodes.append((name, [a.address for a in found if a.type in NODE_ADDRESS_TYPES and a.address]))
        return nodes

    def address_book(self) -> AddressBook:
        """Every node's name and addresses and the exporter pods' names, nodes and IPs, read now.

        Raises:
            KubernetesError: a list call failed.
        """
        nodes = self._nodes()
        pods: list[tuple[str, list[str]]] = []
        pod_names: list[tuple[str, str]] = []
        if self.selector:
            with api_call(f"list pods ({self.selector})"):
                pod_list = self.core.list_pod_for_all_namespaces(
                    label_selector=self.selector, _request_timeout=self._timeout
                )
            for pod in pod_list.items:
                status, spec = pod.status, pod.spec
                if status is None or spec is None or not spec.node_name or status.phase in FINISHED_PHASES:
                    continue
                ips = [p.ip for p in status.pod_ips or [] if p.ip] or (
                    [status.pod_ip] if status.pod_ip else []
                )
                pods.append((spec.node_name, ips))
                if pod.metadata is not None and pod.metadata.name:
                    pod_names.append((pod.metadata.name, spec.node_name))
        return build_address_book(nodes=nodes, pods=pods, pod_names=pod_names)
