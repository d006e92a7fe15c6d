"""The safety limits the engine judges against: plain frozen data, built from the settings by the
composition (``SafetySettings.limits()``), so the engine never sees pydantic."""

from __future__ import annotations

from dataclasses import dataclass

ALL_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


@dataclass(frozen=True)
class MaintenanceWindow:
    """A recurring window (``start``/``end`` HH:MM UTC on ``days``) in which a pool is not touched."""

    start: str
    end: str
    pool: str = "*"
    days: tuple[str, ...] = ALL_DAYS


@dataclass(frozen=True)
class SafetyLimits:
    """Budget, breaker and windows (see :mod:`healer.engine.safety`).

    ``max_unhealthy``: nodes per pool out of service at once (count); ``max_unhealthy_percent``:
    the same as % of the pool, rounded down; ``breaker_nodes``/``breaker_percent``: the breaker
    trips when more nodes (or more % of one pool, counting at least ``breaker_min_nodes`` nodes)
    turned bad within ``breaker_window_seconds``; ``budget_floor_nodes``: nodes any pool may have
    out at once however small it is (never more than ``max_unhealthy``).
    """

    max_unhealthy: int = 2
    max_unhealthy_percent: float = 10.0
    breaker_nodes: int = 5
    breaker_percent: float = 20.0
    breaker_window_seconds: float = 300.0
    breaker_min_nodes: int = 3
    budget_floor_nodes: int = 1
    maintenance_windows: tuple[MaintenanceWindow, ...] = ()
