"""The node lifecycle: one node's facts this tick → the step healer wants next. Pure, time passed in.

::

    healthy ──finding──> suspect ──firing quarantine/taint rule──> quarantined ──rule drains──> draining
       ▲                   │ clear                                    │ no drain              │ done
       │                   ▼                                          ▼                       ▼
       │                healthy                              awaiting_repair <────────────────┘
       │                                                              │ ticket resolved (or operator release)
       │   rules clear for the recovery hold                          ▼
       └──────────────────────────────────────── validating <──── repaired

    blocked   a step was refused (budget, breaker) or a drain could not finish (PodDisruptionBudget
              past the deadline, pods kubectl refuses to drain); the reason is recorded. A blocked
              drain asks for the rule's ticket at once (naming the pods and budgets); its
              resolution moves the node on to repaired
    awaiting_repair with no ticket (a rule that only quarantines): validating once the findings
              clear, so every quarantine has a way out
    released  a human uncordoned (or cordoned) a node healer held: hands off until the findings
              clear; the next firing opens a new incident
    unknown   no data (exporter down or stale) or the node was deleted: neither healthy nor faulty

:func:`decide` walks :data:`TABLE`, a list of (states, condition) → step rows, and returns the
first row's step; the reconciler (``healer.controller.reconcile``) asks :mod:`healer.engine.safety` whether a
step that touches the node may run, runs its :class:`Effect` values through ``NodeActions`` and
records the transition. Effects are data: this module performs no I/O and reads no clock.

Facts come from: this tick's findings (``healer.engine.evaluation``), the node read fresh from the
API server (:class:`~healer.model.node.NodeView`), the open incident's remediation memory (the
``incidents`` table) and the last drain step (:class:`~healer.model.drain.DrainReport`).

Ownership follows the anchors in ``reference/kubernetes.md``: healer uncordons only nodes it
cordoned (draino, kured: a node already unschedulable before healer acted is never uncordoned), and
a human's uncordon or cordon wins (NVSentinel, medik8s), ending healer's involvement until new
evidence. Unknown nodes and frozen rules never start an action and never count as recovery.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import TypeVar

from healer.model.drain import DrainOptions, DrainReport
from healer.model.findings import Finding
from healer.model.node import NodeView, TaintEffect
from healer.model.states import FindingState, NodeState, TicketStatus
from healer.ruleset.durations import format_duration
from healer.ruleset.schema import (
    DrainAction,
    NotifyAction,
    QuarantineAction,
    Rule,
    RuleSet,
    TaintAction,
    TicketAction,
)

#: Recovery hold when the rule sets none, seconds: a node must stay clear this long in
#: ``validating`` before healer hands it back (medik8s ``healthyDelay``).
DEFAULT_RECOVERY_HOLD_SECONDS = 300.0

#: States in which healer holds the node (cordon and/or taint on it), so a human's change of
#: ``spec.unschedulable`` means a takeover.
HELD = frozenset(
    {
        NodeState.QUARANTINED,
        NodeState.DRAINING,
        NodeState.AWAITING_REPAIR,
        NodeState.REPAIRED,
        NodeState.VALIDATING,
        NodeState.BLOCKED,
    }
)


_A = TypeVar("_A")


# --- effects: what the executor does through NodeActions / the ticket outbox --------------------


@dataclass(frozen=True)
class Cordon:
    """Set ``spec.unschedulable`` and healer's ownership annotations (incident, reason, time)."""

    reason: str


@dataclass(frozen=True)
class Taint:
    """Add healer's taint ``<domain>/quarantined=<value>:<effect>``."""

    value: str
    effect: TaintEffect


@dataclass(frozen=True)
class SetCondition:
    """Set the node condition (``GpuHealthy`` by default) on the status subresource."""

    healthy: bool
    reason: str
    message: str


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event on the Node; ``key`` de-duplicates notifications across ticks."""

    reason: str
    message: str
    warning: bool = True
    key: str | None = None


@dataclass(frozen=True)
class StartDrain:
    """Record the drain's start; the drain pass evicts pods step by step with ``options``."""

    rule: str
    options: DrainOptions


@dataclass(frozen=True)
class DrainStep:
    """One ``kubectl drain`` round (evict what may be evicted now) with the drain's recorded options."""


