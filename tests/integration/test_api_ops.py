"""Operations endpoints (/healthz, /readyz, /metrics) and the node chart from a real Prometheus."""

from __future__ import annotations

import json
import re
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from healer.errors import QueryError, SourceUnavailable
from healer.metrics import HealerMetrics
from healer.sources.prometheus_range import PrometheusRange, node_selector_expr
from healer.store import nodes as repo
from healer.store.session import make_engine, make_sessionmaker
from tests.integration.test_api_support import (
    NOW,
    build_app,
    dcgm_exporter,
    healer_serve,
    http_client,
    make_settings,
    seed,
)
from tests.services import ScrapeTarget, prometheus_server


class TestProbes:
    def test_healthz(self, session_factory: sessionmaker[Session]) -> None:
        with http_client(build_app(session_factory)) as c:
            r = c.get("/healthz")
        assert (r.status_code, r.json()) == (200, {"status": "ok"})

    def test_ready_with_a_recent_tick(self, session_factory: sessionmaker[Session]) -> None:
        seed(session_factory)
        app = build_app(session_factory, leader_provider=lambda: True, controller_in_process=True)
        with http_client(app) as c:
            r = c.get("/readyz")
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["ready"] is True and body["reasons"] == []
        assert (body["database"], body["leader"], body["last_tick_age_seconds"]) == (True, True, 20.0)
        assert body["controller"] == {"in_process": True, "ok": True, "reasons": []}

    def test_stale_tick_is_503_with_the_reason(self, session_factory: sessionmaker[Session]) -> None:
        """healer run: its own controller's ticks stopped."""
        seed(session_factory)
        later = NOW + timedelta(minutes=10)
        app = build_app(
            session_factory, clock=lambda: later, leader_provider=lambda: False, controller_in_process=True
        )
        with http_client(app) as c:
            r = c.get("/readyz")
        assert r.status_code == 503
        assert r.json()["reasons"] == ["last tick 620s ago (limit 90s)"]
        assert r.json()["controller"]["reasons"] == ["last tick 620s ago (limit 90s)"]
        assert r.json()["leader"] is False

    def test_no_tick_yet_is_503(self, session_factory: sessionmaker[Session]) -> None:
        with http_client(build_app(session_factory, controller_in_process=True)) as c:
            r = c.get("/readyz")
        assert r.status_code == 503
        assert r.json()["reasons"] == ["no tick recorded yet"]

    def test_the_dashboard_alone_is_ready_and_shows_the_stale_controller(
        self, session_factory: sessionmaker[Session]
    ) -> None:
        """healer serve: no controller runs beside it; its readiness is its own (the database)."""
        seed(session_factory)
        later = NOW + timedelta(minutes=10)
        with http_client(build_app(session_factory, clock=lambda: later)) as c:
            r = c.get("/readyz")
        assert r.status_code == 200, r.text
        body = r.json()
        assert (body["ready"], body["reasons"], body["database"]) == (True, [], True)
        assert body["controller"] == {
            "in_process": False,
            "ok": False,
            "reasons": ["last tick 620s ago (limit 90s)"],
        }


def test_unreachable_database_is_503_and_metrics_still_answer(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'missing' / 'dir' / 'healer.db'}")
    try:
        with http_client(build_app(make_sessionmaker(engine))) as c:
            ready = c.get("/readyz")
            metrics = c.get("/metrics")
    finally:
        engine.dispose()
    assert ready.status_code == 503
    assert ready.json()["database"] is False
    assert ready.json()["reasons"][0].startswith("database unreachable: OperationalError")
    assert metrics.status_code == 200
    assert "healer_database_up 0.0" in metrics.text


def test_metrics(session_factory: sessionmaker[Session]) -> None:
    seed(session_factory)
    metrics = HealerMetrics()
    metrics.observe_tick(duration_seconds=0.8)
    metrics.set_rule_health("GpuTooHot", "ok", evaluated_at_unix=NOW.timestamp())
    metrics.count_action("cordon", "dry_run")
    with http_client(build_app(session_factory, metrics=metrics)) as c:
        r = c.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    samples = dict(re.findall(r"^(\S+) (\S+)$", r.text, flags=re.M))
    assert samples['healer_nodes{state="quarantined"}'] == "1.0"
    assert samples['healer_nodes{state="healthy"}'] == "3.0"
    assert samples["healer_breaker_tripped"] == "1.0"
    assert samples["healer_breaker_held_nodes"] == "1.0"
    assert samples["healer_paused"] == "0.0"
    assert samples["healer_outbox_depth"] == "1.0"
    assert samples["healer_outbox_retrying"] == "1.0"
    assert samples["healer_outbox_delivery_failures"] == "0.0"
    assert samples['healer_ticks_total{outcome="ok"}'] == "1.0"
    assert samples["healer_tick_duration_seconds_count"] == "1.0"
    assert samples['healer_rule_health{health="ok",rule="GpuTooHot"}'] == "1.0"
    assert samples['healer_rule_health{health="error",rule="GpuTooHot"}'] == "0.0"
    assert samples['healer_findings{rule="GpuTooHot",state="firing"}'] == "1.0"
    assert samples['healer_findings{rule="XidFatal",state="firing"}'] == "1.0"
    assert samples['healer_actions_total{kind="cordon",result="dry_run"}'] == "1.0"
    assert float(samples["healer_last_tick_timestamp_seconds"]) == (NOW - timedelta(seconds=20)).timestamp()


