"""The dashboard: server-rendered pages (readable with JavaScript off) and operator forms.

Operator actions take two steps: a GET shows what will happen and asks for confirmation (a
required checkbox), the POST does it. Every POST checks the role, the CSRF token and the
confirmation, then redirects (303) to the page the action concerns, which shows the result.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Depends, Form, Query, Request
from fastapi.responses import RedirectResponse, Response
from sqlalchemy.orm import Session

from api import burst_view, charts, links, operator, parts_view, queries, topology_view
from api.auth import CSRF_FIELD, SESSION_COOKIE, SESSION_MAX_AGE_SECONDS, Auth, Identity, cookie_header
from api.deps import (
    FleetQueryDep,
    IdentityDep,
    JudgingDep,
    NowDep,
    PrometheusDep,
    RowId,
    RuleSetDep,
    SessionDep,
    SettingsDep,
    require_operator,
)
from api.errors import ApiError
from api.exporter_inputs import check_inputs, with_inputs
from api.rendering import render
from api.schemas import FindingOut, NodeDetail
from healer import history
from healer.config import Settings
from healer.model.states import ActionStatus, NodeState, TicketStatus
from healer.operations import RELEASABLE
from healer.ruleset.schema import RuleSet
from healer.store.models import Incident

router = APIRouter(include_in_schema=False)

PAGE_SIZE = 50
#: Closed incidents listed on the fleet page at most (the Incidents page has the rest).
RECENT_CLOSED = 20

#: Result banners after a redirect; fixed texts keyed by a code, so no text is reflected from the URL.
DONE_MESSAGES = {
    "release": (
        "Release requested: healer moves the node to validating at its next tick, and returns it to "
        "service once its rules stay clear."
    ),
    "note": "Note added.",
    "pause": "healer is paused: no new quarantine, drain or ticket.",
    "resume": "healer resumed.",
    "breaker-reset": "Circuit breaker reset; held nodes are re-evaluated on the next tick.",
    "close": "Ticket closed.",
    "login": "Logged in.",
    "logout": "Logged out.",
}


def _done(request: Request) -> str | None:
    return DONE_MESSAGES.get(request.query_params.get("done", ""))


def _query_link(path: str, **params: str | None) -> str:
    clean = {k: v for k, v in params.items() if v}
    return f"{path}?{urlencode(clean)}" if clean else path


# --- pages -------------------------------------------------------------------------------------


def _fleet_context(
    session: Session,
    now: datetime,
    ruleset: RuleSet | None,
    settings: Settings,
    filters: dict[str, str | None],
    cursor: str | None,
    judging: queries.Judging,
) -> dict[str, Any]:
    """What the fleet page and its refreshing fragment show: nodes needing attention, counts,
    switches, budgets, the nodes that are not healthy, rule health."""
    status = queries.fleet_status(
        session,
        now=now,
        safety=settings.safety,
        ruleset=ruleset,
        source_grace_seconds=settings.prometheus.unavailable_grace_seconds,
    )
    state = filters["state"]
    flt = queries.NodeFilter(
        states=(state,) if state else (),
        pool=filters["pool"],
        rule=filters["rule"],
        text=filters["q"],
        unhealthy=not state,
    )
    page = queries.list_nodes(session, flt=flt, cursor=cursor, limit=PAGE_SIZE, judging=judging)
    recent_hours = settings.api.recent_incidents_hours
    recent = (
        queries.list_incidents(
            session,
            limit=RECENT_CLOSED,
            ruleset=ruleset,
            flt=history.IncidentFilter(state="closed", since=now - timedelta(hours=recent_hours)),
        )
        if recent_hours
        else None
    )
    return {
        "recent_hours": recent_hours,
        "recent_closed": recent.items if recent else [],
        "recent_more": bool(recent and recent.next_cursor),
        "status": status,
        "source": status.source,
        "attention": queries.needs_attention(
            session,
            now=now,
            awaiting_repair_seconds=settings.api.awaiting_repair_attention_hours * 3600,
            judging=judging,
        ),
        "blind": queries.blind_spots(session),
        "page": page,
        "filters": filters,
        "states": [str(s) for s in NodeState],
        "pools": [b.pool for b in status.budgets],
        "next_link": _query_link("/", **filters, cursor=page.next_cursor) if page.next_cursor else None,
        "first_link": _query_link("/", **filters) if cursor else None,
        "fragment_url": _query_link("/fragments/fleet", **filters, cursor=cursor),
        "refresh_seconds": settings.api.refresh_seconds,
        "now": now,
        "drain_blocked_alert_seconds": settings.safety.drain_blocked_alert_seconds,
    }


@router.get("/")
def fleet(
    request: Request,
    session: SessionDep,
    now: NowDep,
    ruleset: RuleSetDep,
    settings: SettingsDep,
    _who: IdentityDep,
    query: FleetQueryDep,
    judging: JudgingDep,
) -> Response:
    """Nodes needing attention first, then counts, switches and budgets, the nodes that are not
    healthy, and rule health; the content refreshes itself (``/fragments/fleet``)."""
    context = _fleet_context(session, now, ruleset, settings, query.filters, query.cursor, judging)
    return render(request, "fleet.html", {**context, "done": _done(request)})


@router.get("/fragments/fleet")
def fleet_fragment(
    request: Request,
    session: SessionDep,
    now: NowDep,
    ruleset: RuleSetDep,
    settings: SettingsDep,
    _who: IdentityDep,
    query: FleetQueryDep,
    judging: JudgingDep,
) -> Response:
    """The fleet page's content alone (HTML), for its refresh without a full reload."""
    context = _fleet_context(session, now, ruleset, settings, query.filters, query.cursor, judging)
    return render(request, "_fleet_live.html", context)