@dataclass(frozen=True)
class RequestTicket:
    """Ask the provider to repair the node (a row in the ticket outbox, same transaction)."""

    provider: str
    template: str | None


@dataclass(frozen=True)
class Release:
    """Remove healer's taint, condition and annotations; uncordon only if healer cordoned it."""


Effect = Cordon | Taint | SetCondition | Event | StartDrain | DrainStep | RequestTicket | Release


class StepKind(StrEnum):
    """What a step does to the node, which is what safety judges (see ``healer.engine.safety``)."""

    QUARANTINE = "quarantine"  # takes the node out of service (cordon or taint)
    DRAIN = "drain"
    TICKET = "ticket"
    RELEASE = "release"  # hands the node back (uncordon when healer cordoned)
    NOTIFY = "notify"  # an Event only
    RECORD = "record"  # bookkeeping: a transition with no effect on the node


# --- inputs ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IncidentFacts:
    """The open incident's remediation memory (``incidents`` row) and its ticket's status."""

    id: int
    rule: str | None = None
    cordoned_by_healer: bool = False
    expect_unschedulable: bool | None = None  # None: healer holds nothing on the node
    drain_started_at: datetime | None = None
    blocked_step: str | None = None  # "quarantine" (node untouched) | "drain" (node cordoned)
    clear_since: datetime | None = None
    ticket: TicketStatus | None = None  # the latest ticket of the incident; None = none requested


@dataclass(frozen=True)
class NodeFacts:
    """Everything :func:`decide` knows about one node in one tick.

    ``firing``/``pending`` are this tick's findings for the node (all rules, frozen ones included:
    their previous state stands); ``view`` is the node as read from the API server this tick (None
    when not read); ``drain_due`` whether a drain round is due (the drain pass); ``drain`` the
    report of the round just run; ``notified``
    the keys of notifications already sent; ``owned`` whether the node carries healer's
    ``cordoned-by`` annotation (a cordon healer made, possibly before a restart).
    """

    name: str
    state: NodeState
    incident: IncidentFacts | None = None
    firing: tuple[Finding, ...] = ()
    pending: tuple[Finding, ...] = ()
    unknown: bool = False
    frozen_rules: frozenset[str] = frozenset()
    view: NodeView | None = None
    deleted: bool = False
    drain_due: bool = False
    drain: DrainReport | None = None
    notified: frozenset[str] = frozenset()
    owned: bool = False


# --- output ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Memory:
    """Changes to the incident's remediation memory that come with a step (None = unchanged)."""

    rule: str | None = None
    cordoned_by_healer: bool | None = None
    expect_unschedulable: bool | None = None
    forget_hold: bool = False  # healer no longer holds the node (expect_unschedulable → None)
    blocked_step: str | None = None
    clear_since: datetime | None = None
    reset_clear: bool = False


@dataclass(frozen=True)
class Step:
    """One wanted step: the state to move to (None = stay), why, and the effects.

    ``open_incident`` opens one when none is open; ``new_incident`` closes the open one (with
    ``close_incident`` as its reason) and opens another; ``close_incident`` alone closes it.
    ``blocks_on_refusal`` tells the executor a refused step moves the node to ``blocked``.
    """

    kind: StepKind
    to: NodeState | None
    reason: str
    effects: tuple[Effect, ...] = ()
    evidence: dict[str, object] | None = None
    memory: Memory = field(default_factory=Memory)
    open_incident: bool = False
    new_incident: bool = False
    close_incident: str | None = None
    already_out: bool = False  # the node already counts against its pool's budget
    row: str = ""  # the table row that chose it (for tests and logs)


# --- derived facts --------------------------------------------------------------------------------


def _kinds(rule: Rule) -> set[str]:
    return {a.kind for a in rule.actions}


def _action(rule: Rule, cls: type[_A]) -> _A | None:
    for action in rule.actions:
        if isinstance(action, cls):
            return action
    return None


def _tickets(rule: Rule) -> list[TicketAction]:
    return [a for a in rule.actions if isinstance(a, TicketAction)]


_SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}


@dataclass(frozen=True)
class Context:
    """The tick's fixed inputs: the rule set, ``now`` and the default recovery hold (seconds)."""

    rules: RuleSet
    now: datetime
    recovery_hold_seconds: float = DEFAULT_RECOVERY_HOLD_SECONDS

    def rule(self, name: str | None) -> Rule | None:
        if name is None:
            return None
        try:
            return self.rules.rule(name)
        except KeyError:
            return None


