"""``healer breaker status|reset``: the circuit breaker.

A reset is recorded in the audit log as ``cli:<user>`` (``$USER``); exit status 1 with a message on
stderr when the breaker is not tripped.
"""

from __future__ import annotations

import typer

from healer.cli.context import operator_name, store_sessions
from healer.cli.output import JsonAlias, Output, OutputOption, chosen, emit, iso

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="The circuit breaker.")


@app.command("status")
def breaker_status(
    ctx: typer.Context,
    output: OutputOption = Output.TABLE,
    as_json: JsonAlias = False,
) -> None:
    """Whether the circuit breaker is tripped, why, and the nodes it holds back."""
    from healer.store import nodes as repo

    with store_sessions(ctx)() as session:
        value = repo.get_switch(session, repo.SWITCH_BREAKER)
    for key in ("tripped_at", "reset_at"):
        if value.get(key):
            value[key] = iso(value[key])
    if emit(dict(sorted(value.items())), chosen(output, as_json=as_json)):
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


@app.command("reset")
def breaker_reset(ctx: typer.Context) -> None:
    """Reset a tripped breaker; the nodes it held are re-evaluated against fresh data next tick."""
    from healer import operations, wiring
    from healer.store.session import transaction

    try:
        with transaction(store_sessions(ctx)) as session:
            held = operations.reset_breaker(session, actor=operator_name(), now=wiring.utc_now())
    except operations.OperationError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(f"circuit breaker reset; {len(held)} held node(s) will be re-evaluated on the next tick")
