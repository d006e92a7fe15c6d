"""``healer incident list|show|outcome``: the history of incidents, read from the database.

The queries are :mod:`healer.history`'s, the ones the dashboard's ``/api/v1/incidents`` filters
through. Listing commands take ``-o table|wide|json|yaml``; times are ISO 8601 UTC. Exit status 1
with a message on stderr for an unknown incident; 2 for a time that is not one. ``outcome`` sets a
closed incident's outcome by hand (:func:`healer.store.outcomes.set_outcome`, audited).

The record helpers here (``*_record``, ``*_table``) also print ``healer node show``.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer

from healer.cli.context import store_sessions
from healer.cli.output import JsonAlias, Output, OutputOption, chosen, emit, iso, table_width
from healer.cli.tables import columns

if TYPE_CHECKING:
    from healer.history import IncidentRow
    from healer.store.models import Action, Finding, Transition
    from healer.tickets.views import TicketView

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Incidents: history of unhealthy nodes.")


class IncidentState(StrEnum):
    """``--state``: incidents not closed yet, or closed."""

    OPEN = "open"
    CLOSED = "closed"


# --- records (JSON/YAML) and table rows, shared with `healer node show` ---------------------------


def _when(value: datetime | None) -> str:
    return iso(value) or "-"


def _text(value: object) -> str:
    return "-" if value is None or value == "" else str(value)


def incident_record(row: IncidentRow) -> dict[str, Any]:
    """An incident as JSON/YAML: its fields as ``/api/v1/incidents`` names them, plus pool, state,
    rule (healer's) and rules (its findings')."""
    return {
        "id": row.id,
        "node": row.node,
        "pool": row.pool,
        "state": row.state,
        "rule": row.rule,
        "rules": row.rules,
        "opened_at": iso(row.opened_at),
        "closed_at": iso(row.closed_at),
        "summary": row.summary,
        "first_summary": row.first_summary,
        "close_reason": row.close_reason,
        "escalated": row.escalated,
        "blocked_reason": row.blocked_reason,
        "domain": row.domain,
    }


def finding_record(f: Finding) -> dict[str, Any]:
    """A finding as JSON/YAML (the fields of ``/api/v1/findings``)."""
    return {
        "id": f.id,
        "rule": f.rule,
        "node": f.node_name,
        "gpu": f.gpu,
        "state": f.state,
        "severity": f.severity,
        "value": f.value,
        "unit": f.unit,
        "labels": dict(f.labels),
        "summary": f.summary,
        "active_since": iso(f.active_since),
        "fired_at": iso(f.fired_at),
        "resolved_at": iso(f.resolved_at),
        "incident_id": f.incident_id,
    }


def action_record(a: Action) -> dict[str, Any]:
    """An audit-log row as JSON/YAML; its error redacted, as the dashboard shows it."""
    from healer.redaction import redact_text

    return {
        "id": a.id,
        "at": iso(a.created_at),
        "kind": a.kind,
        "status": a.status,
        "actor": a.actor,
        "target": a.target,
        "attempts": a.attempts,
        "error": redact_text(a.error) if a.error else None,
        "detail": a.detail,
        "incident_id": a.incident_id,
    }


def ticket_record(t: TicketView) -> dict[str, Any]:
    """A ticket as ``healer ticket list -o json`` prints it (errors and reason redacted)."""
    from dataclasses import asdict

    from healer.redaction import redact_text

    record = {k: iso(v) if isinstance(v, datetime) else v for k, v in asdict(t).items()}
    record["reason"] = redact_text(t.reason) if t.reason else None
    return record


def transition_record(t: Transition) -> dict[str, Any]:
    """A lifecycle step as JSON/YAML (the fields of ``/api/v1/nodes/{name}/history``)."""
    return {
        "id": t.id,
        "at": iso(t.at),
        "from": t.from_state,
        "to": t.to_state,
        "actor": t.actor,
        "reason": t.reason,
        "evidence": t.evidence,
        "incident_id": t.incident_id,
    }


def _value(f: dict[str, Any]) -> str:
    if f["value"] is None:
        return "-"
    return f"{f['value']:g}" + (f" {f['unit']}" if f["unit"] else "")


def incidents_table(records: list[dict[str, Any]], *, with_node: bool = True) -> list[list[str]]:
    """Rows (header first) of incidents, newest first as given."""
    header = ["ID", "STATE", "OPENED", "CLOSED", *(["NODE", "POOL"] if with_node else []), "RULE", "SUMMARY"]
    rows = [header]
    for r in records:
        rule = r["rule"] or ", ".join(r["rules"]) or "-"
        where = [r["node"], r["pool"]] if with_node else []
        rows.append(
            [
                str(r["id"]),
                r["state"],
                _text(r["opened_at"]),
                _text(r["closed_at"]),
                *where,
                rule,
                _text(r["summary"]),
            ]
        )
    return rows


def findings_table(records: list[dict[str, Any]]) -> list[list[str]]:
    """Rows (header first) of findings."""
    rows = [["RULE", "GPU", "STATE", "VALUE", "ACTIVE SINCE", "FIRED", "RESOLVED", "SUMMARY"]]
    for f in records:
        rows.append(
            [
                f["rule"],
                _text(f["gpu"]),
                f["state"],
                _value(f),
                _text(f["active_since"]),
                _text(f["fired_at"]),
                _text(f["resolved_at"]),
                _text(f["summary"]),
            ]
        )
    return rows


def actions_table(records: list[dict[str, Any]]) -> list[list[str]]:
    """Rows (header first) of audit-log actions."""
    rows = [["AT", "KIND", "STATUS", "ACTOR", "TARGET", "ERROR"]]
    for a in records:
        rows.append(
            [_text(a["at"]), a["kind"], a["status"], a["actor"], _text(a["target"]), _text(a["error"])]
        )
    return rows


def tickets_table(records: list[dict[str, Any]]) -> list[list[str]]:
    """Rows (header first) of tickets."""
    rows = [["ID", "PROVIDER", "STATUS", "EXTERNAL", "CREATED", "RESOLVED", "ERROR"]]
    for t in records:
        error = t["delivery_error"] if t["status"] in ("pending", "failed") else None
        rows.append(
            [
                str(t["id"]),
                t["provider"],
                t["status"] + (" (escalated)" if t["escalated"] else ""),
                _text(t["external_id"]),
                _text(t["created_at"]),
                _text(t["resolved_at"]),
                _text(error),
            ]
        )
    return rows


def transitions_table(records: list[dict[str, Any]]) -> list[list[str]]:
    """Rows (header first) of lifecycle transitions."""
    rows = [["AT", "FROM", "TO", "ACTOR", "REASON"]]
    for t in records:
        rows.append([_text(t["at"]), t["from"], t["to"], t["actor"], _text(t["reason"])])
    return rows


def section(title: str, rows: list[list[str]], *, width: int | None, empty: str = "none") -> str:
    """A titled table (``rows``: header first), or the title and ``empty`` when it has no rows."""
    if len(rows) < 2:
        return f"{title}: {empty}"
    return f"{title}:\n{columns(rows, width=width)}"


# --- commands ------------------------------------------------------------------------------------


def option_time(option: str, text: str | None, now: datetime) -> datetime | None:
    """``--since``/``--until``: ISO 8601 (UTC unless it says), ``now``, or a duration before now
    (``2h``, ``-2h``, ``now-2h``); None when not given. Exit 2 naming the option otherwise."""
    if text is None:
        return None
    from datetime import timedelta

    from healer.cli.backtest import parse_time
    from healer.ruleset.durations import parse_duration

    try:
        return now - timedelta(seconds=parse_duration(text.strip()))
    except ValueError:
        pass
    try:
        return parse_time(text, now)
    except ValueError as exc:
        typer.echo(
            f"error: {option} {text!r} is not a time: use ISO 8601 (2026-11-24T00:00:00Z, 2026-11-24), "
            "now, or a duration before now (2h, 7d, -90m)",
            err=True,
        )
        raise typer.Exit(2) from exc


@app.command("list")
def list_command(
    ctx: typer.Context,
    rule: Annotated[
        str | None, typer.Option(help="Only incidents of this rule (healer's, or a finding's).")
    ] = None,
    pool: Annotated[str | None, typer.Option(help="Only incidents of nodes in this pool.")] = None,
    state: Annotated[
        IncidentState | None, typer.Option(help="open (not closed yet) or closed.", case_sensitive=False)
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(help="Only incidents open at some time since then: ISO time (UTC), or 2h / 7d ago."),
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="Only incidents opened by then: ISO time (UTC), now, or 2h / 7d ago.")
    ] = None,
    node: Annotated[str | None, typer.Option(help="Only incidents of this node.")] = None,
    search: Annotated[
        str | None,
        typer.Option("--search", "-q", help="Text in the rule, node name or summary (any case)."),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, help="Most incidents shown, newest first.")] = 50,
    output: OutputOption = Output.TABLE,
    as_json: JsonAlias = False,
) -> None:
    """List incidents, newest opened first.

    Each with its state, when it opened and closed, its node and pool, its rule and summary; every
    filter given narrows the list."""
    from healer import history, wiring

    now = wiring.utc_now()
    flt = history.IncidentFilter(
        rule=rule,
        pool=pool,
        state="open" if state is IncidentState.OPEN else "closed" if state is IncidentState.CLOSED else None,
        since=option_time("--since", since, now),
        until=option_time("--until", until, now),
        node=node,
        search=search,
    )
    with store_sessions(ctx)() as session:
        rows = history.find_incidents(session, flt, limit=limit)
    records = [incident_record(r) for r in rows]
    fmt = chosen(output, as_json=as_json)
    if emit(records, fmt):
        return
    if not records:
        filtered = any(v is not None for v in (rule, pool, state, since, until, node, search))
        typer.echo("no incidents match these filters" if filtered else "no incidents recorded")
        return
    typer.echo(columns(incidents_table(records), width=table_width(fmt)))
    if len(records) == limit:
        typer.echo(f"(the newest {limit}; --limit shows more)")


@app.command("show")
def show_command(
    ctx: typer.Context,
    incident_id: Annotated[
        int, typer.Argument(metavar="ID", help="Incident id (see `healer incident list`).")
    ],
    output: OutputOption = Output.TABLE,
    as_json: JsonAlias = False,
) -> None:
    """Show one incident: findings, actions, tickets, transitions.

    Its story in order, oldest first: the findings that made it, the actions healer (or an
    operator) took, its provider tickets, and the node's lifecycle transitions."""
    from healer import history

    with store_sessions(ctx)() as session:
        record = history.incident_record(session, incident_id)
        if record is None:
            typer.echo(f"error: unknown incident {incident_id} (`healer incident list` lists them)", err=True)
            raise typer.Exit(1)
        document: dict[str, Any] = {
            "incident": incident_record(record.incident),
            "findings": [finding_record(f) for f in record.findings],
            "actions": [action_record(a) for a in record.actions],
            "tickets": [ticket_record(t) for t in record.tickets],
            "transitions": [transition_record(t) for t in record.transitions],
        }
    fmt = chosen(output, as_json=as_json)
    if emit(document, fmt):
        return
    width = table_width(fmt)
    inc = document["incident"]
    lines = [f"incident {inc['id']}: node {inc['node']} (pool {inc['pool']})"]
    if inc["closed_at"]:
        closed = f"closed {inc['closed_at']}" + (f": {inc['close_reason']}" if inc["close_reason"] else "")
        lines.append(f"state:    {closed} (opened {inc['opened_at']})")
    else:
        lines.append(f"state:    open since {inc['opened_at']}")
    lines.append(f"rule:     {inc['rule'] or ', '.join(inc['rules']) or '-'}")
    if domain := inc["domain"]:
        state = "open" if domain["open"] else "closed"
        lines.append(
            f"domain:   part of domain incident {domain['id']} ({domain['kind']} {domain['name']}, "
            f"{state}): one ticket for the domain, on the dashboard at /domains/{domain['id']}"
        )
    lines.append(f"summary:  {_text(inc['summary'])}")
    if inc["first_summary"] and inc["first_summary"] != inc["summary"]:
        lines.append(f"opened as: {_text(inc['first_summary'])}")
    if inc["blocked_reason"] and not inc["closed_at"]:
        lines.append(f"blocked:  {inc['blocked_reason']}")
    if inc["escalated"]:
        lines.append("escalated: yes")
    for title, rows in (
        ("FINDINGS", findings_table(document["findings"])),
        ("ACTIONS", actions_table(document["actions"])),
        ("TICKETS", tickets_table(document["tickets"])),
        ("TRANSITIONS", transitions_table(document["transitions"])),
    ):
        lines += ["", section(title, rows, width=width)]
    typer.echo("\n".join(lines))


