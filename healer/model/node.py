"""A node as healer reads it from the API server, and the marks healer leaves on it."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


@dataclass(frozen=True)
class Condition:
    """One ``status.conditions`` entry (times as the API server wrote them, RFC 3339)."""

    status: str
    reason: str = ""
    message: str = ""
    last_transition_time: str = ""


@dataclass(frozen=True)
class NodeView:
    """What healer needs to know about a node, read once per reconcile.

    ``resource_version`` is the precondition of healer's next write (a 409 means someone else
    wrote in between); ``uid`` is what Events refer to. ``condition_details`` holds the full
    conditions by type (``conditions`` is type → status).
    """

    name: str
    unschedulable: bool
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    taints: tuple[tuple[str, str, str], ...] = ()  # (key, value, effect)
    conditions: dict[str, str] = field(default_factory=dict)  # type -> status
    uid: str = ""
    resource_version: str = ""
    condition_details: dict[str, Condition] = field(default_factory=dict)
    taint_added: dict[tuple[str, str], str] = field(default_factory=dict)  # (key, effect) -> timeAdded
    gpus: int | None = None  # allocatable nvidia.com/gpu; None = not known
    gpu_capacity: int | None = None  # capacity nvidia.com/gpu (unhealthy devices too); None = not known


#: The pool of nodes with no pool label that have no GPU (kept apart from GPU nodes, so CPU nodes
#: never dilute a GPU pool's budget or breaker percentage).
NO_GPU_POOL = "no-gpu"
#: The pool of GPU nodes (or nodes of unknown capacity) with no pool label.
DEFAULT_POOL = "default"


def pool_of(labels: dict[str, str], gpus: int | None, *, pool_labels: tuple[str, ...]) -> str:
    """A node's pool: the value of the first of ``pool_labels`` it carries; without any,
    ``default`` for a GPU node (or one of unknown capacity) and ``no-gpu`` for a node without GPUs."""
    for label in pool_labels:
        value = labels.get(label)
        if value:
            return value
    return DEFAULT_POOL if gpus is None or gpus > 0 else NO_GPU_POOL


@dataclass(frozen=True)
class Ownership:
    """Why healer touched a node; written as annotations ``<domain>/cordoned-by`` etc."""

    incident_id: int
    reason: str
    at: datetime
    actor: str = "healer"


@dataclass(frozen=True)
class OwnershipKeys:
    """The annotation keys healer writes on a node it acts on, under ``<domain>/``."""

    cordoned_by: str
    reason: str
    incident: str
    since: str

    @classmethod
    def for_domain(cls, domain: str) -> OwnershipKeys:
        return cls(
            cordoned_by=f"{domain}/cordoned-by",
            reason=f"{domain}/reason",
            incident=f"{domain}/incident",
            since=f"{domain}/since",
        )

    def all(self) -> tuple[str, str, str, str]:
        return (self.cordoned_by, self.reason, self.incident, self.since)


def cordoned_by_healer(view: NodeView, *, domain: str) -> bool:
    """healer's ``<domain>/cordoned-by`` annotation is on the node (healer set ``unschedulable``)."""
    return OwnershipKeys.for_domain(domain).cordoned_by in view.annotations


def human_uncordoned(view: NodeView, *, domain: str) -> bool:
    """A human uncordoned a node healer cordoned: healer's annotation is there, the cordon is not.

    The lifecycle records ``released`` and keeps its hands off until new evidence (kured and
    draino semantics: never fight a human).
    """
    return cordoned_by_healer(view, domain=domain) and not view.unschedulable


def incident_of(view: NodeView, *, domain: str) -> int | None:
    """The incident id healer recorded on the node (``<domain>/incident``), if any."""
    raw = view.annotations.get(OwnershipKeys.for_domain(domain).incident, "")
    return int(raw) if raw.isdigit() else None


@dataclass(frozen=True)
class NodeEdit:
    """What one reconcile step changes in a node's spec and metadata, sent as ONE patch.

    ``cordon``: set ``spec.unschedulable`` and healer's ownership annotations; ``taint``: healer's
    taint ``<domain>/quarantined=<value>:<effect>`` as ``(value, effect)``; ``release``: remove
    healer's taint and annotations, and uncordon when healer's annotation says it cordoned.
    """

    cordon: Ownership | None = None
    taint: tuple[str, TaintEffect] | None = None
    release: bool = False
