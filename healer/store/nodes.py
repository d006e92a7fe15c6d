"""Repository for nodes, incidents, transitions, actions and switches. Never commits.

Every function takes the caller's ``Session``; the tick or the request owns the transaction.
Times are aware UTC and passed in (``now``), never read here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, bindparam, case, event, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import ORMExecuteState, Session
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.orm.util import identity_key

from healer.errors import StaleState
from healer.model.states import NodeState
from healer.store.models import Action, Incident, Node, Switch, Ticket, Transition
from healer.store.models import Finding as FindingRow

#: Switch names (rows of the ``switches`` table).
SWITCH_PAUSED = "paused"  # {"paused": bool, "reason": str}
SWITCH_BREAKER = "breaker"  # {"tripped": bool, "reason": str, "tripped_at": iso, "held": [node, ...]}
SWITCH_LAST_TICK = "last_tick"  # {"at": iso, "duration_seconds": float, "leader": str}
SWITCH_SOURCE = "source"  # {"ok": bool, "since": iso, "reason": str} (healer.model.source_health)
#: {"pools": [{"name": str, "kind": "coverage"|"selector", "rules": [...], "nodes": [...]}]}: the
#: rule pools the last tick counted over (labelled pools are read from the nodes table).
SWITCH_POOLS = "pools"
SWITCH_RULESET = "ruleset"  # {"loaded_at": iso, "sources": [...], "rejected": [{"error": str, "at": iso}]}
#: The last observation of the rules' blind spots (:meth:`healer.model.blind_spots.BlindReport.as_switch`).
SWITCH_BLIND_SPOTS = "blind_spots"
#: The fleet's topology as the leader last read it, for the dashboard's topology page:
#: {"domains": {kind: {domain: [node, ...]}}} (healer.topology; written on a change).
SWITCH_TOPOLOGY = "topology"


# The per-node statements of a reconcile step, built once (building a statement's expression costs
# more CPU than SQLite running it); each call binds its parameters.
_NODE_BY_NAME = select(Node).where(Node.name == bindparam("name"))
_OPEN_INCIDENT = select(Incident).where(
    Incident.node_id == bindparam("node_id"), Incident.closed_at.is_(None)
)
_NODE_AND_OPEN_INCIDENT = (
    select(Node, Incident)
    .outerjoin(Incident, (Incident.node_id == Node.id) & Incident.closed_at.is_(None))
    .where(Node.name == bindparam("name"))
)
# In Core on the session's connection (no ORM synchronisation of loaded findings: nobody in the
# step's session holds them).
_FINDINGS = cast(Table, FindingRow.__table__)
_ATTACH_FINDINGS = (
    update(_FINDINGS)
    .where(
        _FINDINGS.c.node_name == bindparam("b_node_name"),
        _FINDINGS.c.incident_id.is_(None),
        _FINDINGS.c.resolved_at.is_(None),
    )
    .values(incident_id=bindparam("b_incident_id"))
)
_ATTACH_FINDINGS_SKIPPING = _ATTACH_FINDINGS.where(
    _FINDINGS.c.rule.not_in(bindparam("b_skip", expanding=True))
)


# The compare-and-set of a transition and the transition row's INSERT, in Core on the session's
# connection (no ORM bookkeeping: the caller's row object takes the values written through
# ``set_committed_value``, and nobody reads the transition row's id back).
_NODES, _TRANSITIONS, _ACTIONS = (cast(Table, m.__table__) for m in (Node, Transition, Action))
# ``state_since`` is when the node entered its state: a step that records something in place (a
# ladder step while awaiting repair, a log capture's answer) keeps it, so "awaiting repair for 3 h"
# still counts from when the node began to wait.
_MOVE_IF = (
    update(_NODES)
    .where(_NODES.c.id == bindparam("b_id"), _NODES.c.state == bindparam("b_expect"))
    .values(
        state=bindparam("b_state"),
        state_since=case(
            (_NODES.c.state == bindparam("b_state"), _NODES.c.state_since), else_=bindparam("b_at")
        ),
        updated_at=bindparam("b_at"),
    )
)
# The same, clearing the step's intent in the same statement.
_MOVE_IF_CLEARING = _MOVE_IF.values(intent=bindparam("b_intent"))
_INSERT_TRANSITION = insert(_TRANSITIONS)
_INSERT_ACTIONS = insert(_ACTIONS)


def get_or_create_node(session: Session, name: str, *, now: datetime, pool: str = "default") -> Node:
    """The node row for ``name``, created healthy if new."""
    node = session.scalar(_NODE_BY_NAME, {"name": name})
    return node if node is not None else _create_node(session, name, now=now, pool=pool)


def node_and_open_incident(
    session: Session, name: str, *, now: datetime, pool: str = "default"
) -> tuple[Node, Incident | None]:
    """:func:`get_or_create_node` and :func:`open_incident` in one SELECT (an outer join)."""
    row = session.execute(_NODE_AND_OPEN_INCIDENT, {"name": name}).first()
    if row is None:
        return _create_node(session, name, now=now, pool=pool), None
    return row[0], row[1]


# The newest ticket of the open incident, as the lifecycle reads it (None: no ticket).
_TICKET_OF_INCIDENT = (
    select(Ticket.status).where(Ticket.incident_id == Incident.id).order_by(Ticket.id.desc()).limit(1)
).scalar_subquery()
_NODES_AND_OPEN_INCIDENTS = (
    select(Node, Incident, _TICKET_OF_INCIDENT)
    .outerjoin(Incident, (Incident.node_id == Node.id) & Incident.closed_at.is_(None))
    .where(Node.name.in_(bindparam("names", expanding=True)))
)


def nodes_and_open_incidents(
    session: Session, names: Sequence[str]
) -> dict[str, tuple[Node, Incident | None, str | None]]:
    """:func:`node_and_open_incident` of many nodes in one SELECT, with the status of the open
    incident's newest ticket (None: no incident or no ticket); names without a row are absent
    (nothing is created)."""
    if not names:
        return {}
    return {
        node.name: (node, incident, ticket)
        for node, incident, ticket in session.execute(_NODES_AND_OPEN_INCIDENTS, {"names": list(names)})
    }


def _create_node(session: Session, name: str, *, now: datetime, pool: str) -> Node:
    node = Node(
        name=name, pool=pool, state=NodeState.HEALTHY, state_since=now, created_at=now, updated_at=now
    )
    session.add(node)
    session.flush()
    return node


def open_incident(session: Session, node: Node) -> Incident | None:
    """The node's open incident, if any (at most one exists: a partial unique index)."""
    return session.scalar(_OPEN_INCIDENT, {"node_id": node.id})