@pytest.mark.prometheus
def test_node_chart_from_a_real_prometheus(session_factory: sessionmaker[Session]) -> None:
    """The chart is drawn from range-query data: one line per GPU in each panel."""
    with dcgm_exporter("gpu-node-07", gpus=2) as address, prometheus_server([ScrapeTarget(address)]) as prom:
        prom.wait_for_samples('count_over_time(DCGM_FI_DEV_GPU_TEMP{Hostname="gpu-node-07"}[1m]) >= 3')
        now = datetime.now(UTC)
        with session_factory() as s, s.begin():
            node = repo.get_or_create_node(s, "gpu-node-07", now=now - timedelta(days=1))
            repo.ensure_incident(s, node, now=now - timedelta(seconds=30), summary="hot")
        settings = make_settings()
        source = PrometheusRange(prom.url, timeout_seconds=5)
        app = build_app(session_factory, settings, clock=lambda: datetime.now(UTC), prometheus=source)
        with http_client(app) as c:
            page = c.get("/nodes/gpu-node-07").text
        assert 'data-testid="chart-unavailable"' not in page
        assert page.count('<path class="series"') == 4  # 2 GPUs x (temperature, tensor activity)
        assert re.search(r'<path class="series" d="M[\d.]+,[\d.]+ L[\d.]+,[\d.]+', page)
        assert "GPU 0" in page and "GPU 1" in page


@pytest.mark.prometheus
def test_range_adapter_tells_refused_queries_from_unavailable_sources() -> None:
    with dcgm_exporter("n1") as address, prometheus_server([ScrapeTarget(address)]) as prom:
        source = PrometheusRange(prom.url, timeout_seconds=5)
        end = datetime.now(UTC)
        with pytest.raises(QueryError):
            source.query_range("sum(", start=end - timedelta(minutes=5), end=end, step_seconds=15)
        # A node name with quotes and backslashes stays one label value (no PromQL injection).
        expr = node_selector_expr("DCGM_FI_DEV_GPU_TEMP", 'x"} or vector(1) or {a="\\', ("Hostname", "node"))
        assert source.query_range(expr, start=end - timedelta(minutes=5), end=end, step_seconds=15) == []
    with pytest.raises(SourceUnavailable):
        PrometheusRange("http://127.0.0.1:9", timeout_seconds=1).query_range(
            "up", start=end - timedelta(minutes=5), end=end, step_seconds=15
        )


def test_openapi_and_docs_are_served(session_factory: sessionmaker[Session]) -> None:
    with http_client(build_app(session_factory)) as c:
        assert c.get("/docs").status_code == 200
        spec = c.get("/openapi.json").json()
    assert {"/healthz", "/readyz", "/metrics"} <= set(spec["paths"])


def test_rules_without_a_rule_set_come_from_recorded_evaluations(
    session_factory: sessionmaker[Session],
) -> None:
    seed(session_factory)
    with http_client(build_app(session_factory, ruleset_provider=lambda: None)) as c:
        body = c.get("/api/v1/rules").json()
        page = c.get("/rules").text
    assert body["loaded"] is False
    assert [(r["name"], r["group"], r["health"]) for r in body["rules"]] == [
        ("GpuTooHot", "gpu-thermal", "ok"),
        ("XidFatal", "gpu-thermal", "error"),
    ]
    assert "No rule set loaded in this process" in page


def test_healer_serve_runs_the_dashboard_standalone(migrated_sqlite_url: str) -> None:
    with healer_serve(migrated_sqlite_url, output=subprocess.PIPE) as served:
        rules = httpx.get(f"{served.url}/api/v1/rules", timeout=10).json()
        assert rules["loaded"] is True and len(rules["rules"]) > 5  # the default pack from rules/
        ready = httpx.get(f"{served.url}/readyz", timeout=10)
        assert (ready.status_code, ready.json()["reasons"]) == (200, [])
        assert ready.json()["controller"]["reasons"] == ["no tick recorded yet"]
        served.process.terminate()
        out, err = served.process.communicate(timeout=20)
    assert served.process.returncode == 0, err.decode()  # a clean stop on SIGTERM, as healer run
    # Logs are JSON lines on stderr, as healer run writes them; nothing on stdout.
    assert out == b""
    lines = [json.loads(line) for line in err.decode().splitlines()]
    assert all({"time", "level", "logger", "message"} <= line.keys() for line in lines), lines
    messages = [line["message"] for line in lines]
    assert f"dashboard on {served.url}/ (no controller in this process)" in messages
    assert "Application shutdown complete." in messages


def test_a_database_without_schema_says_to_upgrade_it(tmp_path: Path) -> None:
    """A fresh database file (``healer serve`` before ``healer db upgrade``) is reachable but
    empty: /readyz names the command that fixes it, not an OperationalError."""
    engine = make_engine(f"sqlite:///{tmp_path / 'healer.db'}")
    try:
        with http_client(build_app(make_sessionmaker(engine))) as c:
            ready = c.get("/readyz")
    finally:
        engine.dispose()
    assert ready.status_code == 503
    assert ready.json()["reasons"] == ["database has no healer schema: run `healer db upgrade`"]
