"""Outcomes: was a rule's decision right? Per incident, per shadow decision, and per rule. Pure.

An incident healer took a node out for ends **confirmed** (the fault was real) or **not
confirmed** (it was not, as far as anyone could tell), from what happened to it:

========================  ==============  ==========================================================
basis                     outcome         what happened
========================  ==============  ==========================================================
``validation_failed``     confirmed       a validation (Job, or the rule firing again) failed after
                                          the repair: the fault outlived it
``part_replaced``         confirmed       the provider resolved the ticket saying it replaced a part
``fault_found``           confirmed       the provider resolved it saying it found a fault
``repeat_part``           confirmed       a part that failed before after a repair failed again
``repaired``              confirmed       a repair was done (the provider resolved the ticket without
                                          saying more, or the node agent's reset/reboot succeeded)
``no_fault_found``        not confirmed   the provider resolved it saying it found no fault
``released_by_human``     not confirmed   a human took the node back (uncordon, opt-out, release)
``validation_passed``     not confirmed   the first validation Job passed with no repair done
``recovered``             not confirmed   the findings cleared and the node returned with no repair
``no_action``             none            the node never left service (cleared in ``suspect``, or
                                          safety refused the quarantine): no decision to judge
``undetermined``          none            the incident ended otherwise (node deleted, ...)
``operator``              either          an operator set it by hand (audited); wins over the above
========================  ==============  ==========================================================

The first matching line wins, in this order. A rule's **precision** over a window is confirmed /
decided (decided = confirmed + not confirmed); a **false quarantine** is a not-confirmed one.
**GPU-hours taken out** are the hours a node spent out of service in the incident times its GPU
count. **Time to repair** is from the node leaving service to its return.

A shadow rule's decision (:class:`ShadowDecision`) takes its outcome from what later happened to
the node: an acting rule's incident overlapping it, else its own findings clearing (recovered).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from healer.model.states import OUT_OF_SERVICE, NodeState
from healer.model.states import TicketResolution as Resolution


class Outcome(StrEnum):
    CONFIRMED = "confirmed"
    NOT_CONFIRMED = "not_confirmed"


#: Close reasons (``healer.engine.lifecycle``) meaning a validation failed after the repair.
_VALIDATION_FAILED = "failed validation"
#: The close reason of a node handed back to service (``healer.engine.lifecycle``).
RETURNED = "returned to service"


@dataclass(frozen=True)
class Step:
    """One recorded transition of the incident: when, to which state, who."""

    at: datetime
    to_state: str
    actor: str = "healer"


@dataclass(frozen=True)
class IncidentStory:
    """What happened in one closed incident, read from the store.

    ``steps``: its transitions, oldest first. ``resolutions``: the provider's resolution of each
    resolved ticket (None when it said none). ``repaired_by_agent``: a ladder reset/reboot
    succeeded. ``validation``: the validation Job's status (``succeeded``/``failed``) or None.
    ``repeat_part``: it went straight to replacement because a part failed again after a repair.
    """

    rule: str | None
    pool: str
    opened_at: datetime
    closed_at: datetime
    close_reason: str | None
    steps: Sequence[Step] = ()
    resolutions: Sequence[str | None] = ()
    validation: str | None = None
    repeat_part: bool = False
    gpus: int = 0


@dataclass(frozen=True)
class Judgement:
    """An incident's outcome (None: not a decision, or not known) and the basis it rests on."""

    outcome: Outcome | None
    basis: str


def took_out(story: IncidentStory) -> bool:
    """The node left service in the incident (quarantined or further)."""
    return any(s.to_state in OUT_OF_SERVICE for s in story.steps)