def _acting_kinds(rule: Rule) -> bool:
    return bool(_kinds(rule) & {"quarantine", "taint", "ticket"})


def _remediates(rule: Rule) -> bool:
    return bool(_kinds(rule) & {"quarantine", "taint"})


def actionable(facts: NodeFacts, ctx: Context) -> list[Finding]:
    """Firing findings that may start an action: rule known and not frozen, node not unknown."""
    if facts.unknown:
        return []
    return [f for f in facts.firing if f.rule not in facts.frozen_rules and ctx.rule(f.rule) is not None]


def remediating(facts: NodeFacts, ctx: Context) -> list[Finding]:
    """Actionable findings whose rule quarantines or taints, strongest rule first.

    Order: drains, quarantines (vs taint only), tickets, severity, earliest fired, rule name.
    """
    found = [f for f in actionable(facts, ctx) if _remediates(ctx.rules.rule(f.rule))]

    def strength(f: Finding) -> tuple[object, ...]:
        kinds = _kinds(ctx.rules.rule(f.rule))
        fired = (f.fired_at or ctx.now).timestamp()
        return (
            "drain" not in kinds,
            "quarantine" not in kinds,
            "ticket" not in kinds,
            _SEVERITY_RANK.get(f.severity, 3),
            fired,
            f.rule,
        )

    return sorted(found, key=strength)


def _concerning(facts: NodeFacts, ctx: Context) -> list[Finding]:
    """Firing or pending findings (frozen included) of rules that act on nodes (not notify-only)."""
    out = []
    for f in (*facts.firing, *facts.pending):
        rule = ctx.rule(f.rule)
        if rule is None or _acting_kinds(rule):
            out.append(f)
    return out


def _clear(facts: NodeFacts, ctx: Context) -> bool:
    """No finding of a rule that acts on nodes is firing or pending (notify-only rules are not
    faults), data is present and no rule is frozen: the only kind of tick that counts toward
    recovery."""
    return not _concerning(facts, ctx) and not facts.unknown and not facts.frozen_rules


def _evidence(findings: Sequence[Finding]) -> dict[str, object] | None:
    if not findings:
        return None
    return {"findings": [f.evidence for f in findings]}


def _value_text(finding: Finding) -> str:
    """The finding's value as a person reads it: counts whole, others to 4 significant digits."""
    value = finding.value
    if value is None:
        return "no value"
    if not math.isfinite(value):
        text = str(value)
    elif abs(value - round(value)) < 0.05 and abs(value) >= 1:
        text = str(round(value))  # increase() of a counter is a count: 1.032 errors reads "1"
    else:
        text = f"{value:.4g}"
    return f"{text} {finding.unit}" if finding.unit else text


def _hold(rule: Rule | None) -> str:
    """The rule's effective ``for`` (scaled in the demo), as ``held 30s`` (empty without one)."""
    if rule is None or rule.for_ <= 0:
        return ""
    return f"held {format_duration(rule.for_)}"


def _finding_story(finding: Finding, ctx: Context) -> str:
    """One line naming the rule, where, its value and its real hold: ``GpuTooHot firing on GPU 3
    (value 81 C, held 30s): GPU 3 at 81 C, above 78 C``."""
    rule = ctx.rule(finding.rule)
    where = f" on GPU {finding.gpu}" if finding.gpu else ""
    if finding.state == FindingState.FIRING:
        state = "firing"
        detail = ", ".join(p for p in (f"value {_value_text(finding)}", _hold(rule)) if p)
    else:
        state = "pending"
        wait = f"acts if it holds {format_duration(rule.for_)}" if rule is not None and rule.for_ > 0 else ""
        detail = ", ".join(p for p in (f"value {_value_text(finding)}", wait) if p)
    text = f"{finding.rule} {state}{where} ({detail})"
    return f"{text}: {finding.summary}" if finding.summary else text


def _suspect_reason(facts: NodeFacts, ctx: Context) -> str:
    found = _concerning(facts, ctx)
    more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
    return _finding_story(found[0], ctx) + more


def _message(finding: Finding) -> str:
    text = finding.summary or f"rule {finding.rule} is firing"
    where = f" (GPU {finding.gpu})" if finding.gpu else ""
    return f"{text}{where}"


