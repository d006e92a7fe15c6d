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

* 201/200: evicted; 404, or 409 on the uid precondition: the pod is already gone (success); 403
  with cause ``NamespaceTerminating``: its namespace is being deleted, which deletes it (waited for);
* 429 whose Status names the cause ``DisruptionBudget`` (a budget allows no disruption now, or
  the disruption controller has not processed it yet): left for the next step until the deadline
  (``started_at + timeout_seconds``); past it the step reports ``blocked`` naming the pods and the
  budgets, and deletes them (``DELETE`` bypasses budgets) only when ``delete_after_timeout``,
  listing them in ``deleted``;
* 429 without that cause is API priority and fairness (rate limiting): retried once after its
  ``Retry-After`` (at most :data:`RATE_LIMIT_WAIT_MAX` seconds), else left for the next step; never
  a budget block;
* 500 "more than one PodDisruptionBudget": no retry can succeed (kubectl fails the pod at once), so
  the step reports ``blocked`` at once, deadline or not.

API economy: the step reads the node's pods and the budgets of the namespaces it evicts from out of
the watched stores (:mod:`healer.actions.pod_watch`; without them, one list of pods and one list of
budgets per namespace) and POSTs at most ``status.disruptionsAllowed`` evictions per budget; a pod
its budget would refuse is not POSTed. While pods are held, the step watches those budgets (one
watch per namespace, at most ``budget_wait_seconds``) and evicts as soon as a replacement is ready
and the budget allows again, so a 110-pod node under ``maxUnavailable: 1`` costs one eviction per
pod, one watch and the final list (the one LIST of a step: what is left is always read from the API
server), and its wall time follows the replacements' readiness rather than the drain job's interval.
A 429 anyway (a stale count) zeroes that budget until the watch says otherwise. Without watch (an
API server or proxy refusing it) held pods wait for the next step, as before.

On a node whose kubelet is dead (``Ready`` not ``True``) a pod evicted earlier stays terminating
forever; one whose ``deletionTimestamp`` is older than ``skip_wait_for_delete_timeout_seconds``
(``kubernetes.drain_skip_wait_for_delete_timeout_seconds``) counts as gone (kubectl drain's
``--skip-wait-for-delete-timeout``), so the drain can finish.

A step holds no state: what to do follows from the pods on the node now, so a restarted controller
calls it again and resumes; evicted pods are terminating or gone and are not evicted twice.

Humans win mid-step: ``guard`` (the adapter's re-read of the node) runs immediately before each
round of evictions and before the deletions past the deadline, not only when the step starts. A
step can wait minutes for a budget; an uncordon, a removed taint or the opt-out label in that time
stops it there (``stopped`` says why) and nothing more is evicted. It costs one node read per
round (a budget-paced drain evicts one pod a round): issue 24 saw a pod evicted 4 ms after
``kubectl uncordon`` when the node was read only at the step's start.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, cast

from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as Urllib3Error

from healer.actions import checkpoint as ckpt
from healer.actions.apierrors import api_call
from healer.actions.pod_watch import BudgetWatch, PodWatch
from healer.errors import KubernetesError
from healer.model.drain import DrainOptions, DrainReport

log = logging.getLogger(__name__)

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
#: Longest wait (seconds) for a rate-limited eviction's ``Retry-After`` inside one step.
RATE_LIMIT_WAIT_MAX = 5.0


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


def typed(api: k8s.ApiClient, obj: dict[str, Any], kind: str) -> Any:
    """A watched store's object (a JSON dict) as the client's model ``kind`` (``"V1Pod"``)."""
    return api.deserialize(json.dumps(obj), kind, "application/json")


def list_node_pods(
    core: k8s.CoreV1Api, node: str, *, request_timeout: float, pod_watch: PodWatch | None = None
) -> list[k8s.V1Pod]:
    """The pods bound to ``node``: from ``pod_watch`` while it is fresh, else
    ``GET /api/v1/pods?fieldSelector=spec.nodeName=<node>`` (all namespaces), as kubectl does.

    Raises:
        KubernetesError: the list failed.
    """
    watched = pod_watch.on_node(node) if pod_watch is not None else None
    if watched is not None:
        return [typed(core.api_client, x, "V1Pod") for x in watched]
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


@dataclass
class Budgets:
    """The PodDisruptionBudgets of the namespaces a step evicts from, and what each allows now.

    ``allowed`` maps ``namespace/name`` → ``status.disruptionsAllowed`` as last read (listed, then
    watched), decremented by each eviction this step sends; ``matching`` maps a pod → the budgets
    selecting it; ``versions`` the namespaces' list ``resourceVersion`` (where a watch starts).
    """

    allowed: dict[str, int] = field(default_factory=dict)
    matching: dict[str, tuple[str, ...]] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)

    def may_post(self, pod: k8s.V1Pod) -> bool:
        """True when the API server will not refuse the eviction for its budget (no budget, or
        room left in its only one). Several budgets: the API server answers 500 whatever we do,
        so the pod is POSTed (and reported) as before."""
        names = self.matching.get(pod_key(pod), ())
        return len(names) != 1 or self.allowed.get(names[0], 0) > 0

    def take(self, pod: k8s.V1Pod) -> None:
        names = self.matching.get(pod_key(pod), ())
        if len(names) == 1:
            self.allowed[names[0]] -= 1

    def refused(self, pod: k8s.V1Pod) -> None:
        """A 429: the count was stale; nothing more goes to that budget until it changes."""
        for name in self.matching.get(pod_key(pod), ()):
            self.allowed[name] = 0

    def names_for(self, pods: Sequence[k8s.V1Pod]) -> tuple[str, ...]:
        return tuple(sorted({n for x in pods for n in self.matching.get(pod_key(x), ())}))


