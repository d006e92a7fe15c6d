"""``healer backtest`` on four hours of fleet data loaded into a real Prometheus.

The data is generated like the simulator's (32 nodes x 2 GPUs, dcgm-exporter's labels, a sample
every 30 s), turned into TSDB blocks by ``promtool tsdb create-blocks-from openmetrics`` and served
by a throwaway ``prometheus``; the backtest runs the default rule pack over it through the CLI.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from healer.cli import app
from healer.ruletest.series import Series, openmetrics
from healer.sources.scratch import scratch_prometheus
from tests.conftest import REPO
from tests.service_skips import require_binary

pytestmark = pytest.mark.prometheus

START = datetime(2026, 11, 30, 0, 0, tzinfo=UTC)
STEP = 30.0
HOURS = 4
NODES = [f"gpu-node-{i:02d}" for i in range(32)]
POINTS = int(HOURS * 3600 / STEP) + 1


def _at(minutes: float) -> int:
    return int(minutes * 60 / STEP)


def _temps(node: str, gpu: int) -> list[float | None]:
    base = 60.0 + (hash((node, gpu)) % 8)
    values: list[float | None] = [base + (i % 5) for i in range(POINTS)]
    faults = {
        ("gpu-node-03", 0): (60, 90, 85.0),  # hot for 30 minutes: GpuTooHot
        ("gpu-node-11", 1): (180, 200, 81.0),  # 81 C for 20 minutes: only above a 78 C threshold
        ("gpu-node-14", 0): (150, 153, 84.0),  # 3 minutes: shorter than `for: 5m`, never fires
    }
    if (node, gpu) in faults:
        start, end, value = faults[(node, gpu)]
        for i in range(_at(start), _at(end)):
            values[i] = value
    return values


def _xids(node: str, gpu: int) -> list[float | None]:
    values: list[float | None] = [0.0] * POINTS
    if (node, gpu) == ("gpu-node-07", 1):
        for i in range(_at(120), _at(130)):
            values[i] = 79.0  # Xid 79: fallen off the bus
    return values


def fleet_openmetrics() -> str:
    series = []
    for node in NODES:
        for gpu in (0, 1):
            labels = (("Hostname", node), ("UUID", f"GPU-{node}-{gpu}"), ("gpu", str(gpu)))
            series.append(Series("DCGM_FI_DEV_GPU_TEMP", labels, tuple(_temps(node, gpu))))
            series.append(Series("DCGM_FI_DEV_XID_ERRORS", labels, tuple(_xids(node, gpu))))
    return openmetrics((s, START.timestamp(), STEP) for s in series)


@pytest.fixture(scope="module")
def prometheus_url() -> Iterator[str]:
    require_binary("prometheus", package="prometheus")
    require_binary("promtool", package="prometheus")
    with scratch_prometheus(fleet_openmetrics()) as url:
        yield url


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # Settings come from the environment: keep a developer's HEALER_* out of the test.
    for key in list(os.environ):
        if key.startswith("HEALER_"):
            monkeypatch.delenv(key)


def run(url: str, monkeypatch: pytest.MonkeyPatch, *args: str) -> dict:  # type: ignore[type-arg]
    monkeypatch.setenv("HEALER_PROMETHEUS__URL", url)
    window = ["--from", START.isoformat(), "--to", (START + timedelta(hours=HOURS)).isoformat()]
    result = CliRunner().invoke(app, ["backtest", *window, "--step", "30s", "-o", "json", *args])
    assert result.exit_code == 0, result.output
    out = result.stdout
    return json.loads(out[out.index("{") :])  # type: ignore[no-any-return]


def steps(report: dict) -> dict[tuple[str, str], dict[str, list[str]]]:  # type: ignore[type-arg]
    out = {}
    for row in report["nodes"]:
        kinds = {
            k: row[k]
            for k in ("fired", "quarantined", "drained", "ticketed", "held_budget", "held_breaker")
            if row[k]
        }
        out[(row["node"], row["rule"])] = kinds
    return out


def iso(minutes: float) -> str:
    return (START + timedelta(minutes=minutes)).isoformat()


def test_backtest_finds_exactly_the_injected_faults_with_their_steps(
    prometheus_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HEALER_SAFETY__MAX_UNHEALTHY", "3")  # room for all three faults at once
    report = run(prometheus_url, monkeypatch, "--rules", str(REPO / "rules"))
    assert steps(report) == {
        # 85 C from 1:00; `for: 5m` → fired, quarantined and drain started at 1:05; the drain ends
        # at the next round and the ticket goes out.
        ("gpu-node-03", "GpuTooHot"): {
            "fired": [iso(65)],
            "quarantined": [iso(65)],
            "drained": [iso(65)],
            "ticketed": [iso(65.5)],
        },
        ("gpu-node-07", "GpuFatalXid"): {
            "fired": [iso(120)],
            "quarantined": [iso(120)],
            "drained": [iso(120)],
            "ticketed": [iso(120.5)],
        },
        ("gpu-node-11", "GpuTooHot"): {
            "fired": [iso(185)],
            "quarantined": [iso(185)],
            "drained": [iso(185)],
            "ticketed": [iso(185.5)],
        },
    }
    hot = next(r for r in report["rules"] if r["rule"] == "GpuTooHot")
    assert hot["nodes_out"] == 2
    # Never repaired within the window (no provider in a backtest): out until 4:00.
    assert hot["node_hours"] == pytest.approx((240 - 65) / 60 + (240 - 185) / 60, abs=1e-3)
    assert report["nodes_seen"] == len(NODES)
    assert report["breaker_trips"] == []


def test_comparison_shows_what_a_higher_threshold_changes(
    prometheus_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    proposed = tmp_path / "proposed"
    shutil.copytree(REPO / "rules", proposed)
    thermal = proposed / "gpu-thermal.yaml"
    text = thermal.read_text()
    assert text.count(") > 78\n") == 1
    thermal.write_text(text.replace(") > 78\n", ") > 82\n"))

    monkeypatch.setenv("HEALER_SAFETY__MAX_UNHEALTHY", "3")
    body = run(prometheus_url, monkeypatch, "--rules", str(REPO / "rules"), "--compare", str(proposed))
    hot = next(d for d in body["rules"] if d["rule"] == "GpuTooHot")
    assert hot["nodes_out"] == [2, 1]
    assert hot["only_a"] == ["gpu-node-11"]
    assert hot["only_b"] == []
    assert hot["node_hours_delta"] == pytest.approx(-(240 - 185) / 60, abs=1e-3)
    xid = next(d for d in body["rules"] if d["rule"] == "GpuFatalXid")
    assert xid["nodes_out"] == [1, 1] and xid["only_a"] == xid["only_b"] == []


def test_the_budget_holds_what_it_would_have_held(
    prometheus_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The default budget: 2 nodes out at once. Nobody repairs node-03 and node-07 within the
    # window, so node-11's quarantine at 3:05 would have been refused.
    report = run(prometheus_url, monkeypatch, "--rules", str(REPO / "rules"))
    got = steps(report)
    assert "quarantined" in got[("gpu-node-03", "GpuTooHot")]
    assert "quarantined" in got[("gpu-node-07", "GpuFatalXid")]
    assert got[("gpu-node-11", "GpuTooHot")] == {"fired": [iso(185)], "held_budget": [iso(185)]}
    assert next(r for r in report["rules"] if r["rule"] == "GpuTooHot")["held_budget"] == 1


def test_a_repair_returns_the_node_and_frees_the_budget(
    prometheus_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # --repair-after 1h: node-03's ticket (1:05:30) is resolved at 2:05:30, it validates for the
    # recovery hold (5 min, clear since GpuTooHot resolved at 1:40) and returns at 2:10:30.
    report = run(prometheus_url, monkeypatch, "--rules", str(REPO / "rules"), "--repair-after", "1h")
    row = next(r for r in report["nodes"] if r["node"] == "gpu-node-03")
    assert row["returned"] == [iso(130.5)]
    assert row["hours_out"] == pytest.approx((130.5 - 65) / 60, abs=1e-3)
    assert "quarantined" in steps(report)[("gpu-node-11", "GpuTooHot")]


def test_html_report_has_a_timeline_per_node(prometheus_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEALER_PROMETHEUS__URL", prometheus_url)
    window = ["--from", START.isoformat(), "--to", (START + timedelta(hours=HOURS)).isoformat()]
    result = CliRunner().invoke(app, ["backtest", *window, "--rules", str(REPO / "rules"), "-o", "html"])
    assert result.exit_code == 0, result.output
    html = result.stdout
    for node in ("gpu-node-03", "gpu-node-07", "gpu-node-11"):
        assert f'data-node="{node}"' in html
    assert 'data-node="gpu-node-14"' not in html


def test_the_rules_page_links_a_rules_backtest_report(
    prometheus_url: str, session_factory: sessionmaker[Session]
) -> None:
    from healer.config import load_settings
    from healer.ruleset.loading import load_ruleset
    from tests.integration.test_api_support import VIEWER_TOKEN, bearer, build_app, http_client

    settings = load_settings(
        prometheus={"url": prometheus_url, "timeout_seconds": 30.0},
        api={
            "tokens": [{"token": VIEWER_TOKEN, "user": "victor", "role": "viewer"}],
            "csrf_secret": "x" * 32,
        },
        safety={"max_unhealthy": 3},
    )
    ruleset = load_ruleset([REPO / "rules"], promtool=False)
    end = START + timedelta(hours=HOURS)
    app = build_app(session_factory, settings, clock=lambda: end, ruleset_provider=lambda: ruleset)
    with http_client(app) as client:
        rules_page = client.get("/rules", headers=bearer(VIEWER_TOKEN))
        assert rules_page.status_code == 200
        assert 'href="/rules/GpuTooHot/backtest"' in rules_page.text
        assert "what would this rule have done last week" in rules_page.text

        page = client.get(
            "/rules/GpuTooHot/backtest", params={"days": HOURS / 24, "step": 30}, headers=bearer(VIEWER_TOKEN)
        )
        assert page.status_code == 200, page.text
        for node in ("gpu-node-03", "gpu-node-11"):
            assert f'data-node="{node}"' in page.text
        assert 'data-node="gpu-node-07"' not in page.text  # an Xid: another rule's doing

        missing = client.get("/rules/NoSuchRule/backtest", headers=bearer(VIEWER_TOKEN))
        assert missing.status_code == 404


RULE = """groups:
  - name: gpu
    rules:
      - name: {name}
        expr: {expr}
        for: 5m
        severity: warning
        annotations:
          summary: hot
        actions:
          - quarantine
