"""The detection timeline (``test_detection_prometheus.py``) on Prometheus 3.x: the default pack's
rules fire where their faults are and nowhere else, recover after their hold, and treat a silent
exporter as unknown, as on Debian's 2.42. Prometheus 3's range selectors and lookback are
left-open, so the windowed rules (``increase``, ``changes``, ``resets``, ``*_over_time``) are the
ones whose answer could move. The tests that do not query Prometheus (a hung server, a refused
port, the recorded rows) are not repeated."""

from __future__ import annotations

import pytest

from tests.integration.test_detection_prometheus import (
    test_cli_evaluate_once,
    test_concurrent_tick_equals_the_sequential_tick,
    test_exporter_down_is_unknown_not_a_finding_nor_a_recovery,
    test_findings_fire_only_after_their_for,
    test_healthy_fleet_fires_nothing,
    test_recovery_needs_the_recovery_hold,
    test_rule_fires_on_its_fault_and_nowhere_else,
    test_xid45_idle_clocks_and_counter_reset_fire_nothing,
    timeline,
)
from tests.prometheus_releases import PrometheusRelease

pytestmark = pytest.mark.prometheus

__all__ = [
    "test_cli_evaluate_once",
    "test_concurrent_tick_equals_the_sequential_tick",
    "test_exporter_down_is_unknown_not_a_finding_nor_a_recovery",
    "test_findings_fire_only_after_their_for",
    "test_healthy_fleet_fires_nothing",
    "test_recovery_needs_the_recovery_hold",
    "test_rule_fires_on_its_fault_and_nowhere_else",
    "test_xid45_idle_clocks_and_counter_reset_fire_nothing",
    "timeline",
]


@pytest.fixture(scope="module")
def prometheus_release(prometheus3: PrometheusRelease) -> PrometheusRelease:
    return prometheus3
