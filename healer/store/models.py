"""SQLAlchemy 2.0 typed models: the tables healer records into.

Times are aware UTC (:class:`~healer.store.types.UTCDateTime`); state columns hold the string
values of the enums in :mod:`healer.model.states`. Constraint names follow ``NAMING_CONVENTION``
so Alembic migrations are stable on SQLite and PostgreSQL.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from healer.store.types import UTCDateTime

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON, list[Any]: JSON}


class Node(Base):
    """A Kubernetes node healer knows about, with its current lifecycle state."""

    __tablename__ = "nodes"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(253), unique=True)
    pool: Mapped[str] = mapped_column(String(253), default="default")
    state: Mapped[str] = mapped_column(String(32), default="healthy")
    state_since: Mapped[datetime]
    opted_out: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    # Sticky gauges (healer.engine.sticky): series key → value seen when the last repair was accepted.
    sticky_values: Mapped[dict[str, Any] | None]
    #: The step being applied to the cluster now, written before its first write and cleared with
    #: its record ({"step", "to", "from", "holder", "fencing_token", "at"}); one left behind means
    #: the process died in between (the ownership reconcile finishes the job).
    intent: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)

    gpus: Mapped[list[Gpu]] = relationship(back_populates="node", order_by="Gpu.index")

    __table_args__ = (Index("ix_nodes_state_since", "state", "state_since"),)


class Gpu(Base):
    """A GPU by UUID, as dcgm-exporter reports it (``UUID``, ``pci_bus_id``, ``modelName``)."""

    __tablename__ = "gpus"

    id: Mapped[int] = mapped_column(primary_key=True)
    uuid: Mapped[str] = mapped_column(String(64), unique=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    index: Mapped[int]
    pci_bus_id: Mapped[str | None] = mapped_column(String(32))
    model_name: Mapped[str | None] = mapped_column(String(128))
    first_seen: Mapped[datetime]
    last_seen: Mapped[datetime]

    node: Mapped[Node] = relationship(back_populates="gpus")


class RuleEvaluation(Base):
    """One rule's evaluation in one tick: health, duration, how many series matched."""

    __tablename__ = "rule_evaluations"

    id: Mapped[int] = mapped_column(primary_key=True)
    rule: Mapped[str] = mapped_column(String(200))
    group: Mapped[str] = mapped_column(String(200))
    evaluated_at: Mapped[datetime]
    duration_seconds: Mapped[float] = mapped_column(Float)
    health: Mapped[str] = mapped_column(String(16))
    error: Mapped[str | None] = mapped_column(Text)
    series: Mapped[int] = mapped_column(Integer, default=0)
    firing: Mapped[int] = mapped_column(Integer, default=0)
    warnings: Mapped[list[Any] | None]

    __table_args__ = (
        Index("ix_rule_evaluations_rule_evaluated_at", "rule", "evaluated_at"),
        # The dashboard finds the rules evaluated recently when no rule set is loaded.
        Index("ix_rule_evaluations_evaluated_at", "evaluated_at"),
    )


