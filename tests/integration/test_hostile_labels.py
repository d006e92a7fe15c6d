"""Hostile label values: one series whose labels anyone running a pod can shape must not blind healer.

A real Prometheus scrapes a tiny exporter whose GPU temperature series carry hostile labels
(a superscript ``²`` as the GPU index, an index past any integer column, a ``Hostname`` of 300
characters, NUL bytes) next to one genuinely hot GPU. healer's detection records every tick on
SQLite and PostgreSQL; the dashboard pages, the nodes API and ticket delivery then serve those
rows over real HTTP.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from healer.config import load_settings
from healer.detection import initial_state, run_detection
from healer.metrics import HealerMetrics
from healer.model.states import NodeState
from healer.ruleset.loading import load_ruleset
from healer.ruleset.schema import RuleGroup, RuleSet
from healer.sources.prometheus import PrometheusSource
from healer.store import nodes as repo
from healer.store.models import Finding, Gpu, Node, RuleEvaluation
from healer.tickets.delivery import deliver_due
from healer.tickets.outbox import request_ticket
from healer_dev.provider import Receiver
from tests.integration.test_api_support import build_app, http_client
from tests.services import PrometheusServer, ScrapeTarget, prometheus_server, text_exporter

pytestmark = pytest.mark.prometheus

REPO = Path(__file__).resolve().parents[2]
GOOD = "gpu-node-ok"
LONG = "n" * 300
NUL = "gpu-node-\x00nul"
HOSTILE_SERIES = [
    # (Hostname, gpu, UUID, modelName)
    ("gpu-node-super", "²", "GPU-11111111-2222-3333-4444-555555555555", "H100"),
    ("gpu-node-huge", "9" * 40, "GPU-22222222-2222-3333-4444-555555555555", "H100"),
    (LONG, "1", "GPU-33333333-2222-3333-4444-555555555555", "H100"),
    (NUL, "2", "GPU-44444444-2222-3333-4444-555555555555", "H100\x00evil"),
    ("gpu-node-model", "4", "GPU-55555555-2222-3333-4444-555555555555", "m" * 5000),
]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def exposition() -> str:
    lines = ["# TYPE DCGM_FI_DEV_GPU_TEMP gauge"]
    rows = [(GOOD, "3", "GPU-00000000-2222-3333-4444-555555555555", "H100"), *HOSTILE_SERIES]
    for host, gpu, uuid, model in rows:
        labels = f'Hostname="{_escape(host)}",gpu="{_escape(gpu)}",UUID="{uuid}",modelName="{_escape(model)}"'
        lines.append(f"DCGM_FI_DEV_GPU_TEMP{{{labels}}} 91")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def prometheus() -> Iterator[PrometheusServer]:
    with text_exporter(exposition) as address, prometheus_server([ScrapeTarget(address)]) as prom:
        prom.wait_for_samples(f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{GOOD}"}}')
        yield prom


def hot_rule() -> RuleSet:
    """The rule pack's GpuTooHot, PromQL unchanged, firing at once."""
    pack = load_ruleset([REPO / "rules" / "gpu-thermal.yaml"])
    rule = next(r for r in pack.rules if r.name == "GpuTooHot")
    return RuleSet(groups=(RuleGroup(name="gpu-thermal", rules=[rule.model_copy(update={"for_": 0.0})]),))


@pytest.fixture
def detected(prometheus: PrometheusServer, session_factory: sessionmaker[Session]) -> list[str]:
    """Two ticks of detection over the hostile series; returns the nodes firing in the last one."""
    source = PrometheusSource(prometheus.url)
    ruleset = hot_rule()
    state = initial_state(session_factory)
    now = datetime.now(UTC)
    firing: list[str] = []
    for tick in range(2):
        result = run_detection(
            ruleset=ruleset,
            source=source,
            session_factory=session_factory,
            state=state,
            now=now + timedelta(seconds=tick),
        )
        state = result.state
        firing = sorted(result.findings.firing)
    return firing


