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
    released  a human uncordoned (or cordoned) a node healer held, removed healer's taint or put the
              opt-out label on it: hands off until the findings clear; the next firing opens a
              new incident

Inputs from outside the controller never move a node themselves: a provider's resolved ticket
(the incident's ticket status) and an operator's release (``IncidentFacts.release_requested``)
are facts the next reconcile reads, and these rows move the node, fenced like every step.
    unknown   no data (exporter down or stale) or the node was deleted: neither healthy nor faulty

Remediation ladder (a rule's ``ladder``, or its class's default: :mod:`healer.engine.ladder`):
where a rule would ask for its ticket, its ladder's first step starts instead (``awaiting_repair``
with the step in the incident's memory). ``reset-gpu``/``reboot`` publish a signed request to the
node agent (:class:`RequestRepair`); its answer (``succeeded``) moves the node to ``repaired`` and
on to ``validating``; a failed or refused answer, the step's timeout, or the finding firing again
while validating escalate to the next step (``ticket``: the replacement; ``notify``: an Event).
With validation Jobs on (:class:`StartValidation`), ``validating`` also waits for the Job to pass;
a failed Job re-opens the incident (a new one, asking for the replacement) with its result.

Log capture: with a node agent configured (``Context.capture_logs``), taking the node out
(``quarantine``, and a failed validation Job's re-ticket) also publishes a ``capture`` request
(:class:`RequestRepair` with its own nonce, remembered in the incident's ``capture``); the agent
answers with the log bundle, which the ``capture answered`` row records in a transition of its own
(evidence ``{"repair": {"action": "capture", "at", "log_bundle", ...}}``), so a replacement ticket
not preceded by a reboot carries it too. The ticket outbox holds such a ticket while the capture is
unanswered, for a bounded time (``healer.controller.record``). A repair asked before the agent
answered replaces the capture (the agent holds one request at a time): the repair's answer
carries the bundle, and the capture ends ``superseded`` so no ticket waits for it.

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

from healer.engine import ladder as ladders
from healer.model.drain import DrainOptions, DrainReport
from healer.model.findings import Finding
from healer.model.node import NodeView, TaintEffect
from healer.model.repair import CAPTURE, RepairResult
from healer.model.states import FindingState, NodeState, TicketStatus
from healer.model.validation import ValidationResult
from healer.ruleset.durations import format_duration
from healer.ruleset.schema import (
    DrainAction,
    LadderStep,
    NotifyAction,
    NotifyStep,
    QuarantineAction,
    Rule,
    RuleSet,
    TaintAction,
    TicketAction,
    TicketStep,
)
from healer.ruleset.xid_catalog import XidCatalog

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


@dataclass(frozen=True)
class RequestRepair:
    """Ask the node agent (or the provider's API) for ``action`` on the node (``gpu`` for a reset):
    a signed request the controller publishes (:mod:`healer.model.repair`); ``nonce`` ties the
    agent's answer to this ladder step; ``timeout_seconds`` is the step's timeout. ``capture``
    (taking the node out) asks only for the log bundle: no ladder step, no timeout (0)."""

    action: str
    gpu: str | None
    nonce: str
    timeout_seconds: float


@dataclass(frozen=True)
class StartValidation:
    """Run the validation Job ``job`` pinned to the node (all its GPUs, tolerating healer's taint)."""

    job: str


@dataclass(frozen=True)
class CleanupValidation:
    """Delete the validation Job ``job`` (its result is in the record)."""

    job: str


Effect = (
    Cordon
    | Taint
    | SetCondition
    | Event
    | StartDrain
    | DrainStep
    | RequestTicket
    | Release
    | RequestRepair
    | StartValidation
    | CleanupValidation
)


class StepKind(StrEnum):
    """What a step does to the node, which is what safety judges (see ``healer.engine.safety``)."""

    QUARANTINE = "quarantine"  # takes the node out of service (cordon or taint)
    DRAIN = "drain"
    TICKET = "ticket"
    RELEASE = "release"  # hands the node back (uncordon when healer cordoned)
    NOTIFY = "notify"  # an Event only
    REPAIR = "repair"  # a GPU reset or node reboot by the node agent (the node is already out)
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
    # The remediation ladder (healer.engine.ladder): its steps as chosen when it started, the step
    # in progress (None = no ladder; len(ladder) = exhausted), since when, and the repair's nonce.
    ladder: tuple[LadderStep, ...] = ()
    ladder_index: int | None = None
    ladder_started_at: datetime | None = None
    repair_nonce: str | None = None
    # The validation Job of this incident: {"job", "status" (running|succeeded|failed), "result"}.
    validation: dict[str, object] | None = None
    # An operator's release not acted on yet: {"actor", "reason", "at"} (``healer node release``).
    release_requested: dict[str, object] | None = None
    # The domain incident this incident is part of (healer.engine.correlation), if any.
    domain_id: int | None = None
    # The log capture asked of the node agent: {"nonce", "requested_at" (ISO 8601), "status"
    # ("requested" | "succeeded" | "failed" | "refused"), and once answered "answered_at", "reason"}.
    capture: dict[str, object] | None = None


@dataclass(frozen=True)
class DomainFacts:
    """The domain incident (:mod:`healer.engine.correlation`) that absorbs the node: its id, kind
    and name, its ticket's status (None: none requested yet) and the taint its nodes get."""

    id: int
    kind: str
    name: str
    ticket: TicketStatus | None = None
    taint_effect: TaintEffect = "NoSchedule"

    @property
    def label(self) -> str:
        return f"{self.kind} {self.name} (domain incident {self.id})"


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
    repair_result: RepairResult | None = None  # the node agent's last answer (node annotation)
    repeat_parts: frozenset[str] = frozenset()  # GPU UUIDs that failed before after a repair
    validation: ValidationResult | None = None  # the incident's validation Job as read this tick
    #: The node's firing findings as last recorded, when this pass has no tick findings (the drain
    #: pass): what a ladder started there is chosen by (class, GPU), never what it acts on.
    recorded_firing: tuple[Finding, ...] = ()
    #: healer's taint is not on the node as read (a human removed it, if healer holds the node).
    taint_missing: bool = False
    #: The node carries the opt-out label now.
    opted_out: bool = False
    #: The domain incident absorbing the node (None: the node's findings are its own fault).
    domain: DomainFacts | None = None


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
    ladder: tuple[LadderStep, ...] | None = None
    ladder_index: int | None = None
    ladder_started_at: datetime | None = None
    repair_nonce: str | None = None
    validation: dict[str, object] | None = None
    release_handled: bool = False  # the operator's release request is acted on: forget it
    capture: dict[str, object] | None = None


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
    """The tick's fixed inputs: the rule set, ``now``, the default recovery hold (seconds), the Xid
    catalog (classes for the default ladders) and the repair actions available."""

    rules: RuleSet
    now: datetime
    recovery_hold_seconds: float = DEFAULT_RECOVERY_HOLD_SECONDS
    xid_catalog: XidCatalog | None = None
    #: Repair steps someone can carry out (a node agent or a provider API is configured); the
    #: ladder skips the others (recorded), so a fleet without an agent goes straight to the ticket.
    repair_actions: frozenset[str] = frozenset()
    #: A validation Job gates every return to service (``validation.enabled``).
    validate_with_job: bool = False
    #: A node agent answers here: taking a node out also asks it to capture the log bundle.
    capture_logs: bool = False

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


def value_text(value: float | None, unit: str | None) -> str:
    """A finding's value as a person reads it, with its unit: counts whole, others to 4
    significant digits (``1.032`` errors reads ``1``; ``85.53`` with ``degrees C`` reads
    ``85.53 degrees C``); ``no value`` for None."""
    if value is None:
        return "no value"
    if not math.isfinite(value):
        text = str(value)
    elif abs(value - round(value)) < 0.05 and abs(value) >= 1:
        text = str(round(value))  # increase() of a counter is a count: 1.032 errors reads "1"
    else:
        text = f"{value:.4g}"
    return f"{text} {unit}" if unit else text


def _value_text(finding: Finding) -> str:
    return value_text(finding.value, finding.unit)


def _hold(rule: Rule | None) -> str:
    """The rule's effective ``for`` (scaled in the demo), as ``held 30s`` (empty without one)."""
    if rule is None or rule.for_ <= 0:
        return ""
    return f"held {format_duration(rule.for_)}"


def _finding_story(finding: Finding, ctx: Context) -> str:
    return finding_story(finding, ctx.rule(finding.rule))


def finding_story(finding: Finding, rule: Rule | None) -> str:
    """One line naming the rule, where, its value and its real hold (``rule``'s ``for``; none
    without the rule): ``GpuTooHot firing on GPU 3 (value 81 C, held 30s): GPU 3 at 81 C, above
    78 C``. A resolved finding reads ``resolved`` with its last value."""
    where = f" on GPU {finding.gpu}" if finding.gpu else ""
    if finding.state == FindingState.FIRING:
        state = "firing"
        detail = ", ".join(p for p in (f"value {_value_text(finding)}", _hold(rule)) if p)
    elif finding.state == FindingState.RESOLVED:
        state = "resolved"
        detail = f"last value {_value_text(finding)}"
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


def _human_change(facts: NodeFacts) -> str:
    """What a human did to a node healer holds ("" = nothing): its cordon changed (uncordoned, or
    cordoned where healer only tainted), healer's taint removed, or the opt-out label added."""
    inc, view = facts.incident, facts.view
    if inc is None or inc.expect_unschedulable is None or view is None:
        return ""
    if view.unschedulable != inc.expect_unschedulable:
        return "uncordoned" if not view.unschedulable else "cordoned"
    if facts.taint_missing:
        return "untainted"
    if facts.opted_out:
        return "opted out (opt-out label)"
    return ""


def _human_took_over(facts: NodeFacts) -> bool:
    return bool(_human_change(facts))


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
    capture, asked = _capture(facts, ctx)
    effects += capture
    memory = replace(memory, capture=asked)
    done = "cordoned and tainted" if quarantine is not None else "tainted, not cordoned"
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


def _capture(facts: NodeFacts, ctx: Context) -> tuple[tuple[Effect, ...], dict[str, object] | None]:
    """The log capture asked of the node agent as the node is taken out (none without an agent):
    the request and the incident's ``capture`` memory."""
    if not ctx.capture_logs:
        return (), None
    incident = facts.incident.id if facts.incident else 0
    nonce = f"{incident}-capture-{int(ctx.now.timestamp())}"
    asked: dict[str, object] = {"nonce": nonce, "requested_at": ctx.now.isoformat(), "status": "requested"}
    return (RequestRepair(action=CAPTURE, gpu=None, nonce=nonce, timeout_seconds=0.0),), asked


def _ticket_effects(rule: Rule | None) -> tuple[Effect, ...]:
    if rule is None:
        return ()
    return tuple(RequestTicket(provider=t.provider, template=t.template) for t in _tickets(rule))


def _after_hold(facts: NodeFacts, ctx: Context, rule: Rule | None, *, reason: str, row: str) -> Step:
    """Quarantined (or drained) → awaiting_repair, asking for a ticket when the rule says so, or
    starting the rule's remediation ladder; a domain's node waits for the domain's ticket."""
    if facts.domain is not None and _domain_active(facts):
        return Step(
            kind=StepKind.RECORD,
            to=NodeState.AWAITING_REPAIR,
            reason=(
                f"{reason}; part of {facts.domain.label}: no ticket of its own, "
                "waiting for the domain's repair"
            ),
            already_out=True,
            row=row,
        )
    if rule is not None and ladders.has_ladder(rule):
        started = _start_ladder(facts, ctx, rule, reason=reason, row=row)
        if started is not None:
            return started
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


# --- the remediation ladder (healer.engine.ladder) -------------------------------------------------


def _rule_findings(facts: NodeFacts, rule: Rule | str | None) -> list[Finding]:
    """``rule``'s findings this tick, else as last recorded (a ladder started by the drain pass)."""
    name = rule.name if isinstance(rule, Rule) else rule
    return [f for f in facts.firing if f.rule == name] or [
        f for f in facts.recorded_firing if f.rule == name
    ]


def _start_ladder(facts: NodeFacts, ctx: Context, rule: Rule, *, reason: str, row: str) -> Step | None:
    """The ladder's first step; the ladder chosen (by rule, class or a repeat part) is remembered."""
    found = _rule_findings(facts, rule)
    repeat = sorted({u for f in found if (u := f.labels.get("UUID")) and u in facts.repeat_parts})
    steps, why = ladders.ladder_for(rule, found, ctx.xid_catalog, repeat=bool(repeat))
    if not steps:
        return None
    if repeat:
        why = f"GPU {', '.join(repeat)} failed before after a repair: straight to replacement"
    text = f"{reason}; ladder {ladders.describe(steps)} ({why})"
    step = _ladder_step(facts, ctx, steps, 0, reason=text, row=row)
    evidence = dict(step.evidence or {})
    evidence["ladder"] = {"steps": ladders.describe(steps), "why": why, "repeat_parts": repeat}
    return replace(step, evidence=evidence, memory=replace(step.memory, ladder=steps))


def _gpu_of(facts: NodeFacts, rule_name: str | None) -> str | None:
    for finding in _rule_findings(facts, rule_name):
        if finding.gpu:
            return finding.gpu
    return None


def _ladder_step(
    facts: NodeFacts, ctx: Context, steps: Sequence[LadderStep], index: int, *, reason: str, row: str
) -> Step:
    """Take step ``index`` of ``steps`` (skipping repairs nobody can carry out, recorded), or record
    the ladder exhausted when none is left."""
    skipped: list[str] = []
    while index < len(steps) and steps[index].kind in ("reset-gpu", "reboot") and (
        steps[index].kind not in ctx.repair_actions
    ):
        skipped.append(steps[index].kind)
        index += 1
    note = f" ({', '.join(skipped)} skipped: no node agent or provider API configured)" if skipped else ""
    memory = Memory(ladder_index=index, ladder_started_at=ctx.now, repair_nonce="", reset_clear=True)
    evidence = _evidence(_concerning(facts, ctx))
    base = dict(to=NodeState.AWAITING_REPAIR, evidence=evidence, memory=memory, already_out=True, row=row)
    if index >= len(steps):
        return Step(
            StepKind.RECORD,
            reason=f"{reason}{note}: remediation ladder exhausted, waiting for a human",
            effects=(Event("HealerLadderExhausted", "remediation ladder exhausted: waiting for a human"),),
            **base,  # type: ignore[arg-type]
        )
    step = steps[index]
    text = f"{reason}{note}: step {index + 1}/{len(steps)} {step.label()}"
    inc_rule = facts.incident.rule if facts.incident else None
    if step.kind in ("reset-gpu", "reboot"):
        gpu = _gpu_of(facts, inc_rule) if step.kind == "reset-gpu" else None
        incident = facts.incident.id if facts.incident else 0
        nonce = f"{incident}-{index}-{int(ctx.now.timestamp())}"
        where = f" GPU {gpu}" if gpu else ""
        return Step(
            StepKind.REPAIR,
            reason=text,
            effects=(
                RequestRepair(action=step.kind, gpu=gpu, nonce=nonce, timeout_seconds=step.timeout),
                Event(
                    "HealerRepairRequested",
                    f"{step.kind}{where} requested from the node agent ({step.label()})",
                ),
            ),
            **{**base, "memory": replace(memory, repair_nonce=nonce)},  # type: ignore[arg-type]
        )
    if step.kind == "ticket":
        assert isinstance(step, TicketStep)
        return Step(
            StepKind.TICKET,
            reason=text,
            effects=(RequestTicket(provider=step.provider, template=step.template),),
            **base,  # type: ignore[arg-type]
        )
    assert isinstance(step, NotifyStep)
    message = step.message or f"remediation ladder: {step.label()} for rule {inc_rule}"
    return Step(StepKind.NOTIFY, reason=text, effects=(Event("HealerNotify", message),), **base)  # type: ignore[arg-type]


def _on_ladder(f: NodeFacts) -> LadderStep | None:
    """The ladder step in progress, if any."""
    inc = f.incident
    if inc is None or inc.ladder_index is None or inc.ladder_index >= len(inc.ladder):
        return None
    return inc.ladder[inc.ladder_index]


def _repairing(f: NodeFacts) -> bool:
    step = _on_ladder(f)
    return step is not None and step.kind in ("reset-gpu", "reboot")


def _answer(f: NodeFacts) -> RepairResult | None:
    """The agent's answer to the request in progress (matched by nonce)."""
    inc, result = f.incident, f.repair_result
    if not _repairing(f) or inc is None or result is None or not inc.repair_nonce:
        return None
    return result if result.nonce == inc.repair_nonce else None


def _repair_done(f: NodeFacts, c: Context) -> bool:
    answer = _answer(f)
    return answer is not None and answer.status == "succeeded"


def _repair_failed(f: NodeFacts, c: Context) -> bool:
    answer = _answer(f)
    return answer is not None and answer.status != "succeeded"


def _step_timed_out(f: NodeFacts, c: Context) -> bool:
    step, inc = _on_ladder(f), f.incident
    if step is None or inc is None or inc.ladder_started_at is None:
        return False
    if step.kind == "ticket" and inc.ticket == TicketStatus.RESOLVED:
        return False
    return (c.now - inc.ladder_started_at).total_seconds() >= step.timeout


def _escalate(f: NodeFacts, c: Context, why: str, row: str) -> Step:
    inc = f.incident
    assert inc is not None and inc.ladder_index is not None
    return _ladder_step(f, c, inc.ladder, inc.ladder_index + 1, reason=f"escalating: {why}", row=row)


def _bundle_of(answer: RepairResult) -> dict[str, str]:
    """The log bundle the agent captured before the repair (kept for the ticket that may follow)."""
    return {"log_bundle": answer.bundle} if answer.bundle else {}


def _capture_answer(f: NodeFacts) -> RepairResult | None:
    """The agent's answer to the incident's log capture, not recorded yet (matched by its nonce:
    a repair's answer is never taken for it, nor it for a repair's)."""
    inc, result = f.incident, f.repair_result
    asked = inc.capture if inc is not None else None
    if not asked or asked.get("status") != "requested" or result is None:
        return None
    return result if result.nonce == asked.get("nonce") else None


def _capture_answered(f: NodeFacts, c: Context) -> bool:
    # Not in the drain pass: its steps are the drain's (the next tick records the answer).
    return not f.drain_due and f.drain is None and _capture_answer(f) is not None


def _captured(f: NodeFacts, c: Context) -> Step:
    """Record the capture's answer: a transition of its own (the node stays where it is) whose
    evidence keeps the bundle for the ticket (``healer.tickets.payloads.log_bundle``)."""
    answer, inc = _capture_answer(f), f.incident
    assert answer is not None and inc is not None and inc.capture is not None
    if answer.status == "succeeded" and answer.bundle:
        reason = "log bundle captured by the node agent for the ticket"
    else:
        reason = f"log capture {answer.status} on the node ({answer.reason or 'no reason given'})"
    return Step(
        StepKind.RECORD,
        f.state,
        reason,
        evidence={
            "repair": {
                "action": CAPTURE,
                "nonce": answer.nonce,
                "status": answer.status,
                "reason": answer.reason,
                "at": answer.at,
                **_bundle_of(answer),
            }
        },
        memory=Memory(
            capture={
                **inc.capture,
                "status": answer.status,
                "answered_at": answer.at,
                "reason": answer.reason,
            }
        ),
        already_out=True,
        row="capture answered",
    )


def _superseded_capture(f: NodeFacts, kind: str, answer: RepairResult) -> dict[str, object] | None:
    """The incident's capture, still unanswered when the agent answers a repair: the agent holds
    one request at a time, so the repair's request replaced it, and the repair's answer carries
    the bundle captured before it (``_bundle_of``). It ends ``superseded``, so a ticket that
    follows is not held for an answer that will never come. None: nothing to change."""
    asked = f.incident.capture if f.incident is not None else None
    if not asked or asked.get("status") != "requested":
        return None
    carries = "carries the log bundle" if answer.bundle else "has no log bundle"
    return {
        **asked,
        "status": "superseded",
        "answered_at": answer.at,
        "reason": f"the {kind} request replaced it; the {kind} answer {carries}",
    }


def _repaired_by_agent(f: NodeFacts, c: Context) -> Step:
    step, answer = _on_ladder(f), _answer(f)
    assert step is not None and answer is not None
    detail = f": {answer.reason}" if answer.reason else ""
    return Step(
        StepKind.RECORD,
        NodeState.REPAIRED,
        f"{step.kind} done by the node agent{detail}",
        evidence={"repair": {"action": step.kind, "nonce": answer.nonce, "status": answer.status,
                             "at": answer.at, "output": answer.output, **_bundle_of(answer)}},
        memory=Memory(capture=_superseded_capture(f, step.kind, answer)),
        already_out=True,
        row="repair done",
    )


def _repair_failed_step(f: NodeFacts, c: Context) -> Step:
    step, answer = _on_ladder(f), _answer(f)
    assert step is not None and answer is not None
    why = f"{step.kind} {answer.status} on the node ({answer.reason or 'no reason given'})"
    out = _escalate(f, c, why, "repair failed")
    evidence = {**(out.evidence or {}), "repair": {"action": step.kind, "status": answer.status,
                                                   "reason": answer.reason, "output": answer.output,
                                                   **_bundle_of(answer)}}
    capture = _superseded_capture(f, step.kind, answer)
    memory = out.memory if capture is None else replace(out.memory, capture=capture)
    return replace(out, evidence=evidence, memory=memory)


def _timed_out_step(f: NodeFacts, c: Context) -> Step:
    step = _on_ladder(f)
    assert step is not None
    return _escalate(f, c, f"{step.label()} did not clear the finding in time", "ladder step timed out")


def _ladder_next_after_validation(f: NodeFacts, c: Context) -> bool:
    """Validating after a ladder repair that did not clear it, with a step left to try."""
    inc = f.incident
    return (
        inc is not None
        and _repairing(f)
        and inc.ladder_index is not None
        and inc.ladder_index + 1 < len(inc.ladder)
        and any(x.clear_since is None for x in remediating(f, c))
    )


def _escalate_after_validation(f: NodeFacts, c: Context) -> Step:
    step = _on_ladder(f)
    assert step is not None
    found = remediating(f, c)
    why = f"{step.kind} did not clear it: {_finding_story(found[0], c)}"
    return _escalate(f, c, why, "repair did not clear")


# --- the validation Job (healer.actions.validation) ------------------------------------------------


def _job_status(f: NodeFacts) -> str | None:
    inc = f.incident
    return str(inc.validation.get("status")) if inc is not None and inc.validation else None


def _needs_job(f: NodeFacts, c: Context) -> bool:
    return c.validate_with_job and f.incident is not None and _job_status(f) is None


def _start_job(f: NodeFacts, c: Context) -> Step:
    assert f.incident is not None
    job = f"healer-validate-{f.incident.id}-{int(c.now.timestamp())}"
    return Step(
        StepKind.REPAIR,
        None,
        f"validation Job {job} started on the node",
        effects=(StartValidation(job=job), Event("HealerValidating", f"validation Job {job} started", False)),
        memory=Memory(validation={"job": job, "status": "running"}),
        already_out=True,
        row="start validation",
    )


def _job_done(f: NodeFacts, status: str) -> bool:
    return _job_status(f) == "running" and f.validation is not None and f.validation.status == status


def _job_passed(f: NodeFacts, c: Context) -> Step:
    assert f.incident is not None and f.incident.validation and f.validation is not None
    job = str(f.incident.validation["job"])
    return Step(
        StepKind.RECORD,
        NodeState.VALIDATING,  # a row of its own, with the Job's result as evidence
        f"validation Job {job} passed",
        effects=(CleanupValidation(job=job),),
        evidence={"validation": f.validation.evidence()},
        memory=Memory(validation={"job": job, "status": "succeeded", "result": f.validation.result}),
        already_out=True,
        row="validation passed",
    )


def _job_failed(f: NodeFacts, c: Context) -> Step:
    """A failed validation re-opens: a new incident (the evidence in its first step) asking the
    rule's ticket (replacement), the node still held."""
    inc, result = f.incident, f.validation
    assert inc is not None and inc.validation and result is not None
    job = str(inc.validation["job"])
    rule = c.rule(inc.rule)
    why = result.result.get("why") or f"exit code {result.exit_code}"
    reason = f"validation Job {job} failed ({why}): re-opened, asking for a replacement"
    provider = next((t.provider for t in _tickets(rule)), "default") if rule is not None else "default"
    template = next((t.template for t in _tickets(rule)), None) if rule is not None else None
    capture, asked = _capture(f, c)
    return Step(
        StepKind.TICKET,
        NodeState.AWAITING_REPAIR,
        reason,
        effects=(
            CleanupValidation(job=job),
            Event("HealerValidationFailed", reason),
            *capture,
            RequestTicket(provider=provider, template=template),
        ),
        evidence={"validation": result.evidence()},
        memory=Memory(
            rule=inc.rule,
            cordoned_by_healer=inc.cordoned_by_healer,
            expect_unschedulable=inc.expect_unschedulable,
            ladder=(TicketStep(provider=provider, template=template),),
            ladder_index=0,
            ladder_started_at=c.now,
            repair_nonce="",
            reset_clear=True,
            capture=asked,
        ),
        new_incident=True,
        close_incident="failed validation Job after repair",
        already_out=True,
        row="validation Job failed",
    )


def _awaiting_job(f: NodeFacts, c: Context) -> bool:
    return c.validate_with_job and _job_status(f) != "succeeded"


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
    what = _human_change(f)
    if f.opted_out and what.startswith("opted out"):
        # The opt-out label says "never touch": no release either; the human owns the node as is.
        return Step(
            StepKind.RECORD,
            NodeState.RELEASED,
            f"node {what} by someone else: healer keeps its hands off, changing nothing on it",
            memory=Memory(forget_hold=True),
            already_out=True,
            row="human took over",
        )
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
    tickets = () if _domain_active(f) else _ticket_effects(c.rule(f.incident.rule if f.incident else None))
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
    return inc is not None and inc.ticket is None and not _domain_active(f) and _clear(f, c)


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


#: States from which an operator's release sends a node to validation (``healer node release``).
RELEASABLE = frozenset(
    {
        NodeState.QUARANTINED,
        NodeState.DRAINING,
        NodeState.AWAITING_REPAIR,
        NodeState.REPAIRED,
        NodeState.BLOCKED,
        NodeState.RELEASED,
    }
)


def _release_requested(f: NodeFacts, c: Context) -> bool:
    return f.incident is not None and bool(f.incident.release_requested)


def _operator_release(f: NodeFacts, c: Context) -> Step:
    """The operator says the node is repaired: validating, the hold (and a Job) before return."""
    assert f.incident is not None and f.incident.release_requested
    request = f.incident.release_requested
    actor, why = request.get("actor") or "an operator", request.get("reason") or "released by operator"
    return Step(
        StepKind.RECORD,
        NodeState.VALIDATING,
        f"released by {actor} ({why}): validating before return to service",
        evidence={"release": dict(request)},
        # Validation starts now: an earlier clear stretch or a blocked step no longer applies.
        memory=Memory(reset_clear=True, release_handled=True),
        already_out=True,
        row="operator release",
    )


def _stale_release(f: NodeFacts, c: Context) -> Step:
    """A release asked for in a state it does not apply to (the node moved on meanwhile)."""
    return Step(
        StepKind.RECORD,
        None,
        f"release request dropped: the node is {f.state}",
        memory=Memory(release_handled=True),
        row="release request dropped",
    )


def _domain_active(f: NodeFacts) -> bool:
    """The node is absorbed by a domain incident whose repair is still awaited (once its ticket is
    resolved, a node that is bad again is a fault of its own)."""
    return f.domain is not None and f.domain.ticket != TicketStatus.RESOLVED


def _domain_evidence(domain: DomainFacts) -> dict[str, object]:
    return {"id": domain.id, "kind": domain.kind, "name": domain.name}


def _in_domain(f: NodeFacts, c: Context) -> bool:
    return _domain_active(f) and bool(remediating(f, c)) and f.view is not None


def _domain_taint(f: NodeFacts, c: Context) -> Step | None:
    """A domain's node: healer's taint (not a cordon: its jobs are not drained wholesale for a
    switch or rack fault), the condition and an Event naming the domain incident."""
    domain, view = f.domain, f.view
    assert domain is not None and view is not None
    found = remediating(f, c)
    finding = found[0]
    message = f"part of {domain.label}: {_message(finding)}"
    return Step(
        kind=StepKind.QUARANTINE,
        to=NodeState.QUARANTINED,
        reason=f"tainted, not cordoned: {message}: {_finding_story(finding, c)}",
        effects=(
            Taint(value=f"domain-{domain.kind}", effect=domain.taint_effect),
            SetCondition(healthy=False, reason="DomainFault", message=message),
            Event("HealerDomainFault", f"tainted by healer: {message}"),
        ),
        evidence={**(_evidence(found) or {}), "domain": _domain_evidence(domain)},
        memory=Memory(rule=finding.rule, cordoned_by_healer=False, expect_unschedulable=view.unschedulable),
        row="domain taint",
    )


def _domain_waits(f: NodeFacts, c: Context) -> Step:
    assert f.domain is not None
    return Step(
        StepKind.RECORD,
        NodeState.AWAITING_REPAIR,
        f"part of {f.domain.label}: no ticket of its own, waiting for the domain's repair",
        already_out=True,
        row="domain waits",
    )


def _domain_repaired(f: NodeFacts, c: Context) -> bool:
    """The domain's ticket is resolved and this incident is the domain's (a node's own incident,
    opened after the domain's repair, waits for its own)."""
    return (
        f.domain is not None
        and f.domain.ticket == TicketStatus.RESOLVED
        and f.incident is not None
        and f.incident.domain_id == f.domain.id
    )


def _domain_repair_done(f: NodeFacts, c: Context) -> Step:
    assert f.domain is not None
    return Step(
        StepKind.RECORD,
        NodeState.REPAIRED,
        f"{f.domain.label} repaired: its ticket is resolved",
        evidence={"domain": _domain_evidence(f.domain)},
        already_out=True,
        row="domain repaired",
    )


#: States of a held domain node that the domain's repair moves on to ``repaired``.
_DOMAIN_HELD = frozenset(
    {NodeState.QUARANTINED, NodeState.DRAINING, NodeState.AWAITING_REPAIR, NodeState.BLOCKED}
)


def _blocked_before_touching(f: NodeFacts, c: Context) -> bool:
    return f.incident is None or f.incident.blocked_step != "drain"


TABLE: tuple[Row, ...] = (
    Row("deleted", ANY - {NodeState.UNKNOWN}, lambda f, c: f.deleted, _deleted),
    Row("human took over", HELD, lambda f, c: _human_took_over(f), _released),
    Row("operator release", RELEASABLE, _release_requested, _operator_release),
    Row("release request dropped", ANY - RELEASABLE, _release_requested, _stale_release),
    Row("domain repaired", _DOMAIN_HELD, _domain_repaired, _domain_repair_done),
    Row("capture answered", HELD, _capture_answered, _captured),
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
    Row("domain taint", _s(NodeState.SUSPECT), _in_domain, _domain_taint),
    Row("quarantine", _s(NodeState.SUSPECT), lambda f, c: bool(remediating(f, c)), _quarantine_from_suspect),
    Row("ticket only", _s(NodeState.SUSPECT), lambda f, c: True, _ticket_only),
    Row("domain waits", _s(NodeState.QUARANTINED), lambda f, c: _domain_active(f), _domain_waits),
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
    Row("repair done", _s(NodeState.AWAITING_REPAIR), _repair_done, _repaired_by_agent),
    Row("repair failed", _s(NodeState.AWAITING_REPAIR), _repair_failed, _repair_failed_step),
    Row("ladder step timed out", _s(NodeState.AWAITING_REPAIR), _step_timed_out, _timed_out_step),
    # The agent has not answered yet: wait for it (or the step's timeout), whatever the findings do.
    Row("awaiting the agent", _s(NodeState.AWAITING_REPAIR), lambda f, c: _repairing(f), lambda f, c: None),
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
        "repair did not clear",
        _s(NodeState.VALIDATING),
        _ladder_next_after_validation,
        _escalate_after_validation,
    ),
    Row(
        "failed validation",
        _s(NodeState.VALIDATING),
        lambda f, c: any(x.clear_since is None for x in remediating(f, c)),
        _failed_validation,
    ),
    Row("start validation", _s(NodeState.VALIDATING), _needs_job, _start_job),
    Row("validation Job failed", _s(NodeState.VALIDATING), lambda f, c: _job_done(f, "failed"), _job_failed),
    Row("validation passed", _s(NodeState.VALIDATING), lambda f, c: _job_done(f, "succeeded"), _job_passed),
    Row("hold interrupted", _s(NodeState.VALIDATING), _validation_interrupted, _restart_clock),
    Row(
        "hold starts",
        _s(NodeState.VALIDATING),
        lambda f, c: f.incident is not None and f.incident.clear_since is None and _clear(f, c),
        _start_clock,
    ),
    # The hold is done but the validation Job has not passed yet: wait for it.
    Row("awaiting validation", _s(NodeState.VALIDATING), _awaiting_job, lambda f, c: None),
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
        "domain taint",
        _s(NodeState.BLOCKED),
        lambda f, c: _blocked_before_touching(f, c) and _in_domain(f, c),
        _domain_taint,
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


def notifies(rules: RuleSet) -> bool:
    """Whether any rule ``notify``s (otherwise :func:`notices` is always empty and the notifications
    already sent need not be read)."""
    return any(_action(rule, NotifyAction) is not None for rule in rules.rules)


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
        ladder=m.ladder if m.ladder is not None else incident.ladder,
        ladder_index=m.ladder_index if m.ladder_index is not None else incident.ladder_index,
        ladder_started_at=m.ladder_started_at or incident.ladder_started_at,
        repair_nonce=m.repair_nonce if m.repair_nonce is not None else incident.repair_nonce,
        validation=m.validation if m.validation is not None else incident.validation,
        release_requested=None if m.release_handled else incident.release_requested,
        capture=m.capture if m.capture is not None else incident.capture,
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
