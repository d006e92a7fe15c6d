"""The rule's node pool: which nodes a rule's budget and breaker count over, and the floor for tiny
pools. Pure: coverage and node labels are data, as the controller hands them in."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from healer.engine import pools as engine_pools
from healer.engine.lifecycle import StepKind
from healer.engine.safety import PoolUsage, Refusal, Request, SafetyState, breaker, judge
from healer.model.limits import SafetyLimits
from healer.model.node import NO_GPU_POOL
from healer.ruleset.inputs import family, input_metrics
from healer.ruleset.schema import RuleSet

NOW = datetime(2025, 3, 4, 12, 0, tzinfo=UTC)


def ruleset(*rules: dict[str, object], group_pool: dict[str, object] | None = None) -> RuleSet:
    group: dict[str, object] = {"name": "g", "rules": list(rules)}
    if group_pool is not None:
        group["pool"] = group_pool
    return RuleSet.model_validate({"groups": [group]})


GPU_TEMP = {
    "name": "GpuTooHot",
    "expr": "max by (Hostname, gpu) (DCGM_FI_DEV_GPU_TEMP) > 78",
    "actions": ["quarantine"],
}
IB_DOWN = {
    "name": "IbPortDown",
    "expr": "node_infiniband_port_state != 5 or rate(node_infiniband_link_downed_total[5m]) > 0",
    "actions": ["quarantine"],
}
NOTIFY = {"name": "Hot", "expr": "DCGM_FI_DEV_GPU_TEMP > 70", "actions": ["notify"]}

#: 100 GPU nodes (20 with InfiniBand) and 50 CPU nodes.
LABELLED = {**{f"gpu-{i}": "default" for i in range(100)}, **{f"cpu-{i}": NO_GPU_POOL for i in range(50)}}
IB_NODES = frozenset(f"gpu-{i}" for i in range(20))
GPU_NODES = frozenset(f"gpu-{i}" for i in range(100))
COVERAGE = {"GpuTooHot": GPU_NODES, "IbPortDown": IB_NODES}


# -- input metrics -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "metrics"),
    [
        ("max by (Hostname, gpu) (DCGM_FI_DEV_GPU_TEMP) > 78", {"DCGM_FI_DEV_GPU_TEMP"}),
        (IB_DOWN["expr"], {"node_infiniband_port_state", "node_infiniband_link_downed_total"}),
        ('{__name__="DCGM_FI_DEV_XID_ERRORS", gpu="0"} > 0', {"DCGM_FI_DEV_XID_ERRORS"}),
        ('{__name__=~"a_total|b_total"} > 0', {"a_total", "b_total"}),
        ('{__name__=~"DCGM_.*"} > 0', set()),  # a pattern cannot be listed: the labelled pool stands
        ("increase(DCGM_FI_DEV_XID_ERRORS[10m] offset 1m) > 0", {"DCGM_FI_DEV_XID_ERRORS"}),
        ("not promql (", set()),
    ],
)
def test_input_metrics(expr: str, metrics: set[str]) -> None:
    assert input_metrics(expr) == metrics


def test_a_family_names_the_metrics_prefix() -> None:
    assert family(input_metrics(IB_DOWN["expr"])) == "node_infiniband"
    assert family(frozenset({"DCGM_FI_DEV_GPU_TEMP"})) == "DCGM_FI_DEV_GPU_TEMP"


# -- pools -----------------------------------------------------------------------------------------


def test_a_rule_covering_part_of_a_pool_counts_over_the_nodes_it_covers() -> None:
    rules = ruleset(GPU_TEMP, IB_DOWN, NOTIFY)
    pools = engine_pools.build(
        rules=rules, labelled=LABELLED, coverage={"GpuTooHot": GPU_NODES, "IbPortDown": IB_NODES}
    )
    assert pools.pool_for("GpuTooHot", "gpu-3") == "default"  # it covers all of it: the labelled name
    assert pools.pool_for("IbPortDown", "gpu-3") == "default/node_infiniband"
    assert pools.members["default/node_infiniband"] == IB_NODES
    assert pools.kinds["default/node_infiniband"] == engine_pools.COVERAGE
    assert pools.rules["default/node_infiniband"] == ("IbPortDown",)
    assert pools.pools_of("gpu-3", ["GpuTooHot", "IbPortDown"]) == ("default", "default/node_infiniband")
    assert pools.pools_of("gpu-3") == ("default",)  # no rule: its labelled pool
    assert "Hot" not in {r for rs in pools.rules.values() for r in rs}  # notify rules take no node out


def test_coverage_stays_within_the_labelled_pool() -> None:
    """A dcgm rule on a cluster with H100 and A100 pools: each pool is its own denominator."""
    labelled = {
        **{f"h{i}": "h100" for i in range(10)},
        **{f"a{i}": "a100" for i in range(4)},
        "cpu-0": NO_GPU_POOL,
    }
    covered = frozenset(n for n in labelled if n != "cpu-0")
    pools = engine_pools.build(rules=ruleset(GPU_TEMP), labelled=labelled, coverage={"GpuTooHot": covered})
    assert pools.pool_for("GpuTooHot", "h1") == "h100"
    assert len(pools.members["a100"]) == 4


def test_a_node_firing_a_rule_is_covered_by_it() -> None:
    pools = engine_pools.build(
        rules=ruleset(IB_DOWN),
        labelled=LABELLED,
        coverage={"IbPortDown": IB_NODES},
        firing={"IbPortDown": {"gpu-50"}},
    )
    assert "gpu-50" in pools.members[pools.pool_for("IbPortDown", "gpu-50")]


def test_without_coverage_a_rule_counts_over_the_labelled_pool() -> None:
    pools = engine_pools.build(rules=ruleset(IB_DOWN), labelled=LABELLED)
    assert pools.pool_for("IbPortDown", "gpu-3") == "default"
    assert len(pools.members["default"]) == 100


def test_a_pool_named_by_node_labels() -> None:
    spec = {"name": "h100", "node_selector": {"nvidia.com/gpu.product": "H100"}}
    labels = {n: {"nvidia.com/gpu.product": "H100" if n < "gpu-3" else "A100"} for n in LABELLED}
    rules = ruleset({**IB_DOWN, "pool": spec}, GPU_TEMP)
    pools = engine_pools.build(rules=rules, labelled=LABELLED, node_labels=labels)
    assert pools.pool_for("IbPortDown", "gpu-1") == "h100"
    assert pools.members["h100"] == {n for n in LABELLED if labels[n]["nvidia.com/gpu.product"] == "H100"}
    assert pools.kinds["h100"] == engine_pools.SELECTOR
    # the group's pool is every rule's unless it names its own; the name defaults to the rule's
    grouped = ruleset(GPU_TEMP, group_pool={"node_selector": {"nvidia.com/gpu.product": "A100"}})
    pools = engine_pools.build(rules=grouped, labelled=LABELLED, node_labels=labels)
    assert pools.pool_for("GpuTooHot", "gpu-50") == "GpuTooHot"
    # a named pool never widens a labelled pool of the same name
    clash = ruleset({**IB_DOWN, "pool": {**spec, "name": "default"}})
    pools = engine_pools.build(rules=clash, labelled=LABELLED, node_labels=labels)
    assert pools.pool_for("IbPortDown", "gpu-1") == "default/selector"
    assert len(pools.members["default"]) == 100
    # node labels not read: the labelled pool stands in
    assert engine_pools.build(rules=rules, labelled=LABELLED).pool_for("IbPortDown", "gpu-1") == "default"


# -- the breaker over rule pools ---------------------------------------------------------------------


LIMITS = SafetyLimits(max_unhealthy=50, max_unhealthy_percent=50, breaker_nodes=50, breaker_percent=50)


def _breaker(bad: dict[str, tuple[str, ...]], pools: engine_pools.Pools, limits: SafetyLimits = LIMITS):
    at = NOW - timedelta(seconds=30)
    return breaker(
        turned_bad=dict.fromkeys(bad, at),
        fleet_size=len(pools.labelled),
        settings=limits,
        now=NOW,
        members=pools.members,
        bad_in={n: pools.pools_of(n, rules) for n, rules in bad.items()},
    )


def test_most_of_the_infiniband_nodes_going_bad_trips_the_breaker() -> None:
    """15 of the 20 InfiniBand nodes is 75 % of the IB rule's pool, though 15 % of the GPU pool."""
    pools = engine_pools.build(
        rules=ruleset(GPU_TEMP, IB_DOWN),
        labelled=LABELLED,
        coverage={"GpuTooHot": GPU_NODES, "IbPortDown": IB_NODES},
    )
    verdict = _breaker({f"gpu-{i}": ("IbPortDown",) for i in range(15)}, pools)
    assert verdict.trip
    assert (verdict.pool, verdict.count, verdict.fleet_size) == ("default/node_infiniband", 15, 20)
    # over the labelled pool only (no coverage), the same nodes are 15 % of 100: no trip
    flat = engine_pools.build(rules=ruleset(GPU_TEMP, IB_DOWN), labelled=LABELLED)
    assert not _breaker({f"gpu-{i}": ("IbPortDown",) for i in range(15)}, flat).trip