class Incident(Base):
    """One episode of a node being unhealthy; findings, transitions, actions and tickets attach to it.

    At most one open incident per node (a partial unique index on ``node_id`` where ``closed_at``
    is null).
    """

    __tablename__ = "incidents"

    id: Mapped[int] = mapped_column(primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    opened_at: Mapped[datetime]
    closed_at: Mapped[datetime | None]
    summary: Mapped[str] = mapped_column(Text, default="")
    close_reason: Mapped[str | None] = mapped_column(Text)
    escalated: Mapped[bool] = mapped_column(Boolean, default=False)
    # Remediation memory, so a restarted controller resumes instead of forgetting; written by
    # healer.controller only.
    rule: Mapped[str | None] = mapped_column(String(200))  # the rule whose actions healer follows
    cordoned_by_healer: Mapped[bool] = mapped_column(Boolean, default=False)
    # What spec.unschedulable should read while healer holds the node; None = healer holds nothing.
    expect_unschedulable: Mapped[bool | None] = mapped_column(Boolean)
    drain_started_at: Mapped[datetime | None]
    drain_options: Mapped[dict[str, Any] | None]  # DrainOptions as they were at drain start
    blocked_step: Mapped[str | None] = mapped_column(String(32))  # "quarantine" | "drain"
    blocked_reason: Mapped[str | None] = mapped_column(Text)
    clear_since: Mapped[datetime | None]  # validating: first tick of the current clear stretch
    # The remediation ladder (healer.engine.ladder): its steps as chosen (JSON, the rule schema's
    # step objects), the step in progress, since when, and the node agent request's nonce.
    ladder: Mapped[list[Any] | None] = mapped_column(JSON, default=None)
    ladder_index: Mapped[int | None] = mapped_column(Integer, default=None)
    ladder_started_at: Mapped[datetime | None] = mapped_column(default=None)
    repair_nonce: Mapped[str | None] = mapped_column(String(100), default=None)
    # The validation Job before return: {"job", "status", "result"} (the result kept after cleanup).
    validation: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    # The log capture asked of the node agent as the node was taken out (healer.engine.lifecycle):
    # {"nonce", "requested_at", "status" (requested|succeeded|failed|refused), "answered_at", "reason"};
    # a replacement ticket waits for its answer a bounded time (repair.capture_wait_seconds).
    capture: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    # An operator's release waiting for the controller: {"actor", "reason", "at"}; written by
    # healer.operations (the input), cleared by the controller's step that acts on it.
    release_requested: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    #: The domain incident this node's incident is part of (healer.engine.correlation), if any.
    domain_incident_id: Mapped[int | None] = mapped_column(
        ForeignKey("domain_incidents.id", ondelete="SET NULL"), index=True, default=None
    )
    # Whether the decision was right (healer.engine.outcomes), set when the incident closes:
    # "confirmed" | "not_confirmed" | None (no decision, or not known), the basis it rests on, and
    # who set it ("healer", or the operator who edited it; the edit has an audit row).
    outcome: Mapped[str | None] = mapped_column(String(16), default=None)
    outcome_basis: Mapped[str | None] = mapped_column(String(200), default=None)
    outcome_at: Mapped[datetime | None] = mapped_column(default=None)
    outcome_by: Mapped[str | None] = mapped_column(String(200), default=None)
    # The node's GPU count (nvidia.com/gpu capacity) as read when the incident closed, for its
    # GPU-hours out of service; None: not read (the GPUs healer knows by UUID count instead).
    gpus: Mapped[int | None] = mapped_column(Integer, default=None)

    __table_args__ = (
        Index(
            "uq_incidents_open_node",
            "node_id",
            unique=True,
            sqlite_where=text("closed_at IS NULL"),
            postgresql_where=text("closed_at IS NULL"),
        ),
    )


class DomainIncident(Base):
    """One domain fault (:mod:`healer.engine.correlation`): k of n nodes of a rack, switch or NVLink
    domain bad together. Its member nodes' incidents point at it; its one ticket goes to the
    kind's provider. Closed once its ticket is resolved and every member is back (or gone).
    """

    __tablename__ = "domain_incidents"

    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))
    name: Mapped[str] = mapped_column(String(253))
    size: Mapped[int] = mapped_column(Integer)  # nodes in the domain when it opened
    first_seen: Mapped[datetime]  # the first member's bad episode started
    opened_at: Mapped[datetime]
    closed_at: Mapped[datetime | None]
    close_reason: Mapped[str | None] = mapped_column(Text)
    summary: Mapped[str] = mapped_column(Text, default="")
    #: The member nodes, sorted, and when each joined: [{"node", "joined_at", "first_seen"}].
    members: Mapped[list[Any]]
    #: The thresholds it was opened under: {"min_nodes", "min_percent", "window_seconds", "needed"}.
    evidence: Mapped[dict[str, Any] | None]

    __table_args__ = (Index("ix_domain_incidents_kind_name_closed_at", "kind", "name", "closed_at"),)