def _human_took_over(facts: NodeFacts) -> bool:
    inc = facts.incident
    return (
        inc is not None
        and inc.expect_unschedulable is not None
        and facts.view is not None
        and facts.view.unschedulable != inc.expect_unschedulable
    )


def _hold_seconds(facts: NodeFacts, ctx: Context) -> float:
    # A rule's keep_firing_for already kept its finding firing after the condition cleared (the
    # node is not "clear" before that); the recovery hold counts from there, not on top of it twice.
    return ctx.recovery_hold_seconds


# --- step builders --------------------------------------------------------------------------------


def _quarantine(facts: NodeFacts, ctx: Context, *, reason: str, row: str, **extra: object) -> Step | None:
    """Cordon (unless a human already did) or taint, set the condition, tell the story in an Event."""
    found = remediating(facts, ctx)
    if not found or facts.view is None:
        return None
    finding = found[0]
    rule = ctx.rules.rule(finding.rule)
    message = _message(finding)
    effects: list[Effect] = []
    quarantine = _action(rule, QuarantineAction)
    if quarantine is not None:
        # kured's rule: a node unschedulable before healer acted stays the human's; never claim it.
        claim = not facts.view.unschedulable or facts.owned
        if claim:
            effects.append(Cordon(reason=f"{rule.name}: {message}"))
        effects.append(Taint(value=rule.name, effect=quarantine.taint_effect))
        memory = Memory(rule=rule.name, cordoned_by_healer=claim, expect_unschedulable=True)
        event = Event("HealerQuarantined", f"quarantined by rule {rule.name}: {message}")
    else:
        taint = _action(rule, TaintAction)
        assert taint is not None
        effects.append(Taint(value=rule.name, effect=taint.effect))
        memory = Memory(
            rule=rule.name, cordoned_by_healer=False, expect_unschedulable=facts.view.unschedulable
        )
        event = Event("HealerTainted", f"tainted by rule {rule.name}: {message}")
    effects.append(SetCondition(healthy=False, reason=rule.name, message=message))
    effects.append(event)
    done = "quarantined (cordoned and tainted)" if quarantine is not None else "tainted (not cordoned)"
    return Step(
        kind=StepKind.QUARANTINE,
        to=NodeState.QUARANTINED,
        reason=f"{done}: {reason}: {_finding_story(finding, ctx)}",
        effects=tuple(effects),
        evidence=_evidence(found),
        memory=memory,
        row=row,
        **extra,  # type: ignore[arg-type]
    )


def _ticket_effects(rule: Rule | None) -> tuple[Effect, ...]:
    if rule is None:
        return ()
    return tuple(RequestTicket(provider=t.provider, template=t.template) for t in _tickets(rule))


def _after_hold(facts: NodeFacts, ctx: Context, rule: Rule | None, *, reason: str, row: str) -> Step:
    """Quarantined (or drained) → awaiting_repair, asking for a ticket when the rule says so."""
    tickets = _ticket_effects(rule)
    return Step(
        kind=StepKind.TICKET if tickets else StepKind.RECORD,
        to=NodeState.AWAITING_REPAIR,
        reason=reason,
        effects=tickets,
        evidence=_evidence([f for f in facts.firing if rule is not None and f.rule == rule.name]),
        already_out=True,
        row=row,
    )


def _acting_rule(facts: NodeFacts, ctx: Context) -> Rule | None:
    """The incident's rule while it still fires actionably, else the strongest firing one."""
    found = remediating(facts, ctx)
    names = [f.rule for f in found]
    inc_rule = facts.incident.rule if facts.incident else None
    if inc_rule in names:
        return ctx.rules.rule(inc_rule)
    return ctx.rules.rule(names[0]) if names else None


# --- the table ------------------------------------------------------------------------------------

Guard = Callable[[NodeFacts, Context], bool]
Build = Callable[[NodeFacts, Context], Step | None]


@dataclass(frozen=True)
class Row:
    """``states`` and ``when`` → ``then``; the first matching row wins."""

    name: str
    states: frozenset[NodeState]
    when: Guard
    then: Build


ANY = frozenset(NodeState)


def _s(*states: NodeState) -> frozenset[NodeState]:
    return frozenset(states)


