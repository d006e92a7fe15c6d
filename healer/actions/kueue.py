"""Kueue ClusterQueues: read the GPU ``nominalQuota`` per flavor, and set it by server-side apply.

The only module that talks to Kueue's API (``kueue.x-k8s.io``), through the official client's
``CustomObjectsApi``. The version is discovered (``v1beta2`` preferred, else ``v1beta1``; both
carry ``spec.resourceGroups[].flavors[].resources[].nominalQuota`` the same way) once, and again
after a 404.

What it writes: ``spec.resourceGroups`` of a ClusterQueue, by server-side apply with its own field
manager (``healer-kueue`` by default) and ``force``. Kueue's CRD declares ``resourceGroups`` an
atomic list (``x-kubernetes-list-type: atomic``), so the apply carries the whole list as read, with
only the managed flavors' quota of the resource changed, and takes ownership of it: someone who
applies ``resourceGroups`` afterwards gets a conflict naming ``healer-kueue`` (the sign that healer
manages it; turn ``kueue.enabled`` off to take it back). The apply carries the ``resourceVersion``
it was computed from, so a ClusterQueue edited in between answers 409 and is re-read once.

``DryRunKueueQuotas`` reads the same and applies nothing: it remembers the quota it would have set,
and shows it on the next read, so the hysteresis runs in dry-run as it would when acting.

Source of the schema: kubernetes-sigs/kueue ``config/components/crd/bases/kueue.x-k8s.io_clusterqueues.yaml``.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, cast

from kubernetes import client as k8s
from kubernetes.utils.quantity import parse_quantity

from healer.actions.apierrors import api_call
from healer.errors import KubernetesConflict, KubernetesNotFound
from healer.model.states import ActionStatus

log = logging.getLogger(__name__)

GROUP = "kueue.x-k8s.io"
#: Versions healer speaks, preferred first.
VERSIONS = ("v1beta2", "v1beta1")
PLURAL = "clusterqueues"
APPLY_PATCH = "application/apply-patch+yaml"
#: Applies sent for one change: the first, and one more after a 409 and a re-read.
CONFLICT_ATTEMPTS = 2


@dataclass(frozen=True)
class ClusterQueueQuotas:
    """A ClusterQueue as read: its API version, ``resourceVersion``, ``spec.resourceGroups`` as the
    API server returned them, and flavor → ``nominalQuota`` of the resource (None when the flavor
    does not list the resource or the quantity is not a whole number)."""

    name: str
    version: str
    resource_version: str
    resource_groups: list[dict[str, Any]] = field(default_factory=list)
    quotas: dict[str, int | None] = field(default_factory=dict)


class QuotaPort(Protocol):
    """What the quota sync needs of Kueue (``KueueQuotas`` or ``DryRunKueueQuotas``)."""

    status: ActionStatus

    def read(self, name: str) -> ClusterQueueQuotas: ...

    def apply(self, queue: ClusterQueueQuotas, quotas: Mapping[str, int]) -> ClusterQueueQuotas: ...


def quotas_of(groups: list[dict[str, Any]], resource: str) -> dict[str, int | None]:
    """flavor → the ``nominalQuota`` of ``resource`` in ``resourceGroups`` (None: absent or not whole)."""
    out: dict[str, int | None] = {}
    for group in groups:
        for flavor in group.get("flavors") or []:
            name = str(flavor.get("name", ""))
            out.setdefault(name, None)
            for res in flavor.get("resources") or []:
                if res.get("name") == resource:
                    out[name] = _whole(res.get("nominalQuota"))
    return out


def workload_pending(workload: Mapping[str, Any]) -> bool:
    """A Kueue Workload waits for admission: no ``status.admission`` and no ``Finished`` condition
    that is ``True`` (Kueue's Workload API, ``status.admission`` and ``status.conditions``)."""
    status = workload.get("status") or {}
    finished = any(
        c.get("type") == "Finished" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    return not status.get("admission") and not finished


def _whole(value: object) -> int | None:
    try:
        quantity = parse_quantity(value)
    except (ValueError, TypeError):
        return None
    return int(quantity) if quantity == int(quantity) else None


def with_quotas(
    groups: list[dict[str, Any]], resource: str, quotas: Mapping[str, int]
) -> list[dict[str, Any]]:
    """A copy of ``resourceGroups`` with ``resource``'s ``nominalQuota`` set per flavor in ``quotas``
    (as a quantity string, as Kueue's ``resource.Quantity`` serialises); everything else as read."""
    groups = copy.deepcopy(groups)
    for group in groups:
        for flavor in group.get("flavors") or []:
            if flavor.get("name") not in quotas:
                continue
            for res in flavor.get("resources") or []:
                if res.get("name") == resource:
                    res["nominalQuota"] = str(quotas[flavor["name"]])
    return groups


class KueueQuotas:
    """Read and apply ClusterQueue quotas on a real cluster.

    Args:
        api_client: an official-client ``ApiClient`` (not closed here).
        resource: the resource whose quota is kept (``nvidia.com/gpu``).
        field_manager: the server-side apply field manager.
        request_timeout: seconds per HTTP request.
    """

    status = ActionStatus.SUCCEEDED

    def __init__(
        self,
        api_client: k8s.ApiClient,
        *,
        resource: str = "nvidia.com/gpu",
        field_manager: str = "healer-kueue",
        request_timeout: float = 10.0,
    ) -> None:
        self.custom = k8s.CustomObjectsApi(api_client)
        self.apis = k8s.ApisApi(api_client)
        self.resource = resource
        self.field_manager = field_manager
        self._timeout = request_timeout
        self._version: str | None = None

    def version(self) -> str:
        """The Kueue API version to use (discovered once).

        Raises:
            KubernetesNotFound: the cluster serves neither ``v1beta2`` nor ``v1beta1`` of Kueue.
        """
        if self._version is None:
            with api_call("discover API groups"):
                groups = self.apis.get_api_versions(_request_timeout=self._timeout)
            served = {v.version for g in groups.groups or [] if g.name == GROUP for v in g.versions or []}
            found = next((v for v in VERSIONS if v in served), None)
            if found is None:
                raise KubernetesNotFound(
                    f"Kueue is not served: {GROUP} has none of {', '.join(VERSIONS)} "
                    f"(served: {', '.join(sorted(served)) or 'none'})",
                    status=404,
                )
            self._version = found
        return self._version

    def read(self, name: str) -> ClusterQueueQuotas:
        """The ClusterQueue ``name`` now. Raises ``KubernetesNotFound`` when it (or Kueue) is missing."""
        version = self.version()
        try:
            with api_call(f"read ClusterQueue {name}"):
                body = cast(
                    dict[str, Any],
                    self.custom.get_cluster_custom_object(
                        GROUP, version, PLURAL, name, _request_timeout=self._timeout
                    ),
                )
        except KubernetesNotFound:
            self._version = None  # Kueue upgraded or removed: discover again next time
            raise
        groups = list((body.get("spec") or {}).get("resourceGroups") or [])
        return ClusterQueueQuotas(
            name=name,
            version=version,
            resource_version=str((body.get("metadata") or {}).get("resourceVersion", "")),
            resource_groups=groups,
            quotas=quotas_of(groups, self.resource),
        )

    def pending_workloads(self) -> int:
        """Kueue Workloads waiting for admission in every namespace (no ``status.admission`` and not
        ``Finished``): the training demand a capacity rule may read (one list call).

        Raises:
            KubernetesNotFound: Kueue is not served. KubernetesError: the list failed.
        """
        version = self.version()
        with api_call("list Kueue workloads"):
            body = cast(
                dict[str, Any],
                self.custom.list_cluster_custom_object(
                    GROUP, version, "workloads", _request_timeout=self._timeout
                ),
            )
        return sum(1 for w in body.get("items") or [] if workload_pending(w))

    def apply(self, queue: ClusterQueueQuotas, quotas: Mapping[str, int]) -> ClusterQueueQuotas:
        """Set ``resource``'s quota per flavor in ``quotas`` by server-side apply (see the module
        docstring); the ClusterQueue as the API server answered.

        Raises:
            KubernetesConflict: still conflicting after one re-read.
            KubernetesNotFound: the ClusterQueue is gone.
        """
        for attempt in range(CONFLICT_ATTEMPTS):
            body = {
                "apiVersion": f"{GROUP}/{queue.version}",
                "kind": "ClusterQueue",
                "metadata": {"name": queue.name, "resourceVersion": queue.resource_version},
                "spec": {"resourceGroups": with_quotas(queue.resource_groups, self.resource, quotas)},
            }
            try:
                with api_call(f"apply quota to ClusterQueue {queue.name}"):
                    answer = cast(
                        dict[str, Any],
                        self.custom.patch_cluster_custom_object(
                            GROUP,
                            queue.version,
                            PLURAL,
                            queue.name,
                            body,  # sent as JSON, which is YAML
                            field_manager=self.field_manager,
                            force=True,
                            _content_type=APPLY_PATCH,
                            _request_timeout=self._timeout,
                        ),
                    )
            except KubernetesConflict:
                if attempt + 1 == CONFLICT_ATTEMPTS:
                    raise
                log.info("ClusterQueue %s changed while applying its quota: re-reading", queue.name)
                queue = self.read(queue.name)
                continue
            groups = list((answer.get("spec") or {}).get("resourceGroups") or [])
            return replace(
                queue,
                resource_version=str((answer.get("metadata") or {}).get("resourceVersion", "")),
                resource_groups=groups,
                quotas=quotas_of(groups, self.resource),
            )
        raise AssertionError("unreachable")


class DryRunKueueQuotas:
    """Reads through ``reader``; :meth:`apply` changes nothing and remembers the quota it would set,
    which later reads show (so the sync's hysteresis runs as if it had acted)."""

    status = ActionStatus.DRY_RUN

    def __init__(self, reader: KueueQuotas) -> None:
        self.reader = reader
        self.would: dict[str, dict[str, int]] = {}

    def read(self, name: str) -> ClusterQueueQuotas:
        queue = self.reader.read(name)
        overlay = self.would.get(name)
        if not overlay:
            return queue
        quotas = {f: overlay.get(f, q) if q is not None else None for f, q in queue.quotas.items()}
        return replace(queue, quotas=quotas)

    def apply(self, queue: ClusterQueueQuotas, quotas: Mapping[str, int]) -> ClusterQueueQuotas:
        self.would.setdefault(queue.name, {}).update(quotas)
        log.info("dry-run: would set ClusterQueue %s quota %s", queue.name, dict(quotas))
        return replace(queue, quotas={**queue.quotas, **quotas})
