"""The remediation ladder in the lifecycle table: reset → reboot → ticket, by class, with timeouts."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from healer.engine import ladder
from healer.engine import lifecycle as lc
from healer.model.drain import DrainReport
from healer.model.findings import Finding
from healer.model.node import NodeView
from healer.model.repair import RepairResult
from healer.model.states import FindingState, NodeState, TicketStatus
from healer.ruleset.loading import validate_rules
from healer.ruleset.schema import Rule, RuleGroup, RuleSet
from healer.ruleset.xid_catalog import load_xid_catalog

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
CATALOG = load_xid_catalog(Path(__file__).resolve().parents[2] / "rules" / "catalog" / "xid-catalog.yaml")
RULES = RuleSet(
    groups=(
        RuleGroup(
            name="gpu",
            rules=[
                Rule(
                    name="Xid",
                    expr="DCGM_FI_DEV_XID_ERRORS > 0",
                    classify="xid-value",
                    actions=["quarantine", "drain", {"ticket": {"provider": "acme"}}],
                ),
                Rule(
                    name="Recovery",
                    expr="DCGM_FI_DEV_GPU_RECOVERY_ACTION > 0",
                    classify="recovery-action",
                    actions=["quarantine", "ticket"],
                ),
                Rule(
                    name="Own",
                    expr="x > 0",
                    actions=["quarantine"],
                    ladder=[{"reboot": {"timeout": "5m"}}, {"notify": {"timeout": "1m"}}, "ticket"],
                ),
            ],
        ),
    )
)
ALL = frozenset({"reset-gpu", "reboot"})
CTX = lc.Context(rules=RULES, now=NOW, xid_catalog=CATALOG, repair_actions=ALL)
CORDONED = NodeView(name="n1", unschedulable=True, annotations={"healer.dev/cordoned-by": "healer"})


def xid(code: float, *, rule: str = "Xid", uuid: str = "GPU-aaaa", clear: bool = False) -> Finding:
    return Finding(
        rule=rule,
        series_key=f"{rule}{{gpu=3,UUID={uuid}}}",
        node="n1",
        gpu="3",
        state=FindingState.FIRING,
        severity="critical",
        value=code,
        unit="Xid code",
        labels={"Hostname": "n1", "gpu": "3", "UUID": uuid},
        active_since=NOW - timedelta(minutes=5),
        fired_at=NOW - timedelta(minutes=5),
        clear_since=NOW - timedelta(minutes=1) if clear else None,
    )


def incident(**kw: object) -> lc.IncidentFacts:
    kw.setdefault("rule", "Xid")
    return lc.IncidentFacts(id=7, cordoned_by_healer=True, expect_unschedulable=True, **kw)  # type: ignore[arg-type]


def drained(firing: tuple[Finding, ...], **kw: object) -> lc.NodeFacts:
    return lc.NodeFacts(
        name="n1",
        state=NodeState.DRAINING,
        incident=incident(),
        firing=firing,
        view=CORDONED,
        drain=DrainReport(done=True),
        **kw,  # type: ignore[arg-type]
    )


def then(facts: lc.NodeFacts, step: lc.Step, ctx: lc.Context = CTX, **kw: object) -> lc.NodeFacts:
    """The facts after ``step`` (memory remembered, state moved)."""
    assert facts.incident is not None
    inc = lc.remember(facts.incident, step)
    return replace(facts, state=step.to or facts.state, incident=inc, drain=None, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("code", "first", "steps"),
    [
        (48, "reset-gpu", "reset-gpu (10m) → reboot (30m) → ticket (7d)"),
        (79, "reboot", "reboot (30m) → ticket (7d)"),
        (64, "ticket", "ticket (7d)"),
        (999, "ticket", "ticket (7d)"),
    ],
)
def test_default_ladder_by_xid_class(code: int, first: str, steps: str) -> None:
    step = lc.decide(drained((xid(code),)), CTX)
    assert step is not None and step.row == "drained"
    assert step.to == NodeState.AWAITING_REPAIR
    assert step.evidence and step.evidence["ladder"]["steps"] == steps  # type: ignore[index]
    assert "step 1/" in step.reason and first in step.reason
    if first == "ticket":
        assert [type(e).__name__ for e in step.effects] == ["Event", "RequestTicket"]
        assert step.effects[1] == lc.RequestTicket(provider="acme", template=None)
    else:
        repair = next(e for e in step.effects if isinstance(e, lc.RequestRepair))
        assert repair.action == first
        assert repair.gpu == ("3" if first == "reset-gpu" else None)
        assert step.kind == lc.StepKind.REPAIR


@pytest.mark.parametrize(
    ("action", "first"), [(1, "reset-gpu"), (2, "reboot"), (4, "reset-gpu"), (3, "ticket")]
)
def test_recovery_action_picks_the_ladder(action: int, first: str) -> None:
    facts = replace(drained((xid(action, rule="Recovery"),)), state=NodeState.QUARANTINED, drain=None)
    facts = replace(facts, incident=incident(rule="Recovery"))
    step = lc.decide(facts, CTX)
    assert step is not None and step.row == "quarantined, no drain"
    assert first in step.reason


def test_reset_clears_then_validates_and_returns_without_a_ticket() -> None:
    facts = drained((xid(48),))
    step = lc.decide(facts, CTX)
    assert step is not None
    nonce = next(e for e in step.effects if isinstance(e, lc.RequestRepair)).nonce
    facts = then(facts, step)
    assert facts.incident is not None and facts.incident.repair_nonce == nonce
    # Not answered yet: wait (no step), even once the finding clears.
    assert lc.decide(facts, CTX) is None
    assert lc.decide(replace(facts, firing=()), CTX) is None
    answered = replace(facts, repair_result=RepairResult(nonce=nonce, status="succeeded", reason="reset"))
    step = lc.decide(answered, CTX)
    assert step is not None and step.row == "repair done" and step.to == NodeState.REPAIRED
    facts = then(answered, step)
    step = lc.decide(facts, CTX)
    assert step is not None and step.to == NodeState.VALIDATING
    # The old (sticky) value is discounted by the controller: no findings now.
    facts = then(facts, step, firing=())
    step = lc.decide(facts, CTX)
    assert step is not None and step.row == "hold starts"
    facts = then(facts, step)
    later = replace(CTX, now=NOW + timedelta(minutes=6))
    step = lc.decide(facts, later)
    assert step is not None and step.to == NodeState.HEALTHY
    assert not any(isinstance(e, lc.RequestTicket) for e in step.effects)


def test_reset_that_does_not_clear_escalates_to_reboot_then_ticket() -> None:
    facts = drained((xid(48),))
    step = lc.decide(facts, CTX)
    assert step is not None
    facts = then(facts, step)
    # The agent never answers: the reset's 10 minutes pass → reboot.
    late = replace(CTX, now=NOW + timedelta(minutes=10))
    step = lc.decide(facts, late)
    assert step is not None and step.row == "ladder step timed out"
    assert "reboot" in step.reason and "reset-gpu (10m) did not clear" in step.reason
    reboot = next(e for e in step.effects if isinstance(e, lc.RequestRepair))
    assert reboot.action == "reboot"
    facts = then(facts, step)
    # The reboot is done but the Xid is still there (a new value): validation fails → ticket.
    answered = replace(facts, repair_result=RepairResult(nonce=reboot.nonce, status="succeeded"))
    step = lc.decide(answered, late)
    assert step is not None and step.to == NodeState.REPAIRED
    facts = then(answered, step)
    step = lc.decide(facts, late)
    assert step is not None and step.to == NodeState.VALIDATING
    facts = then(facts, step, firing=(xid(62),))
    step = lc.decide(facts, late)
    assert step is not None and step.row == "repair did not clear"
    assert step.to == NodeState.AWAITING_REPAIR and not step.new_incident
    assert [e for e in step.effects if isinstance(e, lc.RequestTicket)] == [
        lc.RequestTicket(provider="acme", template=None)
    ]


def test_agent_failure_or_refusal_escalates_at_once() -> None:
    facts = drained((xid(48),))
    step = lc.decide(facts, CTX)
    assert step is not None
    nonce = next(e for e in step.effects if isinstance(e, lc.RequestRepair)).nonce
    facts = then(facts, step)
    other = replace(facts, repair_result=RepairResult(nonce="someone-else", status="failed"))
    assert lc.decide(other, CTX) is None  # an answer to another request is not this one's
    failed = replace(facts, repair_result=RepairResult(nonce=nonce, status="refused", reason="bad signature"))
    step = lc.decide(failed, CTX)
    assert step is not None and step.row == "repair failed"
    assert "bad signature" in step.reason and "reboot" in step.reason


def test_without_an_agent_the_ladder_skips_to_the_ticket() -> None:
    ctx = replace(CTX, repair_actions=frozenset())
    step = lc.decide(drained((xid(48),)), ctx)
    assert step is not None
    assert "reset-gpu, reboot skipped" in step.reason
    assert any(isinstance(e, lc.RequestTicket) for e in step.effects)


def test_a_part_that_failed_before_goes_straight_to_replacement() -> None:
    step = lc.decide(drained((xid(48, uuid="GPU-bad"),), repeat_parts=frozenset({"GPU-bad"})), CTX)
    assert step is not None
    assert "GPU-bad failed before after a repair" in step.reason
    assert any(isinstance(e, lc.RequestTicket) for e in step.effects)
    assert not any(isinstance(e, lc.RequestRepair) for e in step.effects)
    assert step.evidence and step.evidence["ladder"]["repeat_parts"] == ["GPU-bad"]  # type: ignore[index]


def test_rule_ladder_with_notify_then_ticket_and_exhaustion() -> None:
    facts = replace(drained((xid(1, rule="Own"),)), state=NodeState.QUARANTINED, drain=None)
    facts = replace(facts, incident=incident(rule="Own"))
    step = lc.decide(facts, CTX)
    assert step is not None and "reboot (5m)" in step.reason
    facts = then(facts, step)
    t = replace(CTX, now=NOW + timedelta(minutes=5))
    step = lc.decide(facts, t)
    assert step is not None and step.kind == lc.StepKind.NOTIFY
    facts = then(facts, step)
    t = replace(CTX, now=NOW + timedelta(minutes=6))
    step = lc.decide(facts, t)
    assert step is not None and step.kind == lc.StepKind.TICKET
    facts = then(facts, step)
    resolved = replace(facts, incident=replace(facts.incident, ticket=TicketStatus.RESOLVED))  # type: ignore[arg-type]
    step = lc.decide(resolved, replace(CTX, now=NOW + timedelta(days=30)))
    assert step is not None and step.row == "repaired"
    unresolved = replace(facts, incident=replace(facts.incident, ticket=TicketStatus.SENT))  # type: ignore[arg-type]
    step = lc.decide(unresolved, replace(CTX, now=NOW + timedelta(days=30)))
    assert step is not None and "exhausted" in step.reason


def test_ladder_errors_carry_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(
        """groups:
  - name: g
    rules:
      - name: A
        expr: up == 0
        actions: [taint]
        ladder:
          - reset-gpu: {timeout: 5m}
      - name: B
        expr: up == 0
        actions: [quarantine]
        ladder:
          - ticket
          - reboot
      - name: C
        expr: up == 0
        actions: [quarantine]
        ladder:
          - reset-gpu: {timeout: 0s}
          - replace-the-datacenter
