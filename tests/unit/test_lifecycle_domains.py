"""The lifecycle of a node a domain incident absorbs (healer.engine.correlation): tainted, not
cordoned, drained or ticketed on its own; back through validation once the domain's ticket is
resolved. Time as a parameter."""

from __future__ import annotations

from dataclasses import replace

import pytest

from healer.engine import lifecycle as lc
from healer.model.drain import DrainReport
from healer.model.states import NodeState, TicketStatus
from tests.unit.test_lifecycle import CORDONED, CTX, HELD, HOT, facts, incident, kinds

LEAF = lc.DomainFacts(id=3, kind="ib_leaf", name="leaf-A", ticket=TicketStatus.SENT)
FIXED = lc.DomainFacts(id=3, kind="ib_leaf", name="leaf-A", ticket=TicketStatus.RESOLVED)
TAINTED = incident(rule="GpuTooHot", cordoned_by_healer=False, expect_unschedulable=False, domain_id=3)
JOINED = replace(HELD, domain_id=3)

CASES = [
    # (id, facts, row, next state, effect types)
    (
        "suspect in a faulty domain → tainted, not cordoned",
        facts(NodeState.SUSPECT, incident=incident(), firing=HOT, domain=LEAF),
        "domain taint",
        NodeState.QUARANTINED,
        ["Taint", "SetCondition", "Event"],
    ),
    (
        "tainted domain node → awaiting the domain's repair, no ticket of its own",
        facts(NodeState.QUARANTINED, incident=TAINTED, firing=HOT, domain=LEAF),
        "domain waits",
        NodeState.AWAITING_REPAIR,
        [],
    ),
    (
        "a node's own quarantine joins the domain: no drain, no ticket",
        facts(NodeState.QUARANTINED, incident=HELD, firing=HOT, view=CORDONED, domain=LEAF),
        "domain waits",
        NodeState.AWAITING_REPAIR,
        [],
    ),
    (
        "a draining node that joined: its drain ends without a ticket",
        facts(
            NodeState.DRAINING,
            incident=HELD,
            view=CORDONED,
            drain=DrainReport(done=True),
            domain=LEAF,
        ),
        "drained",
        NodeState.AWAITING_REPAIR,
        ["Event"],
    ),
    (
        "a draining node that joined: a blocked drain asks for no ticket",
        facts(
            NodeState.DRAINING,
            incident=HELD,
            view=CORDONED,
            drain=DrainReport(done=False, blocked=True, blocked_pods=("web/db-0",)),
            domain=LEAF,
        ),
        "drain blocked",
        NodeState.BLOCKED,
        ["Event"],
    ),
    (
        "awaiting the domain's repair while clear: still waiting (no 'cleared, no ticket')",
        facts(NodeState.AWAITING_REPAIR, incident=TAINTED, domain=LEAF),
        None,
        None,
        [],
    ),
    (
        "the domain's ticket resolved → repaired",
        facts(NodeState.AWAITING_REPAIR, incident=TAINTED, domain=FIXED),
        "domain repaired",
        NodeState.REPAIRED,
        [],
    ),
    (
        "the domain's ticket resolved while draining → repaired (the drain is ended)",
        facts(NodeState.DRAINING, incident=JOINED, view=CORDONED, domain=FIXED),
        "domain repaired",
        NodeState.REPAIRED,
        [],
    ),
    (
        "blocked by the budget in a faulty domain → tainted on retry",
        facts(NodeState.BLOCKED, incident=incident(blocked_step="quarantine"), firing=HOT, domain=LEAF),
        "domain taint",
        NodeState.QUARANTINED,
        ["Taint", "SetCondition", "Event"],
    ),
    (
        "after the domain's repair, a member bad again is a node fault: cordoned",
        facts(NodeState.SUSPECT, incident=incident(), firing=HOT, domain=FIXED),
        "quarantine",
        NodeState.QUARANTINED,
        ["Cordon", "Taint", "SetCondition", "Event"],
    ),
    (
        "after the domain's repair, a member's own incident is not repaired by it",
        facts(NodeState.QUARANTINED, incident=HELD, firing=HOT, view=CORDONED, domain=FIXED),
        "drain",
        NodeState.DRAINING,
        ["StartDrain", "Event"],
    ),
    (
        "no domain: the node's own quarantine (cordon) as before",
        facts(NodeState.SUSPECT, incident=incident(), firing=HOT),
        "quarantine",
        NodeState.QUARANTINED,
        ["Cordon", "Taint", "SetCondition", "Event"],
    ),
]


@pytest.mark.parametrize(("name", "node", "row", "to", "effects"), CASES, ids=[c[0] for c in CASES])
def test_domain_rows(
    name: str, node: lc.NodeFacts, row: str | None, to: NodeState | None, effects: list[str]
) -> None:
    step = lc.decide(node, CTX)
    assert (step.row if step else None) == row
    assert (step.to if step else None) == to
    assert kinds(step) == effects
    assert not any(isinstance(e, lc.RequestTicket) for e in (step.effects if step else ()))


def test_the_domain_taint_names_the_domain_and_uses_its_effect() -> None:
    domain = lc.DomainFacts(id=9, kind="rack", name="r12", taint_effect="PreferNoSchedule")
    step = lc.decide(facts(NodeState.SUSPECT, incident=incident(), firing=HOT, domain=domain), CTX)
    assert step is not None
    [taint] = [e for e in step.effects if isinstance(e, lc.Taint)]
    assert (taint.value, taint.effect) == ("domain-rack", "PreferNoSchedule")
    assert "rack r12 (domain incident 9)" in step.reason
    assert step.evidence and step.evidence["domain"] == {"id": 9, "kind": "rack", "name": "r12"}
    assert step.memory.cordoned_by_healer is False