def ensure_incident(session: Session, node: Node, *, now: datetime, summary: str) -> Incident:
    """The node's open incident, opened now if there is none."""
    incident = open_incident(session, node)
    if incident is None:
        incident = new_incident(session, node, now=now, summary=summary)
    return incident


def new_incident(
    session: Session,
    node: Node,
    *,
    now: datetime,
    summary: str,
    before_insert: Callable[[Incident], None] | None = None,
) -> Incident:
    """Open an incident for ``node``, whose open incident the caller has just read as none (saves
    :func:`ensure_incident`'s second SELECT; a concurrent one violates the partial unique index).

    ``before_insert(incident)`` fills more columns before the INSERT (one statement, not an INSERT
    and an UPDATE); the incident's ``id`` is not set yet when it runs.
    """
    incident = Incident(node_id=node.id, opened_at=now, summary=summary)
    if before_insert is not None:
        before_insert(incident)
    session.add(incident)
    session.flush()
    return incident


def close_incident(session: Session, node: Node, *, now: datetime, reason: str) -> Incident | None:
    incident = open_incident(session, node)
    if incident is not None:
        incident.closed_at = now
        incident.close_reason = reason
    return incident


def transition(
    session: Session,
    node: Node,
    to_state: NodeState,
    *,
    now: datetime,
    actor: str,
    reason: str,
    evidence: dict[str, Any] | None = None,
    incident: Incident | None = None,
    expect: str | None = None,
    holder: str | None = None,
    fencing_token: int | None = None,
    clear_intent: bool = False,
    moved: bool = False,
) -> None:
    """Move ``node`` to ``to_state`` and record the step (from, to, who, why, evidence, when).

    ``expect``: the state the step was decided from; the move is a compare-and-set
    (``UPDATE nodes ... WHERE id = :id AND state = :expect``) and raises :class:`StaleState` when
    another writer moved the node since. ``holder`` and ``fencing_token``: the Lease holder
    recording it and its fencing number (see ``healer.controller.fence``). The ``transitions`` row
    is inserted as is (no object kept in the session), with the transaction's other transition
    rows (see :func:`flush_deferred`). ``clear_intent``: the compare-and-set also
    clears the node's ``intent`` (the step being recorded is the one it announced). ``moved``: the
    caller has already moved the node with :func:`move` (from ``expect``); only the row is written.
    """
    if incident is None:
        incident = open_incident(session, node)
    from_state = str(expect) if expect is not None else node.state
    if moved:
        assert expect is not None, "a moved node's transition names the state it moved from"
    elif expect is not None:
        move(session, node, to_state, now=now, expect=expect, clear_intent=clear_intent)
    else:
        if clear_intent:
            node.intent = None
        if node.state != str(to_state):
            node.state_since = now  # kept by a step in place, as :func:`move` keeps it
        node.state = str(to_state)
        node.updated_at = now
    _deferred(session, _INSERT_TRANSITION).append(
        {
            "node_id": node.id,
            "incident_id": incident.id if incident else None,
            "from_state": from_state,
            "to_state": str(to_state),
            "actor": actor,
            "reason": reason,
            "evidence": evidence,
            "at": now,
            "holder": holder,
            "fencing_token": fencing_token,
        }
    )


