"""``/rules/{name}/backtest``: what one rule would have done over the last days, as the HTML report
``healer backtest -o html`` writes (replayed through the engine; nothing is changed anywhere).

The replay runs in the request (a sync route: FastAPI's thread pool), one range query per
``DEFAULT_CHUNK_SECONDS`` of history, each bounded by ``prometheus.timeout_seconds``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import HTMLResponse

from api.deps import HistoryDep, IdentityDep, NowDep, RuleSetDep, SettingsDep
from api.errors import ApiError
from healer.backtesting import backtest
from healer.engine.replay import ReplaySettings
from healer.errors import SourceError
from healer.reports.backtest_html import render
from healer.ruleset.schema import RuleGroup, RuleSet

router = APIRouter(include_in_schema=False)

#: Longest window the page replays, days (a week at the usual 30 s interval is 20,160 ticks).
MAX_DAYS = 14


@router.get("/rules/{name}/backtest")
def rule_backtest(
    name: str,
    now: NowDep,
    ruleset: RuleSetDep,
    settings: SettingsDep,
    source: HistoryDep,
    _who: IdentityDep,
    days: Annotated[float, Query(gt=0, le=MAX_DAYS)] = 7,
    step: Annotated[
        float | None,
        Query(
            ge=1,
            le=3600,
            description="Seconds between ticks (default: the rule's evaluation interval: its group's "
            "interval, else scheduler.default_interval_seconds).",
        ),
    ] = None,
) -> HTMLResponse:
    """The backtest report of rule ``name`` alone over the last ``days`` days, a tick every ``step``
    seconds (by default the rule's own evaluation interval, as the controller evaluates it), with
    the safety limits in force (budget and breaker as the controller judges them)."""
    group = next((g for g in ruleset.groups for r in g.rules if r.name == name), None) if ruleset else None
    if group is None:
        raise ApiError(404, f"no rule {name!r} in the rule set in force")
    rule = next(r for r in group.rules if r.name == name)
    single = RuleSet(groups=(RuleGroup(name=group.name, interval=group.interval, rules=[rule]),))
    end = now.replace(microsecond=0)
    try:
        (report,) = backtest(
            source,
            [(name, single)],
            start=end - timedelta(days=days),
            end=end,
            step_seconds=step,
            default_interval=settings.scheduler.default_interval_seconds,
            settings=ReplaySettings(
                limits=settings.safety.limits(), recovery_hold_seconds=settings.safety.recovery_hold_seconds
            ),
        )
    except SourceError as exc:
        raise ApiError(503, f"Prometheus: {exc}") from exc
    if report.failures and all(f.ticks == report.ticks for f in report.failures):
        # No query answered: a report of zeros would say the rule never fired.
        raise ApiError(503, f"Prometheus: {report.failures[0].error}")
    return HTMLResponse(render(report))