#: At most this many rules charted on a node page (one panel each, one or two queries each).
MAX_RULE_PANELS = 3
#: Audit rows of a node that are not decisions on it: left off its chart's marks.
NOT_DECISIONS = frozenset(
    {"note", "ticket_status", "ticket_retry", "pause", "resume", "breaker_trip", "breaker_reset"}
)


def _finding_spans(findings: list[FindingOut]) -> tuple[charts.Span, ...]:
    spans: list[charts.Span] = []
    for f in findings:
        pending_end = f.fired_at or (f.resolved_at if f.state == "resolved" else None)
        spans.append(charts.Span("pending", f.active_since, pending_end))
        if f.fired_at is not None:
            spans.append(charts.Span("firing", f.fired_at, f.resolved_at))
    return tuple(spans)


def chart_rules(
    detail: NodeDetail, ruleset: RuleSet | None, *, incident_rule: str | None
) -> list[charts.RuleContext]:
    """The rules a node page charts, each with its spans and the incident's decisions: the rule
    healer follows for the incident first, then the incident's other findings' rules (firing,
    pending, then resolved), at most :data:`MAX_RULE_PANELS`; none without rules or findings."""
    if ruleset is None:
        return []
    incident = detail.open_incident or (detail.incidents[0] if detail.incidents else None)
    findings = [f for f in detail.findings if incident is None or f.incident_id in (incident.id, None)]
    if incident is not None and not any(f.incident_id == incident.id for f in findings):
        findings = list(detail.findings)
    order = {"firing": 0, "pending": 1, "resolved": 2}
    names: list[str] = [incident_rule] if incident_rule else []
    for f in sorted(findings, key=lambda f: order.get(f.state, 3)):
        if f.rule not in names:
            names.append(f.rule)
    marks = tuple(
        charts.Mark(at=a.created_at, label=a.kind, detail=str(a.status))
        for a in detail.actions
        if a.kind not in NOT_DECISIONS and (incident is None or a.created_at >= incident.opened_at)
    )
    out: list[charts.RuleContext] = []
    for name in names:
        try:
            rule = ruleset.rule(name)
        except KeyError:
            continue
        mine = [f for f in findings if f.rule == name]
        out.append(
            charts.RuleContext(
                rule=rule,
                finding_labels=mine[0].labels if mine else {},
                spans=_finding_spans(mine),
                marks=marks,
            )
        )
        if len(out) == MAX_RULE_PANELS:
            break
    return out


