"""The narrow interface the controller uses to act on nodes.

Two implementations: ``kubernetes.KubernetesNodeActions`` (the official client, real effects) and
``dryrun.RecordingNodeActions`` (writes the intended action to the database and the log, nothing to
the cluster). Dry-run is this wiring choice, not ``if`` statements in callers.

A reconcile reads the node once (:meth:`NodeActions.read_node`) and hands that
:class:`~healer.model.node.NodeView` to every write of its step: the writes use its
``resourceVersion`` as their precondition and its ``uid`` for Events, and return the node as the API
server answered, for the next step. Passing a node name instead reads the node first.

All methods are idempotent (calling twice leaves the node as calling once) and raise
:class:`healer.errors.KubernetesError` subclasses; ``KubernetesNotFound`` when the node is gone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Protocol

from healer.model.drain import DrainOptions, DrainReport
from healer.model.node import (
    NodeEdit,
    NodeView,
    Ownership,
    OwnershipKeys,
    TaintEffect,
    cordoned_by_healer,
    human_uncordoned,
    incident_of,
)
from healer.model.states import ActionStatus

__all__ = [
    "DrainOptions",
    "DrainReport",
    "NodeActions",
    "NodeEdit",
    "NodeView",
    "Ownership",
    "OwnershipKeys",
    "TaintEffect",
    "cordoned_by_healer",
    "human_uncordoned",
    "incident_of",
]

#: A node as read this reconcile, or its name (then the adapter reads it first).
NodeRef = NodeView | str


class NodeActions(Protocol):
    """Read a node; edit it (cordon, taint, annotations, release) in one patch; set its condition;
    record Events; drain it one step at a time.

    ``status`` is what a write amounts to: ``succeeded`` (the cluster changed) or ``dry_run`` (the
    adapter recorded the intent in the ``actions`` table itself, and changed nothing).
    """

    status: ActionStatus

    def read_node(self, name: str) -> NodeView: ...

    def watched_nodes(self, names: Sequence[str]) -> Mapping[str, NodeView]:
        """The nodes of ``names`` as the Node watch holds them, for a pass to start from without a
        GET each; empty while no watch is synced and fresh. A name missing (a node the store does
        not hold, or any without a watch) is to be read with :meth:`read_node`. A view behind the
        API server is safe to start from: every write carries its ``resourceVersion``, and a 409
        makes the write read the node again."""

    def edit(self, node: NodeRef, change: NodeEdit) -> NodeView:
        """Apply ``change`` in one patch carrying the node's ``resourceVersion``; the node after it."""

    def cordon(self, node: NodeRef, ownership: Ownership) -> NodeView:
        """``edit`` with a cordon only (``spec.unschedulable`` and the ownership annotations)."""

    def taint(self, node: NodeRef, *, value: str, effect: TaintEffect) -> NodeView:
        """``edit`` with healer's taint only (replacing an older one of healer's)."""

    def set_condition(
        self, node: NodeRef, *, healthy: bool, reason: str, message: str, now: datetime
    ) -> NodeView:
        """Set the ``GpuHealthy`` (configurable) node condition on the status subresource."""

    def event(
        self, node: NodeRef, *, reason: str, message: str, warning: bool = True, now: datetime | None = None
    ) -> None:
        """Record a Kubernetes Event on the Node (``kubectl describe node`` shows it).

        ``now`` is the event time (the adapter's clock when omitted)."""

    def drain_step(
        self, node: NodeRef, *, started_at: datetime, now: datetime, options: DrainOptions
    ) -> DrainReport:
        """Evict what can be evicted now (kubectl drain filters; 429 = PodDisruptionBudget, retry later)."""

    def annotate(self, node: NodeRef, annotations: dict[str, str | None], *, what: str) -> NodeView:
        """Set (None: remove) annotations on the node in one patch (a repair request for the node
        agent); ``what`` names the write in logs and records. The node after it."""

    def release(self, node: NodeRef, *, now: datetime | None = None) -> NodeView:
        """Undo what healer did: remove its taint and annotations, set its condition back to healthy
        (at ``now``); uncordon only if healer cordoned it (its annotation is present)."""
