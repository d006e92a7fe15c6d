"""A rule whose series name no node is "degraded" where an operator looks: the Rules page (with the
count and an example instance), ``/api/v1/rules`` and ``/metrics``, never a silent "ok".

Detection runs as the tick runs it (``run_detection`` recording into the database, the address book
read once), the metrics are set as the tick sets them, and the dashboard is served by uvicorn.
"""

from __future__ import annotations

import html
import re

from sqlalchemy.orm import Session, sessionmaker

from healer.detection import run_detection
from healer.engine.evaluation import EvaluationState, QueryResult, Sample
from healer.metrics import HealerMetrics
from healer.model.addresses import AddressBook, build_address_book
from healer.model.findings import UnresolvedSeries
from healer.ruleset.schema import Rule, RuleGroup, RuleSet
from healer.sources.base import Deadline
from tests.integration.test_api_support import NOW, build_app, http_client

RULE = Rule.model_validate(
    {
        "name": "InfinibandPortNotActive",
        "expr": "max by (node, instance, device, port) (node_infiniband_state_id) != 4",
        "node_labels": ["node"],
        "annotations": {"summary": "port down"},
    }
)
RULESET = RuleSet(groups=(RuleGroup(name="infiniband", rules=[RULE]),))


class Source:
    """Answers the rule's query with three node_exporter series that carry only ``instance``."""

    tick_deadline_seconds = 5.0

    def query(self, expr: str, *, at: object, deadline: Deadline | None = None) -> QueryResult:
        return QueryResult(
            samples=[
                Sample({"instance": inst, "device": "mlx5_0", "port": "1"}, 1.0)
                for inst in ("10.0.0.1:9100", "10.9.9.9:9100", "10.9.9.8:9100")
            ]
        )


def test_unresolved_series_degrade_the_rule_on_the_dashboard_and_in_metrics(
    session_factory: sessionmaker[Session],
) -> None:
    reads: list[AddressBook] = []

    def addresses() -> AddressBook:
        reads.append(build_address_book(nodes=[("gpu-a", ["10.0.0.1"])], pods=[]))
        return reads[-1]

    result = run_detection(
        ruleset=RULESET,
        source=Source(),  # type: ignore[arg-type]
        session_factory=session_factory,
        state=EvaluationState(),
        now=NOW,
        addresses=addresses,
    )
    assert len(reads) == 1  # once per tick
    assert list(result.findings.firing) == ["gpu-a"]
    metrics = HealerMetrics()
    for report in result.reports:  # as Controller.tick does
        metrics.set_rule_health(report.rule, str(report.health), evaluated_at_unix=NOW.timestamp())
        metrics.set_unresolved(report.rule, report.unresolved)

    with http_client(build_app(session_factory, metrics=metrics, ruleset_provider=lambda: RULESET)) as c:
        page = c.get("/rules")
        rules = c.get("/api/v1/rules").json()["rules"]
        exposition = c.get("/metrics").text

    row = re.search(r'<tr>\s*<td><a href="/\?rule=InfinibandPortNotActive">.*?</tr>', page.text, re.S)
    assert row is not None
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", row.group(0))).split())
    assert '<span class="health health-degraded">degraded</span>' in row.group(0)
    assert "2 series without a node label (tried node, then the instance address: no Node address" in text
    assert "'instance': '10.9.9.9:9100'" in text
    (rule,) = rules
    assert rule["health"] == "degraded" and "2 series without a node label" in rule["last_error"]

    samples = dict(re.findall(r"^(\S+) (\S+)$", exposition, flags=re.M))
    assert samples['healer_rule_health{health="degraded",rule="InfinibandPortNotActive"}'] == "1.0"
    assert samples['healer_rule_health{health="ok",rule="InfinibandPortNotActive"}'] == "0.0"
    unresolved = (
        'healer_rule_unresolved_series{example_instance="10.9.9.9:9100",rule="InfinibandPortNotActive"}'
    )
    assert samples[unresolved] == "2.0"


def test_the_unresolved_gauge_follows_the_example_and_clears() -> None:
    metrics = HealerMetrics()
    metrics.set_unresolved("R", UnresolvedSeries("R", 2, ("node",), {"instance": "10.9.9.9:9100"}))
    metrics.set_unresolved("R", UnresolvedSeries("R", 1, ("node",), {"instance": "10.9.9.8:9100"}))
    metrics.set_unresolved("R", None)
    text = metrics.exposition().decode()
    assert 'healer_rule_unresolved_series{example_instance="",rule="R"} 0.0' in text
    assert "10.9.9.9" not in text and "10.9.9.8" not in text
