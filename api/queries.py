"""The dashboard's read side: every page and list endpoint is a handful of aggregate queries.

No N+1: a page of nodes costs one query for the nodes and one each for their rules, GPU counts and
tickets, whatever the page size. Lists use keyset (cursor) pagination on ``(sort key, id)`` so the
thousandth page costs what the first does. All functions take the caller's session and ``now``.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import ColumnElement, Select, and_, case, func, or_, select, text
from sqlalchemy.orm import Session

from api import verdict as verdicts
from api.charts import rule_series
from api.errors import ApiError
from api.rendering import format_duration
from api.schemas import (
    ActionOut,
    AttentionOut,
    BlindSpotOut,
    BlindSpotsOut,
    BreakerOut,
    BreakerScope,
    FindingOut,
    FleetStatus,
    GpuOut,
    IncidentOut,
    LastTick,
    NodeDetail,
    NodeSummary,
    Page,
    PoolBudget,
    ProviderStats,
    RejectedReload,
    RuleOut,
    RulesOut,
    SourceOut,
    TicketBrief,
    TicketOut,
    TransitionOut,
    UnresolvedSeriesOut,
)
from healer import history
from healer.config import SafetySettings
from healer.engine.labels import gpu_sort_key
from healer.engine.lifecycle import finding_story
from healer.engine.outcomes import Outcome
from healer.engine.safety import PoolUsage, breaker_trips_at
from healer.model.blind_spots import BlindReport
from healer.model.limits import SafetyLimits
from healer.model.source_health import SourceHealth
from healer.model.states import OUT_OF_SERVICE, ActionStatus, FindingState, NodeState
from healer.ruleset.schema import DrainAction, Rule, RuleSet, TicketAction
from healer.store import nodes as repo
from healer.store.evaluations import finding_from_row
from healer.store.models import (
    Action,
    Finding,
    Gpu,
    Incident,
    Node,
    RuleEvaluation,
    Switch,
    Ticket,
    Transition,
)
from healer.tickets import service as tickets_service
from healer.tickets.views import CLOSED_TICKETS, ticket_views

ACTIVE_FINDINGS = (FindingState.PENDING, FindingState.FIRING)
MAX_LIMIT = 500
#: The rules ever evaluated (within retention), for when no rule set is loaded. A loose index scan
#: on ``(rule, evaluated_at)``: one index seek per rule, where DISTINCT would read every evaluation.
_DISTINCT_RULES = text(
    """
    WITH RECURSIVE seen(rule) AS (
        SELECT MIN(rule) FROM rule_evaluations
        UNION ALL
        SELECT (SELECT MIN(rule) FROM rule_evaluations WHERE rule > seen.rule) FROM seen
        WHERE seen.rule IS NOT NULL
    )
    SELECT rule FROM seen WHERE rule IS NOT NULL ORDER BY rule
    """
)

NodeSort = Literal["since", "name"]


# --- cursors -----------------------------------------------------------------------------------

#: Longest cursor accepted, characters (ours are under 200).
MAX_CURSOR_CHARS = 1024
#: Largest row id (PostgreSQL ``integer``).
MAX_ROW_ID = 2**31 - 1


@dataclass(frozen=True)
class Cursor:
    """Where the previous page ended: the sort it used, the last row's sort key and id."""

    sort: str
    key: Any
    id: int

    def encode(self) -> str:
        raw = json.dumps([self.sort, self.key, self.id], separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, value: str, *, sort: str) -> Cursor:
        """Parse a cursor made for ``sort``.

        Raises:
            ApiError: 400 ``invalid_cursor`` when it is malformed or made for another sort.
        """
        if len(value) > MAX_CURSOR_CHARS:
            raise ApiError(400, "invalid cursor: too long", code="invalid_cursor")
        try:
            raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
            made_for, key, row_id = json.loads(raw)
        except (binascii.Error, ValueError, TypeError, RecursionError) as exc:
            raise ApiError(400, "invalid cursor", code="invalid_cursor") from exc
        if made_for != sort:
            raise ApiError(400, "cursor does not belong to this listing", code="invalid_cursor")
        # bool is an int in Python; ids beyond the column's range would overflow the database.
        if type(row_id) is not int or not 0 <= row_id <= MAX_ROW_ID or not isinstance(key, str):
            raise ApiError(400, "invalid cursor", code="invalid_cursor")
        return cls(sort=made_for, key=key, id=row_id)


def _time_key(value: Any) -> datetime:
    try:
        when = datetime.fromisoformat(str(value))
    except ValueError as exc:
        raise ApiError(400, "invalid cursor", code="invalid_cursor") from exc
    if when.tzinfo is None:
        raise ApiError(400, "invalid cursor", code="invalid_cursor")
    return when


def _after_desc(column: Any, id_column: Any, key: Any, row_id: int) -> Any:
    """Rows after ``(key, id)`` in ``ORDER BY column DESC, id DESC``."""
    return or_(column < key, and_(column == key, id_column < row_id))


def _clamp(limit: int) -> int:
    return max(1, min(limit, MAX_LIMIT))


# --- fleet -------------------------------------------------------------------------------------