def test_nodes_bad_on_another_rule_do_not_count_in_a_rule_pool() -> None:
    pools = engine_pools.build(
        rules=ruleset(GPU_TEMP, IB_DOWN),
        labelled=LABELLED,
        coverage={"GpuTooHot": GPU_NODES, "IbPortDown": IB_NODES},
    )
    verdict = _breaker({f"gpu-{i}": ("GpuTooHot",) for i in range(15)}, pools)
    assert not verdict.trip and verdict.pool == "default" and verdict.fleet_size == 100


# -- the budget over rule pools ----------------------------------------------------------------------


def _state(pools: engine_pools.Pools, out: set[str], limits: SafetyLimits) -> SafetyState:
    return SafetyState(settings=limits, now=NOW, members=pools.members, out_nodes=frozenset(out))


def test_a_quarantine_must_fit_every_pool_it_counts_in() -> None:
    limits = SafetyLimits(max_unhealthy=10, max_unhealthy_percent=10)  # IB pool of 20: 2; GPU pool: 10
    pools = engine_pools.build(
        rules=ruleset(GPU_TEMP, IB_DOWN),
        labelled=LABELLED,
        coverage={"GpuTooHot": GPU_NODES, "IbPortDown": IB_NODES},
    )
    state = _state(pools, {"gpu-0"}, limits)
    req = Request("gpu-1", StepKind.QUARANTINE, pools=pools.pools_of("gpu-1", ["IbPortDown"]))
    decision, state = judge(req, state)
    assert decision.approved
    # the approval counts in-flight in every pool holding gpu-1
    assert state.usage("default/node_infiniband").out == 2 and state.usage("default").out == 2
    third = Request("gpu-2", StepKind.QUARANTINE, pools=pools.pools_of("gpu-2", ["GpuTooHot", "IbPortDown"]))
    decision, _ = judge(third, state)
    assert decision.reason == Refusal.BUDGET
    assert decision.message.startswith(
        "pool default/node_infiniband: 2 of 20 node(s) out of service, budget 2"
    )
    # a GPU-only fault on a node without InfiniBand still fits the GPU pool's budget
    gpu_only = Request("gpu-50", StepKind.QUARANTINE, pools=pools.pools_of("gpu-50", ["GpuTooHot"]))
    assert judge(gpu_only, state)[0].approved