def read_budgets(
    policy: k8s.PolicyV1Api,
    pods: Sequence[k8s.V1Pod],
    *,
    request_timeout: float,
    budget_watch: BudgetWatch | None = None,
) -> Budgets:
    """The PodDisruptionBudgets of each namespace of ``pods`` (from ``budget_watch`` while it is
    fresh, else one list per namespace), matched to each pod."""
    budgets = Budgets()
    by_ns: dict[str, list[k8s.V1PodDisruptionBudget]] = {}
    for pod in pods:
        ns = str(metadata_of(pod).namespace)
        watched = budget_watch.in_namespace(ns) if budget_watch is not None and ns not in by_ns else None
        version = budget_watch.version() if budget_watch is not None and watched is not None else None
        if watched is not None and version is not None:
            by_ns[ns] = [typed(policy.api_client, x, "V1PodDisruptionBudget") for x in watched]
            budgets.versions[ns] = version
            for pdb in by_ns[ns]:
                budgets.allowed[f"{ns}/{metadata_of(pdb).name}"] = _disruptions_allowed(pdb)
        elif ns not in by_ns:
            with api_call(f"list PodDisruptionBudgets in {ns}"):
                listed = policy.list_namespaced_pod_disruption_budget(ns, _request_timeout=request_timeout)
            by_ns[ns] = list(listed.items or [])
            budgets.versions[ns] = str(listed.metadata.resource_version or "") if listed.metadata else ""
            for pdb in by_ns[ns]:
                budgets.allowed[f"{ns}/{metadata_of(pdb).name}"] = _disruptions_allowed(pdb)
        labels = metadata_of(pod).labels or {}
        budgets.matching[pod_key(pod)] = tuple(
            sorted(
                f"{ns}/{metadata_of(pdb).name}"
                for pdb in by_ns[ns]
                if selector_matches(pdb.spec.selector if pdb.spec else None, labels)
            )
        )
    return budgets


def _disruptions_allowed(pdb: k8s.V1PodDisruptionBudget) -> int:
    return int(pdb.status.disruptions_allowed or 0) if pdb.status else 0


def _budget_events(
    policy: k8s.PolicyV1Api, namespace: str, since: str, seconds: float, request_timeout: float
) -> Iterator[tuple[str, int]]:
    """``(namespace/name, disruptionsAllowed)`` for each budget change in ``namespace`` after the
    list's ``since`` version, for at most ``seconds`` (one watch request)."""
    watcher = k8s_watch.Watch()
    try:
        for event in watcher.stream(
            policy.list_namespaced_pod_disruption_budget,
            namespace,
            resource_version=since or None,
            timeout_seconds=max(1, int(seconds)),
            _request_timeout=(request_timeout, seconds + request_timeout),
        ):
            pdb = event.get("object") if isinstance(event, dict) else None
            if isinstance(pdb, k8s.V1PodDisruptionBudget):
                yield f"{namespace}/{metadata_of(pdb).name}", _disruptions_allowed(pdb)
    finally:
        watcher.stop()


