"""The named states healer records. Stored as their string values."""

from __future__ import annotations

from enum import StrEnum


class NodeState(StrEnum):
    """Where a node is in its remediation lifecycle (``healer.engine.lifecycle`` moves it)."""

    HEALTHY = "healthy"
    SUSPECT = "suspect"  # a finding is pending or firing but no action was taken yet
    QUARANTINED = "quarantined"  # cordoned, tainted, condition set
    DRAINING = "draining"
    AWAITING_REPAIR = "awaiting_repair"  # drained, ticket requested
    REPAIRED = "repaired"  # provider or human says fixed
    VALIDATING = "validating"  # rules must stay clear for the recovery hold
    BLOCKED = "blocked"  # a step was refused (budget, breaker, PDB), with the reason
    RELEASED = "released"  # a human took the node over; healer keeps its hands off
    UNKNOWN = "unknown"  # no data: exporter down or stale; neither healthy nor faulty


#: States in which a node is out of service or on its way out; they count against the budget.
OUT_OF_SERVICE = frozenset(
    {
        NodeState.QUARANTINED,
        NodeState.DRAINING,
        NodeState.AWAITING_REPAIR,
        NodeState.REPAIRED,
        NodeState.VALIDATING,
    }
)


class FindingState(StrEnum):
    """Prometheus alerting states of one series of one rule."""

    PENDING = "pending"  # condition true, not yet for `for`
    FIRING = "firing"
    RESOLVED = "resolved"  # clear for `keep_firing_for` after firing, or never fired


class RuleHealth(StrEnum):
    """Outcome of one rule's evaluation in one tick."""

    OK = "ok"
    NO_DATA = "no_data"  # query succeeded, but the series it needs are absent
    DEGRADED = "degraded"  # evaluated, but some series name no node: they can act on nothing
    ERROR = "error"  # the rule is broken (bad PromQL): fix the rule
    UNAVAILABLE = "unavailable"  # the source failed (timeout, 5xx): state kept as it was


class ActionStatus(StrEnum):
    """Result of one action healer took, or would have taken."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    BLOCKED = "blocked"  # e.g. a PodDisruptionBudget past the drain deadline
    REFUSED = "refused"  # safety said no (budget, breaker, pause, window, opt-out)
    DRY_RUN = "dry_run"  # recorded only
    CANCELLED = "cancelled"  # ended before it finished: a drain a human stopped (uncordon, ...)


class TicketStatus(StrEnum):
    """A provider ticket's status, as delivered and as reported back by the provider."""

    PENDING = "pending"  # in the outbox, not delivered yet
    SENT = "sent"  # the provider accepted the webhook
    ACKNOWLEDGED = "acknowledged"
    IN_PROGRESS = "in_progress"
    NEEDS_INFO = "needs_info"
    RESOLVED = "resolved"
    REJECTED = "rejected"
    FAILED = "failed"  # delivery failed permanently (4xx)
    CLOSED = "closed"  # closed by an SRE


class TicketResolution(StrEnum):
    """What a provider says it found when it resolves a ticket (the status callback's
    ``resolution``); it decides the incident's outcome (``healer.engine.outcomes``)."""

    REPLACED = "replaced"
    FAULT_FOUND = "fault_found"
    NO_FAULT_FOUND = "no_fault_found"


class OutboxStatus(StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"  # permanent failure; the response body is kept
