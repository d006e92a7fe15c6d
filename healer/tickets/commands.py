"""``healer ticket ...`` (list, close, retry, deliver, stats) and ``healer provider-receiver``."""

from __future__ import annotations

import getpass
import json
import logging
import os
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Annotated

import httpx
import typer
from sqlalchemy.orm import Session, sessionmaker

from healer.config import Settings
from healer.errors import TicketError
from healer.operations import OperationError
from healer.redaction import redact_text
from healer.store.session import make_engine, make_sessionmaker, transaction
from healer.tickets import service, signing
from healer.tickets.delivery import deliver_due
from healer.tickets.receiver import Receiver

app = typer.Typer(no_args_is_help=True, help="Provider tickets.")


def _factory(ctx: typer.Context) -> tuple[Settings, sessionmaker[Session]]:
    from healer.cli import settings_from

    settings = settings_from(ctx)
    engine = make_engine(settings.database.url)
    return settings, make_sessionmaker(engine)


def _default_actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli"


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else "-"


@app.command("list")
def list_command(
    ctx: typer.Context,
    status: Annotated[list[str] | None, typer.Option("--status", "-s", help="Only these statuses.")] = None,
    node: Annotated[str | None, typer.Option(help="Only this node.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="Most tickets shown, newest first.")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """List tickets: provider, status, delivery attempts and errors."""
    _, factory = _factory(ctx)
    with factory() as session:
        rows = service.list_tickets(session, status=status, node=node, limit=limit)
    if as_json:
        for row in rows:
            typer.echo(json.dumps(asdict(row), default=str))
        return
    if not rows:
        typer.echo("no tickets")
        return
    typer.echo(
        f"{'ID':>5}  {'NODE':<28} {'PROVIDER':<16} {'STATUS':<13} {'TRIES':>5}  {'CREATED':<19}  EXTERNAL"
    )
    for r in rows:
        flag = " (escalated)" if r.escalated else ""
        typer.echo(
            f"{r.id:>5}  {r.node:<28} {r.provider:<16} {r.status:<13} {r.attempts:>5}  "
            f"{_when(r.created_at):<19}  {r.external_id or '-'}{flag}"
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
    _, factory = _factory(ctx)
    try:
        with transaction(factory) as session:
            ticket = service.close_ticket(
                session,
                ticket_id=ticket_id,
                actor=actor or _default_actor(),
                now=datetime.now(UTC),
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
    _, factory = _factory(ctx)
    try:
        with transaction(factory) as session:
            service.retry_ticket(
                session, ticket_id=ticket_id, actor=actor or _default_actor(), now=datetime.now(UTC)
            )
    except OperationError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(f"ticket {ticket_id} queued for delivery")


@app.command("deliver")
def deliver_command(ctx: typer.Context) -> None:
    """Send the due outbox messages once, now (the controller does this every few seconds)."""
    settings, factory = _factory(ctx)
    with httpx.Client() as client:
        report = deliver_due(session_factory=factory, settings=settings, now=datetime.now(UTC), client=client)
    for o in report.outcomes:
        line = f"ticket {o.ticket_id} -> {o.provider}: {o.result}"
        if o.status_code:
            line += f" (HTTP {o.status_code})"
        if o.error and o.result != "delivered":
            line += f": {redact_text(o.error)}"
        typer.echo(line)
    typer.echo(f"{report.delivered} delivered, {report.retrying} to retry, {report.failed} failed")


@app.command("stats")
def stats_command(ctx: typer.Context) -> None:
    """Per provider: open tickets, median time to acknowledge and to repair."""
    _, factory = _factory(ctx)
    with factory() as session:
        stats = service.provider_stats(session)

    def fmt(seconds: float | None) -> str:
        return "-" if seconds is None else f"{seconds / 3600:.1f}h"

    typer.echo(f"{'PROVIDER':<20} {'OPEN':>5} {'TOTAL':>6} {'FAILED':>6} {'ACK':>8} {'REPAIR':>8}")
    for s in stats:
        typer.echo(
            f"{s.provider:<20} {s.open:>5} {s.total:>6} {s.failed:>6} "
            f"{fmt(s.median_ack_seconds):>8} {fmt(s.median_repair_seconds):>8}"
        )


def _env_secret(name: str | None, what: str) -> bytes | None:
    try:
        return signing.load_secret(env=name, file=None, what=what)
    except TicketError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


def provider_receiver(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port).")] = 9300,
    secret_env: Annotated[
        str | None, typer.Option(help="Env var with the secret healer signs webhooks with (verified).")
    ] = None,
    callback_url: Annotated[
        str | None, typer.Option(help="healer's base URL for status callbacks, e.g. http://127.0.0.1:8080.")
    ] = None,
    callback_secret_env: Annotated[
        str | None, typer.Option(help="Env var with the secret to sign callbacks with.")
    ] = None,
    fail_first: Annotated[
        int, typer.Option(min=0, help="Answer the first N webhooks with --fail-status.")
    ] = 0,
    fail_status: Annotated[int, typer.Option(help="Status of the simulated failures.")] = 500,
    retry_after: Annotated[str | None, typer.Option(help="Retry-After header on simulated failures.")] = None,
    reject_status: Annotated[int | None, typer.Option(help="Refuse every webhook with this status.")] = None,
    ack_after: Annotated[
        float | None, typer.Option(help="Seconds after a new ticket to call back acknowledged.")
    ] = None,
    resolve_after: Annotated[
        float | None, typer.Option(help="Seconds after a new ticket to call back resolved.")
    ] = None,
    max_skew_seconds: Annotated[float, typer.Option(help="Refuse webhooks signed further from now.")] = 300.0,
) -> None:
    """Run a stand-in provider: receives signed webhooks, can fail first, calls back signed statuses."""
    logging.basicConfig(level=os.environ.get("HEALER_LOG_LEVEL", "INFO"), format="%(asctime)s %(message)s")
    receiver = Receiver(
        host=host,
        port=port,
        secret=_env_secret(secret_env, "--secret-env"),
        fail_first=fail_first,
        fail_status=fail_status,
        retry_after=retry_after,
        reject_status=reject_status,
        callback_url=callback_url,
        callback_secret=_env_secret(callback_secret_env, "--callback-secret-env"),
        ack_after=ack_after,
        resolve_after=resolve_after,
        max_skew_seconds=max_skew_seconds,
    )
    receiver.start()
    typer.echo(f"provider receiver listening on {receiver.url} (GET /requests lists what it received)")
    try:
        receiver.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        receiver.stop()