class Outcome(StrEnum):
    EVICTED = "evicted"
    GONE = "gone"
    BUDGET = "budget"  # 429 DisruptionBudget: a PodDisruptionBudget holds it for now
    SEVERAL_BUDGETS = "several_budgets"  # 500: more than one budget matches; retrying cannot help
    RATE_LIMITED = "rate_limited"  # 429 from priority and fairness: try again later
    ERROR = "error"


def _status_causes(body: object) -> list[str]:
    """The ``details.causes[].reason`` of a Status body (empty when the body is not a Status)."""
    try:
        status = json.loads(body) if isinstance(body, str | bytes) else None
    except ValueError:
        return []
    details = status.get("details") if isinstance(status, dict) else None
    causes = details.get("causes") if isinstance(details, dict) else None
    return [str(c.get("reason")) for c in causes or [] if isinstance(c, dict)]


def retry_after(exc: ApiException) -> float | None:
    """The ``Retry-After`` header of an answer, in seconds (None when absent or not a number)."""
    value = (exc.headers or {}).get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def is_budget_block(body: object) -> bool:
    """Whether a 429's Status body names the cause ``DisruptionBudget`` (kube-apiserver's
    ``createTooManyRequestsError``); a 429 without it is rate limiting (priority and fairness)."""
    return "DisruptionBudget" in _status_causes(body)


def _outcome(exc: KubernetesError) -> tuple[Outcome, str]:
    """A delete's failure, as mapped by :mod:`healer.actions.apierrors`: 404, or 409 on the uid
    precondition, is gone (a new pod reusing the name is not ours); anything else, transport errors
    and timeouts included (``status`` None), fails this pod only."""
    if exc.status in (404, 409):
        return Outcome.GONE, ""
    return Outcome.ERROR, str(exc)[:300]


def evict(core: k8s.CoreV1Api, pod: k8s.V1Pod, grace: int, request_timeout: float) -> tuple[Outcome, str]:
    """One pod through the Eviction API (``uid`` precondition; ``grace`` seconds, -1 = the pod's
    own), answered as an :class:`Outcome` and a message (see the module docstring); never raises
    for an answer of the API server."""
    return _evict(core, pod, grace, request_timeout)


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
    for attempt in range(2):
        try:
            core.create_namespaced_pod_eviction(name, namespace, body, _request_timeout=request_timeout)
        except ApiException as exc:
            if exc.status in (404, 409):  # gone, or a new pod reusing the name: ours is gone
                return Outcome.GONE, ""
            if exc.status == 403 and "NamespaceTerminating" in _status_causes(exc.body):
                return Outcome.GONE, ""  # kubectl: the namespace controller deletes it; wait for that
            if exc.status == 429 and is_budget_block(exc.body):
                return Outcome.BUDGET, "a PodDisruptionBudget allows no disruption now"
            if exc.status == 429:
                wait = retry_after(exc)
                if attempt == 0:
                    time.sleep(min(RATE_LIMIT_WAIT_MAX, 1.0 if wait is None else wait))
                    continue
                return Outcome.RATE_LIMITED, f"rate limited by the API server (Retry-After {wait} s)"
            if exc.status == 500 and "more than one PodDisruptionBudget" in (exc.body or ""):
                return Outcome.SEVERAL_BUDGETS, "several PodDisruptionBudgets match this pod"
            return Outcome.ERROR, f"HTTP {exc.status}: {(exc.body or exc.reason or '')[:300]}"
        except (Urllib3Error, OSError) as exc:  # a timeout or a dropped connection: this pod only
            return Outcome.ERROR, f"evict pod {namespace}/{name}: {type(exc).__name__}: {exc}"[:300]
        return Outcome.EVICTED, ""
    raise AssertionError("unreachable")  # pragma: no cover


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
        return _outcome(exc)
    return Outcome.EVICTED, ""


