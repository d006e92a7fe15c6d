"""The Kubernetes adapter: cordon, taint, node condition, Events, ownership annotations, drain.

The only module (with ``drain`` and ``lease`` beside it) that talks to the Kubernetes API, and only
through the official ``kubernetes`` client. What it writes on a node, for ``domain`` ``healer.dev``::

    spec.unschedulable: true                                  (cordon; strategic-merge patch)
    spec.taints: [{key: healer.dev/quarantined, value: <rule>, effect: NoSchedule}]
    status.conditions: [{type: GpuHealthy, status: "False", reason, message, lastTransitionTime}]
    metadata.annotations:
      healer.dev/cordoned-by: healer     only when healer set unschedulable itself
      healer.dev/reason: <why>
      healer.dev/incident: <incident id>
      healer.dev/since: <ISO 8601 UTC>
    Events (events.k8s.io/v1, namespace "default", regarding the Node): HealerQuarantined ...

On pods, only when a drain asks them to checkpoint first: ``healer.dev/checkpoint-requested-at``,
``-deadline`` and ``-incident`` annotations (:mod:`healer.actions.checkpoint`).

Every request goes through :class:`~healer.actions.apiretry.RetryingApiClient`: a transient
failure (5xx, 429, a dropped connection or a timeout) is retried on its own, reads quickly with
jitter, writes with a short backoff, a ``Retry-After`` honoured (bounded); the drain's evictions and
watches are left to :mod:`healer.actions.drain`. What still fails, and every other
``ApiException``, becomes a :class:`healer.errors.KubernetesError` (404 → ``KubernetesNotFound``,
409 → ``KubernetesConflict``, 429 → ``KubernetesTooManyRequests``) with the exception as
``__cause__``; transport failures become a ``KubernetesError`` with ``status=None``.

One write per step: a step's cordon, taint and ownership annotations (or their removal) go in ONE
strategic-merge patch computed from the node as the reconcile read it, carrying its
``metadata.resourceVersion`` as a precondition; on 409 the node is re-read and the patch sent once
more (a second 409 is reported as ``KubernetesConflict``). ``spec.taints`` has no patch merge key
in the Node schema (an atomic list), so the patch carries the whole list, as ``kubectl taint``
does. The condition is one ``/status`` patch; Events take the node's UID from the same read.

Facts: ``status.conditions`` merges by ``type`` on the ``/status`` subresource
(node-problem-detector's convention). Kubernetes API reference, "Node v1 core".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from kubernetes import client as k8s

from healer.actions import drain as drain_mod
from healer.actions import rawcalls
from healer.actions.apierrors import api_call
from healer.actions.apiretry import RetryingApiClient
from healer.actions.base import NodeRef
from healer.actions.checkpoint import CheckpointKeys
from healer.actions.node_watch import NodeWatch
from healer.actions.pod_watch import BudgetWatch, PodWatch
from healer.actions.timestamps import micro_time
from healer.clock import utc_now
from healer.config import KubernetesSettings
from healer.errors import ConfigError, KubernetesConflict, KubernetesNotFound
from healer.model.drain import DrainOptions, DrainReport
from healer.model.node import (
    Condition,
    NodeEdit,
    NodeView,
    Ownership,
    OwnershipKeys,
    TaintEffect,
    human_uncordoned,
    incident_of,
    pool_of,
)
from healer.model.states import ActionStatus

log = logging.getLogger(__name__)

STRATEGIC_MERGE = "application/strategic-merge-patch+json"
#: Patches sent for one edit: the first, and one more after a 409 and a re-read.
CONFLICT_ATTEMPTS = 2
#: events.k8s.io/v1 rejects a ``note`` longer than 1 kB (bytes, not characters).
EVENT_NOTE_MAX = 1024
#: Node Events live in "default", as the kubelet records them.
EVENT_NAMESPACE = "default"
#: The extended resource the NVIDIA device plugin advertises.
GPU_RESOURCE = "nvidia.com/gpu"


#: HTTP connections the client keeps open to the API server: the controller's cordon patches in
#: flight (24, ``healer.controller.reconcile.FENCE_OFF_IN_FLIGHT``), its Node, pod and
#: PodDisruptionBudget watches and the leader Lease, with room to spare. The official client's
#: default is 5 per CPU (10 on two cores): above it urllib3 discards the connection each request
#: returns and the next one opens a new TLS session.
CONNECTIONS = 32


def make_api_client(settings: KubernetesSettings) -> k8s.ApiClient:
    """An ``ApiClient`` from ``settings.kubeconfig`` (+ ``context``), or in-cluster config, with
    :data:`CONNECTIONS` pooled connections.

    Order: an explicit ``kubeconfig`` file; else the in-cluster service account when running in a
    pod (``KUBERNETES_SERVICE_HOST`` set); else ``~/.kube/config`` (``$KUBECONFIG``).

    Raises:
        ConfigError: no usable configuration (the message says which source failed).
    """
    import os

    from kubernetes import config as k8s_config
    from kubernetes.config.config_exception import ConfigException

    configuration = k8s.Configuration()
    try:
        if settings.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            k8s_config.load_incluster_config(client_configuration=configuration)
        else:
            k8s_config.load_kube_config(
                config_file=str(settings.kubeconfig) if settings.kubeconfig else None,
                context=settings.context,
                client_configuration=configuration,
                persist_config=False,
            )
    except (ConfigException, OSError) as exc:
        where = str(settings.kubeconfig) if settings.kubeconfig else "in-cluster or ~/.kube/config"
        raise ConfigError(f"kubernetes: cannot load configuration from {where}: {exc}") from exc
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize, CONNECTIONS)
    return k8s.ApiClient(configuration)


T = TypeVar("T")

def node_view(node: Mapping[str, Any]) -> NodeView:
    """The :class:`NodeView` of a Node as the API server's JSON (times normalised to
    ``YYYY-MM-DDTHH:MM:SSZ``, as the server writes them)."""
    meta, spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
    raw_taints = spec.get("taints") or []
    taints = tuple((t["key"], t.get("value") or "", t["effect"]) for t in raw_taints)
    added = {(t["key"], t["effect"]): _api_time(t["timeAdded"]) for t in raw_taints if t.get("timeAdded")}
    raw_conditions = status.get("conditions") or []
    conditions = {c["type"]: c["status"] for c in raw_conditions}
    details = {
        c["type"]: Condition(
            status=c["status"],
            reason=c.get("reason") or "",
            message=c.get("message") or "",
            last_transition_time=_api_time(c["lastTransitionTime"]) if c.get("lastTransitionTime") else "",
        )
        for c in raw_conditions
    }
    return NodeView(
        name=str(meta["name"]),
        unschedulable=bool(spec.get("unschedulable")),
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        taints=taints,
        conditions=conditions,
        uid=meta.get("uid") or "",
        resource_version=meta.get("resourceVersion") or "",
        condition_details=details,
        taint_added=added,
        gpus=_gpus(status),
        gpu_capacity=_gpus(status, field="capacity"),
    )


def event_name(regarding: str) -> str:
    """``<object name>.<hex nanoseconds>``, as client-go's event recorder names Events.

    Not ``generateName``: the API server validates a ``generateName`` like a name with a suffix
    still to come, so one ending in ``.`` is refused (422).
    """
    suffix = f".{time.time_ns():x}"
    return regarding[: 253 - len(suffix)] + suffix


def _gpus(status: Mapping[str, Any], *, field: str = "allocatable") -> int | None:
    """``nvidia.com/gpu`` of the node's ``status.allocatable`` (or ``status.capacity``: the kubelet
    counts a device the plugin reports unhealthy in capacity, not in allocatable); 0 when the node
    reports the field without it, None when it reports no such field."""
    resources = status.get(field)
    if not resources:
        return None
    try:
        return int(str(resources.get(GPU_RESOURCE, "0")))
    except ValueError:
        return None


def _api_time(at: str) -> str:
    """An RFC 3339 time from the API server as ``YYYY-MM-DDTHH:MM:SSZ`` (UTC, whole seconds)."""
    return _utc_iso(datetime.fromisoformat(at))


def _utc_iso(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubernetesNodeActions:
    """:class:`healer.actions.base.NodeActions` on a real cluster (or the emulator).

    Args:
        api_client: an official-client ``ApiClient`` (see :func:`make_api_client`); not closed here.
        settings: ``domain`` (prefix of taint and annotations), ``condition_type``,
            ``request_timeout_seconds`` (per HTTP request).
        identity: this controller instance (``reportingInstance`` of Events, e.g. the pod name).
        clock: aware-UTC ``now`` for Events and ``release`` when the caller passes none; the
            composition root provides it.
    """

    #: A write changes the cluster (the controller records its audit rows).
    status = ActionStatus.SUCCEEDED

    def __init__(
        self,
        api_client: k8s.ApiClient,
        settings: KubernetesSettings,
        *,
        identity: str = "healer",
        clock: Callable[[], datetime] = utc_now,
        node_watch: NodeWatch | None = None,
        pod_watch: PodWatch | None = None,
        budget_watch: BudgetWatch | None = None,
    ) -> None:
        self.settings = settings
        #: The watched store of the cluster's Nodes (:mod:`.node_watch`); None: every read lists.
        self.node_watch = node_watch
        #: The watched stores of pods and PodDisruptionBudgets a drain reads (:mod:`.pod_watch`);
        #: None: each drain step lists them.
        self.pod_watch = pod_watch
        self.budget_watch = budget_watch
        self.identity = identity
        self.clock = clock
        # Every request (node reads and writes, Events, the drain's lists) retries a transient
        # failure on its own (:mod:`.apiretry`) instead of failing the node's whole step.
        self.api: k8s.ApiClient = RetryingApiClient(api_client)
        self.core = k8s.CoreV1Api(self.api)
        self.policy = k8s.PolicyV1Api(self.api)
        self.keys = OwnershipKeys.for_domain(settings.domain)
        self.taint_key = f"{settings.domain}/quarantined"
        self._timeout = settings.request_timeout_seconds

    # -- reads --

    def _call(
        self, what: str, method: str, path: str, body: Any = None, content_type: str | None = None
    ) -> dict[str, Any]:
        """One request through the client's transport, answered as JSON (:mod:`.rawcalls`)."""
        with api_call(what):
            return rawcalls.call(
                self.api, method, path, body=body, content_type=content_type, timeout=self._timeout
            )

    def _nodes(self) -> list[dict[str, Any]]:
        """Every Node in the cluster as JSON: the watched store's (no request) while it is synced
        and fresh, else one list call (no model objects built)."""
        if self.node_watch is not None:
            watched = self.node_watch.nodes()
            if watched is not None:
                return watched
        items: list[dict[str, Any]] = self._call("list nodes", "GET", "/api/v1/nodes").get("items") or []
        return items

    def read_node(self, name: str) -> NodeView:
        """The node as the API server has it now. Raises ``KubernetesNotFound`` when it is gone."""
        return node_view(self._call(f"read node {name}", "GET", f"/api/v1/nodes/{name}"))

    def watched_nodes(self, names: Sequence[str]) -> Mapping[str, NodeView]:
        """:meth:`~healer.actions.base.NodeActions.watched_nodes`: views of the asked nodes only
        (a few per quiet tick; none kept, so the store costs no second copy of the fleet)."""
        if self.node_watch is None:
            return {}
        # A node this adapter wrote whose event the watch has not delivered yet is left to a GET:
        # its watched view would be from before healer's own cordon.
        behind = self.node_watch.behind(names)
        held = self.node_watch.get(name for name in names if name not in behind)
        return {} if held is None else {name: node_view(node) for name, node in held.items()}

    def _per_node(self, name: str, compute: Callable[[dict[str, Any]], T]) -> dict[str, T]:
        """Every node's name -> ``compute(node JSON)``: from the watched store, computed again only
        for the Nodes changed since the last tick (:meth:`~.watch_cache.Watch.derived`; ``name``
        names the computation), else over one list call."""
        if self.node_watch is not None:
            derived = self.node_watch.derived(name, compute)
            if derived is not None:
                return derived
        return {
            meta["name"]: compute(n) for n in self._nodes() if (meta := n.get("metadata") or {}).get("name")
        }

    def node_pools(self) -> dict[str, str]:
        """Every node in the cluster → its pool (:func:`~healer.model.node.pool_of`: ``pool_label``,
        then ``pool_fallback_labels``, then ``default`` for GPU nodes and ``no-gpu`` for the rest).

        Sizes the remediation budget's percentage and the circuit breaker's fleet (the watched
        store, else one list call).
        """
        labels = (self.settings.pool_label, *self.settings.pool_fallback_labels)

        def pool(n: dict[str, Any]) -> str:
            meta = n.get("metadata") or {}
            return pool_of(meta.get("labels") or {}, _gpus(n.get("status") or {}), pool_labels=labels)

        return self._per_node(f"pool {labels}", pool)

    def gpu_nodes(self) -> list[str]:
        """The names of the nodes that report GPUs (``nvidia.com/gpu`` in ``status.capacity``
        above 0; the watched store, else one list call): a GPU node that exports no dcgm-exporter
        series is blind (:mod:`healer.blind_spots`)."""

        def has_gpus(n: dict[str, Any]) -> bool:
            return (_gpus(n.get("status") or {}, field="capacity") or 0) > 0

        return [name for name, yes in self._per_node("has gpus", has_gpus).items() if yes]

    def node_labels(self) -> dict[str, dict[str, str]]:
        """Every node in the cluster → its labels (the watched store, else one list call): the
        members of the pools rules name by ``pool.node_selector``."""

        def labels(n: dict[str, Any]) -> dict[str, str]:
            return dict((n.get("metadata") or {}).get("labels") or {})

        return {name: dict(got) for name, got in self._per_node("labels", labels).items()}

    def owned_nodes(self) -> list[NodeView]:
        """Every node carrying healer's marks now: an ownership annotation or healer's taint (the
        watched store, else one list call). The ownership reconcile compares them with the
        database and confirms each node it would release with :meth:`owned_node`."""

        def marked(n: dict[str, Any]) -> NodeView | None:
            view = node_view(n)
            return view if self.carries_marks(view) else None

        owned = self._per_node(f"marked {self.settings.domain}", marked)
        return [view for view in owned.values() if view is not None]

    def carries_marks(self, view: NodeView) -> bool:
        """Whether healer's ownership annotations or its taint are on the node."""
        return bool(set(self.keys.all()) & set(view.annotations)) or any(
            t[0] == self.taint_key for t in view.taints
        )

    def owned_node(self, name: str) -> NodeView | None:
        """The node read now when it still carries healer's marks, else None (a watched store may
        lag a write by moments: nothing is released on its word alone)."""
        try:
            view = self.read_node(name)
        except KubernetesNotFound:
            return None
        return view if self.carries_marks(view) else None

    def list_nodes(self) -> list[NodeView]:
        """Every node in the cluster now (one list call): the Kueue quota sync counts their GPUs."""
        return [node_view(n) for n in self._nodes()]

    def human_uncordoned(self, name: str) -> bool:
        """Read the node: did a human uncordon it after healer cordoned it?"""
        return human_uncordoned(self.read_node(name), domain=self.settings.domain)

    def _view(self, node: NodeRef) -> NodeView:
        return node if isinstance(node, NodeView) else self.read_node(node)

    # -- writes --

    def edit(self, node: NodeRef, change: NodeEdit) -> NodeView:
        """Cordon, taint, annotate or release in ONE patch carrying the node's ``resourceVersion``.

        Computed from ``node`` as read (a name is read first); nothing is sent when the node is
        already as wanted. On 409 (someone wrote in between) the node is re-read and the patch
        recomputed and sent once more. Returns the node as the API server answered.

        Cordon: a node already unschedulable that healer did not cordon (a human or another tool
        did) keeps its cordon and gets no ``cordoned-by``, so a release never uncordons it (kured's
        rule); ``since`` keeps its first value within an incident. Taint: healer's one taint
        ``<domain>/quarantined=<value>:<effect>`` replaces an older one of healer's; other taints are
        kept. Release: healer's taint and annotations removed; uncordoned only when ``cordoned-by``
        says healer cordoned.

        Raises:
            KubernetesConflict: still conflicting after the re-read.
            KubernetesNotFound: the node is gone.
        """
        view = self._view(node)
        for attempt in range(CONFLICT_ATTEMPTS):
            body = self._edit_body(view, change)
            if body is None:
                return view
            body.setdefault("metadata", {})["resourceVersion"] = view.resource_version
            try:
                return self._patch(view.name, body, _what(change))
            except KubernetesConflict:
                if attempt + 1 == CONFLICT_ATTEMPTS:
                    raise
                log.info("%s node %s: conflict, re-reading", _what(change), view.name)
                view = self.read_node(view.name)
        raise AssertionError("unreachable")

    def _edit_body(self, view: NodeView, change: NodeEdit) -> dict[str, Any] | None:
        keys, annotations = self.keys, view.annotations
        meta: dict[str, str | None] = {}
        spec: dict[str, Any] = {}
        taints = [_taint_body(t, view) for t in view.taints]
        if change.cordon is not None:
            own = change.cordon
            same_incident = annotations.get(keys.incident) == str(own.incident_id)
            wanted = {
                keys.reason: own.reason,
                keys.incident: str(own.incident_id),
                keys.since: (same_incident and annotations.get(keys.since)) or _utc_iso(own.at),
            }
            if not view.unschedulable:
                wanted[keys.cordoned_by] = own.actor
                spec["unschedulable"] = True
            elif keys.cordoned_by in annotations:
                wanted[keys.cordoned_by] = annotations[keys.cordoned_by]
            else:
                log.info(
                    "node %s is already cordoned by someone else: healer will not uncordon it", view.name
                )
            meta.update({k: v for k, v in wanted.items() if annotations.get(k) != v})
        if change.taint is not None:
            value, effect = change.taint
            ours = [t for t in view.taints if t[0] == self.taint_key]
            if ours != [(self.taint_key, value, effect)]:
                kept = [t for t in taints if t["key"] != self.taint_key]
                spec["taints"] = [*kept, {"key": self.taint_key, "value": value, "effect": effect}]
        if change.release:
            meta.update({k: None for k in keys.all() if k in annotations})
            if any(t["key"] == self.taint_key for t in taints):
                spec["taints"] = [t for t in taints if t["key"] != self.taint_key]
            if keys.cordoned_by in annotations and view.unschedulable:
                spec["unschedulable"] = None
        body: dict[str, Any] = {}
        if meta:
            body["metadata"] = {"annotations": meta}
        if spec:
            body["spec"] = spec
        return body or None

    def annotate(self, node: NodeRef, annotations: dict[str, str | None], *, what: str) -> NodeView:
        """Set (None: remove) ``annotations`` in one strategic-merge patch; nothing is sent when the
        node already carries them. Raises ``KubernetesNotFound`` when the node is gone."""
        view = self._view(node)
        wanted = {k: v for k, v in annotations.items() if view.annotations.get(k) != v}
        if not wanted:
            return view
        return self._patch(view.name, {"metadata": {"annotations": wanted}}, what)

    def cordon(self, node: NodeRef, ownership: Ownership) -> NodeView:
        """:meth:`edit` with a cordon only."""
        return self.edit(node, NodeEdit(cordon=ownership))

    def taint(self, node: NodeRef, *, value: str, effect: TaintEffect) -> NodeView:
        """:meth:`edit` with healer's taint only."""
        return self.edit(node, NodeEdit(taint=(value, effect)))

    def _patch(self, name: str, body: dict[str, Any], what: str, *, subresource: str = "") -> NodeView:
        """One strategic-merge patch of the node (or its ``/status``); the node as answered."""
        path = f"/api/v1/nodes/{name}" + (f"/{subresource}" if subresource else "")
        where = f" ({subresource})" if subresource else ""
        view = node_view(self._call(f"{what} node {name}{where}", "PATCH", path, body, STRATEGIC_MERGE))
        if self.node_watch is not None:  # until the watch has it, read this node with a GET
            self.node_watch.expect(name, view.resource_version)
        return view

    def set_condition(
        self, node: NodeRef, *, healthy: bool, reason: str, message: str, now: datetime
    ) -> NodeView:
        """Set the ``condition_type`` condition on ``/status`` (merged by ``type``; other conditions,
        e.g. the kubelet's, untouched) in one patch. ``lastTransitionTime`` moves only when the
        status flips; nothing is sent when status, reason and message are already so."""
        view = self._view(node)
        status = "True" if healthy else "False"
        existing = view.condition_details.get(self.settings.condition_type)
        if existing is not None and (existing.status, existing.reason, existing.message) == (
            status,
            reason,
            message,
        ):
            return view
        transition = _utc_iso(now)
        if existing is not None and existing.status == status and existing.last_transition_time:
            transition = existing.last_transition_time
        condition = {
            "type": self.settings.condition_type,
            "status": status,
            "reason": reason,
            "message": message[:32768],
            "lastTransitionTime": transition,
            "lastHeartbeatTime": _utc_iso(now),
        }
        body = {"status": {"conditions": [condition]}}
        return self._patch(view.name, body, "set condition on", subresource="status")

    def event(
        self, node: NodeRef, *, reason: str, message: str, warning: bool = True, now: datetime | None = None
    ) -> None:
        """Create an ``events.k8s.io/v1`` Event regarding the Node (``kubectl describe node`` and
        ``kubectl events`` show it), its UID taken from ``node`` as read, in ``default``
        (cluster-scoped objects' Events must live there), named explicitly (:func:`event_name`).
        Not deduplicated: each call is one Event (a retried POST of it too: its name is the call's)."""
        at = now or self.clock()
        view = self._view(node)
        name = view.name
        # A plain dict, not the client's model: the model re-serialises eventTime with isoformat(),
        # which drops the fraction at a whole second, and the API server refuses that (422).
        body = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": event_name(name), "namespace": EVENT_NAMESPACE},
            "eventTime": micro_time(at),
            "reason": reason,
            "note": message.encode()[:EVENT_NOTE_MAX].decode(errors="ignore"),  # a limit in bytes
            "type": "Warning" if warning else "Normal",
            "action": reason.removeprefix("Healer") or reason,
            "reportingController": f"{self.settings.domain}/healer",
            "reportingInstance": self.identity,
            "regarding": {"apiVersion": "v1", "kind": "Node", "name": name, "uid": view.uid},
        }
        path = f"/apis/events.k8s.io/v1/namespaces/{EVENT_NAMESPACE}/events"
        try:
            self._call(f"record event {reason} on node {name}", "POST", path, body, "application/json")
        except KubernetesConflict:
            # AlreadyExists: the name is this call's own (event_name), so an earlier try of this
            # POST created it and only its answer was lost; the retry found it.
            log.debug("event %s on node %s: created by an earlier try", reason, name)

    def drain_step(
        self, node: NodeRef, *, started_at: datetime, now: datetime, options: DrainOptions
    ) -> DrainReport:
        """One step of ``kubectl drain`` (see :mod:`healer.actions.drain`) on ``node`` as read.

        A node that is schedulable again (a human uncordoned it), lost healer's taint or carries the
        opt-out label is not drained: the report says so in ``stopped`` and nothing is evicted. The
        node is read again before each round of evictions (:func:`human_change`), so a change made
        while the step waits for a PodDisruptionBudget stops it before the next eviction. Raises
        ``KubernetesNotFound`` when the node is gone.
        """
        view = self._view(node)
        why = self.human_change(view, view)
        if why:
            return DrainReport(done=False, stopped=why)
        return drain_mod.drain_step(
            self.core,
            self.policy,
            view.name,
            started_at=started_at,
            now=now,
            options=options,
            request_timeout=self._timeout,
            node_ready=view.conditions.get("Ready", "True") == "True",
            skip_wait_for_delete_timeout_seconds=self.settings.drain_skip_wait_for_delete_timeout_seconds,
            checkpointing=self._checkpointing(view),
            guard=lambda: self.human_change(view, self.read_node(view.name)),
            pod_watch=self.pod_watch,
            budget_watch=self.budget_watch,
        )

    def human_change(self, before: NodeView, now: NodeView) -> str:
        """Why the node as read ``now`` forbids draining it further ("" when nothing does): it is
        schedulable (uncordoned), healer's taint that ``before`` carried is gone, or it carries the
        opt-out label."""
        name = now.name
        if not now.unschedulable:
            return f"node {name} is schedulable: not draining an uncordoned node"
        ours = [t for t in before.taints if t[0] == self.taint_key]
        if ours and not any(t[0] == self.taint_key for t in now.taints):
            return f"healer's taint {self.taint_key} was removed from node {name}: not draining"
        if now.labels.get(self.settings.opt_out_label, "").lower() == "true":
            return f"node {name} carries the opt-out label {self.settings.opt_out_label}: not draining"
        return ""

    def _checkpointing(self, view: NodeView) -> drain_mod.Checkpointing:
        return drain_mod.Checkpointing(
            keys=CheckpointKeys.for_domain(self.settings.domain),
            label_seconds=self.settings.checkpoint_timeout_seconds,
            incident=incident_of(view, domain=self.settings.domain),
        )

    def plan_drain(self, name: str, *, options: DrainOptions, now: datetime | None = None) -> DrainReport:
        """What a drain would do now, without evicting or asking anything (``dry_run=True`` in the
        report; ``checkpointing`` names the pods it would ask to checkpoint first)."""
        return drain_mod.plan(
            self.core,
            name,
            options=options,
            request_timeout=self._timeout,
            checkpointing=self._checkpointing(self.read_node(name)) if now is not None else None,
            now=now,
            pod_watch=self.pod_watch,
        )

    def release(self, node: NodeRef, *, now: datetime | None = None) -> NodeView:
        """Hand the node back: set the condition to True (if healer had set it False), then remove
        healer's taint and annotations and uncordon when ``cordoned-by`` says healer cordoned it
        (one status patch, one patch)."""
        at = now or self.clock()
        view = self._view(node)
        condition = view.condition_details.get(self.settings.condition_type)
        if condition is not None and condition.status != "True":
            view = self.set_condition(
                view, healthy=True, reason="HealerReleased", message="released by healer", now=at
            )
        return self.edit(view, NodeEdit(release=True))


def _what(change: NodeEdit) -> str:
    return "release" if change.release else "cordon" if change.cordon else "taint"


def _taint_body(taint: tuple[str, str, str], view: NodeView) -> dict[str, Any]:
    """One of the node's taints as API JSON (``timeAdded`` kept: the list is sent whole)."""
    key, value, effect = taint
    out: dict[str, Any] = {"key": key, "effect": effect}
    if value:
        out["value"] = value
    added = view.taint_added.get((key, effect))
    if added:
        out["timeAdded"] = added
    return out