def _deleted(f: NodeFacts, c: Context) -> Step:
    return Step(
        StepKind.RECORD,
        NodeState.UNKNOWN,
        "node deleted from the cluster: remediation ends",
        close_incident="node deleted",
        memory=Memory(forget_hold=True),
        row="deleted",
    )


def _released(f: NodeFacts, c: Context) -> Step:
    assert f.view is not None
    what = "uncordoned" if not f.view.unschedulable else "cordoned"
    return Step(
        StepKind.RELEASE,
        NodeState.RELEASED,
        f"node {what} by someone else: healer keeps its hands off until a new incident",
        # The human wants the node back (uncordon) or owns it (cordon): healer's taint and condition
        # must not keep fighting them. Release uncordons only where healer's annotation says it
        # cordoned, and the node is already uncordoned in that case.
        effects=_release_effects(f, c, what),
        memory=Memory(forget_hold=True),
        already_out=True,
        row="human took over",
    )


def _release_effects(f: NodeFacts, c: Context, what: str) -> tuple[Effect, ...]:
    """Hand the node to the human; while a fault still fires, the condition keeps saying so
    (``GpuHealthy=False``) instead of "released by healer"."""
    effects: list[Effect] = [
        Event("HealerReleased", f"node {what} by someone else; healer stops remediating it"),
        Release(),
    ]
    hands_off = f"node {what} by someone else: healer is not remediating it"
    still = [x for x in f.firing if (rule := c.rule(x.rule)) is None or _acting_kinds(rule)]
    if still:
        message = f"{_message(still[0])}; {hands_off}"
        effects.append(SetCondition(healthy=False, reason=still[0].rule, message=message))
    elif f.incident is not None and f.incident.rule:
        # The drain pass sees no findings: the fault is taken as still there until a tick shows it
        # clear ("human's node clear" sets the condition back to True).
        message = f"rule {f.incident.rule} fired; {hands_off}"
        effects.append(SetCondition(healthy=False, reason=f.incident.rule, message=message))
    return tuple(effects)


def _clear_of_concern(f: NodeFacts, c: Context) -> bool:
    return not f.unknown and not _concerning(f, c)


def _quarantine_from_suspect(f: NodeFacts, c: Context) -> Step | None:
    found = remediating(f, c)
    rule = c.rule(found[0].rule) if found else None
    hold = _hold(rule)
    return _quarantine(f, c, reason=f"finding {hold}" if hold else "finding fired", row="quarantine")


def _ticket_only(f: NodeFacts, c: Context) -> Step | None:
    if f.incident is None or f.incident.ticket is not None:
        return None
    for finding in actionable(f, c):
        rule = c.rules.rule(finding.rule)
        if _tickets(rule) and not _remediates(rule):
            return Step(
                StepKind.TICKET,
                None,
                f"rule {rule.name} asks for a ticket without touching the node",
                effects=_ticket_effects(rule),
                evidence=_evidence([finding]),
                memory=Memory(rule=rule.name),
                row="ticket only",
            )
    return None


def _drain_or_wait(f: NodeFacts, c: Context) -> Step | None:
    rule = _acting_rule(f, c)
    if rule is None:
        if not f.unknown and not f.frozen_rules and not _concerning(f, c):
            return Step(
                StepKind.RECORD,
                NodeState.VALIDATING,
                "findings cleared before the next step: validating before return to service",
                memory=Memory(reset_clear=True),
                already_out=True,
                row="cleared while quarantined",
            )
        return None  # frozen, unknown or only pending: wait, take no new step
    drain = _action(rule, DrainAction)
    if drain is None:
        reason = f"rule {rule.name} quarantines without draining"
        return _after_hold(f, c, rule, reason=reason, row="quarantined, no drain")
    return Step(
        StepKind.DRAIN,
        NodeState.DRAINING,
        f"rule {rule.name} is still firing: draining",
        effects=(
            StartDrain(rule=rule.name, options=drain.options()),
            Event("HealerDraining", f"draining for {rule.name}"),
        ),
        evidence=_evidence([x for x in f.firing if x.rule == rule.name]),
        memory=Memory(rule=rule.name),
        already_out=True,
        row="drain",
    )


