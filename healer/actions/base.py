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


class NodeActions(Protocol):
    """Cordon, taint, condition, Events, annotations, drain, uncordon, for one cluster."""

    def read_node(self, name: str) -> NodeView: ...

    def cordon(self, name: str, ownership: Ownership) -> None:
        """Set ``spec.unschedulable`` and healer's ownership annotations (incident, reason, time)."""

    def taint(self, name: str, *, value: str, effect: TaintEffect) -> None:
        """Add healer's taint ``<domain>/quarantined=<value>:<effect>`` (replacing an older one)."""

    def set_condition(self, name: str, *, healthy: bool, reason: str, message: str, now: datetime) -> None:
        """Set the ``GpuHealthy`` (configurable) node condition on the status subresource."""

    def event(self, name: str, *, reason: str, message: str, warning: bool = True) -> None:
        """Record a Kubernetes Event on the Node (``kubectl describe node`` shows it)."""

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

    def release(self, name: str) -> None:
        """Undo what healer did: remove its taint, condition and annotations; uncordon only if healer
        cordoned it (its annotation is present)."""
