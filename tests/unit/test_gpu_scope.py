"""One GPU out instead of eight (``healer.engine.gpu_scope``): which findings stay at the GPU."""

from __future__ import annotations

from datetime import UTC, datetime

from healer.engine.gpu_scope import contained, for_nodes, gpus_out
from healer.model.findings import Finding, TickFindings
from healer.model.states import FindingState
from healer.ruleset.schema import Rule, RuleGroup, RuleSet

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
RULES = RuleSet(
    groups=(
        RuleGroup(
            name="gpu",
            rules=[
                Rule(
                    name="RowRemapFailed", expr="a > 0", actions=[{"quarantine": {"scope": "gpu"}}, "ticket"]
                ),
                Rule(name="GpuTooHot", expr="b > 0", actions=[{"quarantine": {"scope": "gpu"}}]),
                Rule(name="InfinibandDown", expr="c > 0", actions=["quarantine"]),
                Rule(name="EccNotice", expr="d > 0", actions=["notify"]),
            ],
        ),
    )
)


def finding(rule: str, node: str, gpu: str | None, state: FindingState = FindingState.FIRING) -> Finding:
    return Finding(
        rule=rule,
        series_key=f"{rule}{node}{gpu}",
        node=node,
        gpu=gpu,
        state=state,
        severity="critical",
        value=1.0,
        unit=None,
        fired_at=T0,
    )


def tick(*found: Finding) -> TickFindings:
    firing: dict[str, list[Finding]] = {}
    pending: dict[str, list[Finding]] = {}
    for f in found:
        (firing if f.state == FindingState.FIRING else pending).setdefault(f.node, []).append(f)
    return TickFindings(at=T0, firing=firing, pending=pending)


def test_one_gpu_is_contained_and_the_node_sees_nothing() -> None:
    found = tick(
        finding("RowRemapFailed", "n1", "3"), finding("GpuTooHot", "n1", "3"), finding("EccNotice", "n1", "3")
    )
    assert contained(found, RULES) == {"n1": "3"}
    assert [f.rule for f in for_nodes(found, RULES).firing["n1"]] == ["EccNotice"]
    assert gpus_out(found, RULES) == {"n1": {"3": "GpuTooHot"}}


def test_a_second_gpu_escalates_to_the_node_and_both_gpus_stay_out() -> None:
    found = tick(finding("RowRemapFailed", "n1", "3"), finding("GpuTooHot", "n1", "5", FindingState.PENDING))
    assert contained(found, RULES) == {}
    assert for_nodes(found, RULES) is found
    assert gpus_out(found, RULES) == {"n1": {"3": "RowRemapFailed"}}  # only firing ones go out


def test_a_fabric_finding_escalates() -> None:
    assert contained(tick(finding("RowRemapFailed", "n1", None)), RULES) == {}
    found = tick(finding("RowRemapFailed", "n1", "3"), finding("InfinibandDown", "n1", None))
    assert contained(found, RULES) == {}
    assert [f.rule for f in for_nodes(found, RULES).firing["n1"]] == ["RowRemapFailed", "InfinibandDown"]


def test_node_scoped_rules_are_untouched() -> None:
    found = tick(finding("InfinibandDown", "n2", "1"), finding("RowRemapFailed", "n3", "0"))
    assert contained(found, RULES) == {"n3": "0"}
    assert list(for_nodes(found, RULES).firing) == ["n2"]