def judge(story: IncidentStory) -> Judgement:
    """The outcome of a closed incident, by the table in the module docstring."""
    if not took_out(story):
        return Judgement(None, "no_action")
    reason = story.close_reason or ""
    if reason.startswith(_VALIDATION_FAILED):
        return Judgement(Outcome.CONFIRMED, "validation_failed")
    said = set(story.resolutions)
    if Resolution.REPLACED in said:
        return Judgement(Outcome.CONFIRMED, "part_replaced")
    if Resolution.FAULT_FOUND in said:
        return Judgement(Outcome.CONFIRMED, "fault_found")
    if story.repeat_part:
        return Judgement(Outcome.CONFIRMED, "repeat_part")
    if Resolution.NO_FAULT_FOUND in said:
        return Judgement(Outcome.NOT_CONFIRMED, "no_fault_found")
    if any(s.to_state == NodeState.RELEASED for s in story.steps):
        return Judgement(Outcome.NOT_CONFIRMED, "released_by_human")
    if any(s.to_state == NodeState.REPAIRED for s in story.steps):
        return Judgement(Outcome.CONFIRMED, "repaired")
    if story.validation == "succeeded":
        return Judgement(Outcome.NOT_CONFIRMED, "validation_passed")
    if reason == RETURNED:
        return Judgement(Outcome.NOT_CONFIRMED, "recovered")
    return Judgement(None, "undetermined")


def out_of_service_seconds(steps: Sequence[Step], *, until: datetime) -> float:
    """Seconds the node spent out of service over ``steps`` (oldest first), up to ``until``.

    ``blocked`` counts when entered from an out-of-service state (a blocked drain keeps the node
    cordoned), not when a quarantine was refused.
    """
    total = 0.0
    out_since: datetime | None = None
    for s in steps:
        out = s.to_state in OUT_OF_SERVICE or (s.to_state == NodeState.BLOCKED and out_since is not None)
        if out and out_since is None:
            out_since = s.at
        elif not out and out_since is not None:
            total += max(0.0, (s.at - out_since).total_seconds())
            out_since = None
    if out_since is not None:
        total += max(0.0, (until - out_since).total_seconds())
    return total


def time_to_repair_seconds(story: IncidentStory) -> float | None:
    """From the node leaving service to its return, seconds; None when it did not return."""
    if story.close_reason != RETURNED:
        return None
    first = next((s.at for s in story.steps if s.to_state in OUT_OF_SERVICE), None)
    return None if first is None else max(0.0, (story.closed_at - first).total_seconds())


@dataclass(frozen=True)
class Judged:
    """A closed incident with its outcome as recorded (an operator's edit included)."""

    story: IncidentStory
    outcome: Outcome | None
    basis: str


@dataclass
class RuleRecord:
    """One rule's record (or one rule in one pool, ``pool`` set) over a window.

    ``precision`` is confirmed / decided, None when nothing was decided. Hours are hours.
    """

    rule: str
    pool: str | None = None
    decided: int = 0
    confirmed: int = 0
    not_confirmed: int = 0
    undetermined: int = 0
    gpu_hours: float = 0.0
    node_hours: float = 0.0
    repair_seconds: list[float] = field(default_factory=list)
    bases: dict[str, int] = field(default_factory=dict)

    @property
    def precision(self) -> float | None:
        return self.confirmed / self.decided if self.decided else None

    @property
    def false_quarantines(self) -> int:
        return self.not_confirmed

    @property
    def median_time_to_repair_seconds(self) -> float | None:
        return statistics.median(self.repair_seconds) if self.repair_seconds else None

    def add(self, j: Judged) -> None:
        # A recorded outcome counts even when the incident's transitions were pruned
        # (scheduler.retention_days): its hours out are then unknown and count as none.
        if j.outcome is None and not took_out(j.story):
            return
        self.bases[j.basis] = self.bases.get(j.basis, 0) + 1
        if j.outcome is None:
            self.undetermined += 1
        else:
            self.decided += 1
            if j.outcome == Outcome.CONFIRMED:
                self.confirmed += 1
            else:
                self.not_confirmed += 1
        seconds = out_of_service_seconds(j.story.steps, until=j.story.closed_at)
        self.node_hours += seconds / 3600
        self.gpu_hours += seconds / 3600 * j.story.gpus
        ttr = time_to_repair_seconds(j.story)
        if ttr is not None:
            self.repair_seconds.append(ttr)


