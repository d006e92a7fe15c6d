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

    ``observed_at``: when (the controller's clock, UTC); ``spots``: sorted by node, rule, scope;
    ``unresolved``: series that named no Node (never counted for any node); ``errors``: queries
    that failed (the spots they would have found are unknown, said on every page that shows
    spots); ``rules``: the rules judged (those reading a dcgm-exporter or InfiniBand metric).
    """

    observed_at: datetime
    spots: tuple[BlindSpot, ...] = ()
    unresolved: tuple[UnresolvedSeries, ...] = ()
    errors: tuple[str, ...] = ()
    rules: tuple[str, ...] = ()

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
        """The value stored in the ``blind_spots`` switch."""
        return {
            "observed_at": self.observed_at.isoformat(),
            "spots": [s.as_dict() for s in self.spots],
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
        )


@dataclass(frozen=True)
class NodeBlindness:
    """What the node page says: the node's spots, grouped by rule (rule → its spots)."""

    by_rule: dict[str, list[BlindSpot]] = field(default_factory=dict)

    @classmethod
    def of(cls, report: BlindReport | None, node: str) -> NodeBlindness:
        """The node's spots in ``report`` (none when never observed)."""
        out: dict[str, list[BlindSpot]] = {}
        for spot in report.for_node(node) if report else []:
            out.setdefault(spot.rule, []).append(spot)
        return cls(by_rule=out)
