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

Every ``ApiException`` becomes a :class:`healer.errors.KubernetesError` (404 → ``KubernetesNotFound``,
409 → ``KubernetesConflict``, 429 → ``KubernetesTooManyRequests``) with the exception as
``__cause__``; transport failures become a ``KubernetesError`` with ``status=None``.

Facts: ``spec.taints`` has no patch merge key in the Node schema (an atomic list), so a taint change
sends the whole list with ``metadata.resourceVersion`` as a precondition and retries on 409, the
way ``kubectl taint`` does; ``status.conditions`` merges by ``type`` on the ``/status`` subresource
(node-problem-detector's convention). Kubernetes API reference, "Node v1 core".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes import client as k8s

from healer.actions import drain as drain_mod
from healer.actions.apierrors import api_call
from healer.actions.base import DrainReport, NodeView, Ownership, OwnershipKeys, TaintEffect
from healer.actions.timestamps import micro_time
from healer.config import KubernetesSettings
from healer.errors import ConfigError, KubernetesConflict

log = logging.getLogger(__name__)

STRATEGIC_MERGE = "application/strategic-merge-patch+json"
#: Read-modify-write attempts when ``resourceVersion`` moved on under us (409).
CONFLICT_RETRIES = 5
#: events.k8s.io/v1 rejects a ``note`` longer than 1 kB (bytes, not characters).
EVENT_NOTE_MAX = 1024
#: Node Events live in "default", as the kubelet records them.
EVENT_NAMESPACE = "default"


def make_api_client(settings: KubernetesSettings) -> k8s.ApiClient:
    """An ``ApiClient`` from ``settings.kubeconfig`` (+ ``context``), or in-cluster config.

    Order: an explicit ``kubeconfig`` file; else the in-cluster service account when running in a
    pod (``KUBERNETES_SERVICE_HOST`` set); else ``~/.kube/config`` (``$KUBECONFIG``).

    Raises:
        ConfigError: no usable configuration (the message says which source failed).
    """
    import os

    from kubernetes import config as k8s_config
    from kubernetes.config.config_exception import ConfigException

    try:
        if settings.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            configuration = k8s.Configuration()
            k8s_config.load_incluster_config(client_configuration=configuration)
            return k8s.ApiClient(configuration)
        return k8s_config.new_client_from_config(
            config_file=str(settings.kubeconfig) if settings.kubeconfig else None,
            context=settings.context,
            persist_config=False,
        )
    except (ConfigException, OSError) as exc:
        where = str(settings.kubeconfig) if settings.kubeconfig else "in-cluster or ~/.kube/config"
        raise ConfigError(f"kubernetes: cannot load configuration from {where}: {exc}") from exc


def node_view(node: k8s.V1Node) -> NodeView:
    """The :class:`NodeView` of a client ``V1Node``."""
    meta, spec, status = drain_mod.metadata_of(node), node.spec, node.status
    taints = tuple((t.key, t.value or "", t.effect) for t in (spec.taints if spec else None) or [])
    conditions = {c.type: c.status for c in (status.conditions if status else None) or []}
    return NodeView(
        name=str(meta.name),
        unschedulable=bool(spec and spec.unschedulable),
        labels=dict(meta.labels or {}),
        annotations=dict(meta.annotations or {}),
        taints=taints,
        conditions=conditions,
        uid=meta.uid or "",
        resource_version=meta.resource_version or "",
    )


def event_name(regarding: str) -> str:
    """``<object name>.<hex nanoseconds>``, as client-go's event recorder names Events.

    Not ``generateName``: the API server validates a ``generateName`` like a name with a suffix
    still to come, so one ending in ``.`` is refused (422).
    """
    suffix = f".{time.time_ns():x}"
    return regarding[: 253 - len(suffix)] + suffix


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

    def __init__(
        self,
        api_client: k8s.ApiClient,
        settings: KubernetesSettings,
        *,
        identity: str = "healer",
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.settings = settings
        self.identity = identity
        self.clock = clock
        self.core = k8s.CoreV1Api(api_client)
        self.policy = k8s.PolicyV1Api(api_client)
        self.events = k8s.EventsV1Api(api_client)
        self.keys = OwnershipKeys.for_domain(settings.domain)
        self.taint_key = f"{settings.domain}/quarantined"
        self._timeout = settings.request_timeout_seconds

    # -- reads --

    def _read(self, name: str) -> k8s.V1Node:
        with api_call(f"read node {name}"):
            return self.core.read_node(name, _request_timeout=self._timeout)

    def read_node(self, name: str) -> NodeView:
        """The node as the API server has it now. Raises ``KubernetesNotFound`` when it is gone."""
        return node_view(self._read(name))

    def node_pools(self) -> dict[str, str]:
        """Every node in the cluster → its pool (the ``pool_label`` value, ``default`` without one).

        Sizes the remediation budget's percentage and the circuit breaker's fleet (one list call).
        """
        with api_call("list nodes"):
            nodes = self.core.list_node(_request_timeout=self._timeout)
        label = self.settings.pool_label
        return {n.metadata.name: (n.metadata.labels or {}).get(label) or "default" for n in nodes.items}

    def human_uncordoned(self, name: str) -> bool:
        """Read the node: did a human uncordon it after healer cordoned it? (see ``base.human_uncordoned``)"""
        view = self.read_node(name)
        return self.keys.cordoned_by in view.annotations and not view.unschedulable

    # -- writes --

    def _patch(self, name: str, body: dict[str, Any], what: str) -> k8s.V1Node:
        with api_call(f"{what} node {name}"):
            return self.core.patch_node(
                name, body, _content_type=STRATEGIC_MERGE, _request_timeout=self._timeout
            )

    def _patch_status(self, name: str, body: dict[str, Any], what: str) -> k8s.V1Node:
        with api_call(f"{what} node {name} (status)"):
            return self.core.patch_node_status(
                name, body, _content_type=STRATEGIC_MERGE, _request_timeout=self._timeout
            )

    def _with_retry(self, name: str, step: Callable[[k8s.V1Node], dict[str, Any] | None], what: str) -> None:
        """Read, compute a patch carrying ``resourceVersion``, send; again on 409, a few times."""
        for attempt in range(CONFLICT_RETRIES):
            node = self._read(name)
            body = step(node)
            if body is None:
                return
            body.setdefault("metadata", {})["resourceVersion"] = drain_mod.metadata_of(node).resource_version
            try:
                self._patch(name, body, what)
                return
            except KubernetesConflict:
                log.info("%s node %s: conflict (attempt %d), re-reading", what, name, attempt + 1)
        raise KubernetesConflict(f"{what} node {name}: still conflicting after {CONFLICT_RETRIES} attempts")

    def cordon(self, name: str, ownership: Ownership) -> None:
        """Set ``spec.unschedulable`` and healer's ownership annotations.

        If the node is already unschedulable and healer did not cordon it (a human or another tool
        did), the cordon is left as it is and ``cordoned-by`` is not written, so :meth:`release`
        will never uncordon it (kured's rule). Idempotent: ``since`` keeps its first value.
        """
        keys = self.keys

        def step(node: k8s.V1Node) -> dict[str, Any] | None:
            annotations = drain_mod.metadata_of(node).annotations or {}
            unschedulable = bool(node.spec and node.spec.unschedulable)
            ours = keys.cordoned_by in annotations
            same_incident = annotations.get(keys.incident) == str(ownership.incident_id)
            wanted = {
                keys.reason: ownership.reason,
                keys.incident: str(ownership.incident_id),
                keys.since: (same_incident and annotations.get(keys.since)) or _utc_iso(ownership.at),
            }
            body: dict[str, Any] = {}
            if not unschedulable:
                wanted[keys.cordoned_by] = ownership.actor
                body["spec"] = {"unschedulable": True}
            elif ours:
                wanted[keys.cordoned_by] = annotations[keys.cordoned_by]
            else:
                log.info("node %s is already cordoned by someone else: healer will not uncordon it", name)
            changed = {k: v for k, v in wanted.items() if annotations.get(k) != v}
            if not body and not changed:
                return None
            if changed:
                body["metadata"] = {"annotations": changed}
            return body

        self._with_retry(name, step, "cordon")

    def taint(self, name: str, *, value: str, effect: TaintEffect) -> None:
        """Add healer's taint ``<domain>/quarantined=<value>:<effect>``, replacing an older one of
        healer's; other taints are kept (whole list sent with ``resourceVersion``, retried on 409)."""
        key = self.taint_key

        def step(node: k8s.V1Node) -> dict[str, Any] | None:
            current = [t.to_dict() for t in (node.spec.taints if node.spec else None) or []]
            ours = [t for t in current if t.get("key") == key]
            if len(ours) == 1 and ours[0].get("value") == value and ours[0].get("effect") == effect:
                return None
            kept = [_taint_json(t) for t in current if t.get("key") != key]
            return {"spec": {"taints": [*kept, {"key": key, "value": value, "effect": effect}]}}

        self._with_retry(name, step, "taint")

    def set_condition(self, name: str, *, healthy: bool, reason: str, message: str, now: datetime) -> None:
        """Set the ``condition_type`` condition on ``/status`` (merged by ``type``; other conditions,
        e.g. the kubelet's, untouched). ``lastTransitionTime`` moves only when the status flips."""
        status = "True" if healthy else "False"
        node = self._read(name)
        conditions = (node.status.conditions if node.status else None) or []
        existing = next((c for c in conditions if c.type == self.settings.condition_type), None)
        if existing is not None and (existing.status, existing.reason, existing.message) == (
            status,
            reason,
            message,
        ):
            return
        transition = now
        if existing is not None and existing.status == status and existing.last_transition_time:
            transition = existing.last_transition_time
        condition = {
            "type": self.settings.condition_type,
            "status": status,
            "reason": reason,
            "message": message[:32768],
            "lastTransitionTime": _utc_iso(transition),
            "lastHeartbeatTime": _utc_iso(now),
        }
        self._patch_status(name, {"status": {"conditions": [condition]}}, "set condition on")

    def event(
        self, name: str, *, reason: str, message: str, warning: bool = True, now: datetime | None = None
    ) -> None:
        """Create an ``events.k8s.io/v1`` Event regarding the Node (``kubectl describe node`` and
        ``kubectl events`` show it), in ``default`` (cluster-scoped objects' Events must live there),
        named explicitly (:func:`event_name`). Not deduplicated: each call is one Event."""
        at = now or self.clock()
        node = self._read(name)
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
            "regarding": {
                "apiVersion": "v1",
                "kind": "Node",
                "name": name,
                "uid": drain_mod.metadata_of(node).uid,
            },
        }
        with api_call(f"record event {reason} on node {name}"):
            self.events.create_namespaced_event(EVENT_NAMESPACE, body, _request_timeout=self._timeout)

    def drain_step(
        self,
        name: str,
        *,
        started_at: datetime,
        now: datetime,
        timeout_seconds: float,
        grace_period_seconds: int,
        delete_emptydir_data: bool,
        ignore_daemonsets: bool,
        force: bool,
        delete_after_timeout: bool,
        concurrency: int,
    ) -> DrainReport:
        """One step of ``kubectl drain`` (see :mod:`healer.actions.drain`), after re-reading the node.

        A node that is schedulable again (a human uncordoned it) is not drained: the report says
        so in ``stopped`` and nothing is evicted. Raises ``KubernetesNotFound`` when the node is gone.
        """
        view = self.read_node(name)
        if not view.unschedulable:
            return DrainReport(
                done=False, stopped=f"node {name} is schedulable: not draining an uncordoned node"
            )
        options = drain_mod.DrainOptions(
            timeout_seconds=timeout_seconds,
            grace_period_seconds=grace_period_seconds,
            delete_emptydir_data=delete_emptydir_data,
            ignore_daemonsets=ignore_daemonsets,
            force=force,
            delete_after_timeout=delete_after_timeout,
            concurrency=concurrency,
        )
        return drain_mod.drain_step(
            self.core,
            self.policy,
            name,
            started_at=started_at,
            now=now,
            options=options,
            request_timeout=self._timeout,
        )

    def plan_drain(
        self, name: str, *, delete_emptydir_data: bool, ignore_daemonsets: bool, force: bool
    ) -> DrainReport:
        """What a drain would do now, without evicting anything (``dry_run=True`` in the report)."""
        options = drain_mod.DrainOptions(
            delete_emptydir_data=delete_emptydir_data, ignore_daemonsets=ignore_daemonsets, force=force
        )
        return drain_mod.plan(self.core, name, options=options, request_timeout=self._timeout)

    def release(self, name: str, *, now: datetime | None = None) -> None:
        """Hand the node back: remove healer's taint and annotations, set the condition to True
        (if healer had set it), and uncordon only when ``cordoned-by`` says healer cordoned it."""
        at = now or self.clock()
        keys, key = self.keys, self.taint_key

        def step(node: k8s.V1Node) -> dict[str, Any] | None:
            annotations = drain_mod.metadata_of(node).annotations or {}
            body: dict[str, Any] = {}
            gone = {k: None for k in keys.all() if k in annotations}
            if gone:
                body["metadata"] = {"annotations": gone}
            taints = [t.to_dict() for t in (node.spec.taints if node.spec else None) or []]
            spec: dict[str, Any] = {}
            if any(t.get("key") == key for t in taints):
                spec["taints"] = [_taint_json(t) for t in taints if t.get("key") != key]
            if keys.cordoned_by in annotations and node.spec and node.spec.unschedulable:
                spec["unschedulable"] = None
            if spec:
                body["spec"] = spec
            return body or None

        node = self._read(name)
        conditions = (node.status.conditions if node.status else None) or []
        if any(c.type == self.settings.condition_type and c.status != "True" for c in conditions):
            self.set_condition(
                name, healthy=True, reason="HealerReleased", message="released by healer", now=at
            )
        self._with_retry(name, step, "release")


def _taint_json(taint: dict[str, Any]) -> dict[str, Any]:
    """A client ``V1Taint.to_dict()`` (snake_case) as API JSON, without empty fields."""
    out = {"key": taint["key"], "effect": taint["effect"]}
    if taint.get("value"):
        out["value"] = taint["value"]
    added = taint.get("time_added") or taint.get("timeAdded")
    if added:
        out["timeAdded"] = _utc_iso(added) if isinstance(added, datetime) else added
    return out