def records(judged: Iterable[Judged]) -> tuple[list[RuleRecord], list[RuleRecord]]:
    """Per rule and per rule x pool records of ``judged`` incidents (those without a rule are
    skipped), each list sorted by rule then pool."""
    by_rule: dict[str, RuleRecord] = {}
    by_pool: dict[tuple[str, str], RuleRecord] = {}
    for j in judged:
        rule = j.story.rule
        if not rule:
            continue
        by_rule.setdefault(rule, RuleRecord(rule)).add(j)
        by_pool.setdefault((rule, j.story.pool), RuleRecord(rule, j.story.pool)).add(j)
    return (
        [by_rule[k] for k in sorted(by_rule)],
        [by_pool[k] for k in sorted(by_pool)],
    )


# --- shadow rules -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeIncident:
    """An acting rule's incident on a node, as a shadow decision's outcome reads it."""

    id: int
    opened_at: datetime
    closed_at: datetime | None
    outcome: Outcome | None
    basis: str | None


@dataclass(frozen=True)
class ShadowDecision:
    """What a shadow rule would have done on one node: from its finding firing (``opened_at``) to
    its last finding on the node resolving (``closed_at``, None while it fires). ``would``: the
    actions it would have taken (``cordon``, ``taint``, ``drain``, ``ticket``)."""

    id: int
    rule: str
    node: str
    pool: str
    opened_at: datetime
    closed_at: datetime | None
    would: Sequence[str] = ()
    gpus: int = 0


def judge_shadow(decision: ShadowDecision, incidents: Sequence[NodeIncident], *, now: datetime) -> Judgement:
    """A shadow decision's outcome from what happened to its node: an acting rule's incident
    overlapping it that ended confirmed (or not) gives its outcome (basis ``incident <id>:
    <basis>``); with none, its findings clearing mean it recovered without repair (not
    confirmed); still firing with nothing else known: None (``pending``)."""
    end = decision.closed_at or now
    overlapping = [
        i
        for i in incidents
        if i.opened_at <= end and (i.closed_at is None or i.closed_at >= decision.opened_at)
    ]
    for wanted in (Outcome.CONFIRMED, Outcome.NOT_CONFIRMED):
        hit = next((i for i in overlapping if i.outcome == wanted), None)
        if hit is not None:
            return Judgement(wanted, f"incident {hit.id}: {hit.basis}")
    if any(i.closed_at is None for i in overlapping):
        return Judgement(None, "pending")
    if decision.closed_at is not None:
        return Judgement(Outcome.NOT_CONFIRMED, "recovered")
    return Judgement(None, "pending")


@dataclass
class ShadowRecord:
    """What switching a shadow rule to acting would have done over a window: the nodes it would
    have taken out, GPU-hours (its GPU count times how long its findings fired, clipped to the
    window), tickets it would have opened, and its decisions' outcomes."""

    rule: str
    decisions: int = 0
    nodes: set[str] = field(default_factory=set)
    gpu_hours: float = 0.0
    tickets: int = 0
    confirmed: int = 0
    not_confirmed: int = 0
    pending: int = 0

    @property
    def decided(self) -> int:
        return self.confirmed + self.not_confirmed

    @property
    def precision(self) -> float | None:
        return self.confirmed / self.decided if self.decided else None


def shadow_records(
    judged: Iterable[tuple[ShadowDecision, Judgement]], *, since: datetime, now: datetime
) -> list[ShadowRecord]:
    """Per shadow rule, what it would have done between ``since`` and ``now`` (sorted by rule)."""
    out: dict[str, ShadowRecord] = {}
    for d, j in judged:
        r = out.setdefault(d.rule, ShadowRecord(d.rule))
        r.decisions += 1
        r.nodes.add(d.node)
        start, end = max(d.opened_at, since), min(d.closed_at or now, now)
        r.gpu_hours += max(timedelta(0), end - start).total_seconds() / 3600 * d.gpus
        r.tickets += "ticket" in d.would
        if j.outcome == Outcome.CONFIRMED:
            r.confirmed += 1
        elif j.outcome == Outcome.NOT_CONFIRMED:
            r.not_confirmed += 1
        else:
            r.pending += 1
    return [out[k] for k in sorted(out)]