def still_present(pods: list[k8s.V1Pod], now: datetime, skip_wait_seconds: float | None) -> list[k8s.V1Pod]:
    """``pods`` without those that count as gone: when ``skip_wait_seconds`` is set (the node is not
    Ready), pods terminating longer than that (their kubelet will never confirm)."""
    if skip_wait_seconds is None or skip_wait_seconds <= 0:
        return pods
    limit = timedelta(seconds=skip_wait_seconds)
    kept = []
    for pod in pods:
        since = metadata_of(pod).deletion_timestamp
        if since is not None and now - since >= limit:
            log.warning(
                "drain: %s terminating since %s on a NotReady node: counted as gone", pod_key(pod), since
            )
            continue
        kept.append(pod)
    return kept


@dataclass(frozen=True)
class Checkpointing:
    """Who is asked to checkpoint before eviction (:mod:`healer.actions.checkpoint`): the keys, the
    wait for pods that opt in by label (seconds), and the node's incident (named in the request)."""

    keys: ckpt.CheckpointKeys
    label_seconds: float = 600.0
    incident: int | None = None


def plan(
    core: k8s.CoreV1Api,
    node: str,
    *,
    options: DrainOptions,
    request_timeout: float,
    checkpointing: Checkpointing | None = None,
    now: datetime | None = None,
    pod_watch: PodWatch | None = None,
) -> DrainReport:
    """What a drain step would do now; evicts nothing and asks nothing. ``evicted`` lists the pods
    it would evict, ``checkpointing`` those it would ask to checkpoint first."""
    p = classify(list_node_pods(core, node, request_timeout=request_timeout, pod_watch=pod_watch), options)
    would = tuple(sorted(pod_key(x) for x in p.evict))
    asked: tuple[str, ...] = ()
    if checkpointing is not None and now is not None and not p.refused:
        g = _gate(
            core, p.evict, checkpointing, options, now=now, latest=None, request_timeout=request_timeout
        )
        asked = tuple(sorted(g.waiting))
    return DrainReport(
        done=not p.refused,
        evicted=() if p.refused else would,
        remaining=tuple(sorted([*would, *p.waiting])),
        refused=dict(p.refused),
        kept=tuple(sorted(p.kept)),
        dry_run=True,
        checkpointing=asked,
    )


