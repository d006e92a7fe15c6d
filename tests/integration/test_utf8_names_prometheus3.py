"""UTF-8 metric and label names, which Prometheus 3 accepts (its migration guide: every UTF-8
string is a valid name, quoted in PromQL: ``{"gpu.temp", "a.label"="x"}``), through healer.

A real Prometheus 3 scrapes an exporter whose series have a dotted metric name, a dotted label name
and non-ASCII label values (one with HTML in it). A healer rule selecting them with the quoted
syntax is evaluated in query mode and recorded; the finding keeps every label as Prometheus
returned it, and the dashboard (HTML pages and the JSON API over real uvicorn) shows them escaped,
without error.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from healer.detection import DetectionResult, initial_state, run_detection
from healer.model.states import RuleHealth
from healer.ruleset.schema import Rule, RuleGroup, RuleSet
from healer.sources.prometheus import PrometheusSource
from tests.integration.test_api_support import build_app, http_client
from tests.prometheus_releases import PrometheusRelease
from tests.services import PrometheusServer, ScrapeTarget, text_exporter, wait_until

pytestmark = pytest.mark.prometheus

METRIC = "gpu.temperature.celsius"
RACK = "topology.example.com/rack"
HOT_NODE, COOL_NODE = "gpu-node-07", "gpu-node-08"
HOT_RACK = 'Zürich-Δ1 <b>"hall"</b>'
COOL_RACK = "Genève-β2"
#: Prometheus 3's text format with quoted names (what an exporter on client_golang's UTF-8
#: escaping scheme serves).
_QUOTED_HOT_RACK = HOT_RACK.replace('"', '\\"')
EXPOSITION = f"""# TYPE "{METRIC}" gauge
{{"{METRIC}",Hostname="{HOT_NODE}",gpu="3","{RACK}"="{_QUOTED_HOT_RACK}"}} 91
{{"{METRIC}",Hostname="{COOL_NODE}",gpu="0","{RACK}"="{COOL_RACK}"}} 40
"""
RULE = Rule.model_validate(
    {
        "name": "GpuTooHotUtf8",
        "expr": f'{{"{METRIC}", "{RACK}"=~".+"}} > 80',
        "severity": "critical",
        "unit": "°C",
        "annotations": {"summary": "GPU {{ $labels.gpu }} at {{ $value }} °C"},
        "actions": ["quarantine"],
    }
)
RULESET = RuleSet(groups=(RuleGroup(name="utf8", interval=30, rules=[RULE]),))


@dataclass
class Evaluated:
    result: DetectionResult
    factory: sessionmaker[Session]


@pytest.fixture(scope="module")
def prometheus(prometheus3: PrometheusRelease) -> Iterator[PrometheusServer]:
    """Prometheus 3 scraping the exporter of :data:`EXPOSITION`, once it holds its series."""
    with text_exporter(lambda: EXPOSITION) as address, prometheus3.server([ScrapeTarget(address)]) as prom:
        wait_until(lambda: prom.query(f'{{"{METRIC}"}}'), timeout=30, what=f"{METRIC} scraped")
        yield prom


@pytest.fixture
def evaluated(prometheus: PrometheusServer, session_factory: sessionmaker[Session]) -> Evaluated:
    """One healer tick of :data:`RULESET` in query mode, recorded into ``session_factory``'s database."""
    with PrometheusSource(prometheus.url, timeout_seconds=10) as source:
        result = run_detection(
            ruleset=RULESET,
            source=source,
            session_factory=session_factory,
            state=initial_state(session_factory),
            now=datetime.now(UTC),
        )
    return Evaluated(result=result, factory=session_factory)


def test_a_rule_on_utf8_names_finds_the_node_and_keeps_its_labels(evaluated: Evaluated) -> None:
    result = evaluated.result
    (report,) = result.reports
    assert (report.health, report.error) == (RuleHealth.OK, None)
    found = [f for fs in (*result.findings.firing.values(), *result.findings.pending.values()) for f in fs]
    assert [(f.node, f.gpu, f.value) for f in found] == [(HOT_NODE, "3", 91.0)]
    (hot,) = found
    assert hot.labels[RACK] == HOT_RACK  # the dotted name and the value, byte for byte
    assert hot.summary == "GPU 3 at 91 °C"


def test_the_dashboard_shows_utf8_labels_escaped(evaluated: Evaluated) -> None:
    app = build_app(evaluated.factory, ruleset_provider=lambda: RULESET)
    with http_client(app) as client:
        node = client.get(f"/nodes/{HOT_NODE}")
        assert node.status_code == 200, node.text
        assert "<b>" not in node.text  # the label value's HTML is text
        shown = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", node.text)).split())
        assert f'{RACK}="{HOT_RACK}"' in shown
        assert "GpuTooHotUtf8" in shown
        for page in ("/", "/rules", "/audit"):
            answer = client.get(page)
            assert answer.status_code == 200, (page, answer.text)
            assert "<b>" not in answer.text, page
        # The rule's quoted names are shown as written (Jinja escapes `"` as &#34;).
        assert html.escape(RULE.expr, quote=True).replace("&quot;", "&#34;") in client.get("/rules").text
        findings = client.get("/api/v1/findings").json()
        (row,) = [f for f in findings["items"] if f["rule"] == "GpuTooHotUtf8"]
        assert row["labels"][RACK] == HOT_RACK
        assert httpx.codes.is_success(client.get(f"/api/v1/nodes/{HOT_NODE}").status_code)
