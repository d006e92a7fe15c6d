"""The narrow interface the remediation code uses to act on nodes.

Two implementations: ``kubernetes.KubernetesNodeActions`` (the official client, real effects) and
``dryrun.RecordingNodeActions`` (writes the intended action to the database and the log, nothing to
the cluster). Dry-run is this wiring choice, not ``if`` statements in callers.

All methods are idempotent (calling twice leaves the node as calling once) and raise
:class:`healer.errors.KubernetesError` subclasses; ``KubernetesNotFound`` when the node is gone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Protocol

TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


@dataclass(frozen=True)
class NodeView:
    """What healer needs to know about a node, read fresh before each destructive step."""

    name: str
    unschedulable: bool
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    taints: tuple[tuple[str, str, str], ...] = ()  # (key, value, effect)
    conditions: dict[str, str] = field(default_factory=dict)  # type -> status
    uid: str = ""
    resource_version: str = ""


@dataclass(frozen=True)
class Ownership:
    """Why healer touched a node; written as annotations ``<domain>/cordoned-by`` etc."""

    incident_id: int
    reason: str
    at: datetime
    actor: str = "healer"


@dataclass(frozen=True)
class DrainReport:
    """Outcome of one drain step (the drain may need several, across controller restarts).

    ``done``: nothing left to evict; ``blocked``: the deadline passed with pods still protected
    (``blocked_pods`` names them, ``budgets`` names the PodDisruptionBudgets); ``refused``: pods
    kubectl would refuse to drain (emptyDir, unmanaged) when not allowed, with the reason per pod.
    """

    done: bool
    evicted: tuple[str, ...] = ()  # "namespace/name"
    remaining: tuple[str, ...] = ()
    blocked_pods: tuple[str, ...] = ()
    budgets: tuple[str, ...] = ()
    refused: dict[str, str] = field(default_factory=dict)
    deleted: tuple[str, ...] = ()  # deleted past the deadline (only when the rule says so)
    blocked: bool = False
    kept: tuple[str, ...] = ()  # DaemonSet and mirror pods left in place, as kubectl drain does
    errors: dict[str, str] = field(default_factory=dict)  # pod -> unexpected API error (retried next step)
    stopped: str = ""  # why the step did nothing (e.g. the node is schedulable again: a human uncordon)
    dry_run: bool = False  # what a drain would do now; nothing was evicted

    @property
    def refused_any(self) -> bool:
        """kubectl would refuse this drain (``refused`` names the pods and why)."""
        return bool(self.refused)


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


class NodeActions(Protocol):
    """Cordon, taint, condition, Events, annotations, drain, uncordon, for one cluster."""

    def read_node(self, name: str) -> NodeView: ...

    def cordon(self, name: str, ownership: Ownership) -> None:
        """Set ``spec.unschedulable`` and healer's ownership annotations (incident, reason, time)."""

    def taint(self, name: str, *, value: str, effect: TaintEffect) -> None:
        """Add healer's taint ``<domain>/quarantined=<value>:<effect>`` (replacing an older one)."""

    def set_condition(self, name: str, *, healthy: bool, reason: str, message: str, now: datetime) -> None:
        """Set the ``GpuHealthy`` (configurable) node condition on the status subresource."""

    def event(
        self, name: str, *, reason: str, message: str, warning: bool = True, now: datetime | None = None
    ) -> None:
        """Record a Kubernetes Event on the Node (``kubectl describe node`` shows it).

        ``now`` is the event time (the adapter's clock when omitted)."""

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
        """Evict what can be evicted now (kubectl drain filters; 429 = PodDisruptionBudget, retry later)."""

    def release(self, name: str, *, now: datetime | None = None) -> None:
        """Undo what healer did: remove its taint and annotations, set its condition back to healthy
        (at ``now``); uncordon only if healer cordoned it (its annotation is present)."""
