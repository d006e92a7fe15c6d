"""The node lifecycle table: (state, facts) → (next state, effects), with time as a parameter."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from healer.engine import lifecycle as lc
from healer.model.drain import DrainOptions, DrainReport
from healer.model.findings import Finding
from healer.model.node import NodeView
from healer.model.states import FindingState, NodeState, TicketStatus
from healer.ruleset.schema import DrainAction, Rule, RuleGroup, RuleSet

NOW = datetime(2025, 3, 4, 12, 0, tzinfo=UTC)

RULES = RuleSet(
    groups=(
        RuleGroup(
            name="gpu",
            rules=[
                Rule(
                    name="GpuTooHot",
                    expr="DCGM_FI_DEV_GPU_TEMP > 78",
                    keep_firing_for=600,
                    actions=["quarantine", {"drain": {"timeout": "1h"}}, {"ticket": {"provider": "acme"}}],
                ),
                Rule(name="XidFatal", expr="DCGM_FI_DEV_XID_ERRORS > 0", actions=["quarantine", "ticket"]),
                Rule(name="Throttled", expr="x > 0", severity="warning", actions=[{"taint": {}}]),
                Rule(
                    name="EccNotice", expr="y > 0", severity="info", actions=[{"notify": {"message": "ECC"}}]
                ),
                Rule(name="NeedsTicket", expr="z > 0", actions=["ticket"]),
                Rule(name="QuarantineOnly", expr="q > 0", actions=["quarantine"]),
                Rule(name="DrainNoTicket", expr="d > 0", actions=["quarantine", "drain"]),
            ],
        ),
    )
)
CTX = lc.Context(rules=RULES, now=NOW, recovery_hold_seconds=300)


def finding(
    rule: str = "GpuTooHot", *, state: FindingState = FindingState.FIRING, node: str = "n1"
) -> Finding:
    return Finding(
        rule=rule,
        series_key=f"{rule}{{gpu=0,node={node}}}",
        node=node,
        gpu="0",
        state=state,
        severity="critical",
        value=91.0,
        unit="degrees C",
        labels={"Hostname": node, "gpu": "0"},
        summary=f"{rule} on GPU 0",
        active_since=NOW - timedelta(minutes=6),
        fired_at=NOW - timedelta(minutes=1) if state == FindingState.FIRING else None,
    )


def view(*, unschedulable: bool = False, owned: bool = False) -> NodeView:
    annotations = {"healer.dev/cordoned-by": "healer"} if owned else {}
    return NodeView(name="n1", unschedulable=unschedulable, annotations=annotations)


def facts(state: NodeState, **kw: object) -> lc.NodeFacts:
    kw.setdefault("view", view())
    v = kw["view"]
    kw.setdefault("owned", isinstance(v, NodeView) and "healer.dev/cordoned-by" in v.annotations)
    return lc.NodeFacts(name="n1", state=state, **kw)  # type: ignore[arg-type]


def incident(**kw: object) -> lc.IncidentFacts:
    return lc.IncidentFacts(id=7, **kw)  # type: ignore[arg-type]


HOT = (finding(),)
HELD = incident(rule="GpuTooHot", cordoned_by_healer=True, expect_unschedulable=True)
CORDONED = view(unschedulable=True, owned=True)


def kinds(step: lc.Step | None) -> list[str]:
    return [type(e).__name__ for e in step.effects] if step else []


CASES = [
    # (id, facts, row, next state, effect types)
    ("healthy stays healthy", facts(NodeState.HEALTHY), None, None, []),
    (
        "pending finding → suspect",
        facts(NodeState.HEALTHY, pending=(finding(state=FindingState.PENDING),)),
        "suspect",
        NodeState.SUSPECT,
        [],
    ),
    (
        "firing finding → suspect first",
        facts(NodeState.HEALTHY, firing=HOT),
        "suspect",
        NodeState.SUSPECT,
        [],
    ),
    (
        "suspect, firing quarantine rule → quarantined (cordon, taint, condition, Event)",
        facts(NodeState.SUSPECT, incident=incident(), firing=HOT),
        "quarantine",
        NodeState.QUARANTINED,
        ["Cordon", "Taint", "SetCondition", "Event"],
    ),
    (
        "suspect, node already cordoned by a human → no cordon claimed",
        facts(NodeState.SUSPECT, incident=incident(), firing=HOT, view=view(unschedulable=True)),
        "quarantine",
        NodeState.QUARANTINED,
        ["Taint", "SetCondition", "Event"],
    ),
    (
        "suspect, cordoned by healer before a restart → cordon again (idempotent)",
        facts(NodeState.SUSPECT, incident=incident(), firing=HOT, view=CORDONED),
        "quarantine",
        NodeState.QUARANTINED,
        ["Cordon", "Taint", "SetCondition", "Event"],
    ),
    (
        "suspect, taint-only rule → quarantined without cordon",
        facts(NodeState.SUSPECT, incident=incident(), firing=(finding("Throttled"),)),
        "quarantine",
        NodeState.QUARANTINED,
        ["Taint", "SetCondition", "Event"],
    ),
    (
        "suspect, only pending → wait",
        facts(NodeState.SUSPECT, incident=incident(), pending=(finding(state=FindingState.PENDING),)),
        None,
        None,
        [],
    ),
    (
        "suspect, cleared → healthy, incident closed",
        facts(NodeState.SUSPECT, incident=incident()),
        "cleared before action",
        NodeState.HEALTHY,
        [],
    ),
    (
        "suspect, ticket-only rule → ticket, node untouched",
        facts(NodeState.SUSPECT, incident=incident(), firing=(finding("NeedsTicket"),)),
        "ticket only",
        None,
        ["RequestTicket"],
    ),
    (
        "quarantined, rule drains and still fires → draining",
        facts(NodeState.QUARANTINED, incident=HELD, firing=HOT, view=CORDONED),
        "drain",
        NodeState.DRAINING,
        ["StartDrain", "Event"],
    ),
    (
        "quarantined, rule without drain → awaiting repair with a ticket",
        facts(
            NodeState.QUARANTINED,
            incident=replace(HELD, rule="XidFatal"),
            firing=(finding("XidFatal"),),
            view=CORDONED,
        ),
        "quarantined, no drain",
        NodeState.AWAITING_REPAIR,
        ["RequestTicket"],
    ),
    (
        "quarantined, finding cleared before drain → validating",
        facts(NodeState.QUARANTINED, incident=HELD, view=CORDONED),
        "cleared while quarantined",
        NodeState.VALIDATING,
        [],
    ),
    (
        "quarantined, node unknown → no new step",
        facts(NodeState.QUARANTINED, incident=HELD, firing=HOT, unknown=True, view=CORDONED),
        None,
        None,
        [],
    ),
    (
        "quarantined, rule frozen → no drain",
        facts(
            NodeState.QUARANTINED,
            incident=HELD,
            firing=HOT,
            frozen_rules=frozenset({"GpuTooHot"}),
            view=CORDONED,
        ),
        None,
        None,
        [],
    ),
    (
        "quarantined, human uncordoned → released, hands off",
        facts(NodeState.QUARANTINED, incident=HELD, firing=HOT, view=view(owned=True)),
        "human took over",
        NodeState.RELEASED,
        ["Event", "Release", "SetCondition"],  # the fault still fires: the condition stays False
    ),
    (
        "quarantined, human uncordoned, no findings seen (drain pass) → released, condition False",
        facts(NodeState.QUARANTINED, incident=HELD, view=view(owned=True)),
        "human took over",
        NodeState.RELEASED,
        ["Event", "Release", "SetCondition"],  # until a tick shows the fault clear
    ),
    (
        "taint only, human cordoned → released",
        facts(
            NodeState.QUARANTINED,
            incident=incident(rule="Throttled", expect_unschedulable=False),
            view=view(unschedulable=True),
        ),
        "human took over",
        NodeState.RELEASED,
        ["Event", "Release", "SetCondition"],  # not healthy until a tick shows Throttled clear
    ),
    (
        "draining, human uncordon mid-drain → released",
        facts(NodeState.DRAINING, incident=HELD, firing=HOT, view=view(owned=True)),
        "human took over",
        NodeState.RELEASED,
        ["Event", "Release", "SetCondition"],
    ),
    (
        "draining, healer's taint removed by a human (still cordoned) → released",
        facts(NodeState.DRAINING, incident=HELD, firing=HOT, view=CORDONED, taint_missing=True),
        "human took over",
        NodeState.RELEASED,
        ["Event", "Release", "SetCondition"],
    ),
    (
        "draining, opt-out label added → released, nothing touched on the node",
        facts(NodeState.DRAINING, incident=HELD, firing=HOT, view=CORDONED, opted_out=True),
        "human took over",
        NodeState.RELEASED,
        [],
    ),
    (
        "awaiting repair, operator release requested → validating",
        facts(
            NodeState.AWAITING_REPAIR,
            incident=replace(HELD, release_requested={"actor": "cli:alice", "reason": "GPU swapped"}),
            firing=HOT,
            view=CORDONED,
        ),
        "operator release",
        NodeState.VALIDATING,
        [],
    ),
    (
        "draining, operator release requested → validating (the drain ends)",
        facts(
            NodeState.DRAINING,
            incident=replace(HELD, release_requested={"actor": "bob"}),
            view=CORDONED,
        ),
        "operator release",
        NodeState.VALIDATING,
        [],
    ),
    (
        "validating, a release requested meanwhile → the request is dropped",
        facts(
            NodeState.VALIDATING,
            incident=replace(HELD, release_requested={"actor": "bob"}),
            view=CORDONED,
        ),
        "release request dropped",
        None,
        [],
    ),
    (
        "draining, uncordoned and a release requested → the human's uncordon wins",
        facts(
            NodeState.DRAINING,
            incident=replace(HELD, release_requested={"actor": "bob"}),
            view=view(owned=True),
        ),
        "human took over",
        NodeState.RELEASED,
        ["Event", "Release", "SetCondition"],  # the incident's rule is taken as still firing
    ),
    (
        "draining, no report yet → nothing (advance_drains drives it)",
        facts(NodeState.DRAINING, incident=HELD, firing=HOT, view=CORDONED),
        None,
        None,
        [],
    ),
    (
        "draining, drain done → awaiting repair with a ticket",
        facts(
            NodeState.DRAINING, incident=HELD, view=CORDONED, drain=DrainReport(done=True, evicted=("a/b",))
        ),
        "drained",
        NodeState.AWAITING_REPAIR,
        ["Event", "RequestTicket"],
    ),
    (
        "draining, PodDisruptionBudget past the deadline → blocked, Event",
        facts(
            NodeState.DRAINING,
            incident=HELD,
            view=CORDONED,
            drain=DrainReport(done=False, blocked=True, blocked_pods=("inf/web-0",), budgets=("inf/web",)),
        ),
        "drain blocked",
        NodeState.BLOCKED,
        ["Event", "RequestTicket"],  # the rule's ticket escalates the blocked drain at once
    ),
    (
        "draining, pods kubectl refuses → blocked",
        facts(
            NodeState.DRAINING,
            incident=HELD,
            view=CORDONED,
            drain=DrainReport(done=False, refused={"ml/train-0": "emptyDir"}),
        ),
        "drain blocked",
        NodeState.BLOCKED,
        ["Event", "RequestTicket"],
    ),
    (
        "awaiting repair, ticket resolved → repaired",
        facts(NodeState.AWAITING_REPAIR, incident=replace(HELD, ticket=TicketStatus.RESOLVED), view=CORDONED),
        "repaired",
        NodeState.REPAIRED,
        [],
    ),
    (
        "awaiting repair, ticket in progress → wait",
        facts(
            NodeState.AWAITING_REPAIR, incident=replace(HELD, ticket=TicketStatus.IN_PROGRESS), view=CORDONED
        ),
        None,
        None,
        [],
    ),
    (
        "repaired → validating",
        facts(NodeState.REPAIRED, incident=HELD, view=CORDONED),
        "validate",
        NodeState.VALIDATING,
        [],
    ),
    (
        "validating, clear → the recovery hold starts",
        facts(NodeState.VALIDATING, incident=HELD, view=CORDONED),
        "hold starts",
        None,
        [],
    ),
    (
        "validating, clear but hold not over → wait",
        facts(
            NodeState.VALIDATING,
            incident=replace(HELD, clear_since=NOW - timedelta(seconds=299)),
            view=CORDONED,
        ),
        None,
        None,
        [],
    ),
    (
        "validating, clear for the recovery hold → healthy, released",
        facts(
            NodeState.VALIDATING,
            incident=replace(HELD, clear_since=NOW - timedelta(seconds=300)),
            view=CORDONED,
        ),
        "return to service",
        NodeState.HEALTHY,
        ["Release", "Event"],
    ),
    (
        "validating, unknown node never counts as recovery",
        facts(
            NodeState.VALIDATING,
            incident=replace(HELD, clear_since=NOW - timedelta(hours=1)),
            unknown=True,
            view=CORDONED,
        ),
        "hold interrupted",
        None,
        [],
    ),
    (
        "validating, a frozen rule never counts as recovery",
        facts(
            NodeState.VALIDATING,
            incident=replace(HELD, clear_since=NOW - timedelta(hours=1)),
            frozen_rules=frozenset({"XidFatal"}),
            view=CORDONED,
        ),
        "hold interrupted",  # only observed clear time counts: the hold starts again with the data
        None,
        [],
    ),
    (
        "validating, pending again → hold restarts",
        facts(
            NodeState.VALIDATING,
            incident=replace(HELD, clear_since=NOW - timedelta(seconds=100)),
            pending=(finding(state=FindingState.PENDING),),
            view=CORDONED,
        ),
        "hold interrupted",
        None,
        [],
    ),
    (
        "validating, fires again → quarantined under a new incident, cordon kept",
        facts(NodeState.VALIDATING, incident=HELD, firing=HOT, view=CORDONED),
        "failed validation",
        NodeState.QUARANTINED,
        ["Cordon", "Taint", "SetCondition", "Event"],
    ),
    (
        "validating, still firing only in its recovery hold (condition clear) → not a failure",
        facts(
            NodeState.VALIDATING,
            incident=HELD,
            firing=(replace(finding(), clear_since=NOW - timedelta(seconds=30)),),
            view=CORDONED,
        ),
        None,
        None,
        [],
    ),
    (
        "blocked by budget, still firing → quarantine re-evaluated",
        facts(NodeState.BLOCKED, incident=incident(blocked_step="quarantine"), firing=HOT),
        "retry quarantine",
        NodeState.QUARANTINED,
        ["Cordon", "Taint", "SetCondition", "Event"],
    ),
    (
        "blocked by budget, cleared → healthy",
        facts(NodeState.BLOCKED, incident=incident(blocked_step="quarantine")),
        "cleared while blocked",
        NodeState.HEALTHY,
        [],
    ),
    (
        "draining, PodDisruptionBudget past the deadline, rule without a ticket → blocked, Event",
        facts(
            NodeState.DRAINING,
            incident=replace(HELD, rule="DrainNoTicket"),
            view=CORDONED,
            drain=DrainReport(done=False, blocked=True, blocked_pods=("inf/web-0",), budgets=("inf/web",)),
        ),
        "drain blocked",
        NodeState.BLOCKED,
        ["Event"],
    ),
    (
        "blocked drain, its ticket resolved → repaired",
        facts(
            NodeState.BLOCKED,
            incident=replace(HELD, blocked_step="drain", ticket=TicketStatus.RESOLVED),
            view=CORDONED,
        ),
        "repaired while blocked",
        NodeState.REPAIRED,
        [],
    ),
    (
        "blocked drain, ticket still open → waits",
        facts(
            NodeState.BLOCKED,
            incident=replace(HELD, blocked_step="drain", ticket=TicketStatus.IN_PROGRESS),
            view=CORDONED,
        ),
        None,
        None,
        [],
    ),
    (
        "awaiting repair without a ticket (quarantine-only rule), findings clear → validating",
        facts(NodeState.AWAITING_REPAIR, incident=replace(HELD, rule="QuarantineOnly"), view=CORDONED),
        "cleared, no ticket",
        NodeState.VALIDATING,
        [],
    ),
    (
        "awaiting repair without a ticket, still firing → stays",
        facts(
            NodeState.AWAITING_REPAIR,
            incident=replace(HELD, rule="QuarantineOnly"),
            firing=(finding("QuarantineOnly"),),
            view=CORDONED,
        ),
        None,
        None,
        [],
    ),
    (
        "awaiting repair without a ticket, a rule frozen → stays (no data is not clear)",
        facts(
            NodeState.AWAITING_REPAIR,
            incident=replace(HELD, rule="QuarantineOnly"),
            frozen_rules=frozenset({"QuarantineOnly"}),
            view=CORDONED,
        ),
        None,
        None,
        [],
    ),
    (
        "awaiting repair, ticket sent → waits for the provider even when clear",
        facts(NodeState.AWAITING_REPAIR, incident=replace(HELD, ticket=TicketStatus.SENT), view=CORDONED),
        None,
        None,
        [],
    ),
    (
        "blocked drain waits for a human",
        facts(NodeState.BLOCKED, incident=replace(HELD, blocked_step="drain"), view=CORDONED),
        None,
        None,
        [],
    ),
    (
        "released, still firing → hands off (no re-cordon)",
        facts(NodeState.RELEASED, incident=incident(rule="GpuTooHot"), firing=HOT),
        None,
        None,
        [],
    ),
    (
        "released, findings clear → healthy: the next firing is a new incident",
        facts(NodeState.RELEASED, incident=incident(rule="GpuTooHot")),
        "human's node clear",
        NodeState.HEALTHY,
        ["SetCondition"],  # GpuHealthy back to True: the fault is gone
    ),
    ("healthy, no data → unknown", facts(NodeState.HEALTHY, unknown=True), "no data", NodeState.UNKNOWN, []),
    (
        "healthy, unknown and a stale firing finding → unknown, no action",
        facts(NodeState.HEALTHY, unknown=True, firing=HOT),
        "no data",
        NodeState.UNKNOWN,
        [],
    ),
    ("unknown, data back → healthy", facts(NodeState.UNKNOWN), "data back", NodeState.HEALTHY, []),
    (
        "node deleted mid-drain → unknown, incident closed",
        facts(NodeState.DRAINING, incident=HELD, deleted=True, view=None),
        "deleted",
        NodeState.UNKNOWN,
        [],
    ),
    (
        "notify-only rule does not move the node",
        facts(NodeState.HEALTHY, firing=(finding("EccNotice"),)),
        None,
        None,
        [],
    ),
]


@pytest.mark.parametrize(
    ("facts_", "row", "to", "effects"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_transition_table(
    facts_: lc.NodeFacts, row: str | None, to: NodeState | None, effects: list[str]
) -> None:
    step = lc.decide(facts_, CTX)
    assert (step.row if step else None) == row
    assert (step.to if step else None) == to
    assert kinds(step) == effects


def test_an_operator_release_is_acted_on_once() -> None:
    """The request is an input on the incident: the step that acts on it forgets it, so the next
    tick does not send the node back to validating a second time."""
    inc = replace(HELD, release_requested={"actor": "cli:alice", "reason": "GPU swapped"}, clear_since=NOW)
    step = lc.decide(facts(NodeState.AWAITING_REPAIR, incident=inc, view=CORDONED), CTX)
    assert step is not None and "released by cli:alice (GPU swapped)" in step.reason
    after = lc.remember(inc, step)
    assert after.release_requested is None
    assert after.clear_since is None  # validation's hold starts from scratch


def test_every_state_has_a_way_on() -> None:
    """Each state is the source of at least one row, except healthy's destinations it reaches."""
    sources = set().union(*(r.states for r in lc.TABLE))
    assert set(NodeState) <= sources


