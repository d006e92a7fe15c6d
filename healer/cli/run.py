"""``healer run``: the controller with its dashboard, in one process."""

from __future__ import annotations

import logging
import signal
from types import FrameType
from typing import Annotated

import typer

log = logging.getLogger("healer.run")


def run(
    ctx: typer.Context,
    upgrade: Annotated[
        bool, typer.Option("--upgrade-db", help="Migrate the database schema before starting.")
    ] = False,
    text_logs: Annotated[
        bool, typer.Option("--text-logs", help="Plain text logs instead of JSON lines.")
    ] = False,
) -> None:
    """Run the controller: leader election, evaluation ticks, drains, ticket delivery, and the dashboard.

    SIGTERM/SIGINT finish the current step, release the Lease and exit; SIGHUP reloads the rules.
    """
    import uvicorn

    from healer.cli.context import settings_from
    from healer.errors import HealerError
    from healer.logs import configure_logging
    from healer.wiring import build_process

    settings = settings_from(ctx)
    configure_logging(settings.log_level, json=not text_logs)
    try:
        process = build_process(settings, upgrade=upgrade)
    except HealerError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc

    def on_sighup(_signum: int, _frame: FrameType | None) -> None:
        process.controller.rules.request_reload()  # the rules job (every 2 s) does it

    def on_stop(signum: int, _frame: FrameType | None) -> None:
        # uvicorn handles SIGTERM/SIGINT while it serves, then re-raises them after its shutdown;
        # this handler takes that re-raise so the controller's own shutdown below still runs.
        log.info("received %s; shutting down", signal.Signals(signum).name)

    signal.signal(signal.SIGHUP, on_sighup)
    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    process.controller.start()
    server = uvicorn.Server(
        uvicorn.Config(
            process.app, host=settings.api.host, port=settings.api.port, log_config=None, access_log=False
        )
    )
    log.info("dashboard on http://%s:%d/", settings.api.host, settings.api.port)
    try:
        server.run()  # returns on SIGTERM/SIGINT (uvicorn installs those handlers)
    finally:
        process.controller.stop()
