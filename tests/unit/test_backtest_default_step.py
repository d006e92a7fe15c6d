"""The backtest's default step is each rule's own evaluation interval: a short fault a few minutes
before the window's end is found, as the controller would have found it; ``--step`` still overrides.

Prometheus is stood in for by a fake range query (the history a real one would return for a GPU
hot from 8.5 to 2 minutes before the end of the window).
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from healer.backtesting import backtest, default_step
from healer.cli import app
from healer.engine.replay import ReplaySettings
from healer.ruleset.schema import Rule, RuleGroup, RuleSet
from healer.sources.prometheus_range import PrometheusRange, RangeSeries

END = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
START = END - timedelta(minutes=10)
HOT_FROM, HOT_UNTIL = END - timedelta(minutes=8, seconds=30), END - timedelta(minutes=2)
HOT = "DCGM_FI_DEV_GPU_TEMP > 78"
LABELS = {"Hostname": "gpu-node-03", "gpu": "0", "UUID": "GPU-03-0"}

RULES = """groups:
  - name: gpu-thermal
    interval: 30s
    rules:
      - name: GpuTooHot
        expr: DCGM_FI_DEV_GPU_TEMP > 78
        for: 5m
        severity: critical
        annotations:
          summary: hot
        actions:
          - quarantine
"""


def fake_query_range(
    self: PrometheusRange, expr: str, *, start: datetime, end: datetime, step_seconds: float
) -> list[RangeSeries]:
    """What Prometheus answers over ``[start, end]``: the hot GPU while it is hot; nothing else."""
    if expr.strip() != HOT:
        return []
    count = math.floor((end - start).total_seconds() / step_seconds + 1e-9) + 1
    times = [start + timedelta(seconds=i * step_seconds) for i in range(count)]
    points = [(t.timestamp(), 85.0) for t in times if HOT_FROM <= t < HOT_UNTIL]
    return [RangeSeries(labels=dict(LABELS), points=points)] if points else []


@pytest.fixture
def rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(PrometheusRange, "query_range", fake_query_range)
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    return path


def _backtest(rules: Path, *args: str) -> dict:  # type: ignore[type-arg]
    window = ["--from", START.isoformat(), "--to", END.isoformat()]
    result = CliRunner().invoke(
        app,
        ["backtest", *window, "--rules", str(rules), "-o", "json", *args],
        env={"HEALER_PROMETHEUS__URL": "http://127.0.0.1:9"},
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout[result.stdout.index("{") :])  # type: ignore[no-any-return]


def _fired(report: dict) -> dict[str, list[str]]:  # type: ignore[type-arg]
    return {row["node"]: row["fired"] for row in report["nodes"] if row["fired"]}


def test_by_default_a_short_fault_in_the_last_minutes_is_found_at_the_rules_interval(rules: Path) -> None:
    report = _backtest(rules)
    # Hot from 11:51:30; `for: 5m` held at 11:56:30, three and a half minutes before the end.
    assert _fired(report) == {"gpu-node-03": [(HOT_FROM + timedelta(minutes=5)).isoformat()]}
    assert report["step_seconds"] == 30
    assert report["ticks"] == 21


def test_an_explicit_step_still_overrides_and_can_step_over_a_short_fault(rules: Path) -> None:
    # Ticks at 11:50, 11:55 and 12:00: hot only at 11:55, never held for 5 minutes.
    report = _backtest(rules, "--step", "5m")
    assert _fired(report) == {}
    assert report["ticks"] == 3


def test_the_table_says_the_step_it_used(rules: Path) -> None:
    window = ["--from", START.isoformat(), "--to", END.isoformat()]
    result = CliRunner().invoke(
        app,
        ["backtest", *window, "--rules", str(rules)],
        env={"HEALER_PROMETHEUS__URL": "http://127.0.0.1:9"},
    )
    assert result.exit_code == 0, result.output
    assert "21 ticks every 30s" in result.stdout
    assert "gpu-node-03" in result.stdout


def _group(name: str, interval: float | None, rule: str) -> RuleGroup:
    return RuleGroup(
        name=name, interval=interval, rules=[Rule.model_validate({"name": rule, "expr": HOT, "for": "5m"})]
    )


def test_the_default_step_is_the_shortest_rule_interval() -> None:
    fast, slow, unset = _group("fast", 15, "A"), _group("slow", 120, "B"), _group("unset", None, "C")
    assert default_step([RuleSet(groups=(slow, unset))], 60) == 60
    assert default_step([RuleSet(groups=(slow, unset))], 30) == 30
    assert default_step([RuleSet(groups=(slow,)), RuleSet(groups=(fast,))], 30) == 15


def test_each_group_is_evaluated_at_its_own_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    """A group every 30 s and one every 5 minutes, over the same fault: the fast one fires on the
    tick its `for` is held; the slow one first sees the fault at its next evaluation (11:55) and
    fires five minutes later, past the window, as the controller evaluating it every 5 minutes would."""
    monkeypatch.setattr(PrometheusRange, "query_range", fake_query_range)
    ruleset = RuleSet(groups=(_group("fast", 30, "Fast"), _group("slow", 300, "Slow")))
    (report,) = backtest(
        PrometheusRange("http://127.0.0.1:9"),
        [("current", ruleset)],
        start=START,
        end=END,
        step_seconds=None,
        settings=ReplaySettings(),
        fleet_query=None,
    )
    assert report.step_seconds == 30
    fired = {(n.node, n.rule): n.fired for n in report.nodes if n.fired}
    assert fired == {("gpu-node-03", "Fast"): [HOT_FROM + timedelta(minutes=5)]}


def test_the_dashboards_rule_backtest_defaults_to_the_rules_interval(
    rules: Path, migrated_sqlite_url: str
) -> None:
    from healer.ruleset.loading import load_ruleset
    from healer.store.session import make_engine, make_sessionmaker
    from tests.integration.test_api_support import build_app, http_client

    ruleset = load_ruleset([rules], promtool=False)
    engine = make_engine(migrated_sqlite_url)
    app = build_app(make_sessionmaker(engine), clock=lambda: END, ruleset_provider=lambda: ruleset)
    window = {"days": 10 / 1440}
    try:
        with http_client(app) as client:
            page = client.get("/rules/GpuTooHot/backtest", params=window)
            assert page.status_code == 200, page.text
            assert 'data-node="gpu-node-03"' in page.text
            stepped = client.get("/rules/GpuTooHot/backtest", params={**window, "step": 300})
            assert stepped.status_code == 200, stepped.text
            assert 'data-node="gpu-node-03"' not in stepped.text
    finally:
        engine.dispose()


def test_a_prometheus_that_never_answers_fails_every_tick_of_every_rule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Counted at every tick, due or not: a slow group's rule still reads as failed throughout, so
    the CLI and the dashboard say no query succeeded instead of showing a report of zeros."""
    from healer.errors import SourceUnavailable

    def down(self: PrometheusRange, expr: str, **_: object) -> list[RangeSeries]:
        raise SourceUnavailable("connection refused")

    monkeypatch.setattr(PrometheusRange, "query_range", down)
    ruleset = RuleSet(groups=(_group("fast", 30, "Fast"), _group("slow", 300, "Slow")))
    (report,) = backtest(
        PrometheusRange("http://127.0.0.1:9"),
        [("current", ruleset)],
        start=START,
        end=END,
        step_seconds=None,
        settings=ReplaySettings(),
        fleet_query=None,
    )
    assert {f.rule: f.ticks for f in report.failures} == {"Fast": report.ticks, "Slow": report.ticks}
