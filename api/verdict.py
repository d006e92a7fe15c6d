"""The verdict: one node in four answers an on-call reads first. Pure: facts in, text out, no I/O.

What fired (rule, GPU, its latest value against the rule's threshold, for how long), what healer
did (cordoned, tainted, drained, asked for a repair ...), what it waits for next and when the node
is expected back where that is known, and what a person should do ("nothing: healer is handling
it", unless a human holds the node, the breaker tripped, a drain is stuck, or a ticket came back).

Everything is derived from the lifecycle's own records (:mod:`healer.engine.lifecycle` names the
states and the incident's remediation memory): the node's state, its open incident, the finding
the incident is about, the incident's audit rows and ticket, and the pause and breaker switches.
:func:`api.queries.summarize_nodes` gathers these facts for many nodes in a few queries.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from api.rendering import format_duration, format_time
from api.schemas import VerdictOut
from healer.engine.lifecycle import value_text
from healer.model.states import ActionStatus, FindingState, NodeState, TicketStatus
from healer.ruleset.durations import format_duration as rule_duration

#: What to say when a person need not do anything.
NOTHING = "nothing: healer is handling it"


@dataclass(frozen=True)
class Evidence:
    """The finding the verdict names (the incident's latest): ``value`` in ``unit``, times UTC."""

    rule: str
    gpu: str | None
    state: str  # pending | firing | resolved
    value: float | None
    unit: str | None
    active_since: datetime
    fired_at: datetime | None = None
    resolved_at: datetime | None = None


@dataclass(frozen=True)
class Terms:
    """What the loaded rule says: its final comparison (``op``, ``threshold``; None when the
    expression ends in none), its ``for`` (seconds), whether it drains, and its ticket providers."""

    op: str | None = None
    threshold: float | None = None
    for_seconds: float = 0.0
    drains: bool = False
    tickets: tuple[str, ...] = ()


@dataclass(frozen=True)
class Done:
    """An audit row of the open incident (``actions``): kind, status, detail, error."""

    kind: str
    status: str
    detail: Mapping[str, object] = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True)
class TicketFacts:
    """The open incident's latest ticket."""

    id: int
    provider: str
    status: str
    created_at: datetime
    external_id: str | None = None
    acknowledged_at: datetime | None = None


@dataclass(frozen=True)
class LadderFacts:
    """The remediation ladder: its steps' kinds and timeouts (seconds), the step in progress
    (``index``; ``len(kinds)``: exhausted) and since when."""

    kinds: tuple[str, ...]
    timeouts: tuple[float, ...]
    index: int | None = None
    started_at: datetime | None = None


@dataclass(frozen=True)
class IncidentMemory:
    """The open incident's remediation memory (the ``incidents`` row)."""

    id: int
    opened_at: datetime
    rule: str | None = None
    cordoned_by_healer: bool = False
    blocked_step: str | None = None  # "quarantine" | "drain"
    blocked_reason: str | None = None
    clear_since: datetime | None = None
    drain_started_at: datetime | None = None
    drain_timeout_seconds: float | None = None
    ladder: LadderFacts | None = None
    validation: Mapping[str, object] | None = None  # {"job", "status", "result"}
    release_requested: Mapping[str, object] | None = None  # {"actor", "reason", "at"}


@dataclass(frozen=True)
class Fleet:
    """The controller-wide switches: pause (with its reason) and the circuit breaker (the nodes
    it holds back)."""

    paused: bool = False
    pause_reason: str | None = None
    breaker_tripped: bool = False
    breaker_reason: str | None = None
    breaker_held: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Policy:
    """Settings the verdict reads: the recovery hold (seconds), whether a validation Job gates the
    return to service, and when a node awaiting repair needs chasing (seconds)."""

    recovery_hold_seconds: float = 300.0
    validation_job: bool = False
    awaiting_repair_attention_seconds: float = 24 * 3600.0


@dataclass(frozen=True)
class VerdictFacts:
    """Everything :func:`verdict` reads about one node. ``blocked_reason``: the incident's, or the
    latest refusal's for a node blocked before any incident."""

    node: str
    state: str
    state_since: datetime
    shown_state: str = ""
    opted_out: bool = False
    incident: IncidentMemory | None = None
    evidence: Evidence | None = None
    terms: Terms | None = None
    actions: tuple[Done, ...] = ()
    ticket: TicketFacts | None = None
    fleet: Fleet = field(default_factory=Fleet)
    blocked_reason: str | None = None


@dataclass(frozen=True)
class _Next:
    waiting_for: str
    human: str = NOTHING
    needs_human: bool = False
    expected_back: datetime | None = None


