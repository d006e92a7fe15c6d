"""``healer serve``: the dashboard and API alone, without the controller.

Useful to look at a database (a copy, a standby) or to run the dashboard in its own Deployment. The
rule set is loaded once at start from ``rules_paths`` (for the rules page and the charts' node
labels); a rule set that fails validation is shown as missing and the errors are logged.

Logs are JSON lines on stderr, as ``healer run`` writes them (``--text-logs`` for plain text).
``/readyz`` is this process's readiness (the database answers); the controller's ticks, which
another process records, are shown in its body without making the dashboard unready.
"""

from __future__ import annotations

import logging
import signal
from types import FrameType
from typing import Annotated

import typer

log = logging.getLogger("healer.serve")


def serve(
    ctx: typer.Context,
    host: Annotated[str | None, typer.Option(help="Listen address (default: api.host).")] = None,
    port: Annotated[
        int | None, typer.Option(help="Listen port (default: api.port; 0: a free one, printed).", min=0)
    ] = None,
    text_logs: Annotated[
        bool, typer.Option("--text-logs", help="Plain text logs instead of JSON lines.")
    ] = False,
) -> None:
    """Serve the dashboard, the JSON API and /metrics (no controller: nothing is acted on).

    SIGTERM/SIGINT stop serving and exit 0."""
    import socket

    import uvicorn

    from healer import wiring
    from healer.cli.context import settings_from
    from healer.errors import RuleError
    from healer.logs import configure_logging
    from healer.ruleset.loading import load_ruleset
    from healer.ruleset.schema import RuleSet
    from healer.store.session import make_sessionmaker

    settings = settings_from(ctx)
    configure_logging(settings.log_level, json=not text_logs)
    ruleset: RuleSet | None
    try:
        ruleset = load_ruleset(
            settings.rules_paths,
            recording_rules=settings.detection.recording_rules,
            device_filter=settings.infiniband.device_filter(),
        )
    except RuleError as exc:
        log.warning("rules not loaded; the rules page lists recent evaluations:\n%s", exc)
        ruleset = None
    engine = wiring.engine(settings)
    app = wiring.dashboard(settings, make_sessionmaker(engine), ruleset_provider=lambda: ruleset)

    def on_stop(_signum: int, _frame: FrameType | None) -> None:
        # uvicorn handles SIGTERM/SIGINT while it serves and re-raises them after its shutdown;
        # taking the re-raise here makes a clean stop exit 0, as `healer run` does.
        pass

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    host = host or settings.api.host
    port = settings.api.port if port is None else port
    # Bound here, so a port 0 is a free port known before serving and the line below names it.
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as exc:
        where = f"{host}:{port} (--host, --port; api.host, api.port)"
        typer.echo(f"error: cannot listen on {where}: {exc}", err=True)
        raise typer.Exit(2) from exc
    port = int(listener.getsockname()[1])
    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False, proxy_headers=True)
    )
    log.info("dashboard on http://%s:%d/ (no controller in this process)", host, port)
    try:
        server.run(sockets=[listener])  # returns on SIGTERM/SIGINT
    finally:
        engine.dispose()