@router.get("/nodes/{name}")
def node_page(
    name: str,
    request: Request,
    session: SessionDep,
    now: NowDep,
    ruleset: RuleSetDep,
    settings: SettingsDep,
    _who: IdentityDep,
    judging: JudgingDep,
) -> Response:
    """The verdict, timeline, findings, actions, tickets, GPUs, notes and the chart of one node."""
    detail = queries.node_detail(session, name, now=now, judging=judging)
    incident = detail.open_incident or (detail.incidents[0] if detail.incidents else None)
    start, end = charts.chart_window(
        incident.opened_at if incident else None, incident.closed_at if incident else None, now=now
    )
    incident_rule = session.get(Incident, incident.id).rule if incident else None  # type: ignore[union-attr]
    gate: charts.ChartGate = request.app.state.chart_gate
    with gate.slot() as turn:
        chart = (
            charts.build_node_chart(
                request.app.state.prometheus,
                node=name,
                node_labels=charts.node_labels_of(ruleset),
                start=start,
                end=end,
                rules=chart_rules(detail, ruleset, incident_rule=incident_rule),
            )
            if turn
            else charts.busy_chart(start=start, end=end)
        )
    return render(
        request,
        "node.html",
        {
            "d": detail,
            "chart": chart,
            "panel_links": [
                links.query_links(settings, p.source, start=start, end=end) if p.source else None
                for p in chart.panels
            ],
            "kubectl": links.kubectl_commands(detail.node.name),
            "incident": incident,
            "now": now,
            "done": _done(request),
            "releasable": detail.node.state in {str(s) for s in RELEASABLE},
            "parts_failed_before": parts_view.parts_failed_before(session, detail.node.name, now=now),
            "domain": topology_view.domain_of(session, incident.id) if incident else None,
        },
    )


#: The incidents page's time filter: opened or still open within this many days (0: any time).
INCIDENT_DAYS = (1, 7, 30, 90, 0)


@router.get("/incidents")
def incidents_page(
    request: Request,
    session: SessionDep,
    now: NowDep,
    ruleset: RuleSetDep,
    _who: IdentityDep,
    rule: str | None = None,
    pool: str | None = None,
    state: Literal["open", "closed", ""] = "",
    outcome: str | None = None,
    node: str | None = None,
    q: Annotated[str | None, Query(max_length=200)] = None,
    days: Annotated[int, Query(ge=0, le=3650)] = 7,
    cursor: str | None = None,
) -> Response:
    """Incident history, newest first: filter by rule, pool, state, outcome and time, search the
    rule, node name and headline (the filters of ``healer incident list``)."""
    flt = history.IncidentFilter(
        rule=rule or None,
        pool=pool or None,
        state=state or None,
        outcome=outcome or None,
        node=node or None,
        search=q or None,
        since=now - timedelta(days=days) if days else None,
    )
    page = queries.list_incidents(session, cursor=cursor, limit=PAGE_SIZE, ruleset=ruleset, flt=flt)
    filters = {
        "rule": rule,
        "pool": pool,
        "state": state,
        "outcome": outcome,
        "node": node,
        "q": q,
        "days": str(days),
    }
    known_rules = {r.name for r in ruleset.rules} if ruleset else set()
    return render(
        request,
        "incidents.html",
        {
            "page": page,
            "filters": filters,
            "days_choices": INCIDENT_DAYS,
            "rules": sorted({*queries.incident_rules(session), *known_rules}),
            "pools": queries.pools(session),
            "outcomes": queries.incident_outcomes(session),
            "now": now,
            "next_link": _query_link("/incidents", **filters, cursor=page.next_cursor)
            if page.next_cursor
            else None,
            "first_link": _query_link("/incidents", **filters) if cursor else None,
        },
    )


@router.get("/tickets")
def tickets_page(request: Request, session: SessionDep, now: NowDep, _who: IdentityDep) -> Response:
    """Open tickets (all of them, oldest waiting first) and the recently finished ones."""
    open_tickets = queries.list_tickets(session, now=now, open_only=True, limit=queries.MAX_LIMIT).items
    open_tickets.sort(key=lambda t: t.created_at)
    recent = queries.list_tickets(session, now=now, open_only=False, limit=PAGE_SIZE).items
    return render(
        request,
        "tickets.html",
        {
            "open_tickets": open_tickets,
            "recent": recent,
            "stats": queries.provider_stats(session, now=now),
            "now": now,
            "done": _done(request),
        },
    )


@router.get("/parts")
def parts_page(
    request: Request,
    session: SessionDep,
    now: NowDep,
    _who: IdentityDep,
    days: Annotated[int, Query(ge=1, le=365)] = 90,
) -> Response:
    """The parts ledger: parts that failed (repeat offenders flagged first), repair success per
    step and provider, and time between failures per part and per node, over ``days`` days."""
    return render(
        request, "parts.html", {"p": parts_view.parts_page(session, now=now, days=days), "now": now}
    )


