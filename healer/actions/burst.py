"""The burst's Kubernetes adapter: read pods, put healer's burst taint on or off, evict a pod back.

What it writes, for ``domain`` ``healer.dev`` and a capacity rule ``inference-overflow``::

    spec.taints: [{key: healer.dev/burst, value: inference-overflow, effect: NoSchedule}]

on the burst nodes only (never ``NoExecute``, which would evict every pod at once), and only that
key: every other taint, the provider's own (``virtual-kubelet.io/provider``) included, is kept.
``spec.taints`` is an atomic list, so the patch carries the whole list with the node's
``resourceVersion`` as a precondition; on 409 the node is re-read and the patch sent once more.

Pods come back through the Eviction API (:func:`healer.actions.drain.evict`, which honours
PodDisruptionBudgets): the pod's budgets are read first and a pod its only budget would refuse is not
POSTed (``budget``); a 429 from the API server is the same answer.

Pod reads go through two narrow methods, :meth:`KubernetesBurst.gpu_pods` (pods requesting GPUs,
bound or pending) and :meth:`KubernetesBurst.pods_on` (the pods of one node): the watched pod store
(:mod:`.pod_watch`) while it is fresh, else one list call each; the budgets likewise.

:class:`DryRunBurst` reads the same and writes nothing: the controller records what it would have
done (``dry_run`` rows) and, as when acting, no longer counts a pod it sent back.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from healer.actions import drain as drain_mod
from healer.actions import rawcalls
from healer.actions.apierrors import api_call
from healer.actions.drain import read_budgets
from healer.actions.kubernetes import STRATEGIC_MERGE, node_view
from healer.actions.pod_watch import BudgetWatch, PodWatch
from healer.errors import KubernetesConflict
from healer.model.burst import PodFacts, Toleration
from healer.model.node import NodeView
from healer.model.states import ActionStatus

log = logging.getLogger(__name__)

GPU_RESOURCE = "nvidia.com/gpu"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
#: The effect of healer's burst taint: NoSchedule only (new pods stay off; running ones are moved
#: at the pace, never all at once).
EFFECT = "NoSchedule"
#: Patches sent for one taint change: the first, and one more after a 409 and a re-read.
CONFLICT_ATTEMPTS = 2


def _quantity(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def pod_facts(pod: dict[str, Any]) -> PodFacts:
    """The :class:`~healer.model.burst.PodFacts` of a Pod as the API server's JSON."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    gpus = 0
    for container in spec.get("containers") or []:
        resources = container.get("resources") or {}
        wanted = (resources.get("requests") or {}).get(GPU_RESOURCE)
        if wanted is None:
            wanted = (resources.get("limits") or {}).get(GPU_RESOURCE)
        gpus += _quantity(wanted or 0)
    owner = next((r for r in meta.get("ownerReferences") or [] if r.get("controller")), None)
    tolerations = tuple(
        Toleration(
            key=str(t.get("key") or ""),
            operator=str(t.get("operator") or "Equal"),
            value=str(t.get("value") or ""),
            effect=str(t.get("effect") or ""),
        )
        for t in spec.get("tolerations") or []
    )
    return PodFacts(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        node=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase") or "Pending"),
        gpus=gpus,
        terminating=meta.get("deletionTimestamp") is not None,
        owner_kind=str(owner.get("kind") or "") if owner else "",
        owner_uid=str(owner.get("uid") or "") if owner else "",
        mirror=MIRROR_ANNOTATION in (meta.get("annotations") or {}),
        labels=dict(meta.get("labels") or {}),
        tolerations=tolerations,
    )


class BurstPort(Protocol):
    """What the burst controller needs of the cluster (:class:`KubernetesBurst` or :class:`DryRunBurst`)."""

    #: What a write amounts to: ``succeeded`` (the cluster changed) or ``dry_run`` (nothing changed).
    status: ActionStatus
    taint_key: str

    def gpu_pods(self) -> list[PodFacts]: ...

    def pods_on(self, node: str) -> list[PodFacts]: ...

    def set_taint(self, node: str, *, value: str | None) -> NodeView | None: ...

    def read_node(self, node: str) -> NodeView: ...

    def return_pod(self, pod: PodFacts) -> tuple[str, str]: ...


