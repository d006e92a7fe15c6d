"""Alerts mode (``test_alerts_mode_prometheus.py``) on Prometheus 3.x: the exported rule file loads
(``promtool check rules`` 3.x accepts it), alerts mode finds what query mode finds, and a failing,
stopped, missing or changed rule is refused, read from Prometheus 3's ``/api/v1/rules``."""

from __future__ import annotations

import pytest

from tests.integration.test_alerts_mode_prometheus import (
    setup,
    test_a_rule_failing_in_prometheus_is_refused,
    test_a_rule_prometheus_lacks_or_holds_in_another_version_is_refused,
    test_alerts_mode_finds_what_query_mode_finds,
    test_evaluate_once_in_alerts_mode,
    test_stopped_rule_evaluation_is_refused,
)
from tests.prometheus_releases import PrometheusRelease

pytestmark = pytest.mark.prometheus

__all__ = [
    "setup",
    "test_a_rule_failing_in_prometheus_is_refused",
    "test_a_rule_prometheus_lacks_or_holds_in_another_version_is_refused",
    "test_alerts_mode_finds_what_query_mode_finds",
    "test_evaluate_once_in_alerts_mode",
    "test_stopped_rule_evaluation_is_refused",
]


@pytest.fixture(scope="module")
def prometheus_release(prometheus3: PrometheusRelease) -> PrometheusRelease:
    return prometheus3