@router.get("/trust")
def trust_page(
    request: Request,
    session: SessionDep,
    now: NowDep,
    ruleset: RuleSetDep,
    _who: IdentityDep,
    days: Annotated[int, Query(ge=1, le=365)] = 30,
) -> Response:
    """Each rule's record from its incidents' outcomes (precision, false quarantines, GPU-hours,
    time to repair), per rule and per rule x pool; what each shadow rule would have done; tickets
    past their provider's targets; over ``days`` days."""
    from api.trust_view import trust_page as build

    page = build(session, now=now, days=days, ruleset=ruleset)
    return render(request, "trust.html", {"p": page, "now": now})


@router.get("/burst")
def burst_page(request: Request, session: SessionDep, now: NowDep, _who: IdentityDep) -> Response:
    """The burst: each capacity rule's burst nodes, open or closed, the pods out and those that
    cannot come back, and the history of toggles and returns."""
    return render(request, "burst.html", {"b": burst_view.burst_page(session), "now": now})


@router.get("/topology")
def topology_page(request: Request, session: SessionDep, now: NowDep, _who: IdentityDep) -> Response:
    """Racks, switches and NVLink domains as a grid coloured by their nodes' health, and the domain
    incidents (open first)."""
    return render(request, "topology.html", {"t": topology_view.topology_page(session), "now": now})


@router.get("/domains/{incident_id}")
def domain_incident_page(
    request: Request, session: SessionDep, now: NowDep, _who: IdentityDep, incident_id: RowId
) -> Response:
    """One domain incident: its domain, thresholds, member nodes (state, findings) and ticket."""
    page = topology_view.domain_incident_page(session, incident_id)
    if page is None:
        raise ApiError(404, f"no domain incident {incident_id}")
    return render(request, "domain.html", {"d": page, "now": now})


@router.get("/rules")
def rules_page(
    request: Request,
    session: SessionDep,
    now: NowDep,
    ruleset: RuleSetDep,
    prometheus: PrometheusDep,
    _who: IdentityDep,
) -> Response:
    """The loaded rule set with health, rules whose input metrics no target exports, and the
    errors of a rejected reload."""
    page = with_inputs(
        queries.rules_page(session, ruleset=ruleset, now=now), check_inputs(prometheus, ruleset, now=now)
    )
    return render(request, "rules.html", {"r": page, "now": now})


@router.get("/audit")
def audit_page(
    request: Request,
    session: SessionDep,
    _who: IdentityDep,
    kind: str | None = None,
    status: str | None = None,
    actor: str | None = None,
    target: str | None = None,
    cursor: str | None = None,
) -> Response:
    """Every action taken, dry-run or refused, and every operator action, by whom."""
    flt = queries.AuditFilter(kind=kind, status=status, actor=actor, target=target)
    page = queries.list_actions(session, flt=flt, cursor=cursor, limit=PAGE_SIZE)
    filters = {"kind": kind, "status": status, "actor": actor, "target": target}
    return render(
        request,
        "audit.html",
        {
            "page": page,
            "filters": filters,
            "statuses": [str(s) for s in ActionStatus],
            "next_link": _query_link("/audit", **filters, cursor=page.next_cursor)
            if page.next_cursor
            else None,
            "first_link": _query_link("/audit", **filters) if cursor else None,
        },
    )


# --- login -------------------------------------------------------------------------------------


def _safe_next(target: str | None) -> str:
    # Only same-site paths: an open redirect would turn the login form into a phishing aid.
    if target and target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/"


@router.get("/login")
def login_form(request: Request, next: str | None = None) -> Response:
    """The login form: paste a bearer token from the settings to use it from the browser."""
    auth: Auth = request.app.state.auth
    request.state.identity = auth.read_login(request.cookies.get(SESSION_COOKIE))
    return render(request, "login.html", {"next": _safe_next(next), "error": None, "done": _done(request)})


