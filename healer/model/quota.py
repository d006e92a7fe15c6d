"""Kueue quota sync: what the pure engine (:mod:`healer.engine.quota`) takes and returns.

Shapes only. A ClusterQueue's ``nominalQuota`` of ``nvidia.com/gpu`` per ResourceFlavor follows the
healthy capacity of the nodes the flavor selects (see the engine for the rules).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True)
class QuotaPolicy:
    """How capacity becomes quota, all in GPUs (counts) and seconds.

    ``headroom``: GPUs kept out of the quota (spares for a node's worth of failures);
    ``floor``: the quota never goes below this; ``hysteresis``: a shortfall smaller than this many
    GPUs does not lower the quota (a GPU or two flickering in ``allocatable`` is not a change of
    capacity); ``lower_after_seconds``: a shortfall must last this long before the quota is lowered
    (a node that is NotReady for one heartbeat does not move it). Raising is never delayed: a node
    back in service is capacity at once.
    """

    headroom: int = 0
    floor: int = 0
    hysteresis: int = 1
    lower_after_seconds: float = 60.0


@dataclass(frozen=True)
class Flavor:
    """A Kueue ResourceFlavor as healer counts it: its name and the node labels it selects
    (the flavor's ``spec.nodeLabels``, copied into healer's settings)."""

    name: str
    node_labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class QuotaDecision:
    """One (ClusterQueue, flavor): the quota now, the healthy capacity, the target, and what to do.

    ``set_to`` is the quota to apply now (None: leave it); ``below_since`` is when a shortfall
    beyond the hysteresis was first seen (carried to the next round; None when there is none);
    ``reason`` says why in one line.
    """

    cluster_queue: str
    flavor: str
    current: int | None
    capacity: int
    target: int
    set_to: int | None
    reason: str
    below_since: datetime | None = None
