"""Operations endpoints for Kubernetes and Prometheus: ``/healthz``, ``/readyz``, ``/metrics``.

They need no authentication (probes and scrapers carry none) and reveal only counts.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from api import queries
from api.schemas import ControllerOut, LastTick, ReadyOut, SourceOut
from healer.metrics import HealerMetrics

router = APIRouter(tags=["ops"])

#: A tick older than this many default intervals means the controller is stuck or gone.
STALE_TICKS = 3


#: Seconds /readyz waits for the database before it answers 503.
READY_DB_TIMEOUT_SECONDS = 2.0


@router.get("/healthz", summary="Process is up")
async def healthz() -> dict[str, str]:
    """Always 200 while the process serves requests (liveness). Answered on the event loop, off
    the request thread pool: slow pages cannot starve it into a liveness restart."""
    return {"status": "ok"}


@router.get("/readyz", response_model=ReadyOut, responses={503: {"model": ReadyOut}}, summary="Ready")
async def readyz(request: Request) -> Response:
    """200 when this process can serve: the database answers and, where a controller runs in this
    process (``healer run``), a tick (by any replica) finished within three default intervals and
    Prometheus has not been failing for longer than ``prometheus.unavailable_grace_seconds``; 503
    with the reasons otherwise. ``controller`` shows the controller's state either way: the
    dashboard alone (``healer serve``) is not unready because no controller runs beside it.

    Leadership is reported but does not make a replica unready: the standby must stay in the
    Service (it serves the dashboard) and in rollouts (an unready standby would stall them).
    """
    state = request.app.state
    now = state.clock()
    reasons: list[str] = []
    controller: list[str] = []
    database = True
    tick = None
    source = None
    grace = state.settings.prometheus.unavailable_grace_seconds

    def check() -> tuple[LastTick | None, SourceOut | None]:
        with state.session_factory() as session:
            session.execute(text("SELECT 1"))
            return (
                queries.last_tick(session, now=now),
                queries.source_status(session, now=now, grace_seconds=grace),
            )

    # Its own small thread pool, off the request pool, bounded in time.
    loop = asyncio.get_running_loop()
    try:
        tick, source = await asyncio.wait_for(
            loop.run_in_executor(state.probe_executor, check), timeout=READY_DB_TIMEOUT_SECONDS
        )
    except SQLAlchemyError as exc:
        database = False
        orig = getattr(exc, "orig", None)
        if "no such table" in str(orig) or type(orig).__name__ == "UndefinedTable":  # SQLite, psycopg
            reasons.append("database has no healer schema: run `healer db upgrade`")
        else:
            reasons.append(f"database unreachable: {exc.__class__.__name__}")
    except TimeoutError:
        database = False
        reasons.append(f"database did not answer within {READY_DB_TIMEOUT_SECONDS:g}s")
    limit = STALE_TICKS * state.settings.scheduler.default_interval_seconds
    if database and tick is None:
        controller.append("no tick recorded yet")
    elif tick is not None and tick.age_seconds > limit:
        controller.append(f"last tick {tick.age_seconds:.0f}s ago (limit {limit:.0f}s)")
    if source is not None and source.unready:
        controller.append(
            f"prometheus cannot be queried for {source.failing_seconds:.0f}s "
            f"(grace {grace:.0f}s): {source.reason}"
        )
    in_process: bool = state.controller_in_process
    if in_process:
        reasons += controller
    leader = state.leader_provider() if state.leader_provider is not None else None
    body = ReadyOut(
        ready=not reasons,
        reasons=reasons,
        database=database,
        last_tick_at=tick.at if tick else None,
        last_tick_age_seconds=tick.age_seconds if tick else None,
        leader=leader,
        source=source,
        controller=ControllerOut(in_process=in_process, ok=database and not controller, reasons=controller),
        node_watch_age_seconds=watch.age_seconds() if (watch := state.metrics.node_watch) else None,
    )
    return JSONResponse(body.model_dump(mode="json"), status_code=200 if body.ready else 503)


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
def metrics(request: Request) -> Response:
    """healer's metrics in the Prometheus text format (see :mod:`healer.metrics`)."""
    registry: HealerMetrics = request.app.state.metrics
    return Response(registry.exposition(), media_type=CONTENT_TYPE_LATEST)