def _drained(f: NodeFacts, c: Context) -> Step:
    rule = c.rule(f.incident.rule if f.incident else None)
    step = _after_hold(f, c, rule, reason="drain finished: awaiting repair", row="drained")
    assert f.drain is not None
    event = Event("HealerDrained", f"drained: {len(f.drain.evicted)} pod(s) evicted in the last step", False)
    return replace(step, effects=(event, *step.effects))


def _drain_blocked(f: NodeFacts, c: Context) -> Step:
    report = f.drain
    assert report is not None
    if report.refused:
        pods = ", ".join(f"{pod} ({why})" for pod, why in sorted(report.refused.items()))
        reason = f"drain refused: {pods}"
    else:
        pods = ", ".join(report.blocked_pods) or "(none named)"
        budgets = ", ".join(report.budgets) or "(none named)"
        reason = f"drain blocked past its deadline: pods {pods}; PodDisruptionBudgets {budgets}"
    # Escalate: the rule's ticket goes out now, naming the pods and budgets (the ticket's payload
    # reads them from the drain's record), so a blocked drain never strands the node unseen.
    tickets = _ticket_effects(c.rule(f.incident.rule if f.incident else None))
    return Step(
        StepKind.TICKET if tickets else StepKind.RECORD,
        NodeState.BLOCKED,
        reason,
        effects=(Event("HealerDrainBlocked", reason), *tickets),
        memory=Memory(blocked_step="drain"),
        already_out=True,
        row="drain blocked",
    )


def _to_validating(f: NodeFacts, c: Context) -> Step:
    return Step(
        StepKind.RECORD,
        NodeState.VALIDATING,
        "repaired: validating before return to service",
        memory=Memory(reset_clear=True),
        already_out=True,
        row="validate",
    )


def _failed_validation(f: NodeFacts, c: Context) -> Step | None:
    # Only a condition true now fails validation: a finding still firing only because of its
    # recovery hold (``keep_firing_for``, condition already clear) is the repair working.
    step = _quarantine(
        f,
        c,
        reason="failed validation",
        row="failed validation",
        new_incident=True,
        close_incident="failed validation after repair",
        already_out=True,
    )
    if step is None or f.incident is None:
        return step
    # The cordon is healer's already: keep claiming it even though the node reads unschedulable.
    claimed = f.incident.cordoned_by_healer
    effects = tuple(e for e in step.effects if not isinstance(e, Cordon) or claimed)
    if claimed and not any(isinstance(e, Cordon) for e in effects):
        effects = (Cordon(reason=step.reason), *effects)
    return replace(step, effects=effects, memory=replace(step.memory, cordoned_by_healer=claimed))


def _validation_interrupted(f: NodeFacts, c: Context) -> bool:
    # Only observed clear time counts: a frozen rule (query failed, Prometheus down) or a node with
    # no data is not clear, so the hold starts again once data is back.
    return (
        f.incident is not None
        and f.incident.clear_since is not None
        and (bool(_concerning(f, c)) or f.unknown or bool(f.frozen_rules))
    )


def _no_ticket_and_clear(f: NodeFacts, c: Context) -> bool:
    """The incident asked no provider for a repair (a quarantine-only rule) and its findings are
    clear: healer's own hold is the only thing keeping the node out of service."""
    inc = f.incident
    return inc is not None and inc.ticket is None and _clear(f, c)


def _validate_without_repair(f: NodeFacts, c: Context) -> Step:
    reason = "findings cleared and no ticket was asked for: validating before return to service"
    return replace(_to_validating(f, c), reason=reason, row="cleared, no ticket")


def _ticket_resolved(f: NodeFacts, c: Context) -> bool:
    return f.incident is not None and f.incident.ticket == TicketStatus.RESOLVED


def _restart_clock(f: NodeFacts, c: Context) -> Step:
    return Step(
        StepKind.RECORD,
        None,
        "not clear: recovery hold restarts",
        memory=Memory(reset_clear=True),
        already_out=True,
        row="hold interrupted",
    )


def _start_clock(f: NodeFacts, c: Context) -> Step:
    return Step(
        StepKind.RECORD,
        None,
        "clear: recovery hold starts",
        memory=Memory(clear_since=c.now),
        already_out=True,
        row="hold starts",
    )


def _hold_done(f: NodeFacts, c: Context) -> bool:
    inc = f.incident
    if inc is None or inc.clear_since is None or not _clear(f, c):
        return False
    return (c.now - inc.clear_since).total_seconds() >= _hold_seconds(f, c)


