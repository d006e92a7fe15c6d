"""``healer ticket ...``: list, close, retry, deliver, stats."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import TYPE_CHECKING, Annotated

import typer

from healer.cli.context import operator_name, settings_from, store_sessions
from healer.cli.output import JsonAlias, Output, OutputOption, chosen, emit, iso
from healer.cli.tables import columns

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

    from healer.config import Settings

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Provider tickets.")


def _factory(ctx: typer.Context) -> tuple[Settings, sessionmaker[Session]]:
    settings = settings_from(ctx)
    return settings, store_sessions(ctx, settings)


def _when(value: datetime | None) -> str:
    return iso(value) or "-"


@app.command("list")
def list_command(
    ctx: typer.Context,
    status: Annotated[list[str] | None, typer.Option("--status", "-s", help="Only these statuses.")] = None,
    node: Annotated[str | None, typer.Option(help="Only this node.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="Most tickets shown, newest first.")] = 50,
    output: OutputOption = Output.TABLE,
    as_json: JsonAlias = False,
) -> None:
    """List tickets: provider, status, delivery attempts and errors."""
    from healer.tickets import service

    _, factory = _factory(ctx)
    with factory() as session:
        rows = service.list_tickets(session, status=status, node=node, limit=limit)
    records = [{k: iso(v) if isinstance(v, datetime) else v for k, v in asdict(row).items()} for row in rows]
    if emit(records, chosen(output, as_json=as_json)):
        return
    if not rows:
        typer.echo("no tickets")
        return
    typer.echo(
        f"{'ID':>5}  {'NODE':<28} {'PROVIDER':<16} {'STATUS':<13} {'TRIES':>5}  {'CREATED':<20}  EXTERNAL"
    )
    for r in rows:
        flag = " (escalated)" if r.escalated else ""
        typer.echo(
            f"{r.id:>5}  {r.node:<28} {r.provider:<16} {r.status:<13} {r.attempts:>5}  "
            f"{_when(r.created_at):<20}  {r.external_id or '-'}{flag}"
        )
        if r.last_error and r.status in ("pending", "failed"):
            typer.echo(f"       last error: {r.last_error}")  # redacted by list_tickets
        if r.reason:
            typer.echo(f"       reason: {r.reason}")


@app.command("close")
def close_command(
    ctx: typer.Context,
    ticket_id: Annotated[int, typer.Argument(help="Ticket id (see `healer ticket list`).")],
    reason: Annotated[str, typer.Option("--reason", "-r", help="Why it is closed (recorded).")],
    actor: Annotated[str | None, typer.Option(help="Who closes it (default: cli:<user>).")] = None,
) -> None:
    """Close a ticket by hand; a delivery still pending is cancelled."""
    from healer import wiring
    from healer.operations import OperationError
    from healer.store.session import transaction
    from healer.tickets import service

    _, factory = _factory(ctx)
    try:
        with transaction(factory) as session:
            ticket = service.close_ticket(
                session,
                ticket_id=ticket_id,
                actor=actor or operator_name(),
                now=wiring.utc_now(),
                reason=reason,
            )
            typer.echo(f"ticket {ticket.id} closed")
    except OperationError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc


@app.command("retry")
def retry_command(
    ctx: typer.Context,
    ticket_id: Annotated[int, typer.Argument(help="A failed ticket's id.")],
    actor: Annotated[str | None, typer.Option(help="Who asks (default: cli:<user>).")] = None,
) -> None:
    """Queue a failed ticket for delivery again (same idempotency key)."""
    from healer import wiring
    from healer.operations import OperationError
    from healer.store.session import transaction
    from healer.tickets import service

    _, factory = _factory(ctx)
    try:
        with transaction(factory) as session:
            service.retry_ticket(
                session, ticket_id=ticket_id, actor=actor or operator_name(), now=wiring.utc_now()
            )
    except OperationError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(f"ticket {ticket_id} queued for delivery")


@app.command("deliver")
def deliver_command(ctx: typer.Context) -> None:
    """Send the due outbox messages once, now (the controller does this every few seconds)."""
    import httpx

    from healer import wiring
    from healer.redaction import redact_text
    from healer.tickets.delivery import deliver_due

    settings, factory = _factory(ctx)
    with httpx.Client() as client:
        report = deliver_due(session_factory=factory, settings=settings, now=wiring.utc_now(), client=client)
    for o in report.outcomes:
        line = f"ticket {o.ticket_id} -> {o.provider}: {o.result}"
        if o.status_code:
            line += f" (HTTP {o.status_code})"
        if o.error and o.result != "delivered":
            line += f": {redact_text(o.error)}"
        typer.echo(line)
    typer.echo(f"{report.delivered} delivered, {report.retrying} to retry, {report.failed} failed")


@app.command("stats")
def stats_command(ctx: typer.Context, output: OutputOption = Output.TABLE) -> None:
    """Per provider: open tickets, median time to acknowledge and to repair."""
    from healer.tickets import service

    _, factory = _factory(ctx)
    with factory() as session:
        stats = service.provider_stats(session)
    if emit([asdict(s) for s in stats], output):
        return

    def fmt(seconds: float | None) -> str:
        return "-" if seconds is None else f"{seconds / 3600:.1f}h"

    if not stats:
        typer.echo("no tickets")
        return
    rows = [["PROVIDER", "OPEN", "TOTAL", "FAILED", "MEDIAN ACK", "MEDIAN REPAIR"]]
    for s in stats:
        rows.append(
            [
                s.provider,
                str(s.open),
                str(s.total),
                str(s.failed),
                fmt(s.median_ack_seconds),
                fmt(s.median_repair_seconds),
            ]
        )
    typer.echo(columns(rows))
