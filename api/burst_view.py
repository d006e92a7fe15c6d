"""The burst page: each capacity rule's burst nodes (open or closed), the pods out and those that
cannot come back, and the history of toggles and returns. Read from the record only (the ``burst``
switch the leader's burst job writes each run, ``burst_transitions`` and the ``burst_return``
actions), so any replica serves it."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from healer.store import burst as store
from healer.store.models import Action, BurstTransition
from healer.store.nodes import get_switch


@dataclass(frozen=True)
class BurstPage:
    """What ``burst.html`` shows. ``observed_at``: the burst job's last run (None: never ran)."""

    observed_at: datetime | None
    rules: list[dict[str, Any]] = field(default_factory=list)
    history: list[BurstTransition] = field(default_factory=list)
    returns: list[Action] = field(default_factory=list)
    returned: dict[tuple[str, str], int] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """The same, JSON-safe (``/api/v1/burst``)."""
        return {
            "observed_at": self.observed_at.isoformat() if self.observed_at else None,
            "rules": self.rules,
            "history": [
                {
                    "rule": t.rule,
                    "node": t.node,
                    "from": t.from_state,
                    "to": t.to_state,
                    "by_hand": t.by_hand,
                    "status": t.status,
                    "reason": t.reason,
                    "error": t.error,
                    "evidence": t.evidence,
                    "at": t.at.isoformat(),
                }
                for t in self.history
            ],
            "returns": [
                {
                    "pod": (a.detail or {}).get("pod"),
                    "node": (a.detail or {}).get("node"),
                    "rule": (a.detail or {}).get("rule"),
                    "status": a.status,
                    "error": a.error,
                    "at": a.created_at.isoformat(),
                }
                for a in self.returns
            ],
        }


def burst_page(session: Session, *, limit: int = 100) -> BurstPage:
    """The burst page from the record (see the module)."""
    switch = get_switch(session, store.SWITCH_BURST)
    at = switch.get("at")
    return BurstPage(
        observed_at=datetime.fromisoformat(at) if isinstance(at, str) else None,
        rules=list(switch.get("rules") or []),
        history=store.history(session, limit=limit),
        returns=store.recent_returns(session, limit=limit),
        returned=store.returned(session),
    )