def _return_to_service(f: NodeFacts, c: Context) -> Step:
    hold = _hold_seconds(f, c)
    return Step(
        StepKind.RELEASE,
        NodeState.HEALTHY,
        f"rules clear for the recovery hold ({hold:.0f} s): returned to service",
        effects=(Release(), Event("HealerReturned", "returned to service after validation", warning=False)),
        memory=Memory(forget_hold=True),
        close_incident="returned to service",
        already_out=True,
        row="return to service",
    )


def _blocked_before_touching(f: NodeFacts, c: Context) -> bool:
    return f.incident is None or f.incident.blocked_step != "drain"


TABLE: tuple[Row, ...] = (
    Row("deleted", ANY - {NodeState.UNKNOWN}, lambda f, c: f.deleted, _deleted),
    Row("human took over", HELD, lambda f, c: _human_took_over(f), _released),
    Row(
        "data back",
        _s(NodeState.UNKNOWN),
        lambda f, c: not f.deleted and not f.unknown and f.view is not None,
        lambda f, c: Step(StepKind.RECORD, NodeState.HEALTHY, "data is back", row="data back"),
    ),
    Row(
        "no data",
        _s(NodeState.HEALTHY),
        lambda f, c: f.unknown,
        lambda f, c: Step(
            StepKind.RECORD, NodeState.UNKNOWN, "no data: exporter down or stale", row="no data"
        ),
    ),
    Row(
        "suspect",
        _s(NodeState.HEALTHY),
        lambda f, c: bool(_concerning(f, c)),
        lambda f, c: Step(
            StepKind.RECORD,
            NodeState.SUSPECT,
            _suspect_reason(f, c),
            evidence=_evidence(_concerning(f, c)),
            open_incident=True,
            row="suspect",
        ),
    ),
    Row(
        "cleared before action",
        _s(NodeState.SUSPECT),
        _clear_of_concern,
        lambda f, c: Step(
            StepKind.RECORD,
            NodeState.HEALTHY,
            "findings cleared before any action",
            close_incident="cleared before any action",
            row="cleared before action",
        ),
    ),
    Row("quarantine", _s(NodeState.SUSPECT), lambda f, c: bool(remediating(f, c)), _quarantine_from_suspect),
    Row("ticket only", _s(NodeState.SUSPECT), lambda f, c: True, _ticket_only),
    Row("drain or wait", _s(NodeState.QUARANTINED), lambda f, c: True, _drain_or_wait),
    Row("drained", _s(NodeState.DRAINING), lambda f, c: f.drain is not None and f.drain.done, _drained),
    Row(
        "drain blocked",
        _s(NodeState.DRAINING),
        lambda f, c: f.drain is not None and (f.drain.blocked or bool(f.drain.refused)),
        _drain_blocked,
    ),
    Row(
        "drain step",
        _s(NodeState.DRAINING),
        lambda f, c: f.drain_due and f.drain is None,
        lambda f, c: Step(
            StepKind.DRAIN, None, "drain step", effects=(DrainStep(),), already_out=True, row="drain step"
        ),
    ),
    Row("cleared, no ticket", _s(NodeState.AWAITING_REPAIR), _no_ticket_and_clear, _validate_without_repair),
    Row(
        "repaired",
        _s(NodeState.AWAITING_REPAIR),
        _ticket_resolved,
        lambda f, c: Step(
            StepKind.RECORD,
            NodeState.REPAIRED,
            "ticket resolved by the provider",
            already_out=True,
            row="repaired",
        ),
    ),
    Row("validate", _s(NodeState.REPAIRED), lambda f, c: True, _to_validating),
    Row(
        "failed validation",
        _s(NodeState.VALIDATING),
        lambda f, c: any(x.clear_since is None for x in remediating(f, c)),
        _failed_validation,
    ),
    Row("hold interrupted", _s(NodeState.VALIDATING), _validation_interrupted, _restart_clock),
    Row(
        "hold starts",
        _s(NodeState.VALIDATING),
        lambda f, c: f.incident is not None and f.incident.clear_since is None and _clear(f, c),
        _start_clock,
    ),
    Row("return to service", _s(NodeState.VALIDATING), _hold_done, _return_to_service),
    Row(
        "repaired while blocked",
        _s(NodeState.BLOCKED),
        lambda f, c: not _blocked_before_touching(f, c) and _ticket_resolved(f, c),
        lambda f, c: Step(
            StepKind.RECORD,
            NodeState.REPAIRED,
            "ticket resolved by the provider while the drain was blocked",
            already_out=True,
            row="repaired while blocked",
        ),
    ),
    Row(
        "cleared while blocked",
        _s(NodeState.BLOCKED),
        lambda f, c: _blocked_before_touching(f, c) and _clear_of_concern(f, c),
        lambda f, c: Step(
            StepKind.RECORD,
            NodeState.HEALTHY,
            "findings cleared while blocked (the node was never touched)",
            close_incident="cleared while blocked",
            row="cleared while blocked",
        ),
    ),
    Row(
        "retry quarantine",
        _s(NodeState.BLOCKED),
        lambda f, c: _blocked_before_touching(f, c) and bool(remediating(f, c)),
        lambda f, c: _quarantine(f, c, reason="re-evaluated after being blocked", row="retry quarantine"),
    ),
    Row(
        "human's node clear",
        _s(NodeState.RELEASED),
        lambda f, c: _clear(f, c),
        lambda f, c: Step(
            StepKind.RECORD,
            NodeState.HEALTHY,
            "findings cleared after a human took over: a new firing starts a new incident",
            # The condition said False while the fault fired after the hand-over; now it is true.
            effects=(SetCondition(healthy=True, reason="FindingsCleared", message="no rule fires any more"),),
            close_incident="findings cleared after a human took over",
            row="human's node clear",
        ),
    ),
)


