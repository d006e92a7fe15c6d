"""The promtool corpus (``test_promtool_corpus.py``) under promtool 3.x: ``healer rules test``, with
Prometheus 3's ``promtool`` and ``prometheus`` first on its PATH, gives promtool 3's verdict per file
and per test case."""

from __future__ import annotations

import pytest

from tests.integration.test_promtool_corpus import test_healer_gives_promtools_verdict_per_file_and_per_test
from tests.prometheus_releases import PrometheusRelease

pytestmark = pytest.mark.prometheus

__all__ = ["test_healer_gives_promtools_verdict_per_file_and_per_test"]


@pytest.fixture(scope="module")
def prometheus_release(prometheus3: PrometheusRelease) -> PrometheusRelease:
    return prometheus3
