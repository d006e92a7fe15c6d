"""The JSON API, ``/api/v1``: nodes, history, incidents, findings, tickets, rules, audit, actions.

Lists are cursor-paginated: each answer has ``next_cursor``; pass it back as ``cursor`` (null: the
last page). Errors are ``{"error": {"code", "message"}}``.

Authentication: a bearer token (``Authorization: Bearer ...``), the login cookie, the proxy's user
header, or the anonymous role (see :mod:`api.auth`). POSTs need the operator role; those not
authenticated with a bearer header must also send the ``X-CSRF-Token`` header (a bearer header
cannot be attached by a cross-site browser request, so those are exempt).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request

from api import operator, queries
from api.auth import CSRF_HEADER, Auth, Identity
from api.deps import (
    JudgingDep,
    NowDep,
    PrometheusDep,
    RowId,
    RuleSetDep,
    SessionDep,
    SettingsDep,
    get_identity,
    require_operator,
)
from api.errors import ApiError
from api.exporter_inputs import check_inputs, with_inputs
from api.schemas import (
    ActionOut,
    BlindSpotsOut,
    ErrorBody,
    FindingOut,
    FleetStatus,
    IncidentOut,
    NodeDetail,
    NodeSummary,
    NoteIn,
    OperationOut,
    OutcomeIn,
    Page,
    ReasonIn,
    RulesOut,
    TicketOut,
    TransitionOut,
)
from healer import history

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in {
        400: "Bad request (e.g. an invalid cursor).",
        401: "Not authenticated.",
        403: "Not allowed (viewer role, or missing CSRF token).",
        404: "No such node or ticket.",
        409: "The action does not apply now (e.g. node already healthy).",
        422: "Invalid parameters or body.",
    }.items()
}

router = APIRouter(prefix="/api/v1", tags=["api"], responses=_ERRORS, dependencies=[Depends(get_identity)])

Limit = Annotated[int, Query(ge=1, le=queries.MAX_LIMIT, description="Page size.")]
CursorQ = Annotated[str | None, Query(description="next_cursor of the previous page.")]


def operator_with_csrf(
    request: Request, identity: Annotated[Identity, Depends(require_operator)]
) -> Identity:
    """An operator; when not authenticated by a bearer header, also a valid ``X-CSRF-Token`` header."""
    if identity.via != "token":
        auth: Auth = request.app.state.auth
        auth.check_csrf(request, request.headers.get(CSRF_HEADER))
    return identity


OperatorCsrf = Annotated[Identity, Depends(operator_with_csrf)]


@router.get("/status", response_model=FleetStatus, summary="Fleet at a glance")
def status(session: SessionDep, now: NowDep, ruleset: RuleSetDep, settings: SettingsDep) -> FleetStatus:
    """Counts per lifecycle state, pause and breaker switches, budget use per pool, last tick, rules."""
    return queries.fleet_status(
        session,
        now=now,
        safety=settings.safety,
        ruleset=ruleset,
        source_grace_seconds=settings.prometheus.unavailable_grace_seconds,
    )


@router.get("/nodes", response_model=Page[NodeSummary], summary="List nodes")
def list_nodes(
    session: SessionDep,
    judging: JudgingDep,
    state: Annotated[list[str] | None, Query(description="Any of these states (repeatable).")] = None,
    pool: str | None = None,
    rule: Annotated[
        str | None,
        Query(description="Nodes with a pending or firing finding of it, or an open incident of it."),
    ] = None,
    q: Annotated[str | None, Query(description="Substring of the node name.")] = None,
    unhealthy: Annotated[bool, Query(description="Only nodes not healthy.")] = False,
    sort: Annotated[
        str, Query(pattern="^(since|name)$", description="since (newest change first) or name.")
    ] = ("since"),
    cursor: CursorQ = None,
    limit: Limit = 50,
) -> Page[NodeSummary]:
    """Nodes with their state, active rules, affected GPUs, latest ticket and verdict (what fired,
    what healer did, what it waits for, what a person should do)."""
    flt = queries.NodeFilter(states=tuple(state or ()), pool=pool, rule=rule, text=q, unhealthy=unhealthy)
    return queries.list_nodes(
        session,
        flt=flt,
        sort="name" if sort == "name" else "since",
        cursor=cursor,
        limit=limit,
        judging=judging,
    )


@router.get("/nodes/{name}", response_model=NodeDetail, summary="One node")
def get_node(name: str, session: SessionDep, now: NowDep, judging: JudgingDep) -> NodeDetail:
    """The node with its verdict, GPUs, incidents and the latest transitions, findings, actions,
    notes, tickets."""
    return queries.node_detail(session, name, now=now, judging=judging)


@router.get("/nodes/{name}/history", response_model=Page[TransitionOut], summary="A node's transitions")
def node_history(
    name: str, session: SessionDep, cursor: CursorQ = None, limit: Limit = 100
) -> Page[TransitionOut]:
    """Every lifecycle step of the node, newest first: from, to, actor, reason, evidence, time."""
    return queries.node_transitions(session, name, cursor=cursor, limit=limit)


@router.get("/incidents", response_model=Page[IncidentOut], summary="List incidents")
def list_incidents(
    session: SessionDep,
    ruleset: RuleSetDep,
    node: str | None = None,
    open: Annotated[bool, Query(description="Only incidents not closed yet.")] = False,
    rule: Annotated[str | None, Query(description="The rule it follows, or a finding's.")] = None,
    pool: Annotated[str | None, Query(description="Its node's pool.")] = None,
    state: Annotated[Literal["open", "closed"] | None, Query(description="open or closed.")] = None,
    outcome: Annotated[
        str | None,
        Query(
            description="confirmed or not_confirmed (was the decision right), else how it closed "
            "(close_reason), exactly."
        ),
    ] = None,
    since: Annotated[datetime | None, Query(description="Open at some time at or after this.")] = None,
    until: Annotated[datetime | None, Query(description="Opened at or before this.")] = None,
    q: Annotated[str | None, Query(description="Substring of its rule, node name or headline.")] = None,
    cursor: CursorQ = None,
    limit: Limit = 50,
) -> Page[IncidentOut]:
    """Incidents, newest first, each headlined by its latest finding (``summary``; ``first_summary``
    is what was recorded when it opened), filtered as ``healer incident list`` filters them."""
    flt = history.IncidentFilter(
        node=node,
        state=state or ("open" if open else None),
        rule=rule,
        pool=pool,
        outcome=outcome,
        since=since,
        until=until,
        search=q,
    )
    return queries.list_incidents(session, cursor=cursor, limit=limit, ruleset=ruleset, flt=flt)


@router.get("/findings", response_model=Page[FindingOut], summary="List findings")
def list_findings(
    session: SessionDep,
    node: str | None = None,
    rule: str | None = None,
    state: Annotated[str | None, Query(description="pending, firing or resolved.")] = None,
    cursor: CursorQ = None,
    limit: Limit = 50,
) -> Page[FindingOut]:
    """Findings (rule episodes per series) with values and labels, most recently active first."""
    return queries.list_findings(session, node=node, rule=rule, state=state, cursor=cursor, limit=limit)


@router.get("/tickets", response_model=Page[TicketOut], summary="List tickets")
def list_tickets(
    session: SessionDep,
    now: NowDep,
    open: Annotated[bool | None, Query(description="true: open only; false: finished only.")] = None,
    status: str | None = None,
    provider: str | None = None,
    node: str | None = None,
    cursor: CursorQ = None,
    limit: Limit = 50,
) -> Page[TicketOut]:
    """Provider tickets with status, age, times to acknowledge and repair, and delivery errors."""
    return queries.list_tickets(
        session,
        now=now,
        open_only=open,
        status=status,
        provider=provider,
        node=node,
        cursor=cursor,
        limit=limit,
    )


@router.get("/blind-spots", response_model=BlindSpotsOut, summary="Where rules cannot see")
def get_blind_spots(session: SessionDep) -> BlindSpotsOut:
    """Every GPU, InfiniBand port or node lacking an input a rule reads while other targets export
    it (blind, never healthy), and the series that named no Node, from the controller's last
    observation."""
    return queries.blind_spots(session)


@router.get("/rules", response_model=RulesOut, summary="Rule set and health")
def list_rules(session: SessionDep, now: NowDep, ruleset: RuleSetDep, prometheus: PrometheusDep) -> RulesOut:
    """The loaded rules with their last evaluation, firing nodes, input metrics no target exports,
    and rejected reloads."""
    page = queries.rules_page(session, ruleset=ruleset, now=now)
    return with_inputs(page, check_inputs(prometheus, ruleset, now=now))


@router.get("/topology", summary="Topology and domain incidents")
def topology(session: SessionDep) -> dict[str, object]:
    """Kind → its domains (nodes, their states, the open domain incident) as the leader last read
    the topology, and the domain incidents, open first (docs/topology.md)."""
    from api.topology_view import topology_page

    return topology_page(session).as_json()


@router.get("/domains/{incident_id}", summary="One domain incident")
def domain_incident(session: SessionDep, incident_id: RowId) -> dict[str, object]:
    """The domain incident: its domain, thresholds, members (state, incident, findings), tickets."""
    from api.topology_view import domain_incident_page

    page = domain_incident_page(session, incident_id)
    if page is None:
        raise ApiError(404, f"no domain incident {incident_id}")
    return page.as_json()


@router.get("/burst", summary="Burst nodes")
def burst(session: SessionDep) -> dict[str, object]:
    """Each capacity rule's burst nodes as last observed (state, pods out, pods that stay and why,
    the capacity numbers), the latest toggles with their evidence, and the latest pods sent back."""
    from api.burst_view import burst_page

    return burst_page(session).as_json()


@router.get("/parts", summary="Parts ledger")
def parts_ledger(
    session: SessionDep,
    now: NowDep,
    days: Annotated[int, Query(ge=1, le=365, description="Look back this many days.")] = 90,
    repeat: Annotated[bool, Query(description="Only parts that failed again after a repair.")] = False,
) -> dict[str, object]:
    """Parts (GPU UUID and serial, HCA) with their failures, nodes and repeat flag; repair outcomes
    per step and provider; mean time between failures per part and per node, seconds."""
    from healer.store import parts

    book = parts.ledger(session, since=now - timedelta(days=days))
    return {
        "parts": [
            {
                "kind": p.kind,
                "id": p.id,
                "serial": p.serial,
                "repeat": p.repeat,
                "nodes": p.nodes,
                "failures": [
                    {"at": at.isoformat(), "node": node, "incident": inc} for at, node, inc in p.failures
                ],
                "repaired_incidents": sorted(p.repaired_incidents),
                "mean_time_between_failures_seconds": p.mean_time_between_failures_seconds,
            }
            for p in book.parts
            if p.repeat or not repeat
        ],
        "steps": [
            {
                "step": s.step,
                "provider": s.provider,
                "attempts": s.attempts,
                "succeeded": s.succeeded,
                "success_rate": s.success_rate,
            }
            for s in book.steps
        ],
        "node_mean_time_between_failures_seconds": book.node_mtbf(),
    }


@router.get("/trust", summary="Each rule's record from outcomes")
def trust(
    session: SessionDep,
    now: NowDep,
    ruleset: RuleSetDep,
    days: Annotated[int, Query(ge=1, le=365, description="Look back this many days.")] = 30,
) -> dict[str, object]:
    """Per rule and per rule x node pool: incidents decided (confirmed + not confirmed), precision
    (confirmed / decided), false quarantines, GPU-hours and node-hours out of service, median time
    to repair (seconds) and the outcomes' bases, over incidents closed in the window; per shadow
    rule what acting would have done (nodes, GPU-hours, tickets) and its decisions' outcomes."""
    from api.trust_view import trust_page

    return trust_page(session, now=now, days=days, ruleset=ruleset).as_json()


