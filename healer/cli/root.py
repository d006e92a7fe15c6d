"""The root ``healer`` command: global options, and every command group registered in help order.

Settings are built once per invocation from ``--config`` and the environment and handed to the
commands through ``typer.Context.obj`` (see :func:`healer.cli.context.settings_from`).
:func:`main` is the installed ``healer`` command: the app, and exit 0 when the reader of its output
went away (``healer rules show | head -1``), as kubectl and promtool do.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import IO, Annotated, Any

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
    incident,
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
    "Listing commands take -o table|wide|json|yaml (a table is cut to the terminal's width;\n"
    "wide keeps whole lines); times are ISO 8601 UTC (2026-12-01T14:05:00Z).\n\n"
    "\b\nExit status:\n"
    "  0  done\n"
    "  1  the command failed or does not apply: no database schema (run `healer db upgrade`),\n"
    "     unknown node, incident or ticket, invalid rule files (`rules validate|test|export`,\n"
    "     `run`), Prometheus unavailable (evaluate)\n"
    "  2  bad usage, invalid settings, rules that do not load for a command that needs them\n"
    "     (evaluate, backtest); evaluate: also no database schema, or a rule degraded\n"
    "     (some of its series name no node)\n"
    "  3  evaluate: a rule is broken (Prometheus refused its PromQL); doctor exporters: a rule\n"
    "     reads a metric no target exports, or a node has a blind spot\n"
    "`healer run` and `healer serve` exit 0 on SIGTERM or SIGINT after a clean shutdown, and every\n"
    "command exits 0 when the reader of its output goes away (`healer rules show | head -1`)."
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
def root(
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
app.add_typer(incident.app, name="incident")
app.add_typer(breaker.app, name="breaker")
app.command("pause")(pause.pause)
app.command("resume")(pause.resume)


class _WatchedStdout:
    """``sys.stdout`` that notes when its reader has gone away (a write or flush raised
    BrokenPipeError) before passing the error on."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self.reader_gone = False

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self.reader_gone = True
            raise

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self.reader_gone = True
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def main() -> None:
    """The ``healer`` command. A closed pipe on stdout ends it with status 0 and no traceback: the
    reader (``head``, ``grep -q``) has what it wanted."""
    watched = _WatchedStdout(sys.stdout)
    sys.stdout = watched
    try:
        app()
    except SystemExit as done:
        with contextlib.suppress(BrokenPipeError):
            sys.stdout.flush()  # what a print() left buffered
        if not watched.reader_gone:
            raise
        # Nothing more can reach the reader; let the interpreter's last flush write nowhere.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, watched.fileno())
        raise SystemExit(0) from done
