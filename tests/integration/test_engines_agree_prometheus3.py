"""The engines agree (``test_engines_agree.py``) with Prometheus 3.x in Prometheus's place: the
default pack finds the same nodes on Prometheus 3 as on VictoriaMetrics, on the demo fleet at every
checkpoint and on static samples. With 2.42 agreeing with VictoriaMetrics too, the pack finds the
same nodes on both Prometheus releases."""

from __future__ import annotations

import pytest

from tests.integration.test_engines_agree import (
    engines,
    test_static_samples_fire_the_same_rules_on_both_engines_and_old_totals_fire_none,
    test_the_default_pack_finds_the_same_nodes_on_prometheus_and_victoria_metrics,
)
from tests.prometheus_releases import PrometheusRelease

pytestmark = [pytest.mark.prometheus, pytest.mark.victoria_metrics, pytest.mark.timeout(900)]

__all__ = [
    "engines",
    "test_static_samples_fire_the_same_rules_on_both_engines_and_old_totals_fire_none",
    "test_the_default_pack_finds_the_same_nodes_on_prometheus_and_victoria_metrics",
]


@pytest.fixture(scope="module")
def prometheus_release(prometheus3: PrometheusRelease) -> PrometheusRelease:
    return prometheus3