def move(
    session: Session,
    node: Node,
    to_state: NodeState,
    *,
    now: datetime,
    expect: str,
    clear_intent: bool = False,
) -> None:
    """The compare-and-set of a transition: ``UPDATE nodes ... WHERE id = :id AND state = :expect``
    (clearing the node's ``intent`` too when ``clear_intent``). Raises :class:`StaleState`, having
    written nothing, when another writer moved the node since it was read. Its transition row
    follows with :func:`transition` (``moved=True``)."""
    params = {"b_id": node.id, "b_expect": str(expect), "b_state": str(to_state), "b_at": now}
    connection = session.connection()
    if clear_intent:
        result = connection.execute(_MOVE_IF_CLEARING, {**params, "b_intent": None})
    else:
        result = connection.execute(_MOVE_IF, params)
    if getattr(result, "rowcount", 1) != 1:
        raise StaleState(f"node {node.name}: no longer {expect} (the step to {to_state} is not recorded)")
    # The compare-and-set UPDATE wrote these columns: the in-memory row takes them as loaded, so
    # the flush does not send the same UPDATE a second time.
    if str(to_state) != str(expect):
        set_committed_value(node, "state_since", now)
    set_committed_value(node, "state", str(to_state))
    set_committed_value(node, "updated_at", now)
    if clear_intent:
        set_committed_value(node, "intent", None)


def record_action(
    session: Session,
    *,
    kind: str,
    status: str,
    actor: str,
    now: datetime,
    node: Node | None = None,
    incident: Incident | None = None,
    target: str = "",
    error: str | None = None,
    detail: dict[str, Any] | None = None,
    attempts: int = 0,
    add: bool = True,
) -> Action:
    """Record an action taken, dry-run, refused or requested by an operator (the audit log).

    The row is added, not flushed: a step's rows go to the database together at its next flush
    (one batched INSERT where the driver allows it); its ``id`` is set from then on. ``add=False``:
    the row is only built, for :func:`insert_actions`.
    """
    row = Action(
        node_id=node.id if node else None,
        incident_id=incident.id if incident else None,
        kind=kind,
        target=target or (node.name if node else ""),
        status=str(status),
        actor=actor,
        attempts=attempts,
        error=error,
        detail=detail,
        created_at=now,
        updated_at=now,
    )
    if add:
        session.add(row)  # flushed with the step's other rows (one batched INSERT), or by the next query
    return row


_ACTION_COLUMNS = tuple(c.key for c in _ACTIONS.columns if c.key != "id")


def insert_actions(session: Session, rows: Sequence[Action]) -> None:
    """Insert audit rows built by :func:`record_action` (``add=False``) without keeping them as
    objects (nobody reads their ids back), with the transaction's other such rows in one
    executemany (see :func:`flush_deferred`): one statement on SQLite too, where the ORM's flush
    sends one INSERT per row to learn each id."""
    if rows:
        _deferred(session, _INSERT_ACTIONS).extend({k: getattr(r, k) for k in _ACTION_COLUMNS} for r in rows)


# Transition and audit rows are INSERTed together, one executemany per table, when the transaction
# commits or before a query that reads their tables: a pass recording many nodes in one
# transaction sends two statements for them, not one per step (the order of the rows is kept).
_DEFERRED = "healer.deferred_rows"
_DEFERRED_TABLES = frozenset({_TRANSITIONS, _ACTIONS})


