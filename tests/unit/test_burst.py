"""The burst state machine and the capacity it reads (pure): open on shortage held for `for`, close
on free GPUs held for the hold, flapping toggles nothing, a human's taint change wins."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from healer.actions.burst import pod_facts
from healer.actions.kueue import workload_pending
from healer.engine.burst import step
from healer.engine.capacity import capacity, plan_returns
from healer.model.burst import BurstMemory, BurstState, Capacity, PodFacts, Toleration
from healer.model.node import NodeView
from healer.ruleset.capacity import CapacityRule
from healer.ruleset.loading import load_ruleset, validate_rules

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
RULE = CapacityRule.model_validate(
    {
        "name": "overflow",
        "burst_nodes": {"type": "virtual-kubelet"},
        "open": {"for": "30s"},
        "close": {"hold": "2m"},
    }
)
SHORT = Capacity(free_gpus=0, pending_gpu_pods=2)
FREE = Capacity(free_gpus=8, pending_gpu_pods=0)
BUSY = Capacity(free_gpus=0, pending_gpu_pods=0)  # training uses everything, nothing waits

# (name, starting state, [(seconds from T0, capacity)], toggles expected as (seconds, state))
CASES = [
    ("short held for `for` opens", BurstState.CLOSED, [(0, SHORT), (10, SHORT), (30, SHORT)], [(30, "open")]),
    ("short shorter than `for` does not open", BurstState.CLOSED, [(0, SHORT), (20, SHORT), (25, FREE)], []),
    (
        "flapping demand within `for` toggles nothing",
        BurstState.CLOSED,
        [(t, SHORT if (t // 10) % 2 == 0 else FREE) for t in range(0, 300, 5)],
        [],
    ),
    (
        "free held for the hold closes",
        BurstState.OPEN,
        [(0, FREE), (60, FREE), (120, FREE)],
        [(120, "closed")],
    ),
    (
        "free shorter than the hold does not close",
        BurstState.OPEN,
        [(0, FREE), (100, FREE), (110, SHORT)],
        [],
    ),
    (
        "flapping capacity within the hold toggles nothing",
        BurstState.OPEN,
        [(t, FREE if (t // 60) % 2 == 0 else SHORT) for t in range(0, 600, 10)],
        [],
    ),
    ("busy but nothing waiting keeps it open", BurstState.OPEN, [(t, BUSY) for t in range(0, 900, 30)], []),
    (
        "a free spell interrupted by a busy one starts its hold over",
        BurstState.OPEN,
        [(0, FREE), (100, BUSY), (110, FREE), (200, FREE), (230, FREE)],
        [(230, "closed")],
    ),
    (
        "open, close, open again: each after its own for/hold",
        BurstState.CLOSED,
        [(0, SHORT), (30, SHORT), (40, FREE), (160, FREE), (170, SHORT), (200, SHORT)],
        [(30, "open"), (160, "closed"), (200, "open")],
    ),
]


@pytest.mark.parametrize(("name", "start", "timeline", "toggles"), CASES, ids=[c[0] for c in CASES])
def test_burst_machine(
    name: str, start: BurstState, timeline: list[tuple[int, Capacity]], toggles: list[tuple[int, str]]
) -> None:
    memory = BurstMemory(start)
    seen = []
    for seconds, cap in timeline:
        decision = step(memory, cap, RULE, T0 + timedelta(seconds=seconds))
        memory = decision.memory
        if decision.toggle is not None:
            assert decision.act
            seen.append((seconds, str(decision.toggle)))
    assert seen == toggles


def test_a_human_removing_the_taint_wins_until_a_shortage_agrees() -> None:
    memory = BurstMemory(BurstState.CLOSED)
    d = step(memory, FREE, RULE, T0, observed=BurstState.OPEN)
    assert (d.toggle, d.act, d.memory.by_hand) == (BurstState.OPEN, False, True)
    assert "removed by someone else" in d.reason
    # Free for far longer than the hold: healer does not put its taint back.
    memory = d.memory
    for s in range(10, 1000, 10):
        d = step(memory, FREE, RULE, T0 + timedelta(seconds=s), observed=BurstState.OPEN)
        assert d.toggle is None
        memory = d.memory
    # A shortage held for `for` agrees with the human's open: recorded, healer manages again ...
    d = step(memory, SHORT, RULE, T0 + timedelta(seconds=1000), observed=BurstState.OPEN)
    d = step(d.memory, SHORT, RULE, T0 + timedelta(seconds=1030), observed=BurstState.OPEN)
    assert (d.toggle, d.act, d.memory.by_hand) == (BurstState.OPEN, False, False)
    # ... and closes it after the next free hold.
    d = step(d.memory, FREE, RULE, T0 + timedelta(seconds=1040), observed=BurstState.OPEN)
    d = step(d.memory, FREE, RULE, T0 + timedelta(seconds=1160), observed=BurstState.OPEN)
    assert (d.toggle, d.act) == (BurstState.CLOSED, True)


def test_a_human_tainting_an_open_burst_node_keeps_it_closed_through_a_shortage() -> None:
    d = step(BurstMemory(BurstState.OPEN), SHORT, RULE, T0, observed=BurstState.CLOSED)
    assert (d.toggle, d.act, d.memory.state, d.memory.by_hand) == (
        BurstState.CLOSED,
        False,
        BurstState.CLOSED,
        True,
    )
    d = step(d.memory, SHORT, RULE, T0 + timedelta(seconds=600), observed=BurstState.CLOSED)
    assert d.toggle is None


def gpu_node(name: str, gpus: int = 8, *, unschedulable: bool = False, **kw: object) -> NodeView:
    return NodeView(name=name, unschedulable=unschedulable, conditions={"Ready": "True"}, gpus=gpus, **kw)  # type: ignore[arg-type]


def pod(name: str, gpus: int, node: str = "", *, phase: str = "", **kw: object) -> PodFacts:
    phase = phase or ("Running" if node else "Pending")
    return PodFacts(namespace="ml", name=name, node=node, phase=phase, gpus=gpus, **kw)  # type: ignore[arg-type]


def test_capacity_counts_free_gpus_of_serving_in_cluster_nodes_only() -> None:
    nodes = [
        gpu_node("a"),
        gpu_node("b"),
        gpu_node("q", taints=(("healer.dev/quarantined", "GpuTooHot", "NoSchedule"),)),
        gpu_node("cordoned", unschedulable=True),
        gpu_node("vk", gpus=100, labels={"type": "virtual-kubelet"}),
    ]
    pods = [
        pod("train-0", 8, "a"),
        pod("infer-0", 2, "b"),
        pod("done", 4, "b", phase="Succeeded"),
        pod("infer-1", 2, "vk"),
        pod("waiting", 2),
    ]
    cap = capacity(
        nodes, pods, is_burst=lambda v: v.labels.get("type") == "virtual-kubelet", domain="healer.dev"
    )
    assert cap.free_by_node == {"a": 0, "b": 6}
    assert (cap.free_gpus, cap.pending_gpu_pods, cap.held_gpus, cap.total_gpus) == (6, 1, 8, 32)


def test_a_node_recorded_quarantined_in_dry_run_counts_as_held() -> None:
    cap = capacity(
        [gpu_node("a"), gpu_node("b")],
        [],
        is_burst=lambda v: False,
        domain="healer.dev",
        states={"a": "quarantined"},
    )
    assert (cap.free_gpus, cap.held_gpus) == (8, 8)


TAINT = ("healer.dev/burst", "overflow", "NoSchedule")


def test_plan_returns_what_fits_and_says_why_the_rest_stays() -> None:
    owned = {"owner_kind": "ReplicaSet"}
    pods = [
        pod("big", 8, "vk", **owned),
        pod("small-1", 2, "vk", **owned),
        pod("small-2", 2, "vk", **owned),
        pod(
            "tolerant",
            1,
            "vk",
            owner_kind="ReplicaSet",
            tolerations=(Toleration(key="healer.dev/burst", operator="Exists"),),
        ),
        pod("bare", 1, "vk"),
        pod("ds", 0, "vk", owner_kind="DaemonSet"),
        pod("leaving", 2, "vk", owner_kind="ReplicaSet", terminating=True),
    ]
    plan = plan_returns(pods, {"a": 4, "b": 1}, taint=TAINT)
    assert [p.name for p in plan.back] == ["small-1", "small-2"]
    assert set(plan.stay) == {"ml/big", "ml/tolerant", "ml/bare", "ml/ds"}
    assert "no capacity" in plan.stay["ml/big"] and "Pending" in plan.stay["ml/big"]
    assert len(plan.out) == 6


def test_tolerations_follow_the_kubernetes_rule() -> None:
    assert Toleration(operator="Exists").tolerates(*TAINT)
    assert Toleration(key="healer.dev/burst", value="overflow", effect="NoSchedule").tolerates(*TAINT)
    assert not Toleration(key="healer.dev/burst", value="other").tolerates(*TAINT)
    assert not Toleration(key="healer.dev/burst", operator="Exists", effect="NoExecute").tolerates(*TAINT)


REPO = Path(__file__).resolve().parents[2]


def test_the_shipped_example_loads_disabled() -> None:
    ruleset = load_ruleset([REPO / "rules" / "examples" / "burst-capacity.yaml"], promtool=False)
    (rule,) = ruleset.capacity
    assert (rule.name, rule.enabled, rule.burst_nodes) == (
        "inference-overflow",
        False,
        {"type": "virtual-kubelet"},
    )
    assert (rule.open.for_, rule.close.hold, rule.return_.pods_per_minute) == (60.0, 600.0, 6.0)


def test_capacity_rule_problems_name_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "burst.yaml"
    path.write_text(
        "capacity:\n"
        "  - name: overflow\n"
        "    burst_nodes: {type: virtual-kubelet}\n"
        "    open: {pending_gpu_pods: 0}\n"
        "    close: {hold: 10 minutes, free_gpu: 2}\n"
        "  - name: overflow\n"
        "    burst_nodes: {}\n"
    )
    problems = [str(p).replace(str(path), "F") for p in validate_rules([path], promtool=False).problems]
    assert problems == [
        "F:4:5: capacity[0].open: open needs at least one signal: pending_gpu_pods, kueue_pending_workloads "
        "or free_gpus_below",
        "F:5:13: capacity[0].close.hold: not a Prometheus duration: '10 minutes' (use e.g. 30s, 5m, 1h30m)",
        "F:5:31: capacity[0].close.free_gpu: unknown key 'free_gpu' (did you mean 'free_gpus_at_least'?)",
        "F:6:5: capacity[1].name: duplicate capacity rule name 'overflow': also defined at F:2:5",
        "F:7:5: capacity[1].burst_nodes: must not be empty",
    ]


def test_a_kueue_workload_is_pending_until_admitted_or_finished() -> None:
    assert workload_pending({"status": {"conditions": [{"type": "QuotaReserved", "status": "False"}]}})
    assert not workload_pending({"status": {"admission": {"clusterQueue": "team"}}})
    assert not workload_pending({"status": {"conditions": [{"type": "Finished", "status": "True"}]}})


def test_pod_facts_read_requests_limits_owner_and_tolerations() -> None:
    facts = pod_facts(
        {
            "metadata": {
                "namespace": "ml",
                "name": "infer-0",
                "uid": "u1",
                "ownerReferences": [{"kind": "ReplicaSet", "uid": "rs1", "controller": True}],
            },
            "spec": {
                "nodeName": "vk-0",
                "containers": [
                    {"resources": {"limits": {"nvidia.com/gpu": "2"}}},
                    {"resources": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}},
                ],
                "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
            },
            "status": {"phase": "Running"},
        }
    )
    assert (facts.key, facts.gpus, facts.owner_kind, facts.owner_uid, facts.node) == (
        "ml/infer-0",
        3,
        "ReplicaSet",
        "rs1",
        "vk-0",
    )
    assert facts.tolerates("virtual-kubelet.io/provider", "mock", "NoSchedule")
    assert not facts.tolerates(*TAINT)