@router.get("/audit", response_model=Page[ActionOut], summary="Audit log")
def audit(
    session: SessionDep,
    kind: str | None = None,
    status: Annotated[str | None, Query(description="e.g. succeeded, dry_run, refused, failed.")] = None,
    actor: str | None = None,
    target: Annotated[str | None, Query(description="Node name (or 'healer' for switches).")] = None,
    cursor: CursorQ = None,
    limit: Limit = 50,
) -> Page[ActionOut]:
    """Every action taken, dry-run or refused, and every operator action, newest first."""
    flt = queries.AuditFilter(kind=kind, status=status, actor=actor, target=target)
    return queries.list_actions(session, flt=flt, cursor=cursor, limit=limit)


# --- actions ---------------------------------------------------------------------------------


@router.post("/nodes/{name}/release", response_model=OperationOut, summary="Release a node")
def release(
    name: str, request: Request, who: OperatorCsrf, now: NowDep, body: ReasonIn | None = None
) -> OperationOut:
    """Send the node to validation; it returns to service once its rules stay clear (recovery hold)."""
    return operator.release(
        request.app.state.session_factory,
        node=name,
        actor=who.user,
        now=now,
        reason=body.reason if body else "",
    )


@router.post("/nodes/{name}/notes", response_model=OperationOut, summary="Add a note")
def add_note(name: str, body: NoteIn, request: Request, who: OperatorCsrf, now: NowDep) -> OperationOut:
    """Attach a note to the node's audit trail (and its open incident)."""
    return operator.add_note(
        request.app.state.session_factory, node=name, actor=who.user, now=now, text=body.text
    )


