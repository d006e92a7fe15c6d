"""Drain a node the way ``kubectl drain`` does, one stateless step at a time.

Source of the semantics: kubernetes/kubectl ``pkg/drain`` (``filters.go``, ``drain.go``) and the
Eviction API (``pkg/registry/core/pod/storage/eviction.go``), summarised in
``shared/reference/kubernetes.md``.

Pod filters, in kubectl's order; the first one that decides wins:

1. terminating (``deletionTimestamp`` set): waited for, never evicted again;
2. owned by a DaemonSet: kept when ``ignore_daemonsets`` (refused otherwise); finished ones evicted;
3. mirror (static) pods, annotation ``kubernetes.io/config.mirror``: skipped silently;
4. with an ``emptyDir`` volume: refused unless ``delete_emptydir_data`` (finished pods exempt);
5. without a controller: refused unless ``force`` (finished pods exempt).

Any refusal blocks the whole drain before anything is evicted, and the report names each pod and
why. Evictions (``policy/v1`` Eviction, ``deleteOptions.preconditions.uid`` so a new pod that reused
the name is never evicted by mistake) run in parallel, ``concurrency`` at a time. Answers:

* 201/200: evicted; 404, or 409 on the uid precondition: the pod is already gone (success);
* 429 (a PodDisruptionBudget allows no disruption now) or 500 (several budgets match the pod):
  left for the next step until the deadline (``started_at + timeout_seconds``); past it the step
  reports ``blocked`` naming the pods and the budgets, and deletes them (``DELETE`` bypasses
  budgets) only when ``delete_after_timeout``, listing them in ``deleted``.

A step holds no state: what to do follows from the pods on the node now, so a restarted controller
calls it again and resumes; evicted pods are terminating or gone and are not evicted twice.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, cast

from kubernetes import client as k8s

from healer.actions.apierrors import api_call
from healer.errors import KubernetesError
from healer.model.drain import DrainOptions, DrainReport

log = logging.getLogger(__name__)

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


class Disposition(StrEnum):
    """What the drain does with one pod."""

    EVICT = "evict"
    KEEP = "keep"  # a DaemonSet pod (ignore_daemonsets) or a mirror pod
    WAIT = "wait"  # already terminating
    REFUSE = "refuse"


@dataclass(frozen=True)
class Decision:
    disposition: Disposition
    reason: str = ""


@dataclass
class Plan:
    """The pods of one node sorted by :func:`classify`; keys are ``namespace/name``."""

    evict: list[k8s.V1Pod] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)


def metadata_of(obj: Any) -> k8s.V1ObjectMeta:
    """``obj.metadata``, which the API server always sets on objects it returns."""
    meta = obj.metadata
    if meta is None:
        raise ValueError(f"{type(obj).__name__} without metadata")
    return cast(k8s.V1ObjectMeta, meta)


def pod_key(pod: k8s.V1Pod) -> str:
    meta = metadata_of(pod)
    return f"{meta.namespace}/{meta.name}"


def _finished(pod: k8s.V1Pod) -> bool:
    return bool(pod.status and pod.status.phase in ("Succeeded", "Failed"))


def _controller(pod: k8s.V1Pod) -> k8s.V1OwnerReference | None:
    return next((r for r in metadata_of(pod).owner_references or [] if r.controller), None)


def decide(pod: k8s.V1Pod, options: DrainOptions) -> Decision:
    """kubectl's filters for one pod, in order (see the module docstring). Pure."""
    meta = metadata_of(pod)
    if meta.deletion_timestamp is not None:
        return Decision(Disposition.WAIT, "terminating")
    controller = _controller(pod)
    if controller is not None and controller.kind == "DaemonSet":
        if _finished(pod):
            return Decision(Disposition.EVICT)
        if options.ignore_daemonsets:
            return Decision(Disposition.KEEP, "DaemonSet-managed")
        return Decision(Disposition.REFUSE, "DaemonSet-managed pod (ignore_daemonsets is off)")
    if MIRROR_ANNOTATION in (meta.annotations or {}):
        return Decision(Disposition.KEEP, "mirror pod")
    if _finished(pod):
        return Decision(Disposition.EVICT)
    volumes = (pod.spec.volumes if pod.spec else None) or []
    if any(v.empty_dir is not None for v in volumes) and not options.delete_emptydir_data:
        return Decision(Disposition.REFUSE, "has local storage (emptyDir; delete_emptydir_data is off)")
    if controller is None and not options.force:
        return Decision(Disposition.REFUSE, "not managed by a controller (force is off)")
    return Decision(Disposition.EVICT)


