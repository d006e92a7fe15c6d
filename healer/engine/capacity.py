"""The cluster's GPU capacity as a capacity rule sees it, and which burst pods may come back. Pure.

Free GPUs (:func:`capacity`): the allocatable ``nvidia.com/gpu`` of the in-cluster nodes that can
take pods now (``Ready``, schedulable, not held by healer: a quarantined node reduces the capacity,
see :func:`healer.engine.quota.held_by_healer`; not a burst node) minus the GPU requests of the
pods bound to them that have not finished (a terminating pod still holds its GPUs). Pending GPU
pods: pods requesting GPUs, ``Pending`` and bound to no node.

Coming back (:func:`plan_returns`): a pod on a closed burst node is evicted only when the cluster
can place it: its GPU request fits the free GPUs of one in-cluster node (first fit, largest
requests first, each placed pod taking its GPUs). CPU and memory are not checked (GPU nodes are
sized for their GPUs' pods). A pod stays, with the reason, when it tolerates healer's burst taint
(it chose the burst node), is a DaemonSet or mirror pod (it belongs to its node), has no controller
(an eviction would delete it for good), or would wait ``Pending`` for GPUs; terminating and
finished pods are neither counted nor evicted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from healer.engine.quota import held_by_healer
from healer.model.burst import Capacity, PodFacts
from healer.model.node import NodeView


def capacity(
    nodes: Iterable[NodeView],
    pods: Iterable[PodFacts],
    *,
    is_burst: Callable[[NodeView], bool],
    domain: str,
    in_cluster: Callable[[NodeView], bool] = lambda view: True,
    counts_pending: Callable[[PodFacts], bool] = lambda pod: True,
    states: Mapping[str, str] | None = None,
    kueue_pending: int | None = None,
) -> Capacity:
    """The :class:`~healer.model.burst.Capacity` of the cluster now.

    ``pods``: at least every pod requesting GPUs, bound or pending (others are ignored);
    ``in_cluster``: the nodes (not burst nodes) whose GPUs count (default every one);
    ``counts_pending``: the pending pods that count as demand (default every one);
    ``states``: node → healer's recorded lifecycle state (what counts as held in dry-run, where
    the node carries no mark); ``kueue_pending``: Kueue Workloads waiting for admission, or None.
    """
    states = states or {}
    free: dict[str, int] = {}
    held = total = 0
    for view in nodes:
        if not view.gpus or is_burst(view) or not in_cluster(view):
            continue
        total += view.gpus
        if held_by_healer(view, domain=domain, state=states.get(view.name)):
            held += view.gpus
            continue
        if view.conditions.get("Ready") != "True" or view.unschedulable:
            continue
        free[view.name] = view.gpus
    pending = 0
    for pod in pods:
        if pod.gpus <= 0 or pod.finished:
            continue
        if pod.pending:
            pending += 1 if counts_pending(pod) else 0
        elif pod.node in free:
            free[pod.node] -= pod.gpus
    free = {name: max(0, gpus) for name, gpus in free.items()}
    return Capacity(
        free_gpus=sum(free.values()),
        pending_gpu_pods=pending,
        kueue_pending=kueue_pending,
        free_by_node=free,
        held_gpus=held,
        total_gpus=total,
    )


@dataclass(frozen=True)
class ReturnPlan:
    """The pods of a closed burst node: those to evict now, in order, and those that stay, with why
    (``namespace/name`` → reason). ``out``: every pod counted as on the burst node."""

    back: list[PodFacts] = field(default_factory=list)
    stay: dict[str, str] = field(default_factory=dict)
    out: list[PodFacts] = field(default_factory=list)


def plan_returns(
    pods: Iterable[PodFacts],
    free_by_node: Mapping[str, int],
    *,
    taint: tuple[str, str, str],
    claims: Iterable[int] = (),
) -> ReturnPlan:
    """Which of a burst node's ``pods`` may come back into the cluster now (see the module
    docstring). ``taint``: healer's burst taint ``(key, value, effect)``; ``claims``: the GPU
    requests of pods sent back that may not be placed yet, placed first (their GPUs are spoken for)."""
    free = dict(free_by_node)
    for gpus in sorted(claims, reverse=True):
        node = next((n for n in sorted(free) if free[n] >= gpus), None)
        if node is not None:
            free[node] -= gpus
        elif free:  # not placeable as a whole: still takes what is left of the largest
            largest = max(free, key=lambda n: free[n])
            free[largest] = 0
    plan = ReturnPlan()
    candidates: list[PodFacts] = []
    for pod in pods:
        if pod.finished or pod.terminating or pod.mirror:
            continue
        plan.out.append(pod)
        if pod.tolerates(*taint):
            plan.stay[pod.key] = "tolerates healer's burst taint: it may run on the burst node"
        elif pod.owner_kind == "DaemonSet":
            plan.stay[pod.key] = "a DaemonSet pod: it belongs to its node"
        elif not pod.owner_kind:
            plan.stay[pod.key] = "no controller: an eviction would delete it for good"
        else:
            candidates.append(pod)
    for pod in sorted(candidates, key=lambda p: (-p.gpus, p.key)):
        if pod.gpus <= 0:
            plan.back.append(pod)
            continue
        node = next((n for n in sorted(free) if free[n] >= pod.gpus), None)
        if node is None:
            most = max(free.values(), default=0)
            plan.stay[pod.key] = (
                f"no capacity: it requests {pod.gpus} GPU(s) and no in-cluster node has more than "
                f"{most} free; evicted it would wait Pending"
            )
            continue
        free[node] -= pod.gpus
        plan.back.append(pod)
    return plan