def _deferred(session: Session, statement: Any) -> list[dict[str, Any]]:
    rows: dict[Any, list[dict[str, Any]]] = session.info.setdefault(_DEFERRED, {})
    return rows.setdefault(statement, [])


def flush_deferred(session: Session) -> None:
    """INSERT the transition and audit rows this session's transaction has deferred (runs before
    every commit and before every ORM query of their tables; a rollback drops them)."""
    pending: dict[Any, list[dict[str, Any]]] = session.info.pop(_DEFERRED, {})
    for statement, rows in pending.items():
        if rows:
            session.flush()  # rows the ORM holds keep their place before these
            session.connection().execute(statement, rows)


@event.listens_for(Session, "before_commit")
def _before_commit(session: Session) -> None:
    flush_deferred(session)


@event.listens_for(Session, "after_soft_rollback")
def _after_rollback(session: Session, _previous: Any) -> None:
    session.info.pop(_DEFERRED, None)


@event.listens_for(Session, "do_orm_execute")
def _before_query(state: ORMExecuteState) -> None:
    if _DEFERRED in state.session.info and any(m.local_table in _DEFERRED_TABLES for m in state.all_mappers):
        flush_deferred(state.session)


def get_switch(session: Session, name: str) -> dict[str, Any]:
    """The switch's value, ``{}`` when never set."""
    row = session.get(Switch, name)
    return dict(row.value) if row else {}


def set_switch(session: Session, name: str, value: dict[str, Any], *, now: datetime, by: str) -> None:
    """Write the switch in one upsert (``INSERT … ON CONFLICT (name) DO UPDATE``).

    Two replicas starting together both write ``ruleset`` before either leads; a read-then-INSERT
    let the second fail on the primary key (PostgreSQL ``UniqueViolation``) and exit. The row the
    session may hold is refreshed from the database on its next read.
    """
    row = {"name": name, "value": value, "updated_at": now, "updated_by": by}
    upsert = postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
    statement = upsert(Switch).values(row)
    session.execute(
        statement.on_conflict_do_update(
            index_elements=[Switch.name],
            set_={"value": statement.excluded.value, "updated_at": now, "updated_by": by},
        )
    )
    held = session.identity_map.get(identity_key(Switch, name))
    if held is not None:
        session.expire(held)


def nodes_in_states(session: Session, states: Sequence[str]) -> list[Node]:
    return list(session.scalars(select(Node).where(Node.state.in_(list(states))).order_by(Node.name)))


def sync_nodes(
    session: Session, pools: Mapping[str, str], *, now: datetime, fleet_wide: bool
) -> dict[str, str]:
    """Make the node rows match ``pools`` (node → pool) in a constant number of statements;
    returns node → pool of the rows read, as they are now (every row when ``fleet_wide``, the
    rows of nodes no longer in ``pools`` included).

    One SELECT (of every node when ``fleet_wide``, else of the named ones), one bulk INSERT of the
    new nodes (created healthy), one bulk UPDATE of the nodes whose pool changed; a fleet that did
    not change costs the SELECT only, whatever its size.
    """
    query = select(Node.id, Node.name, Node.pool)
    if not fleet_wide:
        query = query.where(Node.name.in_(list(pools)))
    known = {name: (node_id, pool) for node_id, name, pool in session.execute(query)}
    new = [
        {
            "name": name,
            "pool": pool,
            "state": NodeState.HEALTHY,
            "state_since": now,
            "created_at": now,
            "updated_at": now,
        }
        for name, pool in pools.items()
        if name not in known
    ]
    if new:
        session.execute(insert(Node), new)
    moved = [
        {"id": known[name][0], "pool": pool}
        for name, pool in pools.items()
        if name in known and known[name][1] != pool
    ]
    if moved:
        session.execute(update(Node), moved)
    return {**{name: pool for name, (_, pool) in known.items()}, **pools}


def attach_findings(
    session: Session, node: Node, incident: Incident, *, skip_rules: frozenset[str] = frozenset()
) -> None:
    """Hang the node's unresolved findings that belong to no incident yet on ``incident``, but
    those of ``skip_rules`` (shadow rules: their findings are no incident's evidence)."""
    params: dict[str, Any] = {"b_node_name": node.name, "b_incident_id": incident.id}
    if skip_rules:
        session.connection().execute(_ATTACH_FINDINGS_SKIPPING, {**params, "b_skip": sorted(skip_rules)})
    else:
        session.connection().execute(_ATTACH_FINDINGS, params)