def test_quarantine_records_ownership_and_evidence() -> None:
    step = lc.decide(facts(NodeState.SUSPECT, incident=incident(), firing=HOT), CTX)
    assert step is not None
    assert step.memory.cordoned_by_healer is True
    assert step.memory.expect_unschedulable is True
    assert step.memory.rule == "GpuTooHot"
    assert step.evidence == {"findings": [HOT[0].evidence]}
    assert step.kind == lc.StepKind.QUARANTINE and not step.already_out
    taint = next(e for e in step.effects if isinstance(e, lc.Taint))
    assert (taint.value, taint.effect) == ("GpuTooHot", "NoSchedule")


def test_human_cordon_first_is_never_claimed() -> None:
    step = lc.decide(
        facts(NodeState.SUSPECT, incident=incident(), firing=HOT, view=view(unschedulable=True)), CTX
    )
    assert step is not None and step.memory.cordoned_by_healer is False
    assert step.memory.expect_unschedulable is True


def test_several_rules_strongest_first() -> None:
    """Findings of several rules attach to one incident; the rule that drains leads."""
    both = (finding("Throttled"), finding("XidFatal"), finding("GpuTooHot"))
    step = lc.decide(facts(NodeState.SUSPECT, incident=incident(), firing=both), CTX)
    assert step is not None and step.memory.rule == "GpuTooHot"
    assert step.evidence is not None and len(step.evidence["findings"]) == 3  # type: ignore[arg-type]


