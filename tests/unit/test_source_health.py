"""The source's state changes only on ok ↔ failing; readiness waits out the grace period."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from healer.model.source_health import SourceHealth, next_health

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_failing_keeps_its_start_and_shows_the_latest_reason() -> None:
    first = next_health(None, failure="connection refused", now=T0)
    later = next_health(first, failure="HTTP 401", now=T0 + timedelta(seconds=30))
    assert (later.ok, later.since, later.reason) == (False, T0, "HTTP 401")
    assert not later.overdue(T0 + timedelta(seconds=60), 60)
    assert later.overdue(T0 + timedelta(seconds=61), 60)
    back = next_health(later, failure=None, now=T0 + timedelta(seconds=90))
    assert (back.ok, back.since, back.reason) == (True, T0 + timedelta(seconds=90), "")
    assert back.failing_for(T0 + timedelta(hours=1)) == 0.0


def test_the_switch_value_round_trips() -> None:
    health = SourceHealth(ok=False, since=T0, reason="refused")
    assert SourceHealth.from_switch(health.as_switch()) == health
    assert SourceHealth.from_switch({}) is None
