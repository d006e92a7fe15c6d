"""Ownership reconcile: healer's marks on the cluster agree with its database, on start and every tick.

healer writes the cluster first and records after (see :mod:`healer.controller.reconcile`). A
process killed in between, or a database restored from an older backup, leaves a node cordoned,
tainted and ``GpuHealthy=False`` by healer while the record calls it healthy, with nothing to
release it. Each tick, before remediation, the leader lists the nodes carrying healer's marks
(ownership annotations or healer's taint) and, for each one the record does not account for
(no open incident and a state that is not out of service):

* a finding still firing or pending on it: left alone: the remediation pass adopts it (it walks the
  lifecycle again and opens the incident; the cordon it finds in place is not written twice);
* otherwise: released as a quarantine ends (condition True, healer's taint and annotations removed,
  uncordoned only when healer cordoned it), with one ``release`` audit row naming the step that was
  interrupted (the node's recorded intent) when there is one.

Nothing is released while a rule's query is failing (``frozen_rules``): its finding may still be
firing unseen. Only the leader runs this; its fence is checked before each write and record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from healer.actions.base import NodeActions
from healer.controller.fence import Fence
from healer.errors import KubernetesError, KubernetesNotFound
from healer.model.findings import TickFindings
from healer.model.node import NodeView
from healer.model.states import OUT_OF_SERVICE, ActionStatus, NodeState
from healer.store import nodes as repo
from healer.store.models import Incident, Node
from healer.store.session import transaction

log = logging.getLogger(__name__)

#: Recorded states that account for healer's marks on a node even without an open incident
#: (a human took a released node over; its marks are theirs to keep).
_ACCOUNTED = frozenset({*OUT_OF_SERVICE, NodeState.BLOCKED, NodeState.RELEASED})


@dataclass
class OwnershipResult:
    """Nodes released, nodes left for the remediation pass to adopt, and the errors per node."""

    released: list[str] = field(default_factory=list)
    adopted: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)


def settle(
    *,
    owned: Callable[[], list[NodeView]],
    actions: NodeActions,
    sessions: sessionmaker[Session],
    findings: TickFindings,
    now: datetime,
    actor: str = "healer",
    fence: Fence | None = None,
    confirm: Callable[[str], NodeView | None] | None = None,
) -> OwnershipResult:
    """Release the nodes healer marked that its record does not account for (see the module).

    Args:
        owned: the nodes carrying healer's marks now (``KubernetesNodeActions.owned_nodes``).
        actions: the adapter that releases (the dry-run recorder records instead).
        findings: this tick's findings (a node with one firing or pending is adopted, not released).
        now: aware UTC. ``fence``: the leader's fence (None: unfenced).
        confirm: reads a node now and returns it when it still carries healer's marks, else None
            (``KubernetesNodeActions.owned_node``): ``owned`` may come from a watched store that
            lags healer's own last write by moments; None: ``owned``'s views are taken as read.

    Raises:
        NotLeader: this replica stopped leading (nothing more is written).
    """
    fence = fence or Fence()
    result = OwnershipResult()
    try:
        views = owned()
    except KubernetesError as exc:
        log.warning("ownership reconcile skipped: cannot list nodes: %s", exc)
        return result
    if not views:
        return result
    names = [v.name for v in views]
    with transaction(sessions) as session:
        rows = session.execute(select(Node.name, Node.state).where(Node.name.in_(names)))
        states: dict[str, str] = {name: st for name, st in rows}
        open_ = set(
            session.scalars(
                select(Node.name)
                .join(Incident, Incident.node_id == Node.id)
                .where(Node.name.in_(names), Incident.closed_at.is_(None))
            )
        )
    for view in views:
        name = view.name
        if name in open_ or states.get(name, NodeState.HEALTHY) in _ACCOUNTED:
            continue
        if findings.for_node(name):
            result.adopted.append(name)
            continue
        if findings.frozen_rules:
            log.info("node %s carries healer's marks unrecorded; not released while rules are frozen", name)
            continue
        fence.check()
        try:
            if confirm is not None:
                fresh = confirm(name)
                if fresh is None:
                    continue  # the marks are gone already (the store had not seen it yet)
                view = fresh
            actions.release(view, now=now)
        except KubernetesNotFound:
            continue
        except KubernetesError as exc:
            result.errors[name] = str(exc)
            log.warning("node %s: releasing healer's unrecorded marks failed: %s", name, exc)
            continue
        with transaction(sessions) as session:
            fence.check_db(session)
            node = repo.get_or_create_node(session, name, now=now)
            intent, node.intent = node.intent, None
            if actions.status != ActionStatus.DRY_RUN:
                repo.record_action(
                    session,
                    kind="release",
                    status=ActionStatus.SUCCEEDED,
                    actor=actor,
                    now=now,
                    node=node,
                    detail={
                        "reason": f"healer's marks on a node recorded {node.state} with no incident",
                        "interrupted": intent,
                    },
                )
        log.warning(
            "node %s: released healer's cordon/taint/condition the record did not account for%s",
            name,
            f" (interrupted step {intent.get('step')})" if intent else "",
        )
        result.released.append(name)
    return result
