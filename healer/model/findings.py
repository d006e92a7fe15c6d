"""What evaluation hands to the lifecycle: findings per node, and nodes with no data.

Shapes only; the logic lives in ``evaluation`` (series → findings) and ``lifecycle``
(findings → wanted steps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime

from healer.model.states import FindingState


def json_safe_value(value: float | None) -> float | str | None:
    """A sample value for JSON columns: NaN and ±Inf as Prometheus writes them (``"NaN"``, ``"+Inf"``).

    PostgreSQL's JSON type refuses the bare ``NaN``/``Infinity`` tokens Python's ``json`` emits.
    """
    if value is None or math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "+Inf" if value > 0 else "-Inf"


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
    clear_since: datetime | None = None  # first clear tick while firing: the recovery hold runs from here

    @property
    def evidence(self) -> dict[str, object]:
        """JSON-safe evidence for a transition row."""
        return {
            "rule": self.rule,
            "gpu": self.gpu,
            "value": json_safe_value(self.value),
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
    new action may be taken on their account; ``unresolved`` maps rule → the series it returned
    that name no node. A node can be both ``unknown`` and in ``firing``: a finding whose exporter
    went silent keeps its last state (no data is not recovery).
    """

    at: datetime
    firing: dict[str, list[Finding]] = field(default_factory=dict)
    pending: dict[str, list[Finding]] = field(default_factory=dict)
    unknown: frozenset[str] = frozenset()
    frozen_rules: frozenset[str] = frozenset()
    unresolved: dict[str, UnresolvedSeries] = field(default_factory=dict)

    def for_node(self, node: str) -> list[Finding]:
        """The node's firing then pending findings (empty when it has none)."""
        return [*self.firing.get(node, ()), *self.pending.get(node, ())]


@dataclass(frozen=True)
class UnresolvedSeries:
    """Series of one rule whose node could not be named in one tick: none of ``node_labels`` is
    set, or (checked against the cluster) their values name no Node and no exporter pod, and
    their ``instance`` address is no node's (:mod:`healer.model.addresses`).

    They are reported (the rule's health is ``degraded``), never silently dropped, and never acted
    on: a rule that names no node finds nothing. ``example`` is the label set of one of them;
    ``why`` says why it named no node (None when the cluster was not looked up).
    """

    rule: str
    count: int
    node_labels: tuple[str, ...]
    example: dict[str, str]
    why: str | None = None

    @property
    def example_instance(self) -> str | None:
        """The example's ``instance`` label (the scrape address), if it has one."""
        return self.example.get("instance")

    @property
    def labelled(self) -> bool:
        """Whether the example carries a node label (whose value named no node)."""
        return any(self.example.get(name) for name in self.node_labels)

    def __str__(self) -> str:
        if self.labelled and self.why:
            return f"{self.count} series that name no node ({self.why}), e.g. {self.example}"
        tried = ", ".join(self.node_labels)
        text = f"{self.count} series without a node label (tried {tried}"
        text += f", then the instance address: {self.why})" if self.why else ")"
        return f"{text}, e.g. {self.example}"