""",
        encoding="utf-8",
    )
    result = validate_rules([path], promtool=False)
    text = "\n".join(str(p) for p in result.problems)
    assert not result.ok
    assert f"{path}:7:" in text and "need the quarantine action" in text
    assert f"{path}:12:" in text and "comes after reset-gpu and reboot" in text
    assert f"{path}:19:" in text  # timeout 0
    assert f"{path}:20:" in text  # unknown step


def test_describe_and_class_strength() -> None:
    assert ladder.strongest_class(["reset", "reboot"]) == "reboot"
    assert ladder.strongest_class(["reset", "fatal-replace"]) == "fatal-replace"


@pytest.mark.parametrize(
    ("phase", "code", "message", "status"),
    [
        ("Running", None, "", "running"),
        ("Succeeded", 0, '{"passed": true, "dcgm_level": 2}', "succeeded"),
        ("Succeeded", 0, "", "failed"),  # no JSON result line: KWOK's own completion says nothing
        ("Succeeded", 0, '{"passed": false}', "failed"),
        ("Failed", 1, '{"passed": true}', "failed"),
        ("Succeeded", 0, 'log line\n{"passed": true, "nccl_busbw_gbps": 90.0}', "failed"),  # under 100
        ("Succeeded", 0, '{"passed": true, "nccl_busbw_gbps": 180.5}', "succeeded"),
    ],
)
def test_validation_result_from_exit_code_and_json_line(
    phase: str, code: int | None, message: str, status: str
) -> None:
    from healer.model.validation import judge

    assert judge(phase, code, message, nccl_min_busbw_gbps=100.0).status == status


def test_a_ladder_started_by_the_drain_pass_is_chosen_by_the_recorded_findings() -> None:
    """The drain pass has no tick findings: the ladder of a drained Xid 79 node is still the
    reboot class's (from the findings as last recorded), not a bare ticket for class unknown."""
    facts = replace(drained(()), recorded_firing=(xid(79),))
    step = lc.decide(facts, CTX)
    assert step is not None and step.row == "drained"
    assert step.evidence and step.evidence["ladder"]["steps"] == "reboot (30m) → ticket (7d)"  # type: ignore[index]
    assert "class reboot" in step.reason
    reset = lc.decide(replace(drained(()), recorded_firing=(xid(48),)), CTX)
    assert reset is not None
    repair = next(e for e in reset.effects if isinstance(e, lc.RequestRepair))
    assert (repair.action, repair.gpu) == ("reset-gpu", "3")  # the GPU named by the recorded finding
