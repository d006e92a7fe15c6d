"""Moved to :mod:`healer.model.states`; re-exported while other branches still import it here."""

from healer.model.states import (
    OUT_OF_SERVICE,
    ActionStatus,
    FindingState,
    NodeState,
    OutboxStatus,
    RuleHealth,
    TicketStatus,
)

__all__ = [
    "OUT_OF_SERVICE",
    "ActionStatus",
    "FindingState",
    "NodeState",
    "OutboxStatus",
    "RuleHealth",
    "TicketStatus",
]