@router.post("/pause", response_model=OperationOut, summary="Pause healer")
def pause(request: Request, who: OperatorCsrf, now: NowDep, body: ReasonIn | None = None) -> OperationOut:
    """No new quarantine, drain or ticket until resumed; detection and recording go on."""
    return operator.set_paused(
        request.app.state.session_factory,
        paused=True,
        actor=who.user,
        now=now,
        reason=body.reason if body else "",
    )


@router.post("/resume", response_model=OperationOut, summary="Resume healer")
def resume(request: Request, who: OperatorCsrf, now: NowDep, body: ReasonIn | None = None) -> OperationOut:
    return operator.set_paused(
        request.app.state.session_factory,
        paused=False,
        actor=who.user,
        now=now,
        reason=body.reason if body else "",
    )


@router.post("/breaker/reset", response_model=OperationOut, summary="Reset the circuit breaker")
def breaker_reset(request: Request, who: OperatorCsrf, now: NowDep) -> OperationOut:
    """The nodes it held back are re-evaluated on fresh data at the next tick, not replayed."""
    return operator.reset_breaker(request.app.state.session_factory, actor=who.user, now=now)


@router.post("/tickets/{ticket_id}/close", response_model=OperationOut, summary="Close a ticket")
def close_ticket(
    ticket_id: RowId, request: Request, who: OperatorCsrf, now: NowDep, body: ReasonIn | None = None
) -> OperationOut:
    return operator.close_ticket(
        request.app.state.session_factory,
        ticket_id=ticket_id,
        actor=who.user,
        now=now,
        reason=body.reason if body else "",
    )


@router.post("/incidents/{incident_id}/outcome", response_model=OperationOut, summary="Set an outcome")
def set_outcome(
    incident_id: RowId, body: OutcomeIn, request: Request, who: OperatorCsrf, now: NowDep
) -> OperationOut:
    """Set a closed incident's outcome by hand (``confirmed``/``not_confirmed``; null: back to the
    derived one). Audited (kind ``outcome``); healer never overwrites it."""
    return operator.set_outcome(
        request.app.state.session_factory,
        incident_id=incident_id,
        outcome=body.outcome,
        actor=who.user,
        now=now,
        reason=body.reason,
    )