@router.post("/login")
def login(
    request: Request,
    token: Annotated[str, Form()] = "",
    csrf_token: Annotated[str, Form(alias=CSRF_FIELD)] = "",
    next: Annotated[str, Form()] = "/",
) -> Response:
    """Check the token; on success set the signed login cookie and go to ``next``."""
    auth: Auth = request.app.state.auth
    auth.check_csrf(request, csrf_token)
    result = auth.login(token)
    if result is None:
        return render(
            request,
            "login.html",
            {"next": _safe_next(next), "error": "Unknown token.", "done": None},
            status_code=401,
        )
    _identity, cookie = result
    secure = request.url.scheme == "https"
    request.state.set_cookies.append(
        cookie_header(SESSION_COOKIE, cookie, max_age=SESSION_MAX_AGE_SECONDS, secure=secure)
    )
    return RedirectResponse(_safe_next(next), status_code=303)


@router.post("/logout")
def logout(request: Request, csrf_token: Annotated[str, Form(alias=CSRF_FIELD)] = "") -> Response:
    """End the login session on the server (a copied cookie stops working) and forget the cookie."""
    auth: Auth = request.app.state.auth
    auth.check_csrf(request, csrf_token)
    who = auth.read_login(request.cookies.get(SESSION_COOKIE))
    auth.logout(request.cookies.get(SESSION_COOKIE), user=who.user if who else "anonymous")
    request.state.set_cookies.append(
        cookie_header(SESSION_COOKIE, "", max_age=0, secure=request.url.scheme == "https")
    )
    return RedirectResponse("/login?done=logout", status_code=303)


# --- operator actions ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfirmSpec:
    """What a confirmation page says: title, explanation, button, and the text field it asks for."""

    title: str
    explain: str
    button: str
    field: str | None = "reason"  # "reason", "text" (a note) or None
    field_required: bool = False


SPECS = {
    "release": ConfirmSpec(
        "Release node",
        "healer moves the node to validating at its next tick and un-cordons it once its rules stay "
        "clear for the recovery hold. Use this when the node was repaired or you take responsibility "
        "for it.",
        "Release",
    ),
    "note": ConfirmSpec(
        "Add a note",
        "The note goes into the node's audit trail.",
        "Add note",
        field="text",
        field_required=True,
    ),
    "pause": ConfirmSpec(
        "Pause healer",
        "No new quarantine, drain or ticket for any node until resumed. Detection and recording go on.",
        "Pause",
    ),
    "resume": ConfirmSpec("Resume healer", "healer acts on findings again from the next tick.", "Resume"),
    "breaker-reset": ConfirmSpec(
        "Reset the circuit breaker",
        "The nodes the breaker held back are re-evaluated against fresh data on the next tick; nothing "
        "is replayed. Reset only once you know why many nodes went bad at once.",
        "Reset breaker",
        field=None,
    ),
    "close": ConfirmSpec(
        "Close ticket",
        "healer stops tracking this ticket. It does not tell the provider: close it there too if needed.",
        "Close ticket",
    ),
}


def _confirm_page(
    request: Request,
    action: str,
    *,
    target: str,
    post_to: str,
    back: str,
    error: str | None = None,
    status_code: int = 200,
    value: str = "",
) -> Response:
    return render(
        request,
        "confirm.html",
        {
            "spec": SPECS[action],
            "action": action,
            "target": target,
            "post_to": post_to,
            "back": back,
            "error": error,
            "value": value,
        },
        status_code=status_code,
    )


@dataclass
class FormPost:
    """A submitted operator form, checked: role (403), CSRF (403)."""

    who: Identity
    confirmed: bool
    reason: str
    text: str


def checked_form(
    request: Request,
    who: Annotated[Identity, Depends(require_operator)],
    csrf_token: Annotated[str, Form(alias=CSRF_FIELD)] = "",
    confirm: Annotated[str | None, Form()] = None,
    reason: Annotated[str, Form(max_length=2000)] = "",
    text: Annotated[str, Form(max_length=10000)] = "",
) -> FormPost:
    """Dependency of every operator POST: operator role, valid CSRF token; collects the fields."""
    auth: Auth = request.app.state.auth
    auth.check_csrf(request, csrf_token)
    return FormPost(who=who, confirmed=confirm == "yes", reason=reason.strip(), text=text)


FormDep = Annotated[FormPost, Depends(checked_form)]
OperatorPage = Annotated[Identity, Depends(require_operator)]


