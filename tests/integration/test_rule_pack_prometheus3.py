"""The default rule pack on real exporter samples (``test_rule_pack_prometheus.py``) on Prometheus
3.x: every rule's expression runs, exactly the sampled faults fire, and counter bursts are found
over Prometheus 3's left-open windows as over 2.42's closed ones."""

from __future__ import annotations

import pytest

from tests.integration.test_rule_pack_prometheus import (
    pack,
    test_counter_bursts_and_a_silent_exporter,
    test_every_default_rule_runs_and_exactly_the_sampled_faults_fire,
)
from tests.prometheus_releases import PrometheusRelease

pytestmark = pytest.mark.prometheus

__all__ = [
    "pack",
    "test_counter_bursts_and_a_silent_exporter",
    "test_every_default_rule_runs_and_exactly_the_sampled_faults_fire",
]


@pytest.fixture(scope="module")
def prometheus_release(prometheus3: PrometheusRelease) -> PrometheusRelease:
    return prometheus3
