"""Kueue quota that follows healthy capacity. Pure: nodes, quotas and ``now`` in, decisions out.

The healthy capacity of a ResourceFlavor is the sum of allocatable GPUs (``nvidia.com/gpu``) over
the nodes carrying all the flavor's node labels that are ``Ready``, schedulable and not held by
healer (quarantined, draining, awaiting repair, validating, blocked; or carrying healer's
quarantine taint or ownership annotations), minus the GPUs healer took out one by one on nodes it
keeps serving (one each; a GPU out that allocatable already misses, because a device plugin reports
it unhealthy, is not subtracted twice). The quota a ClusterQueue should have for that flavor is::

    target = max(floor, capacity - headroom)

and it moves with hysteresis:

* ``target > quota``: raised now (a node back in service is capacity at once);
* ``quota - target < hysteresis``: left alone (a GPU flickering in ``allocatable`` is noise);
* otherwise lowered once the shortfall has lasted ``lower_after_seconds`` (seen first at
  ``below_since``); a shortfall that ends before that changes nothing.

Why: Kueue admits gang-scheduled workloads against ``nominalQuota``; a quota above what the nodes
can hold admits a job whose pods then wait for GPUs that are out for repair (kueue#3183 asks for
quotas derived from nodes). Kueue's own docs: "nominalQuota should represent the resources in the
cluster available for running jobs" (ClusterQueue CRD, ``resourceGroups[].flavors[].resources[]``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from healer.engine.lifecycle import HELD
from healer.model.node import NodeView, OwnershipKeys
from healer.model.quota import Flavor, QuotaDecision, QuotaPolicy

#: Node states in which healer holds the node out of service (the lifecycle's own set).
HELD_STATES = HELD


def held_by_healer(view: NodeView, *, domain: str, state: str | None = None) -> bool:
    """healer holds the node: its recorded ``state`` is one of :data:`HELD_STATES` (what counts in
    dry-run, where the node carries no mark), or it carries healer's quarantine taint or
    ownership annotations (what counts when another replica's database is not at hand)."""
    if state is not None and state in HELD_STATES:
        return True
    if any(key == f"{domain}/quarantined" for key, _, _ in view.taints):
        return True
    keys = OwnershipKeys.for_domain(domain)
    return keys.cordoned_by in view.annotations or keys.incident in view.annotations


def selects(flavor: Flavor, view: NodeView) -> bool:
    """The flavor's node labels are all on the node (an empty set selects every node)."""
    return all(view.labels.get(k) == v for k, v in flavor.node_labels.items())


def healthy_capacity(
    nodes: Iterable[NodeView],
    flavor: Flavor,
    *,
    domain: str,
    states: Mapping[str, str] | None = None,
    gpus_out: Mapping[str, int] | None = None,
) -> int:
    """Allocatable GPUs (count) of the flavor's nodes that are Ready, schedulable and not held by
    healer; ``gpus_out`` (node → GPUs healer took out one by one: a DRA DeviceTaintRule or the
    ``gpus-out`` annotation) is subtracted from their nodes, one GPU each, save those allocatable
    already misses (:func:`not_yet_missing`)."""
    states = states or {}
    gpus_out = gpus_out or {}
    total = 0
    for view in nodes:
        if not selects(flavor, view) or not view.gpus:
            continue
        if view.conditions.get("Ready") != "True" or view.unschedulable:
            continue
        if held_by_healer(view, domain=domain, state=states.get(view.name)):
            continue
        total += max(0, view.gpus - not_yet_missing(view, gpus_out.get(view.name, 0)))
    return total


def not_yet_missing(view: NodeView, out: int) -> int:
    """Of the ``out`` GPUs healer took out of ``view`` one by one, those still counted in its
    allocatable: each lowers the capacity by one, except where allocatable already misses GPUs
    (``capacity - allocatable``: a device plugin honouring ``gpus-out`` reports them unhealthy,
    and the kubelet drops them from allocatable only), so a GPU out is never subtracted twice."""
    missing = max(0, view.gpu_capacity - (view.gpus or 0)) if view.gpu_capacity is not None else 0
    return max(0, out - missing)


def target(capacity: int, policy: QuotaPolicy) -> int:
    """``max(floor, capacity - headroom)``, in GPUs."""
    return max(policy.floor, capacity - policy.headroom)


def decide(
    *,
    cluster_queue: str,
    flavor: str,
    current: int | None,
    capacity: int,
    policy: QuotaPolicy,
    below_since: datetime | None,
    now: datetime,
) -> QuotaDecision:
    """What to do with one (ClusterQueue, flavor) quota now (see the module docstring).

    ``current`` None: the ClusterQueue has no quota for the resource in that flavor (nothing to
    keep in step; healer never adds a flavor or a resource to a ClusterQueue).
    """
    want = target(capacity, policy)

    def decision(set_to: int | None, reason: str, since: datetime | None = None) -> QuotaDecision:
        return QuotaDecision(cluster_queue, flavor, current, capacity, want, set_to, reason, since)

    if current is None:
        return decision(None, "no quota for the resource in this flavor: left alone")
    if want == current:
        return decision(None, "quota matches the healthy capacity")
    if want > current:
        return decision(want, f"healthy capacity back: raised from {current} to {want}")
    short = current - want
    if short < policy.hysteresis:
        return decision(
            None, f"{short} GPU(s) short, within the hysteresis of {policy.hysteresis}: left alone"
        )
    since = below_since or now
    waited = (now - since).total_seconds()
    if waited < policy.lower_after_seconds:
        wait = policy.lower_after_seconds - waited
        return decision(
            None, f"{short} GPU(s) short since {since.isoformat()}: lowered in {wait:.0f} s", since
        )
    floor = " (the floor)" if want == policy.floor and capacity - policy.headroom < policy.floor else ""
    return decision(
        want, f"healthy capacity {capacity} GPU(s): lowered from {current} to {want}{floor}", since
    )
