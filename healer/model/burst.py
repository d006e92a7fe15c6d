"""The burst's vocabulary: pods as the capacity rule sees them, the capacity numbers, the burst state.

A burst node (a virtual-kubelet node) is *open* when healer's burst taint is off it and *closed*
when it is on. Its state is not a health lifecycle state (:mod:`healer.model.states`): it has its
own recorded transitions (``burst_transitions``), written by :mod:`healer.controller.burst` only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any


class BurstState(StrEnum):
    """Whether pods may overflow onto the burst node now."""

    OPEN = "open"  # healer's burst taint is off: pods tolerating the provider's taint may land there
    CLOSED = "closed"  # healer's burst taint is on (NoSchedule): pods come back at the pace


@dataclass(frozen=True)
class Toleration:
    """One toleration of a pod (``spec.tolerations[]``); empty strings where the field is unset."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, key: str, value: str, effect: str) -> bool:
        """The Kubernetes rule (``v1helper.TolerationsTolerateTaint``): an empty effect matches
        every effect; ``Exists`` with an empty key matches every taint; ``Equal`` compares values."""
        if self.effect and self.effect != effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == key
        return self.key == key and self.value == value


@dataclass(frozen=True)
class PodFacts:
    """A pod as the capacity rule reads it (``namespace/name``, where it is bound, what it asks).

    ``gpus``: the sum of its containers' ``nvidia.com/gpu`` requests (limits when no request: an
    extended resource's request defaults to its limit). ``owner_kind``: the kind of its controller
    (``ReplicaSet``, ``Job``, ``DaemonSet``; "" when it has none), ``owner_uid`` its uid.
    ``phase``: ``status.phase``.
    """

    namespace: str
    name: str
    uid: str = ""
    node: str = ""
    phase: str = "Pending"
    gpus: int = 0
    terminating: bool = False
    owner_kind: str = ""
    owner_uid: str = ""
    mirror: bool = False
    labels: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def pending(self) -> bool:
        """Waiting for a node: Pending, unbound, not being deleted."""
        return self.phase == "Pending" and not self.node and not self.terminating

    def tolerates(self, key: str, value: str, effect: str) -> bool:
        return any(t.tolerates(key, value, effect) for t in self.tolerations)


@dataclass(frozen=True)
class Capacity:
    """The cluster's GPU capacity as one capacity rule sees it now (counts of GPUs and pods).

    ``free_gpus``: allocatable ``nvidia.com/gpu`` of the in-cluster nodes that can take pods (Ready,
    schedulable, not held by healer, not a burst node) minus the requests of the non-finished pods
    bound to them; ``free_by_node`` the same per node. ``pending_gpu_pods``: pods requesting GPUs
    that wait unbound. ``kueue_pending``: Kueue Workloads not admitted (None: not read).
    ``held_gpus``: allocatable GPUs of nodes healer holds out of service (quarantined and after).
    """

    free_gpus: int
    pending_gpu_pods: int
    kueue_pending: int | None = None
    free_by_node: dict[str, int] = field(default_factory=dict)
    held_gpus: int = 0
    total_gpus: int = 0

    def evidence(self) -> dict[str, Any]:
        """The numbers recorded with a toggle."""
        return {
            "free_gpus": self.free_gpus,
            "pending_gpu_pods": self.pending_gpu_pods,
            "kueue_pending_workloads": self.kueue_pending,
            "held_gpus": self.held_gpus,
            "total_gpus": self.total_gpus,
        }


@dataclass(frozen=True)
class BurstMemory:
    """What the burst state machine remembers of one burst node between runs.

    ``state``: as last recorded (or, never recorded, as read from the node's taint). ``by_hand``: a
    human changed the taint against healer's last toggle; healer leaves it until the signals agree
    with the human's choice for their ``for``/hold. ``short_since``/``free_since``: when the
    current run of shortage / free capacity began (None: not now).
    """

    state: BurstState
    by_hand: bool = False
    short_since: datetime | None = None
    free_since: datetime | None = None


@dataclass(frozen=True)
class BurstDecision:
    """One run of the machine for one burst node: the memory to keep, and the toggle to make.

    ``toggle``: the state to move to (None: nothing to record); ``act``: whether the move changes the
    node (False for a move that only records: a human's change seen, or healer taking it back).
    """

    memory: BurstMemory
    toggle: BurstState | None = None
    act: bool = False
    reason: str = ""


@dataclass(frozen=True)
class Claim:
    """A pod sent back off a burst node whose replacement may not be placed yet: its GPUs are
    spoken for until a new pod of the same controller shows up (bound: counted; pending: returns
    wait) or ``at`` is long past. ``siblings``: the uids of that controller's GPU pods when it left."""

    uid: str
    gpus: int
    at: datetime
    owner_uid: str
    siblings: frozenset[str] = frozenset()

    def replaced(self, pods: list[PodFacts]) -> bool:
        """A pod of the same controller that was not there when this one left exists now."""
        return bool(self.owner_uid) and any(
            p.owner_uid == self.owner_uid and p.uid not in self.siblings and p.uid != self.uid for p in pods
        )
