"""Blind spots as data: where a rule cannot see, per node, and how they are stored and shown.

A *blind spot* is a node, one of its GPUs or one of its InfiniBand ports that lacks an input a
rule reads while the rule's peers (other nodes, GPUs or ports) export it: the rule can find
nothing there, and nothing is not health. :mod:`healer.blind_spots` observes them from
Prometheus; the controller stores the last observation in the ``blind_spots`` switch
(:meth:`BlindReport.as_switch`), which the dashboard, the JSON API and ``/metrics`` read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

#: The scope of a spot that is the whole node (it exports nothing of the rule's family).
WHOLE_NODE = "node"
#: Most spots stored (and shown) per observation; ``total`` and ``per_rule`` stay exact. A fleet
#: half of which lacks a field is thousands of GPUs: the first ones, sorted by node, tell the story.
MAX_STORED_SPOTS = 2000


@dataclass(frozen=True, order=True)
class BlindSpot:
    """One rule that cannot see one place of one node.

    ``node``: the Kubernetes Node's name; ``rule``: the rule's name; ``scope``: where on the node,
    ``"gpu 3"``, ``"mlx5_0 port 1"`` or ``"node"`` (:data:`WHOLE_NODE`); ``missing``: the inputs the
    scope lacks, as ``healer doctor exporters`` writes them (``"DCGM_FI_DEV_GPU_TEMP"``,
    ``"A or B"`` for alternatives); ``why``: one sentence for the operator.
    """

    node: str
    rule: str
    scope: str
    missing: tuple[str, ...]
    why: str = ""

    def as_dict(self) -> dict[str, Any]:
        """The JSON shape (the switch and ``/api/v1/blind-spots``)."""
        return {
            "node": self.node,
            "rule": self.rule,
            "scope": self.scope,
            "missing": list(self.missing),
            "why": self.why,
        }


@dataclass(frozen=True, order=True)
class UnresolvedSeries:
    """A series the observation could not tie to an existing Node: ``series`` its labels as
    ``{a="b", ...}``, ``why`` the reason (:meth:`healer.model.addresses.AddressBook.resolve`)."""

    series: str
    why: str


@dataclass(frozen=True)
class BlindReport:
    """One observation of every rule's blind spots.

    ``observed_at``: when (the controller's clock, UTC); ``spots``: sorted by node, rule, scope
    (stored: at most :data:`MAX_STORED_SPOTS`); ``unresolved``: series that named no Node (never
    counted for any node); ``errors``: queries that failed (the spots they would have found are
    unknown, said on every page that shows spots); ``rules``: the rules judged (those reading a
    dcgm-exporter or InfiniBand metric); ``total``: how many spots were found (None: all are in
    ``spots``); ``per_rule``: rule → its spots, exact.
    """

    observed_at: datetime
    spots: tuple[BlindSpot, ...] = ()
    unresolved: tuple[UnresolvedSeries, ...] = ()
    errors: tuple[str, ...] = ()
    rules: tuple[str, ...] = ()
    total: int | None = None
    per_rule: dict[str, int] = field(default_factory=dict)

    @property
    def found(self) -> int:
        """How many spots the observation found (stored or not)."""
        return len(self.spots) if self.total is None else self.total

    def for_node(self, node: str) -> list[BlindSpot]:
        """The spots of ``node`` (its name as Kubernetes writes it)."""
        return [s for s in self.spots if s.node == node]

    def by_node(self) -> dict[str, list[BlindSpot]]:
        """Node → its spots, nodes in name order."""
        out: dict[str, list[BlindSpot]] = {}
        for spot in self.spots:
            out.setdefault(spot.node, []).append(spot)
        return out

    def counts(self) -> dict[tuple[str, str], int]:
        """(rule, node) → how many scopes of the node the rule cannot see (the metric's value)."""
        out: dict[tuple[str, str], int] = {}
        for spot in self.spots:
            out[(spot.rule, spot.node)] = out.get((spot.rule, spot.node), 0) + 1
        return out

    def as_switch(self) -> dict[str, Any]:
        """The value stored in the ``blind_spots`` switch (the first :data:`MAX_STORED_SPOTS`)."""
        per_rule: dict[str, int] = dict(self.per_rule)
        if not per_rule:
            for spot in self.spots:
                per_rule[spot.rule] = per_rule.get(spot.rule, 0) + 1
        return {
            "observed_at": self.observed_at.isoformat(),
            "total": self.found,
            "per_rule": per_rule,
            "spots": [s.as_dict() for s in self.spots[:MAX_STORED_SPOTS]],
            "unresolved": [{"series": u.series, "why": u.why} for u in self.unresolved],
            "errors": list(self.errors),
            "rules": list(self.rules),
        }

    @classmethod
    def from_switch(cls, value: Mapping[str, Any]) -> BlindReport | None:
        """The report from a stored switch value; None when never observed."""
        if not value.get("observed_at"):
            return None
        return cls(
            observed_at=datetime.fromisoformat(value["observed_at"]),
            spots=tuple(
                BlindSpot(
                    node=str(s["node"]),
                    rule=str(s["rule"]),
                    scope=str(s["scope"]),
                    missing=tuple(str(m) for m in s.get("missing", ())),
                    why=str(s.get("why", "")),
                )
                for s in value.get("spots", ())
            ),
            unresolved=tuple(
                UnresolvedSeries(series=str(u["series"]), why=str(u["why"]))
                for u in value.get("unresolved", ())
            ),
            errors=tuple(str(e) for e in value.get("errors", ())),
            rules=tuple(str(r) for r in value.get("rules", ())),
            total=int(value["total"]) if value.get("total") is not None else None,
            per_rule={str(k): int(v) for k, v in (value.get("per_rule") or {}).items()},
        )
