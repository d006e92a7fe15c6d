"""``healer node release|list``: the nodes healer remediates.

Operator actions go through :mod:`healer.operations` (shared with the dashboard) and are recorded
in the audit log as ``cli:<user>`` (``$USER``). Exit status 1 with a message on stderr when an
action does not apply (unknown node ...).
"""

from __future__ import annotations

from typing import Annotated

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
