"""Which node a series names (healer.model.addresses): its node label checked against the cluster's
Nodes and exporter pods, else its `instance` address; and what evaluation reports when nothing names
a node."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from healer.engine.evaluation import EvaluationState, QueryResult, Sample, evaluate, needs_addresses
from healer.model.addresses import AddressBook, build_address_book, failed_book, instance_host
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


def test_the_book_is_read_only_when_a_rule_returns_series() -> None:
    # A labelled series is checked against the cluster too; a quiet tick reads nothing.
    assert needs_addresses(RULESET, {IB_RULE.name: QueryResult(samples=[ib("x:1", node="gpu-b")])})
    assert not needs_addresses(RULESET, {IB_RULE.name: QueryResult(samples=[])})


# --- the resolution order: label naming a Node → label naming an exporter pod → instance → unresolved

DCGM_LABELS = ("Hostname", "node")
CLUSTER = build_address_book(
    nodes=[("gpu-a", ["10.0.0.1"]), ("gpu-b", ["10.0.0.2"]), ("dcgm-exporter-clash", [])],
    pods=[("gpu-a", ["10.244.1.7"]), ("gpu-b", ["10.244.2.8"])],
    pod_names=[
        ("dcgm-exporter-wwwjh", "gpu-a"),
        ("dcgm-exporter-q7x2p", "gpu-b"),
        ("dcgm-exporter-clash", "gpu-b"),  # a pod named like a Node: the Node wins
        ("dcgm-exporter-twice", "gpu-a"),  # same name in two namespaces, on two nodes
        ("dcgm-exporter-twice", "gpu-b"),
    ],
)


@pytest.mark.parametrize(
    ("labels", "node", "by"),
    [
        ({"Hostname": "gpu-a", "instance": "10.244.2.8:9400"}, "gpu-a", "label"),  # the label first
        ({"Hostname": "GPU-A"}, "gpu-a", "label"),  # kubelet's node name is the lower-cased hostname
        ({"Hostname": "dcgm-exporter-wwwjh", "instance": "10.0.0.2:9400"}, "gpu-a", "pod"),
        ({"Hostname": "dcgm-exporter-wwwjh", "node": "gpu-b"}, "gpu-b", "label"),  # a Node by any label
        ({"Hostname": "dcgm-exporter-clash"}, "dcgm-exporter-clash", "label"),
        ({"Hostname": "gone-node", "instance": "10.244.2.8:9400"}, "gpu-b", "address"),  # pod IP
        ({"Hostname": "gone-node", "instance": "10.0.0.1:9400"}, "gpu-a", "address"),  # InternalIP
        ({"instance": "gpu-b:9100"}, "gpu-b", "address"),  # no label: the instance as before
        ({"Hostname": "dcgm-exporter-twice", "instance": "10.0.0.9:9400"}, None, None),
        ({"Hostname": "gone-node", "instance": "10.0.0.9:9400"}, None, None),
        ({"Hostname": "gone-node"}, None, None),
    ],
)
def test_resolution_order(labels: dict[str, str], node: str | None, by: str | None) -> None:
    found = CLUSTER.resolve(labels, DCGM_LABELS)
    assert (found.node, found.by) == (node, by)
    assert (found.why is None) == (node is not None)


def test_why_a_labelled_series_names_no_node() -> None:
    why = CLUSTER.resolve({"Hostname": "dcgm-exporter-zzzzz", "instance": "10.0.0.9:9400"}, DCGM_LABELS).why
    assert why == (
        "Hostname 'dcgm-exporter-zzzzz' names no Node and no exporter pod; "
        "instance 10.0.0.9:9400 matches no pod or node address"
    )
    twice = CLUSTER.resolve({"Hostname": "dcgm-exporter-twice"}, DCGM_LABELS).why
    assert twice is not None
    assert "exporter pods on more than one node are named 'dcgm-exporter-twice'" in twice
    assert "the series has no instance label" in twice


def test_a_book_that_cannot_check_takes_the_label_as_it_is() -> None:
    # The cluster could not be read (or the book holds addresses only): the label is all there is.
    for book in (failed_book("HTTP 403"), AddressBook(nodes={"10.0.0.1": "gpu-a"})):
        found = book.resolve({"Hostname": "dcgm-exporter-wwwjh", "instance": "10.0.0.1:1"}, DCGM_LABELS)
        assert (found.node, found.by) == ("dcgm-exporter-wwwjh", "label")
    unlabelled = failed_book("HTTP 403").resolve({"instance": "10.0.0.1:1"}, DCGM_LABELS)
    assert unlabelled.node is None and "could not be read: HTTP 403" in (unlabelled.why or "")


DCGM_RULE = Rule.model_validate(
    {
        "name": "GpuTooHot",
        "expr": "max by (Hostname, gpu, instance) (DCGM_FI_DEV_GPU_TEMP) > 78",
        "node_labels": list(DCGM_LABELS),
        "annotations": {"summary": "hot"},
    }
)
DCGM = RuleSet(groups=(RuleGroup(name="thermal", rules=[DCGM_RULE]),))


def hot(hostname: str, instance: str) -> Sample:
    return Sample(labels={"Hostname": hostname, "gpu": "0", "instance": instance}, value=90.0)


def test_a_pod_named_series_fires_on_the_pods_node_and_a_nameless_one_on_no_node() -> None:
    results = {
        DCGM_RULE.name: QueryResult(
            samples=[
                hot("dcgm-exporter-wwwjh", "10.244.1.7:9400"),
                hot("dcgm-exporter-zzzzz", "10.0.0.9:9400"),
            ]
        )
    }
    ev = evaluate(ruleset=DCGM, results=results, previous=EvaluationState(), now=T0, addresses=CLUSTER)
    assert list(ev.findings.firing) == ["gpu-a"]
    assert [f.node for f in ev.findings.firing["gpu-a"]] == ["gpu-a"]
    # The pod's name stays in the labels (the series key), the finding is the node's.
    assert ev.findings.firing["gpu-a"][0].labels["Hostname"] == "dcgm-exporter-wwwjh"
    assert all(c.finding.node == "gpu-a" for c in ev.changes)  # nothing recorded about another name
    (report,) = ev.reports
    assert (report.health, report.by_pod, report.by_address) == (RuleHealth.DEGRADED, 1, 0)
    assert report.unresolved is not None
    assert str(report.unresolved) == (
        "1 series that name no node (Hostname 'dcgm-exporter-zzzzz' names no Node and no exporter "
        "pod; instance 10.0.0.9:9400 matches no pod or node address), e.g. "
        "{'Hostname': 'dcgm-exporter-zzzzz', 'gpu': '0', 'instance': '10.0.0.9:9400'}"
    )
    assert ev.findings.unresolved == {DCGM_RULE.name: report.unresolved}


def test_a_finding_whose_node_is_gone_closes_instead_of_moving_to_a_name() -> None:
    # Firing on gpu-a (read before the check); the next tick's book has no such Node or pod.
    results = {DCGM_RULE.name: QueryResult(samples=[hot("gpu-a", "10.0.0.9:9400")])}
    first = evaluate(ruleset=DCGM, results=results, previous=EvaluationState(), now=T0, addresses=CLUSTER)
    assert list(first.findings.firing) == ["gpu-a"]
    gone = build_address_book(nodes=[("gpu-b", ["10.0.0.2"])], pods=[])
    later = evaluate(ruleset=DCGM, results=results, previous=first.state, now=T0, addresses=gone)
    assert not later.findings.firing and not later.findings.pending
    assert later.findings.unresolved[DCGM_RULE.name].count == 1
