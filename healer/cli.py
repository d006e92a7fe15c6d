"""The ``healer`` command.

Each feature owns its sub-commands in a ``commands`` module and registers them here; settings are
built once per invocation from ``--config`` and the environment and handed to the command through
``typer.Context.obj`` (see :func:`settings_from`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from healer import __version__
from healer.config import Settings, load_settings
from healer.errors import ConfigError

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="GPU node health remediation for Kubernetes."
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


def settings_from(ctx: typer.Context, **overrides: object) -> Settings:
    """Build the settings for this invocation; exits with status 2 and the problems on bad settings."""
    root = ctx.find_root()
    config = (root.obj or {}).get("config")
    try:
        return load_settings(config, **overrides)
    except ConfigError as exc:
        typer.echo(f"error: invalid settings\n{exc}", err=True)
        raise typer.Exit(2) from exc


def _register() -> None:
    from healer.store import commands as db_commands

    app.add_typer(db_commands.app, name="db")
    from healer.ruleset import commands as rule_commands

    app.add_typer(rule_commands.app, name="rules")
    from healer_dev.simulator import commands as simulator_commands

    simulator_commands.register(app)

    from healer.tickets import commands as ticket_commands

    app.add_typer(ticket_commands.app, name="ticket")
    app.command("provider-receiver")(ticket_commands.provider_receiver)
    from healer.sources import commands as source_commands

    source_commands.register(app)
    from healer.run_command import run

    app.command("run")(run)
    from healer_dev.demo import demo_command

    app.command("demo")(demo_command)
    from api.commands import serve

    app.command("serve")(serve)
    from healer import remediation_commands

    remediation_commands.register(app)


_register()