def classify(pods: Sequence[k8s.V1Pod], options: DrainOptions) -> Plan:
    """Sort a node's pods into evict / kept / waiting / refused. Pure."""
    plan = Plan()
    for pod in pods:
        decision = decide(pod, options)
        key = pod_key(pod)
        if decision.disposition is Disposition.EVICT:
            plan.evict.append(pod)
        elif decision.disposition is Disposition.KEEP:
            plan.kept.append(key)
        elif decision.disposition is Disposition.WAIT:
            plan.waiting.append(key)
        else:
            plan.refused[key] = decision.reason
    return plan


def list_node_pods(core: k8s.CoreV1Api, node: str, *, request_timeout: float) -> list[k8s.V1Pod]:
    """``GET /api/v1/pods?fieldSelector=spec.nodeName=<node>`` (all namespaces), as kubectl does.

    Raises:
        KubernetesError: the list failed.
    """
    with api_call(f"list pods on node {node}"):
        result = core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}", _request_timeout=request_timeout
        )
    return list(result.items or [])


def selector_matches(selector: k8s.V1LabelSelector | None, labels: dict[str, str]) -> bool:
    """A ``metav1.LabelSelector``: ``None`` matches nothing, an empty one everything (policy/v1)."""
    if selector is None:
        return False
    for key, value in (selector.match_labels or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.match_expressions or []:
        values = set(expr.values or [])
        present = expr.key in labels
        if expr.operator == "In" and (not present or labels[expr.key] not in values):
            return False
        if expr.operator == "NotIn" and present and labels[expr.key] in values:
            return False
        if expr.operator == "Exists" and not present:
            return False
        if expr.operator == "DoesNotExist" and present:
            return False
    return True


def budgets_for(
    policy: k8s.PolicyV1Api, pods: Sequence[k8s.V1Pod], *, request_timeout: float
) -> tuple[str, ...]:
    """``namespace/name`` of the PodDisruptionBudgets whose selector matches any of ``pods``."""
    found: set[str] = set()
    by_ns: dict[str, list[k8s.V1PodDisruptionBudget]] = {}
    for pod in pods:
        ns = str(metadata_of(pod).namespace)
        if ns not in by_ns:
            with api_call(f"list PodDisruptionBudgets in {ns}"):
                by_ns[ns] = list(
                    policy.list_namespaced_pod_disruption_budget(ns, _request_timeout=request_timeout).items
                    or []
                )
        labels = metadata_of(pod).labels or {}
        for pdb in by_ns[ns]:
            if selector_matches(pdb.spec.selector if pdb.spec else None, labels):
                found.add(f"{ns}/{metadata_of(pdb).name}")
    return tuple(sorted(found))


class Outcome(StrEnum):
    EVICTED = "evicted"
    GONE = "gone"
    BUDGET = "budget"  # 429 or 500 several budgets: a PodDisruptionBudget holds it
    ERROR = "error"


def _outcome(exc: KubernetesError, *, budgets: bool) -> tuple[Outcome, str]:
    """One eviction's (or delete's) failure, as mapped by :mod:`healer.actions.apierrors`.

    404, or 409 on the uid precondition: the pod is gone (a new pod reusing the name is not ours);
    for an eviction, 429 or a 500 naming several budgets: a PodDisruptionBudget holds it; anything
    else, transport errors and timeouts included (``status`` None), fails this pod only.
    """
    if exc.status in (404, 409):
        return Outcome.GONE, ""
    if budgets and exc.status == 429:
        return Outcome.BUDGET, "a PodDisruptionBudget allows no disruption now"
    if budgets and exc.status == 500 and "more than one" in str(exc):
        return Outcome.BUDGET, "several PodDisruptionBudgets match this pod"
    return Outcome.ERROR, str(exc)[:300]


def _evict(core: k8s.CoreV1Api, pod: k8s.V1Pod, grace: int, request_timeout: float) -> tuple[Outcome, str]:
    meta = metadata_of(pod)
    name, namespace = str(meta.name), str(meta.namespace)
    body = k8s.V1Eviction(
        metadata=k8s.V1ObjectMeta(name=meta.name, namespace=meta.namespace),
        delete_options=k8s.V1DeleteOptions(
            grace_period_seconds=grace if grace >= 0 else None,
            preconditions=k8s.V1Preconditions(uid=meta.uid),
        ),
    )
    try:
        with api_call(f"evict pod {namespace}/{name}"):
            core.create_namespaced_pod_eviction(name, namespace, body, _request_timeout=request_timeout)
    except KubernetesError as exc:
        return _outcome(exc, budgets=True)
    return Outcome.EVICTED, ""


def _delete(core: k8s.CoreV1Api, pod: k8s.V1Pod, grace: int, request_timeout: float) -> tuple[Outcome, str]:
    meta = metadata_of(pod)
    name, namespace = str(meta.name), str(meta.namespace)
    options = k8s.V1DeleteOptions(
        grace_period_seconds=grace if grace >= 0 else None, preconditions=k8s.V1Preconditions(uid=meta.uid)
    )
    try:
        with api_call(f"delete pod {namespace}/{name}"):
            core.delete_namespaced_pod(name, namespace, body=options, _request_timeout=request_timeout)
    except KubernetesError as exc:
        return _outcome(exc, budgets=False)
    return Outcome.EVICTED, ""


def plan(core: k8s.CoreV1Api, node: str, *, options: DrainOptions, request_timeout: float) -> DrainReport:
    """What a drain step would do now; evicts nothing. ``evicted`` lists the pods it would evict."""
    p = classify(list_node_pods(core, node, request_timeout=request_timeout), options)
    would = tuple(sorted(pod_key(x) for x in p.evict))
    return DrainReport(
        done=not p.refused,
        evicted=() if p.refused else would,
        remaining=tuple(sorted([*would, *p.waiting])),
        refused=dict(p.refused),
        kept=tuple(sorted(p.kept)),
        dry_run=True,
    )


def drain_step(
    core: k8s.CoreV1Api,
    policy: k8s.PolicyV1Api,
    node: str,
    *,
    started_at: datetime,
    now: datetime,
    options: DrainOptions,
    request_timeout: float,
) -> DrainReport:
    """Evict what can be evicted now; see the module docstring for every rule.

    Args:
        started_at, now: aware datetimes; the deadline is ``started_at + options.timeout_seconds``.

    Returns:
        ``done`` when no pod is left to evict or wait for; ``refused`` (nothing evicted) when a
        filter refuses pods; ``blocked`` with ``blocked_pods`` and ``budgets`` past the deadline.

    Raises:
        KubernetesError: listing pods or budgets failed (evictions' own failures are in ``errors``).
    """
    pods = list_node_pods(core, node, request_timeout=request_timeout)
    p = classify(pods, options)
    if p.refused:
        log.warning("drain of %s refused: %s", node, p.refused)
        return DrainReport(
            done=False,
            remaining=tuple(sorted([*(pod_key(x) for x in p.evict), *p.waiting])),
            refused=dict(p.refused),
            kept=tuple(sorted(p.kept)),
        )
    past_deadline = now >= started_at + timedelta(seconds=options.timeout_seconds)
    grace = options.grace_period_seconds
    outcomes: list[tuple[Outcome, str]] = []
    if p.evict:
        with ThreadPoolExecutor(max_workers=max(1, options.concurrency), thread_name_prefix="evict") as pool:
            outcomes = list(pool.map(lambda x: _evict(core, x, grace, request_timeout), p.evict))
    evicted = [pod_key(x) for x, (o, _) in zip(p.evict, outcomes, strict=True) if o is Outcome.EVICTED]
    held = [x for x, (o, _) in zip(p.evict, outcomes, strict=True) if o is Outcome.BUDGET]
    errors = {pod_key(x): m for x, (o, m) in zip(p.evict, outcomes, strict=True) if o is Outcome.ERROR}
    for key in evicted:
        log.info("drain %s: evicted %s", node, key)
    budgets = budgets_for(policy, held, request_timeout=request_timeout) if held else ()
    deleted: list[str] = []
    if past_deadline and held and options.delete_after_timeout:
        # The rule's explicit choice: DELETE bypasses the budgets. Recorded in the report.
        for x in held:
            outcome, message = _delete(core, x, grace, request_timeout)
            if outcome is Outcome.ERROR:
                errors[pod_key(x)] = message
            else:
                deleted.append(pod_key(x))
                log.warning("drain %s: deleted %s past the deadline (budgets %s)", node, pod_key(x), budgets)
        held = [x for x in held if pod_key(x) not in deleted]
    blocked_pods = [pod_key(x) for x in held]
    if past_deadline:
        blocked_pods += p.waiting  # still terminating at the deadline: reported, never force-deleted
        blocked_pods += list(errors)  # failing evictions (e.g. 403) end the drain instead of looping
    after = classify(list_node_pods(core, node, request_timeout=request_timeout), options)
    remaining = sorted({*(pod_key(x) for x in after.evict), *after.waiting, *after.refused})
    blocked = past_deadline and bool(blocked_pods)
    if blocked:
        log.warning("drain of %s blocked at its deadline: pods %s, budgets %s", node, blocked_pods, budgets)
    return DrainReport(
        done=not remaining and not errors,
        evicted=tuple(sorted(evicted)),
        remaining=tuple(remaining),
        blocked_pods=tuple(sorted(blocked_pods)) if blocked else (),
        budgets=budgets,
        deleted=tuple(sorted(deleted)),
        blocked=blocked,
        kept=tuple(sorted(after.kept)),
        errors=errors,
    )