def source_status(session: Session, *, now: datetime, grace_seconds: float) -> SourceOut | None:
    """Whether Prometheus answered the controller's last queries (the ``source`` switch); None
    before any tick queried it. ``unready`` once it has failed for more than ``grace_seconds``."""
    health = SourceHealth.from_switch(repo.get_switch(session, repo.SWITCH_SOURCE))
    if health is None:
        return None
    return SourceOut(
        ok=health.ok,
        since=health.since,
        reason=health.reason,
        failing_seconds=health.failing_for(now),
        unready=health.overdue(now, grace_seconds),
    )


def fleet_status(
    session: Session,
    *,
    now: datetime,
    safety: SafetySettings,
    ruleset: RuleSet | None,
    source_grace_seconds: float = 60.0,
) -> FleetStatus:
    """Counts per state, switches, budget use per pool, last tick and per-rule health."""
    counts = {str(s): 0 for s in NodeState}
    counts.update(session.execute(select(Node.state, func.count()).group_by(Node.state)).all())
    out_of_service = case((Node.state.in_([str(s) for s in OUT_OF_SERVICE]), 1), else_=0)
    budgets = []
    for pool, nodes, out in session.execute(
        select(Node.pool, func.count(), func.sum(out_of_service)).group_by(Node.pool).order_by(Node.pool)
    ):
        limits = safety.limits()
        limit = PoolUsage(size=nodes).limit(limits)  # the same cap safety applies
        budgets.append(
            PoolBudget(
                pool=pool,
                nodes=nodes,
                out_of_service=int(out or 0),
                limit=limit,
                breaker_trips_at=breaker_trips_at(nodes, limits),
            )
        )
    switches = {
        row.name: dict(row.value)
        for row in session.scalars(
            select(Switch).where(
                Switch.name.in_(
                    [repo.SWITCH_PAUSED, repo.SWITCH_BREAKER, repo.SWITCH_LAST_TICK, repo.SWITCH_POOLS]
                )
            )
        )
    }
    budgets += _rule_pool_budgets(session, switches.get(repo.SWITCH_POOLS, {}), safety.limits())
    paused = switches.get(repo.SWITCH_PAUSED, {})
    breaker = switches.get(repo.SWITCH_BREAKER, {})
    return FleetStatus(
        total=sum(counts.values()),
        counts=counts,
        paused=bool(paused.get("paused")),
        pause_reason=paused.get("reason") or None,
        dry_run=safety.dry_run,
        breaker=BreakerOut(
            tripped=bool(breaker.get("tripped")),
            reason=breaker.get("reason") or breaker.get("last_reason"),
            tripped_at=breaker.get("tripped_at"),
            held=list(breaker.get("held", []) or []) if breaker.get("tripped") else [],
        ),
        breaker_scope=BreakerScope(
            rule=(
                f"trips when more than {safety.breaker_nodes} node(s), or more than "
                f"{safety.breaker_percent:g}% of one pool's nodes (at least {safety.breaker_min_nodes}), "
                f"turn bad within {safety.breaker_window_seconds:g} s"
            ),
            pool=breaker.get("pool") if breaker.get("tripped") else None,
            pool_nodes=breaker.get("pool_nodes") if breaker.get("tripped") else None,
            bad_nodes=breaker.get("bad_nodes") if breaker.get("tripped") else None,
        ),
        budgets=budgets,
        last_tick=_last_tick(switches.get(repo.SWITCH_LAST_TICK, {}), now=now),
        rules=rules_with_health(session, ruleset=ruleset, now=now),
        source=source_status(session, now=now, grace_seconds=source_grace_seconds),
    )


def _rule_pool_budgets(session: Session, value: dict[str, Any], limits: SafetyLimits) -> list[PoolBudget]:
    """The rule pools the last tick counted over (``pools`` switch), with their nodes out now."""
    pools = [p for p in value.get("pools", []) if isinstance(p, dict) and p.get("name")]
    if not pools:
        return []
    out = set(session.scalars(select(Node.name).where(Node.state.in_([str(s) for s in OUT_OF_SERVICE]))))
    budgets = []
    for p in pools:
        members = set(p.get("nodes", []))
        budgets.append(
            PoolBudget(
                pool=str(p["name"]),
                nodes=len(members),
                out_of_service=len(members & out),
                limit=PoolUsage(size=len(members)).limit(limits),
                breaker_trips_at=breaker_trips_at(len(members), limits),
                kind=str(p.get("kind", "coverage")),
                rules=[str(r) for r in p.get("rules", [])],
            )
        )
    return budgets


def _last_tick(value: dict[str, Any], *, now: datetime) -> LastTick | None:
    if not value.get("at"):
        return None
    at = datetime.fromisoformat(value["at"])
    return LastTick(
        at=at,
        duration_seconds=value.get("duration_seconds"),
        leader=value.get("leader"),
        age_seconds=(now - at).total_seconds(),
    )


def last_tick(session: Session, *, now: datetime) -> LastTick | None:
    """The last completed tick (any replica), from the ``last_tick`` switch."""
    return _last_tick(repo.get_switch(session, repo.SWITCH_LAST_TICK), now=now)


# --- rules -------------------------------------------------------------------------------------