def _run(
    request: Request,
    form: FormPost,
    action: str,
    *,
    target: str,
    post_to: str,
    back: str,
    do: object,
) -> Response:
    value = form.text if SPECS[action].field == "text" else form.reason
    if not form.confirmed:
        return _confirm_page(
            request,
            action,
            target=target,
            post_to=post_to,
            back=back,
            error="Tick the confirmation box to go ahead.",
            status_code=400,
            value=value,
        )
    try:
        assert callable(do)
        do()
    except ApiError as exc:
        if exc.status == 404:
            raise
        return _confirm_page(
            request,
            action,
            target=target,
            post_to=post_to,
            back=back,
            error=exc.message,
            status_code=exc.status,
            value=value,
        )
    sep = "&" if "?" in back else "?"
    return RedirectResponse(f"{back}{sep}done={action}", status_code=303)


def _node_link(name: str) -> str:
    return f"/nodes/{quote(name, safe='')}"


@router.get("/nodes/{name}/release")
def release_confirm(name: str, request: Request, session: SessionDep, _op: OperatorPage) -> Response:
    node = queries.get_node(session, name)
    link = _node_link(node.name)
    return _confirm_page(
        request, "release", target=f"node {node.name} ({node.state})", post_to=f"{link}/release", back=link
    )


@router.post("/nodes/{name}/release")
def release_post(name: str, request: Request, form: FormDep, now: NowDep) -> Response:
    link = _node_link(name)
    factory = request.app.state.session_factory
    return _run(
        request,
        form,
        "release",
        target=f"node {name}",
        post_to=f"{link}/release",
        back=link,
        do=lambda: operator.release(factory, node=name, actor=form.who.user, now=now, reason=form.reason),
    )


@router.get("/nodes/{name}/note")
def note_confirm(name: str, request: Request, session: SessionDep, _op: OperatorPage) -> Response:
    node = queries.get_node(session, name)
    link = _node_link(node.name)
    return _confirm_page(request, "note", target=f"node {node.name}", post_to=f"{link}/note", back=link)


@router.post("/nodes/{name}/note")
def note_post(name: str, request: Request, form: FormDep, now: NowDep) -> Response:
    link = _node_link(name)
    factory = request.app.state.session_factory
    return _run(
        request,
        form,
        "note",
        target=f"node {name}",
        post_to=f"{link}/note",
        back=link,
        do=lambda: operator.add_note(factory, node=name, actor=form.who.user, now=now, text=form.text),
    )


_CONTROLS = {"pause", "resume", "breaker-reset"}


@router.get("/controls/{action}")
def control_confirm(action: str, request: Request, _op: OperatorPage) -> Response:
    if action not in _CONTROLS:
        raise ApiError(404, f"no control {action!r}")
    return _confirm_page(request, action, target="healer", post_to=f"/controls/{action}", back="/")


@router.post("/controls/{action}")
def control_post(action: str, request: Request, form: FormDep, now: NowDep) -> Response:
    if action not in _CONTROLS:
        raise ApiError(404, f"no control {action!r}")
    factory = request.app.state.session_factory
    user = form.who.user

    def do() -> None:
        if action == "breaker-reset":
            operator.reset_breaker(factory, actor=user, now=now)
        else:
            operator.set_paused(factory, paused=action == "pause", actor=user, now=now, reason=form.reason)

    return _run(request, form, action, target="healer", post_to=f"/controls/{action}", back="/", do=do)


@router.get("/tickets/{ticket_id}/close")
def close_confirm(ticket_id: RowId, request: Request, session: SessionDep, _op: OperatorPage) -> Response:
    ticket = queries.get_ticket(session, ticket_id)
    target = f"ticket {ticket.id} ({ticket.provider}, {ticket.status})"
    if ticket.status == TicketStatus.CLOSED:
        raise ApiError(409, f"ticket {ticket.id} is already closed")
    return _confirm_page(
        request, "close", target=target, post_to=f"/tickets/{ticket_id}/close", back="/tickets"
    )


@router.post("/tickets/{ticket_id}/close")
def close_post(ticket_id: RowId, request: Request, form: FormDep, now: NowDep) -> Response:
    factory = request.app.state.session_factory
    return _run(
        request,
        form,
        "close",
        target=f"ticket {ticket_id}",
        post_to=f"/tickets/{ticket_id}/close",
        back="/tickets",
        do=lambda: operator.close_ticket(
            factory, ticket_id=ticket_id, actor=form.who.user, now=now, reason=form.reason
        ),
    )
