"""Kueue quota that follows healthy capacity (``healer.engine.quota``): pure, time as a parameter."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from healer.actions.kueue import quotas_of, with_quotas
from healer.config import KueueSettings
from healer.engine.quota import decide, healthy_capacity, target
from healer.model.node import NodeView
from healer.model.quota import Flavor, QuotaPolicy

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
H100 = Flavor("h100", {"nvidia.com/gpu.product": "H100"})


def node(name: str, *, gpus: int = 8, ready: bool = True, product: str = "H100", **kw: object) -> NodeView:
    return NodeView(
        name=name,
        unschedulable=bool(kw.pop("unschedulable", False)),
        labels={"nvidia.com/gpu.product": product},
        conditions={"Ready": "True" if ready else "False"},
        gpus=gpus,
        **kw,  # type: ignore[arg-type]
    )


def test_capacity_counts_ready_schedulable_nodes_healer_does_not_hold() -> None:
    nodes = [
        node("a"),
        node("b", ready=False),  # NotReady
        node("c", unschedulable=True),  # cordoned by anyone
        node("d", taints=(("healer.dev/quarantined", "GpuTooHot", "NoSchedule"),)),  # taint-only rule
        node("e", annotations={"healer.dev/incident": "4"}),
        node("f"),  # held per the database (dry-run: no marks on the node)
        node("g", product="A100"),  # another flavor
        node("h", gpus=4),
    ]
    states = {"f": "draining", "a": "healthy", "h": "released"}
    assert healthy_capacity(nodes, H100, domain="healer.dev", states=states) == 12
    assert healthy_capacity(nodes, H100, domain="healer.dev", states=states, gpus_out={"a": 1}) == 11
    assert healthy_capacity(nodes, Flavor("any"), domain="healer.dev") == 28  # a, f (no states), g, h


def test_each_gpu_out_lowers_capacity_by_one_unless_allocatable_already_misses_it() -> None:
    dra = node("a", gpu_capacity=8)  # a DeviceTaintRule leaves allocatable as it is
    honoured = node("b", gpus=7, gpu_capacity=8)  # a plugin honouring gpus-out dropped one GPU
    fell_off = node("c", gpus=7, gpu_capacity=8)  # one GPU unhealthy, two others out
    unknown = node("d")  # no capacity reported: every GPU out counts
    out = {"a": 2, "b": 1, "c": 3, "d": 1, "elsewhere": 4}
    assert healthy_capacity([dra], H100, domain="healer.dev", gpus_out=out) == 6
    assert healthy_capacity([honoured], H100, domain="healer.dev", gpus_out=out) == 7
    assert healthy_capacity([fell_off], H100, domain="healer.dev", gpus_out=out) == 5
    assert healthy_capacity([unknown], H100, domain="healer.dev", gpus_out=out) == 7
    assert healthy_capacity([node("e", gpu_capacity=8)], H100, domain="healer.dev", gpus_out={"e": 9}) == 0


@pytest.mark.parametrize(
    ("capacity", "headroom", "floor", "expected"),
    [(24, 0, 0, 24), (24, 8, 0, 16), (8, 0, 12, 12), (0, 8, 0, 0), (4, 8, 2, 2)],
)
def test_target_is_capacity_minus_headroom_never_below_the_floor(
    capacity: int, headroom: int, floor: int, expected: int
) -> None:
    assert target(capacity, QuotaPolicy(headroom=headroom, floor=floor)) == expected


def run(current: int | None, capacity: int, *, since: datetime | None = None, at: float = 0, **policy: float):  # type: ignore[no-untyped-def]
    return decide(
        cluster_queue="train",
        flavor="h100",
        current=current,
        capacity=capacity,
        policy=QuotaPolicy(**policy),  # type: ignore[arg-type]
        below_since=since,
        now=T0 + timedelta(seconds=at),
    )


def test_raised_at_once_when_capacity_comes_back() -> None:
    d = run(16, 24, hysteresis=4, lower_after_seconds=600)
    assert d.set_to == 24 and "raised from 16 to 24" in d.reason


def test_lowered_only_after_the_shortfall_lasted() -> None:
    first = run(24, 16, hysteresis=4, lower_after_seconds=60)
    assert first.set_to is None and first.below_since == T0
    still = run(24, 16, since=first.below_since, at=59, hysteresis=4, lower_after_seconds=60)
    assert still.set_to is None and still.below_since == T0
    done = run(24, 16, since=still.below_since, at=60, hysteresis=4, lower_after_seconds=60)
    assert done.set_to == 16 and "lowered from 24 to 16" in done.reason


def test_a_shortfall_within_the_hysteresis_never_moves_the_quota() -> None:
    for at in (0, 600, 6000):
        d = run(24, 22, at=at, since=T0, hysteresis=4, lower_after_seconds=0)
        assert d.set_to is None and d.below_since is None, d.reason


def test_the_floor_holds() -> None:
    d = run(24, 0, floor=8, lower_after_seconds=0)
    assert d.set_to == 8 and "(the floor)" in d.reason
    assert run(8, 0, floor=8).set_to is None


def test_a_flavor_without_the_resource_is_left_alone() -> None:
    assert run(None, 24).set_to is None


def test_settings_refuse_enabled_without_targets() -> None:
    with pytest.raises(ValueError, match="cluster_queues and flavors"):
        KueueSettings(enabled=True)
    settings = KueueSettings(
        enabled=True, cluster_queues=["train"], flavors=[{"name": "h100", "node_labels": {"a": "b"}}]
    )
    assert settings.flavor_models() == (Flavor("h100", {"a": "b"}),)


def test_resource_groups_keep_everything_but_the_managed_quota() -> None:
    groups = [
        {
            "coveredResources": ["cpu", "nvidia.com/gpu"],
            "flavors": [
                {
                    "name": "h100",
                    "resources": [
                        {"name": "cpu", "nominalQuota": "1k"},
                        {"name": "nvidia.com/gpu", "nominalQuota": 24},
                    ],
                },
                {
                    "name": "a100",
                    "resources": [
                        {"name": "cpu", "nominalQuota": 64},
                        {"name": "nvidia.com/gpu", "nominalQuota": "16"},
                    ],
                },
            ],
        },
        {
            "coveredResources": ["memory"],
            "flavors": [{"name": "mem", "resources": [{"name": "memory", "nominalQuota": "1Ti"}]}],
        },
    ]
    assert quotas_of(groups, "nvidia.com/gpu") == {"h100": 24, "a100": 16, "mem": None}
    changed = with_quotas(groups, "nvidia.com/gpu", {"h100": 16})
    assert quotas_of(changed, "nvidia.com/gpu") == {"h100": 16, "a100": 16, "mem": None}
    assert changed[0]["flavors"][0]["resources"][0] == {"name": "cpu", "nominalQuota": "1k"}
    assert groups[0]["flavors"][0]["resources"][1]["nominalQuota"] == 24  # the input is not changed