def rules_with_health(session: Session, *, ruleset: RuleSet | None, now: datetime) -> list[RuleOut]:
    """The rule set's rules with their latest evaluation and firing/pending node counts.

    Without a rule set, every rule the controller recorded evaluations of (within retention).
    """
    if ruleset is not None:
        rules = [
            RuleOut(
                name=r.name,
                group=g.name,
                expr=r.expr,
                for_seconds=r.for_,
                keep_firing_for_seconds=r.keep_firing_for,
                severity=r.severity,
                kind=r.kind,
                actions=[a.kind for a in r.actions],
            )
            for g in ruleset.groups
            for r in g.rules
        ]
    else:
        rules = [
            RuleOut(
                name=rule,
                group="",
                expr="",
                for_seconds=0,
                keep_firing_for_seconds=0,
                severity="",
                kind="",
                actions=[],
            )
            for rule in session.scalars(_DISTINCT_RULES)
        ]
    if not rules:
        return []
    names = [r.name for r in rules]
    # One statement; each subquery is an index seek on (rule, evaluated_at): cheap however long
    # the evaluation history is (a GROUP BY would read all of it).
    latest_ids = [
        select(RuleEvaluation.id)
        .where(RuleEvaluation.rule == name)
        .order_by(RuleEvaluation.evaluated_at.desc(), RuleEvaluation.id.desc())
        .limit(1)
        .scalar_subquery()
        for name in names
    ]
    latest = {
        e.rule: e for e in session.scalars(select(RuleEvaluation).where(RuleEvaluation.id.in_(latest_ids)))
    }
    active: dict[tuple[str, str], int] = {}
    for rule, state, count in session.execute(
        select(Finding.rule, Finding.state, func.count(func.distinct(Finding.node_name)))
        .where(Finding.rule.in_(names), Finding.state.in_([str(s) for s in ACTIVE_FINDINGS]))
        .group_by(Finding.rule, Finding.state)
    ):
        active[(rule, state)] = count
    out = []
    for r in rules:
        ev = latest.get(r.name)
        update: dict[str, Any] = {
            "firing_nodes": active.get((r.name, FindingState.FIRING), 0),
            "pending_nodes": active.get((r.name, FindingState.PENDING), 0),
        }
        if ev is not None:
            update.update(
                group=r.group or ev.group,
                health=ev.health,
                last_error=ev.error,
                last_evaluated_at=ev.evaluated_at,
                last_duration_seconds=ev.duration_seconds,
                series=ev.series,
            )
        out.append(r.model_copy(update=update))
    return out


def rules_page(session: Session, *, ruleset: RuleSet | None, now: datetime) -> RulesOut:
    """The rules page and ``/api/v1/rules``: rules, health, and the last rejected reloads."""
    status = repo.get_switch(session, repo.SWITCH_RULESET)
    rejected = [
        RejectedReload(at=item.get("at"), error=str(item.get("error", "")))
        for item in status.get("rejected", []) or []
        if isinstance(item, dict)
    ]
    sources = list(ruleset.sources) if ruleset is not None else list(status.get("sources", []) or [])
    return RulesOut(
        loaded=ruleset is not None,
        loaded_at=status.get("loaded_at"),
        sources=[str(s) for s in sources],
        rules=rules_with_health(session, ruleset=ruleset, now=now),
        rejected=rejected,
    )


# --- nodes -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeFilter:
    """Filters of the node list: states (any of), pool, rule (an active finding of it, or its open
    incident's rule), name substring.

    ``unhealthy`` keeps nodes not in ``healthy`` (the fleet page's default).
    """

    states: tuple[str, ...] = ()
    pool: str | None = None
    rule: str | None = None
    text: str | None = None
    unhealthy: bool = False


def _node_query(flt: NodeFilter) -> Select[Node]:
    query = select(Node)
    if flt.states:
        query = query.where(Node.state.in_(flt.states))
    if flt.unhealthy:
        query = query.where(Node.state != NodeState.HEALTHY)
    if flt.pool:
        query = query.where(Node.pool == flt.pool)
    if flt.text:
        escaped = flt.text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        query = query.where(Node.name.like(f"%{escaped}%", escape="\\"))
    if flt.rule:
        # The rule the row shows: an active finding's, or its open incident's (a validating node).
        query = query.where(
            or_(
                Node.name.in_(
                    select(Finding.node_name).where(
                        Finding.rule == flt.rule, Finding.state.in_([str(s) for s in ACTIVE_FINDINGS])
                    )
                ),
                Node.id.in_(
                    select(Incident.node_id).where(Incident.closed_at.is_(None), Incident.rule == flt.rule)
                ),
            )
        )
    return query