def test_released_until_a_new_incident() -> None:
    """Human uncordon → released; firing on → nothing; clear → healthy; firing again → suspect, new
    incident → quarantined again."""
    released = lc.decide(facts(NodeState.QUARANTINED, incident=HELD, firing=HOT, view=view(owned=True)), CTX)
    assert released is not None and released.to == NodeState.RELEASED and released.memory.forget_hold
    after = lc.apply_memory(HELD, released)
    assert after is not None and after.expect_unschedulable is None
    for minutes in (1, 10, 60):
        ctx = replace(CTX, now=NOW + timedelta(minutes=minutes))
        assert lc.decide(facts(NodeState.RELEASED, incident=after, firing=HOT), ctx) is None
    clear = lc.decide(facts(NodeState.RELEASED, incident=after), CTX)
    assert clear is not None and clear.to == NodeState.HEALTHY and clear.close_incident
    again = lc.decide(facts(NodeState.HEALTHY, firing=HOT), CTX)
    assert again is not None and again.to == NodeState.SUSPECT and again.open_incident


@pytest.mark.parametrize("fired_key_seen", [False, True])
def test_notify_only_rule_sends_one_event_per_episode(fired_key_seen: bool) -> None:
    f = finding("EccNotice")
    key = f"{f.series_key}@{f.fired_at.isoformat()}"  # type: ignore[union-attr]
    notified = frozenset({key}) if fired_key_seen else frozenset()
    steps = lc.notices(facts(NodeState.HEALTHY, firing=(f,), notified=notified), CTX)
    if fired_key_seen:
        assert steps == []
    else:
        assert [s.kind for s in steps] == [lc.StepKind.NOTIFY]
        assert steps[0].effects == (lc.Event("HealerNotify", "ECC", key=key),)
        assert steps[0].to is None