def _gate(
    core: k8s.CoreV1Api,
    pods: Sequence[k8s.V1Pod],
    checkpointing: Checkpointing,
    options: DrainOptions,
    *,
    now: datetime,
    latest: datetime | None,
    request_timeout: float,
    ask: bool = False,
) -> ckpt.Gate:
    return ckpt.gate(
        core,
        pods,
        incident=checkpointing.incident,
        now=now,
        rule_seconds=options.checkpoint_seconds,
        label_seconds=checkpointing.label_seconds,
        keys=checkpointing.keys,
        request_timeout=request_timeout,
        ask=ask,
        latest=latest,
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
    node_ready: bool = True,
    skip_wait_for_delete_timeout_seconds: float = 300.0,
    checkpointing: Checkpointing | None = None,
    guard: Callable[[], str] | None = None,
    pod_watch: PodWatch | None = None,
    budget_watch: BudgetWatch | None = None,
) -> DrainReport:
    """Evict what can be evicted now; see the module docstring for every rule.

    ``guard`` runs immediately before each round of evictions and before deletions: a non-empty
    answer (why a human's change forbids going on) ends the step there, reported in ``stopped``
    with ``done`` False; it may raise ``KubernetesError`` (the node could not be read), which ends
    the step the same way as a failed pod list.

    With ``checkpointing``, pods that are to checkpoint first (:mod:`healer.actions.checkpoint`)
    are asked, and evicted only once they answered or their deadline (never later than the drain's)
    passed; until then they are in ``checkpointing`` and ``remaining``.

    Args:
        started_at, now: aware datetimes; the deadline is ``started_at + options.timeout_seconds``.
        node_ready: the node's ``Ready`` condition is ``True``; when not, pods terminating longer
            than ``skip_wait_for_delete_timeout_seconds`` count as gone (0 = wait forever).
        pod_watch, budget_watch: the watched stores the step reads the node's pods and the
            budgets from while they are fresh (:mod:`healer.actions.pod_watch`); the pods left
            at the end of the step are always listed from the API server (a store a moment
            behind never calls a node empty).

    Returns:
        ``done`` when no pod is left to evict or wait for; ``refused`` (nothing evicted) when a
        filter refuses pods; ``blocked`` with ``blocked_pods`` and ``budgets`` past the deadline,
        or at once when several budgets match a pod (HTTP 500).

    Raises:
        KubernetesError: listing pods or budgets failed (evictions' own failures are in ``errors``).
    """
    skip_wait = None if node_ready else skip_wait_for_delete_timeout_seconds
    pods = still_present(
        list_node_pods(core, node, request_timeout=request_timeout, pod_watch=pod_watch), now, skip_wait
    )
    p = classify(pods, options)
    if p.refused:
        log.warning("drain of %s refused: %s", node, p.refused)
        return DrainReport(
            done=False,
            remaining=tuple(sorted([*(pod_key(x) for x in p.evict), *p.waiting])),
            refused=dict(p.refused),
            kept=tuple(sorted(p.kept)),
        )
    deadline = started_at + timedelta(seconds=options.timeout_seconds)
    past_deadline = now >= deadline
    gate = ckpt.Gate(ready=list(p.evict))
    if checkpointing is not None and p.evict:
        gate = _gate(
            core,
            p.evict,
            checkpointing,
            options,
            now=now,
            latest=deadline,
            request_timeout=request_timeout,
            ask=True,
        )
        p.evict = gate.ready
    grace = options.grace_period_seconds
    evicted: list[str] = []
    errors: dict[str, str] = {}
    held: list[k8s.V1Pod] = []
    several: list[k8s.V1Pod] = []
    budgets = (
        read_budgets(policy, p.evict, request_timeout=request_timeout, budget_watch=budget_watch)
        if p.evict
        else Budgets()
    )
    waiting_until = time.monotonic() + (0.0 if past_deadline else options.budget_wait_seconds)
    todo = list(p.evict)
    events: dict[str, Iterator[tuple[str, int]]] = {}
    stopped = ""
    try:
        while todo:
            batch, later = [], []
            for x in todo:
                if budgets.may_post(x):
                    budgets.take(x)
                    batch.append(x)
                else:
                    later.append(x)  # its budget would refuse it now: not POSTed
            todo = later
            if batch and guard is not None and (stopped := guard()):
                break
            outcomes = _evict_all(core, batch, grace, request_timeout, options.concurrency)
            for x, (outcome, message) in zip(batch, outcomes, strict=True):
                if outcome is Outcome.EVICTED:
                    evicted.append(pod_key(x))
                    log.info("drain %s: evicted %s", node, pod_key(x))
                elif outcome is Outcome.ERROR:
                    errors[pod_key(x)] = message
                elif outcome is Outcome.RATE_LIMITED:
                    # Not a budget block and not an error: left on the node for the next step.
                    log.info("drain %s: %s %s; next step", node, pod_key(x), message)
                elif outcome is Outcome.SEVERAL_BUDGETS:
                    several.append(x)  # refused whatever we wait for
                elif outcome is Outcome.BUDGET and len(budgets.matching.get(pod_key(x), ())) == 1:
                    budgets.refused(x)
                    todo.append(x)  # a stale count: retried when the budget changes
                elif outcome is Outcome.BUDGET:
                    held.append(x)  # a budget we did not read (created since): held for the next step
            if not todo or time.monotonic() >= waiting_until:
                break
            if not _wait_for_budget(policy, budgets, todo, events, waiting_until, request_timeout):
                break
    finally:
        for stream in events.values():
            close = getattr(stream, "close", None)
            if close is not None:
                close()
    if stopped:
        log.warning("drain of %s stopped: %s", node, stopped)
        left = {pod_key(x) for x in p.evict} - set(evicted)
        return DrainReport(
            done=False,
            evicted=tuple(sorted(evicted)),
            remaining=tuple(sorted({*left, *p.waiting})),
            kept=tuple(sorted(p.kept)),
            errors=errors,
            stopped=stopped,
            checkpointing=tuple(sorted(gate.waiting)),
            checkpoints=gate.times,
        )
    held += todo + several
    budgets_names = budgets.names_for(held)
    deleted: list[str] = []
    if past_deadline and held and options.delete_after_timeout and guard is not None and (stopped := guard()):
        log.warning("drain of %s stopped before deleting past the deadline: %s", node, stopped)
        return DrainReport(
            done=False,
            evicted=tuple(sorted(evicted)),
            remaining=tuple(sorted({pod_key(x) for x in held} | set(p.waiting))),
            kept=tuple(sorted(p.kept)),
            errors=errors,
            stopped=stopped,
        )
    if past_deadline and held and options.delete_after_timeout:
        # The rule's explicit choice: DELETE bypasses the budgets. Recorded in the report.
        for x in held:
            outcome, message = _delete(core, x, grace, request_timeout)
            if outcome is Outcome.ERROR:
                errors[pod_key(x)] = message
            else:
                deleted.append(pod_key(x))
                log.warning(
                    "drain %s: deleted %s past the deadline (budgets %s)", node, pod_key(x), budgets_names
                )
        held = [x for x in held if pod_key(x) not in deleted]
    blocked_pods = [pod_key(x) for x in held]
    if past_deadline:
        blocked_pods += p.waiting  # still terminating at the deadline: reported, never force-deleted
        blocked_pods += list(errors)  # failing evictions (e.g. 403) end the drain instead of looping
    after = classify(
        still_present(list_node_pods(core, node, request_timeout=request_timeout), now, skip_wait), options
    )
    remaining = sorted({*(pod_key(x) for x in after.evict), *after.waiting, *after.refused})
    # Pods several budgets match can never be evicted: blocked now, not at the deadline in an hour.
    blocked = (past_deadline and bool(blocked_pods)) or bool(several)
    if blocked:
        log.warning(
            "drain of %s blocked at its deadline: pods %s, budgets %s", node, blocked_pods, budgets_names
        )
    return DrainReport(
        done=not remaining and not errors,
        evicted=tuple(sorted(evicted)),
        remaining=tuple(remaining),
        blocked_pods=tuple(sorted(blocked_pods)) if blocked else (),
        budgets=budgets_names,
        deleted=tuple(sorted(deleted)),
        blocked=blocked,
        kept=tuple(sorted(after.kept)),
        errors=errors,
        checkpointing=tuple(sorted(gate.waiting)),
        checkpoints=gate.times,
    )


