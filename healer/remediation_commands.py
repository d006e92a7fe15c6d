"""``healer node release|list``, ``healer pause|resume``, ``healer breaker status|reset``.

Operator actions go through :mod:`healer.operations` (shared with the dashboard) and are recorded
in the audit log as ``cli:<user>`` (``$USER``). Exit status 1 with a message on stderr when an
action does not apply (unknown node, breaker not tripped ...).
"""

from __future__ import annotations

import getpass
import json
import os
from datetime import UTC, datetime
from typing import Annotated

import typer
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from healer import operations
from healer.engine.states import NodeState
from healer.operations import OperationError
from healer.store import nodes as repo
from healer.store.models import Incident, Node
from healer.store.session import make_engine, make_sessionmaker, transaction

node_app = typer.Typer(no_args_is_help=True, help="Nodes healer remediates.")
breaker_app = typer.Typer(no_args_is_help=True, help="The circuit breaker.")


def _sessions(ctx: typer.Context) -> sessionmaker[Session]:
    from healer.cli import settings_from

    settings = settings_from(ctx)
    return make_sessionmaker(make_engine(settings.database.url))


def _actor() -> str:
    user = os.environ.get("USER")
    if not user:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = ""
    return f"cli:{user}" if user else "cli"


def _now() -> datetime:
    return datetime.now(UTC)


def _fail(exc: OperationError) -> typer.Exit:
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(1)


@node_app.command("release")
def release(
    ctx: typer.Context,
    node: Annotated[str, typer.Argument(help="Node name.")],
    reason: Annotated[str, typer.Option("--reason", help="Why (recorded in the audit log).")] = "",
) -> None:
    """Tell healer NODE is repaired: it validates, then returns to service after the recovery hold."""
    try:
        with transaction(_sessions(ctx)) as session:
            operations.release_node(session, node_name=node, actor=_actor(), now=_now(), reason=reason)
    except OperationError as exc:
        raise _fail(exc) from exc
    typer.echo(f"{node}: validating; back in service once its rules stay clear for the recovery hold")


@node_app.command("list")
def list_nodes(
    ctx: typer.Context,
    all_nodes: Annotated[bool, typer.Option("--all", help="Healthy nodes too.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines instead of a table.")] = False,
) -> None:
    """Nodes healer is remediating (state, since, pool, incident, rule, blocked reason)."""
    with _sessions(ctx)() as session:
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
                "since": n.state_since.isoformat(timespec="seconds"),
                "pool": n.pool,
                "incident": i.id if i else None,
                "rule": i.rule if i else None,
                "blocked": i.blocked_reason if i else None,
            }
            for n, i in session.execute(query).all()
        ]
    if as_json:
        for row in rows:
            typer.echo(json.dumps(row))
        return
    if not rows:
        typer.echo("no nodes" if all_nodes else "every node is healthy")
        return
    typer.echo(f"{'NODE':<24} {'STATE':<16} {'SINCE':<26} {'POOL':<20} {'INCIDENT':<9} RULE")
    for r in rows:
        line = (
            f"{r['node']:<24} {r['state']:<16} {r['since']:<26} {r['pool']:<20} {r['incident'] or '-'!s:<9} "
        )
        line += str(r["rule"] or "-")
        if r["blocked"]:
            line += f"  ({r['blocked']})"
        typer.echo(line)


def pause(
    ctx: typer.Context,
    reason: Annotated[str, typer.Option("--reason", help="Why (shown on the dashboard).")] = "",
) -> None:
    """Pause healer: no new quarantine, drain or ticket; detection and recording go on."""
    with transaction(_sessions(ctx)) as session:
        operations.set_paused(session, paused=True, actor=_actor(), now=_now(), reason=reason)
    typer.echo("healer paused" + (f": {reason}" if reason else ""))


def resume(ctx: typer.Context) -> None:
    """Resume healer after a pause."""
    with transaction(_sessions(ctx)) as session:
        operations.set_paused(session, paused=False, actor=_actor(), now=_now())
    typer.echo("healer resumed")


@breaker_app.command("status")
def breaker_status(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="The switch as JSON.")] = False,
) -> None:
    """Whether the circuit breaker is tripped, why, and the nodes it holds back."""
    with _sessions(ctx)() as session:
        value = repo.get_switch(session, repo.SWITCH_BREAKER)
    if as_json:
        typer.echo(json.dumps(value, sort_keys=True))
        return
    if not value.get("tripped"):
        typer.echo("circuit breaker: closed (not tripped)")
        if value.get("reset_at"):
            typer.echo(f"last reset {value['reset_at']} by {value.get('reset_by', '?')}")
        return
    held = list(value.get("held", []))
    typer.echo(f"circuit breaker: TRIPPED at {value.get('tripped_at', '?')}")
    typer.echo(f"reason: {value.get('reason', '')}")
    typer.echo(f"holding back {len(held)} node(s): {', '.join(held) or '-'}")
    typer.echo("reset with `healer breaker reset` once the cause is understood")


@breaker_app.command("reset")
def breaker_reset(ctx: typer.Context) -> None:
    """Reset a tripped breaker; the nodes it held are re-evaluated against fresh data next tick."""
    try:
        with transaction(_sessions(ctx)) as session:
            held = operations.reset_breaker(session, actor=_actor(), now=_now())
    except OperationError as exc:
        raise _fail(exc) from exc
    typer.echo(f"circuit breaker reset; {len(held)} held node(s) will be re-evaluated on the next tick")


def register(app: typer.Typer) -> None:
    """Add ``node``, ``pause``, ``resume`` and ``breaker`` to the ``healer`` command."""
    app.add_typer(node_app, name="node")
    app.add_typer(breaker_app, name="breaker")
    app.command("pause")(pause)
    app.command("resume")(resume)
