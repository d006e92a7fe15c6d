"""The FastAPI application factory.

``create_app`` builds the app around what its host gives it: the settings, a session factory, the
clock, the chart source, the metrics registry, and optionally the live rule set and leadership. The
composition root (:func:`healer.wiring.dashboard`) builds those; ``healer run`` serves the app inside
the controller (passing the live providers), ``healer serve`` runs it on its own.

Routes: the dashboard pages (``/``, ``/nodes/{name}``, ``/tickets``, ``/rules``, ``/audit``,
``/login``) and their operator forms, a rule's backtest report (``/rules/{name}/backtest``), the
JSON API under ``/api/v1`` (OpenAPI at ``/docs``), the inbound provider callbacks (when the
tickets feature provides them), Alertmanager's webhook (``/api/v1/alertmanager/webhook``: an early
tick of the controller in this process), and ``/healthz``, ``/readyz``, ``/metrics``.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from sqlalchemy.orm import Session, sessionmaker

from api.auth import SESSION_MAX_AGE_SECONDS, Auth, CsrfCookieMiddleware
from api.charts import ChartGate
from api.errors import install_error_handlers
from api.headers import SecurityHeadersMiddleware
from api.limits import BodyLimitMiddleware, ConcurrencyLimitMiddleware
from api.rendering import STATIC_DIR
from api.routes import alertmanager, api_v1, backtest, docs, ops, pages, ticket_callbacks
from api.sessions import RevokedSessions
from healer import __version__
from healer.config import Settings
from healer.metrics import HealerMetrics
from healer.ruleset.schema import RuleSet
from healer.sources.prometheus_range import PrometheusRange

#: Node-page charts built at once, and how long a page waits for a turn (seconds) before it is
#: shown without its chart: a burst of node pages must not hold every request thread.
CHART_CONCURRENCY = 4
CHART_WAIT_SECONDS = 1.0


def create_app(
    settings: Settings,
    session_factory: sessionmaker[Session],
    *,
    clock: Callable[[], datetime],
    prometheus: PrometheusRange,
    history: PrometheusRange,
    metrics: HealerMetrics,
    ruleset_provider: Callable[[], RuleSet | None] | None = None,
    leader_provider: Callable[[], bool] | None = None,
    controller_in_process: bool = False,
    wake: Callable[[], bool] | None = None,
) -> FastAPI:
    """Build the dashboard and API app.

    Args:
        settings: healer's settings (``api`` for access control, ``safety`` for budgets shown,
            ``prometheus`` for charts, ``scheduler`` for readiness).
        session_factory: database sessions; each request opens its own.
        clock: returns aware UTC now.
        prometheus: the range-query adapter for charts (short timeout: a page waits for it).
        history: the range-query adapter for the backtest page (Prometheus's own timeout).
        metrics: the process's metrics; the scrape-time database collector is added here.
        ruleset_provider: returns the rule set in force (None: rules are then listed from recent
            evaluations).
        leader_provider: returns whether this process holds the leader Lease (shown by ``/readyz``).
        controller_in_process: a controller runs in this process (``healer run``): ``/readyz``
            fails when its ticks stop; otherwise it only shows them.
        wake: asks the controller in this process for an early tick, True when one will run
            (:meth:`healer.controller.Controller.wake`); None: Alertmanager's webhook answers 404.

    The app keeps them on ``app.state`` (``settings``, ``session_factory``, ``clock``, ...).
    """
    app = FastAPI(
        title="healer",
        version=__version__,
        description="GPU node health remediation: fleet state, history, tickets, rules, audit and actions.",
        # Served by api.routes.docs behind the access rules, without a CDN.
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.session_factory = session_factory
    app.state.clock = clock
    app.state.ruleset_provider = ruleset_provider
    app.state.leader_provider = leader_provider
    app.state.controller_in_process = controller_in_process
    app.state.wake = wake
    app.state.metrics = metrics
    app.state.metrics.register_database(session_factory)
    app.state.auth = Auth(
        settings.api,
        revoked=RevokedSessions(
            session_factory, clock=app.state.clock, lifetime_seconds=SESSION_MAX_AGE_SECONDS
        ),
    )
    app.state.prometheus = prometheus
    app.state.history = history
    app.state.chart_gate = ChartGate(concurrency=CHART_CONCURRENCY, wait_seconds=CHART_WAIT_SECONDS)
    app.state.probe_executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="healer-probe")
    install_error_handlers(app)
    app.add_middleware(CsrfCookieMiddleware, auth=app.state.auth)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.api.max_body_bytes)
    app.add_middleware(ConcurrencyLimitMiddleware)  # pages queue; the probes do not
    app.add_middleware(SecurityHeadersMiddleware)  # outermost: every response, refusals included
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    app.include_router(ops.router)
    app.include_router(api_v1.router)
    app.include_router(ticket_callbacks.router)
    app.include_router(alertmanager.router)
    app.include_router(docs.router)
    app.include_router(pages.router)
    app.include_router(backtest.router)
    return app