def _ago(now: datetime, then: datetime | None) -> str:
    return format_duration((now - then).total_seconds()) if then is not None else "?"


def _threshold(terms: Terms | None) -> str | None:
    if terms is None or terms.threshold is None or terms.op is None:
        return None
    return f"{terms.op} {terms.threshold:g}"


def fired(facts: VerdictFacts, now: datetime) -> str:
    """``GpuTooHot on GPU 3: 85.5 degrees C (threshold > 78), firing for 12m 0s``; the rule alone
    when no finding is recorded; ``nothing`` for a node nothing fired on."""
    e = facts.evidence
    if e is None:
        rule = facts.incident.rule if facts.incident else None
        if facts.state == NodeState.UNKNOWN:
            return "no data: its exporters are down or stale"
        if rule:
            return f"rule {rule} (no finding recorded)"
        return "nothing" if facts.state == NodeState.HEALTHY else "nothing recorded"
    where = f" on GPU {e.gpu}" if e.gpu else ""
    limit = _threshold(facts.terms)
    value = value_text(e.value, e.unit) + (f" (threshold {limit})" if limit else "")
    if e.state == FindingState.RESOLVED:
        held = format_duration(((e.resolved_at or now) - e.active_since).total_seconds())
        timing = f"cleared {_ago(now, e.resolved_at)} ago after {held}"
    elif e.state == FindingState.PENDING:
        timing = f"pending for {_ago(now, e.active_since)}"
        if facts.terms is not None and facts.terms.for_seconds > 0:
            timing += f" of the {rule_duration(facts.terms.for_seconds)} it must hold"
    else:
        timing = f"firing for {_ago(now, e.active_since)}"
    return f"{e.rule}{where}: {value}, {timing}"


def _succeeded(facts: VerdictFacts, kind: str) -> bool:
    return any(a.kind == kind and a.status == ActionStatus.SUCCEEDED for a in facts.actions)


def _dry(facts: VerdictFacts, kind: str) -> bool:
    return any(a.kind == kind and a.status == ActionStatus.DRY_RUN for a in facts.actions)


def did(facts: VerdictFacts) -> str:
    """What healer did on this incident, in order: ``cordoned, tainted, drained, asked default for
    a repair (ticket RMA-42, acknowledged)``; ``nothing yet``."""
    out: list[str] = []
    inc = facts.incident
    if (inc is not None and inc.cordoned_by_healer) or _succeeded(facts, "cordon"):
        out.append("cordoned")
    if _succeeded(facts, "taint") or facts.shown_state == "tainted":
        out.append("tainted")
    for kind in ("cordon", "taint", "drain"):
        if _dry(facts, kind):
            out.append(f"would have {'drained' if kind == 'drain' else kind + 'ed'} (dry-run)")
    drains = [a for a in facts.actions if a.kind == "drain"]
    if drains:
        last = drains[-1]
        if last.status == ActionStatus.SUCCEEDED:
            out.append("drained")
        elif last.status == ActionStatus.RUNNING:
            remaining = last.detail.get("remaining")
            left = f", {len(remaining)} pod(s) left" if isinstance(remaining, list) else ""
            out.append(f"draining{left}")
        elif last.status == ActionStatus.BLOCKED:
            out.append("drain blocked")
        elif last.status == ActionStatus.CANCELLED:
            out.append("drain stopped")
    for a in facts.actions:
        if a.kind == "repair-request" and a.status == ActionStatus.SUCCEEDED:
            out.append(f"asked the node agent for {a.detail.get('action') or 'a repair'}")
        elif a.kind == "validation-job" and a.status == ActionStatus.SUCCEEDED:
            out.append(f"started validation Job {a.detail.get('job') or ''}".rstrip())
    if facts.ticket is not None:
        t = facts.ticket
        name = t.external_id or f"#{t.id}"
        out.append(f"asked {t.provider} for a repair (ticket {name}, {t.status})")
    refused = [a for a in facts.actions if a.status == ActionStatus.REFUSED]
    if refused and facts.state in (NodeState.SUSPECT, NodeState.BLOCKED, NodeState.QUARANTINED):
        out.append(f"was refused a {refused[-1].kind} ({refused[-1].error or 'safety'})")
    if facts.state == NodeState.RELEASED:
        out.append("let go of the node when a person took it over")
    return ", ".join(dict.fromkeys(out)) or "nothing yet"


