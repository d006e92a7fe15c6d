"""``healer backtest`` reports the series that name no node as ``healer evaluate --once`` does
(issue 25), on the same data in a real Prometheus.

The data: the last 30 minutes of one GPU node (dcgm-exporter names it, ``Hostname``) and of two
node_exporters whose InfiniBand series carry no node label, only their scrape address
(``instance``), as the node-exporter Helm chart leaves them. One port is DOWN all along, the other
goes DOWN half-way, so InfinibandPortNotActive returns series about no node. No cluster is reachable
(the kubeconfig named does not exist), so their addresses name no node either: ``evaluate`` says
the rule is degraded, why, and exits 2, and the backtest must say the same in every output.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from healer.ruletest.series import Series, openmetrics
from healer.sources.scratch import scratch_prometheus
from tests.conftest import REPO
from tests.healer_cli import run_healer

pytestmark = pytest.mark.prometheus

STEP = 30.0
POINTS = 61  # 30 minutes
ADDRESSES = {"10.9.0.7:9100", "10.9.0.8:9100"}  # node_exporters' hostNetwork addresses
RULE = "InfinibandPortNotActive"


def _data(end: float) -> str:
    half = POINTS // 2
    ports = {
        ("10.9.0.7:9100", "mlx5_0"): [4.0] * half + [1.0] * (POINTS - half),  # goes DOWN half-way
        ("10.9.0.8:9100", "mlx5_1"): [1.0] * POINTS,  # DOWN all along
    }
    series = [
        Series(
            "DCGM_FI_DEV_GPU_TEMP",
            (("Hostname", "gpu-node-1"), ("UUID", "GPU-a"), ("gpu", "0")),
            (50.0,) * POINTS,
        )
    ]
    for (instance, device), states in ports.items():
        labels = (("device", device), ("instance", instance), ("job", "node-exporter"), ("port", "1"))
        series.append(Series("node_infiniband_state_id", labels, tuple(states)))
    start = end - (POINTS - 1) * STEP
    return openmetrics((s, start, STEP) for s in series)


@pytest.fixture(scope="module")
def prometheus_url() -> Iterator[str]:
    # Up to now: `evaluate --once` queries at the current time, the backtest's window ends then.
    with scratch_prometheus(_data(datetime.now(UTC).timestamp() // STEP * STEP)) as url:
        yield url


def healer(url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEALER_")}
    env |= {
        "HEALER_PROMETHEUS__URL": url,
        "HEALER_RULES_PATHS": json.dumps([str(REPO / "rules")]),
        "HEALER_DATABASE__URL": "sqlite://",
        # no cluster: the address lookup fails, and says so, as it would without access
        "HEALER_KUBERNETES__KUBECONFIG": str(tmp_path / "no-such-kubeconfig"),
    }
    return run_healer(*args, env=env, timeout=120)


def _json(text: str) -> Any:
    return json.loads(text[text.index("{") :])


BACKTEST = ("backtest", "--from", "-10m", "--to", "now", "--step", "30s")


def test_the_backtest_counts_and_lists_what_evaluate_reports(prometheus_url: str, tmp_path: Path) -> None:
    evaluated = healer(prometheus_url, tmp_path, "evaluate", "--once", "--no-store", "-o", "json")
    assert evaluated.returncode == 2, evaluated.stderr
    by_rule = {r["rule"]: r for r in _json(evaluated.stdout)["rules"]}
    degraded = {name for name, r in by_rule.items() if r["unresolved"]}
    assert degraded == {RULE}
    now = by_rule[RULE]["unresolved"]
    assert now["count"] == 2 and now["example_instance"] in ADDRESSES
    assert "no-such-kubeconfig" in now["why"]

    replayed = healer(prometheus_url, tmp_path, *BACKTEST, "-o", "json")
    assert replayed.returncode == 2, replayed.stderr  # degraded, as evaluate exits
    rules = {r["rule"]: r for r in _json(replayed.stdout)["rules"]}
    assert {name for name, r in rules.items() if r["unresolved"]} == degraded
    window = rules[RULE]["unresolved"]
    ticks = _json(replayed.stdout)["ticks"]
    # the port that went DOWN half-way did so 15 minutes ago: both are DOWN at every tick
    assert (window["series"], window["ticks"]) == (2, ticks)
    assert window["example_instance"] in ADDRESSES
    assert window["why"] == now["why"]
    assert window["node_labels"] == ["node", "kubernetes_node", "nodename"]


def test_the_text_and_html_reports_list_them_too(prometheus_url: str, tmp_path: Path) -> None:
    table = healer(prometheus_url, tmp_path, *BACKTEST)
    assert table.returncode == 2, table.stderr
    assert "degraded: series that name no node act on nothing" in table.stdout
    assert f"  {RULE}: up to 2 series in 21 of 21 ticks, e.g. instance=10.9.0." in table.stdout
    assert "then the instance address: " in table.stdout

    page = healer(prometheus_url, tmp_path, *BACKTEST, "-o", "html")
    assert page.returncode == 2, page.stderr
    assert f"<strong>Degraded</strong>: rule {RULE} returned series that name no node in 21 of 21 ticks" in (
        page.stdout
    )
    assert "no-such-kubeconfig" in page.stdout
