"""Series without a node label, named by their `instance` address (healer.model.addresses), and
what evaluation reports when the address names no node."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from healer.engine.evaluation import EvaluationState, QueryResult, Sample, evaluate, needs_addresses
from healer.model.addresses import build_address_book, failed_book, instance_host
from healer.model.states import RuleHealth
from healer.ruleset.schema import Rule, RuleGroup, RuleSet

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("instance", "host"),
    [
        ("10.0.0.5:9100", "10.0.0.5"),
        ("10.0.0.5", "10.0.0.5"),
        ("[fd00::0:1]:9100", "fd00::1"),
        ("fd00:0::1", "fd00::1"),
        ("Gpu-N3:9100", "gpu-n3"),
        ("gpu-n3", "gpu-n3"),
        ("[broken:9100", "[broken:9100"),
    ],
)
def test_instance_host(instance: str, host: str) -> None:
    assert instance_host(instance) == host


BOOK = build_address_book(
    nodes=[("gpu-a", ["10.0.0.1", "gpu-a.example"]), ("gpu-b", ["10.0.0.2"]), ("gpu-c", ["10.0.0.3"])],
    pods=[
        ("gpu-a", ["10.244.1.7", "fd00::7"]),  # node-exporter pod on its pod network (dual stack)
        ("gpu-b", ["10.0.0.2"]),  # hostNetwork: the node's own IP, no conflict
        ("gpu-c", ["10.244.9.9"]),  # a pod IP still listed for gpu-c ...
        ("gpu-b", ["10.244.9.9"]),  # ... and reused on gpu-b: names no node
    ],
)


@pytest.mark.parametrize(
    ("instance", "node"),
    [
        ("10.0.0.1:9100", "gpu-a"),  # InternalIP
        ("gpu-a.example:9100", "gpu-a"),  # Hostname address
        ("gpu-c:9100", "gpu-c"),  # the node's name
        ("10.244.1.7:9100", "gpu-a"),  # pod IP → spec.nodeName
        ("[fd00::7]:9100", "gpu-a"),
        ("10.0.0.2:9100", "gpu-b"),
        ("10.244.9.9:9100", None),  # ambiguous
        ("10.9.9.9:9100", None),
        (None, None),
    ],
)
def test_address_book_names_the_node(instance: str | None, node: str | None) -> None:
    assert BOOK.node_for(instance) == node


def test_why_an_address_names_no_node() -> None:
    assert "more than one node" in BOOK.why_not("10.244.9.9:9100")
    assert "no exporter pod IP is 10.9.9.9" in BOOK.why_not("10.9.9.9:9100")
    assert "no instance label" in BOOK.why_not(None)
    assert "could not be read: HTTP 403" in failed_book("HTTP 403").why_not("10.0.0.1:9100")


IB_RULE = Rule.model_validate(
    {
        "name": "InfinibandPortNotActive",
        "expr": "max by (node, instance, device, port) (node_infiniband_state_id) != 4",
        "node_labels": ["node"],
        "annotations": {"summary": "port down"},
    }
)
RULESET = RuleSet(groups=(RuleGroup(name="ib", rules=[IB_RULE]),))


def ib(instance: str, *, node: str | None = None) -> Sample:
    labels = {"instance": instance, "device": "mlx5_0", "port": "1"}
    return Sample(labels=labels | ({"node": node} if node else {}), value=1.0)


def test_a_series_with_only_instance_fires_on_its_node() -> None:
    results = {IB_RULE.name: QueryResult(samples=[ib("10.244.1.7:9100"), ib("x:1", node="gpu-b")])}
    assert needs_addresses(RULESET, results)
    ev = evaluate(ruleset=RULESET, results=results, previous=EvaluationState(), now=T0, addresses=BOOK)
    assert sorted(ev.findings.firing) == ["gpu-a", "gpu-b"]
    (report,) = ev.reports
    assert (report.health, report.by_address, report.unresolved) == (RuleHealth.OK, 1, None)


def test_a_series_whose_address_names_no_node_degrades_the_rule() -> None:
    results = {
        IB_RULE.name: QueryResult(samples=[ib("10.0.0.1:9100"), ib("10.9.9.9:9100"), ib("10.8.8.8:9100")])
    }
    ev = evaluate(ruleset=RULESET, results=results, previous=EvaluationState(), now=T0, addresses=BOOK)
    assert list(ev.findings.firing) == ["gpu-a"]
    (report,) = ev.reports
    assert report.health == RuleHealth.DEGRADED
    assert report.unresolved is not None
    assert (report.unresolved.count, report.unresolved.example_instance) == (2, "10.9.9.9:9100")
    assert "then the instance address: no Node address" in str(report.unresolved)


def test_no_lookup_when_every_series_has_a_node_label() -> None:
    results = {IB_RULE.name: QueryResult(samples=[ib("x:1", node="gpu-b")])}
    assert not needs_addresses(RULESET, results)