"""


def _unused_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_prometheus_is_an_error_not_a_quiet_report(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULE.format(name="GpuTooHot", expr="DCGM_FI_DEV_GPU_TEMP > 78"))
    monkeypatch.setenv("HEALER_PROMETHEUS__URL", f"http://127.0.0.1:{_unused_loopback_port()}")
    result = CliRunner().invoke(app, ["backtest", "--from", "-3m", "--rules", str(rules), "-o", "json"])
    assert result.exit_code == 1, result.output
    assert "nodes_seen" not in result.stdout  # no report of zeros
    assert "no query of any rule succeeded" in result.stderr
    assert "Connection refused" in result.stderr


def test_bad_promql_names_the_file_line_and_column(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    require_binary("promtool", package="prometheus")
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULE.format(name="GpuTooHot", expr="(DCGM_FI_DEV_GPU_TEMP > 78"))
    monkeypatch.setenv("HEALER_PROMETHEUS__URL", f"http://127.0.0.1:{_unused_loopback_port()}")
    result = CliRunner().invoke(app, ["backtest", "--from", "-3m", "--rules", str(rules)])
    assert result.exit_code == 2, result.output
    assert f"{rules}:5:" in result.stderr
    assert "PromQL parse error" in result.stderr


def test_a_rule_prometheus_cannot_evaluate_is_named_and_the_exit_is_1(
    prometheus_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rules = tmp_path / "rules.yaml"
    good = RULE.format(name="GpuTooHot", expr="DCGM_FI_DEV_GPU_TEMP > 78")
    # Parses, but two GPUs per Hostname make the one-to-one match fail when Prometheus runs it.
    bad = RULE.format(
        name="Ambiguous", expr="DCGM_FI_DEV_GPU_TEMP * on (Hostname) DCGM_FI_DEV_XID_ERRORS"
    ).split("\n", 3)[3]
    rules.write_text(good + bad)
    monkeypatch.setenv("HEALER_PROMETHEUS__URL", prometheus_url)
    window = ["--from", START.isoformat(), "--to", (START + timedelta(hours=HOURS)).isoformat()]
    result = CliRunner().invoke(app, ["backtest", *window, "--rules", str(rules), "-o", "json"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout[result.stdout.index("{") :])
    assert [f["rule"] for f in report["failures"]] == ["Ambiguous"]
    assert ("gpu-node-03", "GpuTooHot") in steps(report)  # the rest of the report is still there
    assert "error: rule Ambiguous: Prometheus failed for" in result.stderr
    page = CliRunner().invoke(app, ["backtest", *window, "--rules", str(rules), "-o", "html"])
    assert page.exit_code == 1
    assert "<strong>Prometheus failed</strong> for rule Ambiguous in 481 of 481 ticks" in page.stdout


def test_the_rule_backtest_page_is_503_when_prometheus_does_not_answer(
    session_factory: sessionmaker[Session],
) -> None:
    from healer.config import load_settings
    from healer.ruleset.loading import load_ruleset
    from tests.integration.test_api_support import VIEWER_TOKEN, bearer, build_app, http_client

    settings = load_settings(
        prometheus={"url": f"http://127.0.0.1:{_unused_loopback_port()}"},
        api={
            "tokens": [{"token": VIEWER_TOKEN, "user": "victor", "role": "viewer"}],
            "csrf_secret": "x" * 32,
        },
    )
    ruleset = load_ruleset([REPO / "rules"], promtool=False)
    app = build_app(session_factory, settings, clock=lambda: START, ruleset_provider=lambda: ruleset)
    with http_client(app) as client:
        page = client.get("/rules/GpuTooHot/backtest", params={"days": 0.01}, headers=bearer(VIEWER_TOKEN))
    assert page.status_code == 503, page.text
    assert "Connection refused" in page.text