class KubernetesBurst:
    """:class:`BurstPort` on a real cluster.

    Args:
        api_client: an official-client ``ApiClient`` (healer's retrying one); not closed here.
        domain: the prefix of healer's burst taint key (``<domain>/burst``).
        request_timeout: seconds per HTTP request.
        grace_period: pod grace period of an eviction, seconds; -1 = the pod's own.
        pod_watch, budget_watch: the watched stores read while fresh (None: list each time).
    """

    status = ActionStatus.SUCCEEDED

    def __init__(
        self,
        api_client: k8s.ApiClient,
        *,
        domain: str,
        request_timeout: float = 10.0,
        grace_period: int = -1,
        pod_watch: PodWatch | None = None,
        budget_watch: BudgetWatch | None = None,
    ) -> None:
        self.api = api_client
        self.pod_watch = pod_watch
        self.budget_watch = budget_watch
        self.core = k8s.CoreV1Api(api_client)
        self.policy = k8s.PolicyV1Api(api_client)
        self.taint_key = f"{domain}/burst"
        self._timeout = request_timeout
        self._grace = grace_period

    def _pods(self, what: str, field_selector: str) -> list[PodFacts]:
        with api_call(what):
            body = rawcalls.call(
                self.api,
                "GET",
                "/api/v1/pods",
                query=[("fieldSelector", field_selector)],
                timeout=self._timeout,
            )
        return [pod_facts(p) for p in body.get("items") or []]

    def gpu_pods(self) -> list[PodFacts]:
        """Every pod requesting GPUs that has not finished, bound or pending (one list call).

        Raises:
            KubernetesError: the list failed.
        """
        watched = self.pod_watch.items() if self.pod_watch is not None else None
        if watched is not None:
            listed = [pod_facts(p) for p in watched]
        else:
            listed = self._pods("list pods", "status.phase!=Succeeded,status.phase!=Failed")
        return [p for p in listed if p.gpus > 0 and not p.finished]

    def pods_on(self, node: str) -> list[PodFacts]:
        """Every pod bound to ``node`` (the watched store, else one list call, ``spec.nodeName`` as
        kubectl drain lists)."""
        watched = self.pod_watch.on_node(node) if self.pod_watch is not None else None
        if watched is not None:
            return [pod_facts(p) for p in watched]
        return self._pods(f"list pods on node {node}", f"spec.nodeName={node}")

    def read_node(self, node: str) -> NodeView:
        """The node as the API server has it now (a watched store may lag healer's own write).

        Raises:
            KubernetesNotFound: the node is gone.
        """
        with api_call(f"read node {node}"):
            return node_view(rawcalls.call(self.api, "GET", f"/api/v1/nodes/{node}", timeout=self._timeout))

    def set_taint(self, node: str, *, value: str | None) -> NodeView | None:
        """Put healer's burst taint ``<domain>/burst=<value>:NoSchedule`` on ``node`` (``value``
        None: take it off), keeping every other taint; the node as answered (None: unchanged).

        Raises:
            KubernetesNotFound: the node is gone. KubernetesConflict: still conflicting after a re-read.
        """
        for attempt in range(CONFLICT_ATTEMPTS):
            with api_call(f"read node {node}"):
                view = node_view(
                    rawcalls.call(self.api, "GET", f"/api/v1/nodes/{node}", timeout=self._timeout)
                )
            ours = [t for t in view.taints if t[0] == self.taint_key]
            wanted = [] if value is None else [(self.taint_key, value, EFFECT)]
            if ours == wanted:
                return None
            taints = [_taint(t, view) for t in view.taints if t[0] != self.taint_key]
            taints += [{"key": k, "value": v, "effect": e} for k, v, e in wanted]
            body = {"metadata": {"resourceVersion": view.resource_version}, "spec": {"taints": taints}}
            try:
                with api_call(f"{'taint' if value else 'untaint'} burst node {node}"):
                    answer = rawcalls.call(
                        self.api,
                        "PATCH",
                        f"/api/v1/nodes/{node}",
                        body=body,
                        content_type=STRATEGIC_MERGE,
                        timeout=self._timeout,
                    )
                return node_view(answer)
            except KubernetesConflict:
                if attempt + 1 == CONFLICT_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def return_pod(self, pod: PodFacts) -> tuple[str, str]:
        """Evict ``pod`` (Eviction API, ``uid`` precondition) unless its PodDisruptionBudget allows
        no disruption now. Returns ``(outcome, message)``: ``evicted``, ``gone``, ``budget`` (left
        for later), ``rate_limited`` or ``error``.

        Raises:
            KubernetesError: the budgets could not be listed.
        """
        v1 = k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(name=pod.name, namespace=pod.namespace, uid=pod.uid, labels=pod.labels)
        )
        budgets = read_budgets(
            self.policy, [v1], request_timeout=self._timeout, budget_watch=self.budget_watch
        )
        if not budgets.may_post(v1):
            names = ", ".join(budgets.names_for([v1]))
            return str(drain_mod.Outcome.BUDGET), f"PodDisruptionBudget {names} allows no disruption now"
        try:
            outcome, message = drain_mod.evict(self.core, v1, self._grace, self._timeout)
        except ApiException as exc:  # pragma: no cover - evict maps every answer
            return str(drain_mod.Outcome.ERROR), str(exc)[:300]
        return str(outcome), message


def _taint(taint: tuple[str, str, str], view: NodeView) -> dict[str, Any]:
    key, value, effect = taint
    out: dict[str, Any] = {"key": key, "effect": effect}
    if value:
        out["value"] = value
    if added := view.taint_added.get((key, effect)):
        out["timeAdded"] = added
    return out


class DryRunBurst:
    """:class:`BurstPort` that reads the cluster and writes nothing."""

    status = ActionStatus.DRY_RUN

    def __init__(self, reader: KubernetesBurst) -> None:
        self.reader = reader
        self.taint_key = reader.taint_key

    def gpu_pods(self) -> list[PodFacts]:
        return self.reader.gpu_pods()

    def pods_on(self, node: str) -> list[PodFacts]:
        return self.reader.pods_on(node)

    def read_node(self, node: str) -> NodeView:
        return self.reader.read_node(node)

    def set_taint(self, node: str, *, value: str | None) -> NodeView | None:
        log.info("dry-run: would %s healer's burst taint on node %s", "put" if value else "take off", node)
        return None

    def return_pod(self, pod: PodFacts) -> tuple[str, str]:
        log.info("dry-run: would evict pod %s off its burst node", pod.key)
        return "dry_run", ""
