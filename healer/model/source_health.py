"""Whether the metrics source can be queried: the state kept in the ``source`` switch.

The controller records it after each tick that queried at least one rule (every rule
unavailable = failing, with the first rule's error as the reason); ``/readyz`` and the fleet
page read it. A failing source makes the replica unready once it has failed for longer than
``prometheus.unavailable_grace_seconds``: one bad tick is not an outage.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class SourceHealth:
    """The source's state: ``ok``, since when (aware UTC), and why not (empty when ok)."""

    ok: bool
    since: datetime
    reason: str = ""

    def failing_for(self, now: datetime) -> float:
        """Seconds the source has been failing at ``now`` (0 when it answers)."""
        return 0.0 if self.ok else max(0.0, (now - self.since).total_seconds())

    def overdue(self, now: datetime, grace_seconds: float) -> bool:
        """Failing for longer than ``grace_seconds``."""
        return not self.ok and self.failing_for(now) > grace_seconds

    def as_switch(self) -> dict[str, Any]:
        """The value stored in the ``source`` switch."""
        return {"ok": self.ok, "since": self.since.isoformat(), "reason": self.reason}

    @classmethod
    def from_switch(cls, value: dict[str, Any]) -> SourceHealth | None:
        """The state from a stored switch value; None when never recorded."""
        if not value.get("since"):
            return None
        return cls(
            ok=bool(value.get("ok")),
            since=datetime.fromisoformat(value["since"]),
            reason=value.get("reason") or "",
        )


def next_health(previous: SourceHealth | None, *, failure: str | None, now: datetime) -> SourceHealth:
    """The state after a tick whose source failed with ``failure`` (None: it answered).

    ``since`` moves only when the state changes (ok ↔ failing); a failing source keeps its first
    reason's time but shows the latest reason.
    """
    ok = failure is None
    if previous is not None and previous.ok == ok:
        return SourceHealth(ok=ok, since=previous.since, reason=failure or "")
    return SourceHealth(ok=ok, since=now, reason=failure or "")
