"""Correlation (healer.engine.correlation): k of n nodes of one domain within a window are one
domain fault; time as a parameter, no I/O."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from healer.engine.correlation import (
    DomainKey,
    OpenDomain,
    Threshold,
    collapse,
    correlate,
)
from healer.engine.lifecycle import StepKind
from healer.engine.safety import Request, SafetyState, judge
from healer.model.limits import SafetyLimits

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
LEAF = Threshold(min_nodes=3, min_percent=10, window_seconds=300)
RACK = Threshold(min_nodes=3, min_percent=25, window_seconds=300)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def fleet(leaves: int = 2, per_leaf: int = 64, per_rack: int = 16) -> dict[str, dict[str, str]]:
    """``leaves`` leaf switches of ``per_leaf`` nodes; racks of ``per_rack`` nodes, numbered across."""
    out = {}
    for i in range(leaves * per_leaf):
        out[f"n{i:03d}"] = {"ib_leaf": f"leaf-{i // per_leaf}", "rack": f"r{i // per_rack}"}
    return out


def bad(nodes: dict[str, float], rule: str = "GpuTooHot") -> dict[str, list[tuple[str, datetime]]]:
    return {n: [(rule, ago(s))] for n, s in nodes.items()}


def run(found: dict[str, list[tuple[str, datetime]]], **kw: object):  # type: ignore[no-untyped-def]
    kw.setdefault("topology", fleet())
    kw.setdefault("thresholds", {"ib_leaf": LEAF, "rack": RACK})
    kw.setdefault("kind_order", ("rack", "ib_leaf"))
    return correlate(findings=found, now=NOW, **kw)  # type: ignore[arg-type]


def test_sixteen_of_sixty_four_on_one_leaf_within_a_minute_are_one_leaf_fault() -> None:
    # n000..n063 are leaf-0; 16 spread over leaf-0's four racks (4 per rack: 25 % of each rack)
    storm = {f"n{i:03d}": float(i) for i in range(0, 64, 4)}
    result = run(bad(storm))
    [fault] = result.faults
    assert fault.key == DomainKey("ib_leaf", "leaf-0")
    assert (fault.size, len(fault.nodes), fault.opened) == (64, 16, True)
    assert fault.first_seen == ago(60)  # n060, the earliest
    assert set(result.absorbed) == set(storm)
    assert set(result.absorbed.values()) == {DomainKey("ib_leaf", "leaf-0")}


def test_one_node_bad_in_a_domain_stays_a_node_fault() -> None:
    assert run(bad({"n005": 10})).faults == ()


def test_two_unrelated_nodes_in_two_domains_at_once_stay_two_node_faults() -> None:
    result = run(bad({"n005": 10, "n100": 10}))
    assert (result.faults, dict(result.absorbed)) == ((), {})


@pytest.mark.parametrize(
    ("times", "faulty"),
    [
        ([0, 100, 299], True),  # all within the 300 s window
        ([0, 100, 301], False),  # the first one is too old: a slow trickle, not a storm
        ([0, 0], False),  # 2 < min_nodes 3
        ([0, 0, 0], True),
    ],
)
def test_the_window_and_min_nodes(times: list[float], faulty: bool) -> None:
    found = bad({f"n{i:03d}": t for i, t in enumerate(times)})
    assert bool(run(found, thresholds={"ib_leaf": Threshold(3, 0, 300)}).faults) is faulty


def test_nodes_spread_wider_than_the_window_count_only_the_densest_span() -> None:
    # 3 within 300 s of each other, and 2 older ones that are not (but still within 300 s of now? no)
    found = bad({"n000": 290, "n001": 280, "n002": 5, "n003": 4, "n004": 3})
    [fault] = run(found, thresholds={"ib_leaf": Threshold(3, 0, 300)}).faults
    assert fault.nodes == ("n000", "n001", "n002", "n003", "n004")  # all five fit in 287 s
    tight = run(found, thresholds={"ib_leaf": Threshold(3, 0, 100)}).faults
    assert [f.nodes for f in tight] == [("n002", "n003", "n004")]


def test_the_percentage_of_the_domain() -> None:
    # 3 of 64 is 4.7 %: under a 10 % threshold, 7 of 64 is 10.9 %: over
    assert run(bad({f"n{i:03d}": 0 for i in range(3)}), thresholds={"ib_leaf": LEAF}).faults == ()
    ceil_ = Threshold(3, 10, 300).needed(64)
    assert ceil_ == 7
    assert run(bad({f"n{i:03d}": 0 for i in range(6)}), thresholds={"ib_leaf": LEAF}).faults == ()
    assert run(bad({f"n{i:03d}": 0 for i in range(7)}), thresholds={"ib_leaf": LEAF}).faults != ()


def test_a_threshold_never_makes_one_node_a_domain_fault() -> None:
    assert Threshold(min_nodes=2, min_percent=0, window_seconds=60).needed(1) == 2


def test_a_kind_counts_only_its_rules() -> None:
    leaf = Threshold(3, 0, 300, rules=frozenset({"InfinibandLinkDowned"}))
    found = bad({f"n{i:03d}": 0 for i in range(3)})
    assert run(found, thresholds={"ib_leaf": leaf}).faults == ()
    ib = bad({f"n{i:03d}": 0 for i in range(3)}, rule="InfinibandLinkDowned")
    assert len(run(ib, thresholds={"ib_leaf": leaf}).faults) == 1


def test_a_kind_without_a_threshold_is_not_correlated() -> None:
    storm = bad({f"n{i:03d}": 0 for i in range(16)})
    assert run(storm, thresholds={}).faults == ()


def test_overlapping_domains_the_one_explaining_most_nodes_wins_and_the_others_keep_what_is_left() -> None:
    # 16 bad on leaf-0 spread over 4 racks (4 each): every rack qualifies (25 %), the leaf explains 16
    storm = bad({f"n{i:03d}": 0 for i in range(0, 64, 4)})
    result = run(storm)
    assert [f.key for f in result.faults] == [DomainKey("ib_leaf", "leaf-0")]


def test_a_whole_rack_in_a_leaf_is_the_rack_when_the_leaf_is_under_its_threshold() -> None:
    leaf = Threshold(min_nodes=3, min_percent=50, window_seconds=300)  # 32 of 64 needed
    rack0 = bad({f"n{i:03d}": 0 for i in range(16)})
    [fault] = run(rack0, thresholds={"ib_leaf": leaf, "rack": RACK}).faults
    assert fault.key == DomainKey("rack", "r0")


def test_equal_candidates_prefer_the_smaller_domain_then_the_kind_order() -> None:
    topology = {f"n{i}": {"rack": "r0", "ib_leaf": "leaf-0"} for i in range(4)}
    topology.update({f"m{i}": {"ib_leaf": "leaf-0"} for i in range(4)})
    found = bad({f"n{i}": 0 for i in range(4)})
    either = Threshold(3, 0, 300)
    [fault] = run(found, topology=topology, thresholds={"ib_leaf": either, "rack": either}).faults
    assert fault.key == DomainKey("rack", "r0")  # 4 nodes, the leaf has 8
    same = {f"n{i}": {"rack": "r0", "ib_leaf": "leaf-0"} for i in range(4)}
    [fault] = run(
        found, topology=same, thresholds={"ib_leaf": either, "rack": either}, kind_order=("ib_leaf", "rack")
    ).faults
    assert fault.key == DomainKey("ib_leaf", "leaf-0")


def test_an_open_domain_keeps_its_members_and_a_node_that_turns_bad_later_joins_it() -> None:
    key = DomainKey("ib_leaf", "leaf-0")
    opened = OpenDomain(key, frozenset({"n000", "n001", "n002"}), ago(3600))
    # n000 cleared, n010 turned bad an hour after the storm: it joins, not a new incident
    result = run(bad({"n001": 3600, "n010": 5}), already_open=[opened])
    [fault] = result.faults
    assert (fault.key, fault.opened, fault.first_seen) == (key, False, ago(3600))
    assert fault.nodes == ("n000", "n001", "n002", "n010")
    assert result.new == ()


def test_a_node_already_absorbed_by_an_open_domain_is_not_counted_again() -> None:
    key = DomainKey("rack", "r0")
    opened = OpenDomain(key, frozenset({"n000", "n001", "n002"}), ago(60))
    storm = bad({"n000": 60, "n001": 60, "n002": 60, "n020": 1, "n021": 1})
    result = run(storm, already_open=[opened], thresholds={"ib_leaf": Threshold(3, 0, 300), "rack": RACK})
    # leaf-0 would have 5 bad, but 3 are the rack's: the 2 left do not make a leaf fault
    assert [f.key for f in result.faults] == [key]
    assert "n020" not in result.absorbed


def test_nodes_without_a_domain_are_never_absorbed() -> None:
    found = bad({"lonely-1": 0, "lonely-2": 0, "lonely-3": 0})
    assert run(found).faults == ()


def test_the_breaker_counts_a_domain_once() -> None:
    turned = {f"n{i:03d}": ago(i) for i in range(16)} | {"x": ago(1)}
    keys = {f"n{i:03d}": "domain-7" for i in range(16)}
    assert collapse(turned, keys) == {"domain-7": ago(15), "x": ago(1)}


def test_the_budget_counts_a_domain_once() -> None:
    limits = SafetyLimits(max_unhealthy=2, max_unhealthy_percent=100, breaker_nodes=5, breaker_percent=50)
    nodes = frozenset(f"n{i}" for i in range(10))
    state = SafetyState(settings=limits, now=NOW, members={"p": nodes}, domains={})
    for i in range(5):  # five nodes of one domain: one slot
        decision, state = judge(Request(f"n{i}", StepKind.QUARANTINE, "p", domain="domain-1"), state)
        assert decision.approved, decision
    assert state.usage("p").out == 1
    decision, state = judge(Request("n8", StepKind.QUARANTINE, "p"), state)
    assert decision.approved  # the second slot
    decision, state = judge(Request("n9", StepKind.QUARANTINE, "p"), state)
    assert not decision.approved and decision.reason == "budget"