def _evict_all(
    core: k8s.CoreV1Api, pods: Sequence[k8s.V1Pod], grace: int, request_timeout: float, concurrency: int
) -> list[tuple[Outcome, str]]:
    if not pods:
        return []
    if len(pods) == 1:
        return [_evict(core, pods[0], grace, request_timeout)]
    with ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="evict") as pool:
        return list(pool.map(lambda x: _evict(core, x, grace, request_timeout), pods))


def _wait_for_budget(
    policy: k8s.PolicyV1Api,
    budgets: Budgets,
    held: Sequence[k8s.V1Pod],
    events: dict[str, Iterator[tuple[str, int]]],
    until: float,
    request_timeout: float,
) -> bool:
    """Block until a budget holding one of ``held`` allows a disruption (True), or the watch
    ends, fails or ``until`` (monotonic) passes (False). One watch per namespace, kept open
    across rounds in ``events``."""
    ns = str(metadata_of(held[0]).namespace)
    wanted = set(budgets.names_for([x for x in held if str(metadata_of(x).namespace) == ns]))
    if ns not in events:
        events[ns] = _budget_events(
            policy, ns, budgets.versions.get(ns, ""), until - time.monotonic(), request_timeout
        )
    try:
        for name, allowed in events[ns]:
            budgets.allowed[name] = allowed
            if name in wanted and allowed > 0:
                return True
            if time.monotonic() >= until:
                return False
    except (ApiException, OSError, ValueError, Urllib3Error) as exc:
        log.info("watching PodDisruptionBudgets in %s failed (held pods wait for the next step): %s", ns, exc)
    return False
