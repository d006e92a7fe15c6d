"""Response and request bodies of the JSON API (pydantic, so the OpenAPI document shows them).

Times are aware UTC ISO 8601; durations are seconds.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, Field

from healer.redaction import redact_text

T = TypeVar("T")
#: Text that may carry a URL or a secret from outside (provider answers, transport errors): shown
#: only through :func:`healer.redaction.redact_text`, on pages and in the API alike.
Redacted = Annotated[str, AfterValidator(redact_text)]


class ErrorDetail(BaseModel):
    code: str = Field(..., description="Stable machine-readable code, e.g. not_found, csrf, conflict.")
    message: str


class ErrorBody(BaseModel):
    """Every 4xx/5xx answer of the JSON API."""

    error: ErrorDetail


class Page(BaseModel, Generic[T]):
    """One page of a list; pass ``next_cursor`` back as ``cursor`` for the next one (null: last page)."""

    items: list[T]
    next_cursor: str | None = None


class TicketBrief(BaseModel):
    id: int
    provider: str
    status: str
    external_id: str | None = None


class VerdictOut(BaseModel):
    """The node in one line, derived from the lifecycle's own records (:mod:`api.verdict`): what
    fired, what healer did, what it waits for next (and when the node is expected back, where
    known), and what a person should do."""

    fired: str = Field(
        description="Rule, GPU, the latest value against the rule's threshold and for how long; "
        "'nothing' when no rule fired."
    )
    did: str = Field(
        description="What healer did on the open incident: cordoned, tainted, drained, asked for a repair ..."
    )
    waiting_for: str = Field(
        description="What healer waits for next: the drain, the provider's ticket, the hold ..."
    )
    expected_back: datetime | None = Field(
        None, description="When the node should be back in service; null: not known."
    )
    human: str = Field(description="What a person should do: often 'nothing: healer is handling it'.")
    needs_human: bool = Field(False, description="True when healer cannot go on without a person.")
    rule: str | None = None
    gpu: str | None = None
    value: float | None = Field(None, description="The finding's latest value, in `unit`.")
    unit: str | None = None
    threshold: str | None = Field(
        None, description="The rule's final comparison, e.g. '> 78'; null: not known."
    )
    held_seconds: float | None = Field(
        None, description="How long the condition has held (or held, once cleared)."
    )
    line: str = Field(description="All of it in one sentence, as the dashboard shows it.")


class NodeSummary(BaseModel):
    """A node in lists: state and why (active rules, affected GPUs), and its latest ticket."""

    name: str
    pool: str
    state: str
    state_since: datetime
    opted_out: bool
    shown_state: str = Field(
        "", description="The state named for what happened: 'tainted' for a quarantine by taint alone."
    )
    rules: list[str] = Field(
        default_factory=list,
        description="Rules with a pending or firing finding; when none (validating, awaiting repair after "
        "its findings cleared), the rules of its open incident.",
    )
    affected_gpus: list[str] = Field(default_factory=list, description="GPUs named by those findings.")
    gpu_count: int | None = Field(
        None,
        description="GPUs of the node healer has recorded by UUID (each GPU a finding named); null when "
        "healer has recorded none, which says nothing about how many GPUs the node has.",
    )
    ticket: TicketBrief | None = None
    drain_blocked: bool = Field(
        False, description="Blocked because its drain could not finish (PodDisruptionBudgets, refused pods)."
    )
    blocked_reason: str | None = None
    verdict: VerdictOut | None = Field(None, description="The node in one line; null where not judged.")


class AttentionOut(BaseModel):
    """A node the on-call should look at now, and why."""

    node: NodeSummary
    why: str


class GpuOut(BaseModel):
    uuid: str
    index: int
    pci_bus_id: str | None
    model_name: str | None
    first_seen: datetime
    last_seen: datetime


class TransitionOut(BaseModel):
    id: int
    from_state: str
    to_state: str
    actor: str
    reason: str
    evidence: dict[str, Any] | None
    at: datetime
    incident_id: int | None


class FindingOut(BaseModel):
    id: int
    rule: str
    node_name: str
    gpu: str | None
    state: str
    severity: str
    value: float | None
    unit: str | None
    labels: dict[str, Any]
    summary: str
    active_since: datetime
    fired_at: datetime | None
    resolved_at: datetime | None
    last_seen_at: datetime
    incident_id: int | None


class ActionOut(BaseModel):
    """An audit-log row: something healer did, would have done (dry_run), refused, or an operator did."""

    id: int
    kind: str
    target: str
    status: str
    actor: str
    attempts: int
    error: Redacted | None
    detail: dict[str, Any] | None
    created_at: datetime
    incident_id: int | None


class IncidentOut(BaseModel):
    """An incident, headlined by its latest evidence: ``summary`` tells the incident's latest
    finding (rule, GPU, its latest value), ``first_summary`` what was recorded when it opened."""

    id: int
    node: str
    opened_at: datetime
    closed_at: datetime | None
    summary: str = Field(
        description="The headline from the incident's latest finding (its value now, or its last value "
        "once resolved); the first summary when no finding is attached."
    )
    close_reason: str | None
    escalated: bool
    first_summary: str = Field("", description="The summary recorded when the incident opened.")
    rule: str | None = Field(
        None, description="The rule of the latest finding (else the rule healer follows)."
    )
    gpu: str | None = None
    value: float | None = Field(None, description="The latest finding's latest value, in `unit`.")
    unit: str | None = None
    evidence_at: datetime | None = Field(None, description="When that value was last seen.")
    pool: str | None = Field(None, description="The node's pool (incident lists only).")


class TicketOut(BaseModel):
    """A provider ticket with its delivery state and timings (seconds)."""

    id: int
    incident_id: int
    node: str
    provider: str
    status: str
    open: bool
    external_id: str | None
    escalated: bool
    reason: Redacted | None
    created_at: datetime
    sent_at: datetime | None
    acknowledged_at: datetime | None
    resolved_at: datetime | None
    closed_by: str | None
    age_seconds: float
    time_to_acknowledge_seconds: float | None
    time_to_repair_seconds: float | None
    delivery_attempts: int = 0
    delivery_error: Redacted | None = None
    overdue: list[str] = Field(
        default_factory=list, description="The provider's repair targets it is past: ack, repair."
    )


class ProviderStats(BaseModel):
    """Per provider: open now; over the last 30 days: total, failed deliveries, and median times to
    acknowledge and to repair (seconds, from the provider's callbacks)."""

    provider: str
    open: int
    total: int
    failed: int
    median_ack_seconds: float | None
    median_repair_seconds: float | None


class BlindSpotOut(BaseModel):
    """A place on a node a rule cannot see (:mod:`healer.blind_spots`): it lacks an input the
    rule reads while other targets export it."""

    node: str
    rule: str
    scope: str = Field(description='"gpu 3", "mlx5_0 port 1", or "node" (nothing of the exporter at all)')
    missing: list[str] = Field(description="The inputs it lacks (alternatives joined by ' or ').")
    why: str


class UnresolvedSeriesOut(BaseModel):
    """A series the blind-spot observation could not tie to an existing Node (counted for none)."""

    series: str
    why: str


class BlindSpotsOut(BaseModel):
    """The last blind-spot observation (the controller's, every ``safety.coverage_refresh_seconds``)."""

    observed_at: datetime | None = Field(description="null: never observed (no controller has run yet).")
    total: int = Field(0, description="Places found; `spots` holds the first 2,000 (by node, rule, place).")
    per_rule: dict[str, int] = Field(default_factory=dict, description="Rule → its places, exact.")
    spots: list[BlindSpotOut]
    unresolved: list[UnresolvedSeriesOut]
    errors: list[str] = Field(description="Queries that failed: the places they would show are unknown.")


class NodeDetail(BaseModel):
    """Everything about one node: the recent slice of each history (full history: the list endpoints)."""

    node: NodeSummary
    gpus: list[GpuOut]
    open_incident: IncidentOut | None
    incidents: list[IncidentOut]
    transitions: list[TransitionOut]
    findings: list[FindingOut]
    actions: list[ActionOut]
    notes: list[ActionOut]
    tickets: list[TicketOut]
    blind_spots: list[BlindSpotOut] = Field(
        default_factory=list, description="Places on this node a rule cannot see (last observation)."
    )
    blind_spots_observed_at: datetime | None = None


class RuleOut(BaseModel):
    """A loaded rule with its last evaluation and the nodes it currently flags."""

    name: str
    group: str
    expr: str
    for_seconds: float
    keep_firing_for_seconds: float
    severity: str
    kind: str
    actions: list[str]
    health: str | None = Field(
        default=None,
        description=(
            "ok, no_data, degraded (some series name no node: last_error gives the count and an "
            "example), error, unavailable; null: never evaluated."
        ),
    )
    last_error: Redacted | None = None
    last_evaluated_at: datetime | None = None
    last_duration_seconds: float | None = None
    series: int | None = None
    firing_nodes: int = 0
    pending_nodes: int = 0
    absent_inputs: list[str] = Field(
        default_factory=list,
        description=(
            "Metrics the rule needs that no target exports now (alternatives joined by ' or '): "
            "the rule finds nothing until one appears. `healer doctor exporters` names the "
            "counters CSV line that adds each."
        ),
    )


class RejectedReload(BaseModel):
    at: str | None
    error: str


class RulesOut(BaseModel):
    loaded: bool = Field(..., description="False when this process has no rule set (nothing loaded yet).")
    loaded_at: str | None = None
    sources: list[str] = Field(default_factory=list)
    rules: list[RuleOut]
    rejected: list[RejectedReload] = Field(default_factory=list, description="Failed reloads, newest last.")
    inputs_error: str | None = Field(
        default=None,
        description="Why the rules' input metrics could not be checked against Prometheus; null: checked.",
    )


class BreakerOut(BaseModel):
    tripped: bool
    reason: str | None = None
    tripped_at: str | None = None
    held: list[str] = Field(default_factory=list)


class BreakerScope(BaseModel):
    """What the circuit breaker is judged over: ``rule`` states the limits in force; when tripped,
    ``pool`` is the pool whose share tripped it, ``pool_nodes`` that pool's node count (the
    denominator of the percentage) and ``bad_nodes`` how many of them turned bad."""

    rule: str
    pool: str | None = None
    pool_nodes: int | None = None
    bad_nodes: int | None = None


class PoolBudget(BaseModel):
    """Remediation budget use of one pool: nodes out of service vs the limit (min of both caps,
    never under the floor for small pools).

    ``kind``: how its nodes were found: ``labels`` (the pool label, or ``default``/``no-gpu``),
    ``coverage`` (the nodes exporting the input metrics of ``rules``) or ``selector`` (the rules'
    ``pool.node_selector``); ``rules``: the rules whose budget and breaker count over it.
    """

    pool: str
    nodes: int  # the denominator of the budget's and the breaker's percentages
    out_of_service: int
    limit: int
    breaker_trips_at: int = 0  # nodes of this pool turning bad within the window that trip the breaker
    kind: str = "labels"
    rules: list[str] = Field(default_factory=list)


class LastTick(BaseModel):
    at: datetime
    duration_seconds: float | None = None
    leader: str | None = None
    age_seconds: float


class SourceOut(BaseModel):
    """Whether Prometheus could be queried on the last tick that queried it.

    ``failing_seconds``: how long it has failed (0 when ok); ``unready``: for longer than
    ``prometheus.unavailable_grace_seconds`` (``/readyz`` fails, the dashboard header is red).
    """

    ok: bool
    since: datetime
    reason: str = ""
    failing_seconds: float = 0.0
    unready: bool = False


class FleetStatus(BaseModel):
    """The fleet at a glance."""

    total: int
    counts: dict[str, int]
    paused: bool
    pause_reason: str | None = None
    dry_run: bool
    breaker: BreakerOut
    breaker_scope: BreakerScope
    budgets: list[PoolBudget]
    last_tick: LastTick | None
    rules: list[RuleOut]
    source: SourceOut | None = None


class ReasonIn(BaseModel):
    reason: str = Field("", max_length=2000)


class OutcomeIn(BaseModel):
    """An operator's outcome for a closed incident: ``confirmed``, ``not_confirmed``, or null to
    go back to the one healer derives."""

    outcome: Literal["confirmed", "not_confirmed"] | None
    reason: str = Field("", max_length=2000)


class NoteIn(BaseModel):
    text: str = Field(..., min_length=1, max_length=10000)


class OperationOut(BaseModel):
    """Result of an operator action; the audit log has the full record."""

    ok: bool = True
    message: str
    node: NodeSummary | None = None
    held: list[str] | None = None
    ticket: TicketOut | None = None


class ControllerOut(BaseModel):
    """The controller's state as ``/readyz`` sees it in the database (ticks are recorded by whichever
    replica leads): ``ok`` when a tick finished within three default intervals and Prometheus has
    not been failing for longer than its grace, else ``reasons``. ``in_process``: a controller runs
    in this process (``healer run``), so its state counts towards readiness; ``healer serve`` shows
    it without failing."""

    in_process: bool
    ok: bool
    reasons: list[str]


class ReadyOut(BaseModel):
    ready: bool
    reasons: list[str]
    database: bool
    last_tick_at: datetime | None
    last_tick_age_seconds: float | None
    leader: bool | None
    source: SourceOut | None = None
    controller: ControllerOut
    node_watch_age_seconds: float | None = Field(
        default=None,
        description=(
            "Seconds since this process's watched store of Nodes last heard from the API server "
            "(null: no watch runs here, or it has not listed yet). Past its staleness the "
            "controller lists Nodes instead: informational, never a reason to be unready."
        ),
    )