def _ticket_wait(facts: VerdictFacts, now: datetime, policy: Policy) -> _Next:
    t = facts.ticket
    assert t is not None
    name = f"{t.provider}'s ticket {t.external_id or f'#{t.id}'}"
    if t.status == TicketStatus.PENDING:
        return _Next(f"{name} to be delivered (asked {_ago(now, t.created_at)} ago)")
    if t.status == TicketStatus.SENT:
        return _Next(f"{name} to be acknowledged (sent {_ago(now, t.created_at)} ago)")
    if t.status == TicketStatus.NEEDS_INFO:
        return _Next(f"{name}: the provider asked for information", "answer the provider on the ticket", True)
    if t.status in (TicketStatus.REJECTED, TicketStatus.FAILED, TicketStatus.CLOSED):
        human = f"the ticket is {t.status}: repair the node or ask again, then release it"
        return _Next(f"a repair: {name} is {t.status}", human, True)
    if t.status == TicketStatus.RESOLVED:
        return _Next("the next tick: the provider resolved the ticket, validation follows")
    since = t.acknowledged_at or t.created_at
    waited = (now - facts.state_since).total_seconds()
    if waited > policy.awaiting_repair_attention_seconds:
        limit = format_duration(policy.awaiting_repair_attention_seconds)
        return _Next(
            f"the repair on {name} ({t.status})", f"chase the ticket: awaiting repair over {limit}", True
        )
    return _Next(f"the repair on {name} ({t.status} {_ago(now, since)} ago)")


def _awaiting_repair(facts: VerdictFacts, now: datetime, policy: Policy) -> _Next:
    inc = facts.incident
    ladder = inc.ladder if inc else None
    if ladder is not None and ladder.index is not None and ladder.kinds:
        if ladder.index >= len(ladder.kinds):
            return _Next(
                "a person: the remediation ladder is exhausted",
                "repair the node, then release it (healer has tried every step)",
                True,
            )
        kind, timeout = ladder.kinds[ladder.index], ladder.timeouts[ladder.index]
        step = f"step {ladder.index + 1}/{len(ladder.kinds)}"
        deadline = ladder.started_at + timedelta(seconds=timeout) if ladder.started_at else None
        by = f", escalating at {format_time(deadline)} if it does not help" if deadline else ""
        if kind in ("reset-gpu", "reboot"):
            return _Next(f"the node agent's {kind} ({step}){by}")
        if kind == "notify":
            return _Next(f"the notified team ({step}){by}")
    if facts.ticket is not None:
        return _ticket_wait(facts, now, policy)
    return _Next("its findings to clear (no repair was asked for), then the recovery hold")


def _validating(facts: VerdictFacts, now: datetime, policy: Policy) -> _Next:
    inc = facts.incident
    hold = rule_duration(policy.recovery_hold_seconds)
    job = inc.validation if inc else None
    job_status = str(job.get("status")) if job else None
    if job is not None and job_status == "running":
        return _Next(f"validation Job {job.get('job')} to pass, and the rules to stay clear {hold}")
    if inc is None or inc.clear_since is None:
        return _Next(
            f"its rules to stay clear for the recovery hold ({hold}); it starts at the first clear tick"
        )
    back = inc.clear_since + timedelta(seconds=policy.recovery_hold_seconds)
    if policy.validation_job and job_status != "succeeded":
        return _Next(
            f"the recovery hold ({hold}, clear since {format_time(inc.clear_since)}) and a validation Job"
        )
    return _Next(
        f"the recovery hold ({hold}, clear since {format_time(inc.clear_since)})", expected_back=back
    )


def _blocked(facts: VerdictFacts) -> _Next:
    reason = facts.blocked_reason or (facts.incident.blocked_reason if facts.incident else None) or ""
    inc = facts.incident
    if (inc is not None and inc.blocked_step == "drain") or reason.startswith("drain"):
        ask = " and the provider's ticket" if facts.ticket is not None else ""
        return _Next(
            f"its pods to leave{ask}: {reason or 'the drain could not finish'}",
            "decide about the pods named (their PodDisruptionBudget or owner), or release the node",
            True,
        )
    if reason.startswith("breaker") or facts.node in facts.fleet.breaker_held:
        why = facts.fleet.breaker_reason or reason
        return _Next(
            "a person to reset the circuit breaker",
            f"the circuit breaker tripped ({why}): find the fleet-wide cause, then reset it",
            True,
        )
    if reason.startswith("budget"):
        return _Next(
            f"room in its pool's budget ({reason})",
            "nothing, unless it lasts: healer quarantines it once another node of the pool is back",
        )
    return _Next(
        f"a change: {reason or 'a step was refused'}",
        f"read why it is blocked: {reason or 'see the audit log'}",
        True,
    )


