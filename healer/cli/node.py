"""``healer node release|list|show``: the nodes healer remediates.

Operator actions go through :mod:`healer.operations` (shared with the dashboard) and are recorded
in the audit log as ``cli:<user>`` (``$USER``). Exit status 1 with a message on stderr when an
action does not apply (unknown node ...). ``healer node show`` reads the node's history through
:mod:`healer.history` (the incident helpers of :mod:`healer.cli.incident` print it).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from healer.cli.context import operator_name, store_sessions
from healer.cli.output import JsonAlias, Output, OutputOption, chosen, emit, iso, table_width
from healer.cli.tables import columns

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Nodes healer remediates.")


@app.command("release")
def release(
    ctx: typer.Context,
    node: Annotated[str, typer.Argument(help="Node name.")],
    reason: Annotated[str, typer.Option("--reason", help="Why (recorded in the audit log).")] = "",
) -> None:
    """Tell healer NODE is repaired: it validates, then returns to service after the recovery hold."""
    from healer import operations, wiring
    from healer.store.session import transaction

    try:
        with transaction(store_sessions(ctx)) as session:
            operations.release_node(
                session, node_name=node, actor=operator_name(), now=wiring.utc_now(), reason=reason
            )
    except operations.OperationError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(
        f"{node}: release requested; the controller moves it to validating at its next tick, and it "
        "is back in service once its rules stay clear for the recovery hold (counted from when its "
        "last finding resolves, after the rule's keep_firing_for)"
    )


@app.command("list")
def list_nodes(
    ctx: typer.Context,
    all_nodes: Annotated[bool, typer.Option("--all", help="Healthy nodes too.")] = False,
    output: OutputOption = Output.TABLE,
    as_json: JsonAlias = False,
) -> None:
    """Nodes healer is remediating (state, since, pool, incident, rule, blocked reason)."""
    from sqlalchemy import func, select

    from healer.model.states import NodeState
    from healer.store.models import Incident, Node
    from healer.store.nodes import SWITCH_PAUSED, get_switch

    with store_sessions(ctx)() as session:
        query = (
            select(Node, Incident)
            .outerjoin(Incident, (Incident.node_id == Node.id) & Incident.closed_at.is_(None))
            .order_by(Node.name)
        )
        if not all_nodes:
            query = query.where(Node.state != NodeState.HEALTHY)
        rows = [
            {
                "node": n.name,
                "state": n.state,
                "since": iso(n.state_since),
                "pool": n.pool,
                "incident": i.id if i else None,
                "rule": i.rule if i else None,
                "blocked": i.blocked_reason if i else None,
            }
            for n, i in session.execute(query).all()
        ]
        known = session.scalar(select(func.count()).select_from(Node)) or 0
        pause = get_switch(session, SWITCH_PAUSED)
    if emit(rows, chosen(output, as_json=as_json)):
        return
    if pause.get("paused"):
        reason = f": {pause['reason']}" if pause.get("reason") else ""
        typer.echo(f"healer is PAUSED{reason} (no new quarantine, drain or ticket; `healer resume` ends it)")
    if not rows:
        if not known:
            typer.echo("no nodes recorded yet (has `healer run` run against this database?)")
        else:
            typer.echo(f"all {known} recorded node(s) are healthy")
        return
    table = [["NODE", "STATE", "SINCE", "POOL", "INCIDENT", "RULE"]]
    for r in rows:
        rule = str(r["rule"] or "-") + (f"  ({r['blocked']})" if r["blocked"] else "")
        cells = [r["node"], r["state"], r["since"] or "-", r["pool"], r["incident"] or "-"]
        table.append([*(str(c) for c in cells), rule])
    typer.echo(columns(table, width=table_width(chosen(output, as_json=as_json))))


@app.command("show")
def show_node(
    ctx: typer.Context,
    node: Annotated[str, typer.Argument(help="Node name (see `healer node list --all`).")],
    limit: Annotated[int, typer.Option(min=1, help="Most incidents, tickets and transitions shown.")] = 10,
    output: OutputOption = Output.TABLE,
    as_json: JsonAlias = False,
) -> None:
    """Show one node: state, open incident, GPUs, tickets, history.

    Its state, open incident and active findings, its GPUs, and (newest first, at most --limit of
    each) its tickets, recent incidents and last lifecycle transitions."""
    from healer import history
    from healer.cli.incident import (
        finding_record,
        findings_table,
        incident_record,
        incidents_table,
        section,
        ticket_record,
        tickets_table,
        transition_record,
        transitions_table,
    )

    with store_sessions(ctx)() as session:
        record = history.node_record(session, node, rows=limit)
        if record is None:
            typer.echo(
                f"error: unknown node {node!r} (`healer node list --all` lists the nodes healer knows)",
                err=True,
            )
            raise typer.Exit(1)
        n = record.node
        document: dict[str, Any] = {
            "node": {
                "name": n.name,
                "state": n.state,
                "since": iso(n.state_since),
                "pool": n.pool,
                "opted_out": n.opted_out,
            },
            "open_incident": incident_record(record.open_incident) if record.open_incident else None,
            "findings": [finding_record(f) for f in record.findings],
            "gpus": [
                {
                    "index": g.index,
                    "uuid": g.uuid,
                    "model": g.model_name,
                    "pci_bus_id": g.pci_bus_id,
                    "first_seen": iso(g.first_seen),
                    "last_seen": iso(g.last_seen),
                }
                for g in record.gpus
            ],
            "tickets": [ticket_record(t) for t in record.tickets],
            "incidents": [incident_record(i) for i in record.incidents],
            "transitions": [transition_record(t) for t in record.transitions],
        }
    fmt = chosen(output, as_json=as_json)
    if emit(document, fmt):
        return
    width = table_width(fmt)
    info = document["node"]
    opted = "  (opted out: healer leaves it alone)" if info["opted_out"] else ""
    lines = [f"node {info['name']}: {info['state']} since {info['since']} (pool {info['pool']}){opted}"]
    inc = document["open_incident"]
    if inc:
        rule = inc["rule"] or ", ".join(inc["rules"]) or "-"
        lines.append(
            f"open incident: {inc['id']} ({rule}), opened {inc['opened_at']}: {inc['summary'] or '-'}"
        )
        if inc["blocked_reason"]:
            lines.append(f"blocked: {inc['blocked_reason']}")
    else:
        lines.append("open incident: none")
    if document["tickets"]:
        t = document["tickets"][0]
        external = f" ({t['external_id']})" if t["external_id"] else ""
        lines.append(f"ticket: {t['id']} {t['provider']} {t['status']}{external}, created {t['created_at']}")
    gpu_rows = [["INDEX", "UUID", "MODEL", "PCI BUS", "LAST SEEN"]]
    for g in document["gpus"]:
        gpu_rows.append(
            [str(g["index"]), g["uuid"], g["model"] or "-", g["pci_bus_id"] or "-", g["last_seen"] or "-"]
        )
    for title, rows in (
        ("ACTIVE FINDINGS", findings_table(document["findings"])),
        ("GPUS", gpu_rows),
        ("TICKETS", tickets_table(document["tickets"])),
        ("RECENT INCIDENTS", incidents_table(document["incidents"], with_node=False)),
        ("LAST TRANSITIONS", transitions_table(document["transitions"])),
    ):
        lines += ["", section(title, rows, width=width)]
    typer.echo("\n".join(lines))
