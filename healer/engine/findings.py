"""What evaluation hands to the lifecycle: findings per node, and nodes with no data.

Shapes only; the logic lives in ``evaluation`` (series → findings) and ``lifecycle``
(findings → wanted steps).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from healer.engine.states import FindingState


@dataclass(frozen=True)
class Finding:
    """One rule's condition on one series (rule + label set), with its evidence.

    ``value`` is the expression's value at the tick (NaN/±Inf possible), in ``unit``;
    ``labels`` are the series labels as Prometheus returned them (attacker-controllable text).
    """

    rule: str
    series_key: str  # stable: rule + sorted label set, used to match across ticks
    node: str
    gpu: str | None
    state: FindingState
    severity: str
    value: float | None
    unit: str | None
    labels: dict[str, str] = field(default_factory=dict)
    summary: str = ""
    active_since: datetime | None = None  # first tick the condition was true in this episode
    fired_at: datetime | None = None  # when it held for `for`
    last_true_at: datetime | None = None  # last tick the condition was true (recovery hold starts here)
    resolved_at: datetime | None = None

    @property
    def evidence(self) -> dict[str, object]:
        """JSON-safe evidence for a transition row."""
        return {
            "rule": self.rule,
            "gpu": self.gpu,
            "value": self.value if self.value is None or self.value == self.value else "NaN",
            "unit": self.unit,
            "labels": dict(self.labels),
            "since": self.active_since.isoformat() if self.active_since else None,
        }


@dataclass(frozen=True)
class TickFindings:
    """Everything one tick learned, per node name.

    ``firing`` maps node → its firing findings (all rules); ``pending`` likewise; ``unknown`` are
    nodes a ``no_data`` rule reports (exporter down or stale): neither healthy nor faulty;
    ``frozen_rules`` are rules whose query failed this tick: their previous state stands and no
    new action may be taken on their account.
    """

    at: datetime
    firing: dict[str, list[Finding]] = field(default_factory=dict)
    pending: dict[str, list[Finding]] = field(default_factory=dict)
    unknown: frozenset[str] = frozenset()
    frozen_rules: frozenset[str] = frozenset()
