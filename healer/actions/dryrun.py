"""Dry-run: the same :class:`~healer.actions.base.NodeActions` shape, recording instead of acting.

Reads go to the cluster for real (through a :class:`NodeReader`, normally a
``KubernetesNodeActions``), so decisions see the true node and pods; every write becomes a row in
the ``actions`` table with status ``dry_run`` (and a log line) and nothing changes in the cluster.
Dry-run is this wiring choice, never an ``if`` in callers.

Action kinds recorded: ``cordon``, ``taint``, ``condition``, ``event``, ``drain``, ``release``;
``detail`` holds the arguments (and for ``drain`` the pods a drain would evict, keep or refuse).

Each record is its own short transaction on the given sessionmaker, committed at once, so the
audit log holds it even if the caller's tick later rolls back. On SQLite, call the adapter while
the caller holds no write transaction of its own on the same file (the second writer would wait
for the busy timeout).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from healer.actions.base import DrainReport, NodeView, Ownership, TaintEffect
from healer.engine.states import ActionStatus
from healer.store.models import Incident, Node
from healer.store.nodes import open_incident, record_action
from healer.store.session import transaction

log = logging.getLogger(__name__)


class NodeReader(Protocol):
    """The read side of the Kubernetes adapter (``KubernetesNodeActions`` has it)."""

    def read_node(self, name: str) -> NodeView: ...

    def plan_drain(
        self, name: str, *, delete_emptydir_data: bool, ignore_daemonsets: bool, force: bool
    ) -> DrainReport: ...


class RecordingNodeActions:
    """:class:`~healer.actions.base.NodeActions` that writes intended actions to the database.

    Args:
        reader: real reads (node, and the drain plan from the node's pods).
        sessions: sessionmaker of healer's database; each record commits on its own.
        actor: the ``actor`` of recorded rows.
        clock: aware-UTC ``now`` for calls that carry no time (the composition root's clock).
    """

    def __init__(
        self,
        reader: NodeReader,
        sessions: sessionmaker[Session],
        *,
        actor: str = "healer",
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.reader = reader
        self.sessions = sessions
        self.actor = actor
        self.clock = clock

    def _record(
        self,
        kind: str,
        name: str,
        *,
        now: datetime,
        detail: dict[str, Any],
        incident_id: int | None = None,
    ) -> None:
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

    def read_node(self, name: str) -> NodeView:
        """The real node (raises ``KubernetesNotFound`` when it is gone)."""
        return self.reader.read_node(name)

    def cordon(self, name: str, ownership: Ownership) -> None:
        """Record ``cordon`` (incident, reason, since)."""
        self._record(
            "cordon",
            name,
            now=ownership.at,
            incident_id=ownership.incident_id,
            detail={"reason": ownership.reason, "since": ownership.at.isoformat(), "by": ownership.actor},
        )

    def taint(self, name: str, *, value: str, effect: TaintEffect) -> None:
        """Record ``taint`` (value, effect)."""
        self._record("taint", name, now=self.clock(), detail={"value": value, "effect": effect})

    def set_condition(self, name: str, *, healthy: bool, reason: str, message: str, now: datetime) -> None:
        """Record ``condition`` (healthy, reason, message)."""
        self._record(
            "condition", name, now=now, detail={"healthy": healthy, "reason": reason, "message": message}
        )

    def event(
        self, name: str, *, reason: str, message: str, warning: bool = True, now: datetime | None = None
    ) -> None:
        """Record ``event`` (reason, message, type)."""
        self._record(
            "event",
            name,
            now=now or self.clock(),
            detail={"reason": reason, "message": message, "type": "Warning" if warning else "Normal"},
        )

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
        """Record ``drain`` with what a drain would do now (from the node's real pods).

        Returns the plan (``dry_run=True``): ``done`` unless kubectl's filters would refuse, with
        ``evicted`` listing the pods a drain would evict.
        """
        report = self.reader.plan_drain(
            name, delete_emptydir_data=delete_emptydir_data, ignore_daemonsets=ignore_daemonsets, force=force
        )
        self._record(
            "drain",
            name,
            now=now,
            detail={
                "would_evict": list(report.evicted),
                "kept": list(report.kept),
                "refused": dict(report.refused),
                "timeout_seconds": timeout_seconds,
                "grace_period_seconds": grace_period_seconds,
                "delete_emptydir_data": delete_emptydir_data,
                "ignore_daemonsets": ignore_daemonsets,
                "force": force,
                "delete_after_timeout": delete_after_timeout,
                "concurrency": concurrency,
            },
        )
        return report

    def release(self, name: str, *, now: datetime | None = None) -> None:
        """Record ``release``."""
        self._record("release", name, now=now or self.clock(), detail={})
