"""The root ``healer`` command: global options, and every command group registered in help order.

Settings are built once per invocation from ``--config`` and the environment and handed to the
commands through ``typer.Context.obj`` (see :func:`healer.cli.context.settings_from`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from healer import __version__
from healer.cli import (
    agent,
    backtest,
    breaker,
    db,
    demo,
    doctor,
    evaluate,
    node,
    pause,
    provider_receiver,
    rules,
    run,
    serve,
    simulate,
    ticket,
)

EPILOG = (
    "Listing commands take -o table|json|yaml; times are ISO 8601 UTC (2026-12-01T14:05:00Z).\n\n"
    "\b\nExit status:\n"
    "  0  done\n"
    "  1  the command failed or does not apply: no database schema (run `healer db upgrade`),\n"
    "     unknown node or ticket, invalid rule files (`rules validate|test|export`, `run`),\n"
    "     Prometheus unavailable (evaluate)\n"
    "  2  bad usage, invalid settings, rules that do not load for a command that needs them\n"
    "     (evaluate, backtest); evaluate: also no database schema, or a rule degraded\n"
    "     (some of its series name no node)\n"
    "  3  evaluate: a rule is broken (Prometheus refused its PromQL); doctor exporters: a rule\n"
    "     reads a metric no target exports\n"
    "`healer run` and `healer serve` exit 0 on SIGTERM or SIGINT after a clean shutdown."
)

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="GPU node health remediation for Kubernetes.",
    epilog=EPILOG,
    rich_markup_mode=None,  # plain click help: no `<bool>` type column on flags
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"healer {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    ctx: typer.Context,
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", envvar="HEALER_CONFIG", help="YAML settings file.", dir_okay=False),
    ] = None,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """healer: watch GPU nodes through Prometheus, take bad ones out, ask the provider to fix them."""
    ctx.obj = {"config": config}


app.add_typer(db.app, name="db")
app.add_typer(rules.app, name="rules")
app.add_typer(doctor.app, name="doctor")
app.command("simulate")(simulate.simulate)
app.add_typer(ticket.app, name="ticket")
app.command("provider-receiver")(provider_receiver.provider_receiver)
app.command("evaluate")(evaluate.evaluate)
app.command("backtest")(backtest.backtest)
app.command("run")(run.run)
app.command("demo")(demo.demo)
app.command("serve")(serve.serve)
app.command("agent")(agent.agent)
app.add_typer(node.app, name="node")
app.add_typer(breaker.app, name="breaker")
app.command("pause")(pause.pause)
app.command("resume")(pause.resume)