def test_notify_never_for_unknown_or_frozen() -> None:
    f = (finding("EccNotice"),)
    assert lc.notices(facts(NodeState.HEALTHY, firing=f, unknown=True), CTX) == []
    assert lc.notices(facts(NodeState.HEALTHY, firing=f, frozen_rules=frozenset({"EccNotice"})), CTX) == []


def test_frozen_rule_never_quarantines() -> None:
    step = lc.decide(
        facts(NodeState.SUSPECT, incident=incident(), firing=HOT, frozen_rules=frozenset({"GpuTooHot"})), CTX
    )
    assert step is None or step.kind != lc.StepKind.QUARANTINE


def test_recovery_hold_is_at_least_the_settings_value() -> None:
    ctx = replace(CTX, recovery_hold_seconds=900)
    waiting = facts(
        NodeState.VALIDATING, incident=replace(HELD, clear_since=NOW - timedelta(seconds=600)), view=CORDONED
    )
    assert lc.decide(waiting, ctx) is None
    later = replace(ctx, now=NOW + timedelta(seconds=300))
    step = lc.decide(waiting, later)
    assert step is not None and step.to == NodeState.HEALTHY


def test_drain_blocked_names_pods_and_budgets() -> None:
    report = DrainReport(done=False, blocked=True, blocked_pods=("inf/web-0",), budgets=("inf/web",))
    step = lc.decide(facts(NodeState.DRAINING, incident=HELD, view=CORDONED, drain=report), CTX)
    assert step is not None
    assert "inf/web-0" in step.reason and "inf/web" in step.reason
    event = step.effects[0]
    assert isinstance(event, lc.Event) and event.reason == "HealerDrainBlocked"
    assert step.memory.blocked_step == "drain"