class OutcomeChoice(StrEnum):
    """``healer incident outcome``'s answer: the decision was right, wrong, or back to derived."""

    CONFIRMED = "confirmed"
    NOT_CONFIRMED = "not_confirmed"
    DERIVED = "derived"


@app.command("outcome")
def outcome_command(
    ctx: typer.Context,
    incident_id: Annotated[int, typer.Argument(help="Incident id (see `healer incident list`).")],
    outcome: Annotated[
        OutcomeChoice,
        typer.Argument(help="confirmed, not_confirmed, or derived (back to healer's).", case_sensitive=False),
    ],
    reason: Annotated[str, typer.Option("--reason", "-r", help="Why (recorded in the audit log).")] = "",
    actor: Annotated[str | None, typer.Option(help="Who sets it (default: cli:<user>).")] = None,
) -> None:
    """Set a closed incident's outcome by hand (it counts in its rule's precision); audited, and
    healer never overwrites it. Exit status 1 for an unknown or open incident."""
    from healer import wiring
    from healer.cli.context import operator_name
    from healer.engine.outcomes import Outcome
    from healer.store import outcomes
    from healer.store.session import transaction

    factory = store_sessions(ctx)
    try:
        with transaction(factory) as session:
            row = outcomes.set_outcome(
                session,
                incident_id=incident_id,
                outcome=None if outcome == OutcomeChoice.DERIVED else Outcome(outcome.value),
                actor=actor or operator_name(),
                now=wiring.utc_now(),
                reason=reason,
            )
            said = f"{row.outcome or 'no outcome'} ({row.outcome_basis}, by {row.outcome_by})"
            typer.echo(f"incident {row.id}: {said}")
    except outcomes.OutcomeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