class Finding(Base):
    """One episode of one rule's condition on one series (rule + label set), pending to resolved.

    Written on change only (pending, firing, resolved, value refreshed at most per tick on firing
    ones), not per sample.
    """

    __tablename__ = "findings"

    id: Mapped[int] = mapped_column(primary_key=True)
    rule: Mapped[str] = mapped_column(String(200))
    series_key: Mapped[str] = mapped_column(String(1000))
    node_name: Mapped[str] = mapped_column(String(253))
    gpu: Mapped[str | None] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))
    severity: Mapped[str] = mapped_column(String(16), default="critical")
    value: Mapped[float | None] = mapped_column(Float)
    unit: Mapped[str | None] = mapped_column(String(100))
    labels: Mapped[dict[str, Any]]
    summary: Mapped[str] = mapped_column(Text, default="")
    active_since: Mapped[datetime]
    fired_at: Mapped[datetime | None]
    resolved_at: Mapped[datetime | None]
    last_seen_at: Mapped[datetime]
    incident_id: Mapped[int | None] = mapped_column(
        ForeignKey("incidents.id", ondelete="SET NULL"), index=True
    )

    __table_args__ = (
        Index("ix_findings_node_name_state", "node_name", "state"),
        Index("ix_findings_rule_state", "rule", "state"),
    )


class Transition(Base):
    """A node's lifecycle step: from, to, who, why, when, and the evidence (rule, value, labels)."""

    __tablename__ = "transitions"

    id: Mapped[int] = mapped_column(primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    incident_id: Mapped[int | None] = mapped_column(
        ForeignKey("incidents.id", ondelete="SET NULL"), index=True
    )
    from_state: Mapped[str] = mapped_column(String(32))
    to_state: Mapped[str] = mapped_column(String(32))
    actor: Mapped[str] = mapped_column(String(200))
    reason: Mapped[str] = mapped_column(Text)
    evidence: Mapped[dict[str, Any] | None]
    at: Mapped[datetime]
    #: The Lease holder that recorded it and its fencing number (the Lease's ``leaseTransitions``
    #: when it took the Lease); None for steps not taken by the leader (provider callbacks, CLI).
    holder: Mapped[str | None] = mapped_column(String(253), default=None)
    fencing_token: Mapped[int | None] = mapped_column(BigInteger, default=None)

    __table_args__ = (Index("ix_transitions_node_id_at", "node_id", "at"),)


class Action(Base):
    """Something healer did, would have done (dry-run), or refused; also operator actions (audit log)."""

    __tablename__ = "actions"

    id: Mapped[int] = mapped_column(primary_key=True)
    node_id: Mapped[int | None] = mapped_column(ForeignKey("nodes.id", ondelete="SET NULL"))
    incident_id: Mapped[int | None] = mapped_column(
        ForeignKey("incidents.id", ondelete="SET NULL"), index=True
    )
    kind: Mapped[str] = mapped_column(String(32))
    target: Mapped[str] = mapped_column(String(500), default="")
    status: Mapped[str] = mapped_column(String(16))
    actor: Mapped[str] = mapped_column(String(200))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text)
    detail: Mapped[dict[str, Any] | None]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]

    __table_args__ = (
        Index("ix_actions_node_id_created_at", "node_id", "created_at"),
        Index("ix_actions_created_at", "created_at"),
        # The audit page filters by kind or status, newest first.
        Index("ix_actions_kind_created_at", "kind", "created_at"),
        Index("ix_actions_status_created_at", "status", "created_at"),
    )


class BurstTransition(Base):
    """A burst node opened or closed by a capacity rule (:mod:`healer.controller.burst`), not a
    health lifecycle step: from, to, why, when, the capacity numbers it was decided on (evidence),
    and what came of it (``status``: ``succeeded`` the taint changed, ``dry_run`` it would have,
    ``failed``, or ``recorded``: nothing to change, a human's taint change seen or taken back)."""

    __tablename__ = "burst_transitions"

    id: Mapped[int] = mapped_column(primary_key=True)
    rule: Mapped[str] = mapped_column(String(63))
    node: Mapped[str] = mapped_column(String(253))
    from_state: Mapped[str] = mapped_column(String(16))
    to_state: Mapped[str] = mapped_column(String(16))
    by_hand: Mapped[bool] = mapped_column(Boolean, default=False)
    status: Mapped[str] = mapped_column(String(16))
    actor: Mapped[str] = mapped_column(String(200))
    reason: Mapped[str] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    evidence: Mapped[dict[str, Any] | None]
    at: Mapped[datetime]
    holder: Mapped[str | None] = mapped_column(String(253), default=None)
    fencing_token: Mapped[int | None] = mapped_column(BigInteger, default=None)

    __table_args__ = (Index("ix_burst_transitions_rule_node_at", "rule", "node", "at"),)