def test_drain_round_only_when_the_drain_pass_asks() -> None:
    assert lc.decide(facts(NodeState.DRAINING, incident=HELD, view=CORDONED, firing=HOT), CTX) is None
    step = lc.decide(facts(NodeState.DRAINING, incident=HELD, view=CORDONED, firing=HOT, drain_due=True), CTX)
    assert step is not None and step.row == "drain step" and step.to is None
    assert step.kind == lc.StepKind.DRAIN and step.effects == (lc.DrainStep(),)


def test_drain_starts_with_the_rule_options() -> None:
    step = lc.decide(facts(NodeState.QUARANTINED, incident=HELD, view=CORDONED, firing=HOT), CTX)
    assert step is not None
    start = next(e for e in step.effects if isinstance(e, lc.StartDrain))
    assert start.options.timeout_seconds == 3600.0 and start.options.concurrency == 8


def test_memory_forgets_the_blocked_step_when_the_node_moves_on() -> None:
    blocked = lc.decide(
        facts(
            NodeState.DRAINING,
            incident=HELD,
            view=CORDONED,
            drain=DrainReport(done=False, blocked=True, blocked_pods=("a/b",)),
        ),
        CTX,
    )
    assert blocked is not None
    after = lc.remember(HELD, blocked)
    assert after.blocked_step == "drain" and after.expect_unschedulable is True
    released = lc.decide(facts(NodeState.BLOCKED, incident=after, firing=HOT, view=view(owned=True)), CTX)
    assert released is not None and released.to == NodeState.RELEASED
    assert lc.remember(after, released).blocked_step is None


def test_a_rule_drain_without_options_drains_with_the_default_options() -> None:
    assert DrainAction().options() == DrainOptions()
    custom = DrainAction(timeout=60, grace_period=5, force=True, concurrency=2).options()
    assert (custom.timeout_seconds, custom.grace_period_seconds, custom.force, custom.concurrency) == (
        60,
        5,
        True,
        2,
    )