def test_one_hostile_series_never_blinds_detection(
    detected: list[str], session_factory: sessionmaker[Session], caplog: pytest.LogCaptureFixture
) -> None:
    assert GOOD in detected
    with session_factory() as s:
        rows = s.scalars(select(Finding)).all()
        nodes = {n.name for n in s.scalars(select(Node))}
        gpus = {g.uuid: g.index for g in s.scalars(select(Gpu))}
        report = s.scalars(select(RuleEvaluation).order_by(RuleEvaluation.id.desc())).first()
    # every series counts: six series, six episodes, one per node
    assert len(rows) == 6 and len({r.node_name for r in rows}) == 6
    assert GOOD in nodes and "gpu-node-super" in nodes and "gpu-node-huge" in nodes
    long_name = next(n for n in nodes if n.startswith("nnnn"))
    assert len(long_name) <= 253
    nul_name = next(n for n in nodes if n.startswith("gpu-node-") and "nul" in n)
    assert "\x00" not in nul_name
    # a GPU index that is not a small decimal number is no index; the GPU is still known
    assert gpus["GPU-00000000-2222-3333-4444-555555555555"] == 3
    assert "GPU-11111111-2222-3333-4444-555555555555" not in gpus
    assert "GPU-22222222-2222-3333-4444-555555555555" not in gpus
    # the cleaning is reported on the rule
    assert report is not None and report.health == "ok"
    assert any("cleaned" in w for w in report.warnings or []), report.warnings


def test_cleaned_series_are_logged_and_counted(
    prometheus: PrometheusServer, session_factory: sessionmaker[Session], caplog: pytest.LogCaptureFixture
) -> None:
    source = PrometheusSource(prometheus.url)
    metrics = HealerMetrics()
    with caplog.at_level(logging.WARNING, logger="healer"):
        result = run_detection(
            ruleset=hot_rule(),
            source=source,
            session_factory=session_factory,
            state=initial_state(session_factory),
            now=datetime.now(UTC),
        )
        for report in result.reports:
            metrics.count_cleaned(report.rule, report.cleaned)
    assert "GpuTooHot" in caplog.text and "cleaned" in caplog.text
    assert (
        metrics.registry.get_sample_value("healer_label_values_cleaned_total", {"rule": "GpuTooHot"}) == 2
    )  # the NUL and the long name


def test_pages_and_api_serve_hostile_nodes(
    detected: list[str], session_factory: sessionmaker[Session]
) -> None:
    with session_factory() as s:
        names = [n.name for n in s.scalars(select(Node))]
    with http_client(build_app(session_factory)) as client:
        assert client.get("/").status_code == 200
        for query in ("", "?sort=name", "?sort=since", "?unhealthy=true"):
            r = client.get(f"/api/v1/nodes{query}")
            assert r.status_code == 200, r.text
        for name in names:
            path = quote(name, safe="")
            page = client.get(f"/nodes/{path}")
            assert page.status_code == 200, (name, page.text[:500])
            detail = client.get(f"/api/v1/nodes/{path}")
            assert detail.status_code == 200, (name, detail.text[:500])


def test_ticket_delivery_with_hostile_labels(
    detected: list[str], session_factory: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    from healer.store.evaluations import finding_from_row

    monkeypatch.setenv("HOSTILE_SECRET", "s3cret-0123456789abcdef")
    now = datetime.now(UTC)
    with session_factory() as s, s.begin():
        for row in s.scalars(select(Finding)):
            node = repo.get_or_create_node(s, row.node_name, now=now)
            repo.transition(s, node, NodeState.QUARANTINED, now=now, actor="healer", reason="test")
            incident = repo.ensure_incident(s, node, now=now, summary="hot")
            request_ticket(
                s,
                incident=incident,
                node=node,
                provider="acme",
                template=None,
                findings=[finding_from_row(row)],
                now=now,
            )
    with Receiver(secret=b"s3cret-0123456789abcdef") as rcv, httpx.Client() as http:
        settings = load_settings(
            tickets={"providers": [{"name": "acme", "url": rcv.url, "secret_env": "HOSTILE_SECRET"}]}
        )
        report = deliver_due(session_factory=session_factory, settings=settings, now=now, client=http)
        assert report.delivered == 6, report
        assert len(rcv.requests) == 6