def list_nodes(
    session: Session,
    *,
    flt: NodeFilter,
    sort: NodeSort = "since",
    cursor: str | None = None,
    limit: int = 50,
    judging: Judging | None = None,
) -> Page[NodeSummary]:
    """One page of nodes, sorted by ``since`` (most recent state change first) or ``name``; each
    with its verdict when ``judging`` is given.

    Raises:
        ApiError: 400 for an invalid cursor.
    """
    limit = _clamp(limit)
    query = _node_query(flt)
    if sort == "name":
        query = query.order_by(Node.name, Node.id)
        if cursor:
            c = Cursor.decode(cursor, sort=sort)
            query = query.where(or_(Node.name > str(c.key), and_(Node.name == str(c.key), Node.id > c.id)))
    else:
        query = query.order_by(Node.state_since.desc(), Node.id.desc())
        if cursor:
            c = Cursor.decode(cursor, sort=sort)
            query = query.where(_after_desc(Node.state_since, Node.id, _time_key(c.key), c.id))
    rows = list(session.scalars(query.limit(limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = None
    if more:
        last = rows[-1]
        key: Any = last.name if sort == "name" else last.state_since.isoformat()
        next_cursor = Cursor(sort=sort, key=key, id=last.id).encode()
    return Page[NodeSummary](items=summarize_nodes(session, rows, judging), next_cursor=next_cursor)


#: The fleet page's "Needs attention" list: at most this many nodes.
ATTENTION_LIMIT = 50


def needs_attention(
    session: Session, *, now: datetime, awaiting_repair_seconds: float, judging: Judging | None = None
) -> list[AttentionOut]:
    """Nodes needing a person, most urgent first: blocked (with the refusal), awaiting repair for
    longer than ``awaiting_repair_seconds``, unknown (no data); oldest first within each."""
    overdue = now - timedelta(seconds=awaiting_repair_seconds)
    rank = case((Node.state == NodeState.BLOCKED, 0), (Node.state == NodeState.AWAITING_REPAIR, 1), else_=2)
    rows = list(
        session.execute(
            select(Node, Incident.blocked_reason)
            .outerjoin(Incident, (Incident.node_id == Node.id) & Incident.closed_at.is_(None))
            .where(
                or_(
                    Node.state.in_([str(NodeState.BLOCKED), str(NodeState.UNKNOWN)]),
                    and_(Node.state == NodeState.AWAITING_REPAIR, Node.state_since < overdue),
                )
            )
            .order_by(rank, Node.state_since, Node.name)
            .limit(ATTENTION_LIMIT)
        ).all()
    )
    summaries = {s.name: s for s in summarize_nodes(session, [n for n, _ in rows], judging)}
    out = []
    for node, blocked in rows:
        age = format_duration((now - node.state_since).total_seconds())
        if node.state == NodeState.BLOCKED:
            why = f"blocked for {age}: {blocked or 'a step was refused'}"
        elif node.state == NodeState.AWAITING_REPAIR:
            limit = format_duration(awaiting_repair_seconds)
            why = f"awaiting repair for {age} (over {limit}): chase the ticket"
        else:
            why = f"no data for {age}: exporter down or stale"
        out.append(AttentionOut(node=summaries[node.name], why=why))
    return out


def shown_state(state: str, *, taint_only: bool) -> str:
    """The state as a person names it: a node quarantined by a taint alone (not cordoned) is
    ``tainted``; every other state is shown as stored."""
    return "tainted" if taint_only and state == NodeState.QUARANTINED else state


@dataclass(frozen=True)
class Judging:
    """What a summary needs to carry its node's verdict (:mod:`api.verdict`): ``now``, the rule set
    (thresholds, holds, drains; None: not known) and the settings the verdict reads."""

    now: datetime
    ruleset: RuleSet | None = None
    policy: verdicts.Policy = field(default_factory=verdicts.Policy)


def summarize_nodes(
    session: Session, nodes: Sequence[Node], judging: Judging | None = None
) -> list[NodeSummary]:
    """Summaries of ``nodes`` with their active rules (else their open incident's), GPU counts,
    latest ticket and whether a quarantine is by taint alone: 4 queries; with ``judging``, each
    with its verdict: 2 more (the open incidents' audit rows, the pause and breaker switches)."""
    if not nodes:
        return []
    ids = [n.id for n in nodes]
    names = [n.name for n in nodes]
    incidents = {
        i.node_id: i
        for i in session.scalars(
            select(Incident).where(Incident.node_id.in_(ids), Incident.closed_at.is_(None))
        )
    }
    open_ids = {i.id for i in incidents.values()}
    active = Finding.state.in_([str(s) for s in ACTIVE_FINDINGS])
    by_node: dict[str, list[Finding]] = defaultdict(list)
    for f in session.scalars(
        select(Finding)
        .where(
            Finding.node_name.in_(names),
            or_(active, Finding.incident_id.in_(open_ids)) if open_ids else active,
        )
        .order_by(Finding.id)
    ):
        by_node[f.node_name].append(f)
    gpu_counts = dict(
        session.execute(
            select(Gpu.node_id, func.count()).where(Gpu.node_id.in_(ids)).group_by(Gpu.node_id)
        ).all()
    )
    tickets: dict[int, Ticket] = {}
    for t in session.scalars(
        select(Ticket).where(Ticket.node_id.in_(ids)).order_by(Ticket.created_at.desc(), Ticket.id.desc())
    ):
        tickets.setdefault(t.node_id, t)
    facts = _verdict_facts(session, nodes, incidents, by_node, tickets) if judging is not None else {}
    out = []
    for n in nodes:
        inc = incidents.get(n.id)
        found = by_node.get(n.name, [])
        now_active = [f for f in found if f.state in ACTIVE_FINDINGS]
        shown = now_active or [f for f in found if inc is not None and f.incident_id == inc.id]
        rules = {f.rule for f in shown} | (
            {inc.rule} if inc is not None and inc.rule and not now_active else set()
        )
        blocked = n.state == NodeState.BLOCKED and inc is not None and inc.blocked_step is not None
        ticket = tickets.get(n.id)
        summary = NodeSummary(
            name=n.name,
            pool=n.pool,
            state=n.state,
            shown_state=shown_state(n.state, taint_only=_taint_only(inc)),
            state_since=n.state_since,
            opted_out=n.opted_out,
            rules=sorted(rules),
            affected_gpus=sorted({f.gpu for f in shown if f.gpu is not None}, key=_gpu_sort_key),
            gpu_count=gpu_counts.get(n.id),
            ticket=(
                TicketBrief(
                    id=ticket.id,
                    provider=ticket.provider,
                    status=ticket.status,
                    external_id=ticket.external_id,
                )
                if ticket is not None
                else None
            ),
            drain_blocked=blocked and inc is not None and inc.blocked_step == "drain",
            blocked_reason=inc.blocked_reason if blocked and inc is not None else None,
        )
        if judging is not None:
            judged = replace(
                facts[n.id],
                shown_state=summary.shown_state,
                terms=_terms(judging.ruleset, facts[n.id].evidence, inc),
            )
            summary.verdict = verdicts.verdict(judged, now=judging.now, policy=judging.policy)
        out.append(summary)
    return out


def _taint_only(incident: Incident | None) -> bool:
    """Quarantined by healer's taint alone: healer holds the node and did not cordon it."""
    return (
        incident is not None
        and incident.cordoned_by_healer is False
        and incident.expect_unschedulable is False
    )


def _rule(ruleset: RuleSet | None, name: str | None) -> Rule | None:
    if ruleset is None or name is None:
        return None
    try:
        return ruleset.rule(name)
    except KeyError:
        return None


def _terms(
    ruleset: RuleSet | None, evidence: verdicts.Evidence | None, incident: Incident | None
) -> verdicts.Terms | None:
    """The loaded rule's threshold, hold, drain and tickets, for the evidence's rule (else the
    incident's); None when the rule set does not have it."""
    rule = _rule(ruleset, evidence.rule if evidence else (incident.rule if incident else None))
    if rule is None:
        return None
    series = rule_series(rule)
    return verdicts.Terms(
        op=series.op,
        threshold=series.threshold,
        for_seconds=rule.for_,
        drains=any(isinstance(a, DrainAction) for a in rule.actions),
        tickets=tuple(a.provider for a in rule.actions if isinstance(a, TicketAction)),
    )


_latest = history.latest_finding


#: Audit rows the verdict reads: the steps healer took on the node (refusals of any kind too).
_VERDICT_KINDS = ("cordon", "taint", "drain", "repair-request", "validation-job")


def _verdict_facts(
    session: Session,
    nodes: Sequence[Node],
    incidents: dict[int, Incident],
    findings: dict[str, list[Finding]],
    tickets: dict[int, Ticket],
) -> dict[int, verdicts.VerdictFacts]:
    """The facts of each node's verdict (node id → facts; ``terms`` and ``shown_state`` are filled
    by the caller): 2 queries, the open incidents' audit rows (and the refusals of a node blocked
    before any incident) and the pause and breaker switches."""
    by_incident = {i.id: node_id for node_id, i in incidents.items()}
    bare_blocked = [n.id for n in nodes if n.state == NodeState.BLOCKED and n.id not in incidents]
    wanted: list[ColumnElement[bool]] = [Action.incident_id.in_(list(by_incident))] if by_incident else []
    if bare_blocked:
        wanted.append(and_(Action.node_id.in_(bare_blocked), Action.status == ActionStatus.REFUSED))
    actions: dict[int, list[verdicts.Done]] = defaultdict(list)
    refusals: dict[int, str] = {}
    if wanted:
        for a in session.scalars(
            select(Action)
            .where(or_(*wanted), or_(Action.kind.in_(_VERDICT_KINDS), Action.status == ActionStatus.REFUSED))
            .order_by(Action.created_at, Action.id)
        ):
            node_id = by_incident.get(a.incident_id or -1, a.node_id)
            if node_id is None:
                continue
            actions[node_id].append(
                verdicts.Done(kind=a.kind, status=a.status, detail=a.detail or {}, error=a.error)
            )
            if a.status == ActionStatus.REFUSED and a.error:
                refusals[node_id] = a.error
    switches = {
        row.name: dict(row.value)
        for row in session.scalars(
            select(Switch).where(Switch.name.in_([repo.SWITCH_PAUSED, repo.SWITCH_BREAKER]))
        )
    }
    paused, breaker = switches.get(repo.SWITCH_PAUSED, {}), switches.get(repo.SWITCH_BREAKER, {})
    fleet = verdicts.Fleet(
        paused=bool(paused.get("paused")),
        pause_reason=paused.get("reason") or None,
        breaker_tripped=bool(breaker.get("tripped")),
        breaker_reason=breaker.get("reason") or None,
        breaker_held=frozenset(breaker.get("held", []) or []) if breaker.get("tripped") else frozenset(),
    )
    out = {}
    for n in nodes:
        inc = incidents.get(n.id)
        mine = [f for f in findings.get(n.name, []) if inc is None or f.incident_id in (inc.id, None)]
        latest = _latest(mine, inc.rule if inc else None)
        ticket = tickets.get(n.id)
        if ticket is not None and (inc is None or ticket.incident_id != inc.id):
            ticket = None
        out[n.id] = verdicts.VerdictFacts(
            node=n.name,
            state=n.state,
            state_since=n.state_since,
            opted_out=n.opted_out,
            incident=_memory(inc) if inc is not None else None,
            evidence=(
                verdicts.Evidence(
                    rule=latest.rule,
                    gpu=latest.gpu,
                    state=latest.state,
                    value=latest.value,
                    unit=latest.unit,
                    active_since=latest.active_since,
                    fired_at=latest.fired_at,
                    resolved_at=latest.resolved_at,
                )
                if latest is not None
                else None
            ),
            actions=tuple(actions.get(n.id, ())),
            ticket=(
                verdicts.TicketFacts(
                    id=ticket.id,
                    provider=ticket.provider,
                    status=ticket.status,
                    created_at=ticket.created_at,
                    external_id=ticket.external_id,
                    acknowledged_at=ticket.acknowledged_at,
                )
                if ticket is not None
                else None
            ),
            fleet=fleet,
            blocked_reason=(inc.blocked_reason if inc is not None else None) or refusals.get(n.id),
        )
    return out


def _memory(i: Incident) -> verdicts.IncidentMemory:
    """The incident row's remediation memory as the verdict reads it (a stored ladder step that
    does not parse ends the ladder there)."""
    kinds: list[str] = []
    timeouts: list[float] = []
    for step in i.ladder or []:
        if not isinstance(step, dict) or not isinstance(step.get("timeout"), int | float):
            break
        kinds.append(str(step.get("kind")))
        timeouts.append(float(step["timeout"]))
    drain_timeout = (i.drain_options or {}).get("timeout_seconds")
    return verdicts.IncidentMemory(
        id=i.id,
        opened_at=i.opened_at,
        rule=i.rule,
        cordoned_by_healer=bool(i.cordoned_by_healer),
        blocked_step=i.blocked_step,
        blocked_reason=i.blocked_reason,
        clear_since=i.clear_since,
        drain_started_at=i.drain_started_at,
        drain_timeout_seconds=float(drain_timeout) if isinstance(drain_timeout, int | float) else None,
        ladder=(
            verdicts.LadderFacts(
                kinds=tuple(kinds),
                timeouts=tuple(timeouts),
                index=i.ladder_index,
                started_at=i.ladder_started_at,
            )
            if i.ladder
            else None
        ),
        validation=i.validation,
        release_requested=i.release_requested,
    )


def _gpu_sort_key(gpu: str) -> tuple[int, str]:
    return gpu_sort_key(gpu)


def get_node(session: Session, name: str) -> Node:
    """The node called ``name``.

    Raises:
        ApiError: 404 when healer does not know it.
    """
    node = session.scalar(select(Node).where(Node.name == name))
    if node is None:
        raise ApiError(404, f"unknown node {name!r}")
    return node


#: How much of each history the node page shows; the JSON list endpoints page through the rest.
NODE_PAGE_ROWS = 100


def node_detail(session: Session, name: str, *, now: datetime, judging: Judging | None = None) -> NodeDetail:
    """Everything the node page shows, newest first, bounded by :data:`NODE_PAGE_ROWS` per history;
    the node's verdict and the incidents' headlines read the rule set of ``judging`` (by default
    none: no thresholds or holds).

    Raises:
        ApiError: 404 for an unknown node.
    """
    node = get_node(session, name)
    judging = judging or Judging(now=now)
    (summary,) = summarize_nodes(session, [node], judging)
    incidents = list(
        session.scalars(
            select(Incident)
            .where(Incident.node_id == node.id)
            .order_by(Incident.opened_at.desc(), Incident.id.desc())
            .limit(20)
        )
    )
    transitions = session.scalars(
        select(Transition)
        .where(Transition.node_id == node.id)
        .order_by(Transition.at.desc(), Transition.id.desc())
        .limit(NODE_PAGE_ROWS)
    )
    findings = session.scalars(
        select(Finding)
        .where(Finding.node_name == node.name)
        .order_by(Finding.active_since.desc(), Finding.id.desc())
        .limit(NODE_PAGE_ROWS)
    )
    actions = list(
        session.scalars(
            select(Action)
            .where(Action.node_id == node.id)
            .order_by(Action.created_at.desc(), Action.id.desc())
            .limit(NODE_PAGE_ROWS)
        )
    )
    tickets = list(
        session.scalars(
            select(Ticket).where(Ticket.node_id == node.id).order_by(Ticket.created_at.desc()).limit(20)
        )
    )
    blind = blind_spots(session)
    headlines = _incidents_out(session, incidents, {node.id: node.name}, judging.ruleset)
    return NodeDetail(
        blind_spots=[spot for spot in blind.spots if spot.node == node.name],
        blind_spots_observed_at=blind.observed_at,
        node=summary,
        gpus=[GpuOut.model_validate(g, from_attributes=True) for g in node.gpus],
        open_incident=next((h for h in headlines if h.closed_at is None), None),
        incidents=headlines,
        transitions=[TransitionOut.model_validate(t, from_attributes=True) for t in transitions],
        findings=[FindingOut.model_validate(f, from_attributes=True) for f in findings],
        actions=[ActionOut.model_validate(a, from_attributes=True) for a in actions if a.kind != "note"],
        notes=[ActionOut.model_validate(a, from_attributes=True) for a in actions if a.kind == "note"],
        tickets=ticket_rows(session, tickets, {node.id: node.name}, now=now),
    )


def _incidents_out(
    session: Session, incidents: Sequence[Incident], names: dict[int, str], ruleset: RuleSet | None
) -> list[IncidentOut]:
    """``incidents`` headlined by their latest evidence (one query for all of their findings)."""
    ids = [i.id for i in incidents]
    found: dict[int, list[Finding]] = defaultdict(list)
    if ids:
        for f in session.scalars(select(Finding).where(Finding.incident_id.in_(ids))):
            found[f.incident_id or 0].append(f)
    return [
        _incident(i, names.get(i.node_id, ""), _latest(found.get(i.id, []), i.rule), ruleset)
        for i in incidents
    ]


def _incident(i: Incident, node_name: str, latest: Finding | None, ruleset: RuleSet | None) -> IncidentOut:
    """The incident told by ``latest`` (its latest finding: rule, GPU, value now, the rule's hold
    from ``ruleset``), keeping the summary it opened with as ``first_summary``."""
    headline = finding_story(finding_from_row(latest), _rule(ruleset, latest.rule)) if latest else None
    return IncidentOut(
        id=i.id,
        node=node_name,
        opened_at=i.opened_at,
        closed_at=i.closed_at,
        summary=headline or i.summary,
        first_summary=i.summary,
        close_reason=i.close_reason,
        escalated=i.escalated,
        rule=latest.rule if latest else i.rule,
        gpu=latest.gpu if latest else None,
        value=latest.value if latest else None,
        unit=latest.unit if latest else None,
        evidence_at=latest.last_seen_at if latest else None,
    )


def node_transitions(
    session: Session, name: str, *, cursor: str | None = None, limit: int = 100
) -> Page[TransitionOut]:
    """A node's lifecycle history, newest first.

    Raises:
        ApiError: 404 unknown node, 400 invalid cursor.
    """
    node = get_node(session, name)
    query = select(Transition).where(Transition.node_id == node.id)
    return _page_by_time(
        session, query, Transition.at, Transition.id, cursor, limit, "transitions", TransitionOut
    )


def _page_by_time(
    session: Session,
    query: Select[Any],
    time_col: Any,
    id_col: Any,
    cursor: str | None,
    limit: int,
    sort: str,
    model: type[Any],
    convert: Any = None,
) -> Page[Any]:
    limit = _clamp(limit)
    if cursor:
        c = Cursor.decode(cursor, sort=sort)
        query = query.where(_after_desc(time_col, id_col, _time_key(c.key), c.id))
    rows = list(session.scalars(query.order_by(time_col.desc(), id_col.desc()).limit(limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = None
    if more:
        last = rows[-1]
        next_cursor = Cursor(
            sort=sort, key=getattr(last, time_col.key).isoformat(), id=getattr(last, id_col.key)
        ).encode()
    items = convert(rows) if convert else [model.model_validate(r, from_attributes=True) for r in rows]
    return Page[model](items=items, next_cursor=next_cursor)  # type: ignore[valid-type]


# --- incidents and findings --------------------------------------------------------------------


def list_incidents(
    session: Session,
    *,
    node: str | None = None,
    open_only: bool = False,
    cursor: str | None = None,
    limit: int = 50,
    ruleset: RuleSet | None = None,
    flt: history.IncidentFilter | None = None,
) -> Page[IncidentOut]:
    """Incidents, newest opened first (filtered as ``healer incident list`` filters them: ``flt``,
    else ``node`` and ``open_only``), headlined by their latest finding (``ruleset``: the rules'
    holds in the headline), each with its node's pool.

    Raises:
        ApiError: 404 unknown node, 400 invalid cursor.
    """
    flt = flt or history.IncidentFilter(node=node, state="open" if open_only else None)
    if flt.node:
        get_node(session, flt.node)  # 404 for a node healer does not know
    query = history.incident_query(flt)

    def convert(rows: list[Incident]) -> list[IncidentOut]:
        ids = {r.node_id for r in rows}
        found = select(Node.id, Node.name, Node.pool).where(Node.id.in_(ids))
        nodes = {i: (n, p) for i, n, p in session.execute(found)} if ids else {}
        out = _incidents_out(session, rows, {i: n for i, (n, _) in nodes.items()}, ruleset)
        return [
            o.model_copy(update={"pool": nodes.get(r.node_id, ("", None))[1]})
            for o, r in zip(out, rows, strict=True)
        ]

    return _page_by_time(
        session, query, Incident.opened_at, Incident.id, cursor, limit, "incidents", IncidentOut, convert
    )


def pools(session: Session) -> list[str]:
    """Every pool a node is in, sorted."""
    return sorted(p for p in session.scalars(select(Node.pool).distinct()) if p)


def incident_outcomes(session: Session) -> list[str]:
    """The outcome filter's choices: ``confirmed`` and ``not_confirmed`` (whether the decision was
    right, :mod:`healer.engine.outcomes`), then every way an incident has closed so far
    (``close_reason``), sorted."""
    query = select(Incident.close_reason).where(Incident.close_reason.is_not(None)).distinct()
    return [*(str(o) for o in Outcome), *sorted(r for r in session.scalars(query) if r)]


def incident_rules(session: Session) -> list[str]:
    """Every rule an incident has followed, sorted: the rule filter's choices."""
    query = select(Incident.rule).where(Incident.rule.is_not(None)).distinct()
    return sorted(r for r in session.scalars(query) if r)


def list_findings(
    session: Session,
    *,
    node: str | None = None,
    rule: str | None = None,
    state: str | None = None,
    cursor: str | None = None,
    limit: int = 50,
) -> Page[FindingOut]:
    """Findings, most recently active first."""
    query = select(Finding)
    if node:
        query = query.where(Finding.node_name == node)
    if rule:
        query = query.where(Finding.rule == rule)
    if state:
        query = query.where(Finding.state == state)
    return _page_by_time(
        session, query, Finding.active_since, Finding.id, cursor, limit, "findings", FindingOut
    )


def _node_names(session: Session, ids: Iterable[int | None]) -> dict[int, str]:
    wanted = [i for i in set(ids) if i is not None]
    if not wanted:
        return {}
    return dict(session.execute(select(Node.id, Node.name).where(Node.id.in_(wanted))).all())


# --- tickets -----------------------------------------------------------------------------------


def ticket_rows(
    session: Session, tickets: Sequence[Ticket], node_names: dict[int, str] | None, *, now: datetime
) -> list[TicketOut]:
    """Tickets with timings and their latest delivery error (one outbox query for all of them)."""
    return [
        TicketOut(
            **asdict(view),
            open=view.open,
            age_seconds=(now - view.created_at).total_seconds(),
            time_to_acknowledge_seconds=view.time_to_acknowledge_seconds,
            time_to_repair_seconds=view.time_to_repair_seconds,
            delivery_attempts=view.attempts,
        )
        for view in ticket_views(session, tickets, node_names=node_names)
    ]


def list_tickets(
    session: Session,
    *,
    now: datetime,
    open_only: bool | None = None,
    status: str | None = None,
    provider: str | None = None,
    node: str | None = None,
    cursor: str | None = None,
    limit: int = 50,
) -> Page[TicketOut]:
    """Tickets, newest first; ``open_only`` True: not yet resolved/rejected/failed/closed."""
    query = select(Ticket)
    if open_only is True:
        query = query.where(Ticket.status.notin_([str(s) for s in CLOSED_TICKETS]))
    elif open_only is False:
        query = query.where(Ticket.status.in_([str(s) for s in CLOSED_TICKETS]))
    if status:
        query = query.where(Ticket.status == status)
    if provider:
        query = query.where(Ticket.provider == provider)
    if node:
        query = query.where(Ticket.node_id == get_node(session, node).id)

    def convert(rows: list[Ticket]) -> list[TicketOut]:
        return ticket_rows(session, rows, None, now=now)

    return _page_by_time(
        session, query, Ticket.created_at, Ticket.id, cursor, limit, "tickets", TicketOut, convert
    )


#: The tickets page's provider statistics cover this period.
STATS_WINDOW = timedelta(days=30)


def provider_stats(session: Session, *, now: datetime) -> list[ProviderStats]:
    """Per provider: open tickets, and over :data:`STATS_WINDOW` medians to acknowledge and repair."""
    return [
        ProviderStats.model_validate(s, from_attributes=True)
        for s in tickets_service.provider_stats(session, since=now - STATS_WINDOW)
    ]


def get_ticket(session: Session, ticket_id: int) -> Ticket:
    """Raises ApiError 404 for an unknown ticket."""
    ticket = session.get(Ticket, ticket_id)
    if ticket is None:
        raise ApiError(404, f"unknown ticket {ticket_id}")
    return ticket


# --- audit -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditFilter:
    """Audit log filters: kind (release, cordon, ...), status (refused, dry_run, ...), actor, target."""

    kind: str | None = None
    status: str | None = None
    actor: str | None = None
    target: str | None = None


def list_actions(
    session: Session, *, flt: AuditFilter, cursor: str | None = None, limit: int = 50
) -> Page[ActionOut]:
    """The audit log, newest first."""
    query = select(Action)
    if flt.kind:
        query = query.where(Action.kind == flt.kind)
    if flt.status:
        query = query.where(Action.status == flt.status)
    if flt.actor:
        query = query.where(Action.actor == flt.actor)
    if flt.target:
        query = query.where(Action.target == flt.target)
    return _page_by_time(session, query, Action.created_at, Action.id, cursor, limit, "audit", ActionOut)


def blind_spots(session: Session) -> BlindSpotsOut:
    """The last blind-spot observation (the ``blind_spots`` switch); empty when never observed."""
    report = BlindReport.from_switch(repo.get_switch(session, repo.SWITCH_BLIND_SPOTS))
    if report is None:
        return BlindSpotsOut(observed_at=None, spots=[], unresolved=[], errors=[])
    return BlindSpotsOut(
        observed_at=report.observed_at,
        total=report.found,
        per_rule=report.per_rule,
        spots=[BlindSpotOut(**spot.as_dict()) for spot in report.spots],
        unresolved=[UnresolvedSeriesOut(series=u.series, why=u.why) for u in report.unresolved],
        errors=list(report.errors),
    )