def _next(facts: VerdictFacts, now: datetime, policy: Policy) -> _Next:
    state, inc, fleet = facts.state, facts.incident, facts.fleet
    if inc is not None and inc.release_requested:
        actor = inc.release_requested.get("actor") or "an operator"
        return _Next(f"the next tick to act on {actor}'s release (then validation)")
    if facts.opted_out and state != NodeState.HEALTHY:
        return _Next(
            "nothing: the node carries the opt-out label", "it is yours: healer will not act on it", True
        )
    if fleet.paused and state in (NodeState.SUSPECT, NodeState.QUARANTINED, NodeState.DRAINING):
        why = f" ({fleet.pause_reason})" if fleet.pause_reason else ""
        return _Next(f"healer to be resumed: it is paused{why}", "resume healer when it is safe to act", True)
    if facts.node in fleet.breaker_held and state in (NodeState.SUSPECT, NodeState.BLOCKED):
        return _blocked(facts)
    match state:
        case NodeState.HEALTHY:
            return _Next("nothing", "nothing")
        case NodeState.UNKNOWN:
            return _Next(
                "data to come back",
                "check the node's exporters (dcgm-exporter, node_exporter) and their scrape",
                True,
            )
        case NodeState.SUSPECT:
            e, terms = facts.evidence, facts.terms
            if e is not None and e.state == FindingState.PENDING and terms is not None and terms.for_seconds:
                at = e.active_since + timedelta(seconds=terms.for_seconds)
                return _Next(f"the finding to hold until {format_time(at)} (acts then) or to clear")
            if terms is not None and terms.tickets and not facts.ticket:
                return _Next(f"the ticket to {', '.join(terms.tickets)} to be asked for at the next tick")
            if facts.ticket is not None:
                return _ticket_wait(facts, now, policy)
            return _Next("the finding to fire (healer acts) or to clear")
        case NodeState.QUARANTINED:
            if facts.evidence is not None and facts.evidence.state == FindingState.RESOLVED:
                return _Next("the next tick: its findings cleared, validation follows")
            if facts.terms is not None and facts.terms.drains:
                return _Next("the drain to start at the next tick")
            if facts.ticket is not None:
                return _ticket_wait(facts, now, policy)
            return _Next("the next step (a repair or its ticket) at the next tick")
        case NodeState.DRAINING:
            deadline = None
            if inc is not None and inc.drain_started_at is not None and inc.drain_timeout_seconds:
                deadline = inc.drain_started_at + timedelta(seconds=inc.drain_timeout_seconds)
            by = f"; blocked if pods remain at {format_time(deadline)}" if deadline else ""
            return _Next(f"the drain to finish (PodDisruptionBudgets allowing){by}")
        case NodeState.AWAITING_REPAIR:
            return _awaiting_repair(facts, now, policy)
        case NodeState.REPAIRED:
            return _Next("the next tick: validation starts")
        case NodeState.VALIDATING:
            return _validating(facts, now, policy)
        case NodeState.BLOCKED:
            return _blocked(facts)
        case NodeState.RELEASED:
            return _Next(
                "its findings to clear (then healthy; a new firing opens a new incident)",
                "a person holds this node: healer changes nothing on it",
                True,
            )
    return _Next("nothing known", "look at its timeline", True)


def verdict(facts: VerdictFacts, *, now: datetime, policy: Policy | None = None) -> VerdictOut:
    """The node's verdict from ``facts`` at ``now`` (aware UTC)."""
    policy = policy or Policy()
    what = fired(facts, now)
    done = did(facts)
    nxt = _next(facts, now, policy)
    back = f", back by {format_time(nxt.expected_back)}" if nxt.expected_back else ""
    line = f"Fired: {what}. Did: {done}. Waiting for: {nxt.waiting_for}{back}. You: {nxt.human}."
    e = facts.evidence
    held = None
    if e is not None:
        held = ((e.resolved_at or now) if e.state == FindingState.RESOLVED else now) - e.active_since
    return VerdictOut(
        fired=what,
        did=done,
        waiting_for=nxt.waiting_for,
        expected_back=nxt.expected_back,
        human=nxt.human,
        needs_human=nxt.needs_human,
        rule=e.rule if e else (facts.incident.rule if facts.incident else None),
        gpu=e.gpu if e else None,
        value=e.value if e else None,
        unit=e.unit if e else None,
        threshold=_threshold(facts.terms),
        held_seconds=held.total_seconds() if held is not None else None,
        line=line,
    )