class Ticket(Base):
    """A replacement request to a provider; one per (incident, provider), keyed by ``idempotency_key``."""

    __tablename__ = "tickets"

    id: Mapped[int] = mapped_column(primary_key=True)
    incident_id: Mapped[int] = mapped_column(ForeignKey("incidents.id", ondelete="CASCADE"), index=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    provider: Mapped[str] = mapped_column(String(100))
    idempotency_key: Mapped[str] = mapped_column(String(200), unique=True)
    status: Mapped[str] = mapped_column(String(16))
    external_id: Mapped[str | None] = mapped_column(String(200))
    escalated: Mapped[bool] = mapped_column(Boolean, default=False)
    reason: Mapped[str | None] = mapped_column(Text)
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    sent_at: Mapped[datetime | None]
    acknowledged_at: Mapped[datetime | None]
    resolved_at: Mapped[datetime | None]
    closed_by: Mapped[str | None] = mapped_column(String(200))
    # What the ticket asks for: the findings it lists (JSON-safe dicts, see healer.tickets.outbox),
    # the rule's template override, and the repeat-offender decision taken at first delivery.
    findings: Mapped[list[Any] | None]
    template: Mapped[str | None] = mapped_column(String(500))
    escalation: Mapped[dict[str, Any] | None]
    #: A domain's ticket (one per domain incident): ``incident_id``/``node_id`` name its first
    #: member's incident and node (the anchor), the payload the domain and all its members.
    domain_incident_id: Mapped[int | None] = mapped_column(
        ForeignKey("domain_incidents.id", ondelete="SET NULL"), index=True, default=None
    )
    # What the provider said it found when it resolved the ticket (healer.engine.outcomes.Resolution):
    # "replaced" | "fault_found" | "no_fault_found" | None (it said nothing).
    resolution: Mapped[str | None] = mapped_column(String(32), default=None)
    # When the escalation for a missed repair target (tickets.providers[].ack_within /
    # repair_within) was queued: it is sent once per ticket and target; {"ack": iso, "repair": iso}.
    overdue_escalated: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)

    __table_args__ = (Index("ix_tickets_status_created_at", "status", "created_at"),)


class ShadowDecision(Base):
    """What a ``mode: shadow`` rule would have done on one node: from its first finding there
    firing to its last one resolving (``closed_at`` None while it fires). Its outcome is read from
    what later happened to the node (:func:`healer.engine.outcomes.judge_shadow`)."""

    __tablename__ = "shadow_decisions"

    id: Mapped[int] = mapped_column(primary_key=True)
    rule: Mapped[str] = mapped_column(String(200))
    node_name: Mapped[str] = mapped_column(String(253))
    pool: Mapped[str] = mapped_column(String(253), default="default")
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    would: Mapped[list[Any]]  # the actions it would have taken: cordon, taint, drain, ticket
    evidence: Mapped[dict[str, Any] | None]  # the first firing finding: value, labels, summary
    opened_at: Mapped[datetime]
    closed_at: Mapped[datetime | None]

    __table_args__ = (Index("ix_shadow_decisions_rule_opened_at", "rule", "opened_at"),)


class OutboxMessage(Base):
    """A webhook delivery waiting to be sent (the transactional outbox)."""

    __tablename__ = "outbox"

    id: Mapped[int] = mapped_column(primary_key=True)
    ticket_id: Mapped[int] = mapped_column(ForeignKey("tickets.id", ondelete="CASCADE"), index=True)
    provider: Mapped[str] = mapped_column(String(100))
    idempotency_key: Mapped[str] = mapped_column(String(200))
    body: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime]
    last_status_code: Mapped[int | None]
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]
    delivered_at: Mapped[datetime | None]

    __table_args__ = (Index("ix_outbox_status_next_attempt_at", "status", "next_attempt_at"),)


class CallbackNonce(Base):
    """Signatures of inbound provider callbacks already accepted (replay protection)."""

    __tablename__ = "callback_nonces"

    id: Mapped[int] = mapped_column(primary_key=True)
    signature: Mapped[str] = mapped_column(String(128))
    received_at: Mapped[datetime] = mapped_column(index=True)

    __table_args__ = (UniqueConstraint("signature"),)


class Switch(Base):
    """Controller-wide switches and state: pause, circuit breaker, last tick, rule-set status."""

    __tablename__ = "switches"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[dict[str, Any]]
    updated_at: Mapped[datetime]
    updated_by: Mapped[str] = mapped_column(String(200))