def decide(facts: NodeFacts, ctx: Context) -> Step | None:
    """The step healer wants for the node now, or None (nothing to do this tick).

    Raises nothing; a fact it cannot use (a rule no longer in the rule set) means no new step.
    """
    for row in TABLE:
        if facts.state in row.states and row.when(facts, ctx):
            return row.then(facts, ctx)
    return None


def notices(facts: NodeFacts, ctx: Context) -> list[Step]:
    """Events for rules that ``notify``, once per finding episode (key: series and firing time).

    Notify-only rules do nothing else: no state change, no incident.
    """
    out: list[Step] = []
    for finding in actionable(facts, ctx):
        notify = _action(ctx.rules.rule(finding.rule), NotifyAction)
        if notify is None:
            continue
        key = f"{finding.series_key}@{(finding.fired_at or ctx.now).isoformat()}"
        if key in facts.notified:
            continue
        message = notify.message or _message(finding)
        out.append(
            Step(
                StepKind.NOTIFY,
                None,
                f"rule {finding.rule} notifies",
                effects=(Event("HealerNotify", message, key=key),),
                evidence=_evidence([finding]),
                row="notify",
            )
        )
    return out


def remember(incident: IncidentFacts, step: Step) -> IncidentFacts:
    """The incident's remediation memory after ``step`` (what the controller writes to its row).

    A step that moves the node anywhere but ``blocked`` without blocking it forgets the blocked step.
    """
    m = step.memory
    blocked_step = incident.blocked_step
    if m.blocked_step is not None:
        blocked_step = m.blocked_step
    elif step.to is not None and step.to != NodeState.BLOCKED:
        blocked_step = None
    return replace(
        incident,
        rule=m.rule if m.rule is not None else incident.rule,
        cordoned_by_healer=(
            m.cordoned_by_healer if m.cordoned_by_healer is not None else incident.cordoned_by_healer
        ),
        expect_unschedulable=(
            None
            if m.forget_hold
            else (
                m.expect_unschedulable
                if m.expect_unschedulable is not None
                else incident.expect_unschedulable
            )
        ),
        blocked_step=blocked_step,
        clear_since=None if m.reset_clear else (m.clear_since or incident.clear_since),
    )


def apply_memory(
    incident: IncidentFacts | None, step: Step, *, new_id: int | None = None
) -> IncidentFacts | None:
    """The incident facts after ``step`` (for chaining steps within one tick): None once the step
    closes the incident; a new incident (``new_id``) when the step opens one."""
    if step.close_incident is not None and not step.new_incident:
        return None
    if incident is None or step.new_incident:
        if new_id is None:
            return incident
        incident = IncidentFacts(id=new_id)
    return remember(incident, step)
