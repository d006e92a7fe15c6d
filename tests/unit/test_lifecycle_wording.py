"""What the lifecycle tells a person: the rule, its value and its real hold; taint-only named
"tainted"; after a human uncordon a still-firing fault keeps the condition False."""

from __future__ import annotations

from dataclasses import replace

from healer.engine import lifecycle as lc
from healer.model.findings import Finding
from healer.model.states import FindingState, NodeState
from healer.ruleset.schema import Rule, RuleGroup, RuleSet
from tests.unit.test_lifecycle import HELD, NOW, facts, finding, view

RULES = RuleSet(
    groups=(
        RuleGroup(
            name="gpu",
            rules=[
                Rule(name="GpuTooHot", expr="t > 78", for_=30, actions=["quarantine"]),  # a scaled 5m
                Rule(name="Throttled", expr="x > 0", for_=120, actions=[{"taint": {}}]),
                Rule(name="IbLinkDowned", expr="increase(c[10m]) > 0", actions=["quarantine"]),
            ],
        ),
    )
)
CTX = lc.Context(rules=RULES, now=NOW, recovery_hold_seconds=300)


def test_a_suspect_node_names_the_rule_its_value_and_the_real_hold() -> None:
    pending = finding(state=FindingState.PENDING)
    step = lc.decide(facts(NodeState.HEALTHY, pending=(pending,)), CTX)
    assert step is not None and step.to == NodeState.SUSPECT
    assert (
        step.reason
        == "GpuTooHot pending on GPU 0 (value 91 degrees C, acts if it holds 30s): GpuTooHot on GPU 0"
    )
    assert "watching" not in step.reason and "5 minutes" not in step.reason


def test_counts_are_whole_numbers() -> None:
    count: Finding = replace(finding("IbLinkDowned"), value=1.032, unit=None, gpu=None, summary="")
    step = lc.decide(facts(NodeState.HEALTHY, firing=(count,)), CTX)
    assert step is not None
    assert step.reason == "IbLinkDowned firing (value 1)"


def test_quarantine_and_taint_only_are_named_for_what_happened() -> None:
    hot = lc.decide(facts(NodeState.SUSPECT, firing=(finding(),)), CTX)
    assert hot is not None and hot.reason.startswith("cordoned and tainted: finding held 30s:")
    assert "GpuTooHot firing on GPU 0 (value 91 degrees C, held 30s)" in hot.reason
    throttled = lc.decide(facts(NodeState.SUSPECT, firing=(finding("Throttled"),)), CTX)
    assert throttled is not None
    assert throttled.reason.startswith("tainted, not cordoned: finding held 2m:")


def test_a_human_uncordon_while_the_fault_fires_leaves_the_condition_false() -> None:
    step = lc.decide(
        facts(NodeState.QUARANTINED, incident=HELD, firing=(finding(),), view=view(owned=True)), CTX
    )
    assert step is not None and step.to == NodeState.RELEASED
    [condition] = [e for e in step.effects if isinstance(e, lc.SetCondition)]
    assert condition.healthy is False
    assert condition.reason == "GpuTooHot"
    assert "uncordoned by someone else: healer is not remediating it" in condition.message
    assert "released by healer" not in condition.message