# -- the floor for tiny pools ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "limits", "expected"),
    [
        (4, SafetyLimits(max_unhealthy=2, max_unhealthy_percent=10), 1),  # 10 % of 4 is 0: the floor
        (1, SafetyLimits(max_unhealthy=2, max_unhealthy_percent=10), 1),  # a one-node pool may fix its node
        (9, SafetyLimits(max_unhealthy=2, max_unhealthy_percent=10, budget_floor_nodes=0), 0),  # no floor
        (4, SafetyLimits(max_unhealthy=0, max_unhealthy_percent=10), 0),  # max_unhealthy 0 still means none
        (0, SafetyLimits(), 0),
        (30, SafetyLimits(max_unhealthy=2, max_unhealthy_percent=10), 2),  # big pools: the caps as before
        (8, SafetyLimits(max_unhealthy=5, max_unhealthy_percent=10, budget_floor_nodes=2), 2),
    ],
)
def test_the_budget_floor(size: int, limits: SafetyLimits, expected: int) -> None:
    assert PoolUsage(size=size).limit(limits) == expected


def test_a_tiny_pool_takes_one_node_out_but_not_two() -> None:
    limits = SafetyLimits(max_unhealthy=2, max_unhealthy_percent=10)
    state = SafetyState(settings=limits, now=NOW, members={"small": frozenset({"a", "b", "c", "d"})})
    first, state = judge(Request("a", StepKind.QUARANTINE, pools=("small",)), state)
    second, _ = judge(Request("b", StepKind.QUARANTINE, pools=("small",)), state)
    assert first.approved
    assert second.reason == Refusal.BUDGET and "budget 1" in second.message


def test_the_breaker_never_trips_by_percentage_below_its_floor() -> None:
    """A pool of 2 with both nodes bad is 100 %, but under breaker_min_nodes (3): no trip."""
    limits = SafetyLimits(breaker_nodes=5, breaker_percent=20, breaker_min_nodes=3)
    members = {"pair": frozenset({"a", "b"})}
    verdict = breaker(
        turned_bad=dict.fromkeys(["a", "b"], NOW),
        fleet_size=2,
        settings=limits,
        now=NOW,
        members=members,
        bad_in={"a": ("pair",), "b": ("pair",)},
    )
    assert not verdict.trip and verdict.percent == 100.0
