"""Dry-run: the same :class:`~healer.actions.base.NodeActions` shape, recording instead of acting.

Reads go to the cluster for real (through a :class:`NodeReader`, normally a
``KubernetesNodeActions``), so decisions see the true node and pods; every write becomes a row in
the ``actions`` table with status ``dry_run`` (and a log line) and nothing changes in the cluster.
Dry-run is this wiring choice, never an ``if`` in callers.

Action kinds recorded: ``cordon``, ``taint``, ``condition``, ``event``, ``drain``, ``release``;
``detail`` holds the arguments (and for ``drain`` the pods a drain would evict, keep or refuse).
Other dry-run adapters write through :meth:`RecordingNodeActions.record` (validation Jobs:
:mod:`healer.actions.validation_dryrun`).

Each record is its own short transaction on the given sessionmaker, committed at once, so the
audit log holds it even if the caller's tick later rolls back. On SQLite, call the adapter while
the caller holds no write transaction of its own on the same file (the second writer would wait
for the busy timeout).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from healer.actions.base import NodeRef
from healer.clock import utc_now
from healer.model.drain import DrainOptions, DrainReport
from healer.model.node import NodeEdit, NodeView, Ownership, TaintEffect
from healer.model.states import ActionStatus
from healer.store.models import Incident, Node
from healer.store.nodes import open_incident, record_action
from healer.store.session import transaction

log = logging.getLogger(__name__)


class NodeReader(Protocol):
    """The read side of the Kubernetes adapter (``KubernetesNodeActions`` has it)."""

    #: healer's taint key (``<domain>/quarantined``).
    taint_key: str

    def read_node(self, name: str) -> NodeView: ...

    def plan_drain(self, name: str, *, options: DrainOptions, now: datetime | None = None) -> DrainReport: ...


class RecordingNodeActions:
    """:class:`~healer.actions.base.NodeActions` that writes intended actions to the database.

    Args:
        reader: real reads (node, and the drain plan from the node's pods).
        sessions: sessionmaker of healer's database; each record commits on its own.
        actor: the ``actor`` of recorded rows.
        clock: aware-UTC ``now`` for calls that carry no time (the composition root's clock).

    Reads show the node as healer would have left it: a node the open incident expects cordoned
    reads unschedulable and carries healer's taint (else the missing cordon or taint would look
    like a human's uncordon or untaint).
    """

    #: Writes are recorded here as ``dry_run`` rows; the controller adds none of its own for them.
    status = ActionStatus.DRY_RUN

    def __init__(
        self,
        reader: NodeReader,
        sessions: sessionmaker[Session],
        *,
        actor: str = "healer",
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.reader = reader
        self.sessions = sessions
        self.actor = actor
        self.clock = clock

    def record(
        self,
        kind: str,
        name: str,
        *,
        now: datetime,
        detail: dict[str, Any],
        incident_id: int | None = None,
    ) -> None:
        """Write one ``dry_run`` action ``kind`` on node ``name`` (its open incident unless
        ``incident_id``) with ``detail``, in its own committed transaction, and log it."""
        with transaction(self.sessions) as session:
            node = session.scalar(select(Node).where(Node.name == name))
            incident = session.get(Incident, incident_id) if incident_id is not None else None
            if incident is None and node is not None:
                incident = open_incident(session, node)
            record_action(
                session,
                kind=kind,
                status=ActionStatus.DRY_RUN,
                actor=self.actor,
                now=now,
                node=node,
                incident=incident,
                target=name,
                detail=detail,
            )
        log.info("dry-run: would %s node %s: %s", kind, name, detail)

    def watched_nodes(self, names: Sequence[str]) -> Mapping[str, NodeView]:
        """Nothing: each node is read (:meth:`read_node` lays what healer would have done over it)."""
        return {}

    def read_node(self, name: str) -> NodeView:
        """The real node, with the cordon and taint healer would have left on it (raises
        ``KubernetesNotFound`` when it is gone)."""
        view = self.reader.read_node(name)
        with self.sessions() as session:
            row = session.execute(
                select(Incident.expect_unschedulable, Incident.rule)
                .join(Node, Node.id == Incident.node_id)
                .where(Node.name == name, Incident.closed_at.is_(None))
            ).first()
        if row is None or row.expect_unschedulable is None:
            return view
        key = self.reader.taint_key
        taints = view.taints
        if not any(t[0] == key for t in taints):
            taints = (*taints, (key, row.rule or "", "NoSchedule"))
        return replace(view, unschedulable=row.expect_unschedulable, taints=taints)

    def _view(self, node: NodeRef) -> NodeView:
        return node if isinstance(node, NodeView) else self.read_node(node)

    def edit(self, node: NodeRef, change: NodeEdit) -> NodeView:
        """Record ``cordon`` (incident, reason, since), ``taint`` (value, effect) and ``release``, one
        row each; returns the node as the edit would leave it (cordoned)."""
        view = self._view(node)
        if change.cordon is not None:
            own = change.cordon
            self.record(
                "cordon",
                view.name,
                now=own.at,
                incident_id=own.incident_id,
                detail={"reason": own.reason, "since": own.at.isoformat(), "by": own.actor},
            )
            view = replace(view, unschedulable=True)
        if change.taint is not None:
            value, effect = change.taint
            self.record("taint", view.name, now=self.clock(), detail={"value": value, "effect": effect})
            key = self.reader.taint_key
            view = replace(view, taints=(*(t for t in view.taints if t[0] != key), (key, value, effect)))
        if change.release:
            self.record("release", view.name, now=self.clock(), detail={})
        return view

    def annotate(self, node: NodeRef, annotations: dict[str, str | None], *, what: str) -> NodeView:
        """Record ``what`` (e.g. ``repair-request``) with the annotations it would set."""
        view = self._view(node)
        self.record(what, view.name, now=self.clock(), detail={"annotations": dict(annotations)})
        return view

    def cordon(self, node: NodeRef, ownership: Ownership) -> NodeView:
        """Record ``cordon`` (incident, reason, since)."""
        return self.edit(node, NodeEdit(cordon=ownership))

    def taint(self, node: NodeRef, *, value: str, effect: TaintEffect) -> NodeView:
        """Record ``taint`` (value, effect)."""
        return self.edit(node, NodeEdit(taint=(value, effect)))

    def set_condition(
        self, node: NodeRef, *, healthy: bool, reason: str, message: str, now: datetime
    ) -> NodeView:
        """Record ``condition`` (healthy, reason, message)."""
        view = self._view(node)
        self.record(
            "condition", view.name, now=now, detail={"healthy": healthy, "reason": reason, "message": message}
        )
        return view

    def event(
        self, node: NodeRef, *, reason: str, message: str, warning: bool = True, now: datetime | None = None
    ) -> None:
        """Record ``event`` (reason, message, type)."""
        self.record(
            "event",
            node.name if isinstance(node, NodeView) else node,
            now=now or self.clock(),
            detail={"reason": reason, "message": message, "type": "Warning" if warning else "Normal"},
        )

    def drain_step(
        self, node: NodeRef, *, started_at: datetime, now: datetime, options: DrainOptions
    ) -> DrainReport:
        """Record ``drain`` with what a drain would do now (from the node's real pods).

        Returns the plan (``dry_run=True``): ``done`` unless kubectl's filters would refuse, with
        ``evicted`` listing the pods a drain would evict.
        """
        name = node.name if isinstance(node, NodeView) else node
        report = self.reader.plan_drain(name, options=options, now=now)
        self.record(
            "drain",
            name,
            now=now,
            detail={
                "would_evict": list(report.evicted),
                "would_ask_checkpoint": list(report.checkpointing),
                "checkpoint_seconds": options.checkpoint_seconds,
                "kept": list(report.kept),
                "refused": dict(report.refused),
                "timeout_seconds": options.timeout_seconds,
                "grace_period_seconds": options.grace_period_seconds,
                "delete_emptydir_data": options.delete_emptydir_data,
                "ignore_daemonsets": options.ignore_daemonsets,
                "force": options.force,
                "delete_after_timeout": options.delete_after_timeout,
                "concurrency": options.concurrency,
            },
        )
        return report

    def release(self, node: NodeRef, *, now: datetime | None = None) -> NodeView:
        """Record ``release``."""
        view = self._view(node)
        self.record("release", view.name, now=now or self.clock(), detail={})
        return view
